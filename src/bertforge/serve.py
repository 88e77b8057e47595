"""`bertforge serve MODEL`: the pipelines over HTTP (FastAPI + uvicorn).

    POST /embed      {"texts": [...], "pooling"?, "normalize"?}  -> {"embeddings": [[...]]}
    POST /v1/embeddings  OpenAI's embeddings API: {"input": str | [str] | [int] | [[int]],
                     "model"?, "encoding_format"?: float | base64, "dimensions"?}
                     -> {"data": [...], "usage": ...}
    POST /<pipeline> the catalogue's served pipelines (catalogue.py): their inputs as lists and
                     their options -> {"results": [...]}, one result per input, e.g.
        /classify    {"texts": [...], "pairs"?: [...]}  -> [{label, score, scores}]
        /fill-mask   {"texts": [...], "top_k"?: 5}      -> [[[{token, id, score}]]]
        /ner         {"texts": [...]}                   -> [[{entity, text, start, end, score}]]
        /qa          {"questions", "contexts", "max_seq_length"?, ...} -> [{answer, score, ...}]
        /nsp         {"texts": [...], "pairs": [...]}   -> [P(IsNext)]
    POST /search     with --index DIR: {"queries", "top_k"?, "mode"?, "return_text"?,
                     "return_passage"?} -> {"results": [[{id, score, rank, text?,
                     text_truncated?, passage?}]]} (index.py); a document's text is cut at
                     return_chars characters (text_truncated says whether it was)
    POST /rerank     text-embeddings-inference's: {"query", "texts", "raw_scores"?, "return_text"?,
                     "truncate"?} -> [{index, score, text?}], best first (a cross-encoder)
    POST /v1/rerank  Cohere's (v1) and Jina's: {"query", "documents": [str | {"text"}], "top_n"?,
                     "return_documents"?, "model"?} -> {"id", "results": [{index,
                     relevance_score, document?}], "meta", "model", "usage"}
    POST /v2/rerank  Cohere's v2: {"query", "documents": [str], "top_n"?, "max_tokens_per_doc"?
                     (4096), "model"?} -> {"id", "results": [{index, relevance_score}], "meta":
                     {"api_version": {"version": "2"}, "billed_units": {"search_units"}}};
                     the three rerank endpoints share one batcher
    GET  /health, GET /metadata, GET /metrics (Prometheus text), GET /openapi.json (the API)

The model is fixed, loaded and checked at start-up: the encoder and every head its config.json
"architectures" claim, so a corrupt checkpoint stops `serve` before it listens, and nothing in
a request names a file. Only the pipelines it has the heads for are routes (and so in
/openapi.json); the path of one it lacks answers 404 saying which head is missing.

Work per request is bounded by what the model will read. A request's inputs are checked before
it joins a batch: then its pieces are counted as the model reads them (a long text, or a
(query, document) pair, read in windows costs every window's row, [CLS] and [SEP] included),
and a request over max_request_tokens answers 413 before any model work. The default, 65,536,
passes max_texts inputs of a full 512-piece row twice over, and refuses a /rerank of 64 texts
of 10,000 characters (about 245,000 pieces in windows: 57 s on 2 cores, which held every other
/rerank behind it when a request was one model call).

Concurrent requests are micro-batched, and a big request is answered in slices. Each endpoint
has a batcher whose worker makes its model calls one at a time, in a thread (the inference
runner: length-sorted, so a long text does not pad the short ones). A call takes slices of the
endpoint's waiting requests in turn (round robin; a new request goes before those in the last
call, so it need not wait for a big one's next slice): at most max_batch texts and
max_batch_tokens pieces as read (one input longer than that runs alone), after waiting at most
max_wait_ms for company. A request is answered with its own rows, in order, once all its slices
are in. So one that comes while a big one is answered waits for about one call, not the whole.
Measured (benchmarks/serve_load.py --mixed: 2 cores, all-MiniLM-L6-v2 as a cross-encoder, 20
clients of one-sentence requests beside the largest /rerank these limits admit, 17 texts of
10,000 characters): a one-text /rerank waits p99 0.84 s, against 9.8 s (the whole big one)
when a request was one call. max_batch_tokens is 4,096 there because a small request may wait
for two calls (the one running and the one it shares): p99 7.3 s with calls of 16,384 pieces
(four such texts, read in about 3,700 pieces each), 2.5 s with 8,192, 0.88 s with 4,096; raise
it on a GPU. The endpoints' workers run side by side, as two threads on the cores: making one
model call at a time for the whole server instead made the small /embed requests beside that
/rerank wait for its calls (p99 0.8 s against 0.3 s side by side; the big one took 11 s against
16.5 s).
A call that fails is run again one request's slice at a time, so a bad input fails only its own
request. A request whose client has gone leaves uncomputed, even half done.

With an API key (--api-key, or the environment's BERTFORGE_API_KEY) every request but GET
/health must send `Authorization: Bearer KEY`, else 401 (Auth). Each request is one line of
the access log on stderr (access_line: method, path, status, ms, texts, batch size; no body,
no header), unless --no-access-log.

Errors are answered, never re-raised (the connection stays usable), as JSON {"error": "..."};
on /v1/ as OpenAI's error object {"error": {"message", "type", "param", "code"}}, which its
client shows; on /v2/ as Cohere's {"id", "message"}. A body over max_body_bytes answers 413 as
it arrives, before it is parsed; texts per request and characters per text over their limits
413; a full queue 503; a body that is not JSON 400, one not sent as JSON (its Content-Type) 415;
one of the wrong shape, or an input the pipeline refuses (a BertforgeError), 422;
an unknown path 404, a wrong method 405; a client gone before its answer is counted as 499.
Anything else is a bug: 500 {"error": "internal error: <Type>"} and one line in the server's
log. No answer shows a path of the server's: the model is named by its directory's name.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hmac
import inspect
import itertools
import json
import logging
import math
import os
import time
import traceback
import typing
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:  # the serve extra; without it the module still imports (the CLI reads Limits' options)
    from fastapi import Request
    from pydantic import BaseModel, Field, create_model
except ImportError:  # create_app says what to install
    BaseModel, Field, create_model = object, lambda *a, **k: None, None  # type: ignore[all]
    Request = Any  # type: ignore[misc,assignment]

from . import embedding
from .catalogue import ENTRIES, Entry
from .checkpoint import architectures
from .config import BertConfig
from .data.tasks import SquadExample
from .embedding import POOLINGS
from .errors import BertforgeError, ConfigError, need_extra
from .hub import resolve
from .model import BertModel
from .options import check_options, option
from .pipelines import Pipeline
from .tasks import ranking
from .tasks.squad import featurize as squad_featurize

log = logging.getLogger(__name__)
access_log = logging.getLogger(f"{__name__}.access")  # one line per request (Guard); serve()
# sends it to stderr
_SERVE_EXTRA = "bertforge serve needs the serve extra: pip install 'bertforge[serve]'"


@dataclass
class Limits:
    """What one request and one model call may hold, and how requests wait."""

    max_texts: int = option(64, "texts per request (else 413)", min=1)
    max_chars: int = option(10_000, "characters per text (else 413)", min=1)
    max_request_tokens: int = option(
        65_536,
        "pieces per request as the model reads them: every window, [CLS] and [SEP] included "
        "(else 413)",
        min=1,
    )
    max_batch: int = option(64, "texts per model call", min=1)
    max_batch_tokens: int = option(  # measured: see the module docstring
        4_096,
        "pieces per model call as the model reads them (an input longer than that runs alone)",
        min=1,
    )
    max_wait_ms: float = option(5.0, "how long a batch waits for more requests", min=0)
    max_queue: int = option(1024, "requests waiting per endpoint (else 503)", min=1)
    # 16 MiB holds max_texts x max_chars twice over (QA's questions and contexts) even as
    # 6-byte \u escapes, and as many piece ids; raise it with those two limits
    max_body_bytes: int = option(
        16 * 2**20, "bytes per request body, counted as it arrives (else 413)", min=1
    )
    return_chars: int = option(
        10_000, "characters of a document's text in a /search answer (more: cut, flagged)", min=1
    )

    def __post_init__(self) -> None:
        check_options(self)


API_KEY_ENV = "BERTFORGE_API_KEY"


@dataclass
class Access:
    """Who may call the server, and the access log. The key is never logged, echoed or shown
    (not in /metadata, not in this object's repr, not in an error message); serve() reads it
    from the environment's BERTFORGE_API_KEY when none is given (create_app does not: an
    application made in a test or a library does not depend on the environment)."""

    api_key: str | None = option(
        None,
        f"the key every request but GET /health must send as 'Authorization: Bearer KEY' "
        f"(else 401); default: the environment's {API_KEY_ENV}, which, unlike this option, "
        "does not show in ps",
    )
    access_log: bool = option(
        True,
        "no line per request on stderr (method, path, status, ms, texts, batch size)",
        flag="--no-access-log",
    )

    def __post_init__(self) -> None:
        key = self.api_key
        where = f"api_key (--api-key or {API_KEY_ENV})"
        if key is not None and not isinstance(key, str):
            raise ConfigError(f"{where}: must be str")  # the value unshown: it is a secret
        # what an HTTP header carries and a client can type: visible ASCII, no spaces
        if key is not None and not (key and all("!" <= c <= "~" for c in key)):
            raise ConfigError(f"{where}: must be 1 or more visible ASCII characters (no spaces)")
        check_options(self)

    def __repr__(self) -> str:
        key = None if self.api_key is None else "***"
        return f"Access(api_key={key}, access_log={self.access_log})"


class EmbedRequest(BaseModel):  # pooling, normalize, prompt: the model's own unless given
    texts: list[str]
    pooling: str | None = Field(None, pattern=f"^({'|'.join(POOLINGS)})$")
    normalize: bool | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    dimensions: int | None = Field(None, strict=True)  # true is not 1
    embedding_precision: str = Field(
        "float32", pattern=f"^({'|'.join(embedding.EMBEDDING_PRECISIONS)})$"
    )


class OpenAIEmbeddingRequest(BaseModel):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: str = Field("float", pattern="^(float|base64)$")
    dimensions: int | None = Field(None, strict=True)  # true is not 1
    user: str | None = None


class RerankRequest(BaseModel):  # text-embeddings-inference's /rerank
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


class Document(BaseModel):
    text: str


class CohereRerankRequest(BaseModel):  # Cohere's and Jina's /v1/rerank
    query: str
    documents: list[str | Document]
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class CohereV2RerankRequest(BaseModel):  # Cohere's /v2/rerank: documents are strings
    query: str
    documents: list[str]
    model: str | None = None  # Cohere requires it; the server has one model
    top_n: int | None = Field(None, ge=1)
    max_tokens_per_doc: int = Field(4096, ge=1)  # Cohere's default
    return_documents: bool = False  # dropped from Cohere's v2 in 2025; older clients send it


class SearchRequest(BaseModel):  # POST /search, with --index
    queries: list[str]
    top_k: int = Field(10, ge=1, le=1000)
    mode: str = Field("dense", pattern="^(dense|bm25|hybrid)$")
    fusion: str = Field("rrf", pattern="^(rrf|zscore)$")
    alpha: float = Field(0.5, ge=0.0, le=1.0)
    return_text: bool = False
    return_passage: bool = False


def request_model(entry: Entry) -> type:
    """The request body of a catalogue entry: its inputs as lists of texts (an optional one may
    be left out) and its options with the Pipeline method's types and defaults."""
    method = getattr(Pipeline, entry.method)
    hints, params = typing.get_type_hints(method), inspect.signature(method).parameters
    fields: dict[str, Any] = {
        i.param: (list[str] | None, None) if i.optional else (list[str], ...) for i in entry.inputs
    }
    fields.update({name: (hints[name], params[name].default) for name in entry.options})
    name = "".join(part.title() for part in entry.name.split("-")) + "Request"
    return create_model(name, **fields)  # type: ignore[misc]


