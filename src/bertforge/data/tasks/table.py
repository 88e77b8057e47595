"""Sentence and sentence-pair examples from tables: TSV, CSV and JSONL, plus the pieces that
the GLUE and SWAG readers are built from (open_table, Table, Record and the field checks).

Why one module for this: every task file that is a table (GLUE TSVs, SWAG CSV, a user's own
spam or sentiment file) has the same failure modes, a missing column, a row with too few
fields, a label outside the task's set, an empty text, and they must all end in one
`DataError` naming the file, the line and the field, never a KeyError from deep inside.
So there is one way to open a table (open_table), find a column (Table.column), walk its
rows (Table.records) and read an example's fields from a row (Record, ExampleFields).

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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

from ...errors import DataError, InputError
from ...fileio import text_lines

Column = str | int  # a header name, or a 0-based field index
T = TypeVar("T")


@dataclass(frozen=True)
class Example:
    """One sentence (text_pair None) or sentence-pair example.

    label is a class name (always a string, e.g. "1" or "entailment"), a float for regression,
    a tuple of class names for multi-label tasks, or None for unlabelled (test) files. source
    is "file:line" for error messages and debugging.
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
            raise _csv_error(path, start, reader.line_num, e) from None
        consumed = reader.line_num
        if any(f.strip() for f in fields):
            yield start, fields


def _csv_error(path: str | os.PathLike[str], start: int, line: int, e: csv.Error) -> DataError:
    """A CSV record's error: a quote the file ends inside (the csv module's "unexpected end of
    data", seen at the last line) is named at the line where its record starts; another at
    the line where the parser met it."""
    if "unexpected end of data" in str(e):
        return DataError(
            f"{path}: line {start}: a quoted field never closed (the file ends inside it)"
        )
    record = f" (in the record from line {start})" if line != start else ""
    return DataError(f"{path}: line {line}: malformed CSV{record}: {e}")


def header_error(path: str | os.PathLike[str], header: Sequence[str], problem: str) -> DataError:
    """The error for a header that lacks what a reader needs; it lists what the header has (a
    JSON object where the header should be: the file is JSONL, named otherwise)."""
    line = ",".join(header).strip()
    if line.startswith("{") and line.endswith("}"):
        return DataError(
            f"{path}: line 1 is a JSON object, not a table header: a JSONL file must end in "
            ".jsonl (files are read by their suffix)"
        )
    return DataError(f"{path}: line 1: {problem}; the header has: {', '.join(map(repr, header))}")


@dataclass(slots=True)  # not frozen: made once per row, and frozen init is slow
class Record:
    """One data row and where it came from: a table's fields (by index) or a JSONL line's
    object (by key), so that every field error names the file, the line and the field."""

    path: Path
    lineno: int
    fields: Sequence[str] | dict[str, object]
    names: Sequence[str] | None = None  # a table's column names; None: no header
    # "file: line N" and "file:N", made once: every field of the row needs them.
    where: str = field(init=False)
    source: str = field(init=False)

    def __post_init__(self) -> None:
        self.where = f"{self.path}: line {self.lineno}"
        self.source = f"{self.path}:{self.lineno}"

    def name(self, key: Column) -> str:
        """The field's name in errors: a JSONL key, a header name, or "column 3"."""
        if isinstance(key, str):
            return key
        return self.names[key] if self.names is not None else f"column {key}"

    def value(self, key: Column, role: str = "") -> object:
        """The field's value; only a JSONL object can lack one (Table checked the rest)."""
        if isinstance(self.fields, dict) and key not in self.fields:
            raise DataError(
                f'{self.where}: field "{key}" ({role}) missing; the object has: '
                f"{', '.join(repr(k) for k in self.fields) or 'no keys'}"
            )
        return self.fields[key]  # type: ignore[index]

    def text(self, key: Column, role: str = "") -> str:
        return text_field(self.where, self.name(key), self.value(key, role))


