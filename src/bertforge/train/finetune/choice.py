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
import torch.nn.functional as F
from torch import nn

from ...config import BertConfig
from ...data.tasks import ChoiceExample, read_swag
from ...fileio import write_text
from ...heads import BertForMultipleChoice
from ...tokenizer import Tokenizer
from .. import distributed
from .common import Batch, Features, FinetuneTask, log_softmax


def featurize(examples: Sequence[ChoiceExample], tok: Tokenizer, max_seq_length: int) -> Features:
    firsts = [e.context for e in examples for _ in e.endings]
    seconds = [f"{e.start} {ending}".strip() for e in examples for ending in e.endings]
    encodings = iter(tok.encode_batch(firsts, seconds, max_length=max_seq_length))
    ids, types = [], []
    for e in examples:
        choices = [next(encodings) for _ in e.endings]
        T = max(len(c.ids) for c in choices)
        row = np.full((len(choices), T), tok.pad_id, np.int64)
        seg = np.zeros((len(choices), T), np.int64)
        for k, c in enumerate(choices):
            row[k, : len(c.ids)], seg[k, : len(c.ids)] = c.ids, c.token_type_ids
        ids.append(row)
        types.append(seg)
    labels = np.array([e.label if e.label is not None else 0 for e in examples], np.int64)
    return Features(ids, types, labels)


class ChoiceTask(FinetuneTask):
    head = BertForMultipleChoice
    metric = "accuracy"

    def __init__(self, cfg: Any, d: distributed.Dist, tok: Tokenizer) -> None:
        super().__init__(cfg, d, tok.pad_id)
        self.tok = tok

    def read(self, path: str, labelled: bool = True) -> list[ChoiceExample]:
        return read_swag(path, labelled=labelled)

    def set_labels(self, train: Any = None, config: BertConfig | None = None) -> None:
        return None

    def featurize(self, examples: Sequence[ChoiceExample], training: bool = False) -> Features:
        return featurize(examples, self.tok, self.cfg.max_seq_length)

    def head_kwargs(self) -> dict[str, Any]:
        return {}

    def loss_sum(self, model: nn.Module, micro: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(micro.input_ids, micro.token_type_ids, micro.attention_mask).logits
        loss = F.cross_entropy(logits.float(), micro.labels, reduction="sum")
        return loss, (logits.argmax(-1) == micro.labels).sum()

    def predict_examples(
        self, model: nn.Module, examples: Sequence[ChoiceExample], features: Features
    ) -> np.ndarray:
        return np.stack(self.infer(model, features, lambda out: out.logits)).argmax(-1)

    def evaluate_examples(
        self, model: nn.Module, examples: Sequence[ChoiceExample], features: Features
    ) -> tuple[dict[str, float], np.ndarray]:
        logits = np.stack(self.infer(model, features, lambda out: out.logits))
        refs = np.asarray(features.labels)
        loss = float(-log_softmax(logits)[np.arange(len(refs)), refs].mean())
        preds = logits.argmax(-1)
        return {"accuracy": float((preds == refs).mean()), "loss": loss}, preds

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
