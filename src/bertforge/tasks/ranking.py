"""Cross-encoders: a (query, document) pair read together, one relevance score out.

A cross-encoder is a `BertForSequenceClassification` with one label, as sentence-transformers
writes a CrossEncoder. Its scores go through the activation the model directory names, read
where each sentence-transformers version keeps it: `config_sentence_transformers.json`'s
"activation_fn" (version 6), config.json's `sentence_transformers.activation_fn` (4 and 5),
config.json's `sbert_ce_default_activation_function` (before 4); none: sigmoid, as
`CrossEncoder.predict` does for one label. `pair_rows` lays a pair out as rows the model reads: the
pair itself when it fits, else the query (cut to half a row at most) with each window of the
document in turn, `stride` pieces apart; a document's score is its best window's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..fileio import read_json
from .windows import windows_of

# the activations sentence-transformers saves (torch.nn classes), by their class name
ACTIVATIONS = ("Sigmoid", "Identity", "Tanh")


def activation(path: str | os.PathLike[str]) -> str:
    """The activation a cross-encoder directory names (one of ACTIVATIONS), sigmoid if none."""
    path = Path(path)
    config_file = path / "config.json"
    config = read_json(config_file, CheckpointError)
    st = config.get("sentence_transformers")
    found = [
        (
            config_file,
            "sentence_transformers.activation_fn",
            isinstance(st, dict) and st.get("activation_fn"),
        ),
        (
            config_file,
            "sbert_ce_default_activation_function",
            config.get("sbert_ce_default_activation_function"),
        ),
    ]
    st_config = path / "config_sentence_transformers.json"
    if st_config.is_file():  # version 6's place comes first
        value = read_json(st_config, CheckpointError).get("activation_fn")
        found.insert(0, (st_config, "activation_fn", value))
    for file, field, value in found:
        if not value:
            continue
        name = str(value).rsplit(".", 1)[-1]
        if not str(value).startswith("torch.") or name not in ACTIVATIONS:
            raise CheckpointError(
                f"{file}: {field} = {value!r}: bertforge applies torch.nn's "
                f"{', '.join(ACTIVATIONS)} (pass raw scores and apply your own)"
            )
        return name.lower()
    return "sigmoid"


def activate(logits: torch.Tensor, name: str) -> torch.Tensor:
    """A cross-encoder's scores from its (N,) logits."""
    if name == "sigmoid":
        return torch.sigmoid(logits)
    return torch.tanh(logits) if name == "tanh" else logits


def pair_rows(
    query: Sequence[int],
    document: Sequence[int],
    ids: tuple[int, int],
    max_length: int,
    stride: int | None = None,
    truncate: bool = False,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input ids, token type ids) of each row that reads the pair of piece lists (no special
    tokens): one row [CLS] query [SEP] document [SEP] when it fits in max_length; else the
    query, cut to fit beside the whole document or to half a row at most, with each window of
    the document (stride: default half a window); truncate: the first window only."""
    cls_id, sep_id = ids
    room = max_length - 3
    if room < 2:
        raise ValueError(f"max_length={max_length}: a pair needs at least 5 pieces")
    q = list(query)[: max(room - len(document), min(len(query), room // 2))]
    size = room - len(q)
    spans = windows_of(len(document), size, stride or max(1, size // 2))
    rows = []
    for start, length in spans[: 1 if truncate else None]:
        row = np.asarray([cls_id, *q, sep_id, *document[start : start + length], sep_id], np.int64)
        types = np.zeros(len(row), np.int64)
        types[len(q) + 2 :] = 1
        rows.append((row, types))
    return rows


def ranked(scores: Sequence[float]) -> list[int]:
    """Indices by score, highest first (ties: in the given order)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])
