"""Span question answering (SQuAD v1.1 and v2.0), as google-research/bert's run_squad.py.

Features. The question is cut to max_query_length pieces; the context, tokenized once with
character offsets, is cut into windows of at most max_seq_length - len(question) - 3 pieces
(for [CLS], [SEP], [SEP]) that start doc_stride pieces apart, so an answer near a window's
edge also appears well inside another. Each window is one row:
[CLS] question [SEP] context piece ... [SEP], segment 0 then 1. A piece seen by several
windows belongs, for answering, to the one where it has the most context on both sides
(min(left, right) + 0.01 * window length, `_check_is_max_context`).

Training labels: the answer's first and last piece inside the window, or [CLS] (0, 0) when
the window does not hold the whole answer or the question has none (v2.0).

Answers. For every question, the n_best_size best start and end pieces of each window give
candidate spans: both in the context, start a max-context piece, start <= end, at most
max_answer_length pieces; the score is start + end logit. The text is the context's own
characters from the first piece's start offset to the last piece's end offset (so casing,
accents and spacing are the original's). v2.0: the null score is the smallest [CLS] start +
end over the windows; a question is answered "" when null - best span > the threshold
(null_score_diff_threshold), and null_odds.json records that difference for
evaluate-v2.0.py's best-threshold search.

Loss: (start cross-entropy + end cross-entropy) / 2 (HF's BertForQuestionAnswering).

Written: predictions.json (qid -> text), nbest_predictions.json (qid -> candidates with
text, probability, logits), and for v2.0 null_odds.json (qid -> null - best span).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data.tasks import SquadExample, gold_answers, read_squad
from ..errors import ConfigError, InputError
from ..evaluate import squad_scores, squad_v2_scores
from ..fileio import write_json
from ..heads import BertForQuestionAnswering
from .base import Batch, Features, TaskFamily, reduce
from .windows import max_context_flags, windows_of


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
    reduction: str = "mean",
) -> torch.Tensor:
    """Span QA: (start CE + end CE) / 2, as HF's BertForQuestionAnswering.

    start_logits, end_logits (B, T); start_positions, end_positions (B,) or (B, 1) token
    indices. As HF: positions are clamped to [0, T], and position T (any index past the
    window: the answer is not in this window of a long document) is ignored. Negative positions
    become 0, the [CLS] "no answer" of SQuAD 2.0. Each of the two terms is a mean over the
    examples it does not ignore (HF's loss), or with reduction "sum" a sum.
    """
    T = start_logits.shape[-1]
    total = start_logits.new_zeros((), dtype=torch.float32)
    for logits, positions, name in (
        (start_logits, start_positions, "start_positions"),
        (end_logits, end_positions, "end_positions"),
    ):
        if positions.dim() > 1:
            positions = positions.squeeze(-1)  # (B, 1) -> (B,)
        if positions.is_floating_point() or positions.shape != logits.shape[:-1]:
            raise InputError(
                f"{name} must be integer token indices of shape {tuple(logits.shape[:-1])}, "
                f"got {tuple(positions.shape)} {positions.dtype}"
            )
        positions = positions.clamp(0, T)  # T: outside the window, ignored
        valid = positions != T
        per_example = F.cross_entropy(logits.float(), positions.clamp(max=T - 1), reduction="none")
        total = total + reduce((per_example * valid).sum(), valid.sum(), reduction)
    return total / 2


@dataclass
class Window:
    """Where one row came from: its question, and how its context pieces map back."""

    example: int  # index of the question in the examples
    context_start: int  # row position of the window's first context piece
    offsets: np.ndarray  # (n, 2) character span in the context of each context piece
    max_context: np.ndarray  # (n,) bool: this window is the piece's best


def featurize(
    examples: Sequence[SquadExample],
    tok: Any,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> Features:
    """Windows of every question as rows; labels (rows, 2): the answer's start and end row
    positions in training ((0, 0): not in this window, or no answer), zeros otherwise."""
    questions, contexts = _encoded(examples, tok, max_query_length)
    ids, types, labels, meta = [], [], [], []
    extra = tok.specials.pair_extra
    for i, (e, q) in enumerate(zip(examples, questions)):
        ctx_ids, ctx_offsets = contexts[e.context]
        max_tokens = _room(max_seq_length, len(q.ids), extra)
        span = None
        if training and not e.is_impossible and e.answers:
            text, start_char = e.answers[0]
            end_char = start_char + len(text)
            inside = np.nonzero((ctx_offsets[:, 1] > start_char) & (ctx_offsets[:, 0] < end_char))[
                0
            ]
            if len(inside):
                span = (int(inside[0]), int(inside[-1]))
        spans = windows_of(len(ctx_ids), max_tokens, doc_stride)
        for (start, length), flags in zip(spans, max_context_flags(spans, len(ctx_ids))):
            row, kinds = tok.row(q.ids, ctx_ids[start : start + length].tolist())
            ids.append(row)
            types.append(kinds)
            first = len(row) - length - 1  # the context's first piece: [CLS] q [SEP] ... before
            label = (0, 0)
            if span is not None and start <= span[0] and span[1] < start + length:
                label = (first + span[0] - start, first + span[1] - start)
            labels.append(label)
            meta.append(Window(i, first, ctx_offsets[start : start + length], flags))
    return Features(ids, types, np.asarray(labels, np.int64).reshape(-1, 2), meta=meta)


def pieces_read(
    examples: Sequence[SquadExample],
    tok: Any,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> list[int]:
    """How many pieces `featurize` gives each question: its windows' rows summed, counted
    without making them (what a server bounds before the work)."""
    questions, contexts = _encoded(examples, tok, max_query_length)
    extra = tok.specials.pair_extra
    out = []
    for e, q in zip(examples, questions):
        spans = windows_of(
            len(contexts[e.context][0]), _room(max_seq_length, len(q.ids), extra), doc_stride
        )
        out.append(sum(len(q.ids) + extra + length for _, length in spans))
    return out


def _encoded(
    examples: Sequence[SquadExample], tok: Any, max_query_length: int
) -> tuple[list[Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The questions' encodings (cut to max_query_length) and each distinct context's piece
    ids and character offsets, without special tokens."""
    questions = tok.encode_batch(
        [e.question for e in examples], add_special_tokens=False, max_length=max_query_length
    )
    contexts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    unique = list(dict.fromkeys(e.context for e in examples))
    for text, enc in zip(
        unique, tok.encode_batch(unique, add_special_tokens=False, truncation=False)
    ):
        contexts[text] = (np.asarray(enc.ids, np.int64), np.asarray(enc.offsets, np.int64))
    return questions, contexts


def _room(max_seq_length: int, question: int, extra: int = 3) -> int:
    """Context pieces a window holds beside a question of `question` pieces and the `extra`
    special tokens of a pair ([CLS] and two [SEP]); one ConfigError when there are none."""
    room = max_seq_length - question - extra
    if room < 1:
        raise ConfigError(
            f"max_seq_length={max_seq_length} leaves no room for the context after a "
            f"{question}-piece question; raise it or lower max_query_length"
        )
    return room


@dataclass
class Answers:
    """Per question id: the answer text, the n-best candidates, and (v2.0) null - best span."""

    predictions: dict[str, str]
    nbest: dict[str, list[dict[str, Any]]]
    null_odds: dict[str, float]


def postprocess(
    examples: Sequence[SquadExample],
    features: Features,
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    version_2: bool,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> Answers:
    """Answer texts from the windows' logits (see the module docstring)."""
    by_example: dict[int, list[int]] = {}
    for r, w in enumerate(features.meta):
        by_example.setdefault(w.example, []).append(r)
    out = Answers({}, {}, {})
    for i, e in enumerate(examples):
        null_score = math.inf
        candidates: list[tuple[float, float, float, int, int]] = []  # score, s, e, char span
        for r in by_example.get(i, []):
            w: Window = features.meta[r]
            s, en = start_logits[r], end_logits[r]
            null_score = min(null_score, float(s[0] + en[0]))
            n = len(w.offsets)
            lo, hi = w.context_start, w.context_start + n  # context rows [lo, hi)
            top_s = np.argsort(-s[lo:hi], kind="stable")[:n_best_size]
            top_e = np.argsort(-en[lo:hi], kind="stable")[:n_best_size]
            for a in top_s:
                if not w.max_context[a]:
                    continue
                for b in top_e:
                    if b < a or b - a + 1 > max_answer_length:
                        continue
                    sa, eb = float(s[lo + a]), float(en[lo + b])
                    candidates.append((sa + eb, sa, eb, int(w.offsets[a, 0]), int(w.offsets[b, 1])))
        candidates.sort(key=lambda c: -c[0])
        best: list[dict[str, Any]] = []
        seen: set[str] = set()
        for score, sa, eb, c0, c1 in candidates:
            text = e.context[c0:c1]
            if text in seen:
                continue
            seen.add(text)
            best.append(
                {"text": text, "score": score, "start_logit": sa, "end_logit": eb, "start": c0}
            )
            if len(best) == n_best_size:
                break
        if version_2 and math.isfinite(null_score):
            best.append(
                dict(text="", score=null_score, start_logit=math.nan, end_logit=math.nan, start=-1)
            )
            best.sort(key=lambda c: -c["score"])
        if not best:
            best = [{"text": "", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0, "start": -1}]
        scores = np.array([c["score"] for c in best])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        for c, p in zip(best, probs):
            c["probability"] = float(p)
        top = next((c for c in best if c["text"]), None)
        diff = null_score - top["score"] if top is not None else math.inf
        if version_2:
            out.null_odds[e.qid] = float(diff) if math.isfinite(diff) else 1e9
        answer = top is not None and (not version_2 or diff <= null_score_diff_threshold)
        out.predictions[e.qid] = top["text"] if answer else ""
        out.nbest[e.qid] = best
    return out


class SquadTask(TaskFamily):
    """Span QA: windows, the span loss, answers, SQuAD's metrics and files."""

    head = BertForQuestionAnswering
    metric = "f1"
    per_token = True

    @property
    def version_2(self) -> bool:
        return self.options.task == "squad2"

    def read(self, path: str, labelled: bool = True) -> list[SquadExample]:
        # Labelled (train, dev, evaluate): answers read and their offsets checked, a wrong one
        # an error; --task squad refuses a v2.0 no-answer question (it could neither learn nor
        # score one). Unlabelled (predict): no answers read, every question answered.
        return read_squad(path, labelled=labelled, no_answer=self.version_2)

    def featurize(self, examples: Sequence[SquadExample], training: bool = False) -> Features:
        names = ("max_seq_length", "doc_stride", "max_query_length")
        options = {k: getattr(self.options, k) for k in names}
        return featurize(examples, self.tok, training=training, **options)

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        s, e = batch.labels[:, 0], batch.labels[:, 1]
        loss = span_loss(out.start_logits, out.end_logits, s, e, reduction="sum")
        right = (out.start_logits.argmax(-1) == s) & (out.end_logits.argmax(-1) == e)
        return loss, right.sum()

    def distributions(
        self, out: Any, batch: Batch
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        return [(out.start_logits, None), (out.end_logits, None)]  # over the window's tokens

    def decode(
        self, examples: Sequence[Any], features: Features, rows: list[np.ndarray]
    ) -> Answers:
        names = ("n_best_size", "max_answer_length", "null_score_diff_threshold")
        options = {k: getattr(self.options, k) for k in names}
        starts, ends = [x[:, 0] for x in rows], [x[:, 1] for x in rows]
        return postprocess(examples, features, starts, ends, version_2=self.version_2, **options)

    def score(
        self,
        examples: Sequence[SquadExample],
        features: Features,
        rows: list[np.ndarray],
        preds: Any,
    ) -> dict[str, float]:
        gold = gold_answers(examples)
        if not self.version_2:
            scores = squad_scores(gold, preds.predictions)
            return {"f1": scores["f1"], "exact_match": scores["exact_match"]}
        # The predictions as written (their threshold applied), and the best threshold's.
        scores = squad_v2_scores(gold, preds.predictions, preds.null_odds, math.inf)
        scores.pop("total", None)
        return {k: v for k, v in scores.items() if not k.endswith("_total")}

    def write_predictions(
        self, out: Path, examples: Sequence[SquadExample], preds: Any
    ) -> list[Path]:
        assert isinstance(preds, Answers)
        paths = [out / "predictions.json", out / "nbest_predictions.json"]
        write_json(paths[0], preds.predictions)
        nbest = {
            q: [{k: c[k] for k in ("text", "probability", "start_logit", "end_logit")} for c in v]
            for q, v in preds.nbest.items()
        }
        write_json(paths[1], nbest)
        if self.version_2:
            paths.append(out / "null_odds.json")
            write_json(paths[-1], preds.null_odds)
        return paths
