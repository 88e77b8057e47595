"""Training checkpoints: everything needed to continue a run exactly where it stopped.

RUN/checkpoints/step-00001000/
    config.json, model.safetensors, vocab.txt, ...   the model, loadable with from_pretrained
    trainer_state.pt                                  optimizer, loss scaler, RNG states
                                                      (read back with weights_only=True)
    trainer_state.json                                step, data position, anything else
A checkpoint is written into a temporary directory (checkpoints/.tmp-step-N-PID) and renamed
into place, so a crash never leaves a half-written one, and the next start of the run removes
the temporary directory a kill left behind; the last `keep` are kept. RUN/run.json holds the
run's settings and whether it finished (`RunDir`, its one writer): the same settings resume the
run, and run.json, not checkpoints/, says whether it finished.

What a finished run keeps is its config's `keep_checkpoints`: the last N checkpoints (pretrain:
at least 1, so that more --steps can go on from the last), or with 0 (finetune's and distill's
default) none: checkpoints/, the optimizer's state mostly, is removed once run.json says
finished, and the run directory holds the model alone.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import load_state, load_torch, read_tensors
from ..errors import CheckpointError, ConfigError
from ..fileio import read_json, refuse_overwrite, write_json
from .distributed import Dist, barrier

STATE = "trainer_state.pt"
INFO = "trainer_state.json"
Saver = Callable[[Path], None]  # writes an output (the model, the tokenizer) into a directory


def run_settings(cfg: Any, volatile: Collection[str]) -> dict[str, Any]:
    """What defines a run: its config but the settings that may change when it resumes."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in volatile}


def check_run(run_dir: Path, cfg: Any, volatile: Collection[str]) -> dict[str, Any] | None:
    """run.json of an existing run (None: a new run): the same settings resume it; others are
    an error naming them (a setting added since the run started reads as its default)."""
    path = run_dir / "run.json"
    if not path.is_file():
        return None
    saved = read_json(path, CheckpointError)
    mine = run_settings(cfg, volatile)
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    theirs = {k: saved.get("settings", {}).get(k, defaults[k]) for k in mine}
    diff = sorted(k for k in mine if theirs[k] != mine[k])
    if diff:
        shown = ", ".join(f"{k}: {theirs[k]!r} -> {mine[k]!r}" for k in diff)
        raise ConfigError(f"{run_dir} holds a run with other settings ({shown}); use another --out")
    return saved


# what a run reads (directories: models, shards; files: a task's, a config.json): --out is
# none of them and lies inside none of them
RUN_INPUTS = ("model", "init", "teacher", "data", "train", "dev", "config", "student_size")


def check_output(out: Path, cfg: Any) -> None:
    """--out is not one of the run's inputs nor inside one (finetune --out = --model would
    write the fine-tuned model over the pre-trained one; --out MODEL/run, files into it):
    ConfigError naming both, before anything is written (fileio.refuse_overwrite)."""
    flags = {f.name: f.metadata.get("flag") or f"--{f.name}" for f in dataclasses.fields(cfg)}
    inputs = {
        f"run's {flags[name].replace('_', '-')}": getattr(cfg, name)
        for name in RUN_INPUTS
        if name in flags
    }
    refuse_overwrite(out, inputs, "--out")


class RunDir:
    """A training command's output directory as one run: run.json holds the settings (the
    config's fields but its RESUMABLE ones), `record` and whether the run finished. The main
    process writes it."""

    def __init__(self, path: str | Path, cfg: Any, d: Dist, **record: Any) -> None:
        """Checks an existing run against cfg (check_run). `record`: values kept beside the
        settings, which a finished run must match to count as finished (pre-training's steps:
        a finished run given more steps goes on)."""
        self.path, self.cfg, self.d, self.record = Path(path), cfg, d, record
        check_output(self.path, cfg)
        self.settings = run_settings(cfg, cfg.RESUMABLE)
        self.saved = check_run(self.path, cfg, cfg.RESUMABLE)

    def finished(self, message: str) -> dict[str, Any] | None:
        """The saved run.json if this run already finished (`message` shown), else None."""
        saved = self.saved or {}
        if not saved.get("finished") or any(saved.get(k) != v for k, v in self.record.items()):
            return None
        if self.d.is_main:
            print(f"{self.path}: {message}")
        return saved

    def start(self, message: str) -> None:
        """run.json: not finished, so that a killed run resumes; `message` shown."""
        self._write(message, finished=False)

    def finish(self, result: dict[str, Any], message: str, *save: Saver, **summary: Any) -> bool:
        """After train(): unless `result` was interrupted, the main process writes the outputs
        (each of `save` into the directory: the model, the tokenizer), then run.json: finished,
        with `summary`; `message` shown; then, if the config keeps no checkpoints
        (keep_checkpoints=0), removes checkpoints/. Every process waits for it. Whether it
        finished."""
        done = not result["interrupted"]
        if done:
            self._write(message, save, finished=True, **summary)
            if self.d.is_main and getattr(self.cfg, "keep_checkpoints", 1) == 0:
                shutil.rmtree(self.path / "checkpoints", ignore_errors=True)
        barrier(self.d)
        return done

    def _write(self, message: str, save: tuple[Saver, ...] = (), **status: Any) -> None:
        if self.d.is_main:
            self.path.mkdir(parents=True, exist_ok=True)
            for write in save:  # before run.json says finished: the outputs are complete
                write(self.path)
            write_json(self.path / "run.json", {"settings": self.settings, **self.record, **status})
            print(message)


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / INFO).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def remove_temporary(run_dir: Path) -> None:
    """Remove the temporary directories of checkpoint saves a kill interrupted (`save` writes
    them): at the start of a run, when its one writer is not saving."""
    for tmp in (run_dir / "checkpoints").glob(".tmp-step-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def save(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    info: dict[str, Any],
    keep: int = 3,
    extra_files: Any = None,
) -> Path:
    """Write checkpoint `step` atomically; `extra_files(dir)` may add e.g. the tokenizer."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp)  # type: ignore[operator]
    if extra_files is not None:
        extra_files(tmp)
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng,
        },
        tmp / STATE,
    )
    write_json(tmp / INFO, {"step": step, **info})
    if final.exists():  # the same step saved again (e.g. at a signal right after a save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any
) -> dict[str, Any]:
    """Restore model, optimizer, scaler and RNG states from a checkpoint; returns its info."""
    try:
        info = read_json(path / INFO, CheckpointError)
        state = load_torch(path / STATE, "a trainer state")
    except Exception as e:  # truncated or foreign files
        raise CheckpointError(f"{path}: unreadable training checkpoint ({e})") from None
    if hasattr(model, "load_checkpoint"):  # a model with more than one weights file
        model.load_checkpoint(path)
    else:
        tensors, origin = read_tensors(path)
        load_state(model, tensors, origin)
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return info
