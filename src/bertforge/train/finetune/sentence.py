"""Sentence and sentence-pair tasks: classification and regression (GLUE, tables of your own).

The paper's recipe (section 4.1): one linear layer on the pooled [CLS] vector. Each example
is tokenized once ([CLS] text [SEP] (pair [SEP]), pairs truncated longest-first as Google's
`_truncate_seq_pair`); labels are class indices or float scores. Predictions are written as
GLUE's submission TSV: `index<TAB>prediction` (the label name, or the score).
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
from ...data.tasks import Example, TaskSpec, glue_task, label_set, read_examples, read_glue
from ...errors import DataError
from ...evaluate import compute_metrics
from ...fileio import write_text
from ...heads import BertForSequenceClassification
from ...tokenizer import Tokenizer
from .. import distributed
from .common import Batch, Features, FinetuneTask, log_softmax


def featurize(
    examples: Sequence[Example], tok: Tokenizer, spec: TaskSpec, max_seq_length: int
) -> Features:
    """[CLS] text [SEP] (pair [SEP]), truncated longest-first; labels as indices or floats
    (zeros for unlabelled examples)."""
    pairs = [e.text_pair for e in examples] if spec.is_pair else None
    if pairs is not None:
        for e in examples:
            if e.text_pair is None:
                raise DataError(f"{e.source}: field {spec.text_pair_column!r}: missing text pair")
    encodings = tok.encode_batch(
        [e.text for e in examples],
        pairs,
        max_length=max_seq_length,  # type: ignore[arg-type]
    )
    labelled = all(e.label is not None for e in examples)
    if spec.is_regression:
        labels = np.array([float(e.label or 0.0) for e in examples], np.float32)  # type: ignore[arg-type]
    else:
        index = {name: i for i, name in enumerate(spec.labels or ())}
        labels = np.zeros(len(examples), np.int64)
        for i, e in enumerate(examples):
            if not labelled:
                continue
            if e.label not in index:
                raise DataError(
                    f"{e.source}: field {spec.label_column!r}: label {e.label!r} is not one of "
                    f"{', '.join(map(repr, index))}"
                )
            labels[i] = index[e.label]  # type: ignore[index]
    return Features(
        [np.asarray(x.ids, np.int64) for x in encodings],
        [np.asarray(x.token_type_ids, np.int64) for x in encodings],
        labels,
    )


class SentenceTask(FinetuneTask):
    """Loss, evaluation and predictions of sentence(-pair) classification or regression."""

    head = BertForSequenceClassification

    def __init__(self, cfg: Any, d: distributed.Dist, tok: Tokenizer) -> None:
        super().__init__(cfg, d, tok.pad_id)
        self.tok = tok
        self.spec = self._spec(None)
        self.metric = self.spec.metrics[0]
        self.reports_accuracy = not self.spec.is_regression

    def _spec(self, labels: Sequence[str] | None) -> TaskSpec:
        """The GLUE spec, or one made for a table of your own from the flags and labels."""
        cfg = self.cfg
        if cfg.task != "csv":
            return glue_task(cfg.task)
        if not cfg.regression and labels is None and cfg.labels:
            labels = [x.strip() for x in cfg.labels.split(",") if x.strip()]
        return TaskSpec(
            "csv",
            cfg.text_column,
            cfg.text_pair_column,
            cfg.label_column,
            None if cfg.regression else tuple(labels or ()),
            ("spearman", "pearson") if cfg.regression else ("accuracy",),
            id_column=None,
        )

    # -- data ----------------------------------------------------------------------------------

    def read(self, path: str, labelled: bool = True) -> list[Example]:
        cfg = self.cfg
        if cfg.task != "csv":
            return read_glue(cfg.task, path, labelled=labelled)

        def column(name: str | None) -> str | int | None:
            return None if name is None else int(name) if cfg.no_header else name

        known = self.spec.labels if self.spec.labels else None
        return read_examples(
            path,
            column(cfg.text_column),  # type: ignore[arg-type]
            column(cfg.label_column) if labelled else None,
            column(cfg.text_pair_column),
            delimiter={"\\t": "\t", "tab": "\t"}.get(cfg.delimiter or "", cfg.delimiter),
            header=not cfg.no_header,
            labels=known,
            regression=cfg.regression,
        )

    def set_labels(
        self, train: Sequence[Example] | None = None, config: BertConfig | None = None
    ) -> None:
        """For --task csv: the label set from --labels, else the train file, else the model."""
        if self.cfg.task != "csv" or self.cfg.regression:
            return
        if config is not None:
            names = config.labels
            self.spec = self._spec([names[i] for i in range(len(names))])
        elif not self.spec.labels:
            self.spec = self._spec(label_set(train or []))

    def featurize(self, examples: Sequence[Example], training: bool = False) -> Features:
        return featurize(examples, self.tok, self.spec, self.cfg.max_seq_length)

    def head_kwargs(self) -> dict[str, Any]:
        if self.spec.is_regression:
            return {"num_labels": 1, "problem_type": "regression"}
        return {"id2label": dict(enumerate(self.spec.labels or ()))}

    # -- training ------------------------------------------------------------------------------

    def loss_sum(self, model: nn.Module, micro: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(micro.input_ids, micro.token_type_ids, micro.attention_mask).logits
        if self.spec.is_regression:
            loss = F.mse_loss(logits.squeeze(-1).float(), micro.labels.float(), reduction="sum")
            return loss, torch.zeros((), device=logits.device)
        loss = F.cross_entropy(logits.float(), micro.labels, reduction="sum")
        return loss, (logits.argmax(-1) == micro.labels).sum()

    # -- evaluation and predictions ------------------------------------------------------------

    def logits(self, model: nn.Module, features: Features) -> np.ndarray:
        """(N, K) logits, or (N, 1) scores, in the features' order."""
        return np.stack(self.infer(model, features, lambda out: out.logits))

    def predict_examples(self, model: nn.Module, examples: Any, features: Features) -> np.ndarray:
        logits = self.logits(model, features)
        return logits[:, 0] if self.spec.is_regression else logits.argmax(-1)

    def evaluate_examples(
        self, model: nn.Module, examples: Any, features: Features
    ) -> tuple[dict[str, float], np.ndarray]:
        logits = self.logits(model, features)
        refs = features.labels
        assert isinstance(refs, np.ndarray)
        if self.spec.is_regression:
            preds = logits[:, 0]
            loss = float(np.mean((preds - refs) ** 2))
        else:
            preds = logits.argmax(-1)
            loss = float(-log_softmax(logits)[np.arange(len(refs)), refs].mean())
        positive = (
            self.spec.labels.index(self.spec.positive_label)
            if self.spec.positive_label is not None and self.spec.labels
            else 1
        )
        metrics = compute_metrics(self.spec.metrics, refs, preds, positive_label=positive)
        return {**metrics, "loss": loss}, preds

    def write_predictions(self, out: Path, examples: Sequence[Example], preds: Any) -> list[Path]:
        """GLUE's submission format: `index<TAB>prediction`, one row per example in order."""
        path = out / f"predictions_{self.spec.name}.tsv"
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t", lineterminator="\n")
        w.writerow(["index", "prediction"])
        for i, (e, p) in enumerate(zip(examples, preds)):
            index = e.guid.rsplit("-", 1)[-1] if "-" in e.guid else str(i)
            labels = self.spec.labels or ()
            w.writerow([index, f"{float(p):.6g}" if self.spec.is_regression else labels[int(p)]])
        write_text(path, buf.getvalue())
        return [path]
