"""bertforge.distributed on a real Ray cluster of two nodes started here (ray.cluster_utils:
two raylets, one CPU each), never a mock: its directory and PostgreSQL indexes equal to the
one-process build's, exactly once when a worker is killed mid-job, resumed when the driver is,
and one clear error for a wrong address, a node without the model, a worker without bertforge.
Marked `ray` (`pytest -m 'not ray'` leaves them out; CI runs them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from bertforge.errors import ConfigError, DataError
from bertforge.search import Index, PgOptions
from tests.test_search import DOCS, QUERIES

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'bertforge[ray]')")
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one cluster

from bertforge.distributed import (  # noqa: E402
    NO_BERTFORGE,
    RayOptions,
    embed_dataset,
    index_corpus,
    index_dataset,
    workers,
)
from bertforge.search.options import IndexOptions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# 30 documents, one of them long (windows), as chunks of 4: 8 parts for two workers
TEXTS = [f"{DOCS[i % len(DOCS)]} Number {i}." for i in range(30)]
ONE = dict(chunk=4, progress=False, precision="fp32")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node and a second node, one CPU each; this process its driver."""
    from ray.cluster_utils import Cluster

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no network at test time
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": 100 << 20,
            "include_dashboard": False,
        },
    )
    c.add_node(num_cpus=1, object_store_memory=100 << 20)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c.address
    finally:
        ray.shutdown()
        c.shutdown()


def write_corpus(path: Path, texts: list[str] = TEXTS) -> Path:
    path.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    return path


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Index:
    """The one-process index of the corpus: what every cluster build must equal."""
    tmp = tmp_path_factory.mktemp("single")
    return Index.build(minilm_dir, write_corpus(tmp / "corpus.jsonl"), tmp / "idx", **ONE)


def same_index(got: Index, want: Index) -> None:
    """The same documents in the same order, windows, spans and BM25; vectors within 1e-6;
    the same hits for every query, dense and hybrid."""
    assert got.ids == want.ids and got.texts == want.texts
    np.testing.assert_array_equal(got.windows, want.windows)
    np.testing.assert_array_equal(np.asarray(got.spans), np.asarray(want.spans))
    np.testing.assert_allclose(np.asarray(got.vectors), np.asarray(want.vectors), atol=1e-6)
    for mode in ("dense", "hybrid", "bm25"):
        hits = [[h["id"] for h in q] for q in got.search(QUERIES, top_k=5, mode=mode)]
        assert hits == [[h["id"] for h in q] for q in want.search(QUERIES, top_k=5, mode=mode)]
    assert got.meta["model_sha256"] == want.meta["model_sha256"]


