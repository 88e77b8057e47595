"""Retrieval training files: (query, positive passage) pairs, optionally with hard negatives.

JSONL: one object per line, {"query": str, "positive": str, "negatives": [str, ...]} (negatives
optional), and for distillation "scores": a teacher's score of the positive and of each negative,
in that order (bertforge mine --teacher); "ranks": each passage's rank in the first stage that
mined it, the positive first, null for one below the depth mined (bertforge mine writes them; a
rerank dev file with them is scored in that order beside the reranker's); "group" (a string or integer: the document or topic the
row comes from) lets `--group-batches` fill each batch from one group; "positive_id" (a string or
integer) names the positive's document in a corpus, which `bertforge mine` then matches by id
rather than by text. A table (TSV, or CSV when
the file ends in .csv) with a header naming `query`, `positive`, any number of `negative...`
columns and optionally `group` and `positive_id`. Scored pairs (STS-B style, for CoSENT): {"text", "text_pair",
"score"} objects, or a table with those columns. Every row of a file has the same number of
negatives (a training row reads them side by side); an empty text or a score that is not a
number is an error naming the line.

A BEIR set (a directory, or DIR:SPLIT; data.tasks.beir) gives a split's relevant judgements as
(query, positive) pairs, the positive's id its corpus-id: DIR alone reads the split "train".
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import DataError
from .beir import beir_split, check_judged, is_beir, judged_documents, read_qrels, read_queries
from .table import Record, header_error, jsonl_records, open_table, text_field


@dataclass(frozen=True)
class RetrievalExample:
    query: str  # a scored pair's first text
    positive: str  # its second text
    negatives: tuple[str, ...] = ()
    source: str = ""  # file:line
    score: float | None = None  # a scored pair's similarity (CoSENT); None: a (query, positive)
    teacher: tuple[float, ...] = ()  # a teacher's scores of the positive and the negatives
    group: str | None = None  # the document or topic the row comes from (--group-batches)
    positive_id: str | None = None  # the positive's id in a corpus (bertforge mine matches it)
    ranks: tuple[int | None, ...] = ()  # the first stage's rank of the positive and negatives


PAIRS = ("query", "positive")
SCORED = ("text", "text_pair", "score")


def read_retrieval(path: str | os.PathLike[str]) -> list[RetrievalExample]:
    """The examples of a retrieval training or dev file, or of a BEIR set's split (see the
    module docstring)."""
    if is_beir(path):
        return beir_pairs(path)
    path = Path(path)
    if path.suffix == ".jsonl":
        records = list(jsonl_records(path))
        first = records[0].fields
        scored = "score" in first  # type: ignore[operator]
        examples = [_example(r, scored, None) for r in records]
    else:
        comma = path.suffix == ".csv"
        table = open_table(path, "," if comma else "\t", quoting=comma)
        names = list(table.names or [])
        scored = "score" in names
        need = SCORED if scored else PAIRS
        if any(n not in names for n in need):
            raise header_error(
                path,
                names,
                'a retrieval table needs "query" and "positive" columns (scored pairs: '
                '"text", "text_pair" and "score")',
            )
        columns: dict[str, Any] = {n: names.index(n) for n in need}
        columns["negatives"] = [i for i, n in enumerate(names) if n.startswith("negative")]
        for name in ("group", "positive_id"):
            columns[name] = names.index(name) if name in names else None
        examples = [_example(r, scored, columns) for r in table.records()]
    for e in examples[1:]:
        if bool(e.teacher) != bool(examples[0].teacher):
            scored, bare = (e, examples[0]) if e.teacher else (examples[0], e)
            raise DataError(
                f"{bare.source}: no teacher scores, but {scored.source} has them: every row of a "
                "file needs them or none"
            )
        if len(e.negatives) != len(examples[0].negatives):
            raise DataError(
                f"{e.source}: {len(e.negatives)} negatives, but {examples[0].source} has "
                f"{len(examples[0].negatives)}: every row of a file needs the same number"
            )
    return examples


def beir_pairs(spec: str | os.PathLike[str], default: str = "train") -> list[RetrievalExample]:
    """A BEIR split's (query, positive) pairs: one per judgement above 0, in the qrels file's
    order, the positive_id its corpus-id, the source its qrels line; a judgement of a query or
    document the set lacks is one error naming that line."""
    at = beir_split(spec, default)
    qrels = [q for q in read_qrels(at.qrels) if q.score > 0]
    if not qrels:
        raise DataError(f"{at.qrels}: no judgement above 0: no relevant pair to train on")
    queries = read_queries(at.queries)
    check_judged(qrels, at.qrels, queries, str(at.queries), query=True)
    texts = judged_documents(at, qrels)
    return [
        RetrievalExample(
            queries[q.query][0],
            texts[q.document],
            source=f"{at.qrels}:{q.lineno}",
            positive_id=q.document,
        )
        for q in qrels
    ]


def teacher_scores(examples: list[RetrievalExample], why: str) -> list[tuple[float, ...]]:
    """Each example's teacher scores (positive first), or one error: the option `why` learns a
    teacher's scores and the file's rows have none."""
    if examples and not examples[0].teacher:
        raise DataError(
            f"{examples[0].source}: {why} learns a teacher's scores, and the rows have no "
            '"scores" (add them: bertforge mine --teacher MODEL)'
        )
    return [e.teacher for e in examples]


def _example(r: Record, scored: bool, columns: dict[str, Any] | None) -> RetrievalExample:
    """One row: JSONL fields by name (columns None) or a table's by index."""

    def key(name: str) -> Any:
        return name if columns is None else columns[name]

    if scored:
        value = r.value(key("score"), "the pair's similarity")
        try:
            score = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            score = math.nan
        if isinstance(value, bool) or not math.isfinite(score):
            raise DataError(f'{r.where}: field "score": {value!r} is not a number')
        return RetrievalExample(r.text(key("text")), r.text(key("text_pair")), (), r.source, score)
    if columns is None:
        negatives = r.fields.get("negatives", [])  # type: ignore[union-attr]
        if not isinstance(negatives, list):
            raise DataError(f'{r.where}: field "negatives": expected a list of texts')
        texts = tuple(text_field(r.where, f"negatives[{i}]", n) for i, n in enumerate(negatives))
        teacher, ranks = _teacher(r, len(texts)), _ranks(r, len(texts))
        group, positive_id = (_name(r, field) for field in ("group", "positive_id"))
    else:
        texts, teacher, ranks = tuple(r.text(i) for i in columns["negatives"]), (), ()
        group = None if columns["group"] is None else r.text(columns["group"], "the row's group")
        at = columns["positive_id"]
        positive_id = None if at is None else r.text(at, "the positive's document id")
    return RetrievalExample(
        r.text(key("query"), "the query"),
        r.text(key("positive"), "a relevant passage"),
        texts,
        r.source,
        teacher=teacher,
        group=group,
        positive_id=positive_id,
        ranks=ranks,
    )


