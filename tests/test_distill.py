"""`bertforge distill`: the student's start, the loss against a hand computation, end to end
into a student that sentence-transformers loads, and a killed distillation resumed to the same
parameters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertModel, Tokenizer
from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.pipelines import Pipeline
from bertforge.tasks.embedding import Embedding
from bertforge.train.distill import distillation_loss, make_student
from tests.test_pipelines import SENTENCES

WORDS = [
    "the",
    "a",
    "river",
    "city",
    "song",
    "market",
    "winter",
    "child",
    "old",
    "new",
    "found",
    "quietly",
    "near",
    "over",
    "built",
]


def corpus(path: Path, n: int = 80) -> Path:
    rng = np.random.default_rng(0)
    lines = [
        " ".join(rng.choice(WORDS, int(rng.integers(4, 14)))).capitalize() + "." for _ in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_student_starts_from_the_teachers_layers(minilm_dir: Path) -> None:
    teacher = BertModel.from_pretrained(minilm_dir)
    student = make_student(teacher, [0, 2, 5]).eval()
    assert student.config.num_hidden_layers == 3
    for i, k in enumerate([0, 2, 5]):
        for a, b in zip(student.layers[i].parameters(), teacher.layers[k].parameters()):
            assert torch.equal(a, b)
    ids = Tokenizer.from_pretrained(minilm_dir)(["a river in winter"])
    with torch.no_grad():
        s, t = student(**ids, output_hidden_states=True), teacher(**ids, output_hidden_states=True)
    assert torch.equal(s.hidden_states[0], t.hidden_states[0])
    assert torch.equal(s.hidden_states[1], t.hidden_states[1])  # layer 0 on the same input
    for bad in ([6], [2, 1], [1, 1], []):
        with pytest.raises(ConfigError, match="student layers"):
            make_student(teacher, bad)


def test_the_loss_against_a_hand_computation() -> None:
    torch.manual_seed(0)
    B, T, H, layers = 2, 4, 3, [1, 3]
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])

    def outputs(n: int) -> SimpleNamespace:
        hidden = tuple(torch.randn(B, T, H) for _ in range(n + 1))
        return SimpleNamespace(hidden_states=hidden, last_hidden_state=hidden[-1])

    s, t = outputs(2), outputs(4)
    total, emb = distillation_loss(s, t, mask, layers, Embedding(("mean",), True), 0.5)
    want_total = want_emb = 0.0
    for b in range(B):
        n = int(mask[b].sum())
        vs, vt = s.last_hidden_state[b, :n].mean(0), t.last_hidden_state[b, :n].mean(0)
        e = float(((vs / vs.norm() - vt / vt.norm()) ** 2).mean())
        pairs = [(0, 0), (1, 2), (2, 4)]  # embeddings; student layer i <- teacher layer k
        h = sum(float(((s.hidden_states[i][b, :n] - t.hidden_states[k][b, :n]) ** 2).mean())
                for i, k in pairs) / len(pairs)  # fmt: skip
        want_emb += e
        want_total += e + 0.5 * h
    assert float(emb) == pytest.approx(want_emb, rel=1e-5)
    assert float(total) == pytest.approx(want_total, rel=1e-5)


def test_distill_end_to_end_into_a_sentence_transformers_student(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    st = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "student"
    args = ["distill", "--teacher", str(minilm_dir), "--out", str(out), "--data",
            str(corpus(tmp_path / "text.txt")), "--student-layers", "0,2,5", "--steps", "4",
            "--batch-size", "8", "--no-progress", "--precision", "fp32"]  # fmt: skip
    assert main(args) == 0
    assert "the student (3 layers)" in capsys.readouterr().out
    assert (out / "modules.json").is_file() and (out / "1_Pooling" / "config.json").is_file()
    ref = st.SentenceTransformer(str(out), device="cpu").encode(SENTENCES[:6])
    ours = Pipeline(out, precision="fp32").embed(SENTENCES[:6])
    assert np.abs(ours - ref).max() < 1e-4 and np.allclose(np.linalg.norm(ours, axis=1), 1)
    assert transformers.BertModel.from_pretrained(out).config.num_hidden_layers == 3
    assert main(args) == 0  # a finished run says so
    assert "already finished" in capsys.readouterr().out
    assert main([*args, "--lr", "2e-4"]) == 2  # other settings into a finished run's --out
    assert "other settings" in capsys.readouterr().err
    bad = ["distill", "--teacher", str(minilm_dir), "--out", str(tmp_path / "x"), "--data",
           str(tmp_path / "text.txt"), "--student-layers", "0,9"]  # fmt: skip
    assert main(bad) == 2 and "student layers [0, 9]" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_distillation_resumes_to_identical_parameters(
    tiny_model: Path, tmp_path: Path
) -> None:
    text = corpus(tmp_path / "text.txt", 200)

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "bertforge", "distill", "--teacher", str(tiny_model),
                "--out", str(out), "--data", str(text), "--student-layers", "1", "--steps", "12",
                "--batch-size", "8", "--save-every", "4", "--no-progress"]  # fmt: skip

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd(tmp_path / "A"), capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    proc = subprocess.Popen(
        cmd(tmp_path / "B"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    deadline = time.time() + 300
    while not (tmp_path / "B" / "checkpoints" / "step-00000004").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "B" / "model.safetensors").exists()
    again = subprocess.run(
        cmd(tmp_path / "B"), capture_output=True, text=True, env=env, timeout=600
    )
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = (
        load_file(tmp_path / "A" / "model.safetensors"),
        load_file(tmp_path / "B" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
