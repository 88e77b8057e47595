"""Beyond one machine: a corpus embedded and indexed by a Ray cluster (the extra `ray`), exactly
once, into a directory index or PostgreSQL (`bertforge index MODEL CORPUS --out DIR --ray
[ADDRESS]`, `--to DSN --ray`; docs/distributed.md).

    import ray
    from bertforge.distributed import embed_dataset, index_corpus, index_dataset
    ds = ray.data.read_parquet("corpus/")                   # id and text columns
    vectors = embed_dataset(ds, "all-MiniLM-L6-v2")         # each row and its "vector"
    index_dataset(ds, "all-MiniLM-L6-v2", to="runs/idx")   # or to="postgresql://..."
    index_corpus("all-MiniLM-L6-v2", "corpus.jsonl", to="runs/idx")   # index --ray

What runs where. The driver (this process) loads the model once to record its identity (a
sha256 of config.json and the weights, and what else makes its vectors: search/identity.py),
starts the build as the one-process build does (build.json; or the tables and their record),
reads the documents in order and cuts them into chunks of IndexOptions.chunk. An actor pool of
workers, each holding one model (read once per actor from the driver's path on its own node,
refused unless its identity is the driver's), embeds a chunk at a time and writes it itself: a
directory's part (search.index.write_part: named by the chunk's number, each file atomic, its
sha256 last), or one PostgreSQL transaction (PgIndex.write: COPY, upsert by id). The driver
then joins the parts (BM25, the graph: the one-process build's own ending) or makes the HNSW
index. Texts pass through the driver, vectors never do; a directory's parts are written at the
driver's path of `to`, which every node must see (storage they share; on one machine, any).

Exactly once: a worker killed mid-chunk is restarted by Ray and the chunk run again (a part is
written whole again; a transaction rolled back is done again, the documents a committed one
wrote found and kept); a driver killed and run again resumes as the one-process build does
(whole parts kept, documents present with the same text skipped). The vectors are the ones a
single process gives: the same chunks, the same batches by the pipelines' token budget. Ray's
retries are bounded (TRIES, RESTARTS): a chunk that kills its worker every time stops the job
with one line naming it; run again, the job goes on from what is written.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BertforgeError, ConfigError, DataError, UnavailableError, need_extra
from .fileio import Span, atomic_path, line_spans, read_json, sole_writer, span_sha256, write_json
from .options import check_options, option
from .runner import progress_bar
from .search.corpus import DEFAULT_FORMAT, CorpusFormat, read_search_records
from .search.identity import model_mismatch
from .search.index import Index, write_part
from .search.options import IndexOptions, PgOptions
from .search.pgsql import is_dsn
from .search.windows import chunks

RAY_EXTRA = "a Ray cluster needs ray: pip install 'bertforge[ray]'"
IN_FLIGHT = 2  # chunks queued per worker: its next one is there when it finishes one
# Ray's retries, bounded: a chunk that kills its worker every time (a text too big for a node's
# memory, a crash in a native library), or a node where a worker dies as it starts, stops the
# job with one line (run again, it goes on from what is written) instead of being retried forever
TRIES = 4  # times a chunk is run (Ray's max_task_retries + 1)
RESTARTS = 8  # times Ray restarts a worker that died (max_restarts), over the whole job
NO_BERTFORGE = (
    "the Ray cluster's workers cannot import bertforge: install it on every node, in the Python "
    "the cluster runs (pip install 'bertforge[ray]'), or hand it to them in a runtime_env"
)


@dataclass(kw_only=True)
class RayOptions:
    """Where a job runs and how its workers are shaped: the cluster ("auto": $RAY_ADDRESS,
    else a cluster of this machine started for the job), how many workers (actors, one model
    each; default: as many as the cluster has room for) and what each one holds."""

    address: str | None = option(
        None,
        "embed and write on a Ray cluster's workers: at ADDRESS (host:port), or alone ($RAY_ADDRESS, else a "
        "cluster of this machine started for the job); docs/distributed.md",
        flag="--ray",
        metavar="ADDRESS",
        const="auto",
    )
    workers: int | None = option(
        None, "Ray workers, one model each (default: as many as the cluster has room for)", min=1
    )
    cpus_per_worker: float = option(1.0, "CPUs each Ray worker holds", above=0)
    gpus_per_worker: float = option(0.0, "GPUs each Ray worker holds (0: it runs on CPUs)", min=0)

    def __post_init__(self) -> None:
        check_options(self)
        if self.address is not None and not _ADDRESS.fullmatch(self.address):
            # --ray's value is optional: `--ray corpus.jsonl` takes the input as the address
            file = Path(self.address).exists()
            raise ConfigError(
                f"--ray {self.address}: {'a file, ' if file else ''}not a cluster address "
                "(HOST:PORT, ray://HOST:PORT or auto)"
                + (": put the input files before --ray" if file else "")
            )


# HOST:PORT, SCHEME://…, or auto / local (ray.init's own words)
_ADDRESS = re.compile(r"auto|local|[A-Za-z][A-Za-z0-9+.-]*://\S+|[^\s/:]*:\d+")


# -- the cluster -----------------------------------------------------------------------------------


def connect(address: str | None = "auto") -> tuple[Any, bool]:
    """(the `ray` module, whether this call connected it): the cluster this process is already
    in, else `address` ("auto" or None: $RAY_ADDRESS, else a new cluster of this machine). A
    cluster that cannot be reached: one UnavailableError."""
    import logging

    ray = need_extra("ray", RAY_EXTRA)
    if ray.is_initialized():
        return ray, False
    target = os.environ.get("RAY_ADDRESS") if address in (None, "auto") else address
    try:
        if target and "://" not in target:  # ray.init retries a dead address for minutes
            host, _, port = target.rpartition(":")
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
        ray.init(address=target or None, logging_level=logging.ERROR, log_to_driver=False)
    except (OSError, ValueError, RuntimeError) as e:
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnavailableError(
            f"the Ray cluster at {target or 'this machine'}: cannot connect ({said}); start one (ray start "
            "--head) or give its address (--ray HOST:PORT, or RAY_ADDRESS)"
        ) from None
    return ray, True


@contextmanager
def cluster(address: str | None = "auto") -> Iterator[Any]:
    """connect's `ray` for the block, disconnected after it where it connected."""
    ray, connected = connect(address)
    try:
        yield ray
    finally:
        if connected:
            ray.shutdown()


