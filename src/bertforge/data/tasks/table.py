"""Sentence and sentence-pair examples from tables: TSV, CSV and JSONL, plus the row readers
that the GLUE and SWAG readers share.

Why one module for this: every task file that is a table (GLUE TSVs, SWAG CSV, a user's own
spam or sentiment file) has the same failure modes, a missing column, a row with too few
fields, a label outside the task's set, an empty text, and they must all end in one
`DataError` naming the file, the line and the field, never a KeyError from deep inside.

Quoting. TSV is split on tabs with no quote processing (the GLUE convention: SST-2, MRPC and
RTE texts contain `"` characters that a CSV parser would swallow). CSV follows RFC 4180
quoting through the `csv` module; a quoted field may span lines, and the line reported for
a record is the line where it starts.

Encoding. UTF-8, with a byte-order mark tolerated at the start (MRPC has one). A byte that is
not UTF-8 is an error naming file, line and byte.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ...errors import DataError, InputError
from ...fileio import text_lines

Column = str | int  # a header name, or a 0-based field index
T = TypeVar("T")


@dataclass(frozen=True)
class Example:
    """One sentence (text_pair None) or sentence-pair example.

    label is a class name (always a string, e.g. "1" or "entailment"), a float for regression,
    a tuple of class names for multi-label tasks, or None for unlabelled (test) files. source is "file:line" for error messages and
    debugging.
    """

    text: str
    text_pair: str | None
    label: str | float | tuple[str, ...] | None
    guid: str
    source: str


# --------------------------------------------------------------------------- lines and rows


def iter_rows(
    path: str | os.PathLike[str], delimiter: str = "\t", quoting: bool = False
) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each non-blank record of a delimited file.

    quoting=False splits each line on the delimiter (TSV, GLUE); quoting=True parses
    RFC 4180 quotes (CSV), where the line number is that of the record's first line.
    """
    if len(delimiter) != 1:
        raise InputError(f"delimiter {delimiter!r}: must be a single character")
    if not quoting:
        for lineno, line in text_lines(path):
            line = line.rstrip("\r\n")
            if line.strip():
                yield lineno, line.split(delimiter)
        return
    reader = csv.reader((line for _, line in text_lines(path)), delimiter=delimiter, strict=True)
    consumed = 0
    while True:
        start = consumed + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise DataError(f"{path}: line {reader.line_num}: malformed CSV: {e}") from None
        consumed = reader.line_num
        if any(f.strip() for f in fields):
            yield start, fields


def column_index(
    path: str | os.PathLike[str],
    header: Sequence[str] | None,
    column: Column,
    role: str,
    width: int | None = None,
) -> int:
    """The field index of `column` (a header name or an index); role names it in errors.

    width is the number of fields of a row (default: the header's).
    """
    if isinstance(column, bool) or not isinstance(column, (str, int)):
        raise InputError(f"{role}: {column!r} must be a column name or a 0-based index")
    if isinstance(column, int):
        width = len(header) if width is None and header is not None else width
        if column < 0 or (width is not None and column >= width):
            raise DataError(
                f"{path}: {role} index {column} is out of range (line 1 has {width} fields)"
            )
        return column
    if header is None:
        raise DataError(
            f'{path}: {role} "{column}" is a column name but the file is read without a '
            "header; give a 0-based column index instead"
        )
    if column not in header:
        raise DataError(
            f'{path}: line 1: column "{column}" ({role}) missing from the header; '
            f"the header has: {', '.join(repr(h) for h in header)}"
        )
    return list(header).index(column)


def check_field_count(
    path: str | os.PathLike[str], lineno: int, fields: Sequence[str], expected: int, what: str
) -> None:
    if len(fields) != expected:
        raise DataError(
            f"{path}: line {lineno}: {len(fields)} fields, expected {expected} ({what}); "
            "a delimiter inside a text, or a missing column?"
        )


def text_field(where: str, field: str, value: object) -> str:
    """A non-empty string, else a DataError naming `where` (file: line N) and the field."""
    if not isinstance(value, str):
        raise DataError(f'{where}: field "{field}": expected a string, got {type(value).__name__}')
    if not value.strip():
        raise DataError(f'{where}: field "{field}": empty text')
    return value


