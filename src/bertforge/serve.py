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
    GET  /health, GET /metadata, GET /metrics (Prometheus text), GET /docs (OpenAPI)

Every served pipeline has its endpoint; one whose head the checkpoint lacks (by its config.json
"architectures") answers 404. Concurrent requests are micro-batched: each endpoint has a bounded
queue and one worker that takes up to max_batch texts and max_batch_tokens padded pieces (so one
long text does not hold back a batch of short ones), waiting at most max_wait_ms for more, runs
them length-sorted in a thread (the inference runner: a long text does not pad the short ones),
and answers each request with its own rows. Limits: texts per request and characters per text
answer 413, a full queue 503, a body that is not JSON 400, a body of the wrong shape 422; every
error is JSON {"error": "..."}. The model is fixed at start-up: nothing in a request names a file.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # the serve extra; without it the module still imports (the CLI reads Limits' options)
    from pydantic import BaseModel, Field, create_model
except ImportError:  # create_app says what to install
    BaseModel, Field, create_model = object, lambda *a, **k: None, None  # type: ignore[all]

from .catalogue import ENTRIES, Entry
from .checkpoint import architectures
from .config import check_options, option
from .errors import BertforgeError, ConfigError
from .model import BertModel
from .pipelines import Pipeline
from .tasks.embedding import POOLINGS


@dataclass
class Limits:
    """What one request and one model call may hold, and how requests wait."""

    max_texts: int = option(64, "texts per request (else 413)", min=1)
    max_chars: int = option(10_000, "characters per text (else 413)", min=1)
    max_batch: int = option(64, "texts per model call", min=1)
    max_batch_tokens: int = option(
        16_384, "padded pieces per model call (a longer text runs alone)", min=1
    )
    max_wait_ms: float = option(5.0, "how long a batch waits for more requests", min=0)
    max_queue: int = option(1024, "requests waiting per endpoint (else 503)", min=1)

    def __post_init__(self) -> None:
        check_options(self)


class EmbedRequest(BaseModel):  # pooling, normalize: the model's own unless given
    texts: list[str]
    pooling: str | None = Field(None, pattern=f"^({'|'.join(POOLINGS)})$")
    normalize: bool | None = None


class OpenAIEmbeddingRequest(BaseModel):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: str = Field("float", pattern="^(float|base64)$")
    dimensions: int | None = None
    user: str | None = None


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
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Batcher:
    """One endpoint's queue and worker: requests (items, options) in, rows out."""

    def __init__(
        self,
        run: Callable[[list[Any], dict[str, Any]], list[Any]],
        limits: Limits,
        pieces: Callable[[Any], int],
        metrics: Metrics,
    ) -> None:
        self.run, self.limits, self.pieces, self.metrics = run, limits, pieces, metrics
        self.queue: asyncio.Queue[tuple[list[Any], dict[str, Any], asyncio.Future]] = asyncio.Queue(
            limits.max_queue
        )
        self.lock = asyncio.Lock()  # one model call at a time (torch uses every core already)
        self.task: asyncio.Task | None = None

    async def submit(self, items: list[Any], options: dict[str, Any]) -> list[Any]:
        if self.task is None:
            self.task = asyncio.create_task(self._work())
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        try:
            self.queue.put_nowait((items, options, future))
        except asyncio.QueueFull:
            raise HTTPError(503, "server busy: the request queue is full; retry later") from None
        return await future

    def _longest(self, items: list[Any]) -> int:
        return max((self.pieces(x) for x in items), default=0)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        limits, held = self.limits, None
        while True:
            pending = [held or await self.queue.get()]
            held = None
            size, longest = len(pending[0][0]), self._longest(pending[0][0])
            deadline = loop.time() + limits.max_wait_ms / 1000
            while size < limits.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self.queue.get(), timeout)
                except asyncio.TimeoutError:
                    break
                n, m = size + len(nxt[0]), max(longest, self._longest(nxt[0]))
                if n * m > limits.max_batch_tokens:  # padded pieces: it waits for the next batch
                    held = nxt
                    break
                pending.append(nxt)
                size, longest = n, m
            self.metrics.batch(size, self.queue.qsize() + (held is not None))
            # requests with the same options run as one batch
            groups: dict[str, list[tuple[list[Any], dict[str, Any], asyncio.Future]]] = {}
            for p in pending:
                groups.setdefault(json.dumps(p[1], sort_keys=True), []).append(p)
            for group in groups.values():
                items = [x for p in group for x in p[0]]
                try:
                    rows = await loop.run_in_executor(None, self.run, items, group[0][1])
                except Exception as e:  # answer every waiting request, keep serving
                    for _, _, f in group:
                        if not f.done():
                            f.set_exception(e)
                    continue
                i = 0
                for its, _, f in group:
                    if not f.done():
                        f.set_result(rows[i : i + len(its)])
                    i += len(its)


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
        out = [
            "# HELP bertforge_requests_total HTTP requests by endpoint and status.",
            "# TYPE bertforge_requests_total counter",
        ]
        out += [
            f'bertforge_requests_total{{endpoint="{e}",status="{s}"}} {n}'
            for (e, s), n in sorted(self.requests.items())
        ]
        out += [
            "# HELP bertforge_request_seconds Request latency.",
            "# TYPE bertforge_request_seconds histogram",
        ]
        for e, counts in sorted(self.latency.items()):
            out += _histogram("bertforge_request_seconds", f'endpoint="{e}",', self.LATENCY, counts)
        out += [
            "# HELP bertforge_batch_texts Texts per model call.",
            "# TYPE bertforge_batch_texts histogram",
        ]
        out += _histogram("bertforge_batch_texts", "", self.BATCH, self.batches)
        out += [
            "# HELP bertforge_queue_depth Requests waiting after the last batch was formed.",
            "# TYPE bertforge_queue_depth gauge",
            f"bertforge_queue_depth {self.queue_depth}",
        ]
        return "\n".join(out) + "\n"


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
    found = architectures(model)
    return [e.name for e in ENTRIES.values() if e.served and e.available(found)]


