"""Sentence and sentence-pair tasks: classification and regression (GLUE, tables of your own).

The paper's recipe (section 4.1): one linear layer on the pooled [CLS] vector
(heads.BertForSequenceClassification). Each example is tokenized once ([CLS] text [SEP]
(pair [SEP]), pairs truncated longest-first as Google's `_truncate_seq_pair`); labels are class
indices or float scores. Loss: cross-entropy, or mean squared error for regression (the losses
HF's BertForSequenceClassification computes, by problem_type). Decoding: the argmax label with
the softmax probabilities, or the score. Predictions are written as GLUE's submission TSV:
`index<TAB>prediction` (the label name, or the score).

Multi-label tables (--multi-label): labels are multi-hot rows, the loss binary cross-entropy
on each label's logit (HF's problem_type "multi_label_classification"); a label is predicted
when its sigmoid reaches its threshold: 0.5, or tuned on dev for that label's F1
(--tune-threshold; kept in config.json as `multi_label_thresholds`). Metrics: micro and macro
F1 and exact match; predictions are the label names joined by |.
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

from ..config import BertConfig
from ..data.tasks import Example, TaskSpec, glue_task, label_set, read_examples, read_glue
from ..errors import ConfigError, DataError, InputError
from ..evaluate import compute_metrics
from ..fileio import write_text
from ..heads import BertForSequenceClassification
from .base import (
    Batch,
    Features,
    TaskFamily,
    classification_loss,
    infer,
    log_softmax,
    reduce,
    softmax,
)

# ------------------------------------------------------------------------------------------------
# Losses (checked against transformers' BertForSequenceClassification)


def regression_loss(
    logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Regression (STS-B): logits (B, 1) with labels (B,), or logits (B, K) with labels (B, K).

    Squared error in fp32 (mean, HF's loss, or sum); integer labels are taken as numbers.
    """
    if logits.shape[-1] == 1 and labels.dim() == logits.dim() - 1:
        logits = logits.squeeze(-1)  # (B, 1) -> (B,)
    if labels.shape != logits.shape:
        raise InputError(
            f"labels have shape {tuple(labels.shape)}, which does not fit regression logits "
            f"{tuple(logits.shape)}"
        )
    total = F.mse_loss(logits.float(), labels.float(), reduction="sum")
    return reduce(total, labels.numel(), reduction)


def multi_label_loss(
    logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Multi-label classification: logits (B, K), labels (B, K) of 0/1 (or soft targets).

    Binary cross-entropy with logits in fp32: the mean over every (row, label), or the sum.
    """
    if labels.shape != logits.shape:
        raise InputError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(logits.shape)} "
            "(one 0/1 target per label)"
        )
    total = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="sum")
    return reduce(total, labels.numel(), reduction)


def sequence_classification_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    problem_type: str | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """The loss HF's BertForSequenceClassification picks: by config.problem_type, or when that
    is None, regression for K == 1, single-label for integer labels, multi-label otherwise."""
    if problem_type is None:
        if logits.shape[-1] == 1:
            problem_type = "regression"
        elif not labels.is_floating_point():
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    losses = {
        "regression": regression_loss,
        "single_label_classification": classification_loss,
        "multi_label_classification": multi_label_loss,
    }
    if problem_type not in losses:
        raise ConfigError(
            f"problem_type={problem_type!r}: must be None, regression, "
            "single_label_classification or multi_label_classification"
        )
    return losses[problem_type](logits, labels, reduction=reduction)


# ------------------------------------------------------------------------------------------------
# Features and decoding


def featurize(
    examples: Sequence[Example], tok: Any, spec: TaskSpec, max_seq_length: int
) -> Features:
    """[CLS] text [SEP] (pair [SEP]), truncated longest-first; labels as indices or floats
    (zeros for unlabelled examples)."""
    pairs = [e.text_pair for e in examples] if spec.is_pair else None
    if pairs is not None:
        for e in examples:
            if e.text_pair is None:
                raise DataError(f"{e.source}: field {spec.text_pair_column!r}: missing text pair")
    encodings = tok.encode_batch([e.text for e in examples], pairs, max_length=max_seq_length)
    features = Features.from_encodings(encodings)
    labelled = all(e.label is not None for e in examples)
    if spec.is_regression:
        features.labels = np.array([float(e.label or 0.0) for e in examples], np.float32)  # type: ignore[arg-type]
        return features
    index = {name: i for i, name in enumerate(spec.labels or ())}
    if spec.multi_label:  # multi-hot rows
        features.labels = np.zeros((len(examples), len(index)), np.float32)  # type: ignore[assignment]
        for i, e in enumerate(examples):
            for name in e.label or ():
                if name not in index:
                    raise DataError(f"{e.source}: label {name!r} is not one of {', '.join(index)}")
                features.labels[i, index[name]] = 1  # type: ignore[call-overload]
        return features
    for i, e in enumerate(examples):
        if not labelled:
            break
        if e.label not in index:
            raise DataError(
                f"{e.source}: field {spec.label_column!r}: label {e.label!r} is not one of "
                f"{', '.join(map(repr, index))}"
            )
        features.labels[i] = index[e.label]  # type: ignore[index]
    return features


THRESHOLDS = "multi_label_thresholds"  # config.json: {label: threshold} of a multi-label model


def thresholds_of(config: BertConfig) -> np.ndarray | None:
    """Each label's threshold of a multi-label model (0.5 unless tuned), else None."""
    if config.problem_type != "multi_label_classification":
        return None
    saved = config.extras.get(THRESHOLDS) or {}
    return np.array([float(saved.get(config.labels[i], 0.5)) for i in range(config.num_labels)])


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(logits, -60, 60)))


