"""Task metrics as plain functions on lists or numpy arrays: classification (overall and class
by class), correlation, SQuAD exact match / F1, entity-level precision / recall / F1 for BIO
tags, and retrieval (MRR, nDCG, recall, MAP of rankings against judgements, as trec_eval).

Why our own code: the metrics are small, but each reference that defines them lives in a
different package (scikit-learn, scipy, the SQuAD evaluation scripts, conlleval/seqeval,
trec_eval).
Here they are numpy only, and tests/test_evaluate.py checks each against its reference.

Conventions:
- Arguments are (references, predictions), scikit-learn's (y_true, y_pred) order.
- accuracy, f1, mcc, pearson, spearman, the entity and the retrieval scores are fractions (as
  sklearn, scipy, seqeval and trec_eval give them); SQuAD scores are percentages, as the
  official scripts print (metric_notes says which, where the scores are printed).
- Wrong input (lengths differ, nothing to score, string labels against integer
  predictions, a tag that is not BIO) raises `InputError` with one clear message.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import InputError

ArrayLike = Sequence[Any] | np.ndarray

# --------------------------------------------------------------------------- classification


def _pair(references: ArrayLike, predictions: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    ref, pred = np.asarray(references), np.asarray(predictions)
    if ref.ndim != 1 or pred.ndim != 1:
        raise InputError(
            f"references and predictions must be 1-D, got shapes {ref.shape} and {pred.shape}"
        )
    if len(ref) != len(pred):
        raise InputError(f"{len(ref)} references but {len(pred)} predictions")
    if len(ref) == 0:
        raise InputError("no references and predictions to score")
    # "1" == 1 is False elementwise: a silent accuracy of 0 is the usual result of this bug.
    if (ref.dtype.kind in "US") != (pred.dtype.kind in "US"):
        raise InputError(
            f"references are {_kind(ref)} but predictions are {_kind(pred)}; map both to the "
            "same label type (e.g. spec.labels[i] for class index i)"
        )
    return ref, pred


def _kind(a: np.ndarray) -> str:
    return "strings" if a.dtype.kind in "US" else f"{a.dtype} values"


def accuracy(references: ArrayLike, predictions: ArrayLike) -> float:
    """Fraction of predictions equal to their reference."""
    ref, pred = _pair(references, predictions)
    return float(np.mean(ref == pred))


def f1(references: ArrayLike, predictions: ArrayLike, positive_label: Any = 1) -> float:
    """Binary F1 of the class positive_label: 2TP / (2TP + FP + FN); 0.0 when that is 0/0."""
    ref, pred = _pair(references, predictions)
    if (ref.dtype.kind in "US") != isinstance(positive_label, str):
        raise InputError(
            f"positive_label {positive_label!r} is not of the labels' type ({_kind(ref)})"
        )
    c = _per_class((ref == positive_label)[:, None], (pred == positive_label)[:, None])
    return float(c["f1"][0])


def matthews_corrcoef(references: ArrayLike, predictions: ArrayLike) -> float:
    """Matthews correlation (multi-class form, Gorodkin 2004); 0.0 when undefined (one class)."""
    ref, pred = _pair(references, predictions)
    n = len(ref)
    _, codes = np.unique(np.concatenate([ref, pred]), return_inverse=True)
    k = int(codes.max()) + 1
    confusion = np.bincount(codes[:n] * k + codes[n:], minlength=k * k).reshape(k, k)
    confusion = confusion.astype(np.float64)  # products below overflow int64 past ~3e9 items
    true_sum, pred_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, total = np.trace(confusion), confusion.sum()
    cov_tp = correct * total - true_sum @ pred_sum
    cov_pp = total * total - pred_sum @ pred_sum
    cov_tt = total * total - true_sum @ true_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


# --------------------------------------------------------------------------- correlation


def _floats(references: ArrayLike, predictions: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    ref, pred = _pair(references, predictions)
    try:
        x, y = ref.astype(np.float64), pred.astype(np.float64)
    except (TypeError, ValueError):
        raise InputError("correlation needs numbers, got non-numeric values") from None
    if len(x) < 2:
        raise InputError("correlation needs at least 2 pairs")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise InputError("correlation inputs contain NaN or infinity")
    return x, y


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt(np.dot(dx, dx) * np.dot(dy, dy))
    if denominator == 0:
        return float("nan")  # a constant input: undefined, as scipy.stats.pearsonr says
    return float(np.clip(np.dot(dx, dy) / denominator, -1.0, 1.0))


def pearson(references: ArrayLike, predictions: ArrayLike) -> float:
    """Pearson's r; NaN when either side is constant."""
    return _pearson(*_floats(references, predictions))


