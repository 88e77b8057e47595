"""The PostgreSQL backend: an index's documents, windows and vectors in PostgreSQL with pgvector,
changed in place and searched there (`bertforge index MODEL CORPUS --to DSN --table T`, `index
MODEL --to DSN --table T --delete IDS`, `search DSN QUERIES --table T`, `serve MODEL --index
DSN`). The same Index interface as the directory backend (index.py): the same windows, model
identity, fusion and reranking; what it adds is change in place, metadata filters, and a corpus
that many processes read and that outgrows one machine's memory.

    index = PgIndex.build("all-MiniLM-L6-v2", "corpus.jsonl", "postgresql://me@db/search")
    index = PgIndex.open("postgresql://me@db/search", PgOptions(table="bertforge"))
    index.search(["who wrote hamlet"], top_k=10, mode="hybrid", where={"lang": "en"})
    index.delete(["d7"])

Tables (pgsql.py: T a checked identifier, every value a bound parameter):
    T          id (primary key), n (the document's number: what fusion ranks), text, metadata
               (jsonb: the corpus's other fields), text_sha256, tsv (the text's English
               tsvector, generated, GIN-indexed)
    T_windows  id (deleted with its document), w, span_start, span_end (the window's
               characters), embedding: vector(dim), or halfvec(dim) where pgvector (0.7+) has
               it; an HNSW index, cosine for a model that normalises, else inner product
    T_index    the model's record, the settings a directory's index.json holds (its sha256
               identity, prompts, windows), checked when opened and at every search; and the
               first build's state ('build': unfinished until its end: searches refuse the
               table until then, unless PgOptions.partial)

Writing reads the corpus a chunk (IndexOptions.chunk documents) at a time, so memory is bounded
by a chunk: a document already there with the same text is kept (its metadata updated if it
changed), one whose text changed is embedded again, a new one embedded; each chunk is written in
one transaction (documents by COPY, windows by binary COPY), so a killed build keeps whole
chunks and, run again, skips the documents present; a concurrent search, which reads its
ranking, texts and passages in one snapshot (PgIndex.snapshot), sees each document old or new,
never half. Documents the corpus no longer has stay: `delete` removes them. The HNSW
index is made when absent, after the rows (faster than growing it row by row).

Dense search looks at the 4 k nearest windows through the HNSW graph (ef_search at least), each
document scored by its best among them, as the directory's approximate search does; `exact`
scores every window (each document's best, as the directory's exact search). Full text is
PostgreSQL's: ts_rank of the text's tsvector against the query's English words, any of them
matching (mode "bm25": the text-search list, not BM25). Hybrid fuses the two top-100 lists
(top-k where k is larger; fusion.py). `where` keeps documents whose metadata field equals the
value (as text). Where the graph's candidates hold fewer than k documents (pgvector before 0.8
filters them after the scan: a filter that keeps few documents keeps few of them), dense search
scans the windows of every document the filter keeps instead, when they are at most
EXACT_FALLBACK: the top k of the matching documents, at the cost of an exact search over them;
where they are more, the graph's answer stands, so no request forces a scan of the table
(PgIndex.dense).
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError, check_choice
from ..runner import progress_bar
from .corpus import DEFAULT_FORMAT, CorpusFormat, read_search_records
from .fusion import FUSED, FUSIONS, fuse_runs
from .identity import build_start, model_differences, model_mismatch, query_pipeline
from .options import EF_SEARCH_MAX, MODES, FirstStage, IndexOptions, PgOptions, SearchOptions
from .pgsql import (
    COPY_HEADER,
    COPY_TRAILER,
    Database,
    is_dsn,
    names,
    sql,
    vector_text,
    window_rows,
)
from .windows import chunks, cut_windows, embedded_windows

__all__ = ["PgIndex", "is_dsn"]

FORMAT = 1
HNSW = "WITH (m = 16, ef_construction = 64)"  # pgvector's defaults, written down
HALFVEC = (0, 7)  # the pgvector version that has halfvec
# windows dense search may score exactly, a query, where the graph's candidates fall short (a
# filter's few documents, a top k beyond them): above it, the graph's answer (PgIndex.dense)
EXACT_FALLBACK = 50_000
READY_TIMEOUT = 2.0  # seconds a readiness check waits for a connection (a probe's answer)
ABSENT_SHOWN = 5  # ids not there that a delete names (then: how many more)
# the record's settings a later build must share besides its model (identity.model_differences;
# the model's path and name may move)
_BOUND = (
    "format", "document_prompt", "query_prompt", "window", "stride", "precision", "dimensions",
    "metric",
)  # fmt: skip
_OPS = {"cosine": "<=>", "inner_product": "<#>"}  # pgvector's distance of each metric
# the query's English words, any of them (plainto_tsquery's 'a' & 'b' made 'a' | 'b')
_ANY_WORD = "replace(plainto_tsquery('english', %(text)s)::text, %(all)s, %(any)s)::tsquery"
_ANY_ARGS = {"all": "' & '", "any": "' | '"}
_SCORE = {  # the score of a window: the inner product either way (vectors of norm 1: cosine)
    "cosine": "1 - ({col} <=> %(q)s::{vtype})",
    "inner_product": "({col} <#> %(q)s::{vtype}) * -1",
}


class PgIndex:
    """An index in PostgreSQL (see the module docstring)."""

    def __init__(self, db: Database, pg: PgOptions, meta: dict[str, Any]) -> None:
        self.db, self.pg, self.meta = db, pg, meta
        self.names = names(pg.table)
        self.path = f"{db.shown} table {pg.table}"  # what messages name
        self.query_prompt: str | None = meta.get("query_prompt")
        self.written: dict[str, int] = {}  # the last write's counts: new, changed, ...
        self.absent: tuple[int, list[str]] = (0, [])  # the last delete's ids not there
        self.update_note: str | None = None  # an update not ended, when last checked
        self._pipe: Any = None
        self._local = threading.local()  # this thread's snapshot, while one is open

    # -- opening and building ------------------------------------------------------------------

    @classmethod
    def open(cls, dsn: str | None, pg: PgOptions | None = None, pool: int = 1) -> PgIndex:
        """The index in table pg.table of the database at `dsn` (pgsql.resolve_dsn: or the
        environment's), through a pool of `pool` connections."""
        pg = pg or PgOptions()
        t = names(pg.table)  # checked before connecting
        db = Database(dsn, pool, timeout=pg.statement_timeout)
        try:
            with db.connection("reading the index's record") as conn:
                index = cls(db, pg, _record(conn, t, f"{db.shown} table {pg.table}"))
                index._finished(conn, warn=True)
        except BaseException:
            db.close()
            raise
        return index

    @classmethod
    def build(
        cls,
        model: str | Path,
        corpus: str | Path,
        dsn: str | None,
        *,
        table: str = PgOptions.table,
        fmt: CorpusFormat = DEFAULT_FORMAT,
        **options: Any,
    ) -> PgIndex:
        """Index `corpus` into table `table` of the database at `dsn` with the bi-encoder
        `model`, or bring the table up to date with it (see the module docstring); `options`:
        IndexOptions' (chunk, window, stride, prompt_name, prompt, batch_size, precision,
        device, progress; a directory's bm25, approximate and embedding_precision are not
        this backend's)."""
        o = IndexOptions(**options)
        corpus = Path(corpus)
        read = partial(read_search_records, corpus, fmt, refuse_nul=True)  # no NUL: PostgreSQL's
        index, total = cls.begin(model, corpus, dsn, table, o, lambda: sum(1 for _ in read()))
        index.written = index.write(read(), o.chunk, o.progress, total)
        index.make_hnsw()
        index.finish()
        return index

    @classmethod
    def begin(
        cls,
        model: str | Path,
        corpus: Path | str,
        dsn: str | None,
        table: str,
        o: IndexOptions,
        count: Callable[[], int],
    ) -> tuple[PgIndex, int]:
        """build's first half: the model loaded and checked (identity.build_start: `corpus` a
        file, or the name of documents read elsewhere, `count()` counting them), the tables
        made or checked to hold the same model's and settings' index; (the index, with the
        model as its pipeline, and how many documents the build reads)."""
        _refuse_directory_options(o)
        names(table)  # checked before the model loads
        pipe, record, total = build_start(model, corpus, o, count)
        settings = {
            "format": FORMAT,
            **record,
            "precision": o.precision,
            "dimensions": int(pipe.embed(["dimensions"]).shape[1]),
            "metric": "cosine" if pipe.embedding_settings.normalize else "inner_product",
        }
        index = cls.create(dsn, table, settings, total)
        index._pipe = pipe
        return index, total

    @classmethod
    def create(
        cls, dsn: str | None, table: str, settings: dict[str, Any], documents: int
    ) -> PgIndex:
        """The index in `table`, its tables (and the vector extension) made when absent with
        the record `settings` (the model's: build's) and a build of `documents` documents
        unfinished (until `finish`), else checked to hold the same."""
        pg = PgOptions(table=table)
        db = Database(dsn, timeout=pg.statement_timeout)
        with db.connection("creating the tables") as conn:
            meta = _start(conn, names(table), settings, f"{db.shown} table {table}", documents)
        return cls(db, pg, meta)

    def finish(self) -> None:
        """Record the build finished: searches take the table from now on (before, they
        refuse it unless PgOptions.partial)."""
        text = (
            "INSERT INTO {meta} (key, value) VALUES ('build', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )
        with self.db.connection("recording the build finished") as conn:
            conn.execute(sql(text, self.names), [_json({"finished": True})])

    def write(
        self,
        records: Iterable[tuple[str, str, dict[str, Any]]],
        chunk: int = IndexOptions.chunk,
        progress: bool = False,
        total: int | None = None,
    ) -> dict[str, int]:
        """Upsert (id, text, metadata) records a chunk at a time, each chunk one transaction:
        how many documents were new, changed (embedded again), relabelled (metadata only) and
        kept."""
        pipe = self.use_model()
        counts = dict.fromkeys(("new", "changed", "relabelled", "kept"), 0)
        bar = progress_bar("index", total, "documents") if progress else None
        for docs in chunks(iter(records), chunk):
            for k, v in self._write_chunk(pipe, docs).items():
                counts[k] += v
            if bar is not None:
                bar.update(len(docs))
        if bar is not None:
            bar.close()
        return counts

    def _write_chunk(self, pipe: Any, docs: list[tuple[str, str, dict[str, Any]]]) -> dict:
        """One chunk: what is held of its ids read, what changed embedded, then written in one
        transaction (see write)."""
        t = self.names
        ids = [i for i, _, _ in docs]
        with self.db.connection("reading documents") as conn:
            query = sql("SELECT id, text_sha256, metadata FROM {docs} WHERE id = ANY(%s)", t)
            held = {i: (h, m) for i, h, m in conn.execute(query, [ids])}
        digests = [text_sha256(text) for _, text, _ in docs]
        fresh = [(d, h) for d, h in zip(docs, digests) if d[0] not in held]
        changed = [(d, h) for d, h in zip(docs, digests) if d[0] in held and held[d[0]][0] != h]
        relabelled = [  # the same text, other metadata
            d for d, h in zip(docs, digests) if d[0] in held and held[d[0]][0] == h
            and held[d[0]][1] != d[2]
        ]  # fmt: skip
        rows = self._window_rows(pipe, [d for d, _ in fresh + changed])
        with self.db.connection("writing documents") as conn:
            self.store(conn, fresh, changed, relabelled, rows)
        return {
            "new": len(fresh),
            "changed": len(changed),
            "relabelled": len(relabelled),
            "kept": len(docs) - len(fresh) - len(changed) - len(relabelled),
        }

    def _window_rows(self, pipe: Any, docs: Sequence[tuple[str, str, Any]]) -> bytes:
        """The documents' windows, embedded, as binary COPY rows (pgsql.window_rows)."""
        if not docs:
            return b""
        texts = [text for _, text, _ in docs]
        pieces, owners, starts, lengths, spans = cut_windows(
            pipe, texts, self.meta["window"], self.meta["stride"]
        )
        numbers = np.arange(len(owners)) - np.searchsorted(owners, owners)  # w within its doc
        prompt = self.meta["document_prompt"]
        blocks = embedded_windows(pipe, pieces, owners, starts, lengths, prompt)
        vectors = np.concatenate(list(blocks))  # (W, dim): a chunk's, the bound on memory
        return window_rows(
            [i for i, _, _ in docs], owners, numbers, spans, vectors, self.meta["vector_type"]
        )

    def store(self, conn: Any, fresh: list, changed: list, relabelled: list, rows: bytes) -> None:
        """One chunk's writes, in the connection's one transaction: the changed documents'
        windows deleted and their rows updated, the fresh ones copied in, `rows` (their windows:
        pgsql.window_rows) copied in, the relabelled ones' metadata updated. fresh and changed:
        [((id, text, metadata), text_sha256)]; relabelled: [(id, text, metadata)]."""
        t = self.names
        if changed:
            gone = [d[0] for d, _ in changed]
            conn.execute(sql("DELETE FROM {windows} WHERE id = ANY(%s)", t), [gone])
            update = "UPDATE {docs} SET text = %s, metadata = %s, text_sha256 = %s WHERE id = %s"
            with conn.cursor() as cur:
                cur.executemany(sql(update, t), [(d[1], _json(d[2]), h, d[0]) for d, h in changed])
        if fresh:
            copy = "COPY {docs} (id, text, metadata, text_sha256) FROM STDIN"
            with conn.cursor() as cur, cur.copy(sql(copy, t)) as out:
                for d, h in fresh:
                    out.write_row((d[0], d[1], _json(d[2]), h))
        if rows:
            copy = (
                "COPY {windows} (id, w, span_start, span_end, embedding) FROM STDIN (FORMAT BINARY)"
            )
            with conn.cursor() as cur, cur.copy(sql(copy, t)) as out:
                out.write(COPY_HEADER + rows + COPY_TRAILER)
        if relabelled:
            with conn.cursor() as cur:
                cur.executemany(
                    sql("UPDATE {docs} SET metadata = %s WHERE id = %s", t),
                    [(_json(d[2]), d[0]) for d in relabelled],
                )

    def make_hnsw(self, memory: str = "1GB") -> None:
        """The windows' HNSW index, made when absent (after the rows: faster than growing it),
        with `memory` (maintenance_work_mem: a graph that fits is built much faster)."""
        vtype, metric = self.meta["vector_type"], self.meta["metric"]
        ops = f"{vtype}_{'cosine' if metric == 'cosine' else 'ip'}_ops"
        text = "CREATE INDEX IF NOT EXISTS {hnsw} ON {windows} USING hnsw (embedding {ops}) " + HNSW
        with self.db.connection("making the HNSW index") as conn:
            conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", [memory])
            conn.execute("SELECT set_config('statement_timeout', '0', true)")  # minutes: fine
            conn.execute(sql(text, self.names, ops=ops))

    def delete(self, ids: Iterable[str], chunk: int = 10_000) -> int:
        """Documents (and their windows) removed by id, `chunk` ids per transaction; how many
        there were. An id not there is no error, but is counted in `absent` (how many, the
        first ABSENT_SHOWN of them): a file of wrong ids would otherwise delete nothing
        without a word."""
        removed, missing, first = 0, 0, []
        statement = sql("DELETE FROM {docs} WHERE id = ANY(%s) RETURNING id", self.names)
        for part in chunks(iter(ids), chunk):
            with self.db.connection("deleting documents") as conn:
                found = {i for (i,) in conn.execute(statement, [part])}
            removed += len(found)
            gone = [i for i in dict.fromkeys(part) if i not in found]
            missing += len(gone)
            first += gone[: ABSENT_SHOWN - len(first)]
        self.absent = (missing, first)
        return removed

    def ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Nothing where a search would find the database answering (within `timeout`
        seconds), the table this model's index and its build finished (or pg.partial); else
        the error such a search would raise (a server's readiness: serve's /ready)."""
        with self.db.connection("checking that it answers", timeout=timeout) as conn:
            self._check(conn)

    def count(self) -> tuple[int, int]:
        """(documents, windows) in the tables."""
        with self.db.connection("counting") as conn:
            (docs,) = conn.execute(sql("SELECT count(*) FROM {docs}", self.names)).fetchone()
            (wins,) = conn.execute(sql("SELECT count(*) FROM {windows}", self.names)).fetchone()
        return int(docs), int(wins)

    def close(self) -> None:
        self.db.close()

    # -- the model -----------------------------------------------------------------------------

    def use_model(self, model: str | Path | None = None, **pipeline: Any) -> Any:
        """The pipeline that embeds queries (and documents): `model`, or the one the record
        names, checked to be the index's (identity.query_pipeline)."""
        if self._pipe is None or model is not None:
            recorded = Path(self.meta["model"])
            self._pipe = query_pipeline(self.path, self.meta, recorded, model, **pipeline)
        return self._pipe

    def adopt(self, pipe: Any) -> list[str]:
        """Embed queries with `pipe` (the server's Pipeline) if it is the index's model in the
        index's precision; what differs, in words (empty: adopted)."""
        differs = model_mismatch(pipe, self.meta)
        if not differs:
            self._pipe = pipe
        return differs

    def queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.use_model().embed(list(queries), prompt=self.query_prompt)

    def _check(self, conn: Any) -> None:
        """The table's record, read again: still this model's index (a table rebuilt with
        another model meanwhile would give other hits without a word), its build finished."""
        now = _record(conn, self.names, self.path)
        if _differences(self.meta, now) or now.get("vector_type") != self.meta["vector_type"]:
            raise ConfigError(
                f"{self.path}: now holds an index of another model or settings "
                f"({now.get('model_name')}, sha256 {str(now.get('model_sha256'))[:12]}...) than "
                f"when it was opened ({self.meta['model_name']}): open it again"
            )
        self._finished(conn)

    def _finished(self, conn: Any, warn: bool = False) -> None:
        """One DataError where the table's build has not finished (a build stopped midway
        keeps the chunks it wrote: a search would answer from part of the corpus without a
        word), unless pg.partial: then, with `warn`, a warning saying what it holds. An update
        of a finished table that has not ended: with `warn`, a warning (update_note)."""
        held, updating = _build_state(conn, self.names)
        self.update_note = updating and (
            f"{self.path}: an update of it has not ended ({updating}; running, or stopped "
            "midway): each document is its old or its new version; run the index command again "
            "to finish it"
        )
        if warn and self.update_note:
            warnings.warn(self.update_note, stacklevel=3)
        if held is None:
            return
        said = f"{self.path}: its build has not finished ({held})"
        if self.pg.partial:
            if warn:
                warnings.warn(
                    f"{said}: taken as it is (--partial); run the index command that made it "
                    "again to finish it",
                    stacklevel=3,
                )
            return
        raise DataError(
            f"{said}: run the index command that made it again to finish it (bertforge index "
            f"MODEL CORPUS --to DSN --table {self.pg.table}: it skips the documents written), "
            "or search it as it is with --partial"
        )

    # -- searching -----------------------------------------------------------------------------

    @contextmanager
    def snapshot(self) -> Iterator[Any]:
        """A connection whose transaction reads one snapshot (REPEATABLE READ, read only) for
        the block, and the same connection to every read nested in it on this thread: the reads
        of one search (its ranking, its documents' texts, their passages) see one committed
        state, so each document old or new (a write commits a document's rows together), never
        its new text with its old windows or scores."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self.db.connection() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            self._local.conn = conn
            try:
                yield conn
            finally:
                self._local.conn = None

    def dense(
        self,
        queries: Sequence[str],
        k: int,
        vectors: np.ndarray | None = None,
        where: Mapping[str, str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(document numbers, scores) of each query's top k by its best window (-1: none).
        Through the graph: the 4 k nearest windows (ef_search at least) that `where` keeps, each
        document by its best among them. pgvector (before 0.8) filters the graph's candidates
        after the scan, so a filter that keeps few documents leaves few of them: where fewer
        than k documents are left, the graph again at its most (EF_SEARCH_MAX candidates), and
        where still fewer, the exact scan of the windows that can be hits (every window, or
        those of the documents `where` keeps), when they number at most EXACT_FALLBACK: the top
        k of the matching documents (all of them where fewer match). Where they are more, the
        graph's answer stands (fewer than k documents): a request never forces an exact scan
        of more than EXACT_FALLBACK windows a query (pg.exact scans every window, as asked)."""
        q = self.queries(queries) if vectors is None else vectors
        filters, bound = _filters(where)
        exact, graph = (_dense_sql(self.names, self.meta, filters, g) for g in (False, True))
        ef, rows = min(EF_SEARCH_MAX, max(self.pg.ef_search, 4 * k)), []
        fallback: tuple[Any, dict[str, Any]] | None = None  # decided at the first query short
        with self.snapshot() as conn:
            self._check(conn)
            if not self.pg.exact:
                _ef_search(conn, ef)
            for vector in q:
                args = {"q": vector_text(vector), "k": k, **bound}
                if self.pg.exact:
                    rows.append(conn.execute(exact, args).fetchall())
                    continue
                got = self._near(conn, graph, args, k, ef)
                if len(got) < k:  # the graph's candidates fell short
                    fallback = fallback or self._fallback(conn, filters, bound)
                    if fallback[0] is not None:
                        got = conn.execute(fallback[0], {**args, **fallback[1]}).fetchall()
                rows.append(got)
        return _padded(rows, k)

    def _fallback(
        self, conn: Any, filters: str, bound: dict[str, str]
    ) -> tuple[Any, dict[str, Any]]:
        """The exact scan (statement, its arguments) of the queries the graph falls short on,
        where the windows it would score number at most EXACT_FALLBACK, else (None, {}): the
        graph's answer stands. Without a filter, every window (counted up to one past the
        bound); with one, the windows of the documents it keeps, those found once (read up to
        one past the bound, their windows counted by the primary key) and read by id."""
        cap = {"cap": EXACT_FALLBACK + 1}
        if not filters:
            count = "SELECT count(*) FROM (SELECT 1 FROM {windows} LIMIT %(cap)s) x"
            (n,) = conn.execute(sql(count, self.names), cap).fetchone()
            few = int(n) <= EXACT_FALLBACK
            return (_dense_sql(self.names, self.meta, "", False), {}) if few else (None, {})
        kept = (
            "SELECT d.id, (SELECT count(*) FROM {windows} w WHERE w.id = d.id) FROM {docs} d "
            "WHERE true" + filters + " LIMIT %(cap)s"
        )
        found = conn.execute(sql(kept, self.names), {**bound, **cap}).fetchall()
        if sum(int(n) for _, n in found) > EXACT_FALLBACK:
            return None, {}
        by_id = _dense_sql(self.names, self.meta, " AND w.id = ANY(%(ids)s)", False)
        return by_id, {"ids": [i for i, _ in found]}

    def _near(self, conn: Any, graph: Any, args: dict[str, Any], k: int, ef: int) -> list:
        """The graph's top k documents: among the 4 k nearest windows (ef candidates), else,
        where those hold fewer than k (a filter's), among the most the graph gives; ef_search
        is left at ef."""
        got = conn.execute(graph, {**args, "n": 4 * k}).fetchall()
        if len(got) < k and ef < EF_SEARCH_MAX:
            _ef_search(conn, EF_SEARCH_MAX)
            got = conn.execute(graph, {**args, "n": EF_SEARCH_MAX}).fetchall()
            _ef_search(conn, ef)
        return got

    def text_search(
        self, queries: Sequence[str], k: int, where: Mapping[str, str] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(document numbers, scores) of each query's top k by ts_rank: the documents that
        share an English word (stemmed, stopwords out) with the query (-1: none)."""
        filters, bound = _filters(where)
        text = (
            "SELECT d.n, ts_rank(d.tsv, q.q) AS score FROM {docs} d, (SELECT "
            + _ANY_WORD
            + " AS q) q "
            "WHERE d.tsv @@ q.q" + filters + " ORDER BY score DESC, d.n LIMIT %(k)s"
        )
        statement, rows = sql(text, self.names), []
        with self.snapshot() as conn:
            self._check(conn)
            for query in queries:
                args = {"text": query, "k": k, **_ANY_ARGS, **bound}
                rows.append(conn.execute(statement, args).fetchall())
        return _padded(rows, k)

    bm25 = text_search  # the directory index's name of its word list, for mining

    def ranked(
        self,
        queries: Sequence[str],
        k: int,
        mode: str,
        fusion: str = FirstStage.fusion,
        alpha: float = FirstStage.alpha,
        vectors: np.ndarray | None = None,
        where: Mapping[str, str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(document numbers, scores) of each query's top k by `mode` (-1: none there)."""
        check_choice("fusion", fusion, FUSIONS, "--fusion")
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha={alpha} (--alpha): must be between 0 and 1")
        if mode == "dense":
            return self.dense(queries, k, vectors, where)
        if mode == "bm25":
            return self.text_search(queries, k, where)
        n = max(FUSED, k)  # each list at least as deep as the hits asked for
        runs = [self.dense(queries, n, vectors, where), self.text_search(queries, n, where)]
        return fuse_runs(runs, fusion, alpha, k)

    def search(
        self,
        queries: Sequence[str],
        top_k: int = SearchOptions.top_k,
        mode: str = FirstStage.mode,
        text: bool = SearchOptions.text,
        fusion: str = FirstStage.fusion,
        alpha: float = FirstStage.alpha,
        passage: bool = SearchOptions.passage,
        where: Mapping[str, str] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Per query, its top_k documents: [{"id", "score", "rank"} (+ "text", + "passage")],
        as Index.search gives them; `where`: {metadata field: value} all of which a document
        must have (its field as text equal to the value)."""
        if isinstance(queries, str):
            raise ConfigError("pass a list of queries (a single string is not a list)")
        check_choice("mode", mode, MODES, "--mode")
        if top_k < 1:
            raise ConfigError(f"top_k={top_k} (--top-k): must be >= 1")
        if not queries:
            return []
        vectors = self.queries(queries) if mode != "bm25" or passage else None
        with self.snapshot():  # one committed state: each document's text, windows, score
            docs, scores = self.ranked(queries, top_k, mode, fusion, alpha, vectors, where)
            found = self._documents({d for row in docs.tolist() for d in row if d >= 0})
            hits = [
                [(d, s) for d, s in zip(row_d.tolist(), row_s.tolist()) if d in found]
                for row_d, row_s in zip(docs, scores)
            ]
            if passage:
                spans = self.passages(vectors, [[d for d, _ in row] for row in hits], found)
        return [
            [
                {
                    "id": found[d][0],
                    "score": float(s),
                    "rank": r,
                    **({"text": found[d][1]} if text else {}),
                    **({"passage": spans[q][r - 1]} if passage else {}),
                }
                for r, (d, s) in enumerate(row, 1)
            ]
            for q, row in enumerate(hits)
        ]

    # -- mining: every document, and one document's score --------------------------------------

    def documents(self) -> Iterator[tuple[int, str, str]]:
        """(number, id, text) of each document, in number order, read in one pass (a
        server-side cursor: memory bounded for any table)."""
        with self.db.connection("reading documents") as conn, conn.cursor("documents") as cur:
            cur.execute(sql("SELECT n, id, text FROM {docs} ORDER BY n", self.names))
            yield from cur

    def texts_of(self, numbers: Iterable[int]) -> dict[int, str]:
        """{number: text} of the documents numbered (mining reads its candidates' so, a batch
        of queries' at a time: never the whole table in memory)."""
        return {n: text for n, (_, text) in self._documents(set(numbers)).items()}

    def scores_of(self, queries: Sequence[str], docs: Sequence[int], mode: str) -> np.ndarray:
        """Each query's score of one document (docs[i] for queries[i]) as `mode` scores it."""
        metric, vtype = self.meta["metric"], self.meta["vector_type"]
        if mode == "dense":
            score = _SCORE[metric].format(col="w.embedding", vtype=vtype)
            text = "SELECT max(" + score + ") FROM {windows} w JOIN {docs} d ON d.id = w.id "
            text += "WHERE d.n = %(d)s"
            args = [{"q": vector_text(v), "d": d} for v, d in zip(self.queries(queries), docs)]
        else:
            text = "SELECT ts_rank(d.tsv, " + _ANY_WORD + ") FROM {docs} d WHERE d.n = %(d)s"
            args = [{"text": q, "d": d, **_ANY_ARGS} for q, d in zip(queries, docs)]
        statement, out = sql(text, self.names), []
        with self.db.connection() as conn:
            for a in args:
                row = conn.execute(statement, a).fetchone()
                out.append(float(row[0]) if row and row[0] is not None else 0.0)
        return np.array(out)

    def _documents(self, numbers: set[int]) -> dict[int, tuple[str, str]]:
        """{number: (id, text)} of the documents numbered."""
        with self.snapshot() as conn:
            query = sql("SELECT n, id, text FROM {docs} WHERE n = ANY(%s::bigint[])", self.names)
            return {n: (i, t) for n, i, t in conn.execute(query, [sorted(numbers)])}

    def passages(
        self,
        vectors: np.ndarray | None,
        docs: Sequence[Sequence[int]],
        found: Mapping[int, tuple[str, str]],
    ) -> list[list[str]]:
        """For each query (its vector), the text of each of its documents' window nearest it:
        the characters the build recorded (the whole text when the document is one window)."""
        assert vectors is not None
        text = (
            "SELECT DISTINCT ON (d.n) d.n, w.span_start, w.span_end, "
            "count(*) OVER (PARTITION BY d.n) FROM {windows} w JOIN {docs} d ON d.id = w.id "
            "WHERE d.n = ANY(%(docs)s::bigint[]) ORDER BY d.n, w.embedding {op} %(q)s::{vtype}"
        )
        metric, vtype = self.meta["metric"], self.meta["vector_type"]
        statement, out = sql(text, self.names, op=_OPS[metric], vtype=vtype), []
        with self.snapshot() as conn:
            for vector, row in zip(vectors, docs):
                args = {"docs": list(row), "q": vector_text(vector)}
                spans = {n: (a, b, c) for n, a, b, c in conn.execute(statement, args)}
                out.append([_passage(found[d][1], spans.get(d)) for d in row])
        return out


# -- helpers -----------------------------------------------------------------------------------


def text_sha256(text: str) -> str:
    """A document's text's sha256: a document is embedded again only when it changes."""
    return hashlib.sha256(text.encode()).hexdigest()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _passage(text: str, span: tuple[int, int, int] | None) -> str:
    if span is None or span[2] == 1:  # one window (or gone meanwhile): the whole text
        return text
    return text[span[0] : span[1]]


def _padded(rows: Sequence[Sequence[tuple[int, float]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's (number, score) rows as (Q, k) arrays, -1 and 0 where it has fewer."""
    docs = np.full((len(rows), k), -1, np.int64)
    scores = np.zeros((len(rows), k), np.float64)
    for i, row in enumerate(rows):
        docs[i, : len(row)] = [int(n) for n, _ in row]
        scores[i, : len(row)] = [float(s) for _, s in row]
    return docs, scores


def _ef_search(conn: Any, ef: int) -> None:
    """The graph's candidates per search (hnsw.ef_search), for this transaction only."""
    conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(ef)])


def _dense_sql(t: Mapping[str, Any], meta: Mapping[str, Any], filters: str, graph: bool) -> Any:
    """The dense search's statement: through the graph (the %(n)s nearest windows that the
    filters keep, by pgvector's HNSW index scan) or exact (every window of the documents the
    filters keep), then each document's best window, the top %(k)s documents."""
    vtype, metric = meta["vector_type"], meta["metric"]
    score = _SCORE[metric].format(col="w.embedding", vtype=vtype)
    if graph:
        text = (
            "SELECT d.n, max(near.score) AS score FROM (SELECT w.id, " + score + " AS score "
            "FROM {windows} w"
            + (" JOIN {docs} d ON d.id = w.id WHERE true" + filters if filters else "")
            + " ORDER BY w.embedding {op} %(q)s::{vtype} LIMIT %(n)s) near "
            "JOIN {docs} d ON d.id = near.id GROUP BY d.n ORDER BY score DESC, d.n LIMIT %(k)s"
        )
    else:
        text = (
            "SELECT d.n, max(" + score + ") AS score FROM {windows} w "
            "JOIN {docs} d ON d.id = w.id WHERE true" + filters + " "
            "GROUP BY d.n ORDER BY score DESC, d.n LIMIT %(k)s"
        )
    return sql(text, t, op=_OPS[metric], vtype=vtype)


def _filters(where: Mapping[str, str] | None) -> tuple[str, dict[str, str]]:
    """SQL conditions on d.metadata (" AND (d.metadata ->> %(f0)s) = %(v0)s" ...) and their
    bound values: each field's value as text equal to the value given."""
    text, bound = "", {}
    for i, (field, value) in enumerate((where or {}).items()):
        if not isinstance(field, str) or not field or not isinstance(value, (str, int, float)):
            raise ConfigError(f"where: {field!r}={value!r}: a field name and a value")
        text += f" AND (d.metadata ->> %(f{i})s) = %(v{i})s"
        bound |= {f"f{i}": field, f"v{i}": str(value)}
    return text, bound


def _refuse_directory_options(o: IndexOptions) -> None:
    """A directory index's options that this backend has no use for: one ConfigError."""
    if o.approximate or o.embedding_precision != "float32" or not o.bm25:
        raise ConfigError(
            "--approximate, --embedding-precision and --no-bm25 are a directory index's: "
            "PostgreSQL keeps an HNSW index and full text of its own"
        )


def _differences(held: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """The fields of `settings` (a build's, or the record read again) that differ from the
    record `held`: its model's (identity.model_differences), then the other bound settings."""
    return model_differences(held, settings) + [k for k in _BOUND if held.get(k) != settings.get(k)]


def _record(conn: Any, t: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The index's record (T_index), or one DataError: no such table, or not an index."""
    exists = conn.execute("SELECT to_regclass(%s)", [t["meta"].as_string(conn)]).fetchone()[0]
    if exists is None:
        raise DataError(f"{where}: not a bertforge index (index MODEL CORPUS --to DSN makes one)")
    row = conn.execute(sql("SELECT value FROM {meta} WHERE key = 'settings'", t)).fetchone()
    if row is None or row[0].get("format") != FORMAT:
        raise DataError(f"{where}: its record ({t['meta'].as_string(conn)}) is not an index's")
    return dict(row[0])


def _build_state(conn: Any, t: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(unfinished, updating): what a table whose first build has not finished holds, in words
    ("80 of 200 documents so far"), and the same of a finished table under an update that has
    not ended (running, or killed): each None where it is not so, or where no build recorded
    its state (tables made before builds did, taken as finished). One read of the record, as
    every search checks it."""
    row = conn.execute(sql("SELECT value FROM {meta} WHERE key = 'build'", t)).fetchone()
    state = row[0] if row is not None else {}
    unfinished, updating = not state.get("finished", True), bool(state.get("updating"))
    if not (unfinished or updating):
        return None, None
    (held,) = conn.execute(sql("SELECT count(*) FROM {docs}", t)).fetchone()
    documents = state.get("documents", 0)
    if unfinished:
        return f"{held:,} of {documents:,} documents so far", None
    return None, f"{held:,} documents in the table, the update reads {documents:,}"


def _start(
    conn: Any, t: Mapping[str, Any], settings: dict[str, Any], where: str, documents: int
) -> dict:
    """Create the extension and the tables when absent, their build recorded unfinished (of
    `documents` documents), or check that the record there is of the same model and settings
    (a table whose build has not finished: its count of documents updated); the record. A
    later build of a finished table (an update in place) leaves it finished: its readers see
    each document old or new, and a search needs no more."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    state = _json({"finished": False, "documents": int(documents)})
    if conn.execute("SELECT to_regclass(%s)", [t["meta"].as_string(conn)]).fetchone()[0]:
        held = _record(conn, t, where)
        if changed := _differences(held, settings):
            raise ConfigError(
                f"{where}: holds an index of another model or settings ({', '.join(changed)} "
                "differ): give another --table, or drop that one"
            )
        text = "UPDATE {meta} SET value = %s WHERE key = 'build' AND value ->> 'finished' = 'false'"
        conn.execute(sql(text, t), [state])
        # an update of a finished table: still searched (each document old or new), with a
        # warning until its end (a killed update leaves the table part old, part new)
        update = _json({"finished": True, "updating": True, "documents": int(documents)})
        text = "UPDATE {meta} SET value = %s WHERE key = 'build' AND value ->> 'finished' = 'true'"
        conn.execute(sql(text, t), [update])
        return held
    (version,) = conn.execute(
        "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
    ).fetchone()
    have = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    meta = {**settings, "vector_type": "halfvec" if have >= HALFVEC else "vector"}
    for statement in _tables(meta["vector_type"], int(meta["dimensions"])):
        conn.execute(sql(statement, t))
    conn.execute(sql("INSERT INTO {meta} (key, value) VALUES ('settings', %s)", t), [_json(meta)])
    conn.execute(sql("INSERT INTO {meta} (key, value) VALUES ('build', %s)", t), [state])
    return meta


def _tables(vtype: str, dim: int) -> list[str]:
    """The statements that make an index's tables (dim: an int, vtype: vector or halfvec)."""
    return [
        "CREATE TABLE {docs} (id text PRIMARY KEY, n bigint GENERATED ALWAYS AS IDENTITY, "
        "text text NOT NULL, metadata jsonb NOT NULL DEFAULT '{{}}', text_sha256 text NOT NULL, "
        "tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED)",
        "CREATE UNIQUE INDEX {n} ON {docs} (n)",
        "CREATE INDEX {tsv} ON {docs} USING gin (tsv)",
        "CREATE TABLE {windows} (id text NOT NULL REFERENCES {docs} (id) ON DELETE CASCADE, "
        f"w integer NOT NULL, span_start integer NOT NULL, span_end integer NOT NULL, "
        f"embedding {vtype}({int(dim)}) NOT NULL, PRIMARY KEY (id, w))",
        "CREATE TABLE {meta} (key text PRIMARY KEY, value jsonb NOT NULL)",
    ]


def read_ids(path: str | Path) -> Iterator[str]:
    """The ids of a --delete file, one a line (blank lines skipped)."""
    from ..fileio import read_lines

    for _, line in read_lines(path):
        if line.strip():
            yield line.strip()
