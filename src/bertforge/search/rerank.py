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

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, check_choice
from .fusion import FUSIONS, fuse_runs
from .options import FirstStage, SearchOptions

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
) -> list[list[dict[str, Any]]]:
    """Each query's first-stage hits (results[i] for queries[i]: Index.search with text=True,
    the texts being what the cross-encoder reads) reranked, its top_k: each hit as the first
    stage gave it, its "score" the cross-encoder's (with `fusion`: the fused one, the
    cross-encoder's as "rerank_score"), "rank" the new rank, "first_stage_rank" the old;
    "text" kept only with `text`. `cross_encoder`: a path or a loaded Pipeline."""
    from tqdm import tqdm

    from ..pipelines import Pipeline

    if fusion is not None:
        check_choice("fusion", fusion, FUSIONS, "--rerank-fuse")
    if any("text" not in h for hits in results for h in hits):
        raise ConfigError("rerank reads each hit's text: search the first stage with text=True")
    ce = cross_encoder if isinstance(cross_encoder, Pipeline) else Pipeline(cross_encoder)
    out = []
    ranked = zip(queries, results)
    for query, hits in tqdm(ranked, "rerank", len(queries), disable=None, file=sys.stderr):
        out.append(reordered(hits, reranked_order(ce, query, hits, top_k, fusion), text))
    return out


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
    stage, o = stage or FirstStage(), options or SearchOptions()
    depth = o.rerank_depth if o.rerank else o.top_k
    text = bool(o.rerank or o.text)
    results = index.search(
        queries, depth, stage.mode, text, stage.fusion, stage.alpha, o.passage, where
    )
    if o.rerank:
        results = rerank(o.rerank, queries, results, o.top_k, o.rerank_fuse, o.text)
    return results


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
