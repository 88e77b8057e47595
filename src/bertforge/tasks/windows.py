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

Memory and time. Everything here is linear in the text: `max_context_flags` scores each window
over its own pieces against a running best per piece (O(n) memory, O(n * windows per piece)
time, about 2n at the default stride), and `Stitcher` writes each window's results into its
text's stitched array as the window's row comes (`Layout.place` says where), in any order, so a
caller that stitches batch by batch (Pipeline.per_token) never holds every window's rows: the
windows overlap, and all their rows at once would be twice the answer. A 5 MB line (about a
million pieces) takes the memory of its pieces and of its answer, never windows x pieces.
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
    """For each window, which of its pieces have their most context in it (first best wins).

    Each window scores its own slice only, against the best score so far of each piece: a
    strictly greater score takes the piece, so the earlier window keeps a tie (the argmax over
    all windows that google-research/bert computes, without its windows x pieces table)."""
    best = np.full(n, -np.inf)  # (n,) the best score so far of each piece
    owner = np.zeros(n, np.int64)  # (n,) the window that has it
    for k, (start, length) in enumerate(spans):
        p = np.arange(start, start + length)
        score = np.minimum(p - start, start + length - 1 - p) + 0.01 * length
        won = score > best[start : start + length]
        best[start : start + length][won] = score[won]
        owner[start : start + length][won] = k
    return [owner[start : start + length] == k for k, (start, length) in enumerate(spans)]


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
        if n <= size:  # fits (most texts): the row itself, its one window owns every piece
            ids.append(row)
            types.append(np.zeros(len(row), np.int64))
            windows.append(TextWindow(i, 0, np.ones(n, bool)))
            continue
        spans = windows_of(n, size, stride)[: 1 if truncate else None]
        for (start, length), best in zip(spans, max_context_flags(spans, n)):
            ids.append(np.r_[row[0], row[1 + start : 1 + start + length], row[-1]])
            types.append(np.zeros(length + 2, np.int64))
            windows.append(TextWindow(i, start, best))
    return Features(ids, types, np.zeros(len(ids), np.int64)), windows


class Layout:
    """Where each window's results go in its text's stitched results (see `stitch`): a text's
    windows, in their order, give [CLS] (the first), their own pieces, [SEP] (the last)."""

    def __init__(self, windows: Sequence[TextWindow], texts: int) -> None:
        self.windows = windows
        self.sizes = [0] * texts  # per text: its stitched length (0: no windows)
        self.first, self.last = [-1] * texts, [-1] * texts
        self.offsets = np.zeros(len(windows), np.int64)  # position of each window's 1st piece
        for k, w in enumerate(windows):
            if self.first[w.text] < 0:
                self.first[w.text], self.sizes[w.text] = k, 1  # [CLS]
            self.offsets[k] = self.sizes[w.text]
            self.sizes[w.text] += int(w.best.sum())
            self.last[w.text] = k
        for t in range(texts):
            self.sizes[t] += self.sizes[t] > 0  # [SEP]

    def place(self, k: int, length: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(text, rows, positions) for window k's row of `length` results (its pieces + 2):
        which of them its text keeps, and where they go among the text's stitched results."""
        w = self.windows[k]
        rows = 1 + np.flatnonzero(w.best)
        positions = self.offsets[k] + np.arange(len(rows))
        if k == self.first[w.text]:
            rows, positions = np.r_[0, rows], np.r_[0, positions]
        if k == self.last[w.text]:
            rows, positions = np.r_[rows, length - 1], np.r_[positions, self.sizes[w.text] - 1]
        return w.text, rows, positions


class Stitcher:
    """Texts' per-token results, each window's row written in place as it comes (any order):
    `results` (one array per text, of its first row's dtype; None for a text without windows)
    once every row is in."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.results: list[Any] = [None] * len(layout.sizes)

    def add(self, k: int, row: np.ndarray) -> None:
        """Window k's row (length + 2, ...): the results its text keeps, put in place."""
        text, rows, positions = self.layout.place(k, len(row))
        if self.results[text] is None:
            shape = (self.layout.sizes[text], *row.shape[1:])
            self.results[text] = np.empty(shape, row.dtype)
        self.results[text][positions] = row[rows]


def stitch(windows: Sequence[TextWindow], rows: Sequence[np.ndarray], texts: int) -> list[Any]:
    """Per text, its token results (n + 2, ...) from its windows' rows (length + 2, ...);
    None for a text without windows among them."""
    stitcher = Stitcher(Layout(windows, texts))
    for k, row in enumerate(rows):
        stitcher.add(k, row)
    return stitcher.results


def contributions(windows: Sequence[TextWindow]) -> np.ndarray:
    """How many pieces each window gives its text (weights for averaging per-window results)."""
    return np.array([max(int(w.best.sum()), 1) for w in windows], np.float64)