class HTTPError(Exception):
    """An answer other than 200: its status, its message and the request field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class BodyTooLarge(Exception):
    """Raised into the app by the body's receive once the body passes max_body_bytes."""


GONE = 499  # the client closed its connection before its answer (nginx's code)


def error_response(
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> Any:
    """The JSON answer of an error: {"error": message}; under /v1/ OpenAI's error object, the
    shape its client reads the message from (`code` its machine-readable code, e.g.
    "invalid_api_key"); under /v2/ Cohere's, {"id", "message"}."""
    from fastapi.responses import JSONResponse

    body: dict[str, Any] = {"error": message}
    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    elif path.startswith("/v2/"):
        body = {"id": str(uuid.uuid4()), "message": message}
    return JSONResponse(body, status_code=status, headers=headers)


def internal(where: str, e: BaseException) -> str:
    """A bug's answer ("internal error: <Type>"), logged here as one line: where it was raised."""
    frame = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {Path(frame[0].filename).name}:{frame[0].lineno})" if frame else ""
    log.error("%s: internal error: %s: %s%s", where, type(e).__name__, e, at)
    return f"internal error: {type(e).__name__}"


# pieces each input of a list is read as (every window's row, [CLS] and [SEP] included), given
# the request's options
Cost = Callable[[list[Any], dict[str, Any]], list[int]]


