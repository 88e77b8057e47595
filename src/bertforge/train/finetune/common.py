"""What every fine-tuning task family shares: padded features, length-grouped batches, the
loop's Task protocol, length-sorted inference.

A task family (sentence.py, tagging.py, squad.py, choice.py) subclasses `FinetuneTask`: it
reads its files into examples, turns them into `Features`, computes the loss of a batch and
evaluates/predicts. The loop (train/loop.py) sees only `batches`, `normalizers`, `loss`,
`summarize` and `evaluate`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ...errors import ConfigError
from .. import distributed
from ..loop import resolve_precision

GROUP_BATCHES = 64  # batches per length-sorted window
IGNORE_INDEX = -100  # token labels that do not count (padding, special tokens, later pieces)


@dataclass
class Features:
    """Tokenized rows: ids and segment ids per row, and labels.

    input_ids, token_type_ids: one array per row, (T,), or (C, T) for multiple choice (every
    choice padded to the row's longest). labels: (N,) class indices or float scores, (N, 2)
    answer start/end token indices, or one (T,) array per row of token labels. meta: what a
    task family needs to map rows back to its examples (words' first pieces, SQuAD windows).
    """

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    labels: np.ndarray | list[np.ndarray]
    meta: Any = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((x.shape[-1] for x in self.input_ids), np.int64, len(self.input_ids))


@dataclass
class Batch:
    input_ids: torch.Tensor  # (b, T) or (b, C, T)
    token_type_ids: torch.Tensor  # like input_ids
    attention_mask: torch.Tensor  # like input_ids
    labels: torch.Tensor  # (b,), (b, 2) or (b, T)
    num_tokens: int = 0

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            *(t.to(device, non_blocking=True) for t in dataclasses.astuple(self)[:4]),
            num_tokens=self.num_tokens,
        )


def collate(features: Features, rows: Sequence[int] | np.ndarray, pad_id: int) -> Batch:
    """The rows padded on the right to their longest ([PAD] ids, mask 0, token labels ignored)."""
    T = max(features.input_ids[i].shape[-1] for i in rows)
    lead = features.input_ids[rows[0]].shape[:-1]  # () or (C,)
    B = len(rows)
    ids = np.full((B, *lead, T), pad_id, np.int64)
    types = np.zeros((B, *lead, T), np.int64)
    mask = np.zeros((B, *lead, T), np.int64)
    for j, i in enumerate(rows):
        n = features.input_ids[i].shape[-1]
        ids[j, ..., :n], types[j, ..., :n] = features.input_ids[i], features.token_type_ids[i]
        mask[j, ..., :n] = features.input_ids[i] != pad_id if lead else 1
    if isinstance(features.labels, list):  # token labels
        labels = np.full((B, T), IGNORE_INDEX, np.int64)
        for j, i in enumerate(rows):
            labels[j, : len(features.labels[i])] = features.labels[i]
    else:
        labels = features.labels[np.asarray(rows)]
    return Batch(
        torch.from_numpy(ids),
        torch.from_numpy(types),
        torch.from_numpy(mask),
        torch.from_numpy(labels),
        num_tokens=int(mask.sum()),
    )


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The epoch's batches (row indices): shuffled, length-grouped in windows, shuffled again."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    window = batch_size * GROUP_BATCHES
    for w in range(0, len(order), window):
        rows = order[w : w + window]
        rows = rows[np.argsort(lengths[rows], kind="stable")]
        batches += [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


class FinetuneTask:
    """Batches for the shared loop; subclasses add the loss, evaluation and predictions.

    Subclasses set `head` (the BertFor... class), `metric` (the first metric, which picks the
    best epoch) and implement `loss_sum`, `count`, `evaluate_examples` and `write_predictions`.
    """

    head: ClassVar[type[nn.Module]]
    metric: str = "accuracy"

    def __init__(self, cfg: Any, d: distributed.Dist, pad_id: int) -> None:
        if cfg.batch_size % d.world_size:
            raise ConfigError(
                f"batch_size={cfg.batch_size} must split evenly into {d.world_size} processes"
            )
        self.cfg, self.d, self.pad_id = cfg, d, pad_id
        self.precision = resolve_precision(cfg.precision, d.device)
        self.train: Features | None = None
        self.dev: tuple[Any, Features] | None = None  # (examples, features)
        self.dev_predictions: Any = None  # of the last `evaluate`, for the predictions file

    # -- the loop's Task protocol --------------------------------------------------------------

    @property
    def steps_per_epoch(self) -> int:
        assert self.train is not None
        return math.ceil(len(self.train) / self.cfg.batch_size)

    def batches(self, position: Any) -> Iterator[tuple[list[Batch], Any]]:
        assert self.train is not None
        lengths = self.train.lengths
        epoch, b = (position["epoch"], position["batch"]) if position else (0, 0)
        r, w = self.d.rank, self.d.world_size
        while True:
            batches = epoch_batches(lengths, self.cfg.batch_size, self.cfg.seed, epoch)
            for i in range(b, len(batches)):
                last = i + 1 == len(batches)
                nxt = {"epoch": epoch + 1, "batch": 0} if last else {"epoch": epoch, "batch": i + 1}
                rows = batches[i][r::w]
                if len(rows) == 0:  # a last batch smaller than the number of processes
                    continue
                yield [collate(self.train, rows, self.pad_id)], nxt
            epoch, b = epoch + 1, 0

    def normalizers(self, micro_batches: list[Batch]) -> torch.Tensor:
        return torch.tensor([float(sum(self.count(m) for m in micro_batches))])

    def loss(
        self, model: nn.Module, micro: Batch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss_sum, correct = self.loss_sum(model, micro)
        # The mean over the global batch; x world size because DDP averages over ranks.
        loss = loss_sum / totals[0] * self.d.world_size
        n = torch.tensor(float(self.count(micro)), device=loss_sum.device)
        return loss, torch.stack([loss_sum.detach(), n, correct.float()])

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        out = {"loss": float(s[0] / s[1].clamp(min=1))}
        if self.reports_accuracy:
            out["acc"] = float(s[2] / s[1].clamp(min=1))
        return out

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self.dev is None:
            return {}
        metrics, self.dev_predictions = self.evaluate_examples(model, *self.dev)
        return metrics

    # -- for the subclasses ------------------------------------------------------------------

    reports_accuracy = True

    def count(self, micro: Batch) -> int:
        """What the loss is averaged over in this micro-batch (examples, or labelled tokens)."""
        return len(micro.labels)

    def loss_sum(self, model: nn.Module, micro: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, number of correct predictions) of a micro-batch."""
        raise NotImplementedError

    def evaluate_examples(
        self, model: nn.Module, examples: Any, features: Features
    ) -> tuple[dict[str, float], Any]:
        """(metrics, predictions) on labelled examples."""
        raise NotImplementedError

    def infer(
        self,
        model: nn.Module,
        features: Features,
        outputs: Callable[[Any], torch.Tensor],
        per_token: bool = False,
    ) -> list[np.ndarray]:
        """outputs(model(batch)) for every row, in the features' order: batches of similar
        length (sorted, then restored); per_token: each row's result cut to its own length."""
        order = np.argsort(features.lengths, kind="stable")
        result: list[np.ndarray] = [np.empty(0)] * len(features)
        size = self.cfg.batch_size * 2
        lengths = features.lengths
        for i in range(0, len(order), size):
            rows = order[i : i + size]
            batch = collate(features, rows, self.pad_id).to(self.d.device)
            out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
            values = outputs(out).float().cpu().numpy()
            for j, r in enumerate(rows):
                result[r] = values[j, : lengths[r]] if per_token else values[j]
        return result
