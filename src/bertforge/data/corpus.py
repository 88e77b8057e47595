"""Reading pre-training text: documents made of sentences, from the formats people have.

Formats (`fmt`), detected per file when "auto":
    lines       Google's format: one sentence (or paragraph) per line, a blank line between
                documents. Each line is also run through the sentence splitter, so one
                paragraph per line works too.
    paragraphs  hard-wrapped prose (Project Gutenberg): blank lines separate paragraphs, the
                whole file is one document.
    wiki        WikiExtractor output: `<doc ...>` title, one paragraph per line, `</doc>`.
    jsonl       one JSON object per line with a "text" field: one document each.
Sentences come from sentencex (Wikimedia's offline, rule-based segmenter).

Everything is UTF-8. Bad input ends in one DataError naming the file and line: bytes that are
not UTF-8, a binary file, an empty file, a JSONL line that is not an object with a string
"text".
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..fileio import read_lines

FORMATS = ("auto", "lines", "paragraphs", "wiki", "jsonl")
FORMAT_HELP = {
    "lines": "one sentence or paragraph per line, a blank line between documents",
    "paragraphs": "hard-wrapped prose, the whole file one document; --format lines if each "
    "line is a sentence",
    "wiki": "WikiExtractor <doc> blocks, one document each",
    "jsonl": 'one document per line, its "text" field',
}
_TERMINAL = re.compile(r"[.!?:;\"'”’)\]]\s*$")


@dataclass
class Document:
    source: str  # file it came from
    line: int  # line where it starts (1-based)
    sentences: list[str]


def expand_inputs(items: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files from a list of files, directories (all files below, sorted) and glob patterns."""
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            out.extend(
                sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            )
        elif path.is_file():
            out.append(path)
        else:
            matches = sorted(glob.glob(str(item), recursive=True))
            files = [Path(m) for m in matches if Path(m).is_file()]
            if not files:
                raise DataError(f"{item}: no such file, directory or matching files")
            out.extend(files)
    return out


def split_sentences(paragraph: str, language: str = "en") -> list[str]:
    """Sentences of one paragraph (sentencex, rule-based, offline)."""
    from sentencex import segment

    return [s.strip() for s in segment(language, paragraph) if s.strip()]