@dataclass(eq=False)
class Job:
    """A request in its endpoint's batcher: its items and the pieces each is read as, its
    options (requests with the same `key` share model calls), its rows as slices come back."""

    items: list[Any]
    costs: list[int]
    options: dict[str, Any]
    key: str
    future: asyncio.Future
    arrived: float  # the event loop's clock
    order: int  # arrival order in its batcher
    rows: list[Any]
    turn: float  # its place in the batcher's round (Batcher.take)
    taken: int = 0  # items handed to model calls so far

    @property
    def waiting(self) -> bool:
        """Items not yet handed to a model call, for a client still waiting for them."""
        return self.taken < len(self.items) and not self.future.done()


class Batcher:
    """One endpoint's requests and worker: (items, options) in, each request's own rows out,
    one model call at a time, each call slices of the waiting requests in turn (see `take`)."""

    def __init__(
        self,
        run: Callable[[list[Any], dict[str, Any]], list[Any]],
        limits: Limits,
        cost: Cost,
        metrics: Metrics,
    ) -> None:
        self.run, self.limits, self.cost, self.metrics = run, limits, cost, metrics
        self.jobs: list[Job] = []
        self.arrivals = itertools.count()
        self.calls = 0  # model calls made so far
        self.task: asyncio.Task | None = None  # its worker, in the event loop it started in
        self.wake: asyncio.Event | None = None  # set when a request comes

    @property
    def waiting(self) -> int:
        """Requests with items not yet handed to a model call."""
        return sum(j.waiting for j in self.jobs)

    async def submit(
        self,
        items: list[Any],
        options: dict[str, Any],
        gone: Callable[[], Awaitable[Any]] | None = None,
        field: str = "texts",
    ) -> list[Any]:
        """The rows of `items`, computed in slices that share model calls with other requests;
        413 before any model work if the items are read as more than max_request_tokens pieces
        (`field`: the request's field the message names); `gone` returns when the client has
        left: the request then leaves uncomputed (499), even half done."""
        if not items:
            return []
        # counted in a thread (it tokenizes): the event loop serves the other clients meanwhile
        costs = await asyncio.to_thread(self.cost, items, options)
        total, limit = sum(costs), self.limits.max_request_tokens
        if total > limit:
            raise HTTPError(
                413,
                f"{field}: read as {total:,} pieces (every window, [CLS] and [SEP] "
                f"included), more than the limit of {limit:,} per request (max_request_tokens)",
                field,
            )
        if self.waiting >= self.limits.max_queue:
            raise HTTPError(503, "server busy: the request queue is full; retry later")
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        key = json.dumps(options, sort_keys=True, default=repr)
        order, turn = next(self.arrivals), self.calls - 0.5  # before those in the last call
        job = Job(items, costs, options, key, future, loop.time(), order, [None] * len(items), turn)
        self.jobs.append(job)
        self._wake(loop)
        watch = asyncio.ensure_future(gone()) if gone else None
        try:
            if watch is not None:
                await asyncio.wait([future, watch], return_when=asyncio.FIRST_COMPLETED)
                # gone, unless the watch itself failed: that says nothing of the client
                if not future.done() and watch.exception() is None:
                    raise HTTPError(GONE, "the client closed the connection")
            return await future
        finally:  # answered, the client gone or this handler cancelled: no more slices of it
            future.cancel()
            if watch:
                watch.cancel()

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tell the worker a request has come (started in this event loop if need be)."""
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.wake = asyncio.Event()
            self.task = loop.create_task(self._work(self.wake))
        assert self.wake is not None
        self.wake.set()

    async def _work(self, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            delay = self.delay(loop.time())
            if delay is None or delay:  # none waits, or the first waits for company
                wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                continue
            slices = self.take()
            self.metrics.batch(sum(end - start for _, start, end in slices), self.waiting)
            try:
                await self.answer(slices)
            except Exception as e:  # a bug here must not stop the worker: a 500 each
                for job, _, _ in slices:
                    if not job.future.done():
                        job.future.set_exception(e)

    def delay(self, now: float) -> float | None:
        """Seconds before this endpoint's next model call should start (None: nothing waits):
        none once its waiting items fill a call or its oldest request has waited max_wait_ms."""
        self.jobs = [j for j in self.jobs if not j.future.done()]
        jobs, limits = [j for j in self.jobs if j.waiting], self.limits
        if not jobs:
            return None
        items = sum(len(j.items) - j.taken for j in jobs)
        pieces = sum(sum(j.costs[j.taken :]) for j in jobs)
        if items >= limits.max_batch or pieces >= limits.max_batch_tokens:
            return 0.0
        return max(0.0, min(j.arrived for j in jobs) + limits.max_wait_ms / 1000 - now)

    def take(self) -> list[tuple[Job, int, int]]:
        """The next model call's slices (request, start, end), the requests in turn (round
        robin: the one served least recently first; a new one before those in the last call,
        so it need not wait for a big one's next slice), each giving its next items while the
        call stays within max_batch items and max_batch_tokens pieces (its first item always:
        an input longer than that runs alone). Only requests with the options of the first
        share the call."""
        queue = sorted((j for j in self.jobs if j.waiting), key=lambda j: (j.turn, j.order))
        self.calls += 1
        limits, slices, n, pieces = self.limits, [], 0, 0
        for job in queue:
            if job.key != queue[0].key:
                continue
            start = end = job.taken
            while end < len(job.items) and n < limits.max_batch:
                if n and pieces + job.costs[end] > limits.max_batch_tokens:
                    break
                pieces, n, end = pieces + job.costs[end], n + 1, end + 1
            if end > start:
                slices.append((job, start, end))
                job.taken, job.turn = end, self.calls
        return slices

    async def answer(self, slices: list[tuple[Job, int, int]]) -> None:
        """One model call for the slices, each request given its own rows (answered once all
        its rows are in); if it fails, each slice runs alone, so that one bad input fails only
        its own request."""
        slices = [s for s in slices if not s[0].future.done()]  # clients gone meanwhile
        if not slices:
            return
        items = [x for job, start, end in slices for x in job.items[start:end]]
        loop = asyncio.get_running_loop()
        try:
            rows = await loop.run_in_executor(None, self.run, items, slices[0][0].options)
        except Exception as e:
            if len(slices) > 1:
                for s in slices:
                    await self.answer([s])
            elif not slices[0][0].future.done():
                slices[0][0].future.set_exception(e)
            return
        i = 0
        for job, start, end in slices:
            job.rows[start:end] = rows[i : i + end - start]
            i += end - start
            if end == len(job.items) and not job.future.done():
                job.future.set_result(job.rows)


class Metrics:
    """Counters and histograms for GET /metrics (Prometheus text format, version 0.0.4)."""

    LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
    BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, list[float]] = {}  # per endpoint: bucket counts, then sum
        self.batches: list[float] = [0.0] * (len(self.BATCH) + 2)
        self.queue_depth = 0

    @staticmethod
    def _observe(counts: list[float], buckets: tuple[float, ...], value: float) -> None:
        for k, edge in enumerate(buckets):
            counts[k] += value <= edge
        counts[-2] += 1  # +Inf (= count)
        counts[-1] += value  # sum

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1
        counts = self.latency.setdefault(endpoint, [0.0] * (len(self.LATENCY) + 2))
        self._observe(counts, self.LATENCY, seconds)

    def batch(self, texts: int, waiting: int) -> None:
        self._observe(self.batches, self.BATCH, texts)
        self.queue_depth = waiting

    def text(self) -> str:
        out = _header("requests_total", "counter", "HTTP requests by endpoint and status.")
        out += [
            f'bertforge_requests_total{{endpoint="{e}",status="{s}"}} {n}'
            for (e, s), n in sorted(self.requests.items())
        ]
        out += _header("request_seconds", "histogram", "Request latency.")
        for e, counts in sorted(self.latency.items()):
            out += _histogram("bertforge_request_seconds", f'endpoint="{e}",', self.LATENCY, counts)
        out += _header("batch_texts", "histogram", "Texts per model call.")
        out += _histogram("bertforge_batch_texts", "", self.BATCH, self.batches)
        out += _header("queue_depth", "gauge", "Requests waiting after the last batch was formed.")
        out.append(f"bertforge_queue_depth {self.queue_depth}")
        return "\n".join(out) + "\n"


def _header(name: str, kind: str, text: str) -> list[str]:
    """The HELP and TYPE lines of the metric bertforge_<name>."""
    return [f"# HELP bertforge_{name} {text}", f"# TYPE bertforge_{name} {kind}"]


def _histogram(
    name: str, labels: str, buckets: tuple[float, ...], counts: list[float]
) -> list[str]:
    lines = [
        f'{name}_bucket{{{labels}le="{edge:g}"}} {counts[k]:g}' for k, edge in enumerate(buckets)
    ]
    lines.append(f'{name}_bucket{{{labels}le="+Inf"}} {counts[-2]:g}')
    braces = f"{{{labels.rstrip(',')}}}" if labels else ""
    return [*lines, f"{name}_sum{braces} {counts[-1]:g}", f"{name}_count{braces} {counts[-2]:g}"]


def available(model: str | Path) -> list[str]:
    """The served pipelines this checkpoint supports (embed always; the rest by its head)."""
    found, labels = architectures(model), BertConfig.from_pretrained(resolve(model)).num_labels
    return [e.name for e in ENTRIES.values() if e.served and e.available(found, labels)]


class Server:
    """What the endpoints share: the pipeline, the limits, the metrics, one batcher per
    endpoint (and per set of inputs given), and the piece counts they batch by."""

    def __init__(self, model: str | Path, limits: Limits, pipeline_options: dict[str, Any]) -> None:
        self.model, self.limits, self.metrics = model, limits, Metrics()
        self.pipe = Pipeline(model, batch_size=limits.max_batch, **pipeline_options)
        self.endpoints = available(model)
        # what a request would load, loaded now: a corrupt checkpoint stops `serve` here with
        # its CheckpointError instead of answering every request with it
        for name in self.endpoints:
            self.pipe.model_for(name)
        self.width = self.pipe.config.hidden_size * len(self.pipe.embedding_settings.pooling)
        self.calibration: np.ndarray | None = None  # int8/uint8 embeddings' buckets (--calibration)
        self.name = Path(str(model)).resolve().name  # answers name the model, never its path
        given = (Path(str(model)).resolve(), self.pipe.path, self.pipe.path.resolve())
        self.paths = sorted({str(p) for p in given if p.is_absolute()}, key=len, reverse=True)
        self.batchers: dict[str, Batcher] = {}

    def quantized(self, rows: np.ndarray, precision: str, options: dict[str, Any]) -> np.ndarray:
        """A request's vectors at its embedding_precision (embedding.quantize, as
        sentence-transformers' quantize_embeddings); int8/uint8 buckets from the calibration
        embeddings the server was started with, cut as the request's vectors were (a request's
        own vectors would make each answer depend on the others in it)."""
        if precision not in ("int8", "uint8"):
            return embedding.quantize(rows, precision)
        own = self.pipe.embedding_settings
        other_pooling = options["pooling"] is not None and (options["pooling"],) != own.pooling
        if self.calibration is None or other_pooling:
            raise HTTPError(
                422,
                f"embedding_precision {precision} needs calibration embeddings of the model's "
                "own pooling: start serve with --calibration FILE.npy (bertforge embed MODEL "
                "CORPUS --out FILE.npy), or ask for binary or ubinary",
                "embedding_precision",
            )
        normalized = own.normalize if options["normalize"] is None else options["normalize"]
        cal = embedding.shortened(self.calibration, options["dimensions"], normalized)
        return embedding.quantize(rows, precision, calibration=cal)

    def scrub(self, message: str) -> str:
        """A pipeline's message for a client: the model's directory named, not its path."""
        for path in self.paths:  # longest first: a path's parent would leave its tail
            message = message.replace(path, self.name)
        return message

    def check(self, texts: list[Any], what: str = "texts") -> None:
        """An input list within the limits (else 422 / 413 naming the field and item), piece
        ids in the vocabulary: checked before the request joins a batch."""
        limits, vocab = self.limits, self.pipe.tok.vocab_size
        if not texts:
            raise HTTPError(422, f"{what}: empty list", what)
        if len(texts) > limits.max_texts:
            raise HTTPError(
                413,
                f"{what}: {len(texts)} items, more than the limit of "
                f"{limits.max_texts} per request",
                what,
            )
        for i, t in enumerate(texts):
            unit = "characters" if isinstance(t, str) else "piece ids"
            if len(t) > limits.max_chars:
                raise HTTPError(
                    413,
                    f"{what}[{i}]: {len(t):,} {unit}, more than the limit of {limits.max_chars:,}",
                    what,
                )
            if not isinstance(t, str) and not all(0 <= k < vocab for k in t):
                raise HTTPError(422, f"{what}[{i}]: piece ids must be in [0, {vocab})", what)

    def need(self, entry: Entry) -> None:
        if entry.name not in self.endpoints:
            raise HTTPError(404, self.absent(f"/{entry.name}") or entry.name)

    def absent(self, path: str) -> str | None:
        """Why this model does not serve a path the server can serve (the 404's message), or
        None for a path it never serves."""
        name = "rerank" if path in RERANK_PATHS else path.removeprefix("/")
        if name == "search" and name not in self.endpoints:
            return "search: start the server with --index DIR to search an index"
        entry = ENTRIES.get(name)
        if entry is None or not entry.served or name in self.endpoints:
            return None
        head = entry.architectures[0] + (f" of {entry.labels} label" if entry.labels else "")
        return f"{name}: this model has no {entry.needs} ({head})"

    def pieces(self, item: Any) -> int:
        """Pieces of one input with [CLS] and [SEP]: a text, piece ids, or a tuple of texts."""
        n = 2
        for part in item if isinstance(item, tuple) else (item,):
            if isinstance(part, str):
                encoded = self.pipe.tok.encode_batch(
                    [part], add_special_tokens=False, truncation=False
                )
                n += len(encoded[0])
            elif part is not None:
                n += len(part)
        return n

    def batcher(
        self, key: str, run: Callable[[list[Any], dict[str, Any]], list[Any]], cost: Cost
    ) -> Batcher:
        if key not in self.batchers:
            self.batchers[key] = Batcher(run, self.limits, cost, self.metrics)
        return self.batchers[key]

    async def submit(
        self,
        key: str,
        run: Callable[[list[Any], dict[str, Any]], list[Any]],
        items: list[Any],
        options: dict[str, Any],
        request: Any,
        cost: Cost,
        field: str,
    ) -> list[Any]:
        """The rows of a request's items from the batcher `key` (made with `run`, its items
        read as `cost` says), noting for the access log how many items it had and the model
        call's batch size they ran in (each row comes back from the worker beside that size);
        `field`: the request's field a 413 names."""

        def sized(batch: list[Any], o: dict[str, Any]) -> list[tuple[Any, int]]:
            return [(row, len(batch)) for row in run(batch, o)]

        note(request, texts=len(items))
        b = self.batcher(key, sized, cost)
        rows = await b.submit(items, options, functools.partial(client_gone, request), field)
        note(request, batch=max((n for _, n in rows), default=None))
        return [row for row, _ in rows]

    def clip(self, texts: list[str], pieces: int) -> list[str]:
        """Each text cut after its first `pieces` pieces (Cohere's max_tokens_per_doc): at the
        end of that piece's characters, so the cut text reads as those pieces again."""
        encoded = self.pipe.tok.encode_batch(texts, add_special_tokens=False, truncation=False)
        return [
            t if len(e.offsets) <= pieces else t[: e.offsets[pieces - 1][1]]
            for t, e in zip(texts, encoded)
        ]

    @staticmethod
    def windows_read(pipe: Pipeline, max_length: int | None = None) -> Cost:
        """Pieces each text (or list of piece ids) is read as: the rows of its windows, as
        `pipe` lays them out (Pipeline.windows: embed, classify, ner)."""

        def cost(items: list[Any], options: dict[str, Any]) -> list[int]:
            _, features, windows = pipe.windows(items, max_length)
            out = [0] * len(items)
            for w, n in zip(windows, features.lengths.tolist()):
                out[w.text] += n
            return out

        return cost

    def reading(self, entry: Entry, given: int) -> Cost:
        """How one of the catalogue's pipelines reads its inputs (of `given` columns): rerank
        and qa a long document or context in windows beside the query or question; fill-mask,
        nsp and classify's pairs one row each, cut to the model's length; the rest windows."""
        pipe = self.pipe

        def owned(owners: Any, lengths: Any, n: int) -> list[int]:
            out = [0] * n
            for k, length in zip(owners, lengths.tolist()):
                out[int(k)] += length
            return out

        def pairs(items: list[Any], options: dict[str, Any]) -> list[int]:
            queries, documents = [x[0] for x in items], [x[1] for x in items]
            features, owners = pipe.pair_rows(queries, documents, options.get("truncate"))
            return owned(owners, features.lengths, len(items))

        def squad(items: list[Any], options: dict[str, Any]) -> list[int]:
            examples = [SquadExample(str(i), q, c, [], False, "") for i, (q, c) in enumerate(items)]
            window = {k: options[k] for k in ("max_seq_length", "doc_stride")}
            features = squad_featurize(examples, pipe.tok, **window)
            return owned([w.example for w in features.meta], features.lengths, len(items))

        def cut(items: list[Any], options: dict[str, Any]) -> list[int]:
            columns = list(zip(*items))
            encoded = pipe.encode(list(columns[0]), list(columns[1]) if given > 1 else None)
            return [len(e.ids) for e in encoded]

        if entry.name == "rerank":
            return pairs
        if entry.name == "qa":
            return squad
        if given > 1 or entry.name == "fill-mask":
            return cut
        windows = self.windows_read(pipe)
        return lambda items, options: windows([x[0] for x in items], options)

    async def results(self, entry: Entry, req: Any, request: Any) -> list[Any]:
        """A catalogue entry's results for a request: its inputs checked, batched with other
        requests that give the same inputs and options."""
        self.need(entry)
        given = [i for i in entry.inputs if getattr(req, i.param) is not None]
        columns = {i.param: getattr(req, i.param) for i in given}
        for name, values in columns.items():
            self.check(values, name)
        first, n = given[0].param, len(columns[given[0].param])
        for name, values in columns.items():
            if len(values) != n:
                raise HTTPError(422, f"{n} {first} but {len(values)} {name}", name)

        def run(items: list[tuple[str, ...]], options: dict[str, Any]) -> list[Any]:
            inputs = {i.param: [item[k] for item in items] for k, i in enumerate(given)}
            return entry.run(self.pipe, inputs, options)

        key = "+".join(i.param for i in given)  # classify with and without pairs: two queues
        options = {name: getattr(req, name) for name in entry.options}
        items, cost = list(zip(*columns.values())), self.reading(entry, len(given))
        return await self.submit(f"{entry.name}:{key}", run, items, options, request, cost, first)

    async def scores(
        self, query: str, texts: list[str], field: str, options: dict[str, Any], request: Any
    ) -> list[float]:
        """A cross-encoder's scores of (query, text) for each text, in the batcher that
        POST /rerank (the catalogue's entry) and /v1/rerank share."""
        entry = ENTRIES["rerank"]
        self.need(entry)
        self.check([query], "query")
        self.check(texts, field)

        def run(items: list[tuple[str, str]], options: dict[str, Any]) -> list[Any]:
            inputs = {"queries": [q for q, _ in items], "documents": [d for _, d in items]}
            return entry.run(self.pipe, inputs, options)

        items, cost = [(query, t) for t in texts], self.reading(entry, 2)
        return await self.submit("rerank", run, items, options, request, cost, field)


