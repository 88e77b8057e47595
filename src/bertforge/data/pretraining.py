"""The pre-training batch stream: shards -> instances -> masked, padded batches.

Instances are next-sentence pairs (Google's), or with `packed=True` rows of contiguous text
(masked LM only; see instances.plan_packed). One global, deterministic stream of instances per
epoch: shards in a seeded order, each
shard's instances planned and shuffled with a generator seeded by (seed, version, shard).
`version` is the epoch (dynamic masking: fresh pairs and masks every epoch), or the epoch
modulo `dupe_factor` (static masking, as Google's pipeline with dupe_factor copies).

Global batches are consecutive runs of `batch_size` instances; within windows of
GROUP_BATCHES batches, instances are sorted by length so that little is padded, and the
window's batches are then shuffled. Rank r of W takes rows r, r+W, ... of every global batch,
so the union over ranks is the same global batch whatever the number of processes, and each
rank reads only the tokens of its own rows. A position (epoch, window start, batches done)
says where the stream is; resuming from it gives the same batches as never stopping.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import KW_ONLY, asdict, dataclass
from typing import Any

import numpy as np
import torch

from .instances import (
    IGNORE_INDEX,
    MaskingSpec,
    mask_tokens,
    packed_stream,
    plan_packed,
    plan_shard,
)
from .shards import Shard, ShardSet

GROUP_BATCHES = 32  # batches per window of length-sorted instances (see the module docstring)


@dataclass
class Position:
    """Where the stream is: the epoch, the index of the current window's first instance in
    that epoch, and how many of the window's batches were already used."""

    epoch: int = 0
    window_start: int = 0
    batches_done: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Batch:
    """A rank's rows of one global batch, as model inputs and targets."""

    input_ids: torch.Tensor  # (b, T)
    token_type_ids: torch.Tensor  # (b, T)
    attention_mask: torch.Tensor  # (b, T)
    mlm_positions: torch.Tensor  # (b, P) indices into T, padded with 0
    mlm_labels: torch.Tensor  # (b, P) original ids, IGNORE_INDEX where padded
    nsp_labels: torch.Tensor  # (b,) 0 = IsNext, 1 = NotNext
    num_tokens: int = 0  # real (unpadded) tokens
    padded: bool = True  # whether any row is shorter than T (False: attend without a mask)

    def to(self, device: torch.device | str) -> Batch:
        """On `device`; from pinned host memory when that is a GPU, so that the copies run
        while the GPU works."""
        pin = torch.device(device).type == "cuda"
        moved = {
            k: (v.pin_memory() if pin else v).to(device, non_blocking=True)
            for k, v in self.__dict__.items()
            if isinstance(v, torch.Tensor)
        }
        return Batch(**moved, num_tokens=self.num_tokens, padded=self.padded)