def _got(ray: Any, refs: Any, held: str = "while starting or loading its model") -> Any:
    """ray.get, a worker's failure as one bertforge error: its own (a bad row, a model not on
    its node), a worker that cannot import bertforge, or one that died for good (Ray's
    restarts and retries spent; `held`: what it was doing, for the message)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, BertforgeError):
            raise e.cause from None
        if "No module named 'bertforge'" in str(e):
            raise ConfigError(NO_BERTFORGE) from None
        raise
    except ray.exceptions.RayActorError as e:
        if "No module named 'bertforge'" in str(e):
            raise ConfigError(NO_BERTFORGE) from None
        said = str(e).strip().splitlines()[0]
        raise UnavailableError(
            f"a Ray worker died {held} and Ray gave up (a chunk is tried {TRIES} times, a worker "
            f"restarted {RESTARTS} times; a node short of memory, or a crash there?): the job "
            f"stops; run it again to go on from what is written. Ray said: {said}"
        ) from None


# -- the workers -----------------------------------------------------------------------------------


class PipelineWorker:
    """A Ray actor: one model, read at its first chunk (and again after Ray restarts it) from
    the driver's path on its own node, refused unless it is the model the build records
    (identity.model_mismatch: its sha256, its set-up, its precision)."""

    def __init__(self, record: Mapping[str, Any], pipeline: Mapping[str, Any]) -> None:
        self.record, self.pipeline = dict(record), dict(pipeline)
        self.loaded: Any = None
        self.table: Any = None  # a PostgreSQL job's PgIndex

    def check(self) -> str:
        """ "" where this worker's model is the build's; else why not, in one line."""
        try:
            self.pipe()
        except BertforgeError as e:
            return str(e)
        return ""

    def pipe(self) -> Any:
        if self.loaded is None:
            from .pipelines import Pipeline

            path, node = Path(self.record["model"]), socket.gethostname()
            if not (path / "config.json").is_file():
                raise ConfigError(
                    f"{path}: the model is not on the Ray node {node} (each worker reads it at "
                    "the driver's path: copy it there on every node, or onto storage they share)"
                )
            pipe = Pipeline(path, **self.pipeline)
            if differs := model_mismatch(pipe, self.record):
                raise ConfigError(
                    f"{path} on the Ray node {node}: not the driver's model ({'; '.join(differs)} "
                    "differ): every node needs the same model files"
                )
            self.loaded = pipe
        return self.loaded

    def part(self, part: str, docs: list[tuple[str, str]], first: int, cut: list) -> int:
        """A directory build's chunk written as its part (index.write_part): its windows."""
        return write_part(Path(part), self.pipe(), docs, first, (cut[0], cut[1], cut[2]))

    def rows(self, dsn: str, table: str, total: int, docs: list) -> dict[str, int]:
        """A PostgreSQL build's chunk upserted in one transaction (PgIndex.write): its counts."""
        from .search.postgres import PgIndex

        if self.table is None:
            index = PgIndex.create(dsn, table, self.record, total)
            index.adopt(self.pipe())  # the same record: checked by pipe() already
            self.table = index
        return self.table.write(docs, len(docs))

    def vectors(
        self, part: str, file: str, span: Span, sha256: str, read: dict, embed: dict
    ) -> int:
        """A piece of an input file read here (as `embed` reads it) and its texts written as one
        Parquet part (id, file, line, vector), whole or not at all (a retried piece writes it
        again): its rows. A piece whose bytes are not those the driver cut (`sha256`: the file
        changed since) is refused, so a part always holds the piece embed.json records."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .catalogue import ENTRIES
        from .inputs import read_inputs

        if span_sha256(file, span) != sha256:
            raise DataError(
                f"{file}: lines {span[1]}-{span[1] + span[2] - 1} changed while the job ran "
                "(not the bytes the driver cut into pieces): run the job again to embed them"
            )
        inputs = ENTRIES["embed"].inputs[:1]
        rows = read_inputs(file, inputs, read["skip_blank"], read["keep_tabs"], span=span)
        ids, lines, texts = _columns(rows, read["prefix"])
        # a piece of blank lines only (--skip-blank) still gets a part of the others' schema
        vectors = self.pipe().embed(texts or ["."], **embed)[: len(texts)]
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        table = pa.table(
            {
                "id": pa.array(ids, pa.string()),
                "file": pa.array([file] * len(ids), pa.string()),
                "line": pa.array(lines, pa.int64()),
                "vector": pa.FixedSizeListArray.from_arrays(
                    pa.array(vectors.reshape(-1)), vectors.shape[1]
                ),
            }
        )
        with atomic_path(part) as tmp:
            pq.write_table(table, tmp)
        return len(ids)

    def pid(self) -> int:
        return os.getpid()


def workers(ray: Any, r: RayOptions, record: Mapping[str, Any], o: IndexOptions) -> list[Any]:
    """The job's actor pool, each worker's model checked before any chunk is given out (one
    error for a node without the model, or with another); restarted by Ray when one dies, its
    chunk then run again."""
    room = _room(ray, r)
    n = r.workers or room
    if n > room:
        raise ConfigError(
            f"--workers {n}: the Ray cluster has room for {room} workers of "
            f"{r.cpus_per_worker:g} CPUs and {r.gpus_per_worker:g} GPUs each"
        )
    device = o.device or ("cuda" if r.gpus_per_worker else "cpu")
    pipeline = {"device": device, "precision": o.precision, "batch_size": o.batch_size}
    actor = ray.remote(PipelineWorker).options(
        num_cpus=r.cpus_per_worker,
        num_gpus=r.gpus_per_worker,
        max_restarts=RESTARTS,
        max_task_retries=TRIES - 1,
    )
    pool = [actor.remote(dict(record), pipeline) for _ in range(n)]
    try:
        for said in _got(ray, [w.check.remote() for w in pool]):
            if said:
                raise ConfigError(said)
    except BaseException:  # their CPUs and GPUs given back now, not when collected
        for worker in pool:
            ray.kill(worker)
        raise
    return pool


def _room(ray: Any, r: RayOptions) -> int:
    """How many workers of r's shape the cluster holds at once (at least 1: its first waits)."""
    have = ray.cluster_resources()
    fits = int(have.get("CPU", 0) // r.cpus_per_worker)
    if r.gpus_per_worker:
        fits = min(fits, int(have.get("GPU", 0) // r.gpus_per_worker))
        if not fits:
            raise ConfigError(
                f"--gpus-per-worker {r.gpus_per_worker:g}: the Ray cluster has no GPU "
                f"({have.get('GPU', 0):g})"
            )
    return max(1, fits)


def run_chunks(
    ray: Any,
    pool: list[Any],
    jobs: Iterable[tuple[str, tuple, int, str]],
    total: int,
    progress: bool,
    what: str = "index",
) -> list[Any]:
    """Each job (a worker's method, its arguments, its documents, what they are in words: a
    worker's death names them) run by the next free worker, IN_FLIGHT queued per worker (the
    driver reads ahead no further); their results, in the order they finished. Progress:
    documents of `total`, their rate and the time left."""
    bar = progress_bar(what, total, "doc" if what == "index" else "text") if progress else None
    free = [w for w in pool for _ in range(IN_FLIGHT)]
    pending: dict[Any, tuple[Any, int, str]] = {}
    results = []

    def take() -> None:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        worker, size, held = pending.pop(ref)
        results.append(_got(ray, ref, held))
        free.append(worker)
        if bar is not None:
            bar.update(size)

    try:
        for method, args, size, held in jobs:
            if not free:
                take()
            worker = free.pop()
            pending[getattr(worker, method).remote(*args)] = (worker, size, held)
        while pending:
            take()
    finally:
        if bar is not None:
            bar.close()
        for worker in pool:
            ray.kill(worker)
    return results


def _held(docs: list[Any], first: int, corpus: Path | str) -> str:
    """A chunk of documents in words: its ids and where they are, for a worker's death."""
    ids = f"ids {docs[0][0]}...{docs[-1][0]}"
    return f"holding documents {first + 1}-{first + len(docs)} of {corpus} ({ids})"


# -- indexing --------------------------------------------------------------------------------------


def index_corpus(
    model: str | Path,
    corpus: str | Path,
    to: str | Path,
    *,
    fmt: CorpusFormat = DEFAULT_FORMAT,
    ray: RayOptions | None = None,
    table: str = PgOptions.table,
    **options: Any,
) -> Any:
    """`bertforge index MODEL CORPUS --out DIR --ray`, or `--to DSN --ray`: the corpus file
    indexed by a Ray cluster's workers into the directory `to` (an Index, equal to
    Index.build's) or PostgreSQL (`to` a DSN, table `table`: a PgIndex, as PgIndex.build
    leaves it); `options`: IndexOptions'. Resumes as the one-process build does."""
    corpus = Path(corpus)
    records = lambda: read_search_records(corpus, fmt, refuse_nul=is_dsn(to))  # noqa: E731
    count = lambda: sum(1 for _ in records())  # noqa: E731
    return _index(model, corpus, records, count, to, fmt, ray or RayOptions(), table, options)


def index_dataset(
    ds: Any,
    model: str | Path,
    to: str | Path,
    *,
    id_column: str = "id",
    text_column: str = "text",
    ray: RayOptions | None = None,
    table: str = PgOptions.table,
    **options: Any,
) -> Any:
    """A Ray Dataset's rows (`id_column`, `text_column`; the other columns: a PostgreSQL
    document's metadata) indexed as index_corpus indexes a file, the rows read in the
    Dataset's order (counted first: the Dataset runs twice)."""
    fmt = CorpusFormat(id_field=id_column, text_field=text_column)
    name = f"a Ray Dataset ({id_column}, {text_column})"
    records = lambda: dataset_records(ds, id_column, text_column)  # noqa: E731
    return _index(model, name, records, ds.count, to, fmt, ray or RayOptions(), table, options)


def dataset_records(
    ds: Any, id_column: str, text_column: str
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(id, text, metadata) of each row of a Ray Dataset, in its order; a row without the id
    or a text, or an id seen before: one DataError naming the row and column."""
    ctx = need_extra("ray", RAY_EXTRA).data.DataContext.get_current()
    before, ctx.execution_options.preserve_order = ctx.execution_options.preserve_order, True
    seen: set[str] = set()
    try:
        for n, row in enumerate(ds.iter_rows()):
            doc_id, text = row.get(id_column), row.get(text_column)
            if doc_id is None or not isinstance(text, str) or not text.strip():
                bad = id_column if doc_id is None else text_column
                raise DataError(f"the Ray Dataset: row {n}: column {bad!r}: missing or empty")
            doc_id = str(doc_id)
            if doc_id in seen:
                raise DataError(f"the Ray Dataset: row {n}: id {doc_id!r} repeats")
            seen.add(doc_id)
            other = {k: _plain(v) for k, v in row.items() if k not in (id_column, text_column)}
            yield doc_id, text, other
    finally:
        ctx.execution_options.preserve_order = before


def _plain(value: Any) -> Any:
    """A Dataset's value as JSON holds it (numpy scalars and arrays as Python's)."""
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value


def _index(
    model: str | Path,
    corpus: Path | str,
    records: Callable[[], Iterator[tuple[str, str, dict[str, Any]]]],
    count: Callable[[], int],
    to: str | Path,
    fmt: CorpusFormat,
    r: RayOptions,
    table: str,
    options: dict[str, Any],
) -> Any:
    """index_corpus and index_dataset: the build begun on the driver, its chunks written by
    the workers, ended on the driver."""
    need_extra("ray", RAY_EXTRA)
    if is_dsn(to):
        return _index_postgres(model, corpus, records, count, str(to), r, table, options)
    file = isinstance(corpus, Path)
    # a cluster not there: said before anything is written; another build on `to`: refused
    with cluster(r.address) as ray, sole_writer(to, "index build"):
        build = Index.begin(model, corpus, to, fmt=fmt, count=None if file else count, **options)
        chunk, cut = build.options.chunk, list(build.cut)

        def jobs() -> Iterator[tuple[str, tuple, int, str]]:
            first = 0
            docs = ((i, t) for i, t, _ in records())
            for k, part in enumerate(chunks(docs, chunk)):
                args = (str(build.part(k).resolve()), part, first, cut)
                yield "part", args, len(part), _held(part, first, corpus)
                first += len(part)

        pool = workers(ray, r, build.settings, build.options)
        done = run_chunks(ray, pool, jobs(), build.documents, build.options.progress)
        return build.finish(len(done), build.documents)


def _index_postgres(
    model: str | Path,
    corpus: Path | str,
    records: Callable[[], Iterator[tuple[str, str, dict[str, Any]]]],
    count: Callable[[], int],
    dsn: str,
    r: RayOptions,
    table: str,
    options: dict[str, Any],
) -> Any:
    """The PostgreSQL side of _index: each chunk one worker's transaction, PgIndex.write's
    counts summed, the HNSW index made and the build recorded finished by the driver."""
    from .search.postgres import PgIndex

    o = IndexOptions(**options)
    with cluster(r.address) as ray:
        index, total = PgIndex.begin(model, corpus, dsn, table, o, count)
        jobs = (
            (
                "rows",
                (index.db.dsn, table, total, docs),
                len(docs),
                _held(docs, k * o.chunk, corpus),
            )
            for k, docs in enumerate(chunks(records(), o.chunk))
        )
        pool = workers(ray, r, index.meta, o)
        done = run_chunks(ray, pool, jobs, total, o.progress)
    index.written = {k: sum(d[k] for d in done) for k in ("new", "changed", "relabelled", "kept")}
    index.make_hnsw()
    index.finish()
    return index


# -- embedding -------------------------------------------------------------------------------------


class Embedder:
    """Ray Data's callable class (map_batches over an actor pool): a PipelineWorker's model,
    each batch's `column` embedded into a "vector" column beside the batch's own."""

    def __init__(
        self,
        record: Mapping[str, Any],
        pipeline: Mapping[str, Any],
        column: str,
        embed: Mapping[str, Any],
        precision: str,
    ) -> None:
        self.worker = PipelineWorker(record, pipeline)
        self.worker.pipe()  # a model missing or other on this node: its actor fails to start
        self.column, self.embed, self.precision = column, dict(embed), precision

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .embedding import quantize

        if self.column not in batch:
            raise DataError(f"the Ray Dataset has no column {self.column!r} (column=...)")
        texts = [str(t) for t in batch[self.column]]
        vectors = self.worker.pipe().embed(texts, **self.embed).astype(np.float32)
        return {**batch, "vector": quantize(vectors, self.precision)}


def embed_dataset(
    ds: Any,
    model: str | Path,
    column: str = "text",
    *,
    ray: RayOptions | None = None,
    rows_per_batch: int = 1024,
    prompt_name: str | None = None,
    prompt: str | None = None,
    dimensions: int | None = None,
    embedding_precision: str = "float32",
    precision: str = "auto",
    batch_size: int | None = None,
    device: str | None = None,
) -> Any:
    """A Ray Dataset of `ds`'s rows with a "vector" column: `column`'s texts embedded by an
    actor pool of `model`'s pipelines (Pipeline.embed: its token-budget batches, `batch_size`
    texts at most; `rows_per_batch` rows handed to a worker at a time), as Pipeline.embed gives
    them (prompt_name, prompt, dimensions), float32 or packed bits (embedding_precision binary
    or ubinary; int8 buckets need the whole corpus's ranges: an index computes them). Lazy, as
    Ray Datasets are: write it out (write_parquet) or iterate it. The workers are r.workers
    actors (default: as many as the cluster has room for), each checked to hold the driver's
    model."""
    from .embedding import EMBEDDING_PRECISIONS
    from .errors import check_choice
    from .pipelines import Pipeline
    from .search.identity import model_record

    r = ray or RayOptions()
    check_choice("embedding_precision", embedding_precision, EMBEDDING_PRECISIONS)
    if embedding_precision.endswith("int8"):
        raise ConfigError(
            f"embedding_precision={embedding_precision}: its buckets come from the whole "
            "corpus's vectors; embed float32 and quantise them together, or build an index"
        )
    driver = Pipeline(model, device=device, precision=precision, batch_size=batch_size)
    record = {**model_record(driver), "precision": precision}
    n = r.workers or _room(connect(r.address)[0], r)  # stays connected: ds runs there
    pipeline = {
        "device": device or ("cuda" if r.gpus_per_worker else "cpu"),
        "precision": precision,
        "batch_size": batch_size,
    }
    embed = {"prompt_name": prompt_name, "prompt": prompt, "dimensions": dimensions}
    driver.embed(["a check of the options"], **embed)  # a bad prompt or size: an error now
    return ds.map_batches(
        Embedder,
        fn_constructor_kwargs={
            "record": record,
            "pipeline": pipeline,
            "column": column,
            "embed": embed,
            "precision": embedding_precision,
        },
        batch_size=rows_per_batch,
        batch_format="numpy",
        concurrency=n,
        num_cpus=r.cpus_per_worker,
        num_gpus=r.gpus_per_worker,
    )


# -- embedding files -------------------------------------------------------------------------------

EMBED_RECORD = "embed.json"  # what an embed --ray directory holds: model, input, chunks, done
PART = "part-{:05d}-{:05d}.parquet"  # an input file's number, its piece's


def embed_file(
    model: str | Path,
    inputs: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    ray: RayOptions | None = None,
    chunk: int = 1024,
    skip_blank: bool = False,
    keep_tabs: bool = False,
    progress: bool = True,
    precision: str = "auto",
    batch_size: int | None = None,
    device: str | None = None,
    **embed: Any,
) -> Path:
    """`bertforge embed MODEL FILES --ray --out DIR`: the texts of the files (lines, or JSONL
    with "text" and an optional "id"; directories and glob patterns expanded) embedded by a Ray
    cluster's workers into the directory `out`. The driver only cuts each file into pieces of
    `chunk` lines (fileio.line_spans, no decoding); each worker reads its piece as `embed`
    reads a file and writes it as one Parquet part (part-FFFFF-PPPPP.parquet: id, file, line,
    vector as float32), whole (a piece retried after a worker died writes its part again).
    Ids: a JSONL row's own, else its line number (with several files, FILE:LINE). embed.json
    records the model, the inputs and each piece's sha256: run again, a finished directory is
    left as it is and an unfinished one goes on from its missing parts; a piece whose bytes
    changed since (a bad line put right) is redone, the others kept; a directory of another
    model, input files or chunking is refused. The
    vectors are Pipeline.embed's, `embed` its options (pooling, normalize, prompt_name,
    prompt, dimensions)."""
    from .data.corpus import expand_inputs
    from .pipelines import Pipeline
    from .search.identity import model_record

    need_extra("pyarrow", RAY_EXTRA)
    given = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    if "-" in map(str, given):
        raise ConfigError("embed --ray reads files (its workers read them), not stdin")
    if chunk < 1:
        raise ConfigError(f"chunk={chunk} (--chunk): must be >= 1")
    files = [str(f) for f in expand_inputs(given)]
    r, out = ray or RayOptions(), Path(out)
    driver = Pipeline(model, device=device, precision=precision, batch_size=batch_size)
    driver.embed(["a check of the options"], **embed)  # a bad prompt or size: an error now
    record = {**model_record(driver), "precision": precision}
    pieces: list[list[str]] = [[] for _ in files]  # each piece's sha256, in the cutting pass
    spans = [line_spans(f, chunk, pieces[k]) for k, f in enumerate(files)]
    wanted = {
        "model": record,
        "input": [str(Path(f).resolve()) for f in files],
        "chunk": chunk,
        "embed": embed,
        "pieces": pieces,
    }
    read = {"skip_blank": skip_blank, "keep_tabs": keep_tabs}
    # a cluster not there: said before anything is written; another driver on `out`: refused
    with cluster(r.address) as ray_, sole_writer(out, "embed --ray job"):
        if _embed_begin(out, wanted):
            return out  # done before: nothing to run
        left = [
            ((out / PART.format(k, p)), f, span, pieces[k][p])
            for k, f in enumerate(files)
            for p, span in enumerate(spans[k])
            if not (out / PART.format(k, p)).is_file()  # a re-run: the rest
        ]
        several = len(files) > 1  # a text line's id: FILE:LINE, not a line number of many files
        jobs = (
            (
                "vectors",
                (str(part), f, span, sha, {**read, "prefix": f"{f}:" * several}, embed),
                span[2],
                f"holding lines {span[1]}-{span[1] + span[2] - 1} of {f}",
            )
            for part, f, span, sha in left
        )
        o = IndexOptions(device=device, precision=precision, batch_size=batch_size)
        pool = workers(ray_, r, record, o)
        run_chunks(ray_, pool, jobs, sum(s[2] for _, _, s, _ in left), progress, what="embed")
        parts = [PART.format(k, p) for k in range(len(files)) for p in range(len(spans[k]))]
        _embed_end(out, wanted, parts)
    return out


def _columns(rows: list[Any], prefix: str) -> tuple[list[str], list[int], list[str]]:
    """(ids: a JSONL row's own, else prefix + its line number; lines; texts) of InputLines."""
    return (
        [f"{prefix}{r.line}" if r.id is None else str(r.id) for r in rows],
        [r.line for r in rows],
        [r.texts[0] for r in rows],
    )


def _embed_begin(out: Path, wanted: dict[str, Any]) -> bool:
    """An embed job into `out` begun (embed.json written unfinished) or taken up again (the
    same model, inputs, chunking and options; its written parts kept, but those of pieces
    whose bytes changed since, or that the input no longer has: a bad line put right, lines
    edited); True when it had finished and nothing changed."""
    record = out / EMBED_RECORD
    if record.is_file():
        had = read_json(record, ConfigError)
        differs = [k for k in wanted if k != "pieces" and had.get(k) != wanted[k]]
        if differs:
            raise ConfigError(
                f"--out {out}: holds the embeddings of another job ({', '.join(differs)} "
                "differ): remove it or give another directory"
            )
        if had.get("pieces") == wanted["pieces"]:
            return bool(had.get("finished"))
        old, new = _piece_sha256(had.get("pieces") or []), _piece_sha256(wanted["pieces"])
        for part in out.iterdir():  # removed before the record says otherwise
            named = re.fullmatch(r"part-(\d+)-(\d+)\.parquet", part.name)
            key = named and (int(named[1]), int(named[2]))
            if key and (key not in new or old.get(key) != new[key]):
                part.unlink()
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"--out {out}: {'not a directory' if not out.is_dir() else 'a directory of other files'}; "
            "embed --ray writes a directory of Parquet parts and embed.json: give a new one"
        )
    write_json(record, {**wanted, "finished": False})
    return False


def _piece_sha256(pieces: list[list[str]]) -> dict[tuple[int, int], str]:
    """embed.json's "pieces" (each input file's pieces' sha256) by (file, piece): a part's key."""
    return {(k, p): sha for k, shas in enumerate(pieces) for p, sha in enumerate(shas)}


def _embed_end(out: Path, wanted: dict[str, Any], parts: list[str]) -> None:
    """embed.json marked finished, with the parts and the texts they hold (read from the
    parts' footers: a resumed job's earlier parts counted too)."""
    import pyarrow.parquet as pq

    texts = sum(pq.read_metadata(out / p).num_rows for p in parts)
    write_json(
        out / EMBED_RECORD, {**wanted, "parts": len(parts), "texts": texts, "finished": True}
    )