def test_a_directory_index_by_two_nodes_is_the_one_process_index(
    cluster: str, single: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    r = RayOptions(workers=2)
    got = index_corpus(
        minilm_dir, write_corpus(tmp_path / "c.jsonl"), tmp_path / "idx", ray=r, **ONE
    )
    same_index(Index.load(tmp_path / "idx"), single)
    assert got.meta["documents"] == len(TEXTS) and not (tmp_path / "idx" / "parts").exists()
    # each worker wrote parts: both nodes took part
    assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2


def test_a_ray_dataset_indexed_in_its_order(
    cluster: str, single: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    rows = [{"id": f"d{i}", "text": t, "lang": "en"} for i, t in enumerate(TEXTS)]
    ds = ray.data.from_items(rows, override_num_blocks=3)
    index_dataset(ds, minilm_dir, tmp_path / "idx", ray=RayOptions(workers=2), **ONE)
    same_index(Index.load(tmp_path / "idx"), single)
    bad = ray.data.from_items([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(DataError, match=r"row 1: id 'a' repeats"):
        index_dataset(bad, minilm_dir, tmp_path / "bad", **ONE)


def test_embed_dataset_is_pipeline_embed(cluster: str, minilm_dir: Path) -> None:
    from bertforge.pipelines import Pipeline

    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(TEXTS)])
    out = embed_dataset(ds, minilm_dir, precision="fp32", rows_per_batch=8).take_all()
    got = np.stack([r["vector"] for r in sorted(out, key=lambda r: r["id"])])
    want = Pipeline(minilm_dir, precision="fp32").embed(TEXTS)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-6)


def _ours(pid: int) -> bool:
    """Whether a process descends from this one (this test's cluster's raylets are its
    children): another session's Ray workers on the machine are left alone."""
    while pid > 1:
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid == os.getpid():
            return True
    return False


def _kill_a_worker_when(begun: Callable[[], bool], killed: list[int]) -> None:
    """SIGKILL one PipelineWorker process once `begun()` (a chunk written, more under way)."""
    deadline = time.time() + 120
    while time.time() < deadline and not begun():
        time.sleep(0.05)
    while time.time() < deadline and not killed:  # a worker past its creation, when there is
        _kill_one(killed)
        time.sleep(0.05)


def _kill_one(killed: list[int]) -> None:
    for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            title = (Path("/proc") / pid / "cmdline").read_bytes()
        except OSError:
            continue
        # a worker at work or idle, the case these tests are about; one killed in its creation
        # task is restarted too (test_a_worker_killed_while_it_is_created_is_restarted)
        if b"PipelineWorker" in title and b"__init__" not in title and _ours(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
            killed.append(int(pid))
            return


@contextmanager
def a_worker_killed(begun: Callable[[], bool]) -> Iterator[None]:
    """The block's job with one of its workers killed midway (and it was)."""
    killed: list[int] = []
    killer = threading.Thread(target=_kill_a_worker_when, args=(begun, killed))
    killer.start()
    yield
    killer.join()
    assert killed, "no worker was running to be killed"


def test_a_worker_killed_midway_leaves_each_document_once(
    cluster: str, single: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    corpus, parts = write_corpus(tmp_path / "c.jsonl"), tmp_path / "idx" / "parts"
    with a_worker_killed(lambda: bool(list(parts.glob("*.sha256")))):
        index_corpus(minilm_dir, corpus, tmp_path / "idx", ray=RayOptions(workers=2), **ONE)
    got = Index.load(tmp_path / "idx")
    assert sorted(got.ids) == sorted(single.ids) and len(set(got.ids)) == len(got.ids)
    same_index(got, single)


def ranked(hits: list[dict]) -> list[tuple[float, str]]:
    """Hits by score, ties by id: PostgreSQL breaks ties by the order the documents were
    written in, which workers writing at once do not keep."""
    return sorted((-round(h["score"], 4), h["id"]) for h in hits)


def test_postgresql_by_two_nodes_is_the_one_process_table(
    cluster: str, minilm_dir: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    """The same documents, windows and vectors (float32 rounding: halfvec's where pgvector has
    it) and search results as PgIndex.build's table; run again, every document kept; a worker
    killed midway, still each document once."""
    from bertforge.search.postgres import PgIndex
    from tests.test_postgres import same_rows

    corpus = write_corpus(tmp_path / "c.jsonl")
    want = PgIndex.build(minilm_dir, corpus, postgres_dsn, table="one", **ONE)
    r = RayOptions(workers=2)
    got = index_corpus(minilm_dir, corpus, postgres_dsn, table="ray", ray=r, **ONE)
    assert got.written == {"new": len(TEXTS), "changed": 0, "relabelled": 0, "kept": 0}
    same_rows(got, want)
    hits = [ranked(q) for q in got.search(QUERIES, top_k=5)]
    assert hits == [ranked(q) for q in want.search(QUERIES, top_k=5)]
    # hybrid: the same documents; near copies tied in a list take ranks by the order of writing
    fused = [{h["id"] for h in q} for q in got.search(QUERIES, top_k=5, mode="hybrid")]
    assert fused == [{h["id"] for h in q} for q in want.search(QUERIES, top_k=5, mode="hybrid")]
    again = index_corpus(minilm_dir, corpus, postgres_dsn, table="ray", ray=r, **ONE)
    assert again.written["kept"] == len(TEXTS)

    def rows() -> int:
        with got.db.connection() as conn:
            return conn.execute("SELECT count(*) FROM killed").fetchone()[0]

    def begun() -> bool:
        try:
            return rows() > 0
        except Exception:  # the table is not made yet
            return False

    with a_worker_killed(begun):
        index_corpus(minilm_dir, corpus, postgres_dsn, table="killed", ray=r, **ONE)
    killed = PgIndex.open(postgres_dsn, PgOptions(table="killed"))
    assert rows() == len(TEXTS)
    same_rows(killed, want)
    for index in (want, got, again, killed):
        index.close()


def test_a_killed_driver_resumes(
    cluster: str, single: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    corpus, out = write_corpus(tmp_path / "c.jsonl"), tmp_path / "idx"
    command = [sys.executable, "-m", "bertforge", "index", str(minilm_dir), str(corpus)]
    command += ["--out", str(out), "--ray", cluster, "--workers", "1", "--chunk", "2"]
    command += ["--precision", "fp32", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    driver = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "parts").glob("*.sha256"))) < 2:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    whole = len(list((out / "parts").glob("*.sha256")))
    assert 2 <= whole < 15 and not (out / "index.json").exists()
    with pytest.raises(DataError, match="unfinished index"):
        Index.load(out)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"indexed {len(TEXTS)} documents" in done.stdout
    same_index(Index.load(out), single)


def test_one_clear_line_for_a_wrong_address(minilm_dir: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bertforge", "index", str(minilm_dir)]
    command += [str(write_corpus(tmp_path / "c.jsonl")), "--out", str(tmp_path / "idx")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [*command, "--ray", "127.0.0.1:9"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "bertforge: error: the Ray cluster at 127.0.0.1:9"
    )


def test_a_node_without_the_model(cluster: str, single: Index, tmp_path: Path) -> None:
    record = {**single.meta, "model": str(tmp_path / "nowhere")}
    with pytest.raises(
        ConfigError, match=r"nowhere: the model is not on the Ray node .*every node"
    ):
        workers(ray, RayOptions(workers=2), record, IndexOptions(precision="fp32"))
    other = {**single.meta, "model_sha256": "0" * 64}
    with pytest.raises(ConfigError, match=r"not the driver's model \(its config.json and weights"):
        workers(ray, RayOptions(workers=1), other, IndexOptions(precision="fp32"))


BLOCK = """
import sys

class Absent:  # bertforge as on a node where it is not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "bertforge":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

def block():
    sys.meta_path.insert(0, Absent())
"""
DRIVER = """
import sys, ray
from bertforge.cli import main
hook = {"worker_process_setup_hook": "absent.block", "env_vars": {"PYTHONPATH": sys.argv[1]}}
ray.init(address=sys.argv[2], runtime_env=hook, log_to_driver=False, logging_level="ERROR")
sys.exit(main(sys.argv[3:]))
"""


def test_a_worker_that_cannot_import_bertforge(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """The workers of a driver's cluster find no bertforge (their setup hook takes it away,
    as on a node where it is not installed): one line saying so, exit 2."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "absent.py").write_text(BLOCK)
    command = ["index", str(minilm_dir), str(write_corpus(tmp_path / "c.jsonl"))]
    command += ["--out", str(tmp_path / "idx"), "--ray", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "hook"), cluster, *command],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [f"bertforge: error: {NO_BERTFORGE}"]


def test_the_cluster_has_no_room(cluster: str, single: Index) -> None:
    with pytest.raises(ConfigError, match=r"--workers 3: the Ray cluster has room for 2"):
        workers(ray, RayOptions(workers=3), single.meta, IndexOptions())


def test_the_ray_options_need_ray(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bertforge.cli import main

    corpus = write_corpus(tmp_path / "c.jsonl")
    argv = ["index", str(minilm_dir), str(corpus), "--out", str(tmp_path / "idx")]
    assert main([*argv, "--workers", "2"]) == 2
    assert (
        "--workers, --cpus-per-worker and --gpus-per-worker need --ray" in capsys.readouterr().err
    )
    assert not (tmp_path / "idx").exists()


def read_parts(out: Path) -> tuple[list[str], list[int], np.ndarray]:
    """(ids, lines, vectors) of an embed --ray directory's Parquet parts, in the input's order."""
    import pyarrow.parquet as pq

    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    ids, lines = table["id"].to_pylist(), table["line"].to_pylist()
    vectors = np.array(table["vector"].to_pylist(), dtype=np.float32)
    order = np.argsort(lines)
    return [ids[i] for i in order], [lines[i] for i in order], vectors[order]


def test_embed_ray_writes_parquet_equal_to_one_process_embed(
    cluster: str, minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bertforge embed MODEL FILE --ray --out DIR`: the texts' vectors as Parquet parts (id,
    line, vector) equal to the one-process embed of the same file; a worker killed midway
    leaves each text once; run again, a finished directory is left as it is."""
    from bertforge.cli import main

    texts = tmp_path / "texts.jsonl"
    texts.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    want_file = tmp_path / "one.npy"
    assert (
        main(
            [
                "embed",
                str(minilm_dir),
                str(texts),
                "--out",
                str(want_file),
                "--precision",
                "fp32",
                "--no-progress",
            ]
        )
        == 0
    )
    want = np.load(want_file)
    out = tmp_path / "vectors"
    argv = ["embed", str(minilm_dir), str(texts), "--out", str(out), "--ray", cluster]
    argv += ["--workers", "2", "--chunk", "4", "--precision", "fp32", "--no-progress"]
    with a_worker_killed(lambda: bool(list(out.glob("part-*.parquet")))):
        assert main(argv) == 0
    assert "wrote the vectors to" in capsys.readouterr().out
    ids, lines, got = read_parts(out)
    assert ids == [f"d{i}" for i in range(len(TEXTS))] and lines == list(range(1, len(TEXTS) + 1))
    assert len(list(out.glob("part-*.parquet"))) == 8
    np.testing.assert_allclose(got, want, atol=1e-6)
    record = json.loads((out / "embed.json").read_text())
    assert record["finished"] and record["texts"] == len(TEXTS) and record["parts"] == 8
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(argv) == 0  # done: nothing run again
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_embed_ray_reads_several_files_in_its_workers(
    cluster: str, minilm_dir: Path, tmp_path: Path, reads: Callable[[Path], Counter[str]]
) -> None:
    """Several inputs (a text file with a blank line, --skip-blank; a directory of JSONL): each
    file cut into pieces the workers read themselves; a text line's id FILE:LINE, a JSONL
    row's its own; each text once with a worker killed midway; the vectors one process's. The
    driver reads each input once (its pieces and its sha256 in one pass)."""
    from bertforge.cli import main
    from bertforge.pipelines import Pipeline

    plain = tmp_path / "a.txt"
    plain.write_text(
        "".join(t + "\n" for t in TEXTS[:5]) + "\n" + "".join(t + "\n" for t in TEXTS[5:12])
    )
    shards = tmp_path / "shards"
    shards.mkdir()
    write_corpus(shards / "b.jsonl", TEXTS[12:])
    out = tmp_path / "vectors"
    argv = ["embed", str(minilm_dir), str(plain), str(shards), "--out", str(out), "--skip-blank"]
    argv += ["--ray", cluster, "--workers", "2", "--chunk", "3", "--precision", "fp32"]
    opened = reads(tmp_path)
    with a_worker_killed(lambda: bool(list(out.glob("part-*.parquet")))):
        assert main([*argv, "--no-progress"]) == 0
    assert opened["a.txt"] == 1 and opened[os.path.join("shards", "b.jsonl")] == 1
    import pyarrow.parquet as pq

    table = pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()
    lines = [*range(1, 6), *range(7, 14)]
    assert [(r["file"], r["id"], r["line"]) for r in table] == [
        *((str(plain), f"{plain}:{n}", n) for n in lines),
        *((str(shards / "b.jsonl"), f"d{i}", i + 1) for i in range(len(TEXTS) - 12)),
    ]
    assert len(list(out.glob("part-*.parquet"))) == 5 + 6  # 13 lines by 3, 18 by 3
    want = Pipeline(minilm_dir, precision="fp32").embed(TEXTS)
    got = np.array([r["vector"] for r in table], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert json.loads((out / "embed.json").read_text())["texts"] == len(TEXTS)


def test_embed_ray_goes_on_from_its_missing_parts_and_refuses_another_job(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    from bertforge.distributed import embed_file

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(t + "\n" for t in TEXTS))
    out = tmp_path / "vectors"
    ray_options = RayOptions(workers=1)
    embed_file(minilm_dir, texts, out, ray=ray_options, chunk=8, progress=False, precision="fp32")
    ids, _, full = read_parts(out)
    assert ids == [str(i) for i in range(1, len(TEXTS) + 1)]  # a text line's id: its line
    # a driver killed midway: its record unfinished, some parts missing
    (out / "part-00000-00001.parquet").unlink()
    (out / "part-00000-00003.parquet").unlink()
    record = json.loads((out / "embed.json").read_text())
    (out / "embed.json").write_text(json.dumps({**record, "finished": False}))
    kept = (out / "part-00000-00000.parquet").stat().st_mtime_ns
    embed_file(minilm_dir, texts, out, ray=ray_options, chunk=8, progress=False, precision="fp32")
    assert (out / "part-00000-00000.parquet").stat().st_mtime_ns == kept  # written parts kept
    np.testing.assert_array_equal(read_parts(out)[2], full)
    with pytest.raises(ConfigError, match="holds the embeddings of another job \\(chunk differ\\)"):
        embed_file(
            minilm_dir, texts, out, ray=ray_options, chunk=4, progress=False, precision="fp32"
        )


def test_embed_ray_redoes_only_the_pieces_whose_lines_changed(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """A bad line stops the job, its parts so far kept; the line fixed, the same command goes
    on (it refused: the input's sha256 had changed), writing the fixed piece and keeping the
    parts of unchanged ones. A finished job whose input changed redoes the changed pieces
    alone; a shorter input drops the parts past its end. The vectors: the file's as it is."""
    from bertforge.distributed import embed_file
    from bertforge.pipelines import Pipeline

    texts, out = tmp_path / "texts.txt", tmp_path / "vectors"
    options = dict(ray=RayOptions(workers=1), chunk=8, progress=False, precision="fp32")
    pipe = Pipeline(minilm_dir, precision="fp32")

    def parts() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}

    def run(lines: list[str]) -> dict[str, int]:
        texts.write_text("".join(t + "\n" for t in lines))
        embed_file(minilm_dir, texts, out, **options)
        ids, _, got = read_parts(out)
        assert ids == [str(i) for i in range(1, len(lines) + 1)]
        np.testing.assert_allclose(got, pipe.embed(lines), atol=1e-6)
        record = json.loads((out / "embed.json").read_text())
        assert record["finished"] and record["texts"] == len(lines)
        return parts()

    texts.write_text("".join(t + "\n" for t in [*TEXTS[:9], "", *TEXTS[10:]]))
    with pytest.raises(DataError, match=r"texts.txt: line 10: blank line"):
        embed_file(minilm_dir, texts, out, **options)
    stopped = parts()
    assert "part-00000-00000.parquet" in stopped and "part-00000-00001.parquet" not in stopped
    fixed = [*TEXTS[:9], "A line put right.", *TEXTS[10:]]
    done = run(fixed)
    assert all(done[name] == t for name, t in stopped.items())  # lines 1-8 and 17-: kept
    changed = [*fixed[:20], "A line changed.", *fixed[21:]]  # in the third piece, lines 17-24
    again = run(changed)
    assert again.keys() == done.keys()
    assert [n for n in done if again[n] != done[n]] == ["part-00000-00002.parquet"]
    shorter = run(changed[:16])
    assert shorter == {n: t for n, t in again.items() if n < "part-00000-00002"}


def test_a_piece_changed_after_it_was_cut_is_refused(minilm_dir: Path, tmp_path: Path) -> None:
    """A worker reads its piece itself: bytes other than those the driver cut (the file edited
    while the job ran) are refused, not written as a part that embed.json says holds the old
    bytes (a re-run would keep it)."""
    from bertforge.distributed import PipelineWorker
    from bertforge.fileio import line_spans
    from bertforge.pipelines import Pipeline
    from bertforge.search.identity import model_record

    texts = tmp_path / "t.txt"
    texts.write_text("one\ntwo\nthree\n")
    shas: list[str] = []
    (span,) = line_spans(texts, 8, shas)
    record = {**model_record(Pipeline(minilm_dir, precision="fp32")), "precision": "fp32"}
    worker = PipelineWorker(record, {"device": "cpu", "precision": "fp32", "batch_size": None})
    read = {"skip_blank": False, "keep_tabs": False, "prefix": ""}
    assert worker.vectors(str(tmp_path / "p0.parquet"), str(texts), span, shas[0], read, {}) == 3
    texts.write_text("one\nTWO\nthree\n")
    with pytest.raises(DataError, match=r"t.txt: lines 1-3 changed while the job ran"):
        worker.vectors(str(tmp_path / "p1.parquet"), str(texts), span, shas[0], read, {})
    assert not (tmp_path / "p1.parquet").exists()


def test_a_second_driver_into_the_same_directory_is_refused(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """Two embed --ray jobs writing one directory at once (a command run twice, an edited input
    run again while the first runs) would race on embed.json and the parts: the second is
    refused, one line, and the directory is left as the first has it."""
    from bertforge.distributed import embed_file
    from bertforge.fileio import sole_writer

    texts, out = tmp_path / "texts.txt", tmp_path / "vectors"
    texts.write_text("".join(t + "\n" for t in TEXTS))
    options = dict(ray=RayOptions(workers=1), chunk=8, progress=False, precision="fp32")
    with sole_writer(out, "embed --ray job"):  # the first job, still running
        with pytest.raises(ConfigError, match=r"vectors: another embed --ray job is writing it"):
            embed_file(minilm_dir, texts, out, **options)
        assert list(out.iterdir()) == []
    embed_file(minilm_dir, texts, out, **options)  # the lock given back: runs
    assert json.loads((out / "embed.json").read_text())["finished"]


def test_embed_ray_bad_outputs_and_options_are_one_line(
    cluster: str, minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bertforge.cli import main

    texts = tmp_path / "texts.txt"
    texts.write_text("one\ntwo\n")
    cases = [
        (["--out", str(tmp_path / "v.npy")], "give a directory, not a .npy or JSONL file"),
        (["--out", str(tmp_path / "d"), "--truncate"], "--truncate is not used by embed --ray"),
        (
            ["--out", str(tmp_path / "d"), "--embedding-precision", "int8"],
            "--embedding-precision int8 is not used by embed --ray",
        ),
    ]
    for extra, said in cases:
        assert main(["embed", str(minilm_dir), str(texts), "--ray", "127.0.0.1:1", *extra]) == 2
        assert said in capsys.readouterr().err
    argv = ["embed", str(minilm_dir), str(texts), "--out", str(tmp_path / "x.npy"), "--chunk", "8"]
    assert main(argv) == 2 and "--chunk need --ray" in capsys.readouterr().err
    argv = ["embed", str(minilm_dir), str(texts), "--out", str(tmp_path / "d"), "--chunk", "0"]
    assert main([*argv, "--ray", cluster]) == 2
    assert "chunk=0 (--chunk): must be >= 1" in capsys.readouterr().err
    argv = ["embed", str(minilm_dir), str(texts), str(tmp_path / "gone.txt"), "--ray", cluster]
    assert main([*argv, "--out", str(tmp_path / "d")]) == 2
    assert "gone.txt: no such file, directory or matching files" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    argv = ["embed", str(minilm_dir), str(texts), str(texts), "--out", str(tmp_path / "x.npy")]
    assert main(argv) == 2 and "several are read by a Ray cluster's workers (--ray)" in (
        capsys.readouterr().err
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("x")
    argv = ["embed", str(minilm_dir), str(texts), "--out", str(other), "--ray", cluster]
    assert main(argv) == 2 and "a directory of other files" in capsys.readouterr().err
    assert (other / "mine.txt").read_text() == "x"


def test_a_worker_killed_while_it_is_created_is_restarted(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """Workers killed in their creation task (before the model is loaded: a slow start on a
    busy node), twice, are made again, and the job is still exactly once."""
    from bertforge.distributed import embed_file

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(t + "\n" for t in TEXTS))
    killed: list[int] = []

    def kill_in_creation() -> None:
        deadline = time.time() + 60
        while time.time() < deadline and len(killed) < 2:
            for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
                try:
                    title = (Path("/proc") / pid / "cmdline").read_bytes()
                except OSError:
                    continue
                created = b"PipelineWorker.__init__" in title and _ours(int(pid))
                if created and int(pid) not in killed:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
                    break
            time.sleep(0.01)

    killer = threading.Thread(target=kill_in_creation)
    killer.start()
    out = embed_file(minilm_dir, texts, tmp_path / "v", ray=RayOptions(workers=2), **ONE)
    killer.join()
    assert len(killed) == 2, "no two workers were seen in their creation"
    from bertforge.pipelines import Pipeline

    ids, _, got = read_parts(out)
    assert ids == [str(n) for n in range(1, len(TEXTS) + 1)]
    np.testing.assert_allclose(got, Pipeline(minilm_dir, precision="fp32").embed(TEXTS), atol=1e-6)


@contextmanager
def every_worker_killed(doing: bytes, seconds: float = 60) -> Iterator[list[int]]:
    """The block's job with each worker killed as soon as it is seen `doing` (its process title:
    b"__init__" its creation, b"vectors" a chunk), until the block ends or `seconds` pass: a
    node where a worker dies every time. The pids killed."""
    killed: list[int] = []
    stop = threading.Event()

    def kill() -> None:
        deadline = time.time() + seconds
        while not stop.is_set() and time.time() < deadline:
            for pid in (p.name for p in Path("/proc").iterdir() if p.name.isdigit()):
                try:
                    title = (Path("/proc") / pid / "cmdline").read_bytes()
                except OSError:
                    continue
                mine = b"PipelineWorker." + doing in title and _ours(int(pid))
                if mine and int(pid) not in killed:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
            time.sleep(0.01)

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        yield killed
    finally:
        stop.set()
        killer.join()


def test_a_chunk_whose_worker_dies_each_time_stops_the_job(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """A chunk that kills its worker every time (a text too big for a node's memory, a crash
    in a native library) is tried TRIES times, then the job stops with one line naming the
    lines it held; it was tried forever (max_task_retries=-1), the job never ending."""
    from bertforge.distributed import TRIES, embed_file
    from bertforge.errors import UnavailableError

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(t + "\n" for t in TEXTS))
    start = time.time()
    with every_worker_killed(b"vectors") as killed, pytest.raises(UnavailableError) as e:
        embed_file(minilm_dir, texts, tmp_path / "v", ray=RayOptions(workers=1), **ONE)
    assert time.time() - start < 55 and len(killed) >= TRIES
    said = str(e.value)
    assert "\n" not in said and f"tried {TRIES} times" in said
    assert f"lines 1-4 of {texts}" in said or f"lines 5-8 of {texts}" in said
    assert json.loads((tmp_path / "v" / "embed.json").read_text())["finished"] is False


def test_a_worker_that_dies_each_time_it_is_created_stops_the_job(
    cluster: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """A worker that dies in its creation every time (a node that cannot start it) is
    restarted RESTARTS times, then the job stops with one line; it was restarted forever
    (max_restarts=-1), the job never ending and nothing said."""
    from bertforge.distributed import RESTARTS
    from bertforge.errors import UnavailableError

    start = time.time()
    with every_worker_killed(b"__init__") as killed, pytest.raises(UnavailableError) as e:
        index_corpus(
            minilm_dir,
            write_corpus(tmp_path / "c.jsonl"),
            tmp_path / "idx",
            ray=RayOptions(workers=1),
            **ONE,
        )
    assert time.time() - start < 55 and len(killed) == RESTARTS + 1
    said = str(e.value)
    assert "\n" not in said and f"restarted {RESTARTS} times" in said
    assert said.startswith("a Ray worker died while starting or loading its model")


def test_a_file_given_as_the_ray_address_is_named(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ray takes an optional address, so `--ray corpus.jsonl` swallowed the input: the error
    was about the missing corpus (or stdin), not the option that took it."""
    from bertforge.cli import main

    corpus = write_corpus(tmp_path / "c.jsonl")
    texts = tmp_path / "texts.txt"
    texts.write_text("one\n")
    for argv in (
        ["index", str(minilm_dir), "--ray", str(corpus), "--out", str(tmp_path / "idx")],
        ["embed", str(minilm_dir), "--ray", str(texts), "--out", str(tmp_path / "d")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"bertforge: error: --ray {argv[3]}: a file, not a cluster address (HOST:PORT, "
            "ray://HOST:PORT or auto): put the input files before --ray"
        ]
    argv = ["index", str(minilm_dir), str(corpus), "--out", str(tmp_path / "idx")]
    assert main([*argv, "--ray", "my cluster"]) == 2
    assert (
        "--ray my cluster: not a cluster address (HOST:PORT, ray://HOST:PORT or auto)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "idx").exists() and not (tmp_path / "d").exists()
