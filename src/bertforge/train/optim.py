"""Optimizers and the learning-rate schedule of BERT.

AdamW (decoupled weight decay) as in the paper's recipe, or LAMB (You et al. 2019) for large
batches. Weight decay skips LayerNorm parameters and biases, as Google's optimizer does.
Schedule: linear warmup to the peak, then linear decay to zero at the last step (over all the
steps after warmup, or over the last ones only: warmup-stable-decay). On a time budget
(`TimeBudget`: pretrain --minutes) the same schedule runs over the budget's time, not its steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

OPTIMIZERS = ("adamw", "lamb")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed (weight matrices, embeddings) and not (LayerNorm, biases)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # a shared parameter once
        if not p.requires_grad:
            continue
        if name.endswith("bias") or p.ndim == 1:  # LayerNorm's (H,) weights and biases
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class Lamb(torch.optim.Optimizer):
    """LAMB: Adam's update with decoupled weight decay, scaled per tensor by the trust ratio
    ||w|| / ||update|| (1 where either norm is zero), as in You et al. (2019), Algorithm 2."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt().add_(group["eps"]))
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where(
                    (w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm)
                )
                p.add_(update, alpha=-group["lr"] * float(trust))
        return loss


def build_optimizer(
    model: nn.Module,
    name: str = "adamw",
    lr: float = 1e-4,
    weight_decay: float = 0.01,
    eps: float = 1e-6,
) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        device = next(model.parameters()).device
        # The fused kernel is the fastest on CPU and CUDA alike.
        fused = device.type in ("cpu", "cuda")
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=eps, fused=fused)
    if name == "lamb":
        return Lamb(groups, lr=lr, eps=eps)
    raise ValueError(f"optimizer {name!r}: must be one of {', '.join(OPTIMIZERS)}")


def lr_factor(
    step: int, warmup_steps: int, total_steps: int, decay_steps: int | None = None
) -> float:
    """Multiplier of the peak learning rate for optimizer step `step` (0-based): linear warmup,
    the peak, then linear decay to zero over the last `decay_steps` (default: every step after
    warmup, the paper's schedule; fewer: warmup-stable-decay)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps if decay_steps is None else decay_steps)
    return max(0.0, min(1.0, (total_steps - step) / span))


# A time budget's schedule is lr_factor's over this many equal slices of its time
BUDGET_SLICES = 10_000


@dataclass(frozen=True)
class TimeBudget:
    """A run's length as seconds of training instead of a step count (pretrain --minutes).
    It trains until the seconds are spent, however long its steps take: a plan fixed from the
    first steps' pace made a busy machine's slow start cut the run short (90 steps in 61 s of
    a 4.3-minute budget). Warmup and decay are shares of the time, so the schedule stretches to
    the steps that actually fit and ends at the budget's end. Like Cramming's (Geiping and
    Goldstein 2022) schedules, a run of it is not reproducible step for step."""

    seconds: float
    warmup_ratio: float  # share of the time of linear warmup
    decay_ratio: float  # share of the time of linear decay at the end (1: all after warmup)

    def lr_factor(self, spent: float) -> float:
        """Multiplier of the peak learning rate for a step begun after `spent` seconds."""
        n = BUDGET_SLICES
        decay = None if self.decay_ratio == 1 else max(1, round(self.decay_ratio * n))
        now = min(n - 1, math.floor(spent / self.seconds * n))
        return lr_factor(now, round(self.warmup_ratio * n), n, decay)

    def spent(self, seconds: float) -> bool:
        """Whether `seconds` of training use the budget up."""
        return seconds >= self.seconds

    def steps_that_fit(self, steps: int, spent: float, step_seconds: float) -> int:
        """The run's length in steps as it looks after `steps` in `spent` seconds: those and
        the steps the time left holds at the latest pace (`step_seconds` each)."""
        left = max(0.0, self.seconds - spent)
        return steps + math.ceil(left / max(step_seconds, 1e-9))


class ThreadChoice:
    """On a CPU, during a time budget: the intra-op thread count that takes more steps a second
    now, all of torch's threads or one. On cores other work holds, the threads of a small step
    wait for each other at every barrier: a tiny BERT's demo took 403 steps in 258 s beside two
    busy loops against 6,719 on the quiet machine, and one thread stepped faster than two there.
    Every `period` seconds of training it times `trial` seconds of steps at the count in use and
    as long at the other (each phase's first step, which may start a thread pool, not counted),
    and keeps the other where it is `margin` times faster, so a machine that gets busy or quiet
    mid-run is followed. Only where steps per second are the goal (a budget's run is not
    reproducible step for step anyway); the caller restores the count at the end."""

    def __init__(
        self,
        threads: int,
        period: float = 60.0,
        trial: float = 3.0,
        margin: float = 1.1,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        self.most, self.current = threads, threads
        self.period, self.trial, self.margin, self.set_threads = period, trial, margin, set_threads
        self.rate: dict[int, float] = {}  # steps/s of each count at the last trial
        self._begin("measure")  # the first comparison starts at once: a busy start is common

    def _begin(self, phase: str) -> None:
        self.phase, self.seconds, self.steps, self.skip = phase, 0.0, 0, 1

    def took(self, seconds: float) -> str | None:
        """Record a step of `seconds`; a line to show when the count changes."""
        if self.skip:
            self.skip -= 1
            return None
        self.seconds, self.steps = self.seconds + seconds, self.steps + 1
        if self.phase == "run":
            if self.seconds >= self.period - 2 * self.trial:
                self._begin("measure")
            return None
        if self.seconds < self.trial or self.steps < 2:
            return None
        self.rate[self.current] = self.steps / self.seconds
        if self.phase == "measure":  # now the other count, under the same conditions
            self.current = 1 if self.current == self.most else self.most
            self.set_threads(self.current)
            self._begin("trial")
            return None
        tried, kept = self.current, 1 if self.current == self.most else self.most
        self._begin("run")
        if self.rate[tried] > self.margin * self.rate[kept]:
            return (
                f"training on {tried} CPU thread{'s' * (tried > 1)}: "
                f"{self.rate[tried]:.2f} steps/s against {self.rate[kept]:.2f} on {kept} "
                f"({'the cores are busy with other work' if tried == 1 else 'the cores are free again'};"
                f" checked every {self.period:g} s)"
            )
        self.current = kept
        self.set_threads(kept)
        return None


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
