"""`bertforge distill`: the student's start, the loss against a hand computation, end to end
into a student that sentence-transformers loads, and a killed distillation resumed to the same
parameters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertModel, Tokenizer
from bertforge.cli import main
from bertforge.config import BertConfig
from bertforge.embedding import Embedding
from bertforge.errors import ConfigError
from bertforge.pipelines import Pipeline
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


def test_dropout_reaches_the_student_and_not_its_config() -> None:
    """General distillation trains the student without dropout (the teacher's targets have
    none); with --task the student keeps its own unless --dropout says; the saved config keeps
    the architecture's rates either way."""
    from bertforge.heads import BertForSequenceClassification
    from bertforge.train.distill import DistillConfig, make_trainee
    from tests.conftest import TINY

    config = BertConfig(
        **TINY,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        classifier_dropout=0.2,
        id2label={0: "no", 1: "yes"},
    )

    def rates(model: torch.nn.Module) -> set[float]:
        return {
            float(getattr(m, n))
            for m in model.modules()
            for n in ("p", "attn_dropout")
            if hasattr(m, n)
        }

    def trainee(teacher: torch.nn.Module, **options: Any) -> torch.nn.Module:
        cfg = DistillConfig(teacher="-", out="-", student_layers="0", **options)
        return make_trainee(cfg, teacher).student

    general = trainee(BertModel(config), data=["-"])
    assert rates(general) == {0.0} and general.config.hidden_dropout_prob == 0.1
    assert rates(trainee(BertModel(config), data=["-"], dropout=0.25)) == {0.25}
    head = BertForSequenceClassification(config)
    assert rates(trainee(head, task="csv", train="-")) == {0.1, 0.2}  # its own
    tuned = trainee(head, task="csv", train="-", dropout=0.3)
    assert rates(tuned) == {0.3} and tuned.config.classifier_dropout == 0.2


def test_general_distillation_reads_sentences_of_min_words(tmp_path: Path) -> None:
    from bertforge.errors import DataError
    from bertforge.train.distill import DistillConfig, read_sentences

    text = tmp_path / "text.txt"
    text.write_text("History.\n\nThe river runs past the old mill. It floods.\n|OSTI=\n")

    def read(**options: Any) -> list[str]:
        return read_sentences(
            DistillConfig(teacher="-", out="-", student_layers="0", data=[str(text)], **options)
        )

    assert read() == ["The river runs past the old mill."]
    assert read(min_words=1) == [
        "History.",
        "The river runs past the old mill.",
        "It floods.",
        "|OSTI=",
    ]
    with pytest.raises(DataError, match=r"text.txt: no sentences of 9 words or more.*--min-words"):
        read(min_words=9)


def test_the_loss_against_a_hand_computation() -> None:
    torch.manual_seed(0)
    B, T, H, layers = 2, 4, 3, [1, 3]
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])

    def outputs(n: int) -> SimpleNamespace:
        hidden = tuple(torch.randn(B, T, H) for _ in range(n + 1))
        return SimpleNamespace(hidden_states=hidden, last_hidden_state=hidden[-1])

    s, t = outputs(2), outputs(4)
    total, emb = distillation_loss(
        s, t, mask, layers, Embedding(("mean",), True), 0.5, token_weight=2.0
    )
    want_total = want_emb = 0.0
    for b in range(B):
        n = int(mask[b].sum())
        vs, vt = s.last_hidden_state[b, :n].mean(0), t.last_hidden_state[b, :n].mean(0)
        e = float(((vs / vs.norm() - vt / vt.norm()) ** 2).mean())
        pairs = [(0, 0), (1, 2), (2, 4)]  # embeddings; student layer i <- teacher layer k
        h = sum(
            float(((s.hidden_states[i][b, :n] - t.hidden_states[k][b, :n]) ** 2).mean())
            for i, k in pairs
        ) / len(pairs)
        tokens = float(((s.last_hidden_state[b, :n] - t.last_hidden_state[b, :n]) ** 2).mean())
        want_emb += e
        want_total += e + 0.5 * h + 2.0 * tokens
    assert float(emb) == pytest.approx(want_emb, rel=1e-5)
    assert float(total) == pytest.approx(want_total, rel=1e-5)


