"""Distributed data parallel through torchrun: NCCL on GPUs, gloo on CPUs.

`torchrun --nproc_per_node N -m bertforge pretrain ...` sets RANK, WORLD_SIZE and LOCAL_RANK;
without them everything runs in one process and these helpers are no-ops.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..runner import device_of


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init(requested_device: str | None = None) -> Dist:
    """Join the process group if launched by torchrun; choose this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = device_of(requested_device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world_size, local_rank, device)


def launched(fn: Callable[[Any, Dist], Any], cfg: Any) -> Any:
    """fn(cfg, dist) inside the process group of a torchrun launch (or alone), left cleanly."""
    d = init(cfg.device)
    try:
        return fn(cfg, d)
    finally:
        if d.enabled and dist.is_initialized():
            dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Sum over processes (in place; returned for convenience)."""
    if d.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()
