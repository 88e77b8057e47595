"""Multiple choice (SWAG): the context paired with each candidate ending, one score per pair
from the pooled [CLS], a softmax across the choices (the paper's section 4.4).

Each example is C sequences [CLS] context [SEP] start ending [SEP] (pairs truncated
longest-first), padded to the longest of its choices: a (C, T) row. Predictions are written as
CSV: `guid,label` with the chosen ending's index.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.pretraining import pad_rows
from ..data.tasks import ChoiceExample, read_swag
from ..fileio import write_text
from ..heads import BertForMultipleChoice
from .base import Batch, Features, TaskFamily, classification_loss, log_softmax


def multiple_choice_loss(
    logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Multiple choice (SWAG): logits (B, C), labels (B,) the index of the right choice;
    cross-entropy over the choices (mean, HF's loss, or sum)."""
    return classification_loss(logits, labels, reduction)


def grouped_rows(
    groups: Sequence[Sequence[Any]], tok: Any, max_seq_length: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Input and segment ids of groups of inputs: one (C, T) row per group, padded to the
    group's longest. An input is a text ([CLS] text [SEP]) or a pair of texts ([CLS] a [SEP] b
    [SEP], truncated longest-first); the groups hold one kind or the other."""
    flat = [x for g in groups for x in g]
    pairs = bool(flat) and isinstance(flat[0], tuple)
    firsts = [x[0] for x in flat] if pairs else flat
    seconds = [x[1] for x in flat] if pairs else None
    encodings = iter(tok.encode_batch(firsts, seconds, max_length=max_seq_length))
    choices = [[next(encodings) for _ in g] for g in groups]
    ids = [pad_rows([c.ids for c in group], tok.pad_id) for group in choices]
    return ids, [pad_rows([c.token_type_ids for c in group], 0) for group in choices]


def featurize(examples: Sequence[ChoiceExample], tok: Any, max_seq_length: int) -> Features:
    groups = [
        [(e.context, f"{e.start} {ending}".strip()) for ending in e.endings] for e in examples
    ]
    ids, types = grouped_rows(groups, tok, max_seq_length)
    labels = np.array([e.label if e.label is not None else 0 for e in examples], np.int64)
    return Features(ids, types, labels)


class ChoiceTask(TaskFamily):
    head = BertForMultipleChoice

    def read(self, path: str, labelled: bool = True) -> list[ChoiceExample]:
        return read_swag(path, labelled=labelled)

    def featurize(self, examples: Sequence[ChoiceExample], training: bool = False) -> Features:
        return featurize(examples, self.tok, self.options.max_seq_length)

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = out.logits
        loss = multiple_choice_loss(logits, batch.labels, reduction="sum")
        return loss, (logits.argmax(-1) == batch.labels).sum()

    def decode(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray]
    ) -> np.ndarray:
        return np.stack(rows).argmax(-1)

    def score(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray], preds: Any
    ) -> dict[str, float]:
        logits, refs = np.stack(rows), np.asarray(features.labels)
        loss = float(-log_softmax(logits)[np.arange(len(refs)), refs].mean())
        return {"accuracy": float((preds == refs).mean()), "loss": loss}

    def write_predictions(
        self, out: Path, examples: Sequence[ChoiceExample], preds: Any
    ) -> list[Path]:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["guid", "label"])
        w.writerows([e.guid, int(p)] for e, p in zip(examples, preds))
        path = out / "predictions_swag.csv"
        write_text(path, buf.getvalue())
        return [path]