class Server:
    """What the endpoints share: the pipeline, the limits, the metrics, one batcher per
    endpoint (and per set of inputs given), and the piece counts they batch by."""

    def __init__(self, model: str | Path, limits: Limits, pipeline_options: dict[str, Any]) -> None:
        self.model, self.limits, self.metrics = model, limits, Metrics()
        self.pipe = Pipeline(model, batch_size=limits.max_batch, **pipeline_options)
        self.endpoints = available(model)
        self.batchers: dict[str, Batcher] = {}

    def check(self, texts: list[Any], what: str = "texts") -> None:
        """An input list within the limits (else 422 / 413 naming the field and item)."""
        limits = self.limits
        if not texts:
            raise HTTPError(422, f"{what}: empty list")
        if len(texts) > limits.max_texts:
            raise HTTPError(
                413,
                f"{what}: {len(texts)} items, more than the limit of "
                f"{limits.max_texts} per request",
            )
        for i, t in enumerate(texts):
            if len(t) > limits.max_chars:
                raise HTTPError(
                    413,
                    f"{what}[{i}]: {len(t):,} characters, more than the limit "
                    f"of {limits.max_chars:,}",
                )

    def need(self, entry: Entry) -> None:
        if entry.name not in self.endpoints:
            raise HTTPError(404, f"{entry.name}: this model has no {entry.architectures[0]} head")

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

    def batcher(self, key: str, run: Callable[[list[Any], dict[str, Any]], list[Any]]) -> Batcher:
        if key not in self.batchers:
            self.batchers[key] = Batcher(run, self.limits, self.pieces, self.metrics)
        return self.batchers[key]

    async def results(self, entry: Entry, req: Any) -> list[Any]:
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
                raise HTTPError(422, f"{n} {first} but {len(values)} {name}")

        def run(items: list[tuple[str, ...]], options: dict[str, Any]) -> list[Any]:
            inputs = {i.param: [item[k] for item in items] for k, i in enumerate(given)}
            return entry.run(self.pipe, inputs, options)

        key = "+".join(i.param for i in given)  # classify with and without pairs: two queues
        options = {name: getattr(req, name) for name in entry.options}
        return await self.batcher(f"{entry.name}:{key}", run).submit(
            list(zip(*columns.values())), options
        )


def create_app(model: str | Path, limits: Limits | None = None, **pipeline_options: Any) -> Any:
    """The FastAPI application serving `model`: the catalogue's served pipelines, the
    embedding endpoints, health, metadata and metrics."""
    try:
        from fastapi import FastAPI
    except ImportError:
        raise ConfigError(
            "bertforge serve needs the serve extra: pip install 'bertforge[serve]'"
        ) from None
    server = Server(model, limits or Limits(), pipeline_options)
    app = FastAPI(title="bertforge", description=f"BERT pipelines for {model}")
    add_error_handlers(app)
    add_metrics(app, server.metrics)
    add_status(app, server)
    add_embeddings(app, server)
    for entry in ENTRIES.values():
        if entry.served and entry.name != "embed":  # /embed: its own shape, above
            add_pipeline(app, server, entry)
    return app


