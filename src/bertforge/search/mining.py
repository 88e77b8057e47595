"""Hard negatives mined from an index (`bertforge mine`): for each (query, positive) the
query's top candidates that are neither one of its positives nor a near-copy of one,
optionally scored by a teacher cross-encoder for distillation.

    found = mine(index, queries, positives, negatives=4, depth=50, mode="hybrid")
    groups = mined_groups(read_retrieval("train.jsonl"), found)  # or mine_examples(index, rows)
    score_groups(groups, "runs/ce", width=5)  # each group's "scores": the teacher's raw outputs

The positive's own document is found by its id where the row gives one, else by its text
(Unicode NFKC, case folded, spacing aside: a trailing space once made a query's own paragraph
its "hard negative"); a candidate whose word set is near_duplicate (Jaccard) like the
positive's is left out too. A query of several rows (several relevant passages) has all their
positives: none of them is a negative of any of its rows (as sentence-transformers'
mine_hard_negatives does), the rows grouped by the query's normalized text.

Memory is bounded by the rows, not the corpus: the documents are read once, in one pass, for
the positives' ids and texts (only those kept), and the queries are searched QUERIES_AT_ONCE at
a time, only their candidates' texts read (a PostgreSQL index's corpus need not fit in memory).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, DataError, check_choice
from ..runner import progress_bar
from .index import Index
from .options import MISSING, MODES, QUERIES_AT_ONCE, FirstStage, MineOptions

if TYPE_CHECKING:
    from ..data.tasks.retrieval import RetrievalExample
    from ..pipelines import Pipeline


@dataclass
class Mined:
    """What mine found: per row its negatives (None: fewer left than asked) and the document
    its positive is (None: not in the corpus); how the positives were found; candidates left
    out as near-duplicates of their positive."""

    negatives: list[list[str] | None]
    positives: list[int | None]
    by_id: int = 0
    by_text: int = 0
    near_duplicates: int = 0
    # per row kept: the first stage's rank of its positive (None: below depth), then of each
    # negative: the order a rerank dev file is scored in beside the reranker's
    ranks: list[list[int | None]] = field(default_factory=list)

    @property
    def missing(self) -> list[int]:
        """The rows whose positive is not a document of the corpus."""
        return [i for i, d in enumerate(self.positives) if d is None]


def normalized(text: str) -> str:
    """A text as mining compares texts: Unicode NFKC, case folded, whitespace runs as one
    space, no space at either end (a trailing or doubled space is the same text)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", normalized(text)))


