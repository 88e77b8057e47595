"""BEIR's layout of a retrieval set, the way BEIR, MTEB and sentence-transformers ship them:

    DIR/corpus.jsonl       {"_id", "title"?, "text", ...} a line: the documents
    DIR/queries.jsonl      {"_id", "text", ...} a line: the queries
    DIR/qrels/SPLIT.tsv    query-id<TAB>corpus-id<TAB>score after that header: the judgements
                           (an integer score, relevant when above 0; graded in nDCG)

A document's text is its title and its text joined by a space when the title is not empty,
as BEIR's and sentence-transformers' evaluators read them; its other fields (the title too)
are its metadata. A set is named by its directory, and a split by DIR:SPLIT (a directory
alone: the split its reader defaults to). One reader of the layout, read by `index` (the
corpus), `search --qrels` (queries and judgements), `mine` and `finetune` (a split's relevant
pairs, data.tasks.retrieval); every malformed line, an id repeated or a judgement of a query or
document the set does not have is one DataError naming the file, the line and the field.

squad_beir turns a SQuAD file into the layout: each paragraph a document, each question a query
judged relevant to its own paragraph, split by article (`bertforge beir`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DataError
from ...fileio import json_text
from .table import jsonl_records, open_table

CORPUS, QUERIES, QRELS = "corpus.jsonl", "queries.jsonl", "qrels"
QRELS_HEADER = ("query-id", "corpus-id", "score")
Document = tuple[int, str, str, dict[str, Any]]  # line number, id, text, metadata


@dataclass(frozen=True)
class Qrel:
    """One judgement, and the line of the qrels file it was read from."""

    lineno: int
    query: str
    document: str
    score: int


@dataclass(frozen=True)
class BeirSplit:
    """A split of a BEIR set: its directory and the name of its qrels file."""

    root: Path
    split: str

    @property
    def corpus(self) -> Path:
        return self.root / CORPUS

    @property
    def queries(self) -> Path:
        return self.root / QUERIES

    @property
    def qrels(self) -> Path:
        return self.root / QRELS / f"{self.split}.tsv"


def is_beir(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a BEIR set (a directory, or DIR:SPLIT) rather than a file."""
    text = str(path)
    head, colon, _ = text.rpartition(":")
    return Path(text).is_dir() or (bool(colon and head) and Path(head).is_dir())


def beir_split(spec: str | os.PathLike[str], default: str) -> BeirSplit:
    """The split DIR:SPLIT names (DIR alone: `default`), its files checked to be there; one
    DataError naming the file missing (and the splits that are there)."""
    text = str(spec)
    if Path(text).is_dir():
        root, split = Path(text), default
    else:
        head, _, split = text.rpartition(":")
        root = Path(head)
    found = beir_root(root)
    if not found.qrels.parent.is_dir():
        raise DataError(f"{root}: no {QRELS}/ directory of judgements (qrels/SPLIT.tsv)")
    at = BeirSplit(root, split)
    if not at.qrels.is_file():
        splits = sorted(p.stem for p in at.qrels.parent.glob("*.tsv"))
        raise DataError(
            f"{at.qrels}: no such split (the set has: {', '.join(splits) or 'none'}; name one "
            f"as {root}:SPLIT)"
        )
    if not at.queries.is_file():
        raise DataError(f"{at.queries}: missing: a BEIR set's queries ({{_id, text}} a line)")
    return at


def beir_root(root: str | os.PathLike[str]) -> BeirSplit:
    """The set in directory `root` (no split), its corpus file checked to be there."""
    at = BeirSplit(Path(root), "")
    if not at.corpus.is_file():
        raise DataError(
            f"{root}: a directory without {CORPUS}: not a BEIR set (corpus.jsonl, queries.jsonl, "
            "qrels/SPLIT.tsv)"
        )
    return at


def _id(value: object, where: str, field: str) -> str:
    """An id: a non-empty string, or an integer (read as its digits)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise DataError(f'{where}: field "{field}": missing, or not a string/integer')
    return str(value)


def _text(value: object, where: str, field: str, empty: bool = False) -> str:
    if value is None and empty:
        return ""
    if not isinstance(value, str) or not (empty or value.strip()):
        raise DataError(f'{where}: field "{field}": missing, empty or not text')
    return value


def beir_documents(root: str | os.PathLike[str]) -> Iterator[Document]:
    """(line, id, text, metadata) of each document of a set's corpus.jsonl: the text "title
    text" (the title left out when empty), the metadata every field but _id and text."""
    path = beir_root(root).corpus
    for r in jsonl_records(path):
        fields: dict[str, Any] = r.fields  # type: ignore[assignment]
        doc_id = _id(fields.get("_id"), r.where, "_id")
        title = _text(fields.get("title"), r.where, "title", empty=True)
        text = _text(fields.get("text"), r.where, "text", empty=bool(title.strip()))
        joined = f"{title} {text}".strip() if title.strip() else text
        yield (
            r.lineno,
            doc_id,
            joined,
            {k: v for k, v in fields.items() if k not in ("_id", "text")},
        )


def read_queries(path: str | os.PathLike[str]) -> dict[str, tuple[str, int]]:
    """{id: (text, line)} of a queries.jsonl; a repeated id is an error naming both lines."""
    out: dict[str, tuple[str, int]] = {}
    for r in jsonl_records(Path(path)):
        fields: dict[str, Any] = r.fields  # type: ignore[assignment]
        qid = _id(fields.get("_id"), r.where, "_id")
        if qid in out:
            raise DataError(f"{r.where}: query id {qid!r} repeats line {out[qid][1]}")
        out[qid] = (_text(fields.get("text"), r.where, "text"), r.lineno)
    return out


