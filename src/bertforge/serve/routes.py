"""The endpoints, each added to the application by its add_* function: a served catalogue
entry's POST /<name>, the embedding endpoints (/embed, OpenAI's /v1/embeddings), the rerank
endpoints (text-embeddings-inference's /rerank, Cohere's and Jina's /v1/rerank, Cohere's
/v2/rerank), /search over an index, and GET /health, /metadata and /metrics. Each reads its
request body (schemas.py), asks the Server for its rows and shapes its answer."""

from __future__ import annotations

import asyncio
import base64
import math
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Request

from .. import embedding
from ..catalogue import ENTRIES, Entry
from ..errors import BertforgeError, ConfigError, UnavailableError
from ..model import BertModel
from ..tasks import ranking
from .access import note
from .errors import HTTPError
from .schemas import (
    CohereRerankRequest,
    CohereV2RerankRequest,
    EmbedRequest,
    OpenAIEmbeddingRequest,
    RerankRequest,
    SearchRequest,
    request_model,
)
from .server import RERANK_PATHS, Server

if TYPE_CHECKING:
    from ..search import PgOptions, SearchOptions

SEARCH_POOL = 4  # connections to a PostgreSQL index (the search batcher runs one call at a time)

# a request's vectors and the pieces the model read for them (its inputs, the field they came
# in, its options, the request) (embedder)
Vectors = Callable[[list[Any], str, dict[str, Any], Any], Awaitable[tuple[list, int]]]


def add_pipeline(app: Any, server: Server, entry: Entry) -> None:
    """POST /<entry.name>: the entry's request body in, {"results": [...]} out."""

    async def endpoint(req: Any, request: Any) -> dict[str, Any]:
        return {"results": await server.results(entry, req, request)}

    endpoint.__annotations__ = {
        "req": request_model(entry, server.defaults(entry)),
        "request": Request,
        "return": dict[str, Any],
    }
    app.post(f"/{entry.name}", summary=entry.help, name=entry.name)(endpoint)


def embedder(server: Server) -> Vectors:
    """The vectors of a request's inputs (what: the field a refusal names) from the batcher that
    /embed and /v1/embeddings share, and the pieces the model read for them (the prompt
    before each input included): the inputs and prompt checked, the prompt resolved into the
    batch's options, the dimensions checked (400) and applied to the request's own rows."""
    pipe = server.pipe

    async def vectors(
        inputs: list[Any], what: str, options: dict[str, Any], request: Any
    ) -> tuple[list, int]:
        server.check(inputs, what)
        if options.get("prompt") is not None:
            server.check([options["prompt"]], "prompt")
        own, options = pipe.embedding_settings, dict(options)
        prompt = embedding.prompt_text(own, options.pop("prompt_name"), options.pop("prompt"))
        dimensions, normalize = options.pop("dimensions"), options["normalize"]
        modes = 1 if options["pooling"] else len(own.pooling)
        try:
            embedding.check_dimensions(dimensions, pipe.config.hidden_size * modes)
        except ConfigError as e:
            raise HTTPError(400, str(e).replace(" (--dimensions)", ""), "dimensions") from None
        options["prompt"] = prompt
        rows, pieces = await server.submit("embed", run, inputs, options, request, read, what)
        normalized = own.normalize if normalize is None else normalize
        return list(embedding.shortened(np.stack(rows), dimensions, normalized)), pieces

    def run(items: list[Any], options: dict[str, Any]) -> list[Any]:
        return list(pipe.embed(items, **options))

    windows = server.windows_read(pipe, pipe.embedding_settings.max_length)

    def read(items: list[Any], options: dict[str, Any]) -> list[int]:
        """Pieces each input is read as, its prompt before it (a prompt adds to every text)."""
        prompt = options.get("prompt") or ""
        ids = pipe.tok.encode(prompt, add_special_tokens=False, truncation=False).ids
        prompted = [prompt + x if isinstance(x, str) else [*ids, *x] for x in items]
        return windows(prompted, options)

    return vectors


