"""Fusion of ranked lists: a hybrid search's dense and BM25 lists, or a first stage's hits and
a cross-encoder's order. By reciprocal rank (`fuse`: each document's sum of w / (60 + rank),
Cormack et al. 2009) or by scores standardised per query (`fuse_scores`: z-scores, a document a
list leaves out given that list's lowest); `fuse_runs` picks one by name, weighing the first
list alpha and the second 1 - alpha.

    docs, scores = fuse_runs([(dense_docs, dense_scores), (bm25_docs, bm25_scores)], "rrf")

A list is (document indices, scores), each (Q, n), -1 where a query has fewer documents.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FUSIONS = ("rrf", "zscore")  # hybrid: by reciprocal rank, or by standardised scores
# A reranker's order fused with the first stage's, where a fusion is asked for without naming
# one (search --rerank-fuse alone): on 300 SQuAD questions with a reranker trained on the CPU,
# MRR@10 87.2 by z-scores, 86.5 by reciprocal rank, 85.9 the first stage alone
# (benchmarks/results/rerank_cpu.md)
RERANK_FUSION = "zscore"
RRF_K = 60  # reciprocal-rank fusion: 1 / (k + rank)
FUSED = 100  # documents per list that hybrid search fuses (more where more hits are asked for)


def best_columns(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k largest values (b, k), best first, ties by column order
    (argpartition alone keeps an arbitrary subset of the values tied at the k-th place)."""
    if np.isnan(values).any():  # a NaN would unbalance the count
        values = np.where(np.isnan(values), -np.inf, values)
    if values.shape[1] > k:
        kth = -np.partition(-values, k - 1, axis=1)[:, k - 1 : k]  # (b, 1) the k-th largest
        above = values > kth
        tied = values == kth
        room = k - above.sum(1, keepdims=True)  # places left for the tied, first come first
        keep = above | (tied & (np.cumsum(tied, 1, dtype=np.int32) <= room))
        cols = np.nonzero(keep)[1].reshape(len(values), k)  # in column order
    else:
        cols = np.broadcast_to(np.arange(values.shape[1]), values.shape)
    order = np.lexsort((cols, -np.take_along_axis(values, cols, 1)), axis=1)
    return np.take_along_axis(cols, order, 1)


def fuse_runs(
    runs: Sequence[tuple[np.ndarray, np.ndarray]], fusion: str, alpha: float = 0.5, k: int = FUSED
) -> tuple[np.ndarray, np.ndarray]:
    """Two runs ((document indices, scores), each (Q, n)) fused by reciprocal rank (rrf) or by
    z-scores (zscore), the first weighed alpha and the second 1 - alpha (0.5: equal, the weight
    1 each in reciprocal rank)."""
    weights = (alpha, 1 - alpha)
    if fusion == "zscore":
        return fuse_scores(runs, weights, k)
    return fuse([docs for docs, _ in runs], k, [2 * w for w in weights])


def fuse(
    rankings: Sequence[np.ndarray], k: int = FUSED, weights: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion of per-query ranked lists (each (Q, n) document indices): each
    document's sum of w / (RRF_K + rank) over the lists (w: the list's weight, 1 unless given);
    the top k (ties: first seen)."""
    weights = weights or [1.0] * len(rankings)
    totals = []
    for rows in zip(*rankings):
        total: dict[int, float] = {}
        for w, ranked in zip(weights, rows):
            for r, doc in enumerate(ranked.tolist(), 1):
                if doc >= 0:  # -1: none (a shorter list)
                    total[doc] = total.get(doc, 0.0) + w / (RRF_K + r)
        totals.append(total)
    return _best(totals, k)


def fuse_scores(
    runs: Sequence[tuple[np.ndarray, np.ndarray]], weights: Sequence[float], k: int = FUSED
) -> tuple[np.ndarray, np.ndarray]:
    """Score fusion of per-query ranked lists (each (document indices, scores), (Q, n); -1:
    none): each list's scores standardised over the documents it holds for the query (z-scores),
    a document it does not hold given its lowest; each document's weighted sum; the top k (ties:
    first seen)."""
    totals = []
    for q in range(len(runs[0][0])):
        lists = []
        for docs, scores in runs:
            held = docs[q] >= 0
            z = scores[q][held].astype(np.float64)
            if len(z):
                z = (z - z.mean()) / (z.std() or 1.0)
            low = float(z.min()) if len(z) else 0.0
            lists.append((dict(zip(docs[q][held].tolist(), z.tolist())), low))
        seen = dict.fromkeys(d for table, _ in lists for d in table)  # first seen first
        totals.append(
            {d: sum(w * t.get(d, low) for w, (t, low) in zip(weights, lists)) for d in seen}
        )
    return _best(totals, k)


def _best(totals: Sequence[dict[int, float]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k best-scored documents (ties: first seen), padded with -1 and 0."""
    docs, scores = [], []
    for total in totals:
        best = sorted(total.items(), key=lambda x: -x[1])[:k]
        docs.append([d for d, _ in best])
        scores.append([s for _, s in best])
    width = max((len(d) for d in docs), default=0)
    pad = [d + [-1] * (width - len(d)) for d in docs]
    return np.array(pad, np.int64), np.array([s + [0.0] * (width - len(s)) for s in scores])
