"""The input lines of the pipeline verbs and `search`, and the JSONL rows that answer them.

An input file is JSONL objects with the inputs' fields (a file ending in .jsonl) or lines of
text (several inputs: tab-separated); "-" is stdin, checked for UTF-8 as files are. Every line
is one input and every output row carries its input's line number (and its id, when a JSONL
input had one), so rows answer lines one to one. The catalogue says what each entry's inputs
are (`catalogue.Input`: the field, the column); this module is how a file of them is read and
answered, for the command line and for any Python caller with a file to run (the server reads
JSON request bodies instead).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .catalogue import Entry, Input
from .data.corpus import detect_format
from .data.tasks.documents import WikiCounts, read_documents
from .data.tasks.table import json_object
from .errors import DataError
from .fileio import Span, atomic_path, json_text, read_lines
from .runner import progress_bar

# Input lines run at a time where their rows are written as they come (JSONL): at most this many,
# fewer where their texts reach CHARS_AT_ONCE characters (a long document is a part alone).
# Large enough that the runner's batches are still cut from rows of similar lengths.
LINES_AT_ONCE = 1024
CHARS_AT_ONCE = 1 << 20


@dataclass
class InputLine:
    """One input of a pipeline command: its line number, its id (a JSONL line's "id"), texts."""

    line: int
    id: Any
    texts: tuple[str, ...]


def read_inputs(
    path: str,
    inputs: Sequence[Input],
    skip_blank: bool = False,
    keep_tabs: bool = False,
    unasked: Sequence[Input] = (),
    documents: bool = False,
    span: Span | None = None,
) -> list[InputLine]:
    """Inputs of a pipeline command, one per line: JSONL objects with the inputs' fields (file
    ends in .jsonl, in any case), or lines of text (several inputs: tab-separated); "-" reads
    stdin, checked for UTF-8 as files are. Every line is one input, so output rows answer input
    lines one to one: a blank line is an error unless skip_blank (then each output row's "line"
    says which line it answers); a tab in a single-text line is an error unless keep_tabs (a
    TSV line given without --pairs would otherwise be read as one text, its other columns
    included). unasked: optional inputs whose flag was not given (classify's --pairs): a JSONL
    line with one's field is an error, not a pair read as a single text. documents (a verb
    of one text, Entry.documents): WikiExtractor output, a file or a directory, is read as
    finetune --task summarize reads it (wiki_inputs). span: only that piece of the file
    (fileio.line_spans: embed --ray's workers each read one)."""
    if documents and path != "-" and (Path(path).is_dir() or detect_format(Path(path)) == "wiki"):
        return wiki_inputs(path)
    names = [i.field for i in inputs]
    where = "<stdin>" if path == "-" else path
    jsonl = where.lower().endswith(".jsonl")
    rows: list[InputLine] = []
    for lineno, line in read_lines(Path(path), hint="", span=span):
        at = f"{where}: line {lineno}"
        if not line.strip():
            if skip_blank:
                continue
            raise DataError(
                f"{at}: blank line: remove it, or pass --skip-blank to drop blank lines (each "
                "output row then carries its line number)"
            )
        if jsonl:
            rows.append(_json_input(line, at, lineno, names, unasked))
            continue
        parts = line.split("\t") if len(names) > 1 else [line]
        if len(parts) != len(names) or (len(names) == 1 and "\t" in line and not keep_tabs):
            pairs = f"TEXT<TAB>PAIR: --{unasked[0].param}; " if unasked else ""
            hint = f" ({pairs}a tab inside the text: --keep-tabs)"
            raise DataError(
                f"{at}: {line.count(chr(9)) + 1} tab-separated fields, expected {len(names)} "
                f"({', '.join(names)}){hint if len(names) == 1 else ''}"
            )
        rows.append(InputLine(lineno, None, tuple(parts)))
    return rows


def wiki_inputs(path: str) -> list[InputLine]:
    """The documents of WikiExtractor files (a file, or a directory of them) as
    data.tasks.documents.read_documents reads them to fine-tune a summarizer: an article's
    body is a document (its lead is that document's reference summary; an article too short
    to summarise is left out, the count said on stderr), its line its <doc>, its id
    FILE:TITLE."""
    counts = WikiCounts()
    found = read_documents(path, labelled=False, counts=counts)
    if counts.articles:
        print(counts.said(path), file=sys.stderr, flush=True)
    return [InputLine(int(d.source.rsplit(":", 1)[1]), d.guid, (d.text,)) for d in found]


def _json_input(
    line: str, at: str, lineno: int, names: Sequence[str], unasked: Sequence[Input]
) -> InputLine:
    """One JSONL input line: its fields `names` (text each), its id; a field of an input not
    asked for (`unasked`) is refused."""
    obj = json_object(line, at)
    missing = [n for n in names if not isinstance(obj.get(n), str)]
    if missing:
        raise DataError(f'{at}: field "{missing[0]}": missing or not text')
    for i in unasked:
        if i.field in obj:
            raise DataError(
                f'{at}: field "{i.field}" is read with --{i.param}: pass --{i.param}, or remove '
                "the field (without it each line is one text)"
            )
    return InputLine(lineno, obj.get("id"), tuple(obj[n] for n in names))


def columns(rows: Sequence[InputLine], inputs: Sequence[Input]) -> dict[str, list[str]]:
    """The inputs' texts by the method's parameter ("texts", "pairs"), one column each."""
    return {i.param: [r.texts[k] for r in rows] for k, i in enumerate(inputs)}


def parts(texts: dict[str, list[str]]) -> Iterator[range]:
    """The input lines' indices in the parts they are run in, in order (LINES_AT_ONCE); no
    lines, one empty part (the pipeline still checks its options, as for any input)."""
    n = len(next(iter(texts.values()), []))
    if n == 0:
        yield range(0)
        return
    start, size = 0, 0
    for i in range(n):
        size += sum(len(column[i]) for column in texts.values())
        if i + 1 - start == LINES_AT_ONCE or size >= CHARS_AT_ONCE:
            yield range(start, i + 1)
            start, size = i + 1, 0
    if start < n:
        yield range(start, n)


def answers(
    entry: Entry, pipe: Any, texts: dict[str, list[str]], options: dict[str, Any], progress: bool
) -> Iterator[Any]:
    """The entry's results for the columns `texts`, one per input line, a part at a time
    (`parts`), so each part's rows are written before the next part is run; with progress, a
    bar over the inputs' characters (runner.progress_bar), which a single long document
    advances too (by its share of the rows run)."""
    size = [sum(map(len, line)) for line in zip(*texts.values())]
    bar = progress_bar(entry.name, sum(size), "characters", scale=True) if progress else None
    with pipe.runner.showing(bar):
        for part in parts(texts):
            some = {k: v[part.start : part.stop] for k, v in texts.items()}
            with pipe.runner.showing(None, units=sum(size[part.start : part.stop])):
                results = entry.run(pipe, some, options)
            yield from results


def write_jsonl(out: str | None, rows: Sequence[InputLine], items: Iterable[Any]) -> None:
    """Output rows, each after its input's line number (and id, if the JSONL input had one):
    to the file `out` (written atomically: a temporary file renamed once complete), or stdout
    when it is None, each row flushed as it comes (a reader of the pipe has it then). Row by
    row, as `items` gives them: a features file can be gigabytes."""

    def write(f: TextIO) -> int:
        n = 0
        for x, r in zip(items, rows):  # items first: a generator runs to its end (its bar closes)
            f.write(json_text({"line": r.line, **({"id": r.id} if r.id is not None else {}), **x}))
            f.write("\n")
            if out is None:
                f.flush()
            n += 1
        return n

    if out is None:
        write(sys.stdout)
        return
    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        n = write(f)
    print(f"wrote {n:,} lines to {out}", file=sys.stderr)


def write_results(
    entry: Entry,
    out: str | None,
    rows: Sequence[InputLine],
    texts: dict[str, list[str]],
    results: Any,
) -> None:
    """An entry's results for these input lines: its array file when `out` ends in one of
    entry.arrays (the rows that file's rows answer said on stderr when blank lines were
    skipped), else a JSONL row per input line (entry.row of its texts and its result)."""
    if out and entry.save and out.endswith(entry.arrays):
        entry.save(out, results)
        if rows and rows[-1].line != len(rows):
            kept = ", ".join(str(r.line) for r in rows[:10])
            more = ", ..." if len(rows) > 10 else ""
            print(f"its rows are input lines {kept}{more} (blank lines skipped)", file=sys.stderr)
        return
    items = (entry.row({k: v[n] for k, v in texts.items()}, r, n) for n, r in enumerate(results))
    write_jsonl(out, rows, items)