def likeness(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two texts' word sets (1: the same words)."""
    return len(a & b) / len(a | b) if a or b else 1.0


def find_positives(
    index: Index,
    positives: Sequence[str],
    ids: Sequence[str | None] | None = None,
    sources: Sequence[str] | None = None,
) -> tuple[list[int | None], int, int]:
    """The document of each positive: by its id where `ids` gives one (an unknown id: not
    found), else by its normalized text (the first document with it); (documents, found by id,
    found by text). An id whose document's normalized text is not the row's positive is one
    DataError naming the rows (`sources`: each row's file:line): which of the two the row
    means is not known, and mining around the other would leave the trained positive free to
    be picked as a negative. The documents are read in one pass, only the positives' kept."""
    rows = ids if ids is not None else [None] * len(positives)
    want_ids = {str(i) for i in rows if i is not None}
    want_texts = {normalized(p) for p, i in zip(positives, rows) if i is None}
    by_id: dict[str, tuple[int, str]] = {}  # id: (document, its normalized text)
    by_text: dict[str, int] = {}
    for d, doc_id, t in index.documents():
        if doc_id in want_ids:
            by_id[doc_id] = (d, normalized(t))
        if want_texts and (key := normalized(t)) in want_texts:
            by_text.setdefault(key, d)
    found: list[int | None] = []
    n_id = n_text = 0
    disagree = []
    for i, (positive, doc_id) in enumerate(zip(positives, rows)):
        if doc_id is None:
            d = by_text.get(normalized(positive))
        else:
            d, text = by_id.get(str(doc_id), (None, None))
            if d is not None and text != normalized(positive):
                disagree.append(i)
        found.append(d)
        n_id += d is not None and doc_id is not None
        n_text += d is not None and doc_id is None
    if disagree:
        raise _not_its_document(disagree, rows, len(positives), index, sources)
    return found, n_id, n_text


def mine(
    index: Index,
    queries: Sequence[str],
    positives: Sequence[str],
    *,
    positive_ids: Sequence[str | None] | None = None,
    negatives: int = MineOptions.negatives,
    skip: int = MineOptions.skip,
    depth: int = MineOptions.depth,
    mode: str = FirstStage.mode,
    margin: float | None = MineOptions.margin,
    fusion: str = FirstStage.fusion,
    alpha: float = FirstStage.alpha,
    near_duplicate: float = MineOptions.near_duplicate,
    missing: str = MineOptions.missing,
    sources: Sequence[str] | None = None,
    progress: bool = False,
) -> Mined:
    """Hard negatives per (query, positive): the query's candidates at ranks skip+1..depth of
    `mode`'s search, leaving out the documents of its positives (the positives of every row of
    the same normalized query; found by id, else by normalized text: find_positives), any
    candidate whose words are `near_duplicate` or more like one of those positives' (likeness:
    a copy with other spacing or a small edit is no negative) and, with margin, any candidate
    scored above the row's positive's score minus margin (likely relevant though unlabelled);
    the first `negatives` left, or None where fewer are left. A positive not in the corpus is
    one DataError naming the rows (`sources`: each row's file:line) unless `missing` is "skip"
    (no negatives for the row) or "keep" (mined all the same, guarded by likeness alone); a
    positive_id naming a document whose text is not the row's positive is one always.
    progress: a bar over the queries on stderr (runner.progress_bar)."""
    _check_mining(negatives, skip, depth, mode, margin, near_duplicate, missing)
    found, n_id, n_text = find_positives(index, positives, positive_ids, sources)
    result = Mined([], found, n_id, n_text)
    theirs = _query_positives(queries, positives, found)
    if result.missing and (missing == "error" or margin is not None):
        by_id = positive_ids is not None
        raise _not_in_corpus(result.missing, len(positives), index, by_id, margin, sources)
    bar = progress_bar("mine", len(queries), "queries") if progress else None
    for at in range(0, len(queries), QUERIES_AT_ONCE):
        part = range(at, min(at + QUERIES_AT_ONCE, len(queries)))
        asked = [queries[q] for q in part]
        docs, scores = index.ranked(asked, depth, mode, fusion, alpha)
        floor = np.full(len(part), np.inf)
        if margin is not None:
            own = [found[q] for q in part]  # all found: --margin refuses rows not found
            floor = index.scores_of(asked, own, mode) - margin  # type: ignore[arg-type]
        texts = index.texts_of({d for row in docs[:, skip:].tolist() for d in row if d >= 0})
        words: dict[int, frozenset[str]] = {}  # each candidate document's, once
        for q, row_d, row_s, low in zip(part, docs, scores, floor):
            if found[q] is None and missing == "skip":
                result.negatives.append(None)
                continue
            candidates = zip(row_d[skip:].tolist(), row_s[skip:].tolist())
            group = theirs[normalized(queries[q])]
            kept, near = _kept(candidates, texts, words, group, low, negatives, near_duplicate)
            result.near_duplicates += near
            result.negatives.append([t for t, _ in kept] if len(kept) == negatives else None)
            if len(kept) == negatives:
                ranked = row_d.tolist()
                own = ranked.index(found[q]) + 1 if found[q] in ranked else None
                result.ranks.append([own, *(skip + 1 + at for _, at in kept)])
        if bar is not None:
            bar.update(len(part))
    if bar is not None:
        bar.close()
    return result


Positives = tuple[set[int], set[frozenset[str]]]  # a query's documents and word sets


def _query_positives(
    queries: Sequence[str], positives: Sequence[str], found: Sequence[int | None]
) -> dict[str, Positives]:
    """Each query's positives over all its rows (the rows grouped by the query's normalized
    text): their documents (those found) and their distinct word sets."""
    out: dict[str, Positives] = {}
    for query, positive, d in zip(queries, positives, found):
        docs, word_sets = out.setdefault(normalized(query), (set(), set()))
        if d is not None:
            docs.add(d)
        word_sets.add(_words(positive))
    return out


def _kept(
    candidates: Iterable[tuple[int, float]],
    texts: Mapping[int, str],
    words: dict[int, frozenset[str]],
    positives: Positives,
    floor: float,
    negatives: int,
    near_duplicate: float,
) -> tuple[list[tuple[str, int]], int]:
    """A query's first `negatives` candidates ((number, score), best first) that are none of
    its positives' documents, score below floor and are less than near_duplicate like each of
    its positives' words: their texts; and how many were left out as near-duplicates
    (`words`: each candidate's word set, filled as read), each text with its place among the
    candidates (from 0)."""
    (docs, own), kept, near = positives, [], 0
    for at, (d, s) in enumerate(candidates):
        if d < 0 or d in docs or s >= floor or len(kept) == negatives:
            continue
        if d not in words:
            words[d] = _words(texts[d])
        if max(likeness(words[d], w) for w in own) >= near_duplicate:
            near += 1
            continue
        kept.append((texts[d], at))
    return kept, near


def _not_in_corpus(
    lost: Sequence[int],
    total: int,
    index: Index,
    by_id: bool,
    margin: float | None,
    sources: Sequence[str] | None,
) -> DataError:
    """The error of positives that are not documents of the index (`lost`: their rows)."""
    where = [sources[i] if sources else f"row {i + 1}" for i in lost[:3]]
    why = (
        "--margin scores the positives in the index"
        if margin is not None
        else ("--missing skip or keep mines them anyway")
    )
    return DataError(
        f"{len(lost):,} of {total:,} positives are not documents of {index.path} "
        f"(by {'id' if by_id else 'text, spacing and case aside'}; "
        f"{', '.join(where)}{', ...' if len(lost) > 3 else ''}): mining could pick them as "
        f"negatives; {why}"
    )


def _not_its_document(
    rows: Sequence[int],
    ids: Sequence[str | None],
    total: int,
    index: Index,
    sources: Sequence[str] | None,
) -> DataError:
    """The error of positives whose positive_id names a document with another text (`rows`)."""
    where = [f"{sources[i] if sources else f'row {i + 1}'}: positive_id {ids[i]!r}" for i in rows]
    return DataError(
        f"{len(rows):,} of {total:,} positives are not the text of the document their "
        f"positive_id names in {index.path} (spacing and case aside; {', '.join(where[:3])}"
        f"{', ...' if len(rows) > 3 else ''}): fix the id or the text"
    )


def _check_mining(
    negatives: int,
    skip: int,
    depth: int,
    mode: str,
    margin: float | None,
    near_duplicate: float,
    missing: str,
) -> None:
    if negatives < 1 or skip < 0 or depth - skip < negatives:
        raise ConfigError(
            f"negatives={negatives}, skip={skip}, depth={depth}: need negatives >= 1, skip >= 0 "
            "and depth - skip >= negatives (--negatives, --skip, --depth: the candidates looked "
            "at must hold that many)"
        )
    check_choice("mode", mode, MODES, "--mode")
    check_choice("missing", missing, MISSING, "--missing")
    if margin is not None and mode == "hybrid":
        raise ConfigError("margin (--margin) compares scores: use it with --mode dense or bm25")
    if not 0.0 < near_duplicate <= 1.0:
        raise ConfigError(
            f"near_duplicate={near_duplicate} (--near-duplicate): must be in (0, 1] (1: only "
            "copies with other spacing or case)"
        )


def mine_examples(index: Index, examples: Sequence[RetrievalExample], **options: Any) -> Mined:
    """mine over retrieval training rows (data.tasks.read_retrieval): their queries and
    positives, matched by the positives' ids where any row gives one, each row's file:line
    named in errors; `options`: mine's."""
    given = any(e.positive_id is not None for e in examples)
    return mine(
        index,
        [e.query for e in examples],
        [e.positive for e in examples],
        positive_ids=[e.positive_id for e in examples] if given else None,
        sources=[e.source for e in examples],
        **options,
    )


def mine_groups(
    index: Index,
    examples: Sequence[RetrievalExample],
    options: MineOptions,
    stage: FirstStage,
    source: str | Path,
    progress: bool = False,
) -> tuple[list[dict[str, Any]], str]:
    """`bertforge mine`: the training groups of retrieval rows (read from `source`) that kept
    their negatives, scored by options.teacher if given, and what mining found, in words; no
    group kept is one DataError saying why. progress: bars over the queries and the groups
    scored."""
    o = options
    mined = {k: v for k, v in vars(o).items() if k != "teacher"}
    found = mine_examples(index, examples, **mined, **vars(stage), progress=progress)
    groups = mined_groups(examples, found)
    said = mining_report(found, examples, o.missing, o.negatives)
    if not groups:
        raise DataError(f"{source}: no row kept its {o.negatives} negatives; {said}")
    if o.teacher:
        score_groups(groups, o.teacher, o.negatives + 1, progress)
    return groups, said


def mined_groups(examples: Sequence[RetrievalExample], found: Mined) -> list[dict[str, Any]]:
    """The training groups of the rows that kept their negatives: {"query", "positive",
    "negatives", "ranks"} (ranks: Mined.ranks, what a rerank dev file is compared with), a
    row's "group" kept for --group-batches, its "positive_id" for the next mine."""
    kept = [(e, n) for e, n in zip(examples, found.negatives) if n is not None]
    ranks: list[Any] = found.ranks or [None] * len(kept)  # none: a Mined made by hand
    return [
        {"query": e.query, "positive": e.positive, "negatives": n}
        | ({} if r is None else {"ranks": r})
        | ({} if e.group is None else {"group": e.group})
        | ({} if e.positive_id is None else {"positive_id": e.positive_id})
        for (e, n), r in zip(kept, ranks)
    ]


def mining_report(
    found: Mined, examples: Sequence[RetrievalExample], missing: str, negatives: int
) -> str:
    """What mining found, in words: how the positives were matched, what was left out."""
    lost = found.missing
    skipped = set(lost) if missing == "skip" else set()  # no negatives asked for those
    short = [i for i, n in enumerate(found.negatives) if n is None and i not in skipped]
    parts = [f"positives found by id {found.by_id:,}, by text {found.by_text:,}"]
    if lost:
        first = ", ".join(examples[i].source for i in lost[:3]) + (", ..." if len(lost) > 3 else "")
        parts.append(f"{len(lost):,} not in the index ({missing}: {first})")
    parts.append(
        f"{found.near_duplicates:,} candidates left out as near-duplicates of their positive"
    )
    if short:
        first = examples[short[0]].source
        parts.append(f"{len(short):,} rows had fewer than {negatives} negatives left ({first})")
    return "; ".join(parts)


def score_groups(
    groups: list[dict[str, Any]], teacher: str | Path | Pipeline, width: int, progress: bool = False
) -> None:
    """Each group's "scores": the teacher cross-encoder's raw scores of (query, positive), then
    of each negative (`width`: 1 + the negatives of each group), computed a bounded number of
    groups at a time; what finetune --task rerank (margin-mse, listnet) or --task retrieval
    --teacher-weight learns from. `teacher`: a cross-encoder's path or loaded Pipeline.
    progress: a bar over the groups on stderr, moving as their pairs are scored."""
    from ..pipelines import Pipeline

    model, step = teacher if isinstance(teacher, Pipeline) else Pipeline(teacher), 1024
    bar = progress_bar("teacher", len(groups), "groups") if progress else None
    with model.runner.showing(bar):
        for at in range(0, len(groups), step):
            chunk = groups[at : at + step]
            queries = [k["query"] for k in chunk for _ in range(width)]
            texts = [t for k in chunk for t in (k["positive"], *k["negatives"])]
            with model.runner.showing(None, units=len(chunk)):
                scores = model.score(queries, texts, raw_scores=True)
            for i, k in enumerate(chunk):
                k["scores"] = scores[i * width : (i + 1) * width]
