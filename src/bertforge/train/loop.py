"""The training loop (one for pre-training and fine-tuning; no framework).

Each optimizer step: take the step's micro-batches, compute the loss of each under the chosen
precision, accumulate gradients (DDP synchronises only on the last micro-batch), clip, step,
follow the warmup-then-linear-decay schedule. Around it: progress bar and metrics, held-out
evaluation, checkpoints every N steps and on SIGINT/SIGTERM, exact resume. Training that
diverges (a loss or gradient norm that is not finite) stops with one TrainingError before
anything of it is evaluated or saved: no checkpoint after it, no model, run.json unfinished.

What is task-specific comes in through `Task`: the batches (with their resumable position),
the loss of a micro-batch, and the evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import TrainingError
from ..runner import autocast, resolve_precision
from . import checkpoints
from .distributed import Dist, all_reduce_sum
from .logs import MetricsLog
from .optim import build_optimizer, lr_factor, set_lr

# fp16: a loss scale halved this often means that every step overflows (fairseq's min_loss_scale)
MIN_LOSS_SCALE = 1e-4


@dataclass(kw_only=True)
class LoopConfig:
    """What the loop needs, with no defaults of its own: the commands' configs hold them
    (PretrainConfig, FinetuneConfig), and `of` reads the fields of the same names."""

    steps: int
    lr: float
    warmup_steps: int
    decay_steps: int | None  # None: linear decay over every step after warmup
    weight_decay: float
    optimizer: str
    clip_norm: float
    precision: str
    log_every: int
    eval_every: int
    save_every: int
    keep_checkpoints: int
    progress: bool
    seed: int
    adam_eps: float = 1e-6  # BERT's

    @classmethod
    def of(cls, cfg: Any, **values: Any) -> LoopConfig:
        """The fields of `cfg` with these names, and `values` for the others; a field found in
        neither is an error (TypeError), never a default."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{**{n: getattr(cfg, n) for n in names if hasattr(cfg, n)}, **values})


class Task(Protocol):
    """What the loop needs to know about a training task."""

    def batches(self, position: Any) -> Iterator[tuple[list[Any], Any]]:
        """From a saved position (None: the start): (this rank's micro-batches of one optimizer
        step, the position after that step)."""
        ...

    def normalizers(self, micro_batches: list[Any]) -> torch.Tensor:
        """Counts the loss is averaged over (e.g. masked tokens, sequences) for this rank's
        micro-batches; the loop sums them over ranks."""
        ...

    def loss(
        self, model: nn.Module, micro: Any, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to back-propagate, statistics to sum for logging) of one micro-batch; `totals`
        are the step's normalizers summed over all ranks."""
        ...

    def summarize(self, stats: torch.Tensor) -> dict[str, float]:
        """Logged numbers from statistics summed over micro-batches, ranks and steps."""
        ...

    def evaluate(self, model: nn.Module) -> dict[str, float]: ...


