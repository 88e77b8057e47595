"""Extractive summarization (BertSum, Liu 2019): score every sentence of a document, keep the
best few in document order.

Input. A document's sentences, each as [CLS] sentence [SEP] (a sentence longer than the row is
cut to fit), one after another, with interval segments (segment 0 and 1 in turn); the encoder's
state at each sentence's [CLS] is scored by a token classifier of two labels (SUMMARY_LABELS;
HF's BertForTokenClassification, so transformers loads the model too): its log-odds of
"summary" is the sentence's score. A document longer than a row is read in windows of whole
sentences: at inference they overlap by about half a window and each sentence takes its score
from the window where it has the most context (min(pieces before it, pieces after it), as
tasks.windows does for pieces; the earlier window on a tie), so every sentence has exactly one
score; in training the windows do not overlap (each sentence is trained once, at half the cost).
Cutting documents at one row (BertSum's 512 pieces) would leave most of a Wikipedia article
unread, where the sentences of its lead are drawn from.

Labels. The "oracle" (BertSum's greedy selection): sentences added one at a time, each the one
that most raises ROUGE-1 F1 + ROUGE-2 F1 of the selection (in document order) against the
reference summary, until none raises it or `summary_sentences` are chosen. The loss is
cross-entropy over the sentences' [CLS] positions (every other position is ignored).

Selection. The `count` best-scored sentences (or count = ratio x sentences), skipping a sentence
that shares a word trigram with one already chosen (trigram blocking, on by default), returned
in document order. ROUGE (the metric that picks the best epoch: ROUGE-2) is Google's rouge-score
package, with its Porter stemmer: ROUGE-1, ROUGE-2 and ROUGE-Lsum (the summary-level LCS over
sentences on lines, as pyrouge's ROUGE-L), F1 x 100, the mean over documents. Its words are
rouge-score's on English text; other scripts' letters count too (RougeWords).

The unsupervised mode (no training data: any embedding model) does what the
bert-extractive-summarizer package does by default: the first sentence, and the sentence nearest
each centre of k-means (k = count - 1) over the others' embeddings, sentences under 40
characters left out; "centroid" keeps those most similar to the document's mean embedding
instead (with trigram blocking).
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import BertConfig
from ..data.instances import IGNORE_INDEX
from ..data.tasks.documents import SummaryExample, WikiCounts, read_documents
from ..errors import ConfigError, need_extra
from ..fileio import write_text
from ..heads import BertForTokenClassification
from .base import Batch, Features, TaskFamily, classification_loss, log_softmax

SUMMARY_LABELS = ("other", "summary")  # the head's two labels: a summarizer's config says so
ROUGE_TYPES = ("rouge1", "rouge2", "rougeLsum")
METRICS = {"rouge1": "rouge1", "rouge2": "rouge2", "rougeLsum": "rougeL"}  # ours: rouge-score's
MODES = ("auto", "trained", "kmeans", "centroid")  # Pipeline.summarize's modes
MIN_CHARS = 40  # the unsupervised modes' shortest candidate sentence (bert-extractive-summarizer's)
SENTENCES = 3  # a summary's sentences unless told otherwise (BertSum's)
_WORD = re.compile(r"\w+")


# ------------------------------------------------------------------------------------------------
# ROUGE (rouge-score) and the oracle


# ROUGE's words: runs of letters and digits, except that a Chinese or Japanese character (text
# written without spaces) is a word of its own
_ROUGE_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W_]+")


class RougeWords:
    """ROUGE's tokenizer: rouge-score's own on ASCII text (lower-cased runs of [a-z0-9], words
    over 3 letters Porter-stemmed: the same tokens, so the same scores), and every other
    script's letters kept. rouge-score's drops every character outside [a-z0-9], so a Russian,
    Greek or Chinese summary has no words (ROUGE 0, an empty oracle) and "église" is "glise";
    here a non-ASCII word is kept whole and not stemmed (Porter's rules are English)."""

    def __init__(self) -> None:
        from nltk.stem import porter

        # Porter stemming is most of ROUGE's time and words repeat: the same stems, remembered
        self._stem = functools.lru_cache(maxsize=1 << 17)(porter.PorterStemmer().stem)

    def tokenize(self, text: str) -> list[str]:
        return [
            self._stem(w) if len(w) > 3 and w.isascii() else w
            for w in _ROUGE_WORD.findall(text.lower())
        ]


@functools.cache
def scorer() -> Any:
    """rouge-score's scorer of ROUGE_TYPES over RougeWords (made once)."""
    rouge_scorer = need_extra(
        "rouge_score.rouge_scorer",
        "summarization's ROUGE needs the rouge-score package: pip install 'bertforge[summarize]'",
    )
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=RougeWords())


