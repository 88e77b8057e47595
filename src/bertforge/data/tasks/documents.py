"""Documents to summarise: `SummaryExample`s (a text, its sentences with their character spans,
and a reference summary when there is one), from JSONL or from Wikipedia's own summaries.

Formats, told apart per file:
    jsonl   one document per line: {"text": "...", "summary": "..."?}; paragraphs of the text
            separated by newlines. "summary" is needed to train or evaluate, not to summarise.
    wiki    WikiExtractor output (`<doc ...>` blocks: title, one paragraph a line, section
            headings as lines of their own ending in "."): the lead (the paragraphs before the
            first heading) is the summary of the body (every later paragraph, headings left
            out). An article whose body has fewer than MIN_BODY_SENTENCES sentences, or whose
            lead is a single sentence, is left out and counted (`WikiCounts`).
A path may be a file, a directory (every file below it, sorted) or a glob pattern.

Sentences come from the splitter pre-training uses (data.corpus.split_sentences, sentencex),
paragraph by paragraph: a sentence never spans two paragraphs. Each keeps its character span in
the text, so a summary can point back into the document.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import DataError
from ...fileio import read_lines
from ..corpus import WikiArticle, detect_format, expand_inputs, split_sentences, wiki_articles
from .table import jsonl_records, text_field

# A Wikipedia article is a summarisation example when its body has at least this many
# sentences (a shorter one is hardly longer than its lead) and its lead more than one.
MIN_BODY_SENTENCES = 10
# WikiExtractor writes a section heading as a line of its own ending in "." ("History.",
# "Early life and career."). A line of at most this many words ending in "." with no other
# sentence end in it is read as one; longer headings are rare and read as a paragraph.
HEADING_WORDS = 5
_SENTENCE_END = re.compile(r"[.!?;:]\s")


@dataclass(frozen=True)
class SummaryExample:
    """A document: its text, its sentences and their [start, end) character spans in the text,
    the reference summary (None: unlabelled), and where it came from."""

    guid: str
    text: str
    sentences: list[str]
    spans: list[tuple[int, int]]
    summary: str | None = None
    source: str = ""


@dataclass
class WikiCounts:
    """What a Wikipedia reading kept and left out (and why)."""

    articles: int = 0
    kept: int = 0
    short_body: int = 0  # body under MIN_BODY_SENTENCES sentences
    one_sentence_lead: int = 0  # lead of one sentence (or none)
    files: list[str] = field(default_factory=list)

    def said(self, path: str | os.PathLike[str]) -> str:
        """What was kept and left out, in words ("" where no article was read)."""
        if not self.articles:
            return ""
        return (
            f"{path}: {self.articles:,} Wikipedia articles, {self.kept:,} kept; left out: "
            f"{self.short_body:,} with a body under {MIN_BODY_SENTENCES} sentences, "
            f"{self.one_sentence_lead:,} with a lead of one sentence"
        )


def document(
    text: str, guid: str = "", summary: str | None = None, source: str = ""
) -> SummaryExample:
    """A text as a SummaryExample: its paragraphs (lines) split into sentences, each with its
    character span in the text. An empty or blank text has no sentences."""
    sentences, spans = [], []
    start = 0
    for paragraph in text.splitlines(keepends=True):
        cursor = start
        for s in split_sentences(paragraph):
            # sentencex gives stripped pieces of the paragraph, in order: each is found after
            # the previous one (a piece it rewrote would be found nowhere: it takes the cursor)
            at = paragraph.find(s, cursor - start)
            begin = start + (at if at >= 0 else cursor - start)
            sentences.append(s)
            spans.append((begin, begin + len(s)))
            cursor = begin + len(s)
        start += len(paragraph)
    return SummaryExample(guid, text, sentences, spans, summary, source)


def is_heading(line: str) -> bool:
    """Whether a WikiExtractor paragraph line is a section heading (see HEADING_WORDS)."""
    line = line.strip()
    return (
        line.endswith(".")
        and len(line.split()) <= HEADING_WORDS
        and not _SENTENCE_END.search(line[:-1] + " ")
    )


def wiki_example(article: WikiArticle, counts: WikiCounts) -> SummaryExample | None:
    """An article as (body, lead as its summary), or None (counted) when it is left out."""
    counts.articles += 1
    lead: list[str] = []
    body: list[str] = []
    for p in article.paragraphs:
        if is_heading(p):
            body = body or [""]  # the first heading ends the lead (an empty marker, dropped)
        elif body:
            body.append(p)
        else:
            lead.append(p)
    lead_doc = document("\n".join(lead))
    doc = document(
        "\n".join(p for p in body if p),
        guid=f"{Path(article.source).name}:{article.title}",
        summary="\n".join(lead_doc.sentences),
        source=f"{article.source}:{article.line}",
    )
    if len(lead_doc.sentences) < 2:
        counts.one_sentence_lead += 1
        return None
    if len(doc.sentences) < MIN_BODY_SENTENCES:
        counts.short_body += 1
        return None
    counts.kept += 1
    return doc


def read_documents(
    path: str | os.PathLike[str], labelled: bool = True, counts: WikiCounts | None = None
) -> list[SummaryExample]:
    """Every document of the files at `path` (a file, a directory or a glob), in order; with
    labelled, each must have a summary (JSONL's "summary"; Wikipedia's lead)."""
    counts = counts if counts is not None else WikiCounts()
    out: list[SummaryExample] = []
    for file in expand_inputs([path]):
        if file.is_file() and file.stat().st_size == 0:
            raise DataError(f"{file}: empty file")
        fmt = detect_format(file)
        if fmt == "wiki":
            counts.files.append(str(file))
            for article in wiki_articles(str(file), read_lines(file)):
                example = wiki_example(article, counts)
                if example is not None:
                    out.append(example)
            continue
        if fmt != "jsonl":
            raise DataError(
                f'{file}: expected JSONL (.jsonl, one {{"text", "summary"}} object a line) or '
                "WikiExtractor output (<doc> blocks)"
            )
        for row in jsonl_records(file):
            text = text_field(row.where, "text", row.value("text", "the document"))
            summary = None
            if labelled:
                summary = text_field(row.where, "summary", row.value("summary", "its summary"))
                # a sentence a line, as Wikipedia's leads: ROUGE-Lsum's LCS is per sentence
                summary = "\n".join(document(summary).sentences)
            out.append(document(text, f"{file.name}:{row.lineno}", summary, row.source))
    return out
