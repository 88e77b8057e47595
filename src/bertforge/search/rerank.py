"""Reranking a first stage: each query's hits (Index.search's, with their texts) reordered by
a cross-encoder's score of (query, text), or that order fused with the first stage's
(`bertforge search --rerank`, `--rerank-fuse`).

    hits = index.search(queries, top_k=50, mode="hybrid", text=True)  # the first stage
    best = rerank("runs/ce", queries, hits, top_k=10)                  # [[{id, score, rank,
                                                                       #   first_stage_rank}]]

A first stage finds candidates cheaply from precomputed vectors; the cross-encoder reads each
query with each candidate and orders them better (README, "Search and rerank"). Fused
(`fusion`), its order is kept from throwing away what the first stage knew: by reciprocal
rank, or by the z-scores of the first stage's scores and the cross-encoder's raw ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, check_choice
from ..runner import progress_bar
from .fusion import FUSIONS, fuse_runs
from .options import QUERIES_AT_ONCE, FirstStage, SearchOptions

if TYPE_CHECKING:
    from ..pipelines import Pipeline
    from .index import Index


def rerank(
    cross_encoder: str | Path | Pipeline,
    queries: Sequence[str],
    results: Sequence[Sequence[dict[str, Any]]],
    top_k: int = SearchOptions.top_k,
    fusion: str | None = None,
    text: bool = False,
    progress: bool = False,
) -> list[list[dict[str, Any]]]:
    """Each query's first-stage hits (results[i] for queries[i]: Index.search with text=True,
    the texts being what the cross-encoder reads) reranked, its top_k: each hit as the first
    stage gave it, its "score" the cross-encoder's (with `fusion`: the fused one, the
    cross-encoder's as "rerank_score"), "rank" the new rank, "first_stage_rank" the old;
    "text" kept only with `text`. `cross_encoder`: a path or a loaded Pipeline. progress: a bar
    over the queries on stderr (runner.progress_bar)."""
    bar = progress_bar("rerank", len(queries), "queries") if progress else None
    try:
        ce = _cross_encoder(cross_encoder, fusion)
        return list(_reranked(ce, queries, results, top_k, fusion, text, bar))
    finally:
        if bar is not None:
            bar.close()


def _cross_encoder(cross_encoder: str | Path | Pipeline, fusion: str | None) -> Pipeline:
    from ..pipelines import Pipeline

    if fusion is not None:
        check_choice("fusion", fusion, FUSIONS, "--rerank-fuse")
    return cross_encoder if isinstance(cross_encoder, Pipeline) else Pipeline(cross_encoder)


def _reranked(
    ce: Pipeline,
    queries: Sequence[str],
    results: Sequence[Sequence[dict[str, Any]]],
    top_k: int,
    fusion: str | None,
    text: bool,
    bar: Any,
) -> Iterator[list[dict[str, Any]]]:
    """rerank's hits of each query in turn, `bar` (None: none) advanced by each."""
    if any("text" not in h for hits in results for h in hits):
        raise ConfigError("rerank reads each hit's text: search the first stage with text=True")
    for query, hits in zip(queries, results):
        order = reranked_order(ce, query, hits, top_k, fusion)
        if bar is not None:
            bar.update(1)
        yield reordered(hits, order, text)


def reordered(
    hits: Sequence[dict[str, Any]], order: Sequence[dict[str, Any]], text: bool
) -> list[dict[str, Any]]:
    """A query's first-stage hits in their new `order` (scored_order's): each hit as the first
    stage gave it, its "score" the order's (and its "rerank_score", fused), "rank" the new rank,
    "first_stage_rank" the old; "text" kept only with `text`."""
    out = [
        {
            **hits[o["index"]],
            **{k: o[k] for k in ("score", "rerank_score") if k in o},
            "rank": r,
            "first_stage_rank": o["index"] + 1,
        }
        for r, o in enumerate(order, 1)
    ]
    if not text:
        for h in out:
            h.pop("text")
    return out


