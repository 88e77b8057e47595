"""The application: create_app assembles the FastAPI app for one model (the Server, its
routes, the error handlers, the middleware: Guard outermost, Auth inside it), and serve runs it
with uvicorn."""

from __future__ import annotations

import functools
import logging
import os
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from .. import embedding
from ..catalogue import ENTRIES
from ..errors import BertforgeError, ConfigError, hide, need_extra
from .access import OPEN_PATHS, Auth, Guard, access_log
from .errors import SERVE_EXTRA, HTTPError, error_response, not_json
from .limits import API_KEY_ENV, Access, Limits, check_key_fits
from .routes import add_embeddings, add_pipeline, add_rerank, add_search, add_status
from .server import Server

if TYPE_CHECKING:
    from ..search import PgOptions


def create_app(
    model: str | Path,
    limits: Limits | None = None,
    index: str | Path | None = None,
    index_model: str | None = None,
    access: Access | None = None,
    calibration: str | None = None,
    index_options: PgOptions | None = None,
    rerank_model: str | Path | None = None,
    **pipeline_options: Any,
) -> Any:
    """The FastAPI application serving `model`: the pipelines its checkpoint has the heads for
    (only those: /openapi.json lists what this model serves), the embedding endpoints,
    health, metadata and metrics, and POST /search over `index` (an index.Index directory,
    or a PostgreSQL DSN: `index_options` its table and search settings) when given, its hits
    reranked on request by the cross-encoder `rerank_model` (`model` itself, loaded once, when
    it is that directory); behind
    `access`'s API key, with its access log. The model and its heads load here: a checkpoint
    that cannot be read raises its CheckpointError now, not at the first request."""
    access, limits = access or Access(), limits or Limits()
    hide(access.api_key)  # from now on no message, answer or log line shows it
    check_key_fits(access, limits)
    server = Server(model, limits, pipeline_options)
    if calibration is not None:  # read now: a bad file stops `serve` before it listens
        server.calibration = embedding.read_calibration(calibration, server.width)
    # no /docs or /redoc: their pages load scripts from a CDN, blank offline; /openapi.json is
    # the API (any OpenAPI viewer reads it)
    app = FastAPI(
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
        max_header=server.limits.max_header_bytes,
        routes=app.routes,
        access_log=access.access_log,
    )
    add_error_handlers(app, server)
    add_status(app, server)
    if index is not None:
        add_search(app, server, index, index_model, index_options, rerank_model)
    for name, given in (("index_model", index_model), ("rerank_model", rerank_model)):
        if index is None and given is not None:
            flag = name.replace("_", "-")
            raise ConfigError(f"{name} (--{flag}): needs an index (--index)")
    shaped = {"embed": add_embeddings, "rerank": add_rerank}  # endpoints of their own shape
    for entry in ENTRIES.values():
        if entry.name in server.endpoints:
            shaped.get(entry.name, functools.partial(add_pipeline, entry=entry))(app, server)
    if access.api_key is not None:
        declare_bearer(app)
    return app


def declare_bearer(app: Any) -> None:
    """/openapi.json says that every operation but OPEN_PATHS' needs the bearer key (clients
    generated from it send it)."""
    schema = app.openapi()  # built once and kept: changed here, it is what is served
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            if path not in OPEN_PATHS:
                operation["security"] = [{"bearer": []}]


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
        said = first.get("msg", "invalid request")
        if first.get("type") == "extra_forbidden":  # a Strict body's unknown field
            owner = ".".join(where[:-1]) or f"{request.method} {path}"
            said = f"unknown field (the fields of {owner}: {body_fields(request, where[:-1])})"
        message = f"{'.'.join(where) or 'body'}: {said}"
        return error_response(path, 422, message, where[0] if where else None)

    @app.exception_handler(BertforgeError)
    async def refused(request: Any, e: BertforgeError) -> Any:
        return error_response(request.url.path, 422, server.scrub(str(e)))


def body_fields(request: Any, within: list[str] | None = None) -> str:
    """The fields of the request body the request's route reads (FastAPI's route, in the
    request's scope), or of the object in its field `within` (/search's rerank: a path of
    field names), comma-separated."""
    field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    for name in within or ():
        inner = getattr(model, "model_fields", {}).get(name)
        kind = getattr(inner, "annotation", None)
        kinds = typing.get_args(kind) or (kind,)  # SearchRerank | None: the model in it
        model = next((k for k in kinds if hasattr(k, "model_fields")), None)
    return ", ".join(getattr(model, "model_fields", {})) or "see /openapi.json"


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    index: str | None = None,
    index_model: str | None = None,
    access: Access | None = None,
    calibration: str | None = None,
    index_options: PgOptions | None = None,
    rerank_model: str | None = None,
    **pipeline_options: Any,
) -> None:
    """Load and check the model (a CheckpointError ends it here), then run the server
    (uvicorn, its own access log off: ours says more) until stopped, the access log on
    stderr."""
    uvicorn = need_extra("uvicorn", SERVE_EXTRA)
    access, limits = access or Access(), limits or Limits()
    if access.api_key is None and os.environ.get(API_KEY_ENV):
        access = Access(os.environ[API_KEY_ENV], access.access_log)
    app = create_app(
        model,
        limits,
        index,
        index_model,
        access,
        calibration,
        index_options,
        rerank_model,
        **pipeline_options,
    )
    if access.access_log and not access_log.handlers:
        handler = logging.StreamHandler()  # stderr
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
        access_log.addHandler(handler)
        access_log.setLevel(logging.INFO)
    keyed = "; requests need the API key" if access.api_key else ""
    print(f"serving {model} on http://{host}:{port} (its API: /openapi.json{keyed})", flush=True)
    # uvicorn's h11 refuses a header block over 16 KiB itself, a plain-text 400 before the app
    # sees it (or a reset connection): it reads one up to what a body may be, so that Guard
    # answers one over max_header_bytes with a 431 in the API's shape
    read = max(limits.max_body_bytes, limits.max_header_bytes)
    uvicorn.run(app, host=host, port=port, log_level="warning", h11_max_incomplete_event_size=read)
