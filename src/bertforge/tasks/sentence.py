"""Sentence and sentence-pair tasks: classification and regression (GLUE, tables of your own).

The paper's recipe (section 4.1): one linear layer on the pooled [CLS] vector
(heads.BertForSequenceClassification). Each example is tokenized once ([CLS] text [SEP]
(pair [SEP]), pairs truncated longest-first as Google's `_truncate_seq_pair`). Predictions are
written as GLUE's submission TSV: `index<TAB>prediction`.

Three problems (HF's problem_type names them), one object each (`Problem`), which owns all that
differs between them: the features' labels, the loss (HF's BertForSequenceClassification's),
the soft-target loss of distillation, probabilities, decisions and answers.

  SingleLabel  labels are class indices; cross-entropy; probabilities: the softmax; the
               prediction is the argmax label; answer {label, score, scores}.
  MultiLabel   (--multi-label) labels are multi-hot rows; binary cross-entropy on each label's
               logit; probabilities: each label's sigmoid; a label is predicted when it reaches
               its threshold: 0.5, or tuned on dev for that label's F1 (--tune-threshold; kept
               in config.json as `multi_label_thresholds`); metrics: micro and macro F1 and
               exact match; written as the label names joined by |; answer {labels, scores}.
  Regression   (STS-B, --regression) labels are float scores; squared error; the probability
               and the prediction are the score itself; answer {score}.

Metrics: the spec's (GLUE's own, or accuracy for a table of your own), and for classification
the scores accuracy hides, class by class: each class's precision, recall, F1 and counts with
the macro F1 (evaluate.class_scores), or each label's (evaluate.label_scores) for multi-label.

Pipeline.classify averages a long text's windows in probability space and answers from the
mean through the same object, so that `evaluate` and `classify` decide alike.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import BertConfig, default_labels
from ..data.tasks import Example, TaskSpec, glue_task, label_set, read_examples, read_glue
from ..errors import ConfigError, DataError, InputError
from ..evaluate import CLASS_SCORES, TUNED, class_scores, compute_metrics, label_scores
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
    soft_cross_entropy,
    softmax,
)
from .ranking import save_activation

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


# ------------------------------------------------------------------------------------------------
# The three problems


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(logits, -60, 60)))


def named(names: Sequence[str], p: np.ndarray) -> dict[str, float]:
    """Every label's probability, by name."""
    return {names[k]: float(v) for k, v in enumerate(p)}


