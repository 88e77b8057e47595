"""SWAG multiple choice CSV: one `ChoiceExample` per row (a context and four endings).

SWAG's files (train.csv, val.csv, test.csv) are quoted CSV with a header: an unnamed row
index, video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0..ending3 and
(not in test.csv) label. The model scores each pair (sent1, sent2 + " " + ending_k), as in
the paper's setup; this reader only returns the parts. Columns are read by name.

sent1 (the context) and every ending must be non-empty; sent2 (the start of the second
sentence, e.g. "She") may be empty. labelled=None reads a file named test* unlabelled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import DataError
from .table import check_field_count, column_index, iter_rows, text_field


@dataclass(frozen=True)
class ChoiceExample:
    """context (sent1), start of the answer sentence (sent2), the endings, the right one."""

    context: str
    start: str
    endings: list[str]
    label: int | None
    guid: str
    source: str


def read_swag(path: str | os.PathLike[str], *, labelled: bool | None = None) -> list[ChoiceExample]:
    """Examples of a SWAG CSV file; the endings are ending0, ending1, ... in the header."""
    path = Path(path)
    if labelled is None:
        labelled = not path.name.lower().startswith("test")
    rows = iter_rows(path, ",", quoting=True)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path}: no rows (empty file)")
    names = [h.strip() for h in first[1]]
    context_i = column_index(path, names, "sent1", "context column")
    start_i = column_index(path, names, "sent2", "start column")
    ending_is: list[int] = []
    while f"ending{len(ending_is)}" in names:
        ending_is.append(names.index(f"ending{len(ending_is)}"))
    if len(ending_is) < 2:
        raise DataError(
            f"{path}: line 1: expected columns ending0, ending1, ... in the header; "
            f"the header has: {', '.join(repr(h) for h in names)}"
        )
    label_i = column_index(path, names, "label", "label column") if labelled else None
    allowed = [str(k) for k in range(len(ending_is))]

    out: list[ChoiceExample] = []
    for lineno, fields in rows:
        check_field_count(path, lineno, fields, len(names), "the header's column count")
        where = f"{path}: line {lineno}"
        label: int | None = None
        if label_i is not None:
            raw = fields[label_i].strip()
            if raw not in allowed:
                raise DataError(
                    f'{where}: field "label": {raw!r} is not one of the allowed labels: '
                    f"{', '.join(allowed)}"
                )
            label = int(raw)
        out.append(
            ChoiceExample(
                context=text_field(where, "sent1", fields[context_i]),
                start=fields[start_i],
                endings=[text_field(where, names[i], fields[i]) for i in ending_is],
                label=label,
                guid=f"{path.stem}-{len(out)}",
                source=f"{path}:{lineno}",
            )
        )
    if not out:
        raise DataError(f"{path}: no data rows after the header")
    return out