def _name(r: Record, field: str) -> str | None:
    """A JSONL row's optional name field (a group, a document id): a string or an integer."""
    value = r.fields.get(field)  # type: ignore[union-attr]
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
        raise DataError(f'{r.where}: field "{field}": expected a string or an integer')
    return None if value is None else str(value)


def _teacher(r: Record, negatives: int) -> tuple[float, ...]:
    """A JSONL row's teacher "scores": one number for the positive and one per negative."""
    value = r.fields.get("scores")  # type: ignore[union-attr]
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) != negatives + 1
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value
        )
    ):
        raise DataError(
            f'{r.where}: field "scores": expected {negatives + 1} numbers (the teacher\'s score '
            f"of the positive, then of each of its {negatives} negatives)"
        )
    return tuple(float(v) for v in value)


def _ranks(r: Record, negatives: int) -> tuple[int | None, ...]:
    """A JSONL row's first-stage "ranks": one per passage, the positive first, each a whole
    number from 1 or null (below the depth mined)."""
    value = r.fields.get("ranks")  # type: ignore[union-attr]
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) != negatives + 1
        or not all(v is None or (type(v) is int and v >= 1) for v in value)
    ):
        raise DataError(
            f'{r.where}: field "ranks": expected {negatives + 1} ranks (whole numbers from 1, '
            f"or null below the depth mined: the positive's in the first stage, then each of its "
            f"{negatives} negatives)"
        )
    return tuple(value)