def add_pipeline(app: Any, server: Server, entry: Entry) -> None:
    """POST /<entry.name>: the entry's request body in, {"results": [...]} out."""

    async def endpoint(req: Any) -> dict[str, Any]:
        return {"results": await server.results(entry, req)}

    endpoint.__annotations__ = {"req": request_model(entry), "return": dict[str, Any]}
    app.post(f"/{entry.name}", summary=entry.help, name=entry.name)(endpoint)


def add_embeddings(app: Any, server: Server) -> None:
    """POST /embed and POST /v1/embeddings (OpenAI's shape): one batcher for both."""
    pipe = server.pipe

    async def vectors(inputs: list[Any], pooling: str | None, normalize: bool | None) -> list:
        server.check(inputs, "input" if inputs and not isinstance(inputs[0], str) else "texts")
        b = server.batcher("embed", lambda items, o: list(pipe.embed(items, **o)))
        return await b.submit(inputs, {"pooling": pooling, "normalize": normalize})

    @app.post("/embed", summary=ENTRIES["embed"].help)
    async def embed(req: EmbedRequest) -> dict[str, Any]:
        rows = await vectors(req.texts, req.pooling, req.normalize)
        return {"embeddings": [r.tolist() for r in rows]}

    @app.post("/v1/embeddings", summary="OpenAI's embeddings API")
    async def openai_embeddings(req: OpenAIEmbeddingRequest) -> dict[str, Any]:
        inputs: list[Any] = req.input if isinstance(req.input, list) else [req.input]
        if inputs and isinstance(inputs[0], int):  # one input given as piece ids
            inputs = [inputs]
        width = pipe.config.hidden_size * len(pipe.embedding_settings.pooling)
        if req.dimensions is not None and req.dimensions != width:
            raise HTTPError(
                400,
                f"dimensions={req.dimensions}: this model's embeddings have "
                f"{width} dimensions (it cannot shorten them)",
            )
        rows = await vectors(inputs, None, None)
        used = sum(server.pieces(x) for x in inputs)
        as_base64 = req.encoding_format == "base64"
        return {
            "object": "list",
            "model": req.model or Path(server.model).name,
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
            "model": str(server.model),
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


def add_metrics(app: Any, metrics: Metrics) -> None:
    """Middleware counting every request by endpoint and status, with its latency."""

    @app.middleware("http")
    async def measure(request: Any, call_next: Callable[[Any], Any]) -> Any:
        start, path = time.perf_counter(), request.url.path
        path = path if any(getattr(r, "path", None) == path for r in app.routes) else "other"
        try:
            response = await call_next(request)
        except Exception:
            metrics.request(path, 500, time.perf_counter() - start)
            raise
        metrics.request(path, response.status_code, time.perf_counter() - start)
        return response


def add_error_handlers(app: Any) -> None:
    """Every error as JSON {"error": ...}: HTTPError with its status, a body that is not JSON
    400, a body of the wrong shape 422, a BertforgeError (bad input) 422, anything else 500."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    @app.exception_handler(HTTPError)
    async def http_error(request: Any, e: HTTPError) -> JSONResponse:
        return JSONResponse({"error": e.message}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Any, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        if any(err.get("type") == "json_invalid" for err in errors):
            return JSONResponse({"error": "the body is not valid JSON"}, status_code=400)
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return JSONResponse(
            {"error": f"{where or 'body'}: {first.get('msg', 'invalid request')}"},
            status_code=422,
        )

    @app.exception_handler(Exception)
    async def internal(request: Any, e: Exception) -> JSONResponse:
        if isinstance(e, BertforgeError):
            return JSONResponse({"error": str(e)}, status_code=422)
        return JSONResponse({"error": f"internal error: {type(e).__name__}"}, status_code=500)


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    **pipeline_options: Any,
) -> None:
    """Run the server (uvicorn) until stopped."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigError(
            "bertforge serve needs the serve extra: pip install 'bertforge[serve]'"
        ) from None
    uvicorn.run(
        create_app(model, limits, **pipeline_options), host=host, port=port, log_level="warning"
    )
