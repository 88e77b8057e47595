"""CoNLL column files (CoNLL-2003 NER and the like): one `TaggedSentence` per sentence.

Format: one token per line as whitespace-separated columns (CoNLL-2003: `word POS chunk
NER`), a blank line between sentences, `-DOCSTART-` lines between documents (skipped; they
carry no tokens). The tag column is selectable (default: the last, CoNLL-2003's NER tags;
index 1 would give POS tags). Every token line must have the same number of columns as the
first one (or n_columns): a line that does not is a DataError naming file, line and field,
since a missing tag column would otherwise shift every tag of the file silently.

Tags are kept as written. The original CoNLL-2003 files use IOB1 (I- may start an entity,
B- only separates two adjacent entities of one type); many copies, including the one in
shared/data, use IOB2. `to_iob2` converts the former to the latter, and
`bertforge.evaluate.entity_scores` scores either the way conlleval does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import DataError, InputError
from ...fileio import text_lines

DOCSTART = "-DOCSTART-"


@dataclass(frozen=True)
class TaggedSentence:
    """Tokens and one tag per token; source is "file:line" of the first token."""

    tokens: list[str]
    tags: list[str]
    source: str

    def where(self, word: int) -> str:
        """ "file: line N" of the word at index `word`: a sentence's tokens are on consecutive
        lines, the first at `source`'s."""
        path, _, line = self.source.rpartition(":")
        return f"{path}: line {int(line) + word}"


@dataclass
class _Columns:
    """The column rule of one file: how many columns a token line has (n_columns, or as on
    the first token line) and which of them is the tag, checked line by line."""

    path: Path
    tag_column: int
    labels: Sequence[str] | None  # the allowed tags (None: any)
    expected: int | None
    first_line: int = 0  # the line that fixed `expected` (0: n_columns did)
    tag_i: int = 0  # tag_column from 0, once `expected` is known (0 is the token: not yet)
    allowed: set[str] | None = field(init=False)

    def __post_init__(self) -> None:
        self.allowed = None if self.labels is None else set(self.labels)

    def tag(self, fields: list[str], lineno: int) -> str:
        """The tag of a token line's `fields`, after checking its columns."""
        path, tag_column = self.path, self.tag_column
        if self.expected is None:
            self.expected, self.first_line = len(fields), lineno
            if self.expected < 2:
                raise DataError(
                    f"{path}: line {lineno}: 1 column; expected a token and at least one tag "
                    "column separated by whitespace"
                )
        expected = self.expected
        if self.tag_i == 0:
            if not -expected <= tag_column < expected or tag_column in (0, -expected):
                raise InputError(
                    f"tag_column {tag_column}: out of range for {expected} columns "
                    "(column 0 is the token)"
                )
            self.tag_i = tag_column % expected
        if len(fields) != expected:
            origin = f"as on line {self.first_line}" if self.first_line else "n_columns"
            raise DataError(
                f"{path}: line {lineno}: {len(fields)} columns, expected {expected} ({origin}); "
                f"field {'tag' if len(fields) < expected else 'token'} column missing or "
                "a token containing a space?"
            )
        tag = fields[self.tag_i]
        if self.allowed is not None and tag not in self.allowed:
            raise DataError(
                f'{path}: line {lineno}: field "tag" (column {self.tag_i}): {tag!r} is not one '
                f"of the allowed tags: {', '.join(self.labels or ())}"
            )
        return tag


def read_conll(
    path: str | os.PathLike[str],
    *,
    tag_column: int = -1,
    n_columns: int | None = None,
    labels: Sequence[str] | None = None,
    labelled: bool = True,
) -> list[TaggedSentence]:
    """Sentences of a CoNLL column file, in order.

    labelled=False reads only the tokens (column 0; a file of one token per line is fine) and
    leaves every sentence's tags empty: the input of `bertforge predict`.

    tag_column is an index into each line's columns (negative counts from the end); the
    token is column 0. n_columns None takes the count from the first token line. labels,
    when given, is the allowed tag set.
    """
    path = Path(path)
    if n_columns is not None and n_columns < 2:
        raise InputError(f"n_columns {n_columns}: must be at least 2 (a token and a tag)")
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = 0
    columns = _Columns(path, tag_column, labels, n_columns)

    def flush() -> None:
        nonlocal tokens, tags
        if tokens:
            sentences.append(TaggedSentence(tokens, tags, f"{path}:{start}"))
        tokens, tags = [], []

    for lineno, line in text_lines(path):
        fields = line.split()
        if not fields or fields[0] == DOCSTART:
            flush()
            continue
        if not tokens:
            start = lineno
        tokens.append(fields[0])  # a line that raises below ends the read: no need to undo
        if labelled:
            tags.append(columns.tag(fields, lineno))
    flush()
    if not sentences:
        raise DataError(f"{path}: no sentences found (empty file, or only -DOCSTART- lines)")
    return sentences


def to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 -> IOB2: an I-X that starts an entity (after O or another type) becomes B-X.

    IOB2 input comes back unchanged; entity spans are the same either way.
    """
    out: list[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            out.append("B-" + tag[2:])
        else:
            out.append(tag)
        prev = tag
    return out
