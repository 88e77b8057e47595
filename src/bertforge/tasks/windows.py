"""Texts longer than the model: overlapping windows, and each piece's result from the window
where it has the most context (google-research/bert's doc_stride and `_check_is_max_context`).

A text of n pieces (without [CLS] and [SEP]) that fits in max_length - 2 is one row, as always.
A longer one is cut into windows of max_length - 2 pieces that start at 0, stride, 2 * stride,
... until one reaches the end; each window is a row [CLS] pieces [SEP]. A piece seen by several
windows takes its result from the one where min(left context, right context) + 0.01 * window
length is largest, the earlier window on a tie. `stitch` puts a text's per-token results back
together: [CLS] from the first window, every piece from its best window, [SEP] from the last,
so a long text has exactly the results (one per piece, in order) a model without a length limit
would give it. SQuAD's features cut contexts the same way (squad.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import Features


def windows_of(n: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window of at most max_tokens over n pieces."""
    spans, start = [], 0
    while True:
        length = min(n - start, max_tokens)
        spans.append((start, length))
        if start + length >= n:
            return spans
        start += min(length, stride)


def max_context_flags(spans: list[tuple[int, int]], n: int) -> list[np.ndarray]:
    """For each window, which of its pieces have their most context in it (first best wins)."""
    scores = np.full((len(spans), n), -np.inf)
    for k, (start, length) in enumerate(spans):
        p = np.arange(start, start + length)
        scores[k, p] = np.minimum(p - start, start + length - 1 - p) + 0.01 * length
    best = scores.argmax(0) if n else np.zeros(0, np.int64)
    return [best[start : start + length] == k for k, (start, length) in enumerate(spans)]


@dataclass
class TextWindow:
    """One row: which text it comes from, its first piece, and which of its pieces it owns."""

    text: int
    start: int  # index of the window's first piece among the text's pieces
    best: np.ndarray  # (length,) bool: the pieces whose result this window gives


def split(
    encodings: Sequence[Any], max_length: int, stride: int | None = None, truncate: bool = False
) -> tuple[Features, list[TextWindow]]:
    """Rows for encodings made with [CLS] and [SEP] and no truncation: one per text that fits
    in max_length, windows (stride: default half a window) for the others; truncate keeps only
    the first window of each."""
    size = max_length - 2
    stride = stride or max(1, size // 2)
    ids, types, windows = [], [], []
    for i, enc in enumerate(encodings):
        row = np.asarray(enc.ids, np.int64)
        n = len(row) - 2
        spans = windows_of(n, size, stride)[: 1 if truncate else None]
        for (start, length), best in zip(spans, max_context_flags(spans, n)):
            ids.append(np.r_[row[0], row[1 + start : 1 + start + length], row[-1]])
            types.append(np.zeros(length + 2, np.int64))
            windows.append(TextWindow(i, start, best))
    return Features(ids, types, np.zeros(len(ids), np.int64)), windows


def stitch(windows: Sequence[TextWindow], rows: Sequence[np.ndarray], texts: int) -> list[Any]:
    """Per text, its token results (n + 2, ...) from its windows' rows (length + 2, ...);
    None for a text without windows among them."""
    parts: list[list[np.ndarray]] = [[] for _ in range(texts)]
    last: list[np.ndarray | None] = [None] * texts
    for w, row in zip(windows, rows):
        if not parts[w.text]:
            parts[w.text].append(row[:1])  # [CLS] of the first window
        parts[w.text].append(row[1:-1][w.best])
        last[w.text] = row[-1:]  # [SEP] of the last window
    return [None if end is None else np.concatenate([*p, end]) for p, end in zip(parts, last)]


def contributions(windows: Sequence[TextWindow]) -> np.ndarray:
    """How many pieces each window gives its text (weights for averaging per-window results)."""
    return np.array([max(int(w.best.sum()), 1) for w in windows], np.float64)