def add_embeddings(app: Any, server: Server) -> None:
    """POST /embed and POST /v1/embeddings (OpenAI's shape): one batcher for both. A request's
    prompt is part of its batch's options; its dimensions and output precision are applied to
    its own rows after the batch (embedding.shortened, embedding.quantize), so requests that
    differ only in those share model calls."""
    vectors = embedder(server)

    @app.post("/embed", summary=ENTRIES["embed"].help)
    async def embed(req: EmbedRequest, request: Request) -> dict[str, Any]:
        options = {"pooling": req.pooling, "normalize": req.normalize, "dimensions": req.dimensions}
        options |= {"prompt_name": req.prompt_name, "prompt": req.prompt}
        found, _ = await vectors(req.texts, "texts", options, request)
        rows = np.stack(found)
        return {"embeddings": server.quantized(rows, req.embedding_precision, options).tolist()}

    @app.post("/v1/embeddings", summary="OpenAI's embeddings API")
    async def openai_embeddings(req: OpenAIEmbeddingRequest, request: Request) -> dict[str, Any]:
        inputs: list[Any] = req.input if isinstance(req.input, list) else [req.input]
        if inputs and isinstance(inputs[0], int):  # one input given as piece ids
            inputs = [inputs]
        options = {"pooling": None, "normalize": None, "dimensions": req.dimensions}
        options |= {"prompt_name": None, "prompt": None}  # the model's default prompt, if any
        rows, used = await vectors(inputs, "input", options, request)
        as_base64 = req.encoding_format == "base64"
        return {
            "object": "list",
            "model": req.model or server.name,
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": base64.b64encode(r.astype("<f4").tobytes()).decode()
                    if as_base64
                    else r.tolist(),
                }
                for i, r in enumerate(rows)
            ],
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }


def add_rerank(app: Any, server: Server) -> None:
    """POST /rerank (text-embeddings-inference's shape), /v1/rerank (Cohere's v1 and Jina's)
    and /v2/rerank (Cohere's v2): the texts ordered by a cross-encoder's score for the query,
    one batcher for all three."""
    tei, v1, v2 = RERANK_PATHS

    @app.post(tei, summary=ENTRIES["rerank"].help)
    async def rerank(req: RerankRequest, request: Request) -> list[dict[str, Any]]:
        options = {"raw_scores": req.raw_scores, "truncate": req.truncate}
        scores, _ = await server.scores(req.query, req.texts, "texts", options, request)
        return [
            {"index": i, "score": scores[i], **({"text": req.texts[i]} if req.return_text else {})}
            for i in ranking.ranked(scores)
        ]

    @app.post(v1, summary="Cohere's (v1) and Jina's rerank API")
    async def cohere_rerank(req: CohereRerankRequest, request: Request) -> dict[str, Any]:
        texts = [d if isinstance(d, str) else d.text for d in req.documents]
        scores, used = await server.scores(req.query, texts, "documents", COHERE_OPTIONS, request)
        given = [{"text": d} if isinstance(d, str) else d.model_dump() for d in req.documents]
        return {
            **cohere_answer(scores, given, req.top_n, req.return_documents, "1"),
            "model": req.model or server.name,
            "usage": {"total_tokens": used},
        }

    @app.post(v2, summary="Cohere's v2 rerank API")
    async def cohere_v2_rerank(req: CohereV2RerankRequest, request: Request) -> dict[str, Any]:
        scores, _ = await server.scores(
            req.query, req.documents, "documents", COHERE_OPTIONS, request, req.max_tokens_per_doc
        )
        given = [{"text": d} for d in req.documents]
        return cohere_answer(scores, given, req.top_n, req.return_documents, "2")


# both Cohere endpoints: the model's activation and the pipeline's own rule for a document
# longer than the model reads; the same options, so their requests share model calls (and
# share them with /rerank's requests that keep its defaults)
COHERE_OPTIONS: dict[str, Any] = {"raw_scores": False, "truncate": False}


def cohere_answer(
    scores: list[float],
    documents: list[dict[str, Any]],
    top_n: int | None,
    return_documents: bool,
    version: str,
) -> dict[str, Any]:
    """Cohere's rerank answer: a uuid per answer, the top_n results best first (each with its
    document as it is to be answered, if asked), and its meta (a search unit is one query with
    up to 100 documents, as Cohere bills them)."""
    results = [
        {
            "index": i,
            "relevance_score": scores[i],
            **({"document": documents[i]} if return_documents else {}),
        }
        for i in ranking.ranked(scores)[:top_n]
    ]
    meta = {
        "api_version": {"version": version},
        "billed_units": {"search_units": math.ceil(len(documents) / 100)},
    }
    return {"id": str(uuid.uuid4()), "results": results, "meta": meta}


