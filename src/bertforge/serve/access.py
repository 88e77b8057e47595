"""Who may call the server and what it notes of each request: Auth (the API key, checked before
anything else), Guard (every request counted and given its access-log line, a body over the
limit refused as it arrives, a bug answered with a 500), the access log's lines and the notes
a handler leaves for them. ASGI middleware: no FastAPI imported here."""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from .errors import BodyTooLarge, error_response, internal
from .metrics import Metrics

# one line per request (Guard), "bertforge.serve.access"; serve() sends it to stderr
access_log = logging.getLogger(__name__)

# the request's entry in its ASGI scope (the same dict in Guard and in the handler's Request):
# what the handler knows for the access log: {"texts": items, "batch": the model call's size}
NOTE = "bertforge.access"


def note(request: Any, **fields: Any) -> None:
    """Record facts about a request for its access-log line."""
    request.scope.setdefault(NOTE, {}).update(fields)


OPEN_PATHS = ("/health", "/ready")  # answered without the API key: a probe sends none


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
    (access_line, unless access_log is off), refuses headers over max_header (431, before Auth
    reads the key) and a body over max_body as it arrives (413, before anything parses it),
    and answers an exception that no handler took with a 500 instead of letting it through."""

    def __init__(
        self,
        app: Any,
        metrics: Metrics,
        max_body: int,
        max_header: int,
        routes: list[Any],
        access_log: bool = False,
    ) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes
        self.max_body, self.max_header = max_body, max_header
        self.paths: set[str] | None = None
        self.access_log = access_log

    @staticmethod
    def declared(scope: dict[str, Any]) -> int:
        """The body's Content-Length (0 when not given: it is counted as it comes)."""
        value = dict(scope["headers"]).get(b"content-length", b"0")
        return int(value) if value.isdigit() else 0

    def oversized(self, scope: dict[str, Any]) -> str | None:
        """The 431's message for a request line and headers over max_header bytes (as sent:
        `name: value` and CRLF each), naming the largest header but never showing a value."""
        headers = scope["headers"]
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
        size += sum(len(name) + len(value) + 4 for name, value in headers)
        if size <= self.max_header:
            return None
        name, value = max(headers, key=lambda h: len(h[1]), default=(b"", b""))
        return (
            f"headers of {size:,} bytes, more than the limit of {self.max_header:,} "
            f"(max_header_bytes); the largest: {name.decode('latin-1')}, {len(value):,} bytes"
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.paths is None:  # the routes, all added by the first request
            self.paths = {getattr(r, "path", "") for r in self.routes}
        start, path, status, read = time.perf_counter(), scope["path"], 0, 0
        over = self.declared(scope) > self.max_body
        notes = scope.setdefault(NOTE, {})  # filled by the handler (note())
        if (too_long := self.oversized(scope)) is not None:  # before Auth reads the key
            status, over = 431, True  # the body is left unread: this connection then closes
            response = error_response(path, 431, too_long, headers={"connection": "close"})
            await response(scope, receive, send)

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