def decode(
    logits: np.ndarray, names: Sequence[str] | None, thresholds: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """Per row: {"score"} for a regression head (names None); a multi-label head (thresholds
    given): the labels over their thresholds and every label's probability; else the label,
    its probability and every label's probability."""
    if names is None:
        return [{"score": float(x[0])} for x in logits]
    if thresholds is not None:
        return [
            {
                "labels": [names[k] for k in np.flatnonzero(p >= thresholds)],
                "scores": {names[k]: float(v) for k, v in enumerate(p)},
            }
            for p in sigmoid(logits)
        ]
    probs = softmax(logits)
    return [
        {
            "label": names[int(p.argmax())],
            "score": float(p.max()),
            "scores": {names[k]: float(v) for k, v in enumerate(p)},
        }
        for p in probs
    ]


def tune_thresholds(probs: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """(K,) thresholds: per label, the grid value with the best F1 (nearest 0.5 on a tie)."""
    grid = np.round(np.arange(0.05, 0.951, 0.05), 2)
    order = np.argsort(np.abs(grid - 0.5), kind="stable")  # 0.5 first, then outwards
    best = []
    for k in range(probs.shape[1]):
        pred = probs[:, k][:, None] >= grid[order][None]  # (N, G)
        tp = (pred & refs[:, k][:, None]).sum(0)
        f1 = 2 * tp / np.maximum(pred.sum(0) + refs[:, k].sum(), 1)
        best.append(grid[order][int(np.argmax(f1))])
    return np.array(best)


class SentenceTask(TaskFamily):
    """Sentence(-pair) classification or regression."""

    head = BertForSequenceClassification

    def __init__(self, options: Any, tok: Any) -> None:
        super().__init__(options, tok)
        self.spec = self._spec(None)
        self.metric = self.spec.metrics[0]
        self.reports_accuracy = not self.spec.is_regression
        self.thresholds: np.ndarray | None = None  # multi-label: from the model, or tuned

    def _spec(self, labels: Sequence[str] | None) -> TaskSpec:
        """The GLUE spec, or one made for a table of your own from the options and labels."""
        o = self.options
        if o.task != "csv":
            return glue_task(o.task)
        if not o.regression and labels is None and (o.labels or self._flag_columns()):
            labels = self._flag_columns() or [x.strip() for x in o.labels.split(",") if x.strip()]
        metrics = ("micro_f1", "macro_f1", "exact_match") if o.multi_label else ("accuracy",)
        return TaskSpec(
            "csv",
            o.text_column,
            o.text_pair_column,
            o.label_column,
            None if o.regression else tuple(labels or ()),
            ("spearman", "pearson") if o.regression else metrics,
            id_column=None,
            multi_label=o.multi_label,
        )

    def _flag_columns(self) -> list[str]:
        """Multi-label, one 0/1 column per label: --label-column a,b,c."""
        o = self.options
        return (
            [c.strip() for c in o.label_column.split(",")]
            if o.multi_label and "," in o.label_column
            else []
        )

    # -- data ----------------------------------------------------------------------------------

    def read(self, path: str, labelled: bool = True) -> list[Example]:
        o = self.options
        if o.task != "csv":
            return read_glue(o.task, path, labelled=labelled)

        def column(name: str | None) -> str | int | None:
            return None if name is None else int(name) if o.no_header else name

        flags = self._flag_columns()
        return read_examples(
            path,
            column(o.text_column),  # type: ignore[arg-type]
            (
                ([column(c) for c in flags] if flags else column(o.label_column))
                if labelled
                else None
            ),  # type: ignore[arg-type]
            column(o.text_pair_column),
            delimiter={"\\t": "\t", "tab": "\t"}.get(o.delimiter or "", o.delimiter),
            header=not o.no_header,
            labels=self.spec.labels or None,
            regression=o.regression,
            multi_label=o.multi_label,
        )

    def set_labels(
        self, train: Sequence[Example] | None = None, config: BertConfig | None = None
    ) -> None:
        """For --task csv: the label set from --labels, else the train file, else the model."""
        if self.options.task != "csv" or self.options.regression:
            return
        if config is not None:
            names = config.labels
            self.spec = self._spec([names[i] for i in range(len(names))])
            self.thresholds = thresholds_of(config)
        elif not self.spec.labels:
            self.spec = self._spec(label_set(train or []))

    def featurize(self, examples: Sequence[Example], training: bool = False) -> Features:
        return featurize(examples, self.tok, self.spec, self.options.max_seq_length)

    def head_kwargs(self) -> dict[str, Any]:
        if self.spec.is_regression:
            return {"num_labels": 1, "problem_type": "regression"}
        multi = {"problem_type": "multi_label_classification"} if self.spec.multi_label else {}
        return {"id2label": dict(enumerate(self.spec.labels or ())), **multi}

    def count(self, batch: Batch) -> int:
        return batch.labels.numel()  # rows, or (rows x labels) for multi-label: HF's mean

    # -- training ------------------------------------------------------------------------------

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = out.logits
        problem = (
            "regression"
            if self.spec.is_regression
            else "multi_label_classification"
            if self.spec.multi_label
            else "single_label_classification"
        )
        loss = sequence_classification_loss(logits, batch.labels, problem, reduction="sum")
        if self.spec.is_regression:
            return loss, torch.zeros((), device=logits.device)
        if self.spec.multi_label:  # right decisions, of rows x labels
            return loss, ((logits > 0) == (batch.labels > 0.5)).sum()
        return loss, (logits.argmax(-1) == batch.labels).sum()

    def soft_loss_sum(
        self, student: Any, teacher: Any, batch: Batch, temperature: float
    ) -> torch.Tensor:
        """Regression: the squared error to the teacher's score; multi-label: t^2 x the binary
        cross-entropy with the teacher's probabilities at temperature t, less its entropy (so 0
        when equal); single-label: the soft-target KL of every family."""
        s, t = student.logits.float(), teacher.logits.float()
        if self.spec.is_regression:
            return F.mse_loss(s, t, reduction="sum")
        if self.spec.multi_label:
            temp = float(temperature)
            target = torch.sigmoid(t / temp)
            bce = F.binary_cross_entropy_with_logits(s / temp, target, reduction="sum")
            entropy = F.binary_cross_entropy_with_logits(t / temp, target, reduction="sum")
            return (bce - entropy) * temp * temp
        return super().soft_loss_sum(student, teacher, batch, temperature)

    # -- evaluation and predictions ------------------------------------------------------------

    def decode(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray]
    ) -> np.ndarray:
        logits = np.stack(rows)
        if self.spec.multi_label:
            thresholds = 0.5 if self.thresholds is None else self.thresholds
            return sigmoid(logits) >= thresholds
        return logits[:, 0] if self.spec.is_regression else logits.argmax(-1)

    def evaluate(
        self, runner: Any, model: nn.Module, examples: Sequence[Any], features: Features
    ) -> tuple[dict[str, float], Any]:
        """Metrics and predictions; with --tune-threshold (multi-label), each label's threshold
        first set to the one of 0.05, 0.10, ..., 0.95 that gives it the best F1 on these
        examples (the nearest to 0.5 on a tie), and kept in the model's config."""
        if self.spec.multi_label and self.options.tune_threshold:
            probs = sigmoid(np.stack(infer(runner, model, features, self.tok.pad_id)))
            self.thresholds = tune_thresholds(probs, np.asarray(features.labels) > 0.5)
            names = self.spec.labels or ()
            model.config.extras[THRESHOLDS] = {n: float(t) for n, t in zip(names, self.thresholds)}
        return super().evaluate(runner, model, examples, features)

    def score(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray], preds: Any
    ) -> dict[str, float]:
        logits, refs = np.stack(rows), features.labels
        assert isinstance(refs, np.ndarray)
        if self.spec.is_regression:
            loss = float(np.mean((preds - refs) ** 2))
        elif self.spec.multi_label:
            p = np.clip(sigmoid(logits), 1e-7, 1 - 1e-7)
            loss = float(-np.mean(refs * np.log(p) + (1 - refs) * np.log(1 - p)))
        else:
            loss = float(-log_softmax(logits)[np.arange(len(refs)), refs].mean())
        spec = self.spec
        positive = (
            spec.labels.index(spec.positive_label) if spec.positive_label and spec.labels else 1
        )
        return {**compute_metrics(spec.metrics, refs, preds, positive_label=positive), "loss": loss}

    def write_predictions(self, out: Path, examples: Sequence[Example], preds: Any) -> list[Path]:
        """GLUE's submission format: `index<TAB>prediction`, one row per example in order."""
        path = out / f"predictions_{self.spec.name}.tsv"
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t", lineterminator="\n")
        w.writerow(["index", "prediction"])
        for i, (e, p) in enumerate(zip(examples, preds)):
            index = e.guid.rsplit("-", 1)[-1] if "-" in e.guid else str(i)
            labels = self.spec.labels or ()
            if self.spec.multi_label:
                w.writerow([index, "|".join(labels[k] for k in np.flatnonzero(p))])
                continue
            w.writerow([index, f"{float(p):.6g}" if self.spec.is_regression else labels[int(p)]])
        write_text(path, buf.getvalue())
        return [path]