def add_search(
    app: Any,
    server: Server,
    path: str | Path,
    index_model: str | None = None,
    pg: PgOptions | None = None,
    rerank_model: str | Path | None = None,
) -> None:
    """POST /search: {"queries", "top_k"?, "mode"?: dense | bm25 | hybrid, "return_text"?,
    "return_passage"?, "where"?, "rerank"?} -> {"results": [[{id, score, rank, text?,
    passage?}]]} (each text and passage cut at return_chars, text_truncated /
    passage_truncated said), over the index (loaded now, so a broken index stops `serve` before
    it listens): a directory, or a PostgreSQL DSN (`pg`: its table and search settings;
    searched through a pool of connections; the database down or slow is a 503 until it is
    back). The served model embeds the queries, and must be the index's (its sha256 and
    precision): one model answers /embed and /search; an index of another model is refused
    unless `index_model` names it (checked to be the index's), which then embeds the queries
    beside the served model. With `rerank_model` (a cross-encoder: the served one loaded once,
    or another) a request's "rerank" reorders the first stage's hits as `bertforge search
    --rerank` does (reranked)."""
    from ..search.index import load_index

    index = load_index(path, pg, pool=SEARCH_POOL)
    app.state.index = index
    if index_model is not None:  # the index's model beside the served one, checked
        index.use_model(index_model, device=server.pipe.device.type)
    elif differs := index.adopt(server.pipe):
        raise ConfigError(
            f"{index.path}: built with the model {index.meta['model_name']}, not the one served "
            f"({server.name}: {'; '.join(differs)} differ): serve that model, or name the "
            "index's own with --index-model to search with it beside the served one"
        )
    if rerank_model is not None:
        server.use_reranker(rerank_model)
    server.endpoints.append("search")
    pipe = index.use_model()  # the queries are read as its embed reads them
    read = server.windows_read(pipe, pipe.embedding_settings.max_length)

    def run(items: list[Any], options: dict[str, Any]) -> list[Any]:
        try:
            return index.search(items, **options)
        except UnavailableError as e:  # the database down or slow: retry later
            raise HTTPError(503, str(e)) from None

    @app.post("/search", summary="search the index given with --index")
    async def search(req: SearchRequest, request: Request) -> dict[str, Any]:
        server.check(req.queries, "queries")
        o = search_options(req, server)
        check_text_hits(req, o, server.limits.max_text_hits)
        # a reranked search's first stage: its top rerank_depth, with the texts the
        # cross-encoder reads (search_queries' rule)
        options = {"top_k": o.rerank_depth if o.rerank else o.top_k, "mode": req.mode}
        options |= {"text": bool(o.rerank or o.text), "fusion": req.fusion}
        options |= {"alpha": req.alpha, "passage": o.passage}
        if req.where:  # metadata filters: a PostgreSQL index's (a directory's refuses, 422)
            options["where"] = req.where
        rows, pieces = await server.submit(
            "search", run, req.queries, options, request, read, "queries"
        )
        if o.rerank:
            rows = await reranked(server, req.queries, rows, o, request, pieces)
        asked = [k for k, on in (("text", o.text), ("passage", o.passage)) if on]
        return {"results": _cut(rows, asked, server.limits.return_chars)}


# search --rerank's options as /search names them, in SearchOptions' messages (longest first)
SEARCH_FIELDS = {
    "--rerank-depth": "rerank.depth",
    "--rerank-fuse": "rerank.fusion",
    "--rerank": "rerank",
    "--top-k": "top_k",
}


def search_options(req: SearchRequest, server: Server) -> SearchOptions:
    """A /search request's SearchOptions, checked by their rules (search/options.py, as the
    command line's are: a 422 naming the body's field), its rerank the server's cross-encoder:
    a request for one that the server has not is a 422 saying how to give it one."""
    from ..search import SearchOptions

    r = req.rerank
    if r is not None and server.reranker is None:
        raise HTTPError(
            422,
            "rerank: this server has no cross-encoder to rerank with: start it with "
            "--rerank-model CROSS_ENCODER",
            "rerank",
        )
    rerank = None if r is None or server.reranker is None else str(server.reranker.path)
    depth, fusion = (r.depth, r.fusion) if r is not None else (SearchOptions.rerank_depth, None)
    try:
        return SearchOptions(
            top_k=req.top_k,
            text=req.return_text,
            passage=req.return_passage,
            rerank=rerank,
            rerank_depth=depth,
            rerank_fuse=fusion,
        )
    except ConfigError as e:
        message = str(e)
        for flag, field in SEARCH_FIELDS.items():
            message = message.replace(flag, field)
        raise HTTPError(422, message, "rerank") from None


