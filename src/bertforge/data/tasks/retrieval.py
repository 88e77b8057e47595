"""Retrieval training files: (query, positive passage) pairs, optionally with hard negatives.

JSONL: one object per line, {"query": str, "positive": str, "negatives": [str, ...]} (negatives
optional). A table (TSV, or CSV when the file ends in .csv) with a header naming `query`,
`positive` and any number of `negative...` columns. Every row of a file has the same number of
negatives (a training row reads them side by side); an empty text is an error naming the line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import DataError
from .table import Record, _jsonl_records, header_error, open_table, text_field


@dataclass(frozen=True)
class RetrievalExample:
    query: str
    positive: str
    negatives: tuple[str, ...] = ()
    source: str = ""  # file:line


def read_retrieval(path: str | os.PathLike[str]) -> list[RetrievalExample]:
    """The examples of a retrieval training or dev file (see the module docstring)."""
    path = Path(path)
    examples: list[RetrievalExample] = []
    if path.suffix == ".jsonl":
        for r in _jsonl_records(path):
            negatives = r.fields.get("negatives", [])  # type: ignore[union-attr]
            if not isinstance(negatives, list):
                raise DataError(f'{r.where}: field "negatives": expected a list of texts')
            examples.append(
                RetrievalExample(
                    r.text("query", "the query"),
                    r.text("positive", "a relevant passage"),
                    tuple(
                        text_field(r.where, f"negatives[{i}]", n) for i, n in enumerate(negatives)
                    ),
                    r.source,
                )
            )
    else:
        table = open_table(
            path, "," if path.suffix == ".csv" else "\t", quoting=path.suffix == ".csv"
        )
        names = list(table.names or [])
        negative_columns = [i for i, n in enumerate(names) if n.startswith("negative")]
        if "query" not in names or "positive" not in names:
            raise header_error(
                path, names, 'a retrieval table needs "query" and "positive" columns'
            )
        q, p = names.index("query"), names.index("positive")
        for r in table.records():
            examples.append(_row(r, q, p, negative_columns))
    for e in examples[1:]:
        if len(e.negatives) != len(examples[0].negatives):
            raise DataError(
                f"{e.source}: {len(e.negatives)} negatives, but {examples[0].source} has "
                f"{len(examples[0].negatives)}: every row of a file needs the same number"
            )
    return examples


def _row(r: Record, q: int, p: int, negatives: list[int]) -> RetrievalExample:
    return RetrievalExample(r.text(q), r.text(p), tuple(r.text(i) for i in negatives), r.source)
