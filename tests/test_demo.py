"""`bertforge demo` (bertforge.demo) run again on its directory: stopped by Ctrl-C during
pre-training, it says how to resume and exits 130 rather than going on without a model; the
same command resumes it (on the vocabulary and shards it made); once more on the finished
directory, it shows the same numbers."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from bertforge.cli import main


@pytest.mark.slow
def test_demo_stops_when_interrupted_and_runs_again_on_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from bertforge.demo import run_demo
    from bertforge.train.pretrain import PretrainingTask

    normalizers, calls = PretrainingTask.normalizers, []

    def ctrl_c_in_step_2(self: PretrainingTask, *args: Any) -> Any:
        calls.append(1)  # once a training step (held-out evaluation does not call it)
        if len(calls) == 2:  # as a user's Ctrl-C: the loop ends the step, saves and stops
            signal.raise_signal(signal.SIGINT)
        return normalizers(self, *args)

    monkeypatch.setattr(PretrainingTask, "normalizers", ctrl_c_in_step_2)
    out = tmp_path / "demo"
    with pytest.raises(SystemExit) as stopped:
        main(["demo", "--out", str(out), "--steps", "4", "--no-progress"])
    assert stopped.value.code == 130
    printed = capsys.readouterr().out
    assert "stopped at step 2" in printed
    assert printed.rstrip().endswith("interrupted; run the same command to resume")
    assert (out / "pretrained" / "checkpoints").is_dir()
    assert not (out / "pretrained" / "model.safetensors").exists()
    assert not (out / "classifier").exists()
    monkeypatch.undo()

    small = dict(steps=4, progress=False, sentences=200, epochs=1)
    first = run_demo(out, **small)  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    assert "the vocabulary of an earlier run here" in printed  # the shards' vocabulary
    assert "resuming from" in printed and first["pretrain"]["step"] == 4
    again = run_demo(out, **small)  # type: ignore[arg-type]
    assert "this run already finished (4 steps)" in capsys.readouterr().out
    for key in ("mlm_acc", "after", "top5", "accuracy"):
        assert again[key] == first[key], key


def _spin() -> None:
    while True:
        pass


@pytest.mark.slow
def test_demo_trains_for_its_budget_on_a_busy_machine(tmp_path: Path) -> None:
    """With every core kept busy by other processes (the issue's machine: a plan fixed by timing
    the first, slow steps ran 90 steps in 61 s of a 4.3-minute budget and stopped), the demo
    pre-trains for at least 90% of its time budget, and says so."""
    import multiprocessing
    import os

    from bertforge.demo import run_demo

    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 2)]
    try:
        for p in busy:
            p.start()
        result = run_demo(
            tmp_path / "demo",
            minutes=0.25,
            progress=False,
            sentences=200,
            epochs=1,
            vocab_size=1000,
        )
    finally:
        for p in busy:
            p.kill()
            p.join()
    summary = result["pretrain"]
    assert not summary["interrupted"] and summary["train_seconds"] >= 0.9 * 15