@dataclass
class SingleLabel:
    """One class per text: the softmax over the classes, the argmax decides."""

    names: Sequence[str]
    problem_type: ClassVar[str] = "single_label_classification"
    loss = staticmethod(classification_loss)
    probabilities = staticmethod(softmax)
    soft_loss = staticmethod(soft_cross_entropy)  # the soft-target KL of every family

    def correct(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (logits.argmax(-1) == labels).sum()

    def head_kwargs(self) -> dict[str, Any]:
        return {"id2label": dict(enumerate(self.names))}

    def targets(self, examples: Sequence[Example], column: str) -> np.ndarray:
        """Class indices; zeros for an unlabelled (test) file."""
        if any(e.label is None for e in examples):
            return np.zeros(len(examples), np.int64)
        index = {n: i for i, n in enumerate(self.names)}
        for e in examples:
            if e.label not in index:
                raise DataError(
                    f"{e.source}: field {column!r}: label {e.label!r} is not one of "
                    f"{', '.join(map(repr, index))}"
                )
        return np.array([index[e.label] for e in examples], np.int64)  # type: ignore[index]

    def predictions(self, probs: np.ndarray) -> np.ndarray:
        return probs.argmax(-1)

    def answers(self, probs: np.ndarray) -> list[dict[str, Any]]:
        return [
            {"label": self.names[k], "score": float(p[k]), "scores": named(self.names, p)}
            for p, k in zip(probs, self.predictions(probs))
        ]

    def cell(self, prediction: Any) -> str:
        return self.names[int(prediction)]

    def eval_loss(self, logits: np.ndarray, refs: np.ndarray) -> float:
        return float(-log_softmax(logits)[np.arange(len(refs)), refs].mean())

    def class_metrics(self, refs: np.ndarray, preds: np.ndarray) -> dict[str, float]:
        """The macro F1 and each class's precision, recall, F1 and counts."""
        names = np.asarray(self.names)
        return class_scores(names[refs], names[np.asarray(preds)], names)

    def selectable(self) -> tuple[str, ...]:
        """Its class_metrics that can pick the best epoch (not the counts)."""
        return ("macro_f1", *_class_keys(self.names))


@dataclass
class MultiLabel:
    """Any number of labels per text: a sigmoid per label, each label over its threshold."""

    names: Sequence[str]
    thresholds: np.ndarray | float = 0.5  # (K,): tuned on dev, or kept in config.json
    problem_type: ClassVar[str] = "multi_label_classification"
    loss = staticmethod(multi_label_loss)
    probabilities = staticmethod(sigmoid)

    def correct(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return ((logits > 0) == (labels > 0.5)).sum()  # right decisions, of rows x labels

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
        # t^2 x the cross-entropy with the teacher's sigmoids at t, less their entropy (0 if equal)
        target = torch.sigmoid(teacher / t)
        bce = F.binary_cross_entropy_with_logits(student / t, target, reduction="sum")
        entropy = F.binary_cross_entropy_with_logits(teacher / t, target, reduction="sum")
        return (bce - entropy) * t * t

    def head_kwargs(self) -> dict[str, Any]:
        return {"id2label": dict(enumerate(self.names)), "problem_type": self.problem_type}

    def targets(self, examples: Sequence[Example], column: str) -> np.ndarray:
        """Multi-hot rows (zeros for an unlabelled example)."""
        labels = np.zeros((len(examples), len(self.names)), np.float32)
        index = {n: i for i, n in enumerate(self.names)}
        for i, e in enumerate(examples):
            for name in e.label or ():
                if name not in index:
                    raise DataError(f"{e.source}: label {name!r} is not one of {', '.join(index)}")
                labels[i, index[name]] = 1  # type: ignore[index]
        return labels

    def predictions(self, probs: np.ndarray) -> np.ndarray:
        return probs >= self.thresholds

    def answers(self, probs: np.ndarray) -> list[dict[str, Any]]:
        return [
            {"labels": [self.names[k] for k in np.flatnonzero(on)], "scores": named(self.names, p)}
            for p, on in zip(probs, self.predictions(probs))
        ]

    def cell(self, prediction: Any) -> str:
        return "|".join(self.names[k] for k in np.flatnonzero(prediction))

    def eval_loss(self, logits: np.ndarray, refs: np.ndarray) -> float:
        p = np.clip(sigmoid(logits), 1e-7, 1 - 1e-7)
        return float(-np.mean(refs * np.log(p) + (1 - refs) * np.log(1 - p)))

    def class_metrics(self, refs: np.ndarray, preds: np.ndarray) -> dict[str, float]:
        """Each label's precision, recall, F1 and count (the spec's metrics have their mean)."""
        return label_scores(refs > 0.5, preds, self.names)

    def selectable(self) -> tuple[str, ...]:
        return _class_keys(self.names)


@dataclass
class Regression:
    """A score per text (STS-B's similarity): the head's one output is the answer."""

    problem_type: ClassVar[str] = "regression"
    loss = staticmethod(regression_loss)

    def correct(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), device=logits.device)  # no decisions to count

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
        return F.mse_loss(student, teacher, reduction="sum")  # to the teacher's score

    def head_kwargs(self) -> dict[str, Any]:
        return {"num_labels": 1, "problem_type": self.problem_type}

    def targets(self, examples: Sequence[Example], column: str) -> np.ndarray:
        scores = [float(e.label or 0.0) for e in examples]  # type: ignore[arg-type]
        return np.array(scores, np.float32)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        return logits[..., 0]

    def predictions(self, probs: np.ndarray) -> np.ndarray:
        return probs

    def answers(self, probs: np.ndarray) -> list[dict[str, Any]]:
        return [{"score": float(s)} for s in probs]

    def cell(self, prediction: Any) -> str:
        return f"{float(prediction):.6g}"

    def eval_loss(self, logits: np.ndarray, refs: np.ndarray) -> float:
        return float(np.mean((logits[:, 0] - refs) ** 2))

    def class_metrics(self, refs: np.ndarray, preds: np.ndarray) -> dict[str, float]:
        return {}  # no classes

    def selectable(self) -> tuple[str, ...]:
        return ()


def _class_keys(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(f"{n}_{s}" for n in names for s in ("precision", "recall", "f1"))


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
    losses = {p.problem_type: p.loss for p in (Regression, SingleLabel, MultiLabel)}
    if problem_type not in losses:
        raise ConfigError(
            f"problem_type={problem_type!r}: must be None, regression, "
            "single_label_classification or multi_label_classification"
        )
    return losses[problem_type](logits, labels, reduction=reduction)


THRESHOLDS = "multi_label_thresholds"  # config.json: {label: threshold} of a multi-label model


def thresholds_of(config: BertConfig) -> np.ndarray | None:
    """Each label's threshold of a multi-label model (0.5 unless tuned), else None."""
    if config.problem_type != MultiLabel.problem_type:
        return None
    saved = config.extras.get(THRESHOLDS) or {}
    return np.array([float(saved.get(config.labels[i], 0.5)) for i in range(config.num_labels)])


# Each has the same members: probabilities are (N, K), or regression's (N,) scores (what a long
# text's windows average); predictions are (N,) class indices, (N, K) bools or (N,) scores.
Problem = SingleLabel | MultiLabel | Regression


def problem_of(
    names: Sequence[str] | None, multi_label: bool = False, thresholds: np.ndarray | None = None
) -> Problem:
    """Regression without label names, else multi-label (thresholds: 0.5 unless given) or
    single-label."""
    if names is None:
        return Regression()
    if multi_label:
        return MultiLabel(tuple(names), 0.5 if thresholds is None else thresholds)
    return SingleLabel(tuple(names))


def problem_of_model(config: BertConfig) -> Problem:
    """The problem a trained head answers (Pipeline.classify): regression for one output, else
    by its problem_type, with the thresholds in its config.json."""
    n = config.num_labels
    names = None if n == 1 else [config.labels[i] for i in range(n)]
    return problem_of(names, config.problem_type == MultiLabel.problem_type, thresholds_of(config))


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


def head_order(spec: TaskSpec, config: BertConfig) -> np.ndarray | None:
    """Which of a model's outputs is each of a GLUE task's labels (or a table's regression
    score): None where they are in the task's order, or where the model names them only
    LABEL_i (position is all there is). A head of another size, or whose names are not the
    task's labels (case aside), is a ConfigError naming both."""
    n = config.num_labels
    names = [config.labels[i] for i in range(n)]
    where = f"--task {spec.name}"
    if spec.labels is None:
        if n != 1:
            raise ConfigError(
                f"{where}: regression, one output; the model's head has {n} labels: "
                f"{', '.join(names)}"
            )
        return None
    if n != len(spec.labels):
        has = "one output (a regression head)" if n == 1 else f"{n} labels: {', '.join(names)}"
        raise ConfigError(
            f"{where}: {len(spec.labels)} labels ({', '.join(spec.labels)}); the model's head "
            f"has {has}"
        )
    if names == list(default_labels(n).values()):
        return None
    index = {name.lower(): i for i, name in enumerate(names)}
    if len(index) != n or set(index) != {label.lower() for label in spec.labels}:
        raise ConfigError(
            f"{where}: labels in order {', '.join(spec.labels)}; the model's head (config.json "
            f"id2label) names {', '.join(names)}, not the same labels: use a model of this task, "
            "or name its labels as the task does in its config.json"
        )
    order = np.array([index[label.lower()] for label in spec.labels])
    return None if (order == np.arange(n)).all() else order


# ------------------------------------------------------------------------------------------------
# Features and the family


def featurize(
    examples: Sequence[Example], tok: Any, spec: TaskSpec, max_seq_length: int
) -> Features:
    """[CLS] text [SEP] (pair [SEP]), truncated longest-first; labels as the spec's problem
    takes them (zeros for unlabelled examples)."""
    pairs = [e.text_pair for e in examples] if spec.is_pair else None
    if pairs is not None:
        for e in examples:
            if e.text_pair is None:
                raise DataError(f"{e.source}: field {spec.text_pair_column!r}: missing text pair")
    encodings = tok.encode_batch([e.text for e in examples], pairs, max_length=max_seq_length)
    features = Features.from_encodings(encodings)
    problem = problem_of(spec.labels, spec.multi_label)
    features.labels = problem.targets(examples, spec.label_column)
    return features


class SentenceTask(TaskFamily):
    """Sentence(-pair) classification or regression, through its spec's problem object."""

    head = BertForSequenceClassification

    def __init__(self, options: Any, tok: Any) -> None:
        super().__init__(options, tok)
        self.order: np.ndarray | None = None  # the model's output of each label (head_order)
        self.untuned: np.ndarray | float | None = None  # --tune-threshold: the thresholds before
        self._settle(None)
        self.metric = self.spec.metrics[0]
        self.reports_accuracy = not self.spec.is_regression

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics `score` reports that can pick the best epoch (finetune --metric): the
        spec's (and with --tune-threshold, tuned_* of each), and each class's precision, recall
        and F1 (single-label: their macro F1)."""
        tuned = isinstance(self.problem, MultiLabel) and self.options.tune_threshold
        return (
            *self.spec.metrics,
            *(TUNED + m for m in self.spec.metrics if tuned),
            *self.problem.selectable(),
        )

    def _settle(self, labels: Sequence[str] | None, thresholds: np.ndarray | None = None) -> None:
        """The spec for these labels and its problem (multi-label: a model's thresholds)."""
        self.spec = self._spec(labels)
        self.problem = problem_of(self.spec.labels, self.spec.multi_label, thresholds)
        overall = {*self.spec.metrics, "macro_f1", "loss"}
        overall |= {TUNED + m for m in overall}
        for name in self.spec.labels or ():  # its scores' keys are "{name}_{score}"
            for key in (f"{name}_{s}" for s in CLASS_SCORES):
                if key in overall:
                    raise ConfigError(
                        f"label {name!r}: its score {key} would overwrite the overall {key} in "
                        "the metrics; rename the label (in the data, or --labels)"
                    )

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

        def column(name: str | None, option: str) -> str | int | None:
            if name is None or not o.no_header:
                return name
            try:
                return int(name)
            except ValueError:
                flag = "--" + option.replace("_", "-")
                raise ConfigError(
                    f"{option}={name!r} ({flag}): with --no-header columns are 0-based "
                    f"indices; give the column's index ({flag} 0 for the first)"
                ) from None

        text = column(o.text_column, "text_column")
        pair = column(o.text_pair_column, "text_pair_column")
        flags = self._flag_columns()
        labels: Any = None  # unlabelled: no label column read
        if labelled and flags:
            labels = [column(c, "label_column") for c in flags]
        elif labelled:
            labels = column(o.label_column, "label_column")
        return read_examples(
            path,
            text,  # type: ignore[arg-type]
            labels,
            pair,
            delimiter={"\\t": "\t", "tab": "\t"}.get(o.delimiter or "", o.delimiter),
            header=not o.no_header,
            labels=self.spec.labels or None,
            regression=o.regression,
            multi_label=o.multi_label,
        )

    def set_labels(
        self, train: Sequence[Example] | None = None, config: BertConfig | None = None
    ) -> None:
        """For --task csv: the label set from --labels, else the train file, else the model. A
        GLUE task (or regression) keeps its own: the model's head must fit it (head_order)."""
        if self.options.task != "csv" or self.options.regression:
            if config is not None:
                self.order = head_order(self.spec, config)
            return
        if config is not None:
            if config.num_labels == 1:
                raise ConfigError(
                    "the model's head has one output (a regression head): give --regression"
                )
            names = config.labels
            self._settle([names[i] for i in range(len(names))], thresholds_of(config))
        elif not self.spec.labels:
            self._settle(label_set(train or []))

    def featurize(self, examples: Sequence[Example], training: bool = False) -> Features:
        return featurize(examples, self.tok, self.spec, self.options.max_seq_length)

    def save_files(self, out: Any) -> None:
        """A regression model is a cross-encoder too: its scores are its raw output, as
        CrossEncoder(out).predict and bertforge rerank read them (tasks.ranking)."""
        if self.spec.is_regression:
            save_activation(out, "Identity")

    def head_kwargs(self) -> dict[str, Any]:
        return self.problem.head_kwargs()

    def count(self, batch: Batch) -> int:
        return batch.labels.numel()  # rows, or (rows x labels) for multi-label: HF's mean

    # -- training ------------------------------------------------------------------------------

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        loss = self.problem.loss(out.logits, batch.labels, reduction="sum")
        return loss, self.problem.correct(out.logits, batch.labels)

    def soft_loss_sum(
        self, student: Any, teacher: Any, batch: Batch, temperature: float
    ) -> torch.Tensor:
        """The problem's soft-target loss at this temperature (fp32): see its `soft_loss`."""
        s, t = student.logits.float(), teacher.logits.float()
        return self.problem.soft_loss(s, t, float(temperature))

    # -- evaluation and predictions ------------------------------------------------------------

    def logits(self, rows: list[np.ndarray]) -> np.ndarray:
        """(N, K) the rows' logits, each label at the task's index (the model's order mapped:
        head_order)."""
        logits = np.stack(rows)
        return logits if self.order is None else logits[:, self.order]

    def decode(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray]
    ) -> np.ndarray:
        return self.problem.predictions(self.problem.probabilities(self.logits(rows)))

    def evaluate(
        self, runner: Any, model: nn.Module, examples: Sequence[Any], features: Features
    ) -> tuple[dict[str, float], Any]:
        """Metrics and predictions; with --tune-threshold (multi-label), the metrics at the
        thresholds before tuning (0.5, or the model's config.json's), and beside them as tuned_*
        the spec's metrics at each label's threshold tuned on these same examples: the one of
        0.05, 0.10, ..., 0.95 that gives it the best F1 (the nearest to 0.5 on a tie). Those are
        fitted to the set they score (optimistic), so they pick no epoch unless --metric names
        one. The tuned thresholds decide the predictions and are kept in the model's config."""
        problem = self.problem
        if not (isinstance(problem, MultiLabel) and self.options.tune_threshold):
            return super().evaluate(runner, model, examples, features)
        if self.untuned is None:  # the thresholds before any tuning (0.5, or the model's)
            self.untuned = problem.thresholds
        rows = infer(runner, model, features, self.tok.pad_id, encoder=model.config)
        probs = problem.probabilities(self.logits(rows))  # (N, K)
        problem.thresholds = self.untuned
        metrics = self.score(examples, features, rows, problem.predictions(probs))
        tuned = tune_thresholds(probs, np.asarray(features.labels) > 0.5)
        problem.thresholds = tuned
        preds = problem.predictions(probs)
        scores = compute_metrics(self.spec.metrics, features.labels, preds)  # type: ignore[arg-type]
        metrics.update({TUNED + k: v for k, v in scores.items()})
        model.config.extras[THRESHOLDS] = {n: float(t) for n, t in zip(problem.names, tuned)}
        return metrics, preds

    def score(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray], preds: Any
    ) -> dict[str, float]:
        refs, spec = features.labels, self.spec
        assert isinstance(refs, np.ndarray)
        positive = (
            spec.labels.index(spec.positive_label) if spec.positive_label and spec.labels else 1
        )
        metrics = compute_metrics(spec.metrics, refs, preds, positive_label=positive)
        metrics.update(self.problem.class_metrics(refs, preds))
        return {**metrics, "loss": self.problem.eval_loss(self.logits(rows), refs)}

    def write_predictions(self, out: Path, examples: Sequence[Example], preds: Any) -> list[Path]:
        """GLUE's submission format: `index<TAB>prediction`, one row per example in order."""
        path = out / f"predictions_{self.spec.name}.tsv"
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t", lineterminator="\n")
        w.writerow(["index", "prediction"])
        for i, (e, p) in enumerate(zip(examples, preds)):
            index = e.guid.rsplit("-", 1)[-1] if "-" in e.guid else str(i)
            w.writerow([index, self.problem.cell(p)])
        write_text(path, buf.getvalue())
        return [path]
