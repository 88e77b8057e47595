"""`bertforge pretrain` end to end: exact resume after SIGKILL, 2-process DDP, outputs, signals."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertConfig, BertForPreTraining, Tokenizer
from bertforge.data.shards import prepare
from bertforge.train.checkpoints import checkpoint_dirs
from bertforge.train.optim import Lamb, lr_factor, param_groups
from tests.conftest import read_more_than_once
from tests.test_shards import write_corpus


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("pretrain")
    files = write_corpus(root / "corpus", docs=240)
    prepare(
        files,
        Tokenizer.from_pretrained(minilm_dir),
        root / "shards",
        shard_tokens=4000,
        heldout=0.1,
        progress=False,
    )
    return root / "shards"


@pytest.fixture(scope="module")
def nodrop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny.json"
    BertConfig.from_size("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save(
        path
    )
    return path


def pretrain_cmd(
    data: Path, out: Path, *extra: str, model: tuple[str, str] = ("--model-size", "tiny")
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bertforge",
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(out),
        *model,
        "--batch-size",
        "8",
        "--max-seq-length",
        "64",
        "--precision",
        "fp32",
        "--no-progress",
        "--log-every",
        "1",
        *extra,
    ]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, **kw)


def losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def finished_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("runs") / "A"
    args = [
        "--steps",
        "24",
        "--save-every",
        "8",
        "--eval-every",
        "8",
        "--eval-batches",
        "2",
        "--micro-batch-size",
        "4",
    ]
    result = run(pretrain_cmd(data, out, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    return out, args


def torchrun(cmd: list[str], processes: int = 2) -> list[str]:
    """A `python -m bertforge ...` command under torchrun."""
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [cmd[0], *launch, *cmd[1:]]


def process_tree(pid: int) -> list[int]:
    """pid and its descendants, parents first (Linux: /proc/PID/task/TID/children)."""
    found, i = [pid], 0
    while i < len(found):
        for task in Path(f"/proc/{found[i]}/task").glob("*"):
            with contextlib.suppress(OSError):
                found.extend(int(c) for c in (task / "children").read_text().split())
        i += 1
    return found


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    return False


def kill_and_resume(
    data: Path,
    reference: Path,
    out: Path,
    args: list[str],
    at_step: int,
    before_resume: Callable[[], None] | None = None,
    launch: Callable[[list[str]], list[str]] = lambda cmd: cmd,
) -> None:
    """Run into `out` (as `launch` makes the command: e.g. torchrun), SIGKILL it (all of its
    processes) once checkpoint `at_step` exists, run the same command again: the parameters and
    the logged losses equal those of the uninterrupted `reference` (which `before_resume` may
    make, from what the killed run wrote)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        launch(pretrain_cmd(data, out, *args)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.time() + 300
    while not (out / "checkpoints" / f"step-{at_step:08d}").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert time.time() < deadline
        time.sleep(0.02)
    killed = process_tree(proc.pid)  # torchrun's workers run in sessions of their own
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    while any(Path(f"/proc/{pid}/status").exists() and not _zombie(pid) for pid in killed[1:]):
        time.sleep(0.01)  # the workers are gone before the run starts again
    assert not (out / "model.safetensors").exists()  # it really died before the end
    if before_resume is not None:
        before_resume()
    result = run(launch(pretrain_cmd(data, out, *args)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stdout
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert losses(reference) == losses(out)  # the same curve, resumed steps logged once


@pytest.mark.slow
def test_sigkill_and_resume_ends_with_identical_parameters(
    data: Path, finished_run, tmp_path: Path
) -> None:
    """Killed after a checkpoint, its metrics.jsonl ending in half a record (what a kill in the
    middle of an append leaves): the same command resumes, the torn line dropped with the
    records after the checkpoint, and ends as the run never stopped."""
    reference, args = finished_run

    def tear() -> None:
        with open(tmp_path / "B" / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write('{"step": 17, "lo')

    kill_and_resume(data, reference, tmp_path / "B", args, at_step=16, before_resume=tear)


@pytest.mark.slow
def test_two_processes_follow_one_process(data: Path, nodrop: Path, tmp_path: Path) -> None:
    """torchrun with 2 CPU processes (gloo) and the same global batch: the same losses.
    Dropout is off: its masks are drawn per process and could not match one process's."""
    common = ["--steps", "6", "--save-every", "0", "--eval-every", "0"]
    model = ("--config", str(nodrop))
    single = run(pretrain_cmd(data, tmp_path / "one", *common, model=model))
    assert single.returncode == 0, single.stderr[-3000:]
    double = run(torchrun(pretrain_cmd(data, tmp_path / "two", *common, model=model)))
    assert double.returncode == 0, double.stderr[-3000:]
    assert "2 process(es)" in double.stdout
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [s for s, _ in one] == [s for s, _ in two] == list(range(1, 7))
    assert max(abs(x - y) for (_, x), (_, y) in zip(one, two)) < 1e-5, (one, two)


@pytest.mark.slow
def test_two_processes_killed_and_resumed_end_as_never_stopped(data: Path, tmp_path: Path) -> None:
    """With dropout each process draws its own masks; killed and resumed, every process draws
    what it would have drawn (a checkpoint holds rank 0's random state only)."""
    args = ["--steps", "40", "--save-every", "4", "--eval-every", "0", "--dropout", "0.1"]
    reference = run(torchrun(pretrain_cmd(data, tmp_path / "A", *args)))
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert "2 process(es)" in reference.stdout
    kill_and_resume(data, tmp_path / "A", tmp_path / "B", args, at_step=4, launch=torchrun)


@pytest.mark.slow
def test_outputs_of_a_finished_run(finished_run, tmp_path: Path) -> None:
    out, _ = finished_run
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "vocab.txt",
        "tokenizer_config.json",
        "metrics.jsonl",
        "run.json",
        "tensorboard",
        "checkpoints",
    } <= names
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-00000008",
        "step-00000016",
        "step-00000024",
    ]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_mlm_acc" in r]
    assert [r["step"] for r in evals] == [8, 16, 24]
    for r in evals:
        assert (
            0 <= r["eval_mlm_acc"] <= 1 and 0 <= r["eval_nsp_acc"] <= 1 and r["eval_perplexity"] > 1
        )
    train_rows = [r for r in rows if "loss" in r]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]  # it learns something
    assert all(r["tokens_per_s"] > 0 for r in train_rows)

    # the final model loads in transformers' BertForPreTraining and gives the same logits
    import transformers

    ours = BertForPreTraining.from_pretrained(out)
    theirs = transformers.BertForPreTraining.from_pretrained(str(out)).eval()
    batch = Tokenizer.from_pretrained(out)(["the quick brown fox"], ["jumps over the dog"])
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert (a.mlm_logits - b.prediction_logits).abs().max() < 1e-4
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < 1e-4

    # TensorBoard can read the event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [r["step"] for r in train_rows]
    assert abs(loss[-1].value - train_rows[-1]["loss"]) < 1e-5
    assert [e.step for e in acc.Scalars("eval_mlm_acc")] == [8, 16, 24]

    plot = subprocess.run(
        [sys.executable, "-m", "bertforge", "plot", str(out), "--out", str(tmp_path / "c.png")],
        capture_output=True,
        text=True,
    )
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_rerun_of_a_finished_run_and_changed_settings(data: Path, finished_run) -> None:
    out, args = finished_run
    again = run(pretrain_cmd(data, out, *args))
    assert again.returncode == 0 and "already finished" in again.stdout
    changed = run(pretrain_cmd(data, out, *[a if a != "4" else "2" for a in args]))
    assert changed.returncode == 2
    assert "holds a run with other settings (micro_batch_size: 4 -> 2)" in changed.stderr


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_the_same_command_resumes(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "C"
    common = ["--save-every", "0", "--eval-every", "0"]
    cmd = pretrain_cmd(data, out, "--steps", "400", *common)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 300
    while (
        not (out / "metrics.jsonl").exists()
        or len((out / "metrics.jsonl").read_text().splitlines()) < 3
    ):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130  # stopped, not finished
    assert "stopped at step" in stdout and "run the same command to resume" in stdout
    (saved,) = (out / "checkpoints").iterdir()
    step = int(saved.name.split("-")[1])
    assert 3 <= step < 400
    # the same command (here with fewer steps, which a resumed run may change) continues
    resumed = run(pretrain_cmd(data, out, "--steps", str(step + 3), *common))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {saved} (step {step:,} of {step + 3:,})" in resumed.stdout
    assert [s for s, _ in losses(out)] == list(range(1, step + 4))


@pytest.mark.slow
def test_phase_two_continues_at_a_longer_sequence_length(
    data: Path, finished_run, tmp_path: Path
) -> None:
    first, _ = finished_run
    out = tmp_path / "phase2"
    cmd = pretrain_cmd(data, out, "--steps", "3", "--save-every", "0", "--eval-every", "0")
    i = cmd.index("--model-size")
    cmd[i : i + 2] = ["--init", str(first)]
    cmd[cmd.index("--max-seq-length") + 1] = "128"
    result = run(cmd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert BertConfig.from_pretrained(out) == BertConfig.from_pretrained(first)


@pytest.mark.slow
def test_bad_arguments_give_one_line_errors(data: Path, tmp_path: Path) -> None:
    missing = run(pretrain_cmd(tmp_path / "nothing", tmp_path / "x", "--steps", "1"))
    assert (
        missing.returncode == 2 and "no meta.json, not a prepared data directory" in missing.stderr
    )
    too_long = run(pretrain_cmd(data, tmp_path / "y", "--steps", "1", "--max-seq-length", "1024"))
    assert (
        too_long.returncode == 2
        and "max_seq_length=1024 is more than the model's 512 positions" in too_long.stderr
    )


def test_a_resume_on_other_data_is_refused(tmp_path: Path, minilm_dir: Path) -> None:
    """--data names a directory: prepared again from other text, the run does not go on
    from its checkpoint on it; prepared again from the same files, it does."""
    from bertforge.errors import DataError
    from bertforge.train.pretrain import PretrainConfig
    from bertforge.train.pretrain import run as pretrain

    files = write_corpus(tmp_path / "corpus", docs=40)
    tok, shards = Tokenizer.from_pretrained(minilm_dir), tmp_path / "shards"
    prepare(files, tok, shards, shard_tokens=4000, progress=False)
    cfg = {"data": str(shards), "out": str(tmp_path / "run"), "model_size": "tiny"}
    small = {"batch_size": 4, "max_seq_length": 32, "eval_every": 0, "progress": False}
    assert not pretrain(PretrainConfig(**cfg, **small, steps=1))["interrupted"]
    shutil.rmtree(shards)
    prepare(files[:2], tok, shards, shard_tokens=4000, progress=False)
    with pytest.raises(DataError, match=r"run was trained on other data than .*shards holds now"):
        pretrain(PretrainConfig(**cfg, **small, steps=2))
    shutil.rmtree(shards)
    prepare(files, tok, shards, shard_tokens=4000, progress=False)  # the same files again
    assert pretrain(PretrainConfig(**cfg, **small, steps=2))["step"] == 2


def test_nsp_warns_of_shards_of_a_single_document(tmp_path: Path, minilm_dir: Path) -> None:
    from bertforge.data.shards import ShardSet
    from bertforge.train.distributed import Dist
    from bertforge.train.pretrain import PretrainConfig, make_task

    book = tmp_path / "book.txt"  # hard-wrapped prose: the whole file one document
    book.write_text("\n\n".join("the cat sat\non the mat and\nlooked at me" for _ in range(30)))
    prepare([book], Tokenizer.from_pretrained(minilm_dir), tmp_path / "one", progress=False)
    shards = ShardSet(tmp_path / "one")
    cfg = PretrainConfig(data=str(shards.directory), out="-", eval_every=0)
    with pytest.warns(UserWarning, match=r"1 of 1 training shards .* hold a single document"):
        make_task(cfg, shards, Dist())


def test_tokens_per_s_counts_training_time_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock that evaluation and saving move by 1,000 s (a step by a few ms), the logged
    throughput is that of the steps: evaluation and checkpoint time stay out of its window."""
    from bertforge.train import loop
    from bertforge.train.distributed import Dist

    now = [0.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    monkeypatch.setattr(loop.time, "perf_counter", clock)
    cfg = loop.LoopConfig(
        steps=6, lr=1e-3, warmup_steps=0, decay_steps=None, weight_decay=0.0, optimizer="adamw",
        clip_norm=1.0, precision="fp32", log_every=3, eval_every=2, save_every=5,
        keep_checkpoints=1, progress=False, seed=0,
    )  # fmt: skip
    loop.train(_Linear(now), _ClockTask(now), cfg, tmp_path, Dist())
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in rows if "tokens_per_s" in r]
    assert [r["step"] for r in records] == [3, 6]
    for r in records:  # 300 tokens in 3 steps of a few clock ticks each
        assert r["tokens_per_s"] > 1000, r
        assert r["train_seconds"] < 1, r


def test_a_time_budget_trains_until_it_is_spent_whatever_its_first_steps_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy machine's start: 3 steps of 10 s, then steps of 0.1 s, on a 100 s budget. A plan
    fixed from the first steps stopped after 10 steps (30 s); the budget trains until its
    seconds are spent (about 700 more steps), warms up over its first 5% (here: step 1, which
    took 10), holds the peak, and decays over its last 20% to (nearly) zero at its end."""
    from bertforge.train import loop
    from bertforge.train.distributed import Dist
    from bertforge.train.optim import TimeBudget

    now = [0.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])

    class BusyStart(_ClockTask):
        steps = 0

        def loss(self, model: torch.nn.Module, micro: _Micro, totals: torch.Tensor):
            self.steps += 1
            now[0] += 10.0 if self.steps <= 3 else 0.1
            return super().loss(model, micro, totals)

    cfg = loop.LoopConfig(
        steps=10, lr=1e-3, warmup_steps=0, decay_steps=None, weight_decay=0.0, optimizer="adamw",
        clip_norm=1.0, precision="fp32", log_every=1, eval_every=0, save_every=0,
        keep_checkpoints=1, progress=False, seed=0,
        budget=TimeBudget(seconds=100.0, warmup_ratio=0.05, decay_ratio=0.2),
    )  # fmt: skip
    result = loop.train(_Linear(now), BusyStart(now), cfg, tmp_path, Dist())
    assert not result["interrupted"] and 100.0 <= result["train_seconds"] < 100.11
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert result["step"] == rows[-1]["step"] and 3 + 700 <= result["step"] <= 3 + 701
    lr = {r["step"]: r["lr"] for r in rows}
    began = {r["step"] + 1: r["train_seconds"] for r in rows} | {1: 0.0}  # the time spent before
    assert lr[1] < 1e-5  # the first step, at the start of the warmup
    peak = [s for s in lr if 5 <= began[s] < 80]
    assert all(lr[s] == 1e-3 for s in peak) and len(peak) > 400
    decay = [lr[s] for s in lr if began[s] >= 80.01]
    assert decay == sorted(decay, reverse=True) and decay[0] < 1e-3 and len(decay) > 190
    assert lr[result["step"]] < 1e-5  # the schedule ends where the time does


class _Linear(torch.nn.Linear):
    """A model whose saving takes 1,000 s of the test's clock."""

    def __init__(self, now: list[float]) -> None:
        super().__init__(4, 1)
        self.now = now

    def save_pretrained(self, directory: Path) -> None:
        self.now[0] += 1000.0
        (Path(directory) / "weights.txt").write_text(str(self.weight.tolist()))


class _Micro:
    num_tokens = 100

    def to(self, device: object) -> _Micro:
        return self


class _ClockTask:
    """A task whose evaluation takes 1,000 s of the test's clock."""

    def __init__(self, now: list[float]) -> None:
        self.now = now

    def batches(self, position: object):
        while True:
            yield [_Micro()], None

    def normalizers(self, micro_batches: list[_Micro]) -> torch.Tensor:
        return torch.ones(1)

    def loss(self, model: torch.nn.Module, micro: _Micro, totals: torch.Tensor):
        loss = model(torch.ones(1, 4)).square().sum()
        return loss, loss.detach().reshape(1)

    def summarize(self, stats: torch.Tensor) -> dict[str, float]:
        return {"loss": float(stats[0])}

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        self.now[0] += 1000.0
        return {"score": 1.0}


def test_param_groups_schedule_and_lamb() -> None:
    model = BertForPreTraining(BertConfig.from_size("tiny", vocab_size=300))
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all("norm" in names[id(p)] or names[id(p)].endswith("bias") for p in no_decay["params"])
    assert all(p.ndim == 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    factors = [lr_factor(s, 10, 100) for s in range(100)]
    assert factors[0] == 0.1 and factors[9] == 1.0 and factors[10] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(factors[10:])) and factors[
        -1
    ] == pytest.approx(1 / 90)
    # LAMB minimises a least-squares problem
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(20, 5))
    x, y = torch.randn(200, 20), torch.randn(200, 5)
    opt = Lamb([w], lr=0.05, weight_decay=0.0)
    first = None
    for _ in range(100):
        loss = ((x @ w - y) ** 2).mean()
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


# ------------------------------------------------------------------------------------------------
# Masked LM alone (--no-nsp), --dropout, and the loss against transformers step by step


def test_packed_rows_cross_sentences_and_documents(data: Path) -> None:
    from bertforge.data.instances import MaskingSpec
    from bertforge.data.pretraining import PretrainingStream
    from bertforge.data.shards import ShardSet

    shards = ShardSet(data)
    tok = shards.tokenizer()
    spec = MaskingSpec.from_tokens(
        tok.tokens,
        tok.mask_id,
        frozenset({tok.cls_id, tok.sep_id, tok.pad_id}),
        masked_lm_prob=1e-9,
        max_predictions_per_seq=1,
    )
    stream = PretrainingStream(
        shards, spec, tok.cls_id, tok.sep_id, tok.pad_id, max_seq_length=64, packed=True
    )
    rows = [r for _, plans in stream.epoch_instances(0) for r in plans]
    full = sum(r[1] - r[0] == 62 for r in rows)
    assert full >= len(rows) - 2 * len(
        shards.names("train")
    )  # at most the ends of a shard are short
    # every shard's tokens once per epoch, with a [SEP] at each document boundary
    for name in shards.names("train"):
        shard = shards.load(name)
        packed = stream._tokens(name)
        n_docs = len(shard.documents) - 1
        assert len(packed) == len(shard.tokens) + n_docs - 1
        # document d starts at token t_d; the d-1 [SEP]s before it shift it to t_d + d - 1
        seps = shard.sentences[shard.documents[1:-1]] + np.arange(n_docs - 1)
        assert (packed[seps] == tok.sep_id).all() and (packed == tok.sep_id).sum() >= n_docs - 1
    batch, _ = next(stream.batches(16))
    masks = batch.attention_mask.bool()
    assert masks.all(1).float().mean() > 0.8  # rows are full: no padding inside them
    ids = batch.input_ids[masks.all(1)]
    assert (ids[:, 0] == tok.cls_id).all() and (ids[:, -1] == tok.sep_id).all()
    assert (batch.token_type_ids == 0).all()
    assert (ids[:, 1:-1] == tok.sep_id).sum() > 0  # some row crosses a document boundary
    # a new epoch cuts elsewhere
    again = [r for _, plans in stream.epoch_instances(1) for r in plans]
    assert sorted(map(tuple, again)) != sorted(map(tuple, rows))


@pytest.mark.slow
def test_no_nsp_run_writes_a_masked_lm_that_transformers_loads(data: Path, tmp_path: Path) -> None:
    import transformers

    from bertforge.heads import BertForMaskedLM

    out = tmp_path / "mlm"
    result = run(
        pretrain_cmd(
            data,
            out,
            "--no-nsp",
            "--dropout",
            "0",
            "--steps",
            "12",
            "--eval-every",
            "6",
            "--eval-batches",
            "2",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    assert (
        config["hidden_dropout_prob"] == 0.1
    )  # --dropout is for pre-training; the model keeps its own
    names = set(load_file(out / "model.safetensors"))
    assert not any("seq_relationship" in n or "pooler" in n for n in names)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_loss" not in r and "eval_nsp_acc" not in r for r in rows)
    assert [r["step"] for r in rows if "eval_mlm_loss" in r] == [6, 12]
    assert all(r["train_seconds"] > 0 for r in rows)
    ours = BertForMaskedLM.from_pretrained(out)
    theirs = transformers.BertForMaskedLM.from_pretrained(str(out)).eval()
    batch = Tokenizer.from_pretrained(out)(["the quick brown [MASK] jumps over the dog"])
    with torch.no_grad():
        assert (ours(**batch).mlm_logits - theirs(**batch).logits).abs().max() < 1e-4


def test_dropout_option_reaches_the_model(data: Path) -> None:
    from bertforge.train.pretrain import PretrainConfig, build_model

    tok = Tokenizer.from_pretrained(data)
    for p in (0.0, 0.3):
        model = build_model(
            PretrainConfig(data=str(data), out="-", model_size="tiny", dropout=p), tok
        )
        layer = model.bert.layers[0]
        assert (layer.p, layer.attn_dropout) == (p, p) and model.config.hidden_dropout_prob == 0.1
    model = build_model(PretrainConfig(data=str(data), out="-", model_size="tiny"), tok)
    assert model.bert.layers[0].p == 0.1


@pytest.mark.slow
def test_no_nsp_with_dropout_killed_and_resumed_is_bit_identical(
    data: Path, tmp_path: Path
) -> None:
    args = [
        "--no-nsp",
        "--dropout",
        "0.2",
        "--steps",
        "16",
        "--save-every",
        "4",
        "--eval-every",
        "8",
        "--eval-batches",
        "1",
    ]
    reference = run(pretrain_cmd(data, tmp_path / "A", *args))
    assert reference.returncode == 0, reference.stderr[-3000:]
    kill_and_resume(data, tmp_path / "A", tmp_path / "B", args, at_step=8)


def test_losses_equal_transformers_step_for_step(data: Path, nodrop: Path) -> None:
    """Our pre-training (the code that trains: PretrainingTask.loss on bertforge's own
    batches, AdamW with BERT's parameter groups) against transformers' BertForPreTraining on
    the same weights and batches, 8 optimizer steps, fp32, no dropout."""
    import transformers

    from bertforge.data.shards import ShardSet
    from bertforge.train.distributed import Dist
    from bertforge.train.optim import build_optimizer
    from bertforge.train.pretrain import PretrainConfig, PretrainingTask, build_model

    cfg = PretrainConfig(
        data=str(data), out="-", config=str(nodrop), batch_size=8, max_seq_length=64, lr=1e-3
    )
    shards = ShardSet(data)
    tok = shards.tokenizer()
    torch.manual_seed(0)
    ours = build_model(cfg, tok)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ours.save_pretrained(d)
        theirs = transformers.BertForPreTraining.from_pretrained(d)
    theirs.train()
    from bertforge.data.instances import MaskingSpec
    from bertforge.data.pretraining import PretrainingStream

    spec = MaskingSpec.from_tokens(
        tok.tokens,
        tok.mask_id,
        frozenset({tok.cls_id, tok.sep_id, tok.pad_id}),
        max_predictions_per_seq=10,
    )
    stream = PretrainingStream(shards, spec, tok.cls_id, tok.sep_id, tok.pad_id, max_seq_length=64)
    task = PretrainingTask(stream, {}, cfg, Dist())
    opt_a = build_optimizer(ours, "adamw", 1e-3, 0.01)
    opt_b = build_optimizer(theirs, "adamw", 1e-3, 0.01)
    diffs = []
    for (micro, _), _ in zip(task.batches(None), range(8)):
        (batch,) = micro
        loss_a, _ = task.loss(ours, batch, task.normalizers([batch]))
        labels = hf_mlm_labels(batch)
        loss_b = theirs(
            input_ids=batch.input_ids,
            token_type_ids=batch.token_type_ids,
            attention_mask=batch.attention_mask,
            labels=labels,
            next_sentence_label=batch.nsp_labels,
        ).loss
        diffs.append(abs(loss_a.item() - loss_b.item()))
        step_both((ours, loss_a, opt_a), (theirs, loss_b, opt_b))
    assert max(diffs) < 1e-5, diffs


def hf_mlm_labels(batch: Any) -> torch.Tensor:
    """A pre-training batch's masked-LM targets as transformers takes them: (B, T) with the
    original id at each masked position, -100 elsewhere."""
    labels = torch.full_like(batch.input_ids, -100)
    rows = torch.arange(len(labels))[:, None].expand_as(batch.mlm_positions)
    real = batch.mlm_labels != -100
    labels[rows[real], batch.mlm_positions[real]] = batch.mlm_labels[real]
    return labels


def step_both(*runs: tuple[torch.nn.Module, torch.Tensor, Any]) -> None:
    """An optimizer step of each (model, loss, optimizer), as the loop takes one: backward,
    clip at 1.0, step, zero the gradients."""
    for model, loss, opt in runs:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()


def test_warmup_stable_decay_schedule() -> None:
    wsd = [lr_factor(s, 10, 100, decay_steps=20) for s in range(100)]
    assert wsd[:10] == [(s + 1) / 10 for s in range(10)]
    assert all(f == 1.0 for f in wsd[10:80])  # the peak holds
    assert wsd[80] == 1.0 and wsd[90] == pytest.approx(0.5) and wsd[99] == pytest.approx(0.05)
    assert [lr_factor(s, 10, 100, decay_steps=90) for s in range(100)] == [
        lr_factor(s, 10, 100) for s in range(100)
    ]


def test_minutes_train_until_the_time_is_spent_and_keep_the_steps(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bertforge.cli import main

    argv = pretrain_cmd(data, tmp_path / "M", "--minutes", "0.1", "--eval-every", "0")[3:]
    assert main(argv) == 0
    said = capsys.readouterr().out
    saved = json.loads((tmp_path / "M" / "run.json").read_text())
    steps, seconds = saved["steps"], saved["final"]["train_seconds"]
    assert saved["finished"] and saved["settings"]["minutes"] == 0.1 and steps >= 2
    assert "--minutes 0.1: training for 6 s" in said
    assert f"--minutes 0.1: {steps:,} steps in {seconds:.1f} s of training" in said
    rows = [json.loads(ln) for ln in (tmp_path / "M" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    # the last step began before the budget was spent and ended after
    assert rows[-2]["train_seconds"] < 6.0 <= rows[-1]["train_seconds"] <= seconds
    assert main(argv) == 0  # finished at the count it reached: not trained again
    said = capsys.readouterr().out
    assert f"already finished ({steps:,} steps)" in said and "training for" not in said


@pytest.mark.slow
def test_minutes_killed_and_resumed_go_on_with_the_time_left(data: Path, tmp_path: Path) -> None:
    """A --minutes run's checkpoint keeps its seconds of training: killed and resumed, the run
    goes on from there (the steps after the checkpoint done again) and stops when the budget is
    spent in all, not a new budget after the resume."""
    out = tmp_path / "B"
    cmd = pretrain_cmd(data, out, "--minutes", "0.1", "--save-every", "4", "--eval-every", "0")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 300
    while not (out / "checkpoints" / f"step-{8:08d}").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        assert time.time() < deadline
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert not (out / "model.safetensors").exists()  # it really died before the end
    last = checkpoint_dirs(out)[-1]
    before = json.loads((last / "trainer_state.json").read_text())
    result = run(cmd)
    assert result.returncode == 0, result.stderr[-3000:]
    said = f"(step {before['step']:,}; {before['train_seconds']:.1f} s of its 6 s budget trained)"
    assert f"resuming from {last} {said}" in result.stdout
    saved = json.loads((out / "run.json").read_text())
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, saved["steps"] + 1))  # each step once
    # the step after the checkpoint went on from its time, and the budget is spent once
    assert rows[before["step"]]["train_seconds"] > before["train_seconds"]
    assert rows[-2]["train_seconds"] < 6.0 <= rows[-1]["train_seconds"]


def _steps_under(choice: Any, seconds_per_step: Callable[[int], float], n: int) -> list[str]:
    """Feed `n` steps to a ThreadChoice, each as long as seconds_per_step(its thread count)
    says; the lines it printed."""
    lines = []
    for _ in range(n):
        if line := choice.took(seconds_per_step(choice.current)):
            lines.append(line)
    return lines


def test_thread_choice_takes_one_thread_on_busy_cores_and_all_again_when_free() -> None:
    """On cores other work holds, a small step's threads wait for each other (the demo beside
    two busy loops took 403 steps where the quiet machine took 6,719): a time budget's run
    times one thread against all and keeps the faster, and follows the machine as it changes."""
    from bertforge.train.optim import ThreadChoice

    set_to: list[int] = []
    choice = ThreadChoice(2, period=20.0, trial=1.0, set_threads=set_to.append)
    busy = {2: 0.5, 1: 0.2}  # seconds a step: two threads slower than one
    said = _steps_under(choice, busy.__getitem__, 12)
    assert choice.current == 1 and set_to == [1]  # tried one thread and kept it
    assert len(said) == 1 and said[0].startswith("training on 1 CPU thread: 5.00 steps/s")
    assert "against 2.00 on 2" in said[0] and "busy" in said[0]
    # the machine gets quiet: at the next check, two threads are faster again
    quiet = {2: 0.1, 1: 0.2}
    said = _steps_under(choice, quiet.__getitem__, 200)
    assert choice.current == 2 and set_to[-1] == 2 and len(said) == 1 and "free again" in said[0]
    # nearly equal: no switch back and forth (the margin), the count in use kept
    even = {2: 0.1, 1: 0.098}
    before = len(set_to)
    assert _steps_under(choice, even.__getitem__, 400) == [] and choice.current == 2
    assert set(set_to[before:]) <= {1, 2} and set_to[-1] == 2  # trials only, back each time


def test_a_time_budget_run_gives_back_torch_threads_it_changed(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The thread choice runs on a CPU time budget only, says when it changes the count, and
    leaves torch's thread count as it found it (the demo fine-tunes in the same process)."""
    from bertforge.cli import main
    from bertforge.train import loop, optim

    class Eager(optim.ThreadChoice):  # switches to one thread at its first step, however slow
        def took(self, seconds: float) -> str | None:
            if self.current == 1:
                return None
            self.current = 1
            self.set_threads(1)
            return "training on 1 CPU thread (the test's choice)"

    monkeypatch.setattr(loop, "ThreadChoice", Eager)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        argv = pretrain_cmd(data, tmp_path / "M", "--minutes", "0.05", "--eval-every", "0")[3:]
        assert main(argv) == 0
        assert "training on 1 CPU thread" in capsys.readouterr().out
        assert torch.get_num_threads() == 2
        argv = pretrain_cmd(data, tmp_path / "S", "--steps", "3", "--eval-every", "0")[3:]
        assert main(argv) == 0  # a step count: no choice made (its steps are reproducible)
        assert "CPU thread" not in capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)


def test_pretrain_init_reads_each_file_of_its_model_once(
    reads: Any, data: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """--init's tokenizer (checked against the data's), its config and its weights were each
    read apart (config.json three times, the vocabulary twice); one ModelDir reads each once."""
    from bertforge.train.pretrain import PretrainConfig
    from bertforge.train.pretrain import run as pretrain

    init = tmp_path / "init"
    shutil.copytree(tiny_model, init)
    counts = reads(init)
    small = {"batch_size": 4, "max_seq_length": 32, "eval_every": 0, "progress": False}
    cfg = PretrainConfig(data=str(data), out=str(tmp_path / "run"), init=str(init), **small)
    cfg.steps, cfg.precision = 1, "fp32"
    assert pretrain(cfg)["step"] == 1
    assert {"config.json", "vocab.txt"} <= set(counts)
    assert read_more_than_once(counts) == {}