async def client_gone(request: Any) -> None:
    """Returns once the client has closed its connection: with the body read, the server's
    next message is http.disconnect (uvicorn's comes when the socket closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# the request's entry in its ASGI scope (the same dict in Guard and in the handler's Request):
# what the handler knows for the access log: {"texts": items, "batch": the model call's size}
NOTE = "bertforge.access"


def note(request: Any, **fields: Any) -> None:
    """Record facts about a request for its access-log line."""
    request.scope.setdefault(NOTE, {}).update(fields)


def create_app(
    model: str | Path,
    limits: Limits | None = None,
    index: str | Path | None = None,
    index_model: str | None = None,
    access: Access | None = None,
    calibration: str | None = None,
    **pipeline_options: Any,
) -> Any:
    """The FastAPI application serving `model`: the pipelines its checkpoint has the heads for
    (only those: /openapi.json lists what this model serves), the embedding endpoints,
    health, metadata and metrics, and POST /search over `index` (an index.Index directory)
    when given; behind `access`'s API key, with its access log. The model and its heads load
    here: a checkpoint that cannot be read raises its CheckpointError now, not at the first
    request."""
    fastapi = need_extra("fastapi", _SERVE_EXTRA)
    access = access or Access()
    server = Server(model, limits or Limits(), pipeline_options)
    if calibration is not None:  # read now: a bad file stops `serve` before it listens
        server.calibration = embedding.read_calibration(calibration, server.width)
    # no /docs or /redoc: their pages load scripts from a CDN, blank offline; /openapi.json is
    # the API (any OpenAPI viewer reads it)
    app = fastapi.FastAPI(
        title="bertforge",
        description=f"BERT pipelines for {server.name}",
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = server
    if access.api_key is not None:  # inside Guard (added last: outermost), which counts its 401s
        app.add_middleware(Auth, key=access.api_key)
    app.add_middleware(
        Guard,
        metrics=server.metrics,
        max_body=server.limits.max_body_bytes,
        routes=app.routes,
        access_log=access.access_log,
    )
    add_error_handlers(app, server)
    add_status(app, server)
    if index is not None:
        add_search(app, server, index, index_model)
    elif index_model is not None:
        raise ConfigError("index_model (--index-model): needs an index (--index)")
    shaped = {"embed": add_embeddings, "rerank": add_rerank}  # endpoints of their own shape
    for entry in ENTRIES.values():
        if entry.name in server.endpoints:
            shaped.get(entry.name, functools.partial(add_pipeline, entry=entry))(app, server)
    if access.api_key is not None:
        declare_bearer(app)
    return app


def declare_bearer(app: Any) -> None:
    """/openapi.json says that every operation but GET /health needs the bearer key (clients
    generated from it send it)."""
    schema = app.openapi()  # built once and kept: changed here, it is what is served
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            if path not in OPEN_PATHS:
                operation["security"] = [{"bearer": []}]


def add_pipeline(app: Any, server: Server, entry: Entry) -> None:
    """POST /<entry.name>: the entry's request body in, {"results": [...]} out."""

    async def endpoint(req: Any, request: Any) -> dict[str, Any]:
        return {"results": await server.results(entry, req, request)}

    endpoint.__annotations__ = {
        "req": request_model(entry),
        "request": Request,
        "return": dict[str, Any],
    }
    app.post(f"/{entry.name}", summary=entry.help, name=entry.name)(endpoint)