def rouge(references: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Mean F1 x 100 of ROUGE-1, ROUGE-2 and ROUGE-L(sum) of each prediction against its
    reference (texts with a sentence a line); keys rouge1, rouge2, rougeL."""
    if len(references) != len(predictions):
        raise ConfigError(f"{len(references)} references but {len(predictions)} predictions")
    totals = dict.fromkeys(METRICS.values(), 0.0)
    for ref, pred in zip(references, predictions):
        scores = scorer().score(ref, pred)
        for ours, theirs in METRICS.items():
            totals[theirs] += scores[ours].fmeasure
    return {k: 100 * v / max(len(references), 1) for k, v in totals.items()}


def _gain(reference: Counter, base: Counter, delta: Counter) -> int:
    """How much the n-grams `delta` added to `base` raise its overlap with `reference` (the
    sum over n-grams of min(reference, candidate) that rouge-score's _score_ngrams counts)."""
    return sum(
        min(reference[g], base[g] + d) - min(reference[g], base[g]) for g, d in delta.items()
    )


def oracle(sentences: Sequence[str], summary: str, size: int = 3) -> list[int]:
    """BertSum's greedy oracle: the sentences (indices, in order) chosen one at a time, each the
    one that most raises ROUGE-1 F1 + ROUGE-2 F1 of the chosen sentences' text (in document
    order) against the summary, at most `size`. The scores are rouge-score's (its stemming
    tokenizer, n-grams and F1) of the chosen sentences joined, counted incrementally: a
    candidate adds its own n-grams and the bigrams across its neighbours' boundaries."""
    from rouge_score.rouge_scorer import _create_ngrams
    from rouge_score.scoring import fmeasure

    tokenizer = scorer()._tokenizer  # RougeWords: the tokens its rouge1/rouge2 scores count
    reference = tokenizer.tokenize(summary)
    ref1, ref2 = _create_ngrams(reference, 1), _create_ngrams(reference, 2)
    words = [tokenizer.tokenize(s) for s in sentences]
    grams1 = [_create_ngrams(w, 1) for w in words]
    grams2 = [_create_ngrams(w, 2) for w in words]

    def f1(overlap: int, predicted: int, relevant: int) -> float:
        return fmeasure(overlap / max(predicted, 1), overlap / max(relevant, 1))

    chosen: list[int] = []
    best = 0.0
    for _ in range(min(size, len(sentences))):
        text = [w for j in chosen for w in words[j]]  # chosen is kept in document order
        base1, base2 = _create_ngrams(text, 1), _create_ngrams(text, 2)
        o1 = sum(min(ref1[g], c) for g, c in base1.items())
        o2 = sum(min(ref2[g], c) for g, c in base2.items())
        pick = -1
        for i in range(len(sentences)):
            if i in chosen or not words[i]:
                continue
            before = [j for j in chosen if j < i]
            after = [j for j in chosen if j > i]
            delta2 = Counter(grams2[i])
            if before:
                delta2[(words[before[-1]][-1], words[i][0])] += 1
            if after:
                delta2[(words[i][-1], words[after[0]][0])] += 1
            if before and after:  # the bigram that joined the neighbours is no more
                delta2[(words[before[-1]][-1], words[after[0]][0])] -= 1
            value = f1(
                o1 + _gain(ref1, base1, grams1[i]), len(text) + len(words[i]), len(reference)
            )
            value += f1(
                o2 + _gain(ref2, base2, delta2),
                max(len(text) - 1, 0) + sum(delta2.values()),
                max(len(reference) - 1, 0),
            )
            if value > best:
                best, pick = value, i
        if pick < 0:
            break
        chosen = sorted([*chosen, pick])
    return chosen


# ------------------------------------------------------------------------------------------------
# Choosing sentences


def summary_length(n: int, sentences: int | None = None, ratio: float | None = None) -> int:
    """How many of a document's n sentences a summary keeps: round(ratio x n) (at least 1) when
    ratio is given, else `sentences` (SENTENCES when neither is); never more than n. Both
    given is an error: one of them would be ignored without a word."""
    if ratio is not None and sentences is not None:
        raise ConfigError(
            f"give sentences (--sentences) or ratio (--ratio), not both: sentences={sentences} "
            f"and ratio={ratio} ask for different lengths"
        )
    if ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(f"ratio={ratio}: must be > 0 and <= 1")
        return min(n, max(1, round(ratio * n)))
    sentences = SENTENCES if sentences is None else sentences
    if isinstance(sentences, bool) or not isinstance(sentences, (int, np.integer)) or sentences < 1:
        raise ConfigError(f"sentences={sentences!r}: must be an integer >= 1 (or give a ratio)")
    return min(n, sentences)


def trigrams(sentence: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(sentence.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def select(
    scores: np.ndarray, sentences: Sequence[str], count: int, block_trigrams: bool = True
) -> list[int]:
    """The indices (in document order) of the `count` best-scored sentences, the higher score
    first on the way (the earlier sentence on a tie), skipping with block_trigrams a sentence
    that shares a word trigram with one already chosen (BertSum's trigram blocking). A
    document of no more than `count` sentences is kept whole."""
    if count >= len(sentences):
        return list(range(len(sentences)))
    chosen: list[int] = []
    seen: set[tuple[str, ...]] = set()
    for i in np.argsort(-np.asarray(scores, np.float64), kind="stable").tolist():
        if len(chosen) == count:
            break
        grams = trigrams(sentences[i]) if block_trigrams else set()
        if grams & seen:
            continue
        chosen.append(i)
        seen |= grams
    return sorted(chosen)


def kmeans(vectors: np.ndarray, k: int, seed: int = 0, iterations: int = 100) -> np.ndarray:
    """(k, D) centres of Lloyd's k-means over vectors (N, D), k-means++ seeding drawn from
    `seed` (the same vectors and seed, the same centres)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(vectors, np.float64)
    centres = [x[rng.integers(len(x))]]
    d2 = ((x - centres[0]) ** 2).sum(1)  # (N,) each vector's squared distance to its nearest
    for _ in range(1, k):  # k-means++: the next centre drawn by squared distance
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(len(x), 1 / len(x))
        centres.append(x[rng.choice(len(x), p=p)])
        d2 = np.minimum(d2, ((x - centres[-1]) ** 2).sum(1))
    c = np.stack(centres)
    for _ in range(iterations):
        assign = squared_distances(x, c).argmin(1)  # (N,)
        moved = np.stack(
            [x[assign == j].mean(0) if (assign == j).any() else c[j] for j in range(k)]
        )
        if np.allclose(moved, c):
            break
        c = moved
    return c


def squared_distances(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(N, k) squared Euclidean distances of x (N, D) to c (k, D), as |x|^2 - 2 x.c + |c|^2
    (no (N, k, D) array: 1,600 sentences and 1,500 centres of 384 would be 7 GB)."""
    d2 = (x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None]
    return np.maximum(d2, 0.0)


def unsupervised(
    vectors: np.ndarray,
    sentences: Sequence[str],
    count: int,
    mode: str = "kmeans",
    block_trigrams: bool = True,
) -> tuple[list[int], np.ndarray]:
    """(chosen indices in document order, every sentence's score) from a document's sentence
    embeddings (N, D), as bert-extractive-summarizer chooses by default: sentences under
    MIN_CHARS characters are not candidates (unless fewer than `count` are longer); kmeans
    keeps the first candidate and the candidate nearest each centre of k-means over the others
    (k = count - 1; each sentence once, and with block_trigrams none sharing a word trigram
    with one kept before it; score: minus its distance to its nearest centre);
    centroid keeps the candidates nearest (cosine) the document's mean embedding, as `select`
    keeps them (score: that cosine)."""
    x = np.asarray(vectors, np.float64)
    candidates = [i for i, s in enumerate(sentences) if len(s) >= MIN_CHARS]
    if len(candidates) < count:
        candidates = list(range(len(sentences)))
    if mode == "centroid":
        unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        mean = unit.mean(0)
        scores = unit @ (mean / max(np.linalg.norm(mean), 1e-12))
        kept = select(scores[candidates], [sentences[i] for i in candidates], count, block_trigrams)
        return [candidates[i] for i in kept], scores
    first, rest = candidates[0], np.asarray(candidates[1:], np.int64)
    scores = np.zeros(len(x))
    chosen = [first]
    grams = [trigrams(t) if block_trigrams else set() for t in sentences]
    seen = set(grams[first])
    if count > 1 and len(rest):
        centres = kmeans(x[rest], min(count - 1, len(rest)))
        distances = np.sqrt(squared_distances(x, centres))  # (N, k)
        scores = -distances.min(1)
        taken = {first}
        for j in range(len(centres)):  # each centre's nearest candidate not taken or blocked
            for i in rest[np.argsort(distances[rest, j], kind="stable")].tolist():
                if i not in taken and not grams[i] & seen:
                    chosen.append(i)
                    taken.add(i)
                    seen |= grams[i]
                    break
    return sorted(chosen), scores


def is_summarizer(config: Any) -> bool:
    """Whether a checkpoint's config is a summarizer's: its labels are SUMMARY_LABELS (the
    token classifier's weights are checked as it loads)."""
    labels = config.labels
    return tuple(labels[i] for i in range(len(labels))) == SUMMARY_LABELS


def answer(
    doc: SummaryExample, chosen: Sequence[int], scores: np.ndarray, mode: str
) -> dict[str, Any]:
    """Pipeline.summarize's answer for a document: the summary and its sentences."""
    return {
        "summary": " ".join(doc.sentences[i] for i in chosen),
        "sentences": [
            {
                "index": i,
                "text": doc.sentences[i],
                "start": doc.spans[i][0],
                "end": doc.spans[i][1],
                "score": round(float(scores[i]), 6),
            }
            for i in chosen
        ],
        "mode": mode,
    }


# ------------------------------------------------------------------------------------------------
# Windows of whole sentences


def sentence_windows(lengths: Sequence[int], max_length: int, overlap: bool) -> list[range]:
    """Ranges of consecutive sentences, each at most max_length pieces (a sentence's length
    counts its [CLS] and [SEP]; none is longer than max_length), covering them all; with
    overlap the next window starts at the first sentence past about half the window."""
    windows: list[range] = []
    start, n = 0, len(lengths)
    while start < n:
        end, total = start, 0
        while end < n and total + lengths[end] <= max_length:
            total += lengths[end]
            end += 1
        end = max(end, start + 1)
        windows.append(range(start, end))
        if end >= n:
            break
        if not overlap:
            start = end
            continue
        half, nxt = 0, start
        while nxt < end and half + lengths[nxt] <= total / 2:
            half += lengths[nxt]
            nxt += 1
        start = max(nxt, start + 1)
    return windows


def owners(windows: Sequence[range], lengths: Sequence[int]) -> list[np.ndarray]:
    """For each window, which of its sentences take their score from it: the window where the
    sentence's middle has the most pieces on its shorter side (+ 0.01 x the window's pieces),
    the earlier window on a tie."""
    n = max((w.stop for w in windows), default=0)
    best, owner = np.full(n, -np.inf), np.zeros(n, np.int64)
    for k, w in enumerate(windows):
        sizes = np.asarray([lengths[i] for i in w], np.float64)
        before = np.cumsum(sizes) - sizes / 2  # pieces before each sentence's middle
        score = np.minimum(before, sizes.sum() - before) + 0.01 * sizes.sum()
        won = score > best[w.start : w.stop]
        best[w.start : w.stop][won] = score[won]
        owner[w.start : w.stop][won] = k
    return [owner[w.start : w.stop] == k for k, w in enumerate(windows)]


@dataclass
class SentenceRow:
    """Which document a row reads, the sentences it scores and their [CLS] positions in it."""

    doc: int
    sentences: np.ndarray  # (m,) indices among the document's sentences
    positions: np.ndarray  # (m,) their [CLS] positions in the row


def featurize(
    examples: Sequence[SummaryExample],
    tok: Any,
    max_length: int,
    labels: Sequence[Sequence[int] | None],
    training: bool = False,
) -> Features:
    """Rows of whole sentences for every document (windows when it is longer than a row); the
    labels of each row: 1 at the [CLS] of an oracle sentence it scores, 0 at the others' it
    scores, ignored elsewhere. meta: a SentenceRow per row."""
    flat = [s for e in examples for s in e.sentences]
    encodings = iter(tok.encode_batch(flat, max_length=max_length) if flat else [])
    ids, types, row_labels, meta = [], [], [], []
    for d, e in enumerate(examples):
        pieces = [np.asarray(next(encodings).ids, np.int64) for _ in e.sentences]
        lengths = [len(p) for p in pieces]
        windows = sentence_windows(lengths, max_length, overlap=not training)
        summary = set(labels[d] or ())
        for w, own in zip(windows, owners(windows, lengths)):
            row = [pieces[i] for i in w]
            starts = np.cumsum([0, *(len(p) for p in row)])[:-1]
            ids.append(np.concatenate(row))
            types.append(
                np.concatenate([np.full(len(p), j % 2, np.int64) for j, p in enumerate(row)])
            )
            mine = np.asarray(w)[own]
            y = np.full(len(ids[-1]), IGNORE_INDEX, np.int64)
            y[starts[own]] = [int(i in summary) for i in mine.tolist()]
            row_labels.append(y)
            meta.append(SentenceRow(d, mine, starts[own]))
    return Features(ids, types, row_labels, meta)


@dataclass
class Summary:
    """A document's chosen sentences (indices in document order) and every sentence's score."""

    indices: list[int]
    scores: np.ndarray


def summaries(
    examples: Sequence[SummaryExample], scores: Sequence[np.ndarray], count: int
) -> list[Summary]:
    """Each document's `count` best-scored sentences (select, trigram blocking on)."""
    return [Summary(select(s, e.sentences, count), s) for e, s in zip(examples, scores)]


def rouge_of(examples: Sequence[SummaryExample], preds: Sequence[Summary]) -> dict[str, float]:
    """ROUGE of the chosen sentences (a sentence a line) against the examples' summaries."""
    texts = ["\n".join(e.sentences[i] for i in p.indices) for e, p in zip(examples, preds)]
    return rouge([e.summary or "" for e in examples], texts)


class SummarizeTask(TaskFamily):
    """`finetune --task summarize`: documents with reference summaries (JSONL, Wikipedia)."""

    head = BertForTokenClassification
    metric = "rouge2"
    reports_accuracy = False  # most sentences are not in the summary: accuracy says little
    per_token = True

    def save_files(self, out: Path) -> None:
        """A document summarizer's directory keeps its encoder's sentence-transformers modules,
        so that it embeds sentences as it was trained on them."""
        source = self.source
        if self.options.summarizer == "document" and source and source.is_sentence_transformers:
            source.write_layout(out, BertConfig.from_pretrained(out).hidden_size)

    def read(self, path: str, labelled: bool = True) -> list[SummaryExample]:
        counts = WikiCounts()
        examples = read_documents(path, labelled, counts)
        if counts.articles:  # stderr: stdout may be `evaluate --json`'s
            print(counts.said(path), file=sys.stderr, flush=True)
        return examples

    def set_labels(self, train: Sequence[Any] | None = None, config: Any = None) -> None:
        if config is not None and not is_summarizer(config):
            raise ConfigError(
                f"the model's labels are {list(config.labels.values())}, not a summarizer's "
                f"{list(SUMMARY_LABELS)} (one `bertforge finetune --task summarize` trains)"
            )

    def head_kwargs(self) -> dict[str, Any]:
        return {"id2label": dict(enumerate(SUMMARY_LABELS))}

    def featurize(self, examples: Sequence[SummaryExample], training: bool = False) -> Features:
        size = self.options.summary_sentences
        labels = [oracle(e.sentences, e.summary, size) if e.summary else None for e in examples]
        return featurize(examples, self.tok, self.options.max_seq_length, labels, training)

    def count(self, batch: Batch) -> int:
        return int((batch.labels != IGNORE_INDEX).sum())

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = out.logits  # (B, T, 2)
        loss = classification_loss(logits, batch.labels, reduction="sum")
        labelled = batch.labels != IGNORE_INDEX
        return loss, ((logits.argmax(-1) == batch.labels) & labelled).sum()

    def sentence_scores(
        self, examples: Sequence[SummaryExample], features: Features, rows: list[np.ndarray]
    ) -> list[np.ndarray]:
        """Each document's sentence scores (log-odds of "summary") from its rows' logits."""
        scores = [np.full(len(e.sentences), -np.inf) for e in examples]
        for meta, logits in zip(features.meta, rows):
            at = logits[meta.positions]  # (m, 2)
            scores[meta.doc][meta.sentences] = at[:, 1] - at[:, 0]
        return scores

    def decode(
        self, examples: Sequence[SummaryExample], features: Features, rows: list[np.ndarray]
    ) -> list[Summary]:
        scores = self.sentence_scores(examples, features, rows)
        return summaries(examples, scores, self.options.summary_sentences)

    def score(
        self,
        examples: Sequence[SummaryExample],
        features: Features,
        rows: list[np.ndarray],
        preds: list[Summary],
    ) -> dict[str, float]:
        metrics = rouge_of(examples, preds)
        losses = []
        for row, logits in zip(features.labels, rows):
            at = np.flatnonzero(row != IGNORE_INDEX)
            losses.extend((-log_softmax(logits[at])[np.arange(len(at)), row[at]]).tolist())
        return {**metrics, "loss": float(np.mean(losses)) if losses else 0.0}

    def write_predictions(
        self, out: Path, examples: Sequence[SummaryExample], preds: list[Summary]
    ) -> list[Path]:
        lines = [
            json.dumps(
                {
                    "id": e.guid,
                    "sentences": p.indices,
                    "summary": "\n".join(e.sentences[i] for i in p.indices),
                },
                ensure_ascii=False,
            )
            for e, p in zip(examples, preds)
        ]
        path = out / "predictions_summarize.jsonl"
        write_text(path, "".join(line + "\n" for line in lines))
        return [path]
