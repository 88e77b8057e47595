"""The server's error answers: HTTPError (a status, a message, the field it is about), raised
anywhere in the server and answered by app.py's handlers; error_response, the JSON body in the
shape of the path's API; internal, a bug's answer and its log line. FastAPI's response class is
imported only when an answer is made."""

from __future__ import annotations

import logging
import traceback
import uuid
from pathlib import Path
from typing import Any

from ..errors import redacted

log = logging.getLogger(__package__)  # "bertforge.serve": the server's log
SERVE_EXTRA = "bertforge serve needs the serve extra: pip install 'bertforge[serve]'"


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
    "invalid_api_key"); under /v2/ Cohere's, {"id", "message"}. The message redacted (every
    error answer passes here: none shows a DSN's password or the API key)."""
    from fastapi.responses import JSONResponse

    message = redacted(message)
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
    log.error("%s: internal error: %s: %s%s", where, type(e).__name__, redacted(str(e)), at)
    return f"internal error: {type(e).__name__}"


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