def add_embeddings(app: Any, server: Server) -> None:
    """POST /embed and POST /v1/embeddings (OpenAI's shape): one batcher for both. A request's
    prompt is part of its batch's options; its dimensions and output precision are applied to
    its own rows after the batch (embedding.shortened, embedding.quantize), so requests that
    differ only in those share model calls."""
    pipe = server.pipe

    async def vectors(inputs: list[Any], what: str, options: dict[str, Any], request: Any) -> list:
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
        rows = await server.submit("embed", run, inputs, options, request, read, what)
        normalized = own.normalize if normalize is None else normalize
        return list(embedding.shortened(np.stack(rows), dimensions, normalized))

    def run(items: list[Any], options: dict[str, Any]) -> list[Any]:
        return list(pipe.embed(items, **options))

    windows = server.windows_read(pipe, pipe.embedding_settings.max_length)

    def read(items: list[Any], options: dict[str, Any]) -> list[int]:
        """Pieces each input is read as, its prompt before it (a prompt adds to every text)."""
        prompt = options.get("prompt") or ""
        ids = pipe.tok.encode(prompt, add_special_tokens=False, truncation=False).ids
        prompted = [prompt + x if isinstance(x, str) else [*ids, *x] for x in items]
        return windows(prompted, options)

    @app.post("/embed", summary=ENTRIES["embed"].help)
    async def embed(req: EmbedRequest, request: Request) -> dict[str, Any]:
        options = {"pooling": req.pooling, "normalize": req.normalize, "dimensions": req.dimensions}
        options |= {"prompt_name": req.prompt_name, "prompt": req.prompt}
        rows = np.stack(await vectors(req.texts, "texts", options, request))
        return {"embeddings": server.quantized(rows, req.embedding_precision, options).tolist()}

    @app.post("/v1/embeddings", summary="OpenAI's embeddings API")
    async def openai_embeddings(req: OpenAIEmbeddingRequest, request: Request) -> dict[str, Any]:
        inputs: list[Any] = req.input if isinstance(req.input, list) else [req.input]
        if inputs and isinstance(inputs[0], int):  # one input given as piece ids
            inputs = [inputs]
        options = {"pooling": None, "normalize": None, "dimensions": req.dimensions}
        options |= {"prompt_name": None, "prompt": None}  # the model's default prompt, if any
        rows = await vectors(inputs, "input", options, request)
        used = sum(server.pieces(x) for x in inputs)
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


RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")  # served with a cross-encoder


def add_rerank(app: Any, server: Server) -> None:
    """POST /rerank (text-embeddings-inference's shape), /v1/rerank (Cohere's v1 and Jina's)
    and /v2/rerank (Cohere's v2): the texts ordered by a cross-encoder's score for the query,
    one batcher for all three."""
    tei, v1, v2 = RERANK_PATHS

    @app.post(tei, summary=ENTRIES["rerank"].help)
    async def rerank(req: RerankRequest, request: Request) -> list[dict[str, Any]]:
        options = {"raw_scores": req.raw_scores, "truncate": req.truncate}
        scores = await server.scores(req.query, req.texts, "texts", options, request)
        return [
            {"index": i, "score": scores[i], **({"text": req.texts[i]} if req.return_text else {})}
            for i in ranking.ranked(scores)
        ]

    @app.post(v1, summary="Cohere's (v1) and Jina's rerank API")
    async def cohere_rerank(req: CohereRerankRequest, request: Request) -> dict[str, Any]:
        texts = [d if isinstance(d, str) else d.text for d in req.documents]
        scores = await server.scores(req.query, texts, "documents", COHERE_OPTIONS, request)
        used = sum(server.pieces((req.query, t)) for t in texts)
        return {
            **cohere_answer(scores, texts, req.top_n, req.return_documents, "1"),
            "model": req.model or server.name,
            "usage": {"total_tokens": used},
        }

    @app.post(v2, summary="Cohere's v2 rerank API")
    async def cohere_v2_rerank(req: CohereV2RerankRequest, request: Request) -> dict[str, Any]:
        server.check(req.documents, "documents")  # before they are read to be cut
        texts = server.clip(req.documents, req.max_tokens_per_doc)
        scores = await server.scores(req.query, texts, "documents", COHERE_OPTIONS, request)
        return cohere_answer(scores, req.documents, req.top_n, req.return_documents, "2")