def detect_format(path: Path) -> str:
    """jsonl by extension; wiki if it starts with <doc; hard-wrapped paragraphs if most lines
    end mid-sentence; else lines (Google's format)."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    with open(path, "rb") as f:
        head = f.read(65536).decode("utf-8", errors="replace").removeprefix("\ufeff")  # a BOM
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()][:400]
    if lines and lines[0].startswith("<doc"):
        return "wiki"
    if len(lines) >= 20 and sum(1 for ln in lines if _TERMINAL.search(ln)) < 0.4 * len(lines):
        return "paragraphs"
    return "lines"


def read_documents(
    path: Path,
    fmt: str = "auto",
    encoding_errors: str = "strict",
    on_bytes: Callable[[int], object] | None = None,
) -> Iterator[Document]:
    """Documents of one file, in order."""
    if fmt not in FORMATS:
        raise DataError(f"format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if path.is_file() and path.stat().st_size == 0:
        raise DataError(f"{path}: empty file")
    if fmt == "auto":
        fmt = detect_format(path)
    lines = read_lines(path, encoding_errors, on_bytes)
    reader = {"lines": _lines, "paragraphs": _paragraphs, "wiki": _wiki, "jsonl": _jsonl}[fmt]
    count = 0
    for doc in reader(str(path), lines):
        if doc.sentences:
            count += 1
            yield doc
    if count == 0:
        raise DataError(f"{path}: no text found (read as format {fmt!r})")


def read_corpus(
    files: Iterable[Path],
    fmt: str | Sequence[str] = "auto",
    encoding_errors: str = "strict",
    on_bytes: Callable[[int], object] | None = None,
) -> Iterator[Document]:
    """Documents of every file, in order; fmt is one format for all files or one per file
    (e.g. from detect_format, so a caller that already detected them does not read heads twice)."""
    files = list(files)
    formats = [fmt] * len(files) if isinstance(fmt, str) else list(fmt)
    if len(formats) != len(files):
        raise ValueError(f"{len(formats)} formats for {len(files)} files")
    for path, file_fmt in zip(files, formats):
        yield from read_documents(path, file_fmt, encoding_errors, on_bytes)


def corpus_sentences(
    files: Iterable[Path], fmt: str | Sequence[str] = "auto", encoding_errors: str = "strict"
) -> Iterator[str]:
    """Every sentence of the corpus, read as `prepare` reads it: the text a vocabulary is
    trained on, without JSONL's fields or WikiExtractor's markup."""
    for doc in read_corpus(files, fmt, encoding_errors):
        yield from doc.sentences


def _lines(source: str, lines: Iterator[tuple[int, str]]) -> Iterator[Document]:
    doc = Document(source, 1, [])
    for lineno, line in lines:
        if not line.strip():
            if doc.sentences:
                yield doc
            doc = Document(source, lineno + 1, [])
            continue
        doc.sentences.extend(split_sentences(line))
    yield doc


def _paragraphs(source: str, lines: Iterator[tuple[int, str]]) -> Iterator[Document]:
    doc = Document(source, 1, [])
    block: list[str] = []
    for _, line in lines:
        if line.strip():
            block.append(line.strip())
        elif block:
            doc.sentences.extend(split_sentences(" ".join(block)))
            block = []
    if block:
        doc.sentences.extend(split_sentences(" ".join(block)))
    yield doc


@dataclass
class WikiArticle:
    """One `<doc>` block of WikiExtractor's output: its title and its paragraph lines (section
    headings among them: WikiExtractor writes a heading as a line of its own ending in ".")."""

    source: str
    line: int  # line of its <doc ...>
    title: str
    paragraphs: list[str]


def wiki_articles(source: str, lines: Iterable[tuple[int, str]]) -> Iterator[WikiArticle]:
    """The articles of a WikiExtractor file's lines (the first non-empty line of a block is its
    title); one DataError naming the line for a block left open, nested or text outside one."""
    doc: WikiArticle | None = None
    title_pending = False
    for lineno, line in lines:
        if line.startswith("<doc "):
            if doc is not None:
                raise DataError(f"{source}: line {lineno}: <doc> inside a <doc> (missing </doc>?)")
            doc, title_pending = WikiArticle(source, lineno, "", []), True
        elif line.startswith("</doc>"):
            if doc is None:
                raise DataError(f"{source}: line {lineno}: </doc> without a <doc>")
            yield doc
            doc = None
        elif doc is None:
            if line.strip():
                raise DataError(f"{source}: line {lineno}: text outside <doc> ... </doc>")
        elif title_pending:
            title_pending = not line.strip()  # the first non-empty line is the title
            doc.title = line.strip()
        elif line.strip():
            doc.paragraphs.append(line.strip())
    if doc is not None:
        raise DataError(f"{source}: end of file inside a <doc> (missing </doc>)")


def _wiki(source: str, lines: Iterator[tuple[int, str]]) -> Iterator[Document]:
    for article in wiki_articles(source, lines):
        sentences = [s for p in article.paragraphs for s in split_sentences(p)]
        yield Document(source, article.line, sentences)


def _jsonl(source: str, lines: Iterator[tuple[int, str]]) -> Iterator[Document]:
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{source}: line {lineno}: invalid JSON: {e.msg} (column {e.colno})"
            ) from None
        if not isinstance(obj, dict) or "text" not in obj:
            raise DataError(
                f'{source}: line {lineno}: field "text" missing (expected {{"text": "..."}})'
            )
        text = obj["text"]
        if not isinstance(text, str):
            raise DataError(
                f'{source}: line {lineno}: field "text" must be a string, got {type(text).__name__}'
            )
        sentences = [s for para in text.splitlines() if para.strip() for s in split_sentences(para)]
        yield Document(source, lineno, sentences)