async def reranked(
    server: Server,
    queries: list[str],
    rows: list[list[dict[str, Any]]],
    o: SearchOptions,
    request: Any,
    spent: int,
) -> list[list[dict[str, Any]]]:
    """Each query's first-stage hits (with their texts) reranked as `bertforge search
    --rerank` reranks them (search.rerank's scored_order and reordered), from the server's
    cross-encoder's scores of (query, hit's text), computed in its batcher: the pairs' pieces,
    beside the `spent` pieces of the first stage, within max_request_tokens (else 413 naming
    rerank, before any model call). Each text is tokenised once, in a thread."""
    from ..search.rerank import reads_raw, reordered, scored_order

    pipe = server.reranker
    assert pipe is not None  # search_options refused a rerank without it
    texts = [h["text"] for hits in rows for h in hits]
    ids = await asyncio.to_thread(pipe.piece_ids, [*queries, *texts])
    documents = iter(ids[len(queries) :])
    items = [(ids[q], next(documents)) for q, hits in enumerate(rows) for _ in hits]
    options = {"raw_scores": reads_raw(o.rerank_fuse), "truncate": False}  # /rerank's default
    scores, _ = await server.pair_scores(pipe, items, options, request, "rerank", spent)
    note(request, texts=len(queries))  # the access log's texts: the queries, not the pairs
    out, start = [], 0
    for hits in rows:
        own, start = scores[start : start + len(hits)], start + len(hits)
        order = scored_order(own, hits, o.top_k, o.rerank_fuse, pipe.activation)
        out.append(reordered(hits, order, o.text))
    return out


def _cut(rows: list[list[dict[str, Any]]], keys: list[str], chars: int) -> list[Any]:
    """/search's hits with each of `keys` (text, passage) cut at `chars` and KEY_truncated
    saying whether it was: the answer stays bounded (a passage is a window's words, and one
    word, or a one-window document's whole text, can be any length)."""
    for hit in (h for row in rows for h in row):
        for key in keys:
            hit[f"{key}_truncated"] = len(hit[key]) > chars
            hit[key] = hit[key][:chars]
    return rows


def check_text_hits(req: SearchRequest, o: SearchOptions, limit: int) -> None:
    """A /search asking for texts or passages within max_text_hits hits (else 413, before any
    work): each hit's text is up to return_chars characters, so queries x top_k bounds the
    answer's size. A reranked one's first stage reads the text of queries x rerank depth hits
    for the cross-encoder: within the same limit."""
    asked = [name for name in ("return_text", "return_passage") if getattr(req, name)]
    hits = len(req.queries) * req.top_k
    if asked and hits > limit:
        raise HTTPError(
            413,
            f"queries x top_k: {len(req.queries)} x {req.top_k} = {hits:,} hits with "
            f"{' and '.join(asked)}, more than the limit of {limit:,} per request "
            "(max_text_hits): ask for fewer queries or a smaller top_k",
            "top_k",
        )
    read = len(req.queries) * o.rerank_depth
    if o.rerank and read > limit:
        raise HTTPError(
            413,
            f"queries x rerank.depth: {len(req.queries)} x {o.rerank_depth} = {read:,} hits the "
            f"cross-encoder reads, more than the limit of {limit:,} per request "
            "(max_text_hits): ask for fewer queries or a smaller depth",
            "rerank",
        )


def add_status(app: Any, server: Server) -> None:
    """GET (and HEAD) /health and /ready, GET /metadata (the model, its endpoints, precision,
    limits), /metrics. /health: the process answers (liveness: 200 while it runs, so an
    orchestrator restarts only a server that is stuck, not one whose database is down, which a
    restart would not bring back); /ready: it can answer every endpoint, the index's database
    included (readiness: 503 with the reason while /search would fail: take it out of the
    load balancer until it is back)."""
    from fastapi.responses import PlainTextResponse

    # HEAD beside GET, out of the schema: one route of two methods gives /openapi.json one
    # operation id twice (FastAPI warns on every request for it)
    @app.head("/health", include_in_schema=False)
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.head("/ready", include_in_schema=False)
    @app.get("/ready")
    def ready() -> dict[str, Any]:  # sync: FastAPI runs it in a thread, a database round trip
        index = getattr(app.state, "index", None)  # add_search's, when there is one
        try:
            if index is not None:
                index.ready()
        except BertforgeError as e:  # down, slow, or its table no longer this index
            raise HTTPError(503, str(e)) from None
        note = getattr(index, "update_note", None)  # an update of its table not ended
        return {"status": "ok", "index": note} if note else {"status": "ok"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        m = server.pipe.model(BertModel)
        return {
            "model": server.name,
            "endpoints": server.endpoints,
            "config": m.config.to_dict(),
            "precision": server.pipe.precision,
            "device": str(server.pipe.device),
            "limits": server.limits.__dict__,
            **({"rerank_model": server.reranker.path.name} if server.reranker else {}),
        }

    @app.get("/metrics")
    async def prometheus() -> Any:
        text = server.metrics.text()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