class _StopFlag:
    """Set by SIGINT/SIGTERM: finish the current step, save, exit."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train(
    model: nn.Module,
    task: Task,
    cfg: LoopConfig,
    run_dir: Path,
    d: Dist,
    *,
    save_extra: Callable[[Path], None] | None = None,
    describe: str = "train",
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train `model` on `task` for cfg.steps optimizer steps, resuming from RUN's last
    checkpoint if there is one. Returns {"step", "interrupted", "eval": last evaluation}.
    on_eval(step, metrics) runs on every process after each evaluation (e.g. to keep the best
    model)."""
    device = d.device
    model.to(device)
    precision = resolve_precision(cfg.precision, device)
    wrapped: nn.Module = model
    if d.enabled:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    step, position, train_seconds = 0, None, 0.0
    if d.is_main:  # before this run saves anything: what a kill mid-save left
        checkpoints.remove_temporary(run_dir)
    saved = checkpoints.checkpoint_dirs(run_dir)
    if saved:
        info = checkpoints.load(saved[-1], model, optimizer, scaler)
        step, position = info["step"], info["position"]
        train_seconds = float(info.get("train_seconds", 0.0))
        if d.is_main:
            print(f"resuming from {saved[-1]} (step {step:,} of {cfg.steps:,})", flush=True)
    if d.enabled:
        # Each rank its own dropout stream (a resumed run restores rank 0's only: re-derive).
        torch.manual_seed(cfg.seed + 1_000_003 * d.rank + 7_919 * step)
    log = MetricsLog(run_dir, enabled=d.is_main)
    log.truncate_after(step)
    last_eval: dict[str, float] = {}
    diverged = _Divergence(device, scaler)

    def lr_at(s: int) -> float:
        """The learning rate of step s (1 = the first)."""
        return cfg.lr * lr_factor(s - 1, cfg.warmup_steps, cfg.steps, cfg.decay_steps)

    from tqdm.auto import tqdm

    bar = tqdm(
        total=cfg.steps,
        initial=step,
        desc=describe,
        disable=not (cfg.progress and d.is_main),
        dynamic_ncols=True,
    )
    data = task.batches(position)
    stats_sum: torch.Tensor | None = None
    window_tokens, window_start = 0, time.perf_counter()
    model.train()

    def trained_for() -> float:
        """Seconds of training so far (not evaluating or saving), device work included."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return train_seconds + time.perf_counter() - segment_start

    segment_start = time.perf_counter()
    # closed on the way out, an error's too
    with _StopFlag() as stop, contextlib.closing(bar), contextlib.closing(log):
        while step < cfg.steps:
            micro_batches, next_position = next(data)
            lr = lr_at(step + 1)
            set_lr(optimizer, lr)
            step_loss = torch.zeros((), device=device)  # this process's share of the step's loss
            totals = all_reduce_sum(task.normalizers(micro_batches).to(device), d)
            for i, micro in enumerate(micro_batches):
                micro = micro.to(device)
                last = i == len(micro_batches) - 1
                sync: Any = contextlib.nullcontext()
                if not last and d.enabled:  # DDP synchronises on the step's last micro-batch
                    sync = wrapped.no_sync()  # type: ignore[operator]
                with sync:
                    with autocast(precision, device):
                        loss, stats = task.loss(wrapped, micro, totals)
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                stats_sum = stats if stats_sum is None else stats_sum + stats
                step_loss += loss.detach().float()
                window_tokens += micro.num_tokens
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, position = step + 1, next_position
            diverged.update(step, step_loss, grad_norm)

            logging = step % cfg.log_every == 0 or step == cfg.steps
            if logging:
                assert stats_sum is not None
                summed = all_reduce_sum(stats_sum.detach().float(), d)
                tokens = int(
                    all_reduce_sum(torch.tensor([float(window_tokens)], device=device), d).item()
                )
                elapsed = time.perf_counter() - window_start
                numbers = task.summarize(summed)
                numbers.update(
                    lr=lr,
                    grad_norm=float(grad_norm),
                    tokens=tokens,  # non-padding tokens trained on since the last record
                    tokens_per_s=tokens / max(elapsed, 1e-9),
                    train_seconds=round(trained_for(), 3),  # training alone, over resumes
                )
                log.log(step, **numbers)
                bar.set_postfix(
                    loss=f"{numbers.get('loss', float('nan')):.3f}",
                    lr=f"{lr:.2e}",
                    tok_s=f"{numbers['tokens_per_s']:,.0f}",
                    refresh=False,
                )
                stats_sum, window_tokens, window_start = None, 0, time.perf_counter()
            bar.update(1)

            evaluating = cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps)
            stopping = _agree(stop.requested, d)
            saving = (
                (cfg.save_every and step % cfg.save_every == 0) or stopping or step == cfg.steps
            )
            if logging or evaluating or saving:  # the device is read here anyway
                diverged.check(step, d, lr_at)  # so nothing of a diverged model is kept
            if evaluating or saving:
                train_seconds = trained_for()
            if evaluating:
                model.eval()
                with torch.no_grad(), autocast(precision, device):
                    last_eval = task.evaluate(model)
                model.train()
                log.log(
                    step,
                    train_seconds=round(train_seconds, 3),
                    **{f"eval_{k}": v for k, v in last_eval.items()},
                )
                if on_eval is not None:
                    on_eval(step, last_eval)
                if d.is_main and cfg.progress:
                    bar.write(
                        f"step {step:,}: " + ", ".join(f"{k} {v:.4g}" for k, v in last_eval.items())
                    )

            if saving and d.is_main:
                checkpoints.save(
                    run_dir,
                    step,
                    model,
                    optimizer,
                    scaler,
                    {"position": position, "precision": precision, "train_seconds": train_seconds},
                    keep=cfg.keep_checkpoints,
                    extra_files=save_extra,
                )
            if evaluating or saving:
                segment_start = time.perf_counter()
            if stopping:
                break
    interrupted = step < cfg.steps
    if interrupted and d.is_main:
        print(
            f"stopped at step {step:,}; checkpoint saved in {run_dir / 'checkpoints'}: run the "
            "same command to resume"
        )
    return {"step": step, "interrupted": interrupted, "eval": last_eval, "precision": precision}


class _Divergence:
    """Training that diverged: the first step whose loss or gradient norm is not finite.

    Under fp16 an overflowing gradient is the loss scaler's business (it skips the step and
    halves the scale), so there only the loss counts, and a scale fallen below MIN_LOSS_SCALE:
    every step overflows. The values stay on the device, and `check` reads them only at steps
    where the loop reads the device anyway (logging, evaluation, saving): no synchronisation of
    its own per step."""

    def __init__(self, device: torch.device, scaler: Any) -> None:
        self.scaler = scaler
        self.step = torch.zeros((), dtype=torch.long, device=device)  # the first bad step; 0: none
        self.values = torch.zeros(2, device=device)  # its loss and gradient norm

    def update(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        values = torch.stack([loss.float(), grad_norm.detach().float()])
        watched = values if self.scaler is None else values[:1]
        first = (self.step == 0) & ~torch.isfinite(watched).all()
        self.step = torch.where(first, step, self.step)
        self.values = torch.where(first, values, self.values)

    def check(self, now: int, d: Dist, lr_at: Callable[[int], float]) -> None:
        """TrainingError on every process if any process saw a step diverge."""
        step = int(self.step)
        advice = "nothing was saved as the model; lower --lr (and use a new --out)"
        if _agree(step > 0, d):
            if step == 0:
                raise TrainingError(f"step {now:,}: training diverged on another process; {advice}")
            loss, norm = self.values.tolist()
            what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", norm)
            raise TrainingError(
                f"step {step:,}: the {what} is {value:g} (lr {lr_at(step):.3g}): training "
                f"diverged; {advice}"
            )
        if self.scaler is not None and (scale := self.scaler.get_scale()) < MIN_LOSS_SCALE:
            raise TrainingError(
                f"step {now:,}: the fp16 loss scale fell to {scale:.3g}, the gradients overflow "
                f"at every step (lr {lr_at(now):.3g}): training diverged; {advice}, or train in "
                "bf16 or fp32 (--precision)"
            )


def _agree(flag: bool, d: Dist) -> bool:
    """True on every rank if it is true on any rank (asked to stop, saw training diverge)."""
    if not d.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    return bool(all_reduce_sum(t, d).item() > 0)
