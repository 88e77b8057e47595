"""What every task family shares: features, padded batches, inference over features, and the
family's contract (`TaskFamily`).

A family (sentence.py, tagging.py, squad.py, choice.py) reads its files into examples, turns
them into `Features`, names its head, computes the loss of a batch with the loss function
defined beside it, and decodes the model's outputs into predictions and metrics. Training
(train/supervised.py), `evaluate` / `predict` and the pipelines all go through these methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import BertConfig
from ..data.instances import IGNORE_INDEX
from ..errors import ConfigError, InputError
from ..model import Packing, check_inputs
from ..modeldir import ModelDir
from ..runner import Runner, to_device
from ..tokenizer import Tokenizer


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

    @classmethod
    def from_encodings(cls, encodings: Sequence[Any], meta: Any = None) -> Features:
        """Rows of tokenizer encodings, unlabelled."""
        return cls(
            [np.asarray(e.ids, np.int64) for e in encodings],
            [np.asarray(e.token_type_ids, np.int64) for e in encodings],
            np.zeros(len(encodings), np.int64),
            meta,
        )

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
        # Field by field: dataclasses.astuple would deep-copy every tensor on the host first.
        d = torch.device(device)
        return Batch(
            *(to_device(t, d) for t in (*self.inputs(), self.labels)), num_tokens=self.num_tokens
        )

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.input_ids, self.token_type_ids, self.attention_mask


def collate(
    features: Features,
    rows: Sequence[int] | np.ndarray,
    pad_id: int,
    multiple: int = 1,
    positions: int | None = None,
) -> Batch:
    """The rows padded on the right to their longest ([PAD] ids, mask 0, token labels ignored),
    rounded up to a multiple of `multiple` pieces but not past `positions` (the model's
    max_position_embeddings: a model of 100 positions reads a row of 99 padded to 100, not 112)."""
    B = len(rows)
    lengths = np.fromiter((features.input_ids[i].shape[-1] for i in rows), np.int64, B)
    longest = int(lengths.max())
    T = -(-longest // multiple) * multiple
    if positions is not None:
        T = max(longest, min(T, positions))
    lead = features.input_ids[rows[0]].shape[:-1]  # () or (C,)
    if lead:  # multiple choice: (C, T) per row, choices padded to the row's longest
        ids = np.full((B, *lead, T), pad_id, np.int64)
        types = np.zeros((B, *lead, T), np.int64)
        mask = np.zeros((B, *lead, T), np.int64)
        for j, i in enumerate(rows):
            n = features.input_ids[i].shape[-1]
            ids[j, ..., :n], types[j, ..., :n] = features.input_ids[i], features.token_type_ids[i]
            mask[j, ..., :n] = features.input_ids[i] != pad_id
    else:  # rows one after another, scattered into place in one step each
        real = np.arange(T) < lengths[:, None]
        mask = real.astype(np.int64)
        ids = np.full((B, T), pad_id, np.int64)
        types = np.zeros((B, T), np.int64)
        ids[real] = np.concatenate([features.input_ids[i] for i in rows])
        types[real] = np.concatenate([features.token_type_ids[i] for i in rows])
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


def on_device(
    features: Features,
    rows: np.ndarray,
    lengths: np.ndarray,
    pad_id: int,
    runner: Runner,
    config: BertConfig | None = None,
) -> tuple[Batch, Packing | None]:
    """The rows' batch (collate: padded no further than config's positions) on the runner's
    device; and, where the runner overlaps and the model is an encoder of `config` (or a head
    on one), its rows packed on the host, its ids checked there against config: what
    BertModel's `rows=` takes, so the device reads nothing back (lengths: every row's,
    features.lengths, computed once by the caller)."""
    positions = None if config is None else config.max_tokens
    batch = collate(features, rows, pad_id, runner.pad_multiple, positions)
    packing = None
    if runner.overlaps and config is not None and batch.input_ids.dim() == 2:
        check_inputs(config, batch.input_ids, batch.token_type_ids)
        packing = Packing.of_lengths(lengths[rows], batch.input_ids.shape[1], runner.device)
    return batch.to(runner.device), packing


def infer(
    runner: Runner,
    model: nn.Module,
    features: Features,
    pad_id: int,
    outputs: Callable[[Any], torch.Tensor] = lambda out: out.logits,
    per_token: bool = False,
    encoder: BertConfig | None = None,
) -> list[np.ndarray]:
    """outputs(model(batch)) (the logits) for every row, in the features' order, through the
    runner; per_token: each row's result cut to its own length. encoder: the config of the
    encoder `model` is (or has under its head; its forward takes `rows=`): where the runner
    overlaps, batches are checked and packed on the host (`on_device`)."""
    lengths = features.lengths

    def fn(made: tuple[np.ndarray, Batch, Packing | None]) -> Any:
        rows, batch, packing = made
        extra = {} if packing is None else {"rows": packing}

        def finish(values: np.ndarray) -> list[np.ndarray]:
            return [values[j, : lengths[r]] if per_token else values[j] for j, r in enumerate(rows)]

        return runner.later(outputs(model(*batch.inputs(), **extra)), finish)

    def make(rows: np.ndarray) -> tuple[np.ndarray, Batch, Packing | None]:
        return rows, *on_device(features, rows, lengths, pad_id, runner, encoder)

    return runner(lengths, make, fn)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def softmax(logits: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(logits))


# ------------------------------------------------------------------------------------------------
# Cross-entropy with clear errors (the losses of the classification families)


def check_class_labels(labels: torch.Tensor, num_classes: int, what: str) -> None:
    """Labels in [0, num_classes) or IGNORE_INDEX; otherwise one clear message, not a torch
    IndexError (or a CUDA device assert)."""
    if labels.is_floating_point():
        raise InputError(f"{what} must be integer class ids, got dtype {labels.dtype}")
    if torch.compiler.is_compiling():  # a compiled training step: its labels were checked as read
        return
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
    if bool(bad.any()):
        value = int(labels[bad][0])
        raise InputError(
            f"{what} contains {value}: must be in [0, {num_classes}) or {IGNORE_INDEX} (ignored)"
        )


def reduce(total: torch.Tensor, count: torch.Tensor | int, reduction: str) -> torch.Tensor:
    """A summed loss as the mean over `count` (at least 1) or as the sum."""
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ConfigError(f"reduction={reduction!r}: must be mean or sum")
    if isinstance(count, int):
        return total / max(count, 1)
    return total / count.clamp(min=1)


def classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Single-label classification: logits (..., K), labels (...) in [0, K) or IGNORE_INDEX
    (skipped). Cross-entropy in fp32: the mean over the labelled rows (HF's loss), or the sum."""
    if labels.shape != logits.shape[:-1]:
        raise InputError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(logits.shape[:-1])} "
            f"for logits {tuple(logits.shape)}"
        )
    check_class_labels(labels, logits.shape[-1], "labels")
    flat = labels.reshape(-1)
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        flat,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return reduce(total, (flat != IGNORE_INDEX).sum(), reduction)