@dataclass(eq=False)
class PretrainingStream:
    """Batches for pre-training from a prepared directory (see the module docstring)."""

    shards: ShardSet
    spec: MaskingSpec
    cls_id: int
    sep_id: int
    pad_id: int
    _: KW_ONLY
    split: str = "train"
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    seed: int = 0
    dupe_factor: int | None = None
    packed: bool = False

    def __post_init__(self) -> None:
        self.names = self.shards.names(self.split)
        if not self.names:
            raise ValueError(f"{self.shards.directory}: no {self.split} shards")
        self._shard_cache: dict[str, Shard] = {}
        self._packed_cache: dict[str, np.ndarray] = {}

    # -- the instance stream ---------------------------------------------------------------------

    def version(self, epoch: int) -> int:
        return epoch if self.dupe_factor is None else epoch % self.dupe_factor

    def _shard(self, name: str) -> Shard:
        shard = self._shard_cache.get(name)
        if shard is None:
            if len(self._shard_cache) > 4:
                self._shard_cache.pop(next(iter(self._shard_cache)))
            shard = self._shard_cache[name] = self.shards.load(name)
        return shard

    def _tokens(self, name: str) -> np.ndarray:
        """What instance spans index: the shard's tokens, or its packed stream."""
        if not self.packed:
            return self._shard(name).tokens
        stream = self._packed_cache.get(name)
        if stream is None:
            if len(self._packed_cache) > 4:
                self._packed_cache.pop(next(iter(self._packed_cache)))
            shard = self._shard(name)
            stream = packed_stream(shard.tokens, shard.sentences, shard.documents, self.sep_id)
            self._packed_cache[name] = stream
        return stream

    def epoch_instances(self, epoch: int) -> Iterator[tuple[int, np.ndarray]]:
        """(shard number, planned instances) for each shard, in the epoch's order."""
        version = self.version(epoch)
        order = np.random.default_rng([self.seed, version, 0]).permutation(len(self.names))
        for k in order:
            rng = np.random.default_rng([self.seed, version, 1, int(k)])
            if self.packed:
                plans = plan_packed(len(self._tokens(self.names[k])), rng, self.max_seq_length)
            else:
                shard = self._shard(self.names[k])
                plans = plan_shard(
                    shard.sentences, shard.documents, rng, self.max_seq_length, self.short_seq_prob
                )
            yield int(k), plans

    def _instances_from(self, epoch: int, start: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """(epoch, index in epoch, shard number, plan row) from a position onwards, forever."""
        while True:
            index = 0
            empty = True
            for k, plans in self.epoch_instances(epoch):
                empty = empty and len(plans) == 0
                if index + len(plans) <= start:
                    index += len(plans)
                    continue
                for row in range(max(0, start - index), len(plans)):
                    yield epoch, index + row, k, plans[row]
                index += len(plans)
            if empty:
                raise ValueError(f"{self.shards.directory}: the shards hold no usable documents")
            epoch, start = epoch + 1, 0

    # -- batches ---------------------------------------------------------------------------------

    def batches(
        self, batch_size: int, position: Position | None = None, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[Batch, Position]]:
        """This rank's part of each global batch, with the position after it."""
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by {world_size} processes")
        pos = position or Position()
        stream = self._instances_from(pos.epoch, pos.window_start)
        window_size = batch_size * GROUP_BATCHES
        while True:
            window = [next(stream) for _ in range(window_size)]
            epoch, start = window[0][0], window[0][1]
            order = self._window_order(window, epoch, start, batch_size)
            after = Position(window[-1][0], window[-1][1] + 1, 0)
            for b in range(pos.batches_done, len(order)):
                rows = [window[i] for i in order[b][rank::world_size]]
                nxt = after if b + 1 == len(order) else Position(epoch, start, b + 1)
                yield self._collate(rows), nxt
            pos = after

    def _window_order(
        self, window: list[Any], epoch: int, start: int, batch_size: int
    ) -> list[np.ndarray]:
        """Batches of the window: instances sorted by length, cut into batches, shuffled."""
        lengths = np.array([(p[1] - p[0]) + (p[3] - p[2]) for _, _, _, p in window])
        by_length = np.argsort(lengths, kind="stable")
        batches = [by_length[i : i + batch_size] for i in range(0, len(window), batch_size)]
        rng = np.random.default_rng([self.seed, epoch, 2, start])
        return [batches[i] for i in rng.permutation(len(batches))]

    def _collate(self, rows: list[tuple[int, int, int, np.ndarray]]) -> Batch:
        sequences, types, positions, labels, nsp = [], [], [], [], []
        for epoch, _, k, p in rows:
            tokens = self._tokens(self.names[k])
            a, b = (
                np.asarray(tokens[p[0] : p[1]], np.int64),
                np.asarray(tokens[p[2] : p[3]], np.int64),
            )
            ids = np.concatenate(
                ([self.cls_id], a, [self.sep_id], b, [self.sep_id])
                if len(b)
                else ([self.cls_id], a, [self.sep_id])
            )
            # The mask depends on the instance alone, not on batching or the number of ranks.
            rng = np.random.default_rng(
                [self.seed, self.version(epoch), 3, k, int(p[0]), int(p[2])]
            )
            masked, pos, lab = mask_tokens(ids, self.spec, rng)
            sequences.append(masked)
            types.append(
                np.concatenate(
                    (np.zeros(len(a) + 2, np.int64), np.ones(len(b) + (len(b) > 0), np.int64))
                )
            )
            positions.append(pos)
            labels.append(lab)
            nsp.append(int(p[4]))
        attention_mask = pad_rows([np.ones(len(s), np.int64) for s in sequences], 0)
        P = self.spec.max_predictions_per_seq
        return Batch(
            input_ids=torch.from_numpy(pad_rows(sequences, self.pad_id)),
            token_type_ids=torch.from_numpy(pad_rows(types, 0)),
            attention_mask=torch.from_numpy(attention_mask),
            # every batch the same P (the spec's most), so that a compiled step keeps its shapes
            mlm_positions=torch.from_numpy(pad_rows(positions, 0, P)),
            mlm_labels=torch.from_numpy(pad_rows(labels, IGNORE_INDEX, P)),
            nsp_labels=torch.tensor(nsp, dtype=torch.long),
            num_tokens=int(attention_mask.sum()),
            padded=bool(attention_mask.size > attention_mask.sum()),
        )


def pad_rows(rows: Sequence[Sequence[int] | np.ndarray], fill: int, width: int = 0) -> np.ndarray:
    """The rows as one int64 (len(rows), longest row or `width` if more) array, padded at the
    end with `fill`."""
    out = np.full((len(rows), max(width, *(len(r) for r in rows))), fill, np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