def search_queries(
    index: Index,
    queries: Sequence[str],
    stage: FirstStage | None = None,
    options: SearchOptions | None = None,
    where: Mapping[str, str] | None = None,
) -> list[list[dict[str, Any]]]:
    """`bertforge search`: each query's top_k hits by the first stage (`stage`), or with
    options.rerank, the first stage's top rerank_depth reranked by that cross-encoder (with
    rerank_fuse: that order fused with the first stage's); each hit's text with options.text,
    its passage with options.passage; `where`: a PostgreSQL index's metadata filters."""
    return list(searched(index, queries, stage, options, where))


def searched(
    index: Index,
    queries: Sequence[str],
    stage: FirstStage | None = None,
    options: SearchOptions | None = None,
    where: Mapping[str, str] | None = None,
    progress: bool = False,
) -> Iterator[list[dict[str, Any]]]:
    """search_queries' hits of each query in turn, as they are ready (the first stage run
    QUERIES_AT_ONCE queries at a time, reranking a query at a time), so a caller can write
    each before the next is searched; progress: a bar over the queries on stderr."""
    stage, o = stage or FirstStage(), options or SearchOptions()
    depth = o.rerank_depth if o.rerank else o.top_k
    text = bool(o.rerank or o.text)
    bar = progress_bar("search", len(queries), "queries") if progress else None
    try:
        ce = _cross_encoder(o.rerank, o.rerank_fuse) if o.rerank else None
        for at in range(0, len(queries), QUERIES_AT_ONCE):
            part = queries[at : at + QUERIES_AT_ONCE]
            results = index.search(
                part, depth, stage.mode, text, stage.fusion, stage.alpha, o.passage, where
            )
            if ce is not None:
                yield from _reranked(ce, part, results, o.top_k, o.rerank_fuse, o.text, bar)
                continue
            if bar is not None:
                bar.update(len(part))
            yield from results
    finally:
        if bar is not None:
            bar.close()


def reads_raw(fusion: str | None) -> bool:
    """Whether reranking with `fusion` reads the cross-encoder's raw scores (its logits): zscore
    standardises them (an activation saturates, flattening the differences it would fuse)."""
    return fusion == "zscore"


def reranked_order(
    ce: Pipeline, query: str, hits: Sequence[dict[str, Any]], top_k: int, fusion: str | None
) -> list[dict[str, Any]]:
    """The hits' new order by the cross-encoder `ce` (scored_order) of (query, each hit's
    text)."""
    texts = [h["text"] for h in hits]
    scores = ce.score([query] * len(texts), texts, reads_raw(fusion))
    return scored_order(scores, hits, top_k, fusion, ce.activation)


def scored_order(
    scores: Sequence[float],
    hits: Sequence[dict[str, Any]],
    top_k: int,
    fusion: str | None,
    activation: str,
) -> list[dict[str, Any]]:
    """The hits' new order, [{index, score, rerank_score?}] (index: into hits, by first-stage
    rank), from a cross-encoder's `scores` of them (raw where reads_raw(fusion); `activation`:
    the cross-encoder's, which makes them its scores): by that score (ties: first-stage order),
    or that order fused with the first stage's (rrf), or the z-scores of both lists' scores
    fused with equal weights (zscore); with a fusion, rerank_score is the cross-encoder's score.
    The server's /search reranks with it too, from scores its batcher computed."""
    import numpy as np
    import torch

    from ..tasks.ranking import activate, ranked

    best = ranked(scores)
    if not fusion:
        return [{"index": i, "score": scores[i]} for i in best[:top_k]]
    by_ce = np.array([best])
    ordered = np.array([[scores[i] for i in best]], np.float64)
    first = (np.arange(len(hits))[None], np.array([[h["score"] for h in hits]]))
    (picked,), (fused,) = fuse_runs([first, (by_ce, ordered)], fusion, 0.5, top_k)
    if reads_raw(fusion):
        ordered = activate(torch.from_numpy(ordered), activation).numpy()
    ce_score = dict(zip(by_ce[0].tolist(), ordered[0].tolist()))
    return [
        {"index": int(i), "score": float(f), "rerank_score": ce_score[int(i)]}
        for i, f in zip(picked, fused)
    ]
