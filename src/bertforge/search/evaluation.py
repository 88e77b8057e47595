"""Search scored against relevance judgements (`bertforge search --qrels`): each judged query
searched, its ranking scored by evaluate.retrieval_scores (trec_eval's MRR@10, nDCG@10,
recall@k and MAP@100), the first stage's and, with a reranker, the reranked one's side by side.

    judged = Judged.from_beir("beir/scifact:test")            # or from_lines(texts, ids, ...)
    scores = score_search(index, judged, FirstStage(mode="hybrid"), SearchOptions(rerank="ce"))
    scores.first, scores.reranked                                # {"mrr@10": ..., ...}

Each query is searched SCORED_DEPTH (100) deep, or --top-k where that is deeper, so that
recall@100 means what it says; the reranked ranking is the first stage's top --rerank-depth
reordered, followed by the rest of the first stage's in its order (a reranker reorders a
prefix and leaves the rest in place), so recall@100 compares like with like. A ranking is scored
in the order the search gives it (its ranks), ties included; a judged query with no hits scores
0, as trec_eval -c counts it. A reranking that does not raise MRR@10 is warned about.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.tasks.beir import Qrel, beir_split, check_judged, judgements, read_qrels, read_queries
from ..errors import ConfigError
from ..evaluate import retrieval_scores
from .fusion import RERANK_FUSION
from .options import FirstStage, SearchOptions

if TYPE_CHECKING:
    from .index import Index

SCORED_DEPTH = 100  # hits per query scored (recall@100)
RECALL_AT = (1, 5, 10, 20, 100)
SHOWN = ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100")  # printed; JSON: all
SEARCH_BLOCK = 256  # queries searched at once: a progress step


@dataclass(frozen=True)
class Judged:
    """Queries to search (texts, their ids, their input lines) and the judgements that score
    them ({query id: {document id: score}}, read from `path`)."""

    texts: list[str]
    ids: list[str]
    lines: list[int]
    qrels: dict[str, dict[str, int]]
    rows: list[Qrel]
    path: Path

    @classmethod
    def from_beir(cls, spec: str) -> Judged:
        """A BEIR split's judged queries (DIR alone: the split "test"), in queries.jsonl's order;
        a judgement of a query the set lacks is an error naming its qrels line."""
        at = beir_split(spec, "test")
        rows = read_qrels(at.qrels)
        queries = read_queries(at.queries)
        check_judged(rows, at.qrels, queries, str(at.queries), query=True)
        qrels = judgements(rows)
        kept = [(q, t, n) for q, (t, n) in queries.items() if q in qrels]
        return cls([t for _, t, _ in kept], [q for q, _, _ in kept], [n for *_, n in kept],
                   qrels, rows, at.qrels)  # fmt: skip

    @classmethod
    def from_lines(
        cls, texts: Sequence[str], ids: Sequence[str], lines: Sequence[int], qrels_spec: str
    ) -> Judged:
        """Queries of a file (ids: a JSONL line's "id", else its line number) and the qrels
        file or BEIR split `qrels_spec` (DIR alone: "test"); a judged query not among them is an
        error naming its qrels line (it would score 0 unseen)."""
        from ..data.tasks.beir import is_beir

        path = beir_split(qrels_spec, "test").qrels if is_beir(qrels_spec) else Path(qrels_spec)
        rows = read_qrels(path)
        check_judged(rows, path, set(ids), "the queries", query=True)
        return cls(list(texts), list(ids), list(lines), judgements(rows), rows, path)

    def check_documents(self, known: Sequence[str] | None, where: str) -> None:
        """An error naming the first judgement of a document that `known` (the index's ids;
        None: not known here) does not hold."""
        if known is not None:
            check_judged(self.rows, self.path, set(known), where, query=False)


@dataclass
class SearchScores:
    """The first stage's scores, the reranked ones (None: no reranker), the queries scored,
    and each query's hits as the search gives them (top_k, reranked if asked)."""

    first: dict[str, float]
    reranked: dict[str, float] | None
    queries: int
    results: list[list[dict[str, Any]]]

    def report(self) -> dict[str, Any]:
        """What --metrics-out writes."""
        out: dict[str, Any] = {"queries": self.queries, "first_stage": self.first}
        if self.reranked is not None:
            out["reranked"] = self.reranked
        return out


def score_search(
    index: Index,
    judged: Judged,
    stage: FirstStage | None = None,
    options: SearchOptions | None = None,
    where: Mapping[str, str] | None = None,
) -> SearchScores:
    """`judged`'s queries searched by `stage` (and reranked by options.rerank) and scored (see
    the module docstring); a UserWarning when reranking does not raise MRR@10."""
    from .rerank import rerank

    stage, o = stage or FirstStage(), options or SearchOptions()
    depth = max(SCORED_DEPTH, o.top_k, o.rerank_depth if o.rerank else 0)
    text = bool(o.rerank or o.text)
    first = _searched(index, judged.texts, depth, stage, text, o.passage, where)
    scored = [q in judged.qrels for q in judged.ids]
    n = sum(any(r > 0 for r in judged.qrels[q].values()) for q, s in zip(judged.ids, scored) if s)
    first_scores = _scores(judged, first, scored)
    if not o.rerank:
        return SearchScores(first_scores, None, n, _cut(first, o.top_k, o.text))
    head = [hits[: o.rerank_depth] for hits in first]
    reordered = rerank(o.rerank, judged.texts, head, o.rerank_depth, o.rerank_fuse, text=True)
    whole = [r + hits[o.rerank_depth :] for r, hits in zip(reordered, first)]
    scores = _scores(judged, whole, scored)
    if scores["mrr@10"] <= first_scores["mrr@10"]:
        warnings.warn(
            f"reranking by {o.rerank} did not raise MRR@10 on {n:,} judged queries "
            f"({first_scores['mrr@10']:.4f} first stage, {scores['mrr@10']:.4f} reranked): "
            "search without --rerank, or fuse its order with the first stage's (--rerank-fuse "
            f"{RERANK_FUSION})",
            stacklevel=2,
        )
    return SearchScores(first_scores, scores, n, _cut(reordered, o.top_k, o.text))


def _searched(
    index: Index,
    queries: Sequence[str],
    depth: int,
    stage: FirstStage,
    text: bool,
    passage: bool,
    where: Mapping[str, str] | None,
) -> list[list[dict[str, Any]]]:
    """The first stage's hits of each query, SEARCH_BLOCK queries at a time (a progress step)."""
    from ..runner import progress_bar

    out: list[list[dict[str, Any]]] = []
    with progress_bar("search", len(queries), "queries") as bar:
        for start in range(0, len(queries), SEARCH_BLOCK):
            block = list(queries[start : start + SEARCH_BLOCK])
            found = index.search(
                block, depth, stage.mode, text, stage.fusion, stage.alpha, passage, where
            )
            out.extend(found)
            bar.update(len(block))
    return out


def _scores(
    judged: Judged, results: Sequence[Sequence[dict[str, Any]]], scored: Sequence[bool]
) -> dict[str, float]:
    """retrieval_scores of the judged queries' rankings, each in its search's order."""
    run = {
        q: {h["id"]: float(len(hits) - r) for r, h in enumerate(hits)}
        for q, hits, s in zip(judged.ids, results, scored)
        if s
    }
    if not any(scored):
        raise ConfigError(f"{judged.path}: none of the queries searched is judged there")
    return retrieval_scores(judged.qrels, run, recall_at=RECALL_AT)


def _cut(
    results: Sequence[Sequence[dict[str, Any]]], top_k: int, text: bool
) -> list[list[dict[str, Any]]]:
    """Each query's top_k hits, their texts left out unless asked for."""
    return [
        [{k: v for k, v in h.items() if text or k != "text"} for h in hits[:top_k]]
        for hits in results
    ]
