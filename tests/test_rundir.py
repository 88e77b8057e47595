"""checkpoints.RunDir: the run directory of every training command (run.json): a new run, a
resumed one, other settings refused, a finished run reported as finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bertforge.errors import ConfigError
from bertforge.train.checkpoints import RunDir, run_settings
from bertforge.train.distill import DistillConfig
from bertforge.train.distributed import Dist
from bertforge.train.finetune import FinetuneConfig
from bertforge.train.pretrain import PretrainConfig


def _finetune(tmp_path: Path, **changes: Any) -> FinetuneConfig:
    return FinetuneConfig(model="m", task="sst2", train="t", out=str(tmp_path / "run"), **changes)


def _saved(run: RunDir) -> dict[str, Any]:
    return json.loads((run.path / "run.json").read_text(encoding="utf-8"))


def test_a_new_run_starts_then_finishes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _finetune(tmp_path)
    run = RunDir(cfg.out, cfg, Dist())
    assert run.saved is None and run.finished("finished") is None
    run.start("starting")
    settings = run_settings(cfg, cfg.RESUMABLE)
    assert _saved(run) == {"settings": settings, "finished": False}
    assert "lr" in settings and "progress" not in settings
    written: list[Path] = []
    assert run.finish({"interrupted": False}, "done", written.append, best={"accuracy": 0.5})
    assert written == [run.path]
    assert _saved(run) == {"settings": settings, "finished": True, "best": {"accuracy": 0.5}}
    assert capsys.readouterr().out.splitlines() == ["starting", "done"]


def test_an_interrupted_run_resumes_and_a_finished_one_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = _finetune(tmp_path)
    run = RunDir(cfg.out, cfg, Dist())
    run.start("starting")
    written: list[Path] = []
    assert not run.finish({"interrupted": True}, "done", written.append, best={})
    assert written == [] and _saved(run)["finished"] is False

    # resumable settings may change; the run goes on
    resumed = RunDir(cfg.out, _finetune(tmp_path, progress=False, log_every=1), Dist())
    assert resumed.saved == _saved(run) and resumed.finished("finished") is None
    resumed.finish({"interrupted": False}, "done", best={"accuracy": 0.5})

    capsys.readouterr()
    again = RunDir(cfg.out, cfg, Dist())
    assert again.finished("already finished") == _saved(run)
    assert capsys.readouterr().out == f"{run.path}: already finished\n"


def test_other_settings_are_refused_naming_them(tmp_path: Path) -> None:
    cfg = _finetune(tmp_path)
    RunDir(cfg.out, cfg, Dist()).start("starting")
    with pytest.raises(ConfigError) as e:
        RunDir(cfg.out, _finetune(tmp_path, lr=1e-3, seed=1), Dist())
    assert str(e.value) == (
        f"{tmp_path / 'run'} holds a run with other settings (lr: 3e-05 -> 0.001, seed: 0 -> 1); "
        "use another --out"
    )


def test_a_finished_run_counts_only_with_the_same_record(tmp_path: Path) -> None:
    """Pre-training records its steps: a finished run given more steps goes on."""
    cfg = PretrainConfig(data="d", out=str(tmp_path / "run"), steps=10)
    run = RunDir(cfg.out, cfg, Dist(), steps=cfg.steps)
    run.start("starting")
    run.finish({"interrupted": False}, "done", final={"step": 10})
    assert list(_saved(run)) == ["settings", "steps", "finished", "final"]
    assert _saved(run)["steps"] == 10 and "steps" not in _saved(run)["settings"]
    assert RunDir(cfg.out, cfg, Dist(), steps=cfg.steps).finished("finished")
    more = PretrainConfig(data="d", out=str(tmp_path / "run"), steps=20)
    assert RunDir(more.out, more, Dist(), steps=more.steps).finished("finished") is None


def test_only_the_main_process_writes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = _finetune(tmp_path)
    RunDir(cfg.out, cfg, Dist(rank=1, world_size=2)).start("starting")
    assert not (tmp_path / "run").exists() and capsys.readouterr().out == ""


def test_what_the_commands_record() -> None:
    """The settings a resumed run may change, and distillation's defaults by mode, as run.json
    records them."""
    # compile: how the step runs, not what it computes (a resumed run may change it)
    assert {"progress", "device", "log_every", "keep_checkpoints", "compile"} == (
        FinetuneConfig.RESUMABLE
    )
    assert DistillConfig.RESUMABLE == FinetuneConfig.RESUMABLE
    assert {
        "steps",
        "save_every",
        "eval_every",
        "log_every",
        "keep_checkpoints",
        "progress",
        "device",
        "compile",
    } == PretrainConfig.RESUMABLE
    keys = ("batch_size", "lr", "hidden_weight", "dropout", "token_weight")
    general = DistillConfig(teacher="t", out="o", student_layers="0", data=["x"])
    task = DistillConfig(teacher="t", out="o", student_layers="0", task="sst2", train="t")
    assert [run_settings(general, general.RESUMABLE)[k] for k in keys] == [64, 1e-3, 0.01, 0, 1]
    assert [run_settings(task, task.RESUMABLE)[k] for k in keys] == [32, 1e-4, 0, None, 0]