def read_qrels(path: str | os.PathLike[str]) -> list[Qrel]:
    """The judgements of a qrels TSV (BEIR's header, then query-id, corpus-id and an integer
    score a line); a judgement repeated is an error naming both lines."""
    table = open_table(path, "\t")
    if tuple(table.names or ()) != QRELS_HEADER:
        raise DataError(
            f"{path}: line 1: expected the header {chr(9).join(QRELS_HEADER)!r} (BEIR's qrels), "
            f"got {chr(9).join(table.names or ())!r}"
        )
    rows, seen = [], {}
    for r in table.records():
        query, document, score = (x.strip() for x in r.fields)
        for name, value in zip(QRELS_HEADER, (query, document)):
            if not value:
                raise DataError(f'{r.where}: field "{name}": empty')
        try:
            value = int(score)
        except ValueError:
            raise DataError(f'{r.where}: field "score": {score!r} is not an integer') from None
        if (query, document) in seen:
            raise DataError(
                f"{r.where}: query {query!r}, document {document!r} judged again (line "
                f"{seen[query, document]})"
            )
        seen[query, document] = r.lineno
        rows.append(Qrel(r.lineno, query, document, value))
    return rows


def judgements(qrels: Iterable[Qrel]) -> dict[str, dict[str, int]]:
    """{query: {document: score}}, as evaluate.retrieval_scores takes them."""
    out: dict[str, dict[str, int]] = {}
    for q in qrels:
        out.setdefault(q.query, {})[q.document] = q.score
    return out


def check_judged(
    qrels: Sequence[Qrel], path: Path, known: Container[str], what: str, query: bool
) -> None:
    """One DataError at the first judgement of a query (query=True) or a document that `known`
    (`what`: where those are read from) does not hold."""
    for q in qrels:
        name = q.query if query else q.document
        if name not in known:
            field = "query-id" if query else "corpus-id"
            raise DataError(f'{path}: line {q.lineno}: field "{field}": {name!r} is not in {what}')


def judged_documents(at: BeirSplit, qrels: Sequence[Qrel]) -> dict[str, str]:
    """{id: text} of the documents the relevant judgements name, read in one pass over the
    corpus (keeping only those); a judged id the corpus lacks is an error naming its line."""
    wanted = {q.document for q in qrels if q.score > 0}
    texts = {i: t for _, i, t, _ in beir_documents(at.root) if i in wanted}
    check_judged([q for q in qrels if q.score > 0], at.qrels, texts, str(at.corpus), False)
    return texts


# ------------------------------------------------------------------------------------------------
# SQuAD in BEIR's layout


@dataclass(frozen=True)
class BeirSet:
    """A whole set in memory, to be written: documents, queries, each split's judgements."""

    documents: list[dict[str, str]]  # {_id, title, text, ...}
    queries: list[dict[str, str]]  # {_id, text}
    qrels: dict[str, list[tuple[str, str, int]]]  # split: (query, document, score)


def squad_beir(path: str | os.PathLike[str], train_articles: int | None = None) -> BeirSet:
    """A SQuAD file as a retrieval set: each paragraph a document (id "p<N>", its article's
    title kept as the field "article", not prepended: SQuAD's questions are asked of the
    paragraph), each question a query judged relevant (1) to its paragraph; the questions of
    the first `train_articles` articles (default: half of them, rounded down) the split
    "train", the rest "test"."""
    from .squad import read_squad

    documents: list[dict[str, str]] = []
    queries: list[dict[str, str]] = []
    pairs: list[tuple[int, str, str]] = []  # article, question id, paragraph id
    articles: list[str] = []
    for e in read_squad(path, labelled=False):
        if not articles or e.title != articles[-1]:
            articles.append(e.title)
            documents.append({"_id": f"p{len(documents)}", "article": e.title, "text": e.context})
        elif e.context != documents[-1]["text"]:
            documents.append({"_id": f"p{len(documents)}", "article": e.title, "text": e.context})
        queries.append({"_id": e.qid, "text": e.question})
        pairs.append((len(articles) - 1, e.qid, documents[-1]["_id"]))
    cut = len(articles) // 2 if train_articles is None else train_articles
    if not 0 <= cut <= len(articles):
        raise ConfigError(
            f"train_articles={cut} (--train-articles): must be between 0 and the file's "
            f"{len(articles)} articles"
        )
    splits: dict[str, list[tuple[str, str, int]]] = {"train": [], "test": []}
    for article, qid, doc in pairs:
        splits["train" if article < cut else "test"].append((qid, doc, 1))
    return BeirSet(documents, queries, {k: v for k, v in splits.items() if v})


def write_beir(out: str | os.PathLike[str], data: BeirSet) -> None:
    """The set written in BEIR's layout into the new directory `out`, whole or not at all (in a
    directory beside it, renamed once complete); an `out` that holds anything is refused."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty directory; give a new one")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / QRELS).mkdir()
        _lines(tmp / CORPUS, (json_text(d) for d in data.documents))
        _lines(tmp / QUERIES, (json_text(q) for q in data.queries))
        for split, rows in data.qrels.items():
            body = ("\t".join(map(str, r)) for r in rows)
            _lines(tmp / QRELS / f"{split}.tsv", ["\t".join(QRELS_HEADER), *body])
        for p in (tmp, *tmp.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)  # mkdtemp's 0700 would hide it from others
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _lines(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