@dataclass(frozen=True)
class Table:
    """A delimited file being read: its column names and its data rows (iterate them once).

    names are the header's fields, stripped; for a file without a header the names given,
    or None (columns by index only, "column 3" in errors). Every data row must have `width`
    fields; `what` says why, in the error when one does not.
    """

    path: Path
    names: Sequence[str] | None
    width: int
    what: str
    rows: Iterator[tuple[int, list[str]]]

    def column(self, column: Column, role: str) -> int:
        """The field index of `column` (a header name or an index); role names it in errors."""
        if isinstance(column, bool) or not isinstance(column, (str, int)):
            raise InputError(f"{role}: {column!r} must be a column name or a 0-based index")
        if isinstance(column, int):
            if not 0 <= column < self.width:
                raise DataError(
                    f"{self.path}: {role} index {column} is out of range "
                    f"(line 1 has {self.width} fields)"
                )
            return column
        if self.names is None:
            raise DataError(
                f'{self.path}: {role} "{column}" is a column name but the file is read without a '
                "header; give a 0-based column index instead"
            )
        if column not in self.names:
            problem = f'column "{column}" ({role}) missing from the header'
            raise header_error(self.path, self.names, problem)
        return self.names.index(column)

    def records(self) -> Iterator[Record]:
        """The data rows, each checked for its field count; a table without one is an error."""
        empty = True
        for lineno, fields in self.rows:
            if len(fields) != self.width:
                raise DataError(
                    f"{self.path}: line {lineno}: {len(fields)} fields, expected {self.width} "
                    f"({self.what}); a delimiter inside a text, or a missing column?"
                )
            empty = False
            yield Record(self.path, lineno, fields, self.names)
        if empty:
            raise DataError(f"{self.path}: no data rows after the header")


def open_table(
    path: str | os.PathLike[str],
    delimiter: str = "\t",
    quoting: bool = False,
    *,
    header: bool | Callable[[list[str]], bool] = True,
    names: Sequence[str] | None = None,
    what: str = "the column count of line 1",
) -> Table:
    """A delimited file's header and rows (split as iter_rows says); an empty file is an error.

    header says whether the first record is the header, or is a test of that record's fields
    that says so (CoLA's files come with and without one). A file without a header has the
    columns `names` when given, else as many as its first record; `what` says which, in the
    error for a row of another width.
    """
    path = Path(path)
    rows = iter_rows(path, delimiter, quoting)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path}: no rows (empty file)")
    if header(first[1]) if callable(header) else header:
        columns = [h.strip() for h in first[1]]
        return Table(path, columns, len(columns), "the header's column count", rows)
    width = len(first[1]) if names is None else len(names)
    return Table(path, names, width, what, itertools.chain([first], rows))


# --------------------------------------------------------------------------- fields


def text_field(where: str, field: str, value: object) -> str:
    """A non-empty string, else a DataError naming `where` (file: line N) and the field."""
    if not isinstance(value, str):
        raise DataError(f'{where}: field "{field}": expected a string, got {type(value).__name__}')
    if not value.strip():
        raise DataError(f'{where}: field "{field}": empty text')
    return value


def not_allowed(where: str, field: str, shown: str, labels: Sequence[str]) -> DataError:
    """The error for a label outside the task's set; `shown` is the label as quoted there."""
    return DataError(
        f'{where}: field "{field}": {shown} is not one of the allowed labels: {", ".join(labels)}'
    )


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
        raise not_allowed(where, field, f"label {label!r}", labels)
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
            raise not_allowed(where, field, f"label {name!r}", labels)
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