def label_field(
    where: str,
    field: str,
    value: object,
    labels: Sequence[str] | None = None,
    regression: bool = False,
) -> str | float:
    """A class label (string, checked against `labels` when given) or a finite float."""
    if regression:
        number: float | None = None
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        if number is None or not math.isfinite(number):
            raise DataError(
                f'{where}: field "{field}": {value!r} is not a number (regression label)'
            )
        return number
    if isinstance(value, str):
        label = value.strip()
    elif isinstance(value, (int, bool)):  # JSON 1 / true: as they would be written in a TSV
        label = json.dumps(value)
    else:
        raise DataError(
            f'{where}: field "{field}": label must be a string or an integer, '
            f"got {type(value).__name__}"
        )
    if not label:
        raise DataError(f'{where}: field "{field}": empty label')
    if labels is not None and label not in labels:
        raise DataError(
            f'{where}: field "{field}": label {label!r} is not one of the allowed labels: '
            f"{', '.join(labels)}"
        )
    return label


def multi_label_field(
    where: str, field: str, value: object, labels: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The labels of one multi-label row: "a|b" (a JSON list of strings too); "" for none."""
    if isinstance(value, str):
        items: list[object] = value.split("|")
    elif isinstance(value, list):
        items = value
    else:
        raise DataError(
            f'{where}: field "{field}": expected labels separated by |, got {type(value).__name__}'
        )
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise DataError(f'{where}: field "{field}": label {item!r} is not a string')
        name = item.strip()
        if name and labels is not None and name not in labels:
            raise DataError(
                f'{where}: field "{field}": label {name!r} is not one of the allowed '
                f"labels: {', '.join(labels)}"
            )
        if name and name not in out:
            out.append(name)
    return tuple(out)


def flag_fields(where: str, names: Sequence[str], values: Sequence[object]) -> tuple[str, ...]:
    """The labels of one row given as one 0/1 column per label: the names whose value is 1."""
    out = []
    for name, value in zip(names, values):
        flag = value.strip() if isinstance(value, str) else json.dumps(value)
        if flag not in ("0", "1", "false", "true"):
            raise DataError(
                f'{where}: field "{name}": {value!r} is not 0 or 1 (one column per label)'
            )
        if flag in ("1", "true"):
            out.append(name)
    return tuple(out)


# --------------------------------------------------------------------------- generic reader

FORMATS = ("auto", "tsv", "csv", "jsonl")


def detect_table_format(path: str | os.PathLike[str]) -> str:
    """jsonl for .jsonl/.ndjson, csv for .csv, else tsv (the SMS spam file has no suffix)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    return "csv" if suffix == ".csv" else "tsv"


def read_examples(
    path: str | os.PathLike[str],
    text_column: Column,
    label_column: Column | Sequence[Column] | None = None,
    text_pair_column: Column | None = None,
    *,
    fmt: str = "auto",
    delimiter: str | None = None,
    header: bool = True,
    quoting: bool | None = None,
    labels: Sequence[str] | None = None,
    regression: bool = False,
    id_column: Column | None = None,
    multi_label: bool = False,
) -> list[Example]:
    """Examples from a TSV, CSV or JSONL file of your own.

    Columns are header names, or 0-based indices (always allowed; the only choice with
    header=False). For JSONL, columns are keys of each line's object and header/delimiter do
    not apply. fmt "auto" goes by the suffix (see detect_table_format). delimiter overrides
    the format's ("\\t" for tsv, "," for csv); quoting defaults to on for csv, off for tsv.
    labels, when given, is the allowed label set; regression=True reads float labels.
    label_column None gives unlabelled examples (label None). guid is the id_column's value
    when given, else "<file stem>-<row number from 0>". multi_label: each label a tuple of
    names, from one column of names separated by | or, when label_column is a list of
    columns, one 0/1 column per label (named by the column).

    Example, the SMS spam collection (no header, `label<TAB>text`):
        read_examples(path, text_column=1, label_column=0, header=False, labels=["ham", "spam"])
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"fmt {fmt!r}: must be one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_table_format(path)
    flags = list(label_column) if isinstance(label_column, (list, tuple)) else None
    if fmt == "jsonl":
        return _read_jsonl(
            path,
            text_column,
            label_column,
            text_pair_column,
            labels,
            regression,
            id_column,
            multi_label,
        )
    delim = delimiter if delimiter is not None else ("," if fmt == "csv" else "\t")
    quote = quoting if quoting is not None else fmt == "csv"
    rows = iter_rows(path, delim, quote)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path}: no rows (empty file)")
    names: list[str] | None = None
    if header:
        names = [h.strip() for h in first[1]]
        n_fields, what = len(names), "the header's column count"
    else:
        rows = itertools.chain([first], rows)
        n_fields, what = len(first[1]), "the column count of line 1"

    def col(c: Column | None, role: str) -> int | None:
        return None if c is None else column_index(path, names, c, role, n_fields)

    text_i = column_index(path, names, text_column, "text_column", n_fields)
    pair_i = col(text_pair_column, "text_pair_column")
    label_i = None if flags else col(label_column, "label_column")  # type: ignore[arg-type]
    flag_i = [column_index(path, names, c, "label_column", n_fields) for c in flags or ()]
    id_i = col(id_column, "id_column")

    def field_name(i: int) -> str:
        return names[i] if names is not None else f"column {i}"

    def label(where: str, fields: list[str]) -> str | float | tuple[str, ...] | None:
        if flags:
            return flag_fields(where, [field_name(i) for i in flag_i], [fields[i] for i in flag_i])
        if label_i is None:
            return None
        if multi_label:
            return multi_label_field(where, field_name(label_i), fields[label_i], labels)
        return label_field(where, field_name(label_i), fields[label_i], labels, regression)

    out: list[Example] = []
    for lineno, fields in rows:
        check_field_count(path, lineno, fields, n_fields, what)
        where = f"{path}: line {lineno}"
        out.append(
            Example(
                text=text_field(where, field_name(text_i), fields[text_i]),
                text_pair=None
                if pair_i is None
                else text_field(where, field_name(pair_i), fields[pair_i]),
                label=label(where, fields),
                guid=fields[id_i].strip() if id_i is not None else f"{path.stem}-{len(out)}",
                source=f"{path}:{lineno}",
            )
        )
    if not out:
        raise DataError(f"{path}: no data rows after the header")
    return out


def _read_jsonl(
    path: Path,
    text_column: Column,
    label_column: Column | None,
    text_pair_column: Column | None,
    labels: Sequence[str] | None,
    regression: bool,
    id_column: Column | None,
    multi_label: bool,
) -> list[Example]:
    flags = list(label_column) if isinstance(label_column, (list, tuple)) else None
    for role, c in (
        ("text_column", text_column),
        *(("label_column", f) for f in flags or [label_column]),
        ("text_pair_column", text_pair_column),
        ("id_column", id_column),
    ):
        if c is not None and not isinstance(c, str):
            raise InputError(f"{role}: {c!r}: JSONL columns are key names (strings)")
    out: list[Example] = []
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")

        def get(key: str, role: str, obj: dict[str, object] = obj, where: str = where) -> object:
            if key not in obj:
                raise DataError(
                    f'{where}: field "{key}" ({role}) missing; the object has: '
                    f"{', '.join(repr(k) for k in obj) or 'no keys'}"
                )
            return obj[key]

        assert isinstance(text_column, str)
        out.append(
            Example(
                text=text_field(where, text_column, get(text_column, "text_column")),
                text_pair=None
                if text_pair_column is None
                else text_field(
                    where, str(text_pair_column), get(str(text_pair_column), "text_pair_column")
                ),
                label=None
                if label_column is None
                else flag_fields(where, flags, [get(str(f), "label_column") for f in flags])
                if flags
                else multi_label_field(
                    where, str(label_column), get(str(label_column), "label_column"), labels
                )
                if multi_label
                else label_field(
                    where,
                    str(label_column),
                    get(str(label_column), "label_column"),
                    labels,
                    regression,
                ),
                guid=str(get(str(id_column), "id_column"))
                if id_column is not None
                else f"{path.stem}-{len(out)}",
                source=f"{path}:{lineno}",
            )
        )
    if not out:
        raise DataError(f"{path}: no rows (empty file)")
    return out


# --------------------------------------------------------------------------- splitting


def split_train_test(
    items: Sequence[T], test_fraction: float = 0.2, rng: np.random.Generator | None = None
) -> tuple[list[T], list[T]]:
    """(train, test): a fixed random split for data sets that come without one (SMS spam).

    round(len * test_fraction) items go to test, chosen by rng.permutation; rng None means
    numpy.random.default_rng(0), the project's fixed split. Both parts keep file order, so
    the same seed gives the same files byte for byte.
    """
    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"test_fraction {test_fraction}: must be strictly between 0 and 1")
    rng = np.random.default_rng(0) if rng is None else rng
    n = len(items)
    n_test = round(n * test_fraction)
    is_test = np.zeros(n, dtype=bool)
    is_test[rng.permutation(n)[:n_test]] = True
    train = [items[i] for i in range(n) if not is_test[i]]
    test = [items[i] for i in range(n) if is_test[i]]
    return train, test


def label_set(examples: Iterable[Example]) -> list[str]:
    """The sorted distinct class labels of examples (for a file with no declared label set);
    multi-label examples: every label any example has."""
    found: set[str] = set()
    for e in examples:
        found.update(
            [e.label] if isinstance(e.label, str) else e.label if isinstance(e.label, tuple) else ()
        )
    return sorted(found)