# both Cohere endpoints: the model's activation and the pipeline's own rule for a document
# longer than the model reads; the same options, so their requests share model calls (and
# share them with /rerank's requests that keep its defaults)
COHERE_OPTIONS: dict[str, Any] = {"raw_scores": False, "truncate": False}


def cohere_answer(
    scores: list[float], texts: list[str], top_n: int | None, documents: bool, version: str
) -> dict[str, Any]:
    """Cohere's rerank answer: a uuid per answer, the top_n results best first, and its meta
    (a search unit is one query with up to 100 documents, as Cohere bills them)."""
    results = [
        {
            "index": i,
            "relevance_score": scores[i],
            **({"document": {"text": texts[i]}} if documents else {}),
        }
        for i in ranking.ranked(scores)[:top_n]
    ]
    meta = {
        "api_version": {"version": version},
        "billed_units": {"search_units": math.ceil(len(texts) / 100)},
    }
    return {"id": str(uuid.uuid4()), "results": results, "meta": meta}


def add_search(app: Any, server: Server, path: str | Path, index_model: str | None = None) -> None:
    """POST /search: {"queries", "top_k"?, "mode"?: dense | bm25 | hybrid, "return_text"?,
    "return_passage"?} -> {"results": [[{id, score, rank, text?, passage?}]]}, over the index
    (loaded now, so a broken index stops `serve` before it listens). The served model embeds
    the queries, and must be the index's (its sha256 and precision): one model answers
    /embed and /search; an index of another model is refused unless `index_model` names it
    (checked to be the index's), which then embeds the queries beside the served model."""
    from .search import Index

    index = Index.load(path)
    if index_model is not None:  # the index's model beside the served one, checked
        index.use_model(index_model, device=server.pipe.device.type)
    elif not index.adopt(server.pipe):
        raise ConfigError(
            f"{path}: built with the model {index.meta['model_name']}, not the one served "
            f"({server.name}, or not in its precision): serve that model, or name the index's "
            "own with --index-model to search with it beside the served one"
        )
    server.endpoints.append("search")
    pipe = index.use_model()  # the queries are read as its embed reads them
    read = server.windows_read(pipe, pipe.embedding_settings.max_length)

    def run(items: list[Any], options: dict[str, Any]) -> list[Any]:
        return index.search(items, **options)

    @app.post("/search", summary="search the index given with --index")
    async def search(req: SearchRequest, request: Request) -> dict[str, Any]:
        server.check(req.queries, "queries")
        options = {"top_k": req.top_k, "mode": req.mode, "text": req.return_text}
        options |= {"fusion": req.fusion, "alpha": req.alpha, "passage": req.return_passage}
        rows = await server.submit("search", run, req.queries, options, request, read, "queries")
        if req.return_text:  # a document's text cut at return_chars: the answer stays bounded
            cut = server.limits.return_chars
            for hit in (h for row in rows for h in row):
                hit["text_truncated"] = len(hit["text"]) > cut
                hit["text"] = hit["text"][:cut]
        return {"results": rows}


def add_status(app: Any, server: Server) -> None:
    """GET /health, /metadata (the model, its endpoints, precision, limits), /metrics."""
    from fastapi.responses import PlainTextResponse

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

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
        }

    @app.get("/metrics")
    async def prometheus() -> Any:
        text = server.metrics.text()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


OPEN_PATHS = ("/health",)  # answered without the API key: a liveness probe sends none


