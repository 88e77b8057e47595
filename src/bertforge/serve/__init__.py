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
        /qa          {"questions", "contexts", "max_seq_length"?, ...} -> [{answer, score, ...}]:
                     its windows the pipeline's max_length and stride (create_app's
                     options) unless the request says
        /nsp         {"texts": [...], "pairs": [...]}   -> [P(IsNext)]
    POST /search     with --index DIR: {"queries", "top_k"?, "mode"?, "fusion"?, "alpha"?,
                     "return_text"?, "return_passage"?, "where"?, "rerank"?} -> {"results":
                     [[{id, score, rank, text?, text_truncated?, passage?, passage_truncated?,
                     rerank_score?, first_stage_rank?}]]} (search/index.py); a document's text
                     and passage are cut at return_chars characters (text_truncated,
                     passage_truncated say whether they were), and with texts or passages
                     queries x top_k is at most max_text_hits (else 413). "rerank" (true or
                     {"depth", "fusion"}: search --rerank's; with --rerank-model) reranks the
                     hits as search --rerank does: queries x depth at most max_text_hits, the
                     pairs' pieces counted against max_request_tokens, batched as /rerank's
    POST /rerank     text-embeddings-inference's: {"query", "texts", "raw_scores"?, "return_text"?,
                     "truncate"?} -> [{index, score, text?}], best first (a cross-encoder)
    POST /v1/rerank  Cohere's (v1) and Jina's: {"query", "documents": [str | {"text", ...}],
                     "top_n"?, "return_documents"?, "model"?} -> {"id", "results": [{index,
                     relevance_score, document?}], "meta", "model", "usage"}: a document as
                     sent (an object with its other fields, a string as {"text"})
    POST /v2/rerank  Cohere's v2: {"query", "documents": [str], "top_n"?, "max_tokens_per_doc"?
                     (4096), "model"?} -> {"id", "results": [{index, relevance_score}], "meta":
                     {"api_version": {"version": "2"}, "billed_units": {"search_units"}}};
                     the three rerank endpoints share one batcher
    GET  /health (alive), GET /ready (the index's database answers too: else 503), GET
    /metadata, GET /metrics (Prometheus text), GET /openapi.json (the API)

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
endpoint's waiting requests in the order of their tags, fair queueing's virtual finish times
(the pieces the batcher had handed to model calls when the request came, plus its own): at most
max_batch texts and max_batch_tokens pieces as read (one input longer than that runs alone),
after waiting at most max_wait_ms for company. A request is answered with its own rows, in
order, once all its slices are in. So requests of one size are answered in the order they
came, each as soon as it can be; one that comes while a big one is answered goes before the
big one's next slice and waits for about one call, not the whole; and a big one waits behind
later requests for at most its own pieces of their work. Round robin (each waiting request's
next slice in turn), the order before, answered equal requests all together at the end: on the
rerank load of benchmarks/serve_load.py --peers (8 clients, a question and 20 SQuAD paragraphs
each) its p99 was 3.2 times its p50 (13.7 s against 4.3 s); by tags, 1.2 times (2.3 s against
1.9 s, the model calls also faster by then).
Measured (benchmarks/serve_load.py --mixed: 2 cores, all-MiniLM-L6-v2 as a cross-encoder, 20
clients of one-sentence requests beside the largest /rerank these limits admit, 17 texts of
10,000 characters): a one-text /rerank waits p99 0.84 s, against 9.8 s (the whole big one)
when a request was one call (by tags, with SDPA attention: p99 0.72 s, the big one 6.2 s). max_batch_tokens is 4,096 there because a small request may wait
for two calls (the one running and the one it shares): p99 7.3 s with calls of 16,384 pieces
(four such texts, read in about 3,700 pieces each), 2.5 s with 8,192, 0.88 s with 4,096; raise
it on a GPU. The endpoints' workers run side by side, as two threads on the cores: making one
model call at a time for the whole server instead made the small /embed requests beside that
/rerank wait for its calls (p99 0.8 s against 0.3 s side by side; the big one took 11 s against
16.5 s).
A call that fails is run again one request's slice at a time, so a bad input fails only its own
request, and is named by its place in the request, not in the slice (ItemError.shifted). A
request whose client has gone leaves uncomputed, even half done. The pieces a request is
counted as read (the batcher's, once, in a thread) are also its usage on /v1/embeddings and
/v1/rerank; nothing is tokenised on the event loop, which would hold up every client.

With an API key (--api-key, or the environment's BERTFORGE_API_KEY) every request but
/health and /ready must send `Authorization: Bearer KEY`, else 401 (Auth). Each request is one line of
the access log on stderr (access_line: method, path, status, ms, texts, batch size; no body,
no header), unless --no-access-log.

Errors are answered, never re-raised (the connection stays usable), as JSON {"error": "..."};
on /v1/ as OpenAI's error object {"error": {"message", "type", "param", "code"}}, which its
client shows; on /v2/ as Cohere's {"id", "message"}. Headers over max_header_bytes answer 431
(uvicorn reads a header block up to max_body_bytes, so that the app answers it); a body over
max_body_bytes answers 413 as it arrives, before it is parsed; texts per request and characters per text over their limits
413; a full queue 503; a body that is not JSON 400, one not sent as JSON (its Content-Type) 415;
one of the wrong shape (a field it does not know too, but on /rerank, whose peer ignores one:
schemas.Strict; a null is a field's default), or an input the pipeline refuses (a
BertforgeError), 422; an unknown path 404, a wrong method 405; a client gone before its answer
is counted as 499.
Anything else is a bug: 500 {"error": "internal error: <Type>"} and one line in the server's
log. No answer shows a path of the server's: the model is named by its directory's name.

The package, by job (text-embeddings-inference's split: a core that knows no HTTP, a router):
limits.py (Limits, Access: no FastAPI needed to import them), batcher.py (the micro-batcher),
server.py (Server: the model, the checks, the batchers), metrics.py, errors.py (HTTPError and
the error answers), access.py (Auth, Guard, the access log), schemas.py (the request bodies),
routes.py (the endpoints) and app.py (create_app, serve). create_app and serve are imported on
first use: they need the serve extra.
"""

from __future__ import annotations

from typing import Any

from ..errors import need_extra
from .errors import SERVE_EXTRA
from .limits import API_KEY_ENV, Access, Limits

__all__ = ["API_KEY_ENV", "Access", "Limits", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    """create_app and serve, from app.py on first use: they need FastAPI, and without the serve
    extra say what to install (a ConfigError); the limits above need nothing of it."""
    if name not in ("create_app", "serve"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    need_extra("fastapi", SERVE_EXTRA)
    from . import app

    return getattr(app, name)
