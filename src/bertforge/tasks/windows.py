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

from ..errors import ConfigError
from .base import Features


def windows_of(n: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window of at most max_tokens over n pieces, starting stride
    pieces apart (both at least 1: a stride of 0 would never end)."""
    if max_tokens < 1 or stride < 1:
        raise ConfigError(f"windows of {max_tokens} pieces, {stride} apart: both must be >= 1")
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


class Windows(Sequence[TextWindow]):
    """The rows `split` makes, as arrays (no object per row: a run over 50,000 short texts
    made 50,000 of them, about a tenth of its host time), each readable as a TextWindow.

    text (R,): the text of each row; start (R,): its first piece among its text's pieces;
    pieces (R,): its own pieces (its length - 2); cut: the owned-piece flags of each row that
    is a window of a longer text (a row not in it is its whole text and owns every piece)."""

    def __init__(
        self, text: np.ndarray, start: np.ndarray, pieces: np.ndarray, cut: dict[int, np.ndarray]
    ) -> None:
        self.text, self.start, self.pieces, self.cut = text, start, pieces, cut

    @classmethod
    def of(cls, windows: Sequence[TextWindow]) -> Windows:
        """Any TextWindows (a subset, in any order) as Windows; every row keeps its flags."""
        if isinstance(windows, Windows):
            return windows
        return cls(
            np.array([w.text for w in windows], np.int64),
            np.array([w.start for w in windows], np.int64),
            np.array([len(w.best) for w in windows], np.int64),
            {k: w.best for k, w in enumerate(windows)},
        )

    def __len__(self) -> int:
        return len(self.text)

    def __getitem__(self, k: int) -> TextWindow:  # type: ignore[override]
        k = range(len(self))[k]  # a negative index counts from the end; past it: IndexError
        return TextWindow(int(self.text[k]), int(self.start[k]), self.best(k))

    def best(self, k: int) -> np.ndarray:
        """Row k's flags: which of its pieces take their result from it."""
        flags = self.cut.get(int(k))
        return flags if flags is not None else np.ones(int(self.pieces[k]), bool)

    @property
    def whole(self) -> np.ndarray:
        """(R,) bool: the rows that are their whole text."""
        whole = np.ones(len(self), bool)
        whole[list(self.cut)] = False
        return whole

    @property
    def texts_cut(self) -> int:
        """How many texts were cut into windows (or, with truncate, cut short)."""
        return len({int(t) for t in self.text[list(self.cut)]})

    @property
    def owned(self) -> np.ndarray:
        """(R,) how many pieces each row gives its text."""
        owned = self.pieces.copy()
        for k, flags in self.cut.items():
            owned[k] = int(flags.sum())
        return owned


def split(
    encodings: Sequence[Any], max_length: int, stride: int | None = None, truncate: bool = False
) -> tuple[Features, Windows]:
    """Rows for encodings (or their id arrays) made with [CLS] and [SEP] and no truncation: one
    per text that fits in max_length, windows (stride: default half a window) for the others;
    truncate keeps only the first window of each."""
    size = max_length - 2
    stride = stride or max(1, size // 2)
    rows = [e if isinstance(e, np.ndarray) else np.asarray(e.ids, np.int64) for e in encodings]
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    zeros = np.zeros(int(lengths.max(initial=0)), np.int64)  # segment ids: read-only views
    zeros.flags.writeable = False
    if (lengths - 2 <= size).all():  # every text fits (most calls): each is its own row
        types = [zeros[:n] for n in lengths.tolist()]
        windows = Windows(np.arange(len(rows)), np.zeros_like(lengths), lengths - 2, {})
        return Features(rows, types, np.zeros(len(rows), np.int64)), windows
    ids, where, cut = [], [], {}  # where: (text, start, pieces) of each row
    for i, row in enumerate(rows):
        n = len(row) - 2
        if n <= size:  # fits: the row itself, its one window owns every piece
            ids.append(row)
            where.append((i, 0, n))
            continue
        spans = windows_of(n, size, stride)[: 1 if truncate else None]
        for (start, length), best in zip(spans, max_context_flags(spans, n)):
            cut[len(ids)] = best
            ids.append(np.r_[row[0], row[1 + start : 1 + start + length], row[-1]])
            where.append((i, start, length))
    types = [zeros[: len(r)] for r in ids]  # a window is never longer than its text
    windows = Windows(*np.array(where, np.int64).reshape(-1, 3).T, cut)
    return Features(ids, types, np.zeros(len(ids), np.int64)), windows


class Layout:
    """Where each window's results go in its text's stitched results (see `stitch`): a text's
    windows, in their order, give [CLS] (the first), their own pieces, [SEP] (the last)."""

    def __init__(self, windows: Sequence[TextWindow], texts: int) -> None:
        self.windows = w = Windows.of(windows)
        self.sizes = np.zeros(texts, np.int64)  # per text: its stitched length (0: no windows)
        self.first, self.last = np.full(texts, -1), np.full(texts, -1)
        self.offsets = np.ones(len(w), np.int64)  # position of each window's 1st piece
        rows = np.flatnonzero(w.whole)  # a whole text: [CLS], its pieces, [SEP]
        self.sizes[w.text[rows]] = w.pieces[rows] + 2
        self.first[w.text[rows]] = self.last[w.text[rows]] = rows
        owned = w.owned
        for k in sorted(w.cut):  # the windows of longer texts, in their order
            t = w.text[k]
            if self.first[t] < 0:
                self.first[t], self.sizes[t] = k, 1  # [CLS]
            self.offsets[k] = self.sizes[t]
            self.sizes[t] += owned[k]
            self.last[t] = k
        cut_texts = w.text[list(w.cut)]
        self.sizes[cut_texts] = self.sizes[cut_texts] + 1  # [SEP] (a text's size set once)

    def place(self, k: int, length: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(text, rows, positions) for window k's row of `length` results (its pieces + 2):
        which of them its text keeps, and where they go among the text's stitched results."""
        text = int(self.windows.text[k])
        rows = 1 + np.flatnonzero(self.windows.best(k))
        positions = self.offsets[k] + np.arange(len(rows))
        if k == self.first[text]:
            rows, positions = np.r_[0, rows], np.r_[0, positions]
        if k == self.last[text]:
            rows, positions = np.r_[rows, length - 1], np.r_[positions, self.sizes[text] - 1]
        return text, rows, positions


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
    return np.maximum(Windows.of(windows).owned, 1).astype(np.float64)