@dataclass(frozen=True)
class ExampleFields:
    """Where each part of an Example is in a Record: column indices in a table, keys in
    JSONL. One builder for read_examples' formats and read_glue, so all give the same errors.

    guid is guid_prefix + the id field's value, or "<file stem>-<row number from 0>".
    """

    text: Column
    pair: Column | None
    label: Column | None
    flags: Sequence[Column]  # one 0/1 column per label (multi-label), instead of `label`
    id: Column | None
    guid_prefix: str = ""  # GLUE's guids are "<file stem>-<index>"

    def example(
        self,
        row: Record,
        n: int,
        labels: Sequence[str] | None = None,
        regression: bool = False,
        multi_label: bool = False,
    ) -> Example:
        """The example of the file's n-th row (from 0; the default guid)."""
        text = row.text(self.text, "text_column")
        pair = None if self.pair is None else row.text(self.pair, "text_pair_column")
        label: str | float | tuple[str, ...] | None = None
        if self.flags:
            values = [row.value(k, "label_column") for k in self.flags]
            label = flag_fields(row.where, [row.name(k) for k in self.flags], values)
        elif self.label is not None:
            name, value = row.name(self.label), row.value(self.label, "label_column")
            label = (
                multi_label_field(row.where, name, value, labels)
                if multi_label
                else label_field(row.where, name, value, labels, regression)
            )
        if self.id is None:
            guid = f"{row.path.stem}-{n}"
        else:  # a table's id is trimmed like its labels; a JSON value is taken as written
            value = row.value(self.id, "id_column")
            guid = str(value) if isinstance(row.fields, dict) else str(value).strip()
            guid = self.guid_prefix + guid
        return Example(text, pair, label, guid, row.source)


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
    # One label column unless a list of flag columns; an empty list is refused as a column.
    single = None if flags else cast("Column | None", label_column)
    fields = ExampleFields(text_column, text_pair_column, single, flags or [], id_column)
    rows: Iterator[Record]
    if fmt == "jsonl":
        _check_jsonl_columns(fields, label_column)
        rows = jsonl_records(path)
    else:
        delim = delimiter if delimiter is not None else ("," if fmt == "csv" else "\t")
        quote = quoting if quoting is not None else fmt == "csv"
        table = open_table(path, delim, quote, header=header)
        fields = _table_fields(table, fields)
        rows = table.records()
    return [fields.example(row, n, labels, regression, multi_label) for n, row in enumerate(rows)]


def _check_jsonl_columns(fields: ExampleFields, label_column: object) -> None:
    """JSONL columns are keys: each given column a string (label_column as given, when it
    is not a list of flag columns: an empty list is refused here)."""
    for role, c in (
        ("text_column", fields.text),
        *(("label_column", f) for f in fields.flags or [label_column]),
        ("text_pair_column", fields.pair),
        ("id_column", fields.id),
    ):
        if c is not None and not isinstance(c, str):
            raise InputError(f"{role}: {c!r}: JSONL columns are key names (strings)")


def _table_fields(table: Table, columns: ExampleFields) -> ExampleFields:
    """The columns (names or indices) as the table's field indices, each checked against it."""

    def col(c: Column | None, role: str) -> int | None:
        return None if c is None else table.column(c, role)

    text_i = table.column(columns.text, "text_column")
    pair_i = col(columns.pair, "text_pair_column")
    label_i = col(columns.label, "label_column")
    flag_i = [table.column(c, "label_column") for c in columns.flags]
    return ExampleFields(text_i, pair_i, label_i, flag_i, col(columns.id, "id_column"))


def jsonl_records(path: Path) -> Iterator[Record]:
    """A Record per non-blank line of a JSONL file, each an object; an empty file is an error."""
    empty = True
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        obj = json_object(line, f"{path}: line {lineno}")
        empty = False
        yield Record(path, lineno, obj)
    if empty:
        raise DataError(f"{path}: no rows (empty file)")


def json_object(line: str, where: str) -> dict[str, Any]:
    """One JSONL line's object; a line that is not one is a DataError led by `where` (the file
    and line). The one parser of JSONL lines that task files and the CLI's inputs share."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


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
