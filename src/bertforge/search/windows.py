"""The windows of a search corpus's documents, one home for both backends (index.py: the
directory, postgres.py: PostgreSQL): their size and stride checked against the model, each
document cut into overlapping windows of pieces with the characters each covers, the windows
embedded a bounded block at a time, and a corpus read a chunk of documents at a time.

    length, stride = window_settings(pipe, window=None, stride=None)   # the model's length
    pieces, owners, starts, lengths, spans = cut_windows(pipe, texts, length, stride)
    for block in embedded_windows(pipe, pieces, owners, starts, lengths, prompt): ...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..tasks.windows import windows_of

EMBED_BLOCK = 2048  # windows embedded per call while building: memory bounded for any document


def chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """`items` in lists of `size` (the last shorter): a build's unit of work and of memory."""
    while chunk := list(islice(items, size)):
        yield chunk


def default_stride(window: int) -> int:
    """Pieces between a long document's windows unless given: half a window."""
    return max(1, window // 2)


def window_settings(
    pipe: Any, window: int | None, stride: int | None, prompt: str = ""
) -> tuple[int, int]:
    """(pieces per window, pieces between windows), checked against the model's length less
    the prompt each window is read after."""
    positions = pipe.config.max_tokens
    longest = min(pipe.embedding_settings.max_length or positions, positions) - 2
    if prompt:
        longest -= len(pipe.tok.encode(prompt, add_special_tokens=False, truncation=False).ids)
    if longest < 1:
        raise ConfigError(f"the prompt {prompt!r} leaves no room for a document in a window")
    length = longest if window is None else window
    if not 1 <= length <= longest:
        raise ConfigError(
            f"window={window} (--window): must be between 1 and the model's {longest} pieces"
        )
    stride = default_stride(length) if stride is None else stride
    if not 1 <= stride <= length:
        raise ConfigError(
            f"stride={stride} (--stride): must be between 1 and the window, {length} pieces"
        )
    return length, stride


def cut_windows(
    pipe: Any, texts: Sequence[str], window: int, stride: int
) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each text's pieces and its windows (index --window): (pieces, owners (W,): each
    window's text, starts (W,) and lengths (W,) in pieces, spans (W, 2): its characters, words
    whole)."""
    pieces = pipe.tok.encode_long(list(texts))
    owners, starts, lengths, spans = [], [], [], []
    for d, p in enumerate(pieces):
        windows = windows_of(len(p.ids), window, stride)
        owners += [d] * len(windows)
        starts += [a for a, _ in windows]
        lengths += [n for _, n in windows]
        spans += [p.span(a, a + n) if len(p.ids) else (0, len(texts[d])) for a, n in windows]
    owned, first, width = (np.asarray(x, np.int64) for x in (owners, starts, lengths))
    return pieces, owned, first, width, np.array(spans, np.int64).reshape(len(owners), 2)


def embedded_windows(
    pipe: Any,
    pieces: Sequence[Any],
    owners: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    prompt: str,
) -> Iterator[np.ndarray]:
    """The windows' vectors (cut_windows), float32 (b, dimensions) blocks of EMBED_BLOCK
    windows in order: memory bounded for any document."""
    for a in range(0, len(owners), EMBED_BLOCK):
        rows = [
            pieces[owners[w]].ids[starts[w] : starts[w] + lengths[w]].tolist()
            for w in range(a, min(a + EMBED_BLOCK, len(owners)))
        ]
        yield pipe.embed(rows, prompt=prompt).astype(np.float32)
