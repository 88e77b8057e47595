"""What the server admits and who may call it: Limits (per request, per model call, the queue)
and Access (the API key, the access log). No FastAPI here: the command line builds `serve`'s
options from these two without the serve extra."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..options import check_options, option


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
    max_batch_tokens: int = option(  # measured: see the package docstring (serve/__init__.py)
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
    # what uvicorn reads before the app sees a request is set from this and max_body_bytes by
    # serve(): a header block over this limit is refused here, in the API's shape
    max_header_bytes: int = option(
        65_536,
        "bytes of a request's line and headers (else 431; an API key must fit, beside "
        "a client's other headers)",
        min=1,
    )
    return_chars: int = option(
        10_000,
        "characters of a document's text or passage in a /search answer (more: cut, flagged)",
        min=1,
    )
    # with return_chars, what bounds a /search answer's size: 1,000 hits of 10,000 characters
    # are 10 million (and a window-long passage each); 64 queries x top_k 1,000 were 640 million
    max_text_hits: int = option(
        1_000,
        "hits with a text or passage in a /search answer: queries x top_k with return_text or "
        "return_passage (else 413)",
        min=1,
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
        f"the key every request but /health and /ready must send as 'Authorization: Bearer KEY' "
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


# the request line and a client's other headers beside the key's: the openai client's are
# about 500 bytes
HEADER_ROOM = 1024


def check_key_fits(access: Access, limits: Limits) -> None:
    """An API key whose header fits in max_header_bytes beside a client's other headers: a
    longer one would make every request a 431. The key is not shown."""
    key, limit = access.api_key, limits.max_header_bytes
    if key is not None and len(key) + HEADER_ROOM > limit:
        raise ConfigError(
            f"api_key (--api-key or {API_KEY_ENV}): {len(key):,} characters, too long for "
            f"--max-header-bytes {limit:,} (a request's headers, the key among them, with "
            f"{HEADER_ROOM:,} bytes left for a client's others): raise --max-header-bytes or "
            "use a shorter key"
        )
