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

from .table import header_error, not_allowed, open_table


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
    table = open_table(path, ",", quoting=True)
    names = table.names or []
    context_i = table.column("sent1", "context column")
    start_i = table.column("sent2", "start column")
    ending_is: list[int] = []
    while f"ending{len(ending_is)}" in names:
        ending_is.append(names.index(f"ending{len(ending_is)}"))
    if len(ending_is) < 2:
        raise header_error(path, names, "expected columns ending0, ending1, ... in the header")
    label_i = table.column("label", "label column") if labelled else None
    allowed = [str(k) for k in range(len(ending_is))]

    out: list[ChoiceExample] = []
    for row in table.records():
        label: int | None = None
        if label_i is not None:
            # Not label_field: an ending's number, and its message quotes the raw field.
            raw = str(row.value(label_i)).strip()
            if raw not in allowed:
                raise not_allowed(row.where, "label", repr(raw), allowed)
            label = int(raw)
        out.append(
            ChoiceExample(
                context=row.text(context_i),
                start=str(row.value(start_i)),
                endings=[row.text(i) for i in ending_is],
                label=label,
                guid=f"{path.stem}-{len(out)}",
                source=row.source,
            )
        )
    return out
