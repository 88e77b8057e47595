"""Reading a search corpus: (id, text) documents, each one to index (`bertforge index`), and
their metadata (the PostgreSQL backend keeps it, for `search --where field=value`).

The corpus is a text file (one document per line, its id the line number), JSONL objects with
an id and a text field, a CSV/TSV table with a header naming them (files are read by their
suffix), or a directory in BEIR's layout: its corpus.jsonl ({_id, title, text}; the text "title
text", data.tasks.beir). A document's metadata is its JSONL object's other fields, or its table row's other
columns (strings); a text line has none. JSONL objects and tables are read by the
training-data readers (data.tasks.table: jsonl_records, open_table), so a line is parsed and
its errors named one way everywhere.
Not data.corpus.read_corpus: that one reads pre-training text as documents of sentences.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError
from ..fileio import read_lines
from ..options import check_options, option


@dataclass(frozen=True)
class CorpusFormat:
    """Where a corpus file keeps its documents' ids and texts (JSONL fields, table columns),
    and whether a text file's blank lines are dropped (else each is an error)."""

    id_field: str = option("id", "JSONL field / table column of the id")
    text_field: str = option("text", "JSONL field / table column of the text")
    skip_blank: bool = option(False, "drop blank lines (default: error)")

    def __post_init__(self) -> None:
        check_options(self)


DEFAULT_FORMAT = CorpusFormat()  # "id" and "text", a blank line an error
Row = tuple[int, str, str, dict[str, Any]]  # line number, id, text, metadata


def read_search_corpus(
    path: str | Path, fmt: CorpusFormat = DEFAULT_FORMAT
) -> Iterator[tuple[str, str]]:
    """(id, text) of each document of a corpus file (see the module docstring); a malformed
    line, a missing or empty field, a blank line (unless skip_blank) or a repeated id is one
    DataError naming the file, line and field."""
    for doc_id, text, _ in read_search_records(path, fmt):
        yield doc_id, text


def read_search_records(
    path: str | Path, fmt: CorpusFormat = DEFAULT_FORMAT, refuse_nul: bool = False
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(id, text, metadata) of each document of a corpus file, checked as read_search_corpus
    checks them; metadata: a JSONL object's other fields, a table row's other columns. With
    `refuse_nul` (PostgreSQL's text and jsonb hold no NUL character), a NUL in the id, the
    text or a metadata field is one DataError naming the line and field, not a failed write."""
    path = Path(path)
    seen: dict[str, int] = {}
    readers = {".jsonl": _jsonl_documents, ".csv": _table_documents, ".tsv": _table_documents}
    if path.is_dir():
        rows = _beir_documents(path, fmt)
        path = corpus_file(path)
    else:
        rows = readers.get(path.suffix.lower(), _line_documents)(path, fmt)
    for lineno, doc_id, text, metadata in rows:
        if doc_id in seen:
            raise DataError(f"{path}: line {lineno}: id {doc_id!r} repeats line {seen[doc_id]}")
        seen[doc_id] = lineno
        fields = {fmt.id_field: doc_id, fmt.text_field: text, **metadata}
        if refuse_nul and _has_nul(fields):
            bad = next(k for k, v in fields.items() if _has_nul(k) or _has_nul(v))
            raise DataError(
                f'{path}: line {lineno}: field "{bad}": holds a NUL character (\\0), which '
                "PostgreSQL cannot store: remove it"
            )
        yield doc_id, text, metadata


def corpus_file(path: str | Path) -> Path:
    """The file that holds a corpus's documents: a BEIR set's corpus.jsonl (checked to be
    there), else `path` itself."""
    from ..data.tasks.beir import beir_root

    path = Path(path)
    return beir_root(path).corpus if path.is_dir() else path


def _beir_documents(path: Path, fmt: CorpusFormat) -> Iterator[Row]:
    from ..data.tasks.beir import beir_documents

    if (fmt.id_field, fmt.text_field) != (DEFAULT_FORMAT.id_field, DEFAULT_FORMAT.text_field):
        raise ConfigError(
            f"{path}: a BEIR set's fields are _id, title and text: leave out --id-field and "
            "--text-field"
        )
    return beir_documents(path)


def _has_nul(value: Any) -> bool:
    """Whether a JSON value holds a NUL character in any string (a key of an object too)."""
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_nul(v) for v in value)


def _line_documents(path: Path, fmt: CorpusFormat) -> Iterator[Row]:
    for lineno, line in read_lines(path, hint=""):
        if lineno == 1 and _json_document(line, fmt):
            raise DataError(
                f"{path}: line 1 is a JSON object with a {fmt.text_field!r} field: a JSONL corpus "
                "must end in .jsonl (files are read by their suffix; each line here would be a "
                "document's text)"
            )
        if not line.strip():
            if fmt.skip_blank:
                continue
            raise DataError(f"{path}: line {lineno}: blank line (--skip-blank drops blank lines)")
        yield lineno, str(lineno), line, {}


def _json_document(line: str, fmt: CorpusFormat) -> bool:
    """Whether a line is a JSON object with the corpus's text field (a JSONL line)."""
    if not line.lstrip().startswith("{"):
        return False
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and fmt.text_field in obj


def _jsonl_documents(path: Path, fmt: CorpusFormat) -> Iterator[Row]:
    """JSONL objects (a blank line holds no document: skipped; ids come from the objects)."""
    from ..data.tasks.table import jsonl_records

    for r in jsonl_records(path):
        fields: dict[str, Any] = r.fields  # type: ignore[assignment]
        doc_id = _id(fields.get(fmt.id_field), path, r.lineno, fmt.id_field)
        text = _text(fields.get(fmt.text_field), path, r.lineno, fmt.text_field)
        other = {k: v for k, v in fields.items() if k not in (fmt.id_field, fmt.text_field)}
        yield r.lineno, doc_id, text, other


def _table_documents(path: Path, fmt: CorpusFormat) -> Iterator[Row]:
    from ..data.tasks.table import header_error, open_table

    comma = path.suffix.lower() == ".csv"
    table = open_table(path, "," if comma else "\t", quoting=comma)
    names = list(table.names or [])
    for name in (fmt.id_field, fmt.text_field):
        if name not in names:
            raise header_error(path, names, f'column "{name}" missing from the header')
    i, t = names.index(fmt.id_field), names.index(fmt.text_field)
    for r in table.records():
        fields: Sequence[str] = r.fields  # type: ignore[assignment]
        doc_id = _id(fields[i], path, r.lineno, fmt.id_field)
        text = _text(fields[t], path, r.lineno, fmt.text_field)
        other = {n: v for j, (n, v) in enumerate(zip(names, fields)) if j not in (i, t)}
        yield r.lineno, doc_id, text, other


def _id(value: object, path: Path, lineno: int, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise DataError(f'{path}: line {lineno}: field "{name}": missing, or not a string/integer')
    return str(value)


def _text(value: object, path: Path, lineno: int, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataError(f'{path}: line {lineno}: field "{name}": missing, empty or not text')
    return value
