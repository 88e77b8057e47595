"""What the endpoints share (Server): the pipeline and its model, loaded and checked at start-up;
the limits and the checks of a request's inputs against them; how each pipeline reads its
inputs, in pieces (the batchers' costs); one batcher per endpoint; a message cleaned of the
server's paths. No web framework: a request is read only for its notes and its disconnect."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import embedding
from ..catalogue import ENTRIES, Entry
from ..data.tasks import SquadExample
from ..data.tasks.documents import document
from ..errors import ConfigError
from ..model import BertModel
from ..modeldir import ModelDir
from ..pipelines import Pipeline
from ..tasks.squad import pieces_read as squad_pieces
from .access import note
from .batcher import Batcher, Cost
from .errors import HTTPError
from .limits import Limits
from .metrics import Metrics

RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")  # served with a cross-encoder


def available(model: str | Path | ModelDir) -> list[str]:
    """The served pipelines this checkpoint supports (embed always; the rest by its head)."""
    source = ModelDir.open(model)
    found, labels = source.architectures, source.config.num_labels
    return [e.name for e in ENTRIES.values() if e.served and e.available(found, labels)]


class Server:
    """What the endpoints share: the pipeline, the limits, the metrics, one batcher per
    endpoint (and per set of inputs given), and the piece counts they batch by."""

    def __init__(self, model: str | Path, limits: Limits, pipeline_options: dict[str, Any]) -> None:
        self.model, self.limits, self.metrics = model, limits, Metrics()
        self.pipeline_options = pipeline_options
        # the directory read once: the pipeline and the endpoints' checks share what is read
        self.pipe = Pipeline(ModelDir.open(model), batch_size=limits.max_batch, **pipeline_options)
        self.reranker: Pipeline | None = None  # /search's cross-encoder (use_reranker)
        self.endpoints = available(self.pipe.source)
        # what a request would load, loaded now: a corrupt checkpoint stops `serve` here with
        # its CheckpointError instead of answering every request with it; heads first, so the
        # encoder alone is a head's (Pipeline.model): the weights read and kept once
        for name in sorted(self.endpoints, key=lambda n: ENTRIES[n].model is BertModel):
            self.pipe.model_for(name)
        self.width = self.pipe.config.hidden_size * len(self.pipe.embedding_settings.pooling)
        self.calibration: np.ndarray | None = None  # int8/uint8 embeddings' buckets (--calibration)
        self.name = Path(str(model)).resolve().name  # answers name the model, never its path
        self.paths: dict[str, str] = {}  # a path of a model's: its name in answers (scrub)
        self.name_paths(model, self.pipe)
        self.batchers: dict[str, Batcher] = {}
        if "qa" in self.endpoints and self.pipe.truncate:  # refused, not ignored: see defaults
            raise ConfigError(
                f"truncate: {ENTRIES['qa'].unused['truncate']}: serve {self.name} without it "
                "(it has a question-answering head, served as /qa)"
            )

    def use_reranker(self, model: str | Path) -> None:
        """/search's cross-encoder (--rerank-model), loaded and checked now: the served model
        when it is that directory (loaded once; /search's pairs share the rerank endpoints'
        batcher), else another beside it with the server's pipeline options."""
        source, name = ModelDir.open(model), Path(str(model)).resolve().name
        local = source.path
        if "rerank" not in available(source):
            entry = ENTRIES["rerank"]
            raise ConfigError(
                f"rerank_model (--rerank-model): {name}: no {entry.needs} "
                f"({entry.architectures[0]} of 1 label): {entry.remedy}"
            )
        if local.resolve() == self.pipe.path.resolve():
            self.reranker = self.pipe
            return
        pipe = Pipeline(source, batch_size=self.limits.max_batch, **self.pipeline_options)
        pipe.model_for("rerank")  # a corrupt checkpoint stops `serve` here
        self.name_paths(model, pipe)
        self.reranker = pipe

    def name_paths(self, model: str | Path, pipe: Pipeline) -> None:
        """A loaded model's paths, to be shown as its directory's name (scrub)."""
        given = (Path(str(model)).resolve(), pipe.path, pipe.path.resolve())
        name = Path(str(model)).resolve().name
        self.paths |= {str(p): name for p in given if p.is_absolute()}

    def defaults(self, entry: Entry) -> dict[str, Any]:
        """The entry's options whose default is the server's, not its Pipeline method's: /qa's
        windows are the pipeline's max_length pieces (at most the model's positions) and its
        stride apart when create_app was given them, as every other endpoint's windows are (a
        request's own max_seq_length and doc_stride still win). Its truncate cannot be: qa
        reads every window of a context, and a model with a QA head is not served with it."""
        pipe = self.pipe
        if entry.name != "qa":
            return {}
        positions = pipe.config.max_tokens
        given = {
            "max_seq_length": None if pipe.max_length is None else min(pipe.max_length, positions),
            "doc_stride": pipe.stride,
        }
        return {name: value for name, value in given.items() if value is not None}

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
        for path in sorted(self.paths, key=len, reverse=True):  # a parent would leave its tail
            message = message.replace(path, self.paths[path])
        return message

    def check(self, texts: list[Any], what: str = "texts") -> None:
        """An input list within the limits (else 422 / 413 naming the field and item), checked
        before its pieces are counted. Piece ids are checked to be in the vocabulary as they
        are counted (the pipeline's own check, Pipeline.windows), in the batcher's thread: a
        loop over 64 x 10,000 ids here would hold up every client."""
        limits = self.limits
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

    def check_answers(self, texts: list[Any], top_k: int) -> None:
        """fill-mask's answer, top_k tokens for each [MASK], within max_request_tokens answers
        (else 413): 64 texts of 2,000 masks at top_k 30,000 would be 4 billion."""
        token, mask = self.pipe.tok.specials.mask, self.pipe.tok.mask_id
        masks = sum(t.count(token) if isinstance(t, str) else list(t).count(mask) for t in texts)
        limit = self.limits.max_request_tokens
        if masks * max(int(top_k), 0) > limit:
            raise HTTPError(
                413,
                f"top_k: {masks:,} [MASK] x top_k {top_k:,} = {masks * top_k:,} answers, more "
                f"than the limit of {limit:,} per request (max_request_tokens)",
                "top_k",
            )

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
        spent: int = 0,
    ) -> tuple[list[Any], int]:
        """The rows of a request's items from the batcher `key` (made with `run`, its items
        read as `cost` says), and the pieces they were read as (a request's usage: counted
        once, by the batcher), noting for the access log how many items it had and the model
        call's batch size they ran in (each row comes back from the worker beside that size);
        `field`: the request's field a 413 names; `spent`: pieces the request has had read
        already (a reranked search's first stage), counted against its limit too."""

        def sized(batch: list[Any], o: dict[str, Any]) -> list[tuple[Any, int]]:
            return [(row, len(batch)) for row in run(batch, o)]

        note(request, texts=len(items))
        b = self.batcher(key, sized, cost)
        costs = await b.read(items, options, field, spent)
        gone = functools.partial(client_gone, request)
        rows = await b.submit(items, options, gone, field, costs)
        note(request, batch=max((n for _, n in rows), default=None))
        return [row for row, _ in rows], sum(costs)

    @staticmethod
    def windows_read(pipe: Pipeline, max_length: int | None = None) -> Cost:
        """Pieces each text (or list of piece ids) is read as: the rows of its windows, as
        `pipe` lays them out (Pipeline.windows: embed, classify, ner)."""

        def cost(items: list[Any], options: dict[str, Any]) -> list[int]:
            _, features, windows = pipe.windows(items, max_length, views=False)
            read = np.bincount(windows.text, weights=features.lengths, minlength=len(items))
            return read.astype(np.int64).tolist()

        return cost

    @staticmethod
    def pairs_read(pipe: Pipeline) -> Cost:
        """Pieces each (query, document) pair is read as by the cross-encoder `pipe`: every
        window of a long document beside the query, [CLS] and two [SEP] each."""

        def cost(items: list[Any], options: dict[str, Any]) -> list[int]:
            queries, documents = [x[0] for x in items], [x[1] for x in items]
            features, owners = pipe.pair_rows(queries, documents, options.get("truncate"))
            out = [0] * len(items)
            for k, length in zip(owners, features.lengths.tolist()):
                out[int(k)] += length
            return out

        return cost

    def reading(self, entry: Entry, given: int) -> Cost:
        """How one of the catalogue's pipelines reads its inputs (of `given` columns): rerank
        and qa a long document or context in windows beside the query or question; fill-mask,
        nsp and classify's pairs one row each, cut to the model's length; summarize each
        sentence of a document; the rest windows."""
        pipe = self.pipe

        def squad(items: list[Any], options: dict[str, Any]) -> list[int]:
            examples = [SquadExample(str(i), q, c, [], False, "") for i, (q, c) in enumerate(items)]
            qa = pipe.qa_options(**options)  # checked before any work: a stride of 0 never ends
            window = {
                k: getattr(qa, k) for k in ("max_seq_length", "doc_stride", "max_query_length")
            }
            return squad_pieces(examples, pipe.tok, **window)

        def cut(items: list[Any], options: dict[str, Any]) -> list[int]:
            columns = list(zip(*items))
            encoded = pipe.encode(list(columns[0]), list(columns[1]) if given > 1 else None)
            return [len(e.ids) for e in encoded]

        if entry.name == "rerank":
            return self.pairs_read(pipe)
        if entry.name == "qa":
            return squad
        if given > 1 or entry.name == "fill-mask":
            return cut
        windows = self.windows_read(pipe)

        def sentences(items: list[Any], options: dict[str, Any]) -> list[int]:
            docs = [document(x[0]).sentences for x in items]  # a sentence is a row of its own
            flat = [s for d in docs for s in d]
            read = np.cumsum([0, *(windows(flat, options) if flat else [])])
            ends = np.cumsum([0, *map(len, docs)])
            return (read[ends[1:]] - read[ends[:-1]]).tolist()

        if entry.name == "summarize":
            return sentences
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
        if entry.name == "fill-mask":
            self.check_answers(columns["texts"], options["top_k"])
        items, cost = list(zip(*columns.values())), self.reading(entry, len(given))
        rows, _ = await self.submit(
            f"{entry.name}:{key}", run, items, options, request, cost, first
        )
        return rows

    async def scores(
        self,
        query: str,
        texts: list[str],
        field: str,
        options: dict[str, Any],
        request: Any,
        pieces: int | None = None,
    ) -> tuple[list[float], int]:
        """A cross-encoder's scores of (query, text) for each text, in the batcher that the
        three rerank endpoints share, and the pieces the model read for them (every window of
        a long text beside the query, [CLS] and two [SEP]); `pieces`: each text cut after its
        first pieces (Cohere's max_tokens_per_doc). The query and each text are tokenised
        once, in a thread (the event loop serves the other clients meanwhile): their piece
        ids are the batcher's items, read as they are by its cost and by the model call."""
        self.need(ENTRIES["rerank"])
        self.check([query], "query")
        self.check(texts, field)
        query_ids, *ids = await asyncio.to_thread(self.pipe.piece_ids, [query, *texts])
        items = [(query_ids, d[:pieces]) for d in ids]
        return await self.pair_scores(self.pipe, items, options, request, field)

    async def pair_scores(
        self,
        pipe: Pipeline,
        items: list[tuple[Any, Any]],
        options: dict[str, Any],
        request: Any,
        field: str,
        spent: int = 0,
    ) -> tuple[list[float], int]:
        """The cross-encoder `pipe`'s scores of (query, document) pairs given as piece ids,
        and the pieces it read for them, batched with other requests' pairs: the served
        model's in the rerank endpoints' batcher, /search's own reranker's in one of its own;
        `spent`: pieces the request has had read already (Server.submit)."""
        entry = ENTRIES["rerank"]

        def run(items: list[tuple[Any, Any]], options: dict[str, Any]) -> list[Any]:
            inputs = {"queries": [q for q, _ in items], "documents": [d for _, d in items]}
            return entry.run(pipe, inputs, options)

        key, cost = ("rerank" if pipe is self.pipe else "search:rerank"), self.pairs_read(pipe)
        return await self.submit(key, run, items, options, request, cost, field, spent)


async def client_gone(request: Any) -> None:
    """Returns once the client has closed its connection: with the body read, the server's
    next message is http.disconnect (uvicorn's comes when the socket closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