def test_distill_end_to_end_into_a_sentence_transformers_student(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    st = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "student"
    args = [
        "distill",
        "--teacher",
        str(minilm_dir),
        "--out",
        str(out),
        "--data",
        str(corpus(tmp_path / "text.txt")),
        "--student-layers",
        "0,2,5",
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--no-progress",
        "--precision",
        "fp32",
    ]
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
    bad = [
        "distill",
        "--teacher",
        str(minilm_dir),
        "--out",
        str(tmp_path / "x"),
        "--data",
        str(tmp_path / "text.txt"),
        "--student-layers",
        "0,9",
    ]
    assert main(bad) == 2 and "student layers [0, 9]" in capsys.readouterr().err


def run_whole_and_killed(cmd: Any, tmp_path: Path, checkpoint: str) -> None:
    """cmd(tmp/A) left alone; cmd(tmp/B) SIGKILLed once `checkpoint` is written (before the
    student is), then run again to the end."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd(tmp_path / "A"), capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    proc = subprocess.Popen(
        cmd(tmp_path / "B"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    deadline = time.time() + 300
    while not (tmp_path / "B" / "checkpoints" / checkpoint).exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    again = subprocess.run(
        cmd(tmp_path / "B"), capture_output=True, text=True, env=env, timeout=600
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in again.stdout


@pytest.mark.slow
def test_a_killed_distillation_resumes_to_identical_parameters(
    tiny_model: Path, tmp_path: Path
) -> None:
    text = corpus(tmp_path / "text.txt", 200)

    def cmd(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bertforge",
            "distill",
            "--teacher",
            str(tiny_model),
            "--out",
            str(out),
            "--data",
            str(text),
            "--student-layers",
            "1",
            "--steps",
            "12",
            "--batch-size",
            "8",
            "--save-every",
            "4",
            "--no-progress",
        ]

    run_whole_and_killed(cmd, tmp_path, "step-00000004")
    a, b = (
        load_file(tmp_path / "A" / "model.safetensors"),
        load_file(tmp_path / "B" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------
# Task distillation: the soft-target losses by hand, every family end to end, the students of
# a size or a config.json (projections), bad command lines


def _kl(t: np.ndarray, s: np.ndarray, temp: float) -> float:
    """temp^2 x KL(softmax(t / temp) || softmax(s / temp)) of one position, written out."""
    p = np.exp(t / temp) / np.exp(t / temp).sum()
    q = np.exp(s / temp) / np.exp(s / temp).sum()
    return float((p * np.log(p / q)).sum()) * temp * temp


def test_soft_target_losses_against_a_hand_computation(minilm_dir: Path) -> None:
    from bertforge.tasks import TaskOptions, family
    from bertforge.tasks.base import Batch, soft_cross_entropy

    tok = Tokenizer.from_pretrained(minilm_dir)
    g = torch.Generator().manual_seed(0)
    temp = 2.5

    def batch(labels: torch.Tensor) -> Batch:
        z = torch.zeros(1, dtype=torch.long)
        return Batch(z, z, z, labels)

    # one distribution per row: classification, multiple choice
    s, t = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    want = sum(_kl(t[i].numpy(), s[i].numpy(), temp) for i in range(3))
    assert float(soft_cross_entropy(s, t, temp)) == pytest.approx(want, rel=1e-5)
    assert float(soft_cross_entropy(t, t, temp)) == pytest.approx(0.0, abs=1e-5)
    fam = family(TaskOptions(task="sst2"), tok)
    got = fam.soft_loss_sum(
        SimpleNamespace(logits=s), SimpleNamespace(logits=t), batch(torch.zeros(3)), temp
    )
    assert float(got) == pytest.approx(want, rel=1e-5)
    # NER: only the labelled positions (each word's first piece)
    s, t = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    labels = torch.tensor([[-100, 1, 0, -100, -100], [-100, 2, -100, 1, 0]])
    want = sum(
        _kl(t[b, j].numpy(), s[b, j].numpy(), temp)
        for b in range(2)
        for j in range(5)
        if labels[b, j] != -100
    )
    fam = family(TaskOptions(task="conll2003"), tok)
    fam.labels = ["O", "B-PER", "I-PER"]
    got = fam.soft_loss_sum(
        SimpleNamespace(logits=s), SimpleNamespace(logits=t), batch(labels), temp
    )
    assert float(got) == pytest.approx(want, rel=1e-5)
    # SQuAD: the start and the end distributions over each window's tokens, averaged
    ss, se, ts, te = (torch.randn(2, 6, generator=g) for _ in range(4))
    want = (
        sum(
            _kl(ts[b].numpy(), ss[b].numpy(), temp) + _kl(te[b].numpy(), se[b].numpy(), temp)
            for b in range(2)
        )
        / 2
    )
    fam = family(TaskOptions(task="squad"), tok)
    got = fam.soft_loss_sum(
        SimpleNamespace(start_logits=ss, end_logits=se),
        SimpleNamespace(start_logits=ts, end_logits=te),
        batch(torch.zeros(2, 2)),
        temp,
    )
    assert float(got) == pytest.approx(want, rel=1e-5)
    # regression: the squared error to the teacher's score
    s, t = torch.randn(4, 1, generator=g), torch.randn(4, 1, generator=g)
    fam = family(TaskOptions(task="stsb"), tok)
    got = fam.soft_loss_sum(
        SimpleNamespace(logits=s), SimpleNamespace(logits=t), batch(torch.zeros(4)), temp
    )
    assert float(got) == pytest.approx(float(((s - t) ** 2).sum()), rel=1e-5)
    # multi-label: per (row, label) the KL of the teacher's and student's Bernoulli at temp
    s, t = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    fam = family(TaskOptions(task="csv", multi_label=True, labels="a,b,c"), tok)
    p, q = torch.sigmoid(t / temp).numpy(), torch.sigmoid(s / temp).numpy()
    want = float((p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))).sum()) * temp * temp
    got = fam.soft_loss_sum(
        SimpleNamespace(logits=s), SimpleNamespace(logits=t), batch(torch.zeros(2, 3)), temp
    )
    assert float(got) == pytest.approx(want, rel=1e-4)


def test_projected_hidden_and_attention_losses_against_a_hand_computation() -> None:
    from bertforge.train.distill import Trainee, representation_loss

    torch.manual_seed(0)
    B, T, Hs, Ht, heads = 2, 4, 3, 5, 2
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    student = SimpleNamespace(
        config=BertConfig(
            hidden_size=Hs, num_hidden_layers=2, num_attention_heads=1, intermediate_size=4
        )
    )
    trainee = Trainee(student, Ht, [1, 3])  # type: ignore[arg-type]
    assert trainee.projections is not None and len(trainee.projections) == 3

    def attn(n: int) -> tuple[torch.Tensor, ...]:
        out = []
        for _ in range(n):
            scores = torch.randn(B, heads, T, T).masked_fill(mask[:, None, None, :] == 0, -1e9)
            out.append(scores.softmax(-1))
        return tuple(out)

    s = SimpleNamespace(
        hidden_states=tuple(torch.randn(B, T, Hs) for _ in range(3)), attentions=attn(2)
    )
    t = SimpleNamespace(
        hidden_states=tuple(torch.randn(B, T, Ht) for _ in range(5)), attentions=attn(4)
    )
    got = representation_loss(s, t, mask, trainee, 0.3, 0.7)
    with torch.no_grad():
        for b in range(B):
            n = int(mask[b].sum())
            h = 0.0
            for i, k in [(0, 0), (1, 2), (2, 4)]:
                proj = trainee.projections[str(i)](s.hidden_states[i][b, :n])
                h += float(((proj - t.hidden_states[k][b, :n]) ** 2).mean())
            a = 0.0
            for i, k in [(0, 1), (1, 3)]:
                ps, pt = s.attentions[i][b, :, :n, :n], t.attentions[k][b, :, :n, :n]
                a += float((pt * (pt / ps).log()).sum(-1).mean())
            assert float(got[b]) == pytest.approx(0.3 * h / 3 + 0.7 * a / 2, rel=1e-4)


def _csv(path: Path, n: int = 48) -> Path:
    rng = np.random.default_rng(1)
    rows = ["text\tlabel"]
    for i in range(n):
        good = i % 2 == 0
        words = rng.choice(["fine", "great", "lovely"] if good else ["dull", "bad", "grim"], 3)
        rows.append(f"a {' '.join(words)} film number {i}\t{'pos' if good else 'neg'}")
    path.write_text("\n".join(rows) + "\n")
    return path


def _family_files(task: str, tmp: Path) -> tuple[Path, dict[str, object]]:
    from tests.task_files import SWAG_HEADER, conll_text, ner_sentences, squad_file

    if task == "csv":
        return _csv(tmp / "t.tsv"), {}
    if task == "csv-regression":
        path = tmp / "r.tsv"
        path.write_text(
            "text\tlabel\n" + "".join(f"score {i} words\t{i / 10}\n" for i in range(24))
        )
        return path, {"regression": True}
    if task == "conll2003":
        path = tmp / "ner.txt"
        path.write_text(conll_text(ner_sentences(16, 0)))
        return path, {}
    if task == "squad2":
        return squad_file(tmp / "squad.json", True), {"max_seq_length": 48, "doc_stride": 16}
    rows = [SWAG_HEADER] + [
        f'v{i},{i},x,"The man picks up a cup {i}.",He,gold,"drinks.",'
        f'"sings.","flies away.","melts.",{i % 4}'
        for i in range(8)
    ]
    path = tmp / "swag.csv"
    path.write_text("\n".join(rows) + "\n")
    return path, {}


@pytest.mark.parametrize("task", ["csv", "csv-regression", "conll2003", "squad2", "swag"])
def test_task_distillation_end_to_end_for_every_family(
    task: str, tmp_path: Path, tiny_model: Path
) -> None:
    """A teacher fine-tuned by bertforge, distilled into its layer 1 (2 -> 1 layers): the
    student is the teacher's task head on one layer, kept by dev, loads in transformers with
    the same logits, and `evaluate` on it gives the dev metrics that were kept."""
    transformers = pytest.importorskip("transformers")
    from bertforge.train.distill import DistillConfig
    from bertforge.train.distill import run as distill
    from bertforge.train.finetune import FinetuneConfig, evaluate_model
    from bertforge.train.finetune import run as finetune

    data, options = _family_files(task, tmp_path)
    name = "csv" if task.startswith("csv") else task
    common = dict(
        task=name,
        train=str(data),
        dev=str(data),
        batch_size=4,
        progress=False,
        precision="fp32",
        **options,
    )
    teacher = tmp_path / "teacher"
    given: dict = {"model": str(tiny_model), "out": str(teacher), "epochs": 1, **common}
    finetune(FinetuneConfig(**given))
    out = tmp_path / "student"
    best = distill(
        DistillConfig(
            teacher=str(teacher),
            out=str(out),
            student_layers="1",
            epochs=2,
            hidden_weight=0.1,
            **common,
        )
    )  # type: ignore[arg-type]
    t_config = json.loads((teacher / "config.json").read_text())
    s_config = json.loads((out / "config.json").read_text())
    assert (
        s_config["num_hidden_layers"] == 1
        and s_config["architectures"] == t_config["architectures"]
    )
    assert s_config.get("id2label") == t_config.get("id2label")
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("soft_loss" in m and "hard_loss" in m for m in metrics)
    kept = json.loads((out / "eval_results.json").read_text())
    again = evaluate_model(str(out), name, str(data), precision="fp32", **options)
    assert again[kept_metric(kept)] == pytest.approx(kept[kept_metric(kept)], abs=1e-6)
    arch = getattr(transformers, t_config["architectures"][0])
    theirs = arch.from_pretrained(out).eval()
    from bertforge import heads
    from bertforge.checkpoint import architectures

    ours = getattr(heads, architectures(out)[0]).from_pretrained(out).eval()
    enc = Tokenizer.from_pretrained(out)(["a fine film", "the cat sat on the mat"])
    if task == "swag":
        enc = {k: v.unsqueeze(0) for k, v in enc.items()}
    with torch.no_grad():
        a, b = ours(**enc), theirs(**enc)
    for field in ("start_logits", "end_logits") if task == "squad2" else ("logits",):
        assert torch.allclose(getattr(a, field), getattr(b, field), atol=1e-5)
    assert best


def kept_metric(kept: dict[str, object]) -> str:
    return next(k for k in ("accuracy", "spearman", "f1", "exact") if k in kept)


def _narrow_config(tmp: Path, hidden: int, heads: int, layers: int = 2) -> Path:
    path = tmp / "student_config.json"
    path.write_text(
        json.dumps(
            {
                "num_hidden_layers": layers,
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "intermediate_size": 2 * hidden,
            }
        )
    )
    return path


def test_a_fresh_narrower_student_with_projections_and_attention_transfer(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--student-size config.json: a 2-layer, width-192 student of MiniLM (12 heads, as the
    teacher: attention transfer), its projections in the checkpoints, not in the student;
    sentence-transformers loads it with bertforge's vectors (192 dimensions)."""
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "student"
    config = _narrow_config(tmp_path, 192, 12)
    args = [
        "distill",
        "--teacher",
        str(minilm_dir),
        "--out",
        str(out),
        "--data",
        str(corpus(tmp_path / "text.txt")),
        "--student-size",
        str(config),
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--hidden-weight",
        "0.1",
        "--attention-weight",
        "0.1",
        "--no-progress",
        "--precision",
        "fp32",
        "--keep-checkpoints",  # a finished run keeps none by default; this test reads one
        "1",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "2 layers, width 192" in printed and "teacher layers [2, 5]" in printed
    (step,) = (out / "checkpoints").iterdir()
    assert set(load_file(step / "projections.safetensors")) == {
        f"{i}.{w}" for i in range(3) for w in ("weight", "bias")
    }
    assert not (out / "projections.safetensors").exists()
    assert all("projections" not in k for k in load_file(out / "model.safetensors"))
    ref = st.SentenceTransformer(str(out), device="cpu").encode(SENTENCES[:4])
    ours = Pipeline(out, precision="fp32").embed(SENTENCES[:4])
    assert ours.shape == (4, 192) and np.abs(ours - ref).max() < 1e-4
    bad = [*args[:4], str(tmp_path / "x"), *args[5:]]
    bad[bad.index(str(config))] = str(_narrow_config(tmp_path, 192, 6))
    assert main(bad) == 2 and "attention transfer needs the same number" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_task_distillation_resumes_to_identical_parameters(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Task distillation into a fresh, narrower student (projections trained too), killed
    after its first epoch's checkpoint: the same student and projections as a run left alone."""
    from bertforge.train.finetune import FinetuneConfig
    from bertforge.train.finetune import run as finetune

    data = _csv(tmp_path / "t.tsv", 64)
    teacher = tmp_path / "teacher"
    finetune(
        FinetuneConfig(
            model=str(tiny_model),
            task="csv",
            train=str(data),
            out=str(teacher),
            epochs=1,
            batch_size=8,
            progress=False,
        )
    )
    config = _narrow_config(tmp_path, 64, 2, layers=1)

    def cmd(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bertforge",
            "distill",
            "--teacher",
            str(teacher),
            "--task",
            "csv",
            "--train",
            str(data),
            "--dev",
            str(data),
            "--out",
            str(out),
            "--student-size",
            str(config),
            "--epochs",
            "3",
            "--batch-size",
            "8",
            "--hidden-weight",
            "0.5",
            "--no-progress",
            "--keep-checkpoints",  # the last checkpoints of both runs are compared below
            "1",
        ]

    run_whole_and_killed(cmd, tmp_path, "step-00000008")
    for name in (
        "model.safetensors",
        "checkpoints/step-00000024/projections.safetensors",
        "checkpoints/step-00000024/model.safetensors",
    ):
        a, b = load_file(tmp_path / "A" / name), load_file(tmp_path / "B" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert json.loads((tmp_path / "A" / "eval_results.json").read_text()) == json.loads(
        (tmp_path / "B" / "eval_results.json").read_text()
    )


@pytest.mark.slow
def test_two_processes_distil_as_one(tmp_path: Path, minilm_dir: Path) -> None:
    """torchrun --nproc_per_node 2 (gloo, CPU), a narrower fresh student with projections and
    the same global batch: the same losses as one process (dropout off: its masks are per
    process)."""
    from bertforge import BertForPreTraining
    from tests.conftest import TINY

    tok = Tokenizer.from_pretrained(minilm_dir)
    teacher = tmp_path / "teacher"
    config = BertConfig(
        **{**TINY, "vocab_size": tok.vocab_size},
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertForPreTraining(config).save_pretrained(teacher)
    tok.save_pretrained(teacher)
    text = corpus(tmp_path / "text.txt", 64)
    student = _narrow_config(tmp_path, 64, 2, layers=1)

    def distil(out: Path, *launcher: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                *launcher,
                "bertforge",
                "distill",
                "--teacher",
                str(teacher),
                "--out",
                str(out),
                "--data",
                str(text),
                "--student-size",
                str(student),
                "--steps",
                "6",
                "--batch-size",
                "8",
                "--hidden-weight",
                "0.5",
                "--log-every",
                "1",
                "--precision",
                "fp32",
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )

    one = distil(tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = distil(
        tmp_path / "two", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"
    )
    assert two.returncode == 0, two.stderr[-3000:]

    def losses(out: Path) -> list[float]:
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == 6 and max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (a, b)


def test_two_stages_a_general_student_then_the_task(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture
) -> None:
    """TinyBERT's two stages: a general student of layer 1 (`--student-layers 1`), then
    `--student DIR` for task distillation from a fine-tuned teacher: the student starts from
    that checkpoint (its layer, not the teacher's), taught by teacher layer 1 (the uniform map)."""
    from bertforge.train.finetune import FinetuneConfig
    from bertforge.train.finetune import run as finetune

    general = tmp_path / "general"
    assert (
        main(
            [
                "distill",
                "--teacher",
                str(tiny_model),
                "--out",
                str(general),
                "--data",
                str(corpus(tmp_path / "text.txt")),
                "--student-layers",
                "1",
                "--steps",
                "2",
                "--batch-size",
                "8",
                "--no-progress",
            ]
        )
        == 0
    )
    data = _csv(tmp_path / "t.tsv", 16)
    teacher = tmp_path / "teacher"
    finetune(
        FinetuneConfig(
            model=str(tiny_model),
            task="csv",
            train=str(data),
            out=str(teacher),
            epochs=1,
            batch_size=8,
            progress=False,
        )
    )
    capsys.readouterr()
    out = tmp_path / "task"
    assert (
        main(
            [
                "distill",
                "--teacher",
                str(teacher),
                "--task",
                "csv",
                "--train",
                str(data),
                "--student",
                str(general),
                "--out",
                str(out),
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--no-progress",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"into {general} (1 layers" in printed and "teacher layers [1] of 0..1" in printed
    start = BertModel.from_pretrained(general).state_dict()
    trained = load_file(out / "model.safetensors")
    assert trained["classifier.weight"].shape[0] == 2  # the teacher's labels
    assert any(
        not torch.equal(trained[f"bert.{k}"], v) for k, v in start.items() if f"bert.{k}" in trained
    )
    bad = [
        "distill",
        "--teacher",
        str(teacher),
        "--task",
        "csv",
        "--train",
        str(data),
        "--student",
        str(tmp_path / "missing"),
        "--out",
        str(tmp_path / "y"),
    ]
    assert main(bad) == 2 and "missing" in capsys.readouterr().err


def test_general_distillation_reads_special_tokens_strings_as_text(minilm_dir: Path) -> None:
    """Corpus rows are prepare's: "[SEP]" written in a sentence is text, not a control id;
    other sentences are the tokenizer's rows, cut the same way."""
    from bertforge.train.distill import corpus_rows

    tok = Tokenizer.from_pretrained(minilm_dir)
    plain = ["A plain sentence about cats.", "word " * 40]
    rows = corpus_rows(tok, plain, 16)
    want = tok.encode_batch(plain, max_length=16)
    assert [r.tolist() for r in rows.input_ids] == [e.ids for e in want]
    [row] = corpus_rows(tok, ["use [SEP] between [MASK] segments"], 64).input_ids
    sep, mask = tok.convert_tokens_to_ids(["[SEP]", "[MASK]"])
    assert row[-1] == sep and sep not in row[1:-1].tolist() and mask not in row.tolist()


@pytest.mark.parametrize("task", ["retrieval", "rerank"])
def test_task_distillation_refuses_retrieval_and_rerank(
    task: str, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture
) -> None:
    """Their losses are over (B, C, T) rows of passages, with no output distribution to learn:
    refused by the config, before anything is written, naming what teaches them instead."""
    from bertforge.train.distill import DistillConfig

    with pytest.raises(ConfigError, match=f"--task {task}: task distillation"):
        DistillConfig(teacher="-", out="-", student_layers="0", task=task, train="-")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"query": "q", "positive": "p", "negatives": ["n"]}) + "\n")
    out = tmp_path / "student"
    args = ["distill", "--teacher", str(tiny_model), "--task", task, "--train", str(data)]
    assert main([*args, "--student-layers", "0", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--task {task}: task distillation" in err and "bertforge mine --teacher" in err
    assert not out.exists()
