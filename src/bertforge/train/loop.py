"""The training loop (one for pre-training and fine-tuning; no framework).

Each optimizer step: take the step's micro-batches, compute the loss of each under the chosen
precision, accumulate gradients (DDP synchronises only on the last micro-batch), clip, step,
follow the warmup-then-linear-decay schedule: over cfg.steps, or over a time budget (train
until its seconds of training are spent, however fast the steps turn out). Around it: progress bar and metrics, held-out
evaluation, checkpoints every N steps and on SIGINT/SIGTERM, exact resume (each process draws
a step's dropout from a seed of (seed, rank, step): the same after a resume, on every process).
Training that diverges (a loss or gradient norm that is not finite) stops with one
TrainingError before anything of it is evaluated or saved: no checkpoint after it, no model,
run.json unfinished.

What is task-specific comes in through `Task`: the batches (with their resumable position),
the loss of a micro-batch, and the evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ..errors import TrainingError
from ..runner import autocast, resolve_precision
from . import checkpoints
from .distributed import Dist, all_reduce_sum
from .logs import MetricsLog
from .optim import ThreadChoice, TimeBudget, build_optimizer, lr_factor, set_lr

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
    compile: bool | None = None  # the step's forward and loss through torch.compile; None: on GPUs
    # train until this budget of training seconds is spent (steps, warmup_steps and
    # decay_steps unused): pretrain --minutes
    budget: TimeBudget | None = None

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
    """Train `model` on `task` for cfg.steps optimizer steps (or cfg.budget's seconds),
    resuming from RUN's last checkpoint if there is one. Returns {"step", "interrupted", "eval":
    last evaluation, "precision", "train_seconds": of training, over resumes}.
    on_eval(step, metrics) runs on every process after each evaluation (e.g. to keep the best
    model)."""
    return _Training(model, task, cfg, run_dir, d, save_extra, on_eval).run(describe)


def _thread_choice(cfg: LoopConfig, d: Dist) -> ThreadChoice | None:
    """A ThreadChoice where steps per second are the goal and the threads are ours to choose:
    a time budget, one process on a CPU of several threads, no OMP_NUM_THREADS set."""
    threads = torch.get_num_threads()
    if cfg.budget is None or d.enabled or d.device.type != "cpu" or threads < 2:
        return None
    return None if os.environ.get("OMP_NUM_THREADS") else ThreadChoice(threads)


class _Training:
    """One call of `train`, in its phases (torchtune's recipes: setup, then the loop): set up
    the model on its device (DDP-wrapped when distributed), the optimizer, the fp16 loss scaler
    and where a resumed run left off (`__init__`, `_resume`); then each optimizer step (`_step`)
    and what follows it (`_after_step`): its record, evaluation, checkpoint."""

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        cfg: LoopConfig,
        run_dir: Path,
        d: Dist,
        save_extra: Callable[[Path], None] | None,
        on_eval: Callable[[int, dict[str, float]], None] | None,
    ) -> None:
        self.model, self.task, self.cfg, self.run_dir, self.d = model, task, cfg, run_dir, d
        self.save_extra, self.on_eval = save_extra, on_eval
        device = self.device = d.device
        model.to(device)
        self.precision = resolve_precision(cfg.precision, device)
        self.wrapped: nn.Module = model
        if d.enabled:
            self.wrapped = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        self.optimizer = build_optimizer(
            model, cfg.optimizer, cfg.lr, cfg.weight_decay, eps=cfg.adam_eps
        )
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        self.loss = compiled(task.loss) if compiles(cfg.compile, device) else task.loss
        self.step, self.position, self.train_seconds = self._resume()
        self.log = MetricsLog(run_dir, enabled=d.is_main)
        self.log.truncate_after(self.step)
        self.last_eval: dict[str, float] = {}
        self.diverged = _Divergence(device, self.scaler)
        # the record's window: statistics and non-padding tokens since the last record
        self.stats_sum: torch.Tensor | None = None
        self.window_tokens, self.window_start = 0, 0.0  # (set as the loop starts)
        self.segment_start = 0.0  # when training last resumed (after setup, evaluation, saving)
        self.spent = self.train_seconds  # on a time budget: training seconds after the last step
        self.window_steps = 0  # steps since the last record (a budget's pace)
        self.lrs: dict[int, float] = {}  # steps' learning rates since the last divergence check
        self.threads = _thread_choice(cfg, d)

    def _resume(self) -> tuple[int, Any, float]:
        """(step, batches' position, seconds of training) of the last checkpoint; (0, None, 0)
        for a fresh run."""
        d, run_dir = self.d, self.run_dir
        if d.is_main:  # before this run saves anything: what a kill mid-save left
            checkpoints.remove_temporary(run_dir)
        saved = checkpoints.checkpoint_dirs(run_dir)
        if not saved:
            return 0, None, 0.0
        info = checkpoints.load(saved[-1], self.model, self.optimizer, self.scaler)
        step, seconds = info["step"], float(info.get("train_seconds", 0.0))
        if d.is_main:
            budget = self.cfg.budget
            of = f" of {self.cfg.steps:,}"
            if budget is not None:
                of = f"; {seconds:.1f} s of its {budget.seconds:g} s budget trained"
            print(f"resuming from {saved[-1]} (step {step:,}{of})", flush=True)
        return step, info["position"], seconds

    def next_lr(self) -> float:
        """The learning rate of the next step: by its place among cfg.steps, or on a time
        budget by the training seconds spent before it. Kept until the divergence check, whose
        message names a past step's."""
        cfg, s = self.cfg, self.step + 1
        if cfg.budget is None:
            factor = lr_factor(s - 1, cfg.warmup_steps, cfg.steps, cfg.decay_steps)
        else:
            factor = cfg.budget.lr_factor(self.spent)
        self.lrs[s] = cfg.lr * factor
        return self.lrs[s]

    def done(self) -> bool:
        """Whether the run has all its steps, or has spent its time budget."""
        if self.cfg.budget is None:
            return self.step >= self.cfg.steps
        return self.cfg.budget.spent(self.spent)

    def _spent_now(self) -> float:
        """Training seconds so far by the host's clock, read after every step of a time budget:
        no device synchronisation (a GPU may have a step or two queued); on several processes
        rank 0's, so that all take the same learning rate and stop at the same step."""
        spent = self.train_seconds + time.perf_counter() - self.segment_start
        if not self.d.enabled:
            return spent
        mine = torch.tensor([spent if self.d.is_main else 0.0], device=self.device)
        return float(all_reduce_sum(mine, self.d).item())

    def trained_for(self) -> float:
        """Seconds of training so far (not evaluating or saving), device work included."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.train_seconds + time.perf_counter() - self.segment_start

    def run(self, describe: str) -> dict[str, Any]:
        """The steps from where the run is to cfg.steps (or the budget's end), or until asked to
        stop."""
        cfg, d = self.cfg, self.d
        from tqdm.auto import tqdm

        bar = tqdm(
            total=cfg.steps if cfg.budget is None else None,  # a budget's: known as it goes
            initial=self.step,
            desc=describe,
            disable=not (cfg.progress and d.is_main),
            dynamic_ncols=True,
        )
        data = self.task.batches(self.position)
        self.window_start = time.perf_counter()
        self.model.train()
        self.segment_start = time.perf_counter()
        threads = torch.get_num_threads()  # a ThreadChoice changes it; the caller's comes back
        # closed on the way out, an error's too
        with _StopFlag() as stop, contextlib.closing(bar), contextlib.closing(self.log):
            try:
                self._loop(data, bar, stop)
            finally:
                torch.set_num_threads(threads)
        interrupted = not self.done()
        if interrupted and d.is_main:
            print(
                f"stopped at step {self.step:,}; checkpoint saved in "
                f"{self.run_dir / 'checkpoints'}: run the same command to resume"
            )
        return {
            "step": self.step,
            "interrupted": interrupted,
            "eval": self.last_eval,
            "precision": self.precision,
            "train_seconds": round(self.train_seconds, 3),
        }

    def _loop(self, data: Iterator[Any], bar: Any, stop: _StopFlag) -> None:
        """Steps until the run is done or asked to stop."""
        cfg, d = self.cfg, self.d
        while not self.done():
            micro_batches, next_position = next(data)
            torch.manual_seed(step_seed(cfg.seed, d.rank, self.step + 1))  # its dropout
            lr = self.next_lr()
            set_lr(self.optimizer, lr)
            began = time.perf_counter()
            step_loss, grad_norm = self._step(micro_batches)
            self._pace(time.perf_counter() - began)
            self.step, self.position = self.step + 1, next_position
            self.window_steps += 1
            if cfg.budget is not None:
                self.spent = self._spent_now()
            self.diverged.update(self.step, step_loss, grad_norm)
            if self._after_step(bar, stop, lr, grad_norm):
                break

    def _pace(self, seconds: float) -> None:
        """A step's seconds to the thread choice (a CPU run on a time budget), which may change
        torch's thread count and says so."""
        if self.threads is not None and (line := self.threads.took(seconds)) and self.d.is_main:
            print(line, flush=True)

    def _step(self, micro_batches: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over this process's micro-batches, gradients accumulated: (this
        process's share of the step's loss, the gradient norm before clipping)."""
        device, d, scaler, optimizer = self.device, self.d, self.scaler, self.optimizer
        step_loss = torch.zeros((), device=device)  # this process's share of the step's loss
        totals = all_reduce_sum(self.task.normalizers(micro_batches).to(device), d)
        for i, micro in enumerate(micro_batches):
            micro = micro.to(device)
            last = i == len(micro_batches) - 1
            sync: Any = contextlib.nullcontext()
            if not last and d.enabled:  # DDP synchronises on the step's last micro-batch
                sync = self.wrapped.no_sync()  # type: ignore[operator]
            with sync:
                with autocast(self.precision, device):
                    loss, stats = self.loss(self.wrapped, micro, totals)
                (scaler.scale(loss) if scaler is not None else loss).backward()
            self.stats_sum = stats if self.stats_sum is None else self.stats_sum + stats
            step_loss += loss.detach().float()
            self.window_tokens += micro.num_tokens
        if scaler is not None:
            scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return step_loss, grad_norm

    def _after_step(self, bar: Any, stop: _StopFlag, lr: float, grad_norm: torch.Tensor) -> bool:
        """What follows a step: its record (every log_every steps and the last), evaluation
        (every eval_every and the last), a checkpoint (every save_every, the last, and when
        asked to stop); True when asked to stop, on any process (then on every one)."""
        cfg, d, step, last = self.cfg, self.d, self.step, self.done()
        logging = step % cfg.log_every == 0 or last
        if logging:
            self._record(bar, lr, grad_norm)
        bar.update(1)

        evaluating = cfg.eval_every and (step % cfg.eval_every == 0 or last)
        stopping = _agree(stop.requested, d)
        saving = (cfg.save_every and step % cfg.save_every == 0) or stopping or last
        if logging or evaluating or saving:  # the device is read here anyway
            self.diverged.check(step, d, self.lrs.__getitem__)  # nothing of a diverged model kept
            self.lrs.clear()
        if evaluating or saving:
            self.train_seconds = self.trained_for()
            paused = time.perf_counter()
            if evaluating:
                self._evaluate(bar)
            if saving and d.is_main:
                self._save()
            # the time of evaluating and saving is not training: out of train_seconds and out
            # of the record's window (its tokens_per_s)
            self.segment_start = time.perf_counter()
            self.window_start += self.segment_start - paused
        return stopping

    def _save(self) -> None:
        """A checkpoint of this step (the main process writes it)."""
        checkpoints.save(
            self.run_dir,
            self.step,
            self.model,
            self.optimizer,
            self.scaler,
            {
                "position": self.position,
                "precision": self.precision,
                "train_seconds": self.train_seconds,
            },
            keep=self.cfg.keep_checkpoints,
            extra_files=self.save_extra,
        )

    def _record(self, bar: Any, lr: float, grad_norm: torch.Tensor) -> None:
        """The window's numbers, summed over processes, into metrics.jsonl and the bar."""
        d, device = self.d, self.device
        assert self.stats_sum is not None
        summed = all_reduce_sum(self.stats_sum.detach().float(), d)
        tokens = int(
            all_reduce_sum(torch.tensor([float(self.window_tokens)], device=device), d).item()
        )
        elapsed = time.perf_counter() - self.window_start
        if self.cfg.budget is not None:  # the steps that fit, at the window's pace
            bar.total = self.cfg.budget.steps_that_fit(
                self.step, self.spent, elapsed / max(1, self.window_steps)
            )
        numbers = self.task.summarize(summed)
        numbers.update(
            lr=lr,
            grad_norm=float(grad_norm),
            tokens=tokens,  # non-padding tokens trained on since the last record
            tokens_per_s=tokens / max(elapsed, 1e-9),
            train_seconds=round(self.trained_for(), 3),  # training alone, over resumes
        )
        self.log.log(self.step, **numbers)
        bar.set_postfix(
            loss=f"{numbers.get('loss', float('nan')):.3f}",
            lr=f"{lr:.2e}",
            tok_s=f"{numbers['tokens_per_s']:,.0f}",
            refresh=False,
        )
        self.stats_sum, self.window_tokens, self.window_start = None, 0, time.perf_counter()
        self.window_steps = 0

    def _evaluate(self, bar: Any) -> None:
        """The task's held-out evaluation, logged, handed to on_eval, shown."""
        step, model = self.step, self.model
        model.eval()
        with torch.no_grad(), autocast(self.precision, self.device):
            self.last_eval = self.task.evaluate(model)
        model.train()
        self.log.log(
            step,
            train_seconds=round(self.train_seconds, 3),
            **{f"eval_{k}": v for k, v in self.last_eval.items()},
        )
        if self.on_eval is not None:
            self.on_eval(step, self.last_eval)
        if self.d.is_main and self.cfg.progress:
            bar.write(
                f"step {step:,}: " + ", ".join(f"{k} {v:.4g}" for k, v in self.last_eval.items())
            )


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


COMPILE_HELP = (
    "the training step through torch.compile (default: on a GPU, where a BERT-base step ran "
    "1.4x faster than eager on an H200; --no-compile: eager, e.g. for a short run)"
)

# Shapes a compiled step sees before it is recompiled no more (the length of a batch's rows, a
# padded batch or not, the last short batch: a handful; dynamic shapes take over after two)
RECOMPILE_LIMIT = 32


def compiles(setting: bool | None, device: torch.device) -> bool:
    """Whether training compiles its step: as asked (--compile / --no-compile), else on CUDA,
    where a compiled step is faster (on the CPU, compiling costs more than the first minutes of
    eager steps gain)."""
    return device.type == "cuda" if setting is None else setting


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a task's loss: the model's forward and the loss of a micro-batch) through
    torch.compile: one graph, its backward compiled with it. A new row length recompiles it
    once as dynamic in that dimension, then not again."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
    )
    return torch.compile(fn)


def step_seed(seed: int, rank: int, step: int) -> int:
    """The torch seed of one process's optimizer step (its dropout masks): a function of
    (seed, rank, step) alone, drawn afresh at every step, so that each process has its own
    stream and a resumed run draws what an uninterrupted one draws on every process (a
    checkpoint holds the random state of the process that writes it only)."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, np.uint64)[0])


def _agree(flag: bool, d: Dist) -> bool:
    """True on every rank if it is true on any rank (asked to stop, saw training diverge)."""
    if not d.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    return bool(all_reduce_sum(t, d).item() > 0)