class Auth:
    """ASGI middleware: a request to any path but OPEN_PATHS must carry the key as
    `Authorization: Bearer KEY`, else 401 in the path's error shape (OpenAI's code
    "invalid_api_key" under /v1/) with a `WWW-Authenticate: Bearer` challenge; unknown paths
    too, so that a client without the key learns nothing of the API. GET /metrics and
    /openapi.json need it as well: the metrics tell how the server is used, and a Prometheus
    scrape job sends the key with its `authorization` setting (`credentials_file`). The key
    is compared in constant time, and no answer or log line shows what a client sent."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        value = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = value.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            await self.app(scope, receive, send)
            return
        if scheme.lower() == b"bearer":
            message, challenge = "invalid API key", 'Bearer error="invalid_token"'
        else:
            message, challenge = "an API key is required: 'Authorization: Bearer KEY'", "Bearer"
        response = error_response(
            scope["path"],
            401,
            message,
            headers={"www-authenticate": challenge},
            code="invalid_api_key",
        )
        await response(scope, receive, send)


def access_line(method: str, path: str, status: int, seconds: float, notes: dict) -> str:
    """A request's access-log line: method, path, status, milliseconds, and where the handler
    noted them its texts and the model call's batch size; never a body or a header. A path's
    unprintable characters (it arrives percent-decoded) are escaped: one request, one line."""
    if not path.isprintable():
        path = path.encode("unicode_escape").decode()
    line = f"{method} {path} {status} {seconds * 1000:.1f} ms"
    return line + "".join(f" {k}={notes[k]}" for k in ("texts", "batch") if k in notes)


class Guard:
    """ASGI middleware just inside Starlette's ServerErrorMiddleware (which answers an exception
    and then re-raises it: uvicorn logs its traceback and drops the keep-alive connection).
    It counts every request by endpoint and status with its latency and logs its access line
    (access_line, unless access_log is off), refuses a body over max_body as it arrives (413,
    before anything parses it), and answers an exception that no handler took with a 500
    instead of letting it through."""

    def __init__(
        self,
        app: Any,
        metrics: Metrics,
        max_body: int,
        routes: list[Any],
        access_log: bool = False,
    ) -> None:
        self.app, self.metrics, self.max_body, self.routes = app, metrics, max_body, routes
        self.paths: set[str] | None = None
        self.access_log = access_log

    @staticmethod
    def declared(scope: dict[str, Any]) -> int:
        """The body's Content-Length (0 when not given: it is counted as it comes)."""
        value = dict(scope["headers"]).get(b"content-length", b"0")
        return int(value) if value.isdigit() else 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.paths is None:  # the routes, all added by the first request
            self.paths = {getattr(r, "path", "") for r in self.routes}
        start, path, status, read = time.perf_counter(), scope["path"], 0, 0
        over = self.declared(scope) > self.max_body
        notes = scope.setdefault(NOTE, {})  # filled by the handler (note())

        async def receive_counted() -> Any:
            nonlocal read, over
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.max_body:
                over = True
                raise BodyTooLarge
            return message

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if over and not status:  # the app's answer to a cut body: the 413 goes instead
                return
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if not over:
                await self.app(scope, receive_counted, send_status)
        except Exception as e:
            if not over:  # a bug: logged, and answered unless its answer had begun
                message = internal(f"{scope['method']} {path}", e)
                if not status:
                    await error_response(path, 500, message)(scope, receive, send_status)
        if over and not status:
            status = 413  # the body is unread: this connection cannot carry another request
            text = f"the body is larger than the limit of {self.max_body:,} bytes"
            response = error_response(path, 413, text, headers={"connection": "close"})
            await response(scope, receive, send)
        endpoint, seconds = path if path in self.paths else "other", time.perf_counter() - start
        self.metrics.request(endpoint, status or 500, seconds)
        if self.access_log:
            access_log.info(access_line(scope["method"], path, status or 500, seconds, notes))


def add_error_handlers(app: Any, server: Server) -> None:
    """Every error answered, never re-raised, as error_response: HTTPError with its status,
    Starlette's own (404, 405, a body it could not read) with theirs (a 404 for a pipeline
    this model lacks says why), a body that is not JSON 400, one not sent as JSON 415
    (not_json), a body of the wrong shape 422, a BertforgeError (an input the pipeline
    refuses) 422 with the server's paths shown as the model's name. The rest: Guard's 500."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPError)
    async def http_error(request: Any, e: HTTPError) -> Any:
        return error_response(request.url.path, e.status, e.message, e.param)

    @app.exception_handler(HTTPException)
    async def starlette_error(request: Any, e: HTTPException) -> Any:
        path = request.url.path
        message = f"{e.detail}: {request.method} {path}"
        if e.status_code == 404:  # a pipeline this model has no head for says so
            message = server.absent(path) or message
        return error_response(path, e.status_code, message, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Any, e: RequestValidationError) -> Any:
        errors, path = e.errors(), request.url.path
        if any(err.get("type") == "json_invalid" for err in errors):
            return error_response(path, 400, "the body is not valid JSON")
        if isinstance(e.body, bytes) and e.body:  # a body FastAPI did not read as JSON
            return error_response(path, 415, not_json(request.headers.get("content-type")))
        first = errors[0] if errors else {}
        where = [str(x) for x in first.get("loc", ()) if x != "body"]
        message = f"{'.'.join(where) or 'body'}: {first.get('msg', 'invalid request')}"
        return error_response(path, 422, message, where[0] if where else None)

    @app.exception_handler(BertforgeError)
    async def refused(request: Any, e: BertforgeError) -> Any:
        return error_response(request.url.path, 422, server.scrub(str(e)))


def not_json(content_type: str | None) -> str:
    """The 415's message for a body not sent as JSON. Bodies are read as JSON only when their
    Content-Type says so (application/json or */*+json), as FastAPI does and for its reason:
    a web page can make a browser send a text/plain or form body, or one without a
    Content-Type, to a server on localhost without asking first (cross-site request forgery);
    it cannot send application/json so. curl -d sends application/x-www-form-urlencoded."""
    given = f"Content-Type {content_type}" if content_type else "no Content-Type"
    return (
        f"the body was sent with {given}; send JSON as 'Content-Type: application/json' "
        "(curl: --json BODY, or -H 'Content-Type: application/json' -d BODY)"
    )


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    index: str | None = None,
    index_model: str | None = None,
    access: Access | None = None,
    calibration: str | None = None,
    **pipeline_options: Any,
) -> None:
    """Load and check the model (a CheckpointError ends it here), then run the server
    (uvicorn, its own access log off: ours says more) until stopped, the access log on
    stderr."""
    uvicorn = need_extra("uvicorn", _SERVE_EXTRA)
    access = access or Access()
    if access.api_key is None and os.environ.get(API_KEY_ENV):
        access = Access(os.environ[API_KEY_ENV], access.access_log)
    app = create_app(model, limits, index, index_model, access, calibration, **pipeline_options)
    if access.access_log and not access_log.handlers:
        handler = logging.StreamHandler()  # stderr
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
        access_log.addHandler(handler)
        access_log.setLevel(logging.INFO)
    keyed = "; requests need the API key" if access.api_key else ""
    print(f"serving {model} on http://{host}:{port} (its API: /openapi.json{keyed})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