def soft_cross_entropy(
    student: torch.Tensor,
    teacher: torch.Tensor,
    temperature: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Summed temperature^2 x KL(softmax(teacher / t) || softmax(student / t)) over the leading
    positions (those of `mask`, if given) of logits (..., K): the soft-target loss of
    distillation; its gradient is that of the cross-entropy with the teacher's soft targets."""
    t = float(temperature)
    log_s = F.log_softmax(student.float() / t, dim=-1)
    log_t = F.log_softmax(teacher.float() / t, dim=-1)
    per_position = (log_t.exp() * (log_t - log_s)).sum(-1)
    if mask is not None:
        per_position = per_position * mask
    return per_position.sum() * t * t


class TaskFamily:
    """A task family's contract; subclasses fill in the data, loss and decoding methods.

    `options` carries the task's settings (tasks.TaskOptions, or FinetuneConfig, which extends
    it: task name, lengths, columns, SQuAD windows); `head` is the BertFor... class, `metric`
    the first metric (it picks the best epoch).
    """

    head: ClassVar[type[nn.Module]]
    metric: str = "accuracy"
    reports_accuracy = True  # the training log shows accuracy
    per_token = False  # inference keeps a value per token (cut to each row's length)
    source: ModelDir | None = None  # the model directory trained or evaluated (set_model)

    def __init__(self, options: Any, tok: Tokenizer) -> None:
        self.options, self.tok = options, tok

    # -- data ----------------------------------------------------------------------------------

    def read(self, path: str, labelled: bool = True) -> list[Any]:
        raise NotImplementedError

    def set_labels(self, train: Sequence[Any] | None = None, config: Any = None) -> None:
        """Settle the label set: from the options, the training examples or a model's config."""

    def featurize(self, examples: Sequence[Any], training: bool = False) -> Features:
        raise NotImplementedError

    def batch_keys(self, features: Features) -> np.ndarray | None:
        """A key per training row: rows with the same key are kept out of the same batch
        (retrieval: the positive passage); None for most families."""
        return None

    def batch_groups(self, features: Features) -> np.ndarray | None:
        """A group per training row: each batch is cut from one group's rows where it can be
        (retrieval with --group-batches: the rows' "group"); None for most families."""
        return None

    def set_model(self, model: str | os.PathLike[str] | ModelDir) -> None:
        """The model directory trained or evaluated, opened once (a ModelDir handed on as it
        is): what it holds beyond config.json (retrieval's pooling, a summarizer's modules) is
        read from it."""
        self.source = ModelDir.open(model)

    def head_kwargs(self) -> dict[str, Any]:
        return {}

    def freeze_unused(self, model: nn.Module) -> list[str]:
        """Before training: freeze the parameters of `model` that no loss of the family reads
        (DDP stops at the second step over one without a gradient); their names. None for most
        families."""
        return []

    # -- training ------------------------------------------------------------------------------

    def count(self, batch: Batch) -> int:
        """What the loss is averaged over in this batch (examples, or labelled tokens)."""
        return len(batch.labels)

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, number of correct predictions) of a batch."""
        return self.loss_of(model(*batch.inputs()), batch)

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, number of correct predictions) of the model's outputs on a batch."""
        raise NotImplementedError

    # -- task distillation (train/distill.py) --------------------------------------------------

    def distributions(
        self, out: Any, batch: Batch
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The outputs a student learns from its teacher's: (logits whose last dimension is a
        distribution, mask of the positions that count or None for all), summed as `count`
        counts (rows here)."""
        return [(out.logits, None)]

    def soft_loss_sum(
        self, student: Any, teacher: Any, batch: Batch, temperature: float
    ) -> torch.Tensor:
        """Soft-target loss of a batch, summed as `count` counts: temperature^2 x KL(teacher ||
        student) of their distributions at that temperature (Hinton et al. 2015), averaged
        over the family's distributions (SQuAD: start and end)."""
        pairs = zip(self.distributions(student, batch), self.distributions(teacher, batch))
        terms = [soft_cross_entropy(s, t, temperature, mask) for (s, mask), (t, _) in pairs]
        return sum(terms) / len(terms)  # type: ignore[return-value]

    # -- inference -----------------------------------------------------------------------------

    def decode(self, examples: Sequence[Any], features: Features, rows: list[np.ndarray]) -> Any:
        """Predictions from every row's outputs."""
        raise NotImplementedError

    def score(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray], preds: Any
    ) -> dict[str, float]:
        """Metrics of the predictions against the examples' labels."""
        raise NotImplementedError

    def predict(
        self,
        runner: Runner,
        model: nn.Module,
        examples: Sequence[Any],
        features: Features,
        score: bool = False,
    ) -> Any:
        """Predictions for the examples (their features run through `runner`); with score,
        (metrics, predictions)."""
        config = getattr(model, "config", None)  # a head on the encoder: it takes rows=
        rows = infer(
            runner, model, features, self.tok.pad_id, per_token=self.per_token, encoder=config
        )
        preds = self.decode(examples, features, rows)
        return (self.score(examples, features, rows, preds), preds) if score else preds

    def evaluate(
        self, runner: Runner, model: nn.Module, examples: Sequence[Any], features: Features
    ) -> tuple[dict[str, float], Any]:
        return self.predict(runner, model, examples, features, score=True)

    def write_predictions(self, out: Any, examples: Sequence[Any], preds: Any) -> list[Any]:
        raise NotImplementedError

    def warning(self, best: dict[str, Any]) -> str | None:
        """What the run's best dev metrics say is wrong with the model (warned about at the end
        of training), or None."""
        return None

    def save_files(self, out: Any) -> None:
        """What a trained model's directory holds beside its weights and vocabulary (retrieval:
        its sentence-transformers modules); nothing for most families."""