def average_ranks(values: ArrayLike) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span (scipy's "average")."""
    x = np.asarray(values)
    n = len(x)
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(starts_group) - 1
    starts = np.flatnonzero(starts_group)
    sizes = np.diff(np.r_[starts, n])
    mean_rank = starts + (sizes + 1) / 2.0  # ranks starts+1 .. starts+sizes
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = mean_rank[group]
    return ranks


def spearman(references: ArrayLike, predictions: ArrayLike) -> float:
    """Spearman's rho: Pearson's r of the average ranks; NaN when either side is constant."""
    x, y = _floats(references, predictions)
    return _pearson(average_ranks(x), average_ranks(y))


MULTI_LABEL_METRICS = ("micro_f1", "macro_f1", "exact_match")


def _multi_hot(references: ArrayLike, predictions: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    ref, pred = np.asarray(references, bool), np.asarray(predictions, bool)
    if ref.shape != pred.shape or ref.ndim != 2:
        raise InputError(
            f"multi-label scores need two (N, K) arrays, got {ref.shape} and {pred.shape}"
        )
    if ref.shape[0] == 0:
        raise InputError("no references and predictions to score")
    if ref.shape[1] == 0:
        raise InputError("no labels to score: the (N, K) arrays have K = 0")
    return ref, pred


def _per_class(ref: np.ndarray, pred: np.ndarray) -> dict[str, np.ndarray]:
    """precision, recall, f1, n_gold, n_pred and tp of each column of (N, K) bool arrays; a
    score that is 0/0 is 0 (scikit-learn's zero_division=0)."""
    tp, n_gold, n_pred = (ref & pred).sum(0), ref.sum(0), pred.sum(0)
    return {
        "precision": np.where(n_pred > 0, tp / np.maximum(n_pred, 1), 0.0),
        "recall": np.where(n_gold > 0, tp / np.maximum(n_gold, 1), 0.0),
        # 2TP / (2TP + FP + FN), which is 2PR / (P + R)
        "f1": np.where(n_gold + n_pred > 0, 2 * tp / np.maximum(n_gold + n_pred, 1), 0.0),
        "n_gold": n_gold,
        "n_pred": n_pred,
        "tp": tp,
    }


def multi_label_scores(references: ArrayLike, predictions: ArrayLike) -> dict[str, float]:
    """Multi-label metrics of (N, K) 0/1 arrays: micro F1 (over every (row, label) decision),
    macro F1 (the mean of the K labels' F1; a label neither true nor predicted anywhere counts
    0, as scikit-learn's zero_division=0) and exact_match (rows whose whole label set is right)."""
    ref, pred = _multi_hot(references, predictions)
    c = _per_class(ref, pred)
    denominator = c["n_gold"].sum() + c["n_pred"].sum()
    return {
        "micro_f1": float(2 * c["tp"].sum() / denominator) if denominator else 0.0,
        "macro_f1": float(c["f1"].mean()),
        "exact_match": float(np.mean((ref == pred).all(1))),
    }


# What class_scores and label_scores report per class c, as "{c}_{name}"; n_gold: the rows of
# the class (scikit-learn's support); n_pred: the rows predicted as it (single-label only).
CLASS_SCORES = ("precision", "recall", "f1", "n_gold", "n_pred")


def class_scores(
    references: ArrayLike, predictions: ArrayLike, labels: ArrayLike | None = None
) -> dict[str, float]:
    """Single-label classification, class by class: macro_f1 (the mean of the classes' F1),
    then {c}_precision, {c}_recall, {c}_f1, {c}_n_gold and {c}_n_pred for each class c of
    `labels` (default: the values in references or predictions, sorted), as scikit-learn's
    precision_recall_fscore_support(labels=labels, zero_division=0) gives them. The scores that
    accuracy hides: a model that answers the majority class for every row scores its share."""
    ref, pred = _pair(references, predictions)
    classes = np.unique(np.concatenate([ref, pred])) if labels is None else np.asarray(labels)
    if classes.ndim != 1 or len(classes) == 0:
        raise InputError(f"labels must be a non-empty list of classes, got {labels!r}")
    if (classes.dtype.kind in "US") != (ref.dtype.kind in "US"):
        raise InputError(f"labels are {_kind(classes)} but the references are {_kind(ref)}")
    if "macro" in classes.tolist():
        raise InputError("a class named 'macro': its macro_f1 would be the classes' mean's key")
    c = _per_class(ref[:, None] == classes[None], pred[:, None] == classes[None])  # (N, K)
    out = {"macro_f1": float(c["f1"].mean())}
    for k, name in enumerate(classes):
        out.update({f"{name}_{s}": _number(s, c[s][k]) for s in CLASS_SCORES})
    return out


def _number(name: str, value: Any) -> float:
    return int(value) if name.startswith("n_") else float(value)  # counts stay counts


def label_scores(
    references: ArrayLike, predictions: ArrayLike, names: Sequence[str]
) -> dict[str, float]:
    """Multi-label (N, K) 0/1 arrays, label by label: {name}_precision, {name}_recall, {name}_f1
    and {name}_n_gold of each of the K labels (multi_label_scores has their mean F1)."""
    ref, pred = _multi_hot(references, predictions)
    if len(names) != ref.shape[1]:
        raise InputError(f"{len(names)} label names for {ref.shape[1]} labels")
    c = _per_class(ref, pred)
    return {f"{n}_{s}": _number(s, c[s][k]) for k, n in enumerate(names) for s in CLASS_SCORES[:4]}


def split_classes(
    scores: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(the scores of no class, {class: {score name: value}}) of a metrics dict: a class c is
    one with c_precision, c_recall and c_f1 (class_scores, label_scores, entity_scores' types)."""
    named = [k.removesuffix("_precision") for k in scores if k.endswith("_precision")]
    per: dict[str, dict[str, float]] = {
        c: {} for c in named if {f"{c}_recall", f"{c}_f1"} <= scores.keys()
    }
    owners = {f"{c}_{s}": (c, s) for c in per for s in CLASS_SCORES}
    rest: dict[str, float] = {}
    for key, value in scores.items():
        if key in owners:
            c, s = owners[key]
            per[c][s] = value
        else:
            rest[key] = value
    return rest, per


def class_table(scores: Mapping[str, float]) -> str:
    """The per-class scores of a metrics dict as a text table (empty if it has none)."""
    _, per = split_classes(scores)
    if not per:
        return ""
    columns = [s for s in CLASS_SCORES if all(s in row for row in per.values())]
    width = max(len("class"), *map(len, per))
    lines = [f"  {'class':<{width}}" + "".join(f"  {c:>9}" for c in columns)]
    for name, row in per.items():
        cells = [f"{row[c]:>9,.0f}" if c.startswith("n_") else f"{row[c]:>9.4f}" for c in columns]
        lines.append(f"  {name:<{width}}" + "".join(f"  {x}" for x in cells))
    return "\n".join(lines)


TUNED = "tuned_"  # the prefix of a score at decision thresholds tuned on the examples it scores


def metric_notes(scores: Mapping[str, Any]) -> list[str]:
    """What a reader of a metrics dict needs beside the numbers: their scale (SQuAD's exact match
    and F1 and ROUGE are percentages, as their official scripts print them; every other score a
    fraction, as scikit-learn, scipy, seqeval and trec_eval give it: `f1 88.1` and `f1 0.881`
    are the same F1), and that tuned_* scores are optimistic."""
    squad = "total" in scores and ("exact_match" in scores or "exact" in scores)
    rouge = [k for k in scores if k.startswith("rouge")]
    if squad:
        notes = ["scale: exact match and F1 in percent (0-100, as SQuAD's official scripts)"]
    elif rouge:
        notes = [f"scale: {', '.join(rouge)} in percent (F1 x 100, as the ROUGE scripts)"]
    else:
        notes = ["scale: fractions, not percent (an F1 of 0.88 is 88%)"]
    if any(k.startswith(TUNED) for k in scores):
        notes.append(
            f"{TUNED}*: at thresholds tuned on these same examples (optimistic); the others at "
            "the thresholds before tuning"
        )
    return notes


def metrics_text(scores: Mapping[str, float]) -> str:
    """A metrics dict as `bertforge evaluate` prints it: each score of no class on a line of
    its own, then the per-class table (class_table), then metric_notes."""
    overall, _ = split_classes(scores)
    lines = [f"{k:>20}  {v:.4f}" for k, v in overall.items()]
    table = class_table(scores)
    return "\n".join([*lines, *filter(None, [table]), *metric_notes(scores)])


def single_class(scores: Mapping[str, float]) -> str | None:
    """The class a single-label classifier predicted for every row (class_scores' n_pred) when
    the references hold more than one class; None otherwise."""
    _, per = split_classes(scores)
    counted = {c: row for c, row in per.items() if "n_pred" in row and "n_gold" in row}
    predicted = [c for c, row in counted.items() if row["n_pred"] > 0]
    gold = [c for c, row in counted.items() if row["n_gold"] > 0]
    return predicted[0] if len(predicted) == 1 and len(gold) > 1 else None


def compute_metrics(
    names: Sequence[str],
    references: ArrayLike,
    predictions: ArrayLike,
    positive_label: Any = 1,
) -> dict[str, float]:
    """{name: value} for metric names of a TaskSpec (accuracy, f1, mcc, pearson, spearman;
    micro_f1, macro_f1, exact_match of multi-label (N, K) 0/1 arrays; macro_f1 of 1-D class
    labels too: class_scores')."""
    functions = {
        "accuracy": accuracy,
        "mcc": matthews_corrcoef,
        "pearson": pearson,
        "spearman": spearman,
    }
    out: dict[str, float] = {}
    for name in names:
        if name == "macro_f1" and np.ndim(references) == 1:
            out[name] = class_scores(references, predictions)[name]
        elif name in MULTI_LABEL_METRICS:
            out[name] = multi_label_scores(references, predictions)[name]
        elif name == "f1":
            out[name] = f1(references, predictions, positive_label)
        elif name in functions:
            out[name] = functions[name](references, predictions)
        else:
            raise InputError(f"metric {name!r}: one of f1, {', '.join(functions)}")
    return out


# --------------------------------------------------------------------------- SQuAD

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower case, drop ASCII punctuation, drop the
    articles a/an/the, collapse whitespace (in that order)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(prediction: list[str], gold: list[str], empty_matches_empty: bool) -> float:
    if not prediction or not gold:
        # v2.0: a no-answer ("") is right exactly when the other side is also empty.
        # v1.1 has no such rule: with no tokens in common the score is 0.
        return float(prediction == gold) if empty_matches_empty else 0.0
    common = sum((Counter(prediction) & Counter(gold)).values())
    return _prf(common, len(gold), len(prediction))[2]


def squad_question_scores(
    prediction: str, golds: Sequence[str], version: str = "2.0"
) -> tuple[float, float]:
    """(exact match, F1) in [0, 1] of one prediction: the best over the gold answers.

    version "2.0": golds that normalise to nothing are dropped, and no gold left means a
    no-answer question whose one right prediction is "" (evaluate-v2.0.py). version "1.1":
    golds as given, an empty one scoring F1 0 (evaluate-v1.1.py; the v1.1 dev set has three
    golds that are just "."). Both agree everywhere else.
    """
    if version not in ("1.1", "2.0"):
        raise InputError(f"version {version!r}: must be '1.1' or '2.0'")
    v2 = version == "2.0"
    normal_golds = [normalize_answer(g) for g in golds]
    if v2:
        normal_golds = [g for g in normal_golds if g] or [""]
    elif not normal_golds:
        raise InputError("a SQuAD v1.1 question needs at least one gold answer")
    pred = normalize_answer(prediction)
    exact = max(float(pred == g) for g in normal_golds)
    pred_tokens = pred.split()
    best_f1 = max(_token_f1(pred_tokens, g.split(), v2) for g in normal_golds)
    return exact, best_f1


def _check_predictions(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, Any], what: str
) -> None:
    if not references:
        raise InputError("no SQuAD references to score")
    missing = [qid for qid in references if qid not in predictions]
    if missing:
        raise InputError(
            f"{len(missing)} of {len(references)} questions have no {what} "
            f"(e.g. {', '.join(missing[:3])}); score a subset by passing only its references"
        )


def squad_scores(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """SQuAD v1.1: {"exact_match", "f1"} in percent over all references, and "total".

    references: qid -> gold answer texts (data.tasks.gold_answers). Predictions for qids
    not in references are ignored; a reference without a prediction is an error (the
    official script scores it 0 and prints a line that is easy to miss).
    """
    _check_predictions(references, predictions, "prediction")
    scores = [squad_question_scores(predictions[q], g, "1.1") for q, g in references.items()]
    exact, f1_ = np.mean(np.asarray(scores), axis=0) * 100.0
    return {"exact_match": float(exact), "f1": float(f1_), "total": len(scores)}


def squad_v2_scores(
    references: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """SQuAD v2.0, as evaluate-v2.0.py reports it (percentages).

    references: qid -> gold texts, [] for a no-answer question. A question whose na_prob
    is above na_prob_thresh counts as answered "" (no answer). Keys: exact, f1, total;
    HasAns_exact/f1/total and NoAns_exact/f1/total when such questions exist; with na_probs
    also best_exact, best_exact_thresh, best_f1, best_f1_thresh: the scores at the no-answer
    threshold that maximises them (find_best_thresh).
    """
    _check_predictions(references, predictions, "prediction")
    if na_probs is not None:
        _check_predictions(references, na_probs, "na_prob")
    has_answer = {qid: bool(golds) for qid, golds in references.items()}
    raw_exact: dict[str, float] = {}
    raw_f1: dict[str, float] = {}
    for qid, golds in references.items():
        raw_exact[qid], raw_f1[qid] = squad_question_scores(predictions[qid], golds, "2.0")
    probs = {qid: 0.0 for qid in references} if na_probs is None else dict(na_probs)

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        return {
            q: float(not has_answer[q]) if probs[q] > na_prob_thresh else s for q, s in raw.items()
        }

    exact, f1_ = thresholded(raw_exact), thresholded(raw_f1)

    def summary(qids: list[str]) -> dict[str, float]:
        return {
            "exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            "f1": 100.0 * sum(f1_[q] for q in qids) / len(qids),
            "total": len(qids),
        }

    out = summary(list(references))
    for prefix, qids in (
        ("HasAns", [q for q in references if has_answer[q]]),
        ("NoAns", [q for q in references if not has_answer[q]]),
    ):
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in summary(qids).items()})
    if na_probs is not None:
        for name, raw in (("exact", raw_exact), ("f1", raw_f1)):
            best, thresh = _best_threshold(predictions, raw, probs, has_answer)
            out[f"best_{name}"], out[f"best_{name}_thresh"] = best, thresh
    return out


def _best_threshold(
    predictions: Mapping[str, str],
    raw: dict[str, float],
    na_probs: Mapping[str, float],
    has_answer: dict[str, bool],
) -> tuple[float, float]:
    """The official find_best_thresh: sweep the threshold up through the sorted na_probs.

    Below every na_prob all questions are answered "", which is right for exactly the
    no-answer ones. Raising the threshold past a question's na_prob restores its
    prediction: a has-answer question gains its raw score, a no-answer one loses 1 if the
    prediction is non-empty. Ties are walked one question at a time in na_probs' order
    (sorted() is stable), as the official script does.
    """
    score = float(sum(1 for q in has_answer if not has_answer[q]))
    best_score, best_thresh = score, 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in raw:
            continue
        if has_answer[qid]:
            score += raw[qid]
        elif predictions[qid]:
            score -= 1.0
        if score > best_score:
            best_score, best_thresh = score, float(na_probs[qid])
    return 100.0 * best_score / len(raw), best_thresh


# --------------------------------------------------------------------------- entity F1


ENTITY_TAGS = "O or B-/I-/E-/S- followed by a type"  # the tags entity_spans reads


def is_entity_tag(tag: object) -> bool:
    """Whether entity_spans reads `tag` (ENTITY_TAGS): IOB1, IOB2 and IOBES tags are."""
    return tag == "O" or (
        isinstance(tag, str) and len(tag) > 2 and tag[0] in "BIES" and tag[1] == "-"
    )


def _split_tag(tag: str, where: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    if is_entity_tag(tag):
        return tag[0], tag[2:]
    raise InputError(f"{where}: tag {tag!r} is not {ENTITY_TAGS}")


def entity_spans(tags: Sequence[str], where: str = "tags") -> list[tuple[str, int, int]]:
    """(type, start, end) of each entity, end exclusive, with conlleval's chunk rules.

    A chunk ends before a tag when the previous tag was E or S, or the new tag is B, S or O,
    or the type changes; a non-O tag starts a chunk when it is B or S, follows O, E or S,
    or changes the type. So I-X after O starts an entity (IOB1), B-X after I-X splits two
    entities, and I-Y after I-X is a new Y entity. seqeval's default mode is the same.
    """
    spans: list[tuple[str, int, int]] = []
    start = 0
    prev_prefix, prev_type = "O", ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, type_ = _split_tag(tag, f"{where}, position {i}")
        if prev_prefix != "O" and (prev_prefix in "ES" or prefix in "BSO" or type_ != prev_type):
            spans.append((prev_type, start, i))
        if prefix != "O" and (prefix in "BS" or prev_prefix in "ESO" or type_ != prev_type):
            start = i
        prev_prefix, prev_type = prefix, type_
    return spans


def _prf(n_correct: int, n_gold: int, n_pred: int) -> tuple[float, float, float]:
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f


def entity_scores(
    references: Sequence[Sequence[str]] | Sequence[str],
    predictions: Sequence[Sequence[str]] | Sequence[str],
) -> dict[str, float]:
    """Entity-level precision, recall and F1 (conlleval / seqeval), overall and per type.

    references and predictions are tag sequences per sentence (or one flat sequence); an
    entity counts as correct when its type, start and end all match. Keys: precision,
    recall, f1, n_gold, n_pred, n_correct, and <TYPE>_precision / _recall / _f1 / _n_gold
    for each type seen on either side.
    """
    if len(references) != len(predictions):
        raise InputError(f"{len(references)} reference sentences but {len(predictions)} predicted")
    if len(references) == 0:
        raise InputError("no tags to score")
    flat = isinstance(references[0], str)
    ref_sents = [references] if flat else references
    pred_sents = [predictions] if flat else predictions
    gold: set[tuple[int, str, int, int]] = set()
    pred: set[tuple[int, str, int, int]] = set()
    for s, (ref_tags, pred_tags) in enumerate(zip(ref_sents, pred_sents)):
        if isinstance(ref_tags, str) or isinstance(pred_tags, str):
            raise InputError(f"sentence {s}: mixes flat tags and tag lists")
        if len(ref_tags) != len(pred_tags):
            raise InputError(
                f"sentence {s}: {len(ref_tags)} reference tags but {len(pred_tags)} predicted"
            )
        gold.update((s, *span) for span in entity_spans(ref_tags, f"references, sentence {s}"))
        pred.update((s, *span) for span in entity_spans(pred_tags, f"predictions, sentence {s}"))
    correct = gold & pred
    p, r, f = _prf(len(correct), len(gold), len(pred))
    out: dict[str, float] = dict(zip(CLASS_SCORES, (p, r, f, len(gold), len(pred))))
    out["n_correct"] = len(correct)
    for type_ in sorted({e[1] for e in gold | pred}):
        counts = [sum(1 for e in group if e[1] == type_) for group in (correct, gold, pred)]
        values = (*_prf(*counts), counts[1])
        out.update({f"{type_}_{s}": v for s, v in zip(CLASS_SCORES[:4], values)})
    return out


# ------------------------------------------------------------------------------------------------
# Retrieval: rankings against relevance judgements (trec_eval's definitions)

RECALL_AT = (1, 5, 20, 100)


def ranking(scores: Mapping[str, float]) -> list[str]:
    """Document ids by decreasing score, ties by decreasing id (trec_eval's order, so that
    equal scores rank the same way here and there). The scores must be finite (check_rankable):
    NaN compares false both ways, so sorting leaves it wherever it was."""
    return [d for d, _ in sorted(scores.items(), key=lambda x: (x[1], x[0]), reverse=True)]


def unrankable(where: str, score: float) -> InputError:
    """The error of a score that is not a finite number: `where` names its query and document.
    A model whose outputs overflowed (fp16) or diverged scores NaN or infinity, and a NaN left in
    a ranking keeps its place: a positive listed first would rank first (MRR 1.0)."""
    return InputError(
        f"{where}: score {score}: rankings need finite scores (did the model's outputs overflow, "
        "e.g. in fp16 (--precision), or did training diverge?)"
    )


def check_rankable(run: Mapping[str, Mapping[str, float]]) -> None:
    """unrankable's InputError for the first score of `run` that is not finite."""
    for q, scores in run.items():
        values = np.fromiter(scores.values(), np.float64, len(scores))
        if not np.isfinite(values).all():
            k = int(np.flatnonzero(~np.isfinite(values))[0])
            raise unrankable(f"query {q!r}, document {list(scores)[k]!r}", values[k])


def retrieval_scores(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    mrr_at: int = 10,
    ndcg_at: int = 10,
    recall_at: Sequence[int] = RECALL_AT,
    map_at: int = 100,
) -> dict[str, float]:
    """Mean retrieval metrics of `run` ({query: {document: score}}) against `qrels` ({query:
    {document: relevance}}, relevant when > 0; graded gains count in nDCG), as trec_eval
    defines them: mrr@10 (1 / rank of the first relevant document in the top 10, else 0),
    ndcg@10 (gain = relevance, discount log2(rank + 1), over the ideal ordering of the query's
    judgements), recall@k (relevant documents in the top k / relevant documents), map@100
    (precision at each relevant document in the top 100, summed, / relevant documents).

    The mean is over the judged queries that have a relevant document; one missing from `run`
    scores 0 (trec_eval -c), so leaving a query out never raises a score. A score that is not
    finite is an InputError naming its query and document (check_rankable)."""
    queries = [q for q, judged in qrels.items() if any(r > 0 for r in judged.values())]
    if not queries:
        raise InputError("retrieval scores need at least one query with a relevant document")
    unknown = set(run) - set(qrels)
    if unknown:
        shown = ", ".join(sorted(map(repr, unknown))[:5])
        raise InputError(f"{len(unknown)} queries of the run have no judgements: {shown}")
    check_rankable(run)
    names = [f"mrr@{mrr_at}", f"ndcg@{ndcg_at}", *(f"recall@{k}" for k in recall_at)]
    names.append(f"map@{map_at}")
    totals = dict.fromkeys(names, 0.0)
    for q in queries:
        judged = qrels[q]
        relevant = {d for d, r in judged.items() if r > 0}
        ranked = ranking(run.get(q, {}))
        hits = [d in relevant for d in ranked]
        first = next((i for i, hit in enumerate(hits[:mrr_at]) if hit), None)
        totals[f"mrr@{mrr_at}"] += 0.0 if first is None else 1.0 / (first + 1)
        discounts = 1.0 / np.log2(np.arange(2, ndcg_at + 2))
        gains = np.array([max(judged.get(d, 0), 0) for d in ranked[:ndcg_at]], float)
        ideal = np.sort(np.array([r for r in judged.values() if r > 0], float))[::-1][:ndcg_at]
        totals[f"ndcg@{ndcg_at}"] += float(
            (gains * discounts[: len(gains)]).sum() / (ideal * discounts[: len(ideal)]).sum()
        )
        for k in recall_at:
            totals[f"recall@{k}"] += sum(hits[:k]) / len(relevant)
        found = np.cumsum(hits[:map_at])
        precisions = [found[i] / (i + 1) for i, hit in enumerate(hits[:map_at]) if hit]
        totals[f"map@{map_at}"] += float(sum(precisions)) / len(relevant)
    return {name: value / len(queries) for name, value in totals.items()}
