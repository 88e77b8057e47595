"""The PostgreSQL backend (bertforge.search.postgres, `index --to`, `search DSN`, `serve --index
DSN`) against a real PostgreSQL + pgvector started by the suite (tests/pg_server.py): its
searches against the directory index's on the same corpus and by hand, a build killed with
SIGKILL and resumed, upserts that embed only changed text, deletes, filters (a selective one
still gets its top k where the graph falls short), a reader that sees each document of a
concurrent upsert old or new, mining that reads only its candidates' texts, the model check,
SQL-injection attempts, the DSN's password kept out of every message, and the server's 503
while the database is down or a lock holds its search past the statement timeout, and its
recovery."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.errors import ConfigError, DataError, UnavailableError, redacted
from bertforge.pipelines import Pipeline
from bertforge.search import Index, PgOptions, fuse_runs, open_index
from bertforge.search.postgres import PgIndex
from tests.test_search import DOCS, QUERIES, set_up_otherwise

pytest.importorskip("psycopg")
REPO = Path(__file__).resolve().parents[1]
META = [
    {"lang": "en", "year": 2020},
    {"lang": "en", "year": 2021},
    {"lang": "fr", "year": 2020},
    {"lang": "en", "year": 2019},
    {"lang": "de", "year": 2020},
    {"lang": "en", "year": 2021},
]


def write_corpus(path: Path, docs: list[str] = DOCS, meta: list[dict] = META) -> Path:
    lines = [
        json.dumps({"id": f"d{i}", "text": t, **m}) for i, (t, m) in enumerate(zip(docs, meta))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def build(model: Path, corpus: Path, dsn: str, table: str, **options: Any) -> PgIndex:
    return PgIndex.build(
        model, corpus, dsn, table=table, chunk=2, progress=False, precision="fp32", **options
    )


def build_stopped(monkeypatch: pytest.MonkeyPatch, chunk: int, *args: Any) -> None:
    """build(*args) stopped as a kill stops it when it reaches its `chunk`-th chunk: the
    chunks before it committed, nothing after."""
    real, calls = PgIndex._write_chunk, []

    def stopped(self: PgIndex, *a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == chunk:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(PgIndex, "_write_chunk", stopped)
        build(*args)


def same_rows(a: PgIndex, b: PgIndex) -> None:
    """Both tables hold the same documents (their numbers aside) and windows, the vectors
    equal to float32 rounding (a text embedded in another batch)."""
    got = []
    for index in (a, b):
        t = index.pg.table
        with index.db.connection() as conn:
            docs = conn.execute(
                f"SELECT id, text, metadata, text_sha256 FROM {t} ORDER BY id"
            ).fetchall()
            windows = conn.execute(
                f"SELECT id, w, span_start, span_end, embedding::text FROM {t}_windows "
                "ORDER BY id, w"
            ).fetchall()
        got.append((docs, [w[:4] for w in windows], [json.loads(w[4]) for w in windows]))
    assert got[0][:2] == got[1][:2]
    np.testing.assert_allclose(np.array(got[0][2]), np.array(got[1][2]), atol=1e-5)


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path, postgres_dsn: str) -> PgIndex:
    tmp = tmp_path_factory.mktemp("pg")
    return build(minilm_dir, write_corpus(tmp / "corpus.jsonl"), postgres_dsn, "docs")


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Index:
    tmp = tmp_path_factory.mktemp("dir")
    path = write_corpus(tmp / "corpus.jsonl")
    return Index.build(minilm_dir, path, tmp / "idx", chunk=2, progress=False, precision="fp32")


def test_dense_search_is_the_directory_index_s(pg: PgIndex, directory: Index) -> None:
    """Dense search, exact or through HNSW (a tiny corpus: the graph finds every window), and
    passages: the same documents, order and scores as the directory index (a long document by
    its best window)."""
    assert pg.count() == (len(DOCS), len(directory.windows))
    assert pg.meta["model_sha256"] == directory.meta["model_sha256"]
    assert pg.meta["metric"] == "cosine" and pg.meta["vector_type"] in ("vector", "halfvec")
    want = directory.search(QUERIES, top_k=6, text=True, passage=True)
    exact = PgIndex.open(pg.db.dsn, PgOptions(table="docs", exact=True))
    for index in (pg, exact):
        got = index.search(QUERIES, top_k=6, text=True, passage=True)
        for g, w in zip(got, want):
            assert [h["id"] for h in g] == [h["id"] for h in w]
            assert [h["text"] for h in g] == [h["text"] for h in w]
            assert [h["passage"] for h in g] == [h["passage"] for h in w]
            np.testing.assert_allclose([h["score"] for h in g], [h["score"] for h in w], atol=2e-5)
    exact.close()
    assert [row[0]["id"] for row in pg.search(QUERIES, top_k=1)] == ["d2", "d0", "d1", "d5"]


def test_text_search_is_postgres_ts_rank_and_hybrid_fuses(pg: PgIndex) -> None:
    """mode bm25 here: PostgreSQL's ts_rank over the documents sharing any English word with
    the query, best first, computed here by SQL of our own; hybrid: fusion.py's fusion of the
    dense and text lists."""
    query = "the tower in paris and the great wall"
    with pg.db.connection() as conn:
        want = conn.execute(
            "SELECT id, ts_rank(to_tsvector('english', text), "
            "to_tsquery('english', 'tower | paris | great | wall')) AS s FROM docs "
            "WHERE to_tsvector('english', text) @@ to_tsquery('english', 'tower | paris | great | "
            "wall') ORDER BY s DESC, n"
        ).fetchall()
    got = pg.search([query], top_k=6, mode="bm25")[0]
    assert [h["id"] for h in got] == [i for i, _ in want] and len(got) == 2
    np.testing.assert_allclose([h["score"] for h in got], [s for _, s in want], rtol=1e-6)
    assert pg.search(["zebra quantum"], top_k=3, mode="bm25") == [[]]  # no word in common
    for fusion, alpha in (("rrf", 0.5), ("zscore", 0.7)):
        dense, text = pg.dense(QUERIES, 100), pg.text_search(QUERIES, 100)
        docs, scores = fuse_runs([dense, text], fusion, alpha, 3)
        got = pg.search(QUERIES, top_k=3, mode="hybrid", fusion=fusion, alpha=alpha)
        numbers = {i: n for n, i, _ in pg.documents()}
        for row, d, s in zip(got, docs, scores):
            assert [numbers[h["id"]] for h in row] == [x for x in d.tolist() if x >= 0]
            np.testing.assert_allclose([h["score"] for h in row], s[: len(row)], rtol=1e-9)


def test_filters_are_bound_and_combine(pg: PgIndex, directory: Index) -> None:
    en = pg.search(QUERIES, top_k=6, where={"lang": "en"})
    assert all({h["id"] for h in row} == {"d0", "d1", "d3", "d5"} for row in en)
    both = pg.search(QUERIES, top_k=6, mode="hybrid", where={"lang": "en", "year": "2021"})
    assert all({h["id"] for h in row} <= {"d1", "d5"} for row in both)
    hamlet = pg.search(["hamlet"], 6, "bm25", where={"year": "2020"})
    assert [[h["id"] for h in row] for row in hamlet] == [["d2"]]
    assert pg.search(["hamlet"], 6, "bm25", where={"year": "2021"}) == [[]]
    exact = PgIndex.open(pg.db.dsn, PgOptions(table="docs", exact=True))
    assert [h["id"] for h in exact.search(["who wrote hamlet"], 6, where={"year": "2020"})[0]] == [
        h["id"] for h in pg.search(["who wrote hamlet"], 6)[0] if h["id"] in ("d0", "d2", "d4")
    ]
    exact.close()
    with pytest.raises(ConfigError, match="a directory index keeps no metadata"):
        directory.search(QUERIES, where={"lang": "en"})


# fmt: off
SUBJECTS = ["The farmer", "A young pilot", "My neighbour", "The old painter", "A chemist",
            "The river guide", "Our teacher", "A football coach", "The baker", "A sailor"]
VERBS = ["repaired", "painted", "sold", "described", "photographed", "studied", "carried",
         "cleaned", "measured", "borrowed"]
OBJECTS = ["a wooden boat", "the red bicycle", "an ancient map", "a bag of apples",
           "the broken clock", "a mountain cabin", "the violin", "a box of letters",
           "the garden fence", "a telescope"]
# fmt: on


def sentences(n: int, seed: int = 0) -> list[str]:
    """n different short sentences (one window each), drawn from 1,000 by a seeded generator."""
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(SUBJECTS) * len(VERBS) * len(OBJECTS), n, replace=False)
    return [
        f"{SUBJECTS[i // 100]} {VERBS[i // 10 % 10]} {OBJECTS[i % 10]} on day {j}."
        for j, i in enumerate(picks.tolist())
    ]


def test_a_selective_filter_still_finds_k(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    """A filter that keeps 20 of 600 documents (every 30th, whatever its text), the search run
    the way PostgreSQL runs it on a large table: through the graph, pgvector 0.6 filtering its
    ef_search (100) candidates after the scan (on a table this small the planner would scan
    the matching rows instead; enable_sort off, given in the DSN, makes it take the graph).
    The graph's candidates hold fewer than 10 matching windows; the search (the graph again at
    its most, then an exact scan of the matching documents) gives exactly 10, the top 10 of the
    matching documents with their exact scores (computed here from the model's vectors), as
    --exact does; a filter that keeps 4 gives those 4."""
    texts = sentences(600)
    meta = [{"group": "rare" if i % 30 == 7 else "common"} for i in range(600)]
    for i in (0, 7, 37, 67, 97):  # four rare ones, one common one
        meta[i]["tag"] = "x"
    path = write_corpus(tmp_path / "c.jsonl", texts, meta)
    built = PgIndex.build(
        minilm_dir, path, postgres_dsn, table="filtered", chunk=200, progress=False,
        precision="fp32",
    )  # fmt: skip
    built.close()
    graph_dsn = postgres_dsn + "&options=-c%20enable_sort%3Doff"
    index = PgIndex.open(graph_dsn, PgOptions(table="filtered"))
    query = "the fisherman fixed an old wooden ship"
    rare = [i for i, m in enumerate(meta) if m["group"] == "rare"]
    pipe = index.use_model()
    cos = pipe.embed([texts[i] for i in rare]) @ pipe.embed([query])[0]  # (20,)
    order = np.argsort(-cos, kind="stable")
    with index.db.connection() as conn:  # the graph's part of the search, by hand
        conn.execute("SET LOCAL hnsw.ef_search = 100")
        (near,) = conn.execute(
            "SELECT count(*) FROM (SELECT w.id FROM filtered_windows w JOIN filtered d "
            "ON d.id = w.id WHERE d.metadata ->> 'group' = 'rare' ORDER BY w.embedding <=> "
            "%s::" + index.meta["vector_type"] + " LIMIT 40) x",
            [json.dumps(pipe.embed([query])[0].tolist())],
        ).fetchone()
    assert near < 10  # what the graph alone gives: fewer than asked for
    exact = PgIndex.open(postgres_dsn, PgOptions(table="filtered", exact=True))
    for i in (index, exact):
        got = i.search([query], top_k=10, where={"group": "rare"})[0]
        assert [h["id"] for h in got] == [f"d{rare[j]}" for j in order[:10]]
        np.testing.assert_allclose([h["score"] for h in got], cos[order[:10]], atol=1e-5)
    hybrid = index.search([query], top_k=10, mode="hybrid", where={"group": "rare"})[0]
    assert len(hybrid) == 10 and {h["id"] for h in hybrid} <= {f"d{i}" for i in rare}
    few = index.search([query], top_k=10, where={"group": "rare", "tag": "x"})[0]
    assert sorted(h["id"] for h in few) == ["d37", "d67", "d7", "d97"]
    index.close()
    exact.close()


def test_a_request_never_makes_postgres_score_the_whole_table(
    pg: PgIndex, directory: Index, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the graph's candidates hold fewer than k documents, the exact scan runs only where
    the windows it would score are at most EXACT_FALLBACK (every window of a small table, or
    those of the documents a filter keeps); else the graph's answer stands. A top_k of 1,000
    once made each query of a request score every window of the table. Here the graph gives 2
    windows (EF_SEARCH_MAX 2; enable_sort off makes the planner take it) of the 6 documents."""
    import bertforge.search.postgres as postgres

    monkeypatch.setattr(postgres, "EF_SEARCH_MAX", 2)
    index = PgIndex.open(postgres_dsn + "&options=-c%20enable_sort%3Doff", PgOptions(table="docs"))
    windows = pg.count()[1]
    with pg.db.connection() as conn:
        (english,) = conn.execute(
            "SELECT count(*) FROM docs_windows w JOIN docs d ON d.id = w.id "
            "WHERE d.metadata ->> 'lang' = 'en'"
        ).fetchone()
    want = [[h["id"] for h in row] for row in directory.search(QUERIES, top_k=6)]
    kept = {"d0", "d1", "d3", "d5"}  # the English ones
    for bound, where, expect in (
        (windows, None, want),  # every window: few enough, exact
        (english, {"lang": "en"}, [[i for i in row if i in kept] for row in want]),
        (windows - 1, None, None),  # more: the graph's documents (of its 2 windows)
        (english - 1, {"lang": "en"}, None),
    ):
        monkeypatch.setattr(postgres, "EXACT_FALLBACK", bound)
        got = [[h["id"] for h in row] for row in index.search(QUERIES, top_k=6, where=where)]
        if expect is None:
            assert all(len(row) <= 2 for row in got) and (where or all(got))
        else:
            assert got == expect
    index.close()


def test_a_nul_character_is_named_by_its_corpus_line(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    """PostgreSQL's text and jsonb hold no NUL: a corpus line with one is an error naming the
    line and field before anything is written (it once failed the write, naming the table)."""
    for line, field in (
        ({"id": "b", "text": "a NUL \u0000 here"}, "text"),
        ({"id": "b", "text": "fine", "tags": ["x\u0000"]}, "tags"),
    ):
        path = tmp_path / "nul.jsonl"
        path.write_text(json.dumps({"id": "a", "text": "fine"}) + "\n" + json.dumps(line) + "\n")
        with pytest.raises(DataError, match=f'line 2: field "{field}": holds a NUL'):
            build(minilm_dir, path, postgres_dsn, "nul")
        with pytest.raises(DataError, match="not a bertforge index"):
            PgIndex.open(postgres_dsn, PgOptions(table="nul"))


def one_version(hits: list[dict], refs: list[dict[str, dict]]) -> int:
    """Which version (an index of refs: {id: its hit when the table held that version}) every
    hit of one search is, whole: its text, its passage and its score; AssertionError if any
    hit is none, or the hits are of different versions."""
    seen = set()
    for h in hits:
        same = [
            v for v, ref in enumerate(refs)
            if (h["text"], h["passage"]) == (ref[h["id"]]["text"], ref[h["id"]]["passage"])
            and abs(h["score"] - ref[h["id"]]["score"]) < 1e-5
        ]  # fmt: skip
        assert same, f"{h['id']}: text, passage and score of no one version: {h}"
        seen.update(same)
    assert len(seen) == 1, f"one search saw versions {seen}"
    return seen.pop()


def while_writing(writer: PgIndex, versions: list[list], search: Any) -> Iterator[list[dict]]:
    """search()'s hits again and again while another thread writes the versions in turn, ten
    times (each write one chunk: one transaction)."""
    failed: list[BaseException] = []

    def write_back_and_forth() -> None:
        try:
            for r in range(10):
                writer.write(versions[r % 2])
        except BaseException as e:  # said after the reads
            failed.append(e)

    thread = threading.Thread(target=write_back_and_forth)
    thread.start()
    while thread.is_alive():
        yield search()
    thread.join()
    assert not failed, failed


def test_a_reader_sees_each_document_old_or_new(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    """Four documents of several windows each, in two versions (other text: other windows and
    vectors). While one thread writes them back and forth between the versions (one chunk,
    one transaction each time), another searches them again and again with their texts and
    passages: every search sees one version whole, each hit's text, passage (its best window,
    cut from that text) and score (that window's) as a search of that version alone gives
    them, and both versions are seen. Then a version committed between a search's ranking and
    its reading of the texts (the write put there by hand): the search still sees the version
    it ranked."""
    text = [" ".join(sentences(16, seed=v)[4 * i : 4 * i + 4]) for v in (1, 2) for i in range(4)]
    versions = [[(f"d{i}", text[4 * v + i], {}) for i in range(4)] for v in (0, 1)]
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t, _ in versions[0]))
    options = {"window": 16, "stride": 8, "progress": False, "precision": "fp32"}
    PgIndex.build(minilm_dir, path, postgres_dsn, table="versions", **options).close()
    reader = PgIndex.open(postgres_dsn, PgOptions(table="versions"))
    writer = PgIndex.open(postgres_dsn, PgOptions(table="versions"))
    assert reader.count()[1] >= 12  # several windows a document
    query = ["a sailor repaired the old boat"]

    def search() -> list[dict]:
        return reader.search(query, top_k=4, text=True, passage=True)[0]

    refs = []
    for v in (0, 1):
        writer.write(versions[v])
        refs.append({h["id"]: h for h in search()})
    assert all(refs[0][i]["passage"] != refs[1][i]["passage"] for i in refs[0])
    seen = [one_version(hits, refs) for hits in while_writing(writer, versions, search)]
    assert len(seen) > 10 and set(seen) == {0, 1}  # the reads ran among the writes
    now = one_version(search(), refs)  # the version the last write left
    real = PgIndex._documents

    def commit_first(self: PgIndex, numbers: set[int]) -> Any:
        writer.write(versions[1 - now])  # committed after the ranking, before the texts
        return real(self, numbers)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(PgIndex, "_documents", commit_first)
        assert one_version(search(), refs) == now
    assert one_version(search(), refs) == 1 - now
    reader.close()
    writer.close()


def test_mining_reads_only_the_candidates_texts(
    pg: PgIndex, directory: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mine over the table: the directory index's negatives (dense), by text or by id, whole or
    one query at a time; the texts it reads are its candidates' only, a batch at a time (one
    query's: 3 of the 6 documents), never the table's."""
    from bertforge.search import mining

    positives = [DOCS[2], DOCS[0], DOCS[1], DOCS[5]]  # each query's own document
    options = {"negatives": 2, "depth": 3, "mode": "dense"}
    want = mining.mine(directory, QUERIES, positives, **options).negatives
    assert all(n is not None and len(n) == 2 for n in want)
    asked: list[set[int]] = []
    real = PgIndex.texts_of
    monkeypatch.setattr(PgIndex, "texts_of", lambda self, d: asked.append(set(d)) or real(self, d))
    assert mining.mine(pg, QUERIES, positives, **options).negatives == want
    assert len(asked) == 1  # the four queries: one batch
    monkeypatch.setattr(mining, "QUERIES_AT_ONCE", 1)
    ids = ["d2", "d0", "d1", "d5"]
    assert mining.mine(pg, QUERIES, positives, positive_ids=ids, **options).negatives == want
    assert len(asked) == 5 and all(len(a) == 3 for a in asked[1:])  # each query's candidates


def test_a_killed_build_resumes_and_ends_equal(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    """A build killed with SIGKILL in its third chunk keeps the chunks written; run again, it
    embeds only the documents missing and its tables equal an uninterrupted build's."""
    path = write_corpus(tmp_path / "corpus.jsonl")
    script = f"""
import os, signal
from bertforge.pipelines import Pipeline
from bertforge.search.postgres import PgIndex
real, calls = Pipeline.embed, []
def embed(self, rows, *a, **k):
    calls.append(len(rows))
    if len(calls) == 4:  # the probe of the dimensions, chunks 1 and 2, then chunk 3: killed
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, rows, *a, **k)
Pipeline.embed = embed
PgIndex.build({str(minilm_dir)!r}, {str(path)!r}, {postgres_dsn!r}, table="killed", chunk=2,
              progress=False, precision="fp32")
"""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, timeout=300)
    assert done.returncode == -9
    with pytest.warns(UserWarning, match="build has not finished"):  # refused without it
        half = PgIndex.open(postgres_dsn, PgOptions(table="killed", partial=True))
    before = half.count()
    assert before[0] == 4  # two whole chunks, nothing of the third
    embedded: list[int] = []
    real = Pipeline.embed

    def counted(self: Any, rows: Any, *a: Any, **k: Any) -> Any:
        embedded.append(len(rows))
        return real(self, rows, *a, **k)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Pipeline, "embed", counted)
        resumed = build(minilm_dir, path, postgres_dsn, "killed")
    assert resumed.written == {"new": 2, "changed": 0, "relabelled": 0, "kept": 4}
    # the probe of the dimensions, then the last two documents' windows only
    assert sum(embedded[1:]) == resumed.count()[1] - before[1] > 0
    whole = build(minilm_dir, path, postgres_dsn, "whole")
    same_rows(resumed, whole)
    for index in (half, resumed, whole):
        index.close()


def test_an_unfinished_build_is_refused_until_it_is_run_again(
    minilm_dir: Path,
    postgres_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build stopped in its third chunk (two of three committed: 4 of 6 documents) is refused
    by PgIndex.open, open_index, `search`, `mine` and the server, each saying that the build
    has not finished, how many documents it holds and how to finish it; --partial
    (PgOptions.partial) searches it as it is, with a warning; run again, the build finishes
    and the table opens. A search of a table that was finished when opened and is being
    built anew meanwhile is refused too, and a table recorded before builds recorded their
    state (none: taken as finished) still opens."""
    path = write_corpus(tmp_path / "corpus.jsonl")
    build_stopped(monkeypatch, 3, minilm_dir, path, postgres_dsn, "unfinished")
    said = "its build has not finished (4 of 6 documents so far)"
    for opening in (
        lambda: PgIndex.open(postgres_dsn, PgOptions(table="unfinished")),
        lambda: open_index(postgres_dsn, PgOptions(table="unfinished")),
    ):
        with pytest.raises(DataError, match=re.escape(said)) as caught:
            opening()
        assert "--table unfinished" in str(caught.value) and "--partial" in str(caught.value)
    queries, train = tmp_path / "q.txt", tmp_path / "train.jsonl"
    queries.write_text("\n".join(QUERIES) + "\n")
    train.write_text(json.dumps({"query": QUERIES[0], "positive": DOCS[2]}) + "\n")
    search = ["search", postgres_dsn, str(queries), "--table", "unfinished"]
    mine = ["mine", postgres_dsn, str(train), "--table", "unfinished", "--out"]
    for argv in (search, [*mine, str(tmp_path / "mined.jsonl")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and "run the index command" in err, err
    assert not (tmp_path / "mined.jsonl").exists()
    with pytest.warns(UserWarning, match=re.escape(said)):
        partial = PgIndex.open(postgres_dsn, PgOptions(table="unfinished", partial=True))
    assert len(partial.search(QUERIES, top_k=6)[0]) == 4  # what it holds
    assert main([*search, "--partial"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(QUERIES)
    pytest.importorskip("fastapi")
    from bertforge.serve import create_app

    with pytest.raises(DataError, match=re.escape(said)):
        create_app(minilm_dir, index=postgres_dsn, index_options=PgOptions(table="unfinished"))
    build(minilm_dir, path, postgres_dsn, "unfinished").close()  # run again: finished
    index = PgIndex.open(postgres_dsn, PgOptions(table="unfinished"))
    assert len(index.search(QUERIES, top_k=6)[0]) == 6
    with partial.db.connection() as conn:  # built anew under a running search
        conn.execute(
            'UPDATE unfinished_index SET value = \'{"finished": false, "documents": 9}\' '
            "WHERE key = 'build'"
        )
    with pytest.raises(DataError, match=re.escape("(6 of 9 documents so far)")):
        index.search(QUERIES, top_k=6)
    with partial.db.connection() as conn:  # as builds before this one left their tables
        conn.execute("DELETE FROM unfinished_index WHERE key = 'build'")
    assert len(index.search(QUERIES, top_k=6)[0]) == 6
    PgIndex.open(postgres_dsn, PgOptions(table="unfinished")).close()
    for i in (index, partial):
        i.close()


def test_upsert_embeds_only_what_changed_and_delete_removes(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write_corpus(tmp_path / "corpus.jsonl")
    index = build(minilm_dir, path, postgres_dsn, "upserted")
    docs = [*DOCS, "Penguins live in the southern hemisphere."]
    docs[1] = "Dogs are loyal companions that love long walks."  # changed text
    meta = [dict(m) for m in META] + [{"lang": "en", "year": 2022}]
    meta[3]["lang"] = "nl"  # changed metadata only
    write_corpus(path, docs, meta)
    embedded: list[list] = []
    real = Pipeline.embed

    def counted(self: Any, rows: Any, *a: Any, **k: Any) -> Any:
        embedded.append(list(rows))
        return real(self, rows, *a, **k)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Pipeline, "embed", counted)
        again = build(minilm_dir, path, postgres_dsn, "upserted")
    assert again.written == {"new": 1, "changed": 1, "relabelled": 1, "kept": 4}
    tok = again.use_model().tok
    pieces = [tok.encode(t, add_special_tokens=False).ids for t in (docs[1], docs[6])]
    got = [list(r) for rows in embedded[1:] for r in rows]
    assert got == [list(p) for p in pieces]  # those two, nothing else
    assert again.search(["what do dogs like"], top_k=1)[0][0]["id"] == "d1"
    assert again.search(["what do cats eat"], top_k=1, mode="bm25") == [[]]
    assert {h["id"] for h in again.search(QUERIES[:1], 7, where={"lang": "nl"})[0]} == {"d3"}
    fresh = build(minilm_dir, path, postgres_dsn, "fresh")
    same_rows(again, fresh)  # as if built from this corpus
    ids = tmp_path / "gone.txt"
    ids.write_text("d1\nd6\n\nnot-there\n")
    model = str(minilm_dir)
    common = ["index", model, "--to", postgres_dsn, "--table", "upserted"]
    assert main([*common, "--delete", str(ids)]) == 0
    said = capsys.readouterr().out
    assert "deleted 2 documents" in said and "1 id not in the table: not-there" in said, said
    ids.write_text("\n".join(["d1", "d0", *(f"gone{i}" for i in range(7)), "d6"]) + "\n")
    assert main([*common, "--delete", str(ids)]) == 0
    said = capsys.readouterr().out  # d0 deleted; d1 and d6 gone already; 7 never there
    assert "deleted 1 documents" in said, said
    assert "9 ids not in the table: d1, gone0, gone1, gone2, gone3 and 4 more" in said, said
    assert again.count() == (4, fresh.count()[1] - 3)  # d0, d1 and d6: one window each
    hits = {h["id"] for row in again.search(QUERIES, top_k=7, mode="hybrid") for h in row}
    assert not hits & {"d0", "d1", "d6"}
    both = ["index", model, str(path), "--to", postgres_dsn, "--table", "upserted"]
    assert main([*both, "--delete", str(ids)]) == 2  # a corpus or --delete, not both
    assert main(["index", model, str(path), "--delete", str(ids), "--out", "x"]) == 2
    assert "--to DSN" in capsys.readouterr().err
    for i in (index, again, fresh):
        i.close()


def test_the_model_is_checked_at_every_search(
    pg: PgIndex, minilm_dir: Path, tiny_model: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="not the model this index was built with"):
        open_index(postgres_dsn, PgOptions(table="docs"), model=str(tiny_model))
    with pytest.raises(ConfigError, match="another model or settings"):
        build(tiny_model, write_corpus(tmp_path / "c.jsonl"), postgres_dsn, "docs")
    index = build(minilm_dir, write_corpus(tmp_path / "c.jsonl"), postgres_dsn, "swapped")
    with index.db.connection() as conn:  # the table's record replaced under an open index
        conn.execute(
            "UPDATE swapped_index SET value = jsonb_set(value, '{model_sha256}', '\"0000\"')"
        )
    with pytest.raises(ConfigError, match="now holds an index of another model"):
        index.search(QUERIES, top_k=2)
    with pytest.raises(DataError, match="not a bertforge index"):
        PgIndex.open(postgres_dsn, PgOptions(table="nothing_here"))
    # its weights set up otherwise (here another pooling): the directory index's rule
    pooled = set_up_otherwise(minilm_dir, tmp_path / "pooled", "pooling")
    with pytest.raises(ConfigError, match="weights this index was built with .*pooling"):
        open_index(postgres_dsn, PgOptions(table="docs"), model=str(pooled))
    with pytest.raises(ConfigError, match=r"another model or settings \(pooling differ"):
        build(pooled, write_corpus(tmp_path / "c.jsonl"), postgres_dsn, "docs")
    # a record written before the tokenizer and length were kept: checked without them
    with index.db.connection() as conn:
        conn.execute(  # the model's own sha256 again, the tokenizer and length unrecorded
            "UPDATE swapped_index SET value = (value - 'tokenizer_sha256' - 'max_length') || "
            "jsonb_build_object('model_sha256', %s::text)",
            [pg.meta["model_sha256"]],
        )
    shorter = set_up_otherwise(minilm_dir, tmp_path / "shorter", "max_seq_length")
    assert open_index(postgres_dsn, PgOptions(table="swapped"), model=str(shorter)) is not None
    with pytest.raises(ConfigError, match="directory index's"):
        build(minilm_dir, tmp_path / "c.jsonl", postgres_dsn, "other", approximate="hnsw")
    index.close()


@pytest.mark.parametrize(
    "table", ["docs; DROP TABLE docs", 'a"b', "Robert'); --", "1docs", "x" * 49, "docs.x", ""]
)
def test_a_table_name_is_an_identifier(postgres_dsn: str, table: str) -> None:
    with pytest.raises(ConfigError, match="not a table name"):
        PgIndex.open(postgres_dsn, PgOptions(table=table))


def test_injection_attempts_are_inert(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path, pg: PgIndex
) -> None:
    """Ids, metadata keys and values, filters and queries full of SQL are data: stored and
    found as written, matching nothing they should not, dropping nothing."""
    evil = [
        "x'); DROP TABLE docs; --",
        'q" OR 1=1 --',
        "' OR '1'='1",
        "%(k)s; SELECT pg_sleep(10)",
    ]
    path = tmp_path / "evil.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": e, "text": f"{DOCS[i]} {e}", e: e, "lang": "en"}) + "\n"
            for i, e in enumerate(evil)
        )
    )
    index = build(minilm_dir, path, postgres_dsn, "evil")
    assert {d[1] for d in index.documents()} == set(evil)
    for e in evil:
        got = index.search([e], top_k=4, mode="hybrid", where={e: e})[0]
        assert [h["id"] for h in got] == [e]  # its own key and value: itself only
        assert index.search([e], top_k=4, where={"lang": e}) == [[]]
    operators = index.search(["hamlet & | ! ( ) :* <-> ' \\ ;"], top_k=4, mode="bm25")
    assert [[h["id"] for h in row] for row in operators] == [[evil[2]]]  # words, not syntax
    assert index.delete(["' OR '1'='1"]) == 1 and index.count()[0] == 3
    assert pg.count()[0] == len(DOCS)  # the other table is still there, whole
    index.close()


def test_the_password_is_never_shown(
    minilm_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "s3cr%40t-Pa55"  # percent-encoded in the URI: s3cr@t-Pa55
    dsn = f"postgresql://bob:{secret}@127.0.0.1:1/db"
    assert redacted(dsn) == "postgresql://bob:***@127.0.0.1:1/db"
    assert redacted("host=db password='a b' user=x") == "host=db password=*** user=x"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(UnavailableError) as e:
        PgIndex.open(dsn)
    assert "postgresql://bob:***@127.0.0.1:1/db" in str(e.value)
    queries = Path(os.devnull)
    assert main(["search", dsn, str(queries)]) == 2
    path = write_corpus(tmp_path / "c.jsonl")
    to = f"host=127.0.0.1 port=1 password={secret}"
    assert main(["index", str(minilm_dir), str(path), "--to", to, "--precision", "fp32"]) == 2
    out = capsys.readouterr()
    shown = out.out + out.err + caplog.text
    assert "the database is unavailable" in out.err
    for s in (secret, "s3cr@t-Pa55"):
        assert s not in shown


SECRET = "Sup3rS3cret"  # a password no output may show
KEY = "k3y-N0t-To-Be-Shown"  # the server's API key: the same


def test_no_verb_shows_a_password_or_the_api_key(
    minilm_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A password in a DSN of either form (a URI, libpq's key=value words, quoted or not), in
    $DATABASE_URL or $PGPASSWORD, and the server's API key, through the error paths of every
    verb that takes a DSN (index --to, index --delete, search, mine, serve --index: a server
    that does not answer, 127.0.0.1 port 1; a DSN libpq cannot read; an option the verb lacks):
    each one error, exit status 2, naming the database, and nothing printed, logged or warned
    shows a secret."""
    caplog.set_level(logging.DEBUG)
    corpus, queries = write_corpus(tmp_path / "c.jsonl"), tmp_path / "q.txt"
    queries.write_text("who wrote hamlet\n")
    ids, train = tmp_path / "ids.txt", tmp_path / "train.jsonl"
    ids.write_text("d1\n")
    train.write_text(json.dumps({"query": QUERIES[0], "positive": DOCS[2]}) + "\n")
    model, mined = str(minilm_dir), str(tmp_path / "mined.jsonl")

    def verbs(dsn: str, to: list[str]) -> list[list[str]]:
        return [
            ["index", model, str(corpus), *to, "--precision", "fp32", "--no-progress"],
            ["index", model, *to, "--delete", str(ids)],
            ["search", dsn, str(queries)],
            ["mine", dsn, str(train), "--out", mined],
            ["serve", model, "--index", dsn, "--api-key", KEY, "--precision", "fp32"],
        ]

    uri = f"postgresql://bob:{SECRET}@127.0.0.1:1/db"
    given = [uri, f"host=127.0.0.1 port=1 user=bob password={SECRET} dbname=db"]
    given += [f"port=1 host = 127.0.0.1 password = '{SECRET} two words'"]
    shown = []
    with warnings.catch_warnings(record=True) as warned:
        for dsn in given:
            for argv in verbs(dsn, ["--to", dsn]):
                assert main(argv) == 2, argv
                err = capsys.readouterr().err
                assert "the database is unavailable" in err, (argv, err)
                assert "127.0.0.1" in err and "***" in err, err  # the database named, redacted
                shown.append(err)
        environments = [{"DATABASE_URL": uri}, {"PGHOST": "127.0.0.1", "PGPORT": "1"}]
        environments[1]["PGPASSWORD"] = SECRET
        for env in environments:
            with monkeypatch.context() as m:
                for name, value in env.items():
                    m.setenv(name, value)
                for argv in verbs("postgresql://", ["--to"]):
                    assert main(argv) == 2, argv
                    err = capsys.readouterr().err
                    assert "the database is unavailable" in err, (argv, err)
                    shown.append(err)
        unreadable = f"host=127.0.0.1 password={SECRET} dbname='unterminated"
        assert main(["search", unreadable, str(queries)]) == 2
        assert "not a PostgreSQL DSN" in capsys.readouterr().err
        for key in (["--api-key", KEY], [f"--api-key={KEY}"], ["--api", KEY]):
            with pytest.raises(SystemExit, match="2"):  # a usage error: search has no key
                main(["search", uri, str(queries), *key])
            assert "unrecognized arguments" in capsys.readouterr().err
        with monkeypatch.context() as m:
            m.setenv("BERTFORGE_API_KEY", KEY)
            assert main(["serve", model, "--index", given[1], "--precision", "fp32"]) == 2
        for dsn in given:
            with pytest.raises(UnavailableError) as caught:
                open_index(dsn, PgOptions(table="docs"))
            shown.append(str(caught.value))
    out = capsys.readouterr()
    shown += [out.out, out.err, caplog.text, *(str(w.message) for w in warned)]
    for text in shown:
        assert SECRET not in text and KEY not in text, text


def test_cli_index_search_and_rerank(
    minilm_dir: Path,
    tiny_model: Path,
    postgres_dsn: str,
    directory: Index,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    from tests.test_search import _saturating_cross_encoder

    path = write_corpus(tmp_path / "corpus.jsonl")
    common = ["--precision", "fp32", "--no-progress", "--chunk", "3"]
    assert (
        main(["index", str(minilm_dir), str(path), "--to", postgres_dsn, "--table", "cli", *common])
        == 0
    )
    assert "6 new" in capsys.readouterr().out
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    search = ["search", postgres_dsn, str(queries), "--table", "cli", "--top-k", "3"]
    assert main([*search, "--exact", "--where", "lang=en", "--where", "year=2021"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4]
    assert all({h["id"] for h in r["results"]} <= {"d1", "d5"} for r in rows)
    ce = _saturating_cross_encoder(tiny_model, tmp_path / "ce")
    rerank = ["--rerank", str(ce), "--rerank-depth", "4", "--exact"]
    assert main([*search, *rerank]) == 0
    got = [json.loads(x)["results"] for x in capsys.readouterr().out.splitlines()]
    assert main(["search", str(directory.path), str(queries), "--top-k", "3", *rerank[:4]]) == 0
    want = [json.loads(x)["results"] for x in capsys.readouterr().out.splitlines()]
    assert [[h["id"] for h in r] for r in got] == [[h["id"] for h in r] for r in want]
    assert main([*search, "--where", "lang"]) == 2
    assert "must be FIELD=VALUE" in capsys.readouterr().err
    assert main(["search", str(directory.path), str(queries), "--table", "cli"]) == 2
    assert "a PostgreSQL index's" in capsys.readouterr().err
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"query": QUERIES[0], "positive": DOCS[2]}) + "\n")
    mined = tmp_path / "mined.jsonl"
    mine = ["mine", postgres_dsn, str(train), "--table", "cli", "--out", str(mined)]
    for flags in (["--mode", "hybrid"], ["--margin", "0"]):
        mined.unlink(missing_ok=True)
        assert main([*mine, "--negatives", "2", *flags]) == 0
        (row,) = [json.loads(x) for x in mined.read_text().splitlines()]
        assert row["positive"] == DOCS[2] and len(row["negatives"]) == 2
        assert DOCS[2] not in row["negatives"]


def test_server_searches_postgres_and_answers_503_while_it_is_down(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """serve --index DSN: /search through the pool; the database stopped: 503 {"error"}, and
    /ready 503 saying so while /health stays 200 (alive: a restart would not help); the
    database back: both answer again, the server never restarted."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app
    from tests.pg_server import restart, running, stop

    with running() as server:
        dsn = server.get_uri()
        build(minilm_dir, write_corpus(tmp_path / "c.jsonl"), dsn, "served").close()
        app = create_app(
            minilm_dir, index=dsn, index_options=PgOptions(table="served"), precision="fp32"
        )
        body = {"queries": QUERIES, "top_k": 2, "mode": "hybrid", "where": {"lang": "en"}}
        with TestClient(app) as client:
            first = client.post("/search", json=body)
            assert first.status_code == 200
            assert all(
                {h["id"] for h in row} <= {"d0", "d1", "d3", "d5"}
                for row in first.json()["results"]
            )
            assert client.get("/ready").json() == {"status": "ok"}
            stop(server)
            down = client.post("/search", json=body)
            assert down.status_code == 503
            assert "the database is unavailable" in down.json()["error"]
            for method in ("GET", "HEAD"):
                assert client.request(method, "/ready").status_code == 503
                assert client.request(method, "/health").status_code == 200
            assert "the database is unavailable" in client.get("/ready").json()["error"]
            restart(server)
            deadline = time.monotonic() + 60  # the pool reconnects in the background
            while (back := client.post("/search", json=body)).status_code != 200:
                assert time.monotonic() < deadline, back.json()
                time.sleep(0.5)
            assert back.status_code == 200 and back.json() == first.json()
            assert client.get("/ready").status_code == 200
        app.state.index.close()


def test_server_answers_503_while_a_lock_holds_the_search_and_recovers(
    minilm_dir: Path, postgres_dsn: str, tmp_path: Path
) -> None:
    """serve --index DSN --statement-timeout 1: another session holds an ACCESS EXCLUSIVE lock
    on the index's table in an open transaction, so a search's statement waits; PostgreSQL
    cancels it at the timeout and /search answers 503 {"error"} while the lock is still held
    (a guard lets go of it after 60 s, so a search that waited for it fails the test instead of
    hanging); the lock released, the next search is 200 with the same results, the server
    never restarted."""
    pytest.importorskip("fastapi")
    import psycopg
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    build(minilm_dir, write_corpus(tmp_path / "c.jsonl"), postgres_dsn, "locked").close()
    pg = PgOptions(table="locked", statement_timeout=1.0)
    app = create_app(minilm_dir, index=postgres_dsn, index_options=pg, precision="fp32")
    body = {"queries": QUERIES, "top_k": 2, "mode": "hybrid", "where": {"lang": "en"}}
    with TestClient(app) as client, psycopg.connect(postgres_dsn) as holder:
        first = client.post("/search", json=body)
        assert first.status_code == 200
        holder.execute("LOCK TABLE locked IN ACCESS EXCLUSIVE MODE")  # held until rollback
        let_go = threading.Timer(60, holder.rollback)
        let_go.start()
        start = time.monotonic()
        locked = client.post("/search", json=body)
        waited = time.monotonic() - start
        held = let_go.is_alive()  # the guard has not let go: the answer came under the lock
        let_go.cancel()
        holder.rollback()
        assert held and waited >= 1.0  # it waited for the lock until the timeout, not longer
        assert locked.status_code == 503
        error = locked.json()["error"]
        assert "statement timeout (1 s, --statement-timeout)" in error
        back = client.post("/search", json=body)
        assert back.status_code == 200 and back.json() == first.json()
    app.state.index.close()


def test_a_refused_login_is_no_outage(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A wrong password, no password, a role or a database that does not exist: one
    ConfigError naming the database (its password as ***) and what the server said, never
    "unavailable ... retry when it is back" (retrying will not help); a server that does not
    answer stays an UnavailableError. The right password: searched and served, and while the
    database is down the server's 503s do not show it either."""
    import psycopg

    from tests.pg_server import running

    with running() as server:
        dsn = server.get_uri()
        host = dsn.split("host=")[1]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE bob SUPERUSER LOGIN PASSWORD '{SECRET}'")
        hba = Path(server.pgdata) / "pg_hba.conf"
        hba.write_text("local all bob scram-sha-256\n" + hba.read_text())
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        wrong = f"host={host} user=bob password=Wr0ng-{SECRET} dbname=postgres"
        deadline = time.monotonic() + 30  # the server reads pg_hba.conf again on its own time
        while time.monotonic() < deadline:
            try:
                psycopg.connect(wrong).close()
                time.sleep(0.2)
            except psycopg.OperationalError:
                break
        refusals = {
            wrong: 'password authentication failed for user "bob"',
            f"host={host} user=bob dbname=postgres": "no password supplied",
            f"postgresql://bob:{SECRET}@/nodb?host={host}": 'database "nodb" does not exist',
            f"host={host} user=nobody dbname=postgres": 'role "nobody" does not exist',
        }
        queries = tmp_path / "q.txt"
        queries.write_text("who wrote hamlet\n")
        for given, said in refusals.items():
            with pytest.raises(ConfigError, match=re.escape(said)) as caught:
                PgIndex.open(given)
            message = str(caught.value)
            assert "refused the connection" in message and "retry when" not in message, message
            assert SECRET not in message and (host in message or "nodb" in message), message
            assert main(["search", given, str(queries)]) == 2
            err = capsys.readouterr().err
            assert said in err and "unavailable" not in err and SECRET not in err, err
        right = f"postgresql://bob:{SECRET}@/postgres?host={host}"
        build(minilm_dir, write_corpus(tmp_path / "c.jsonl"), right, "bobs").close()
        assert main(["search", right, str(queries), "--table", "bobs"]) == 0
        assert json.loads(capsys.readouterr().out)["results"][0]["id"] == "d2"
        pytest.importorskip("fastapi")
        from fastapi.testclient import TestClient

        from bertforge.serve import create_app
        from tests.pg_server import stop

        app = create_app(
            minilm_dir, index=right, index_options=PgOptions(table="bobs"), precision="fp32"
        )
        with TestClient(app) as client:
            assert client.get("/ready").status_code == 200
            stop(server)
            answers = [client.post("/search", json={"queries": ["who"]}), client.get("/ready")]
        assert [a.status_code for a in answers] == [503, 503]
        assert all(SECRET not in a.text and "***" in a.text for a in answers), answers[0].text
        app.state.index.close()


def test_the_dsn_from_the_environment(
    pg: PgIndex, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`postgresql://` alone (or `--to` alone): $DATABASE_URL, else libpq's PG* variables."""
    monkeypatch.setenv("DATABASE_URL", postgres_dsn)
    index = PgIndex.open("postgresql://", PgOptions(table="docs"))
    assert index.count() == pg.count()
    index.close()
    monkeypatch.delenv("DATABASE_URL")
    host = postgres_dsn.split("host=")[1]  # pgserver's: postgresql://postgres:@/postgres?host=DIR
    monkeypatch.setenv("PGHOST", host)
    monkeypatch.setenv("PGUSER", "postgres")
    monkeypatch.setenv("PGDATABASE", "postgres")
    index = PgIndex.open(None, PgOptions(table="docs"))
    assert index.count() == pg.count()
    index.close()


def test_a_password_in_odd_places_and_forms_is_never_shown(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second hostile trial's forms: a DSN where a file is expected (a path collapses its
    //), as --out (refused: no file is named after a password), an upper-case or +driver
    scheme, a password with a space, an @ or a backslash-escaped space, and a typo of
    --api-key: each one error, exit 2, no secret shown, nothing written."""
    corpus, queries = write_corpus(tmp_path / "c.jsonl"), tmp_path / "q.txt"
    queries.write_text("who wrote hamlet\n")
    model = str(minilm_dir)
    index = tmp_path / "idx"
    assert main(["index", model, str(corpus), "--out", str(index), "--no-progress"]) == 0
    capsys.readouterr()
    secrets = [SECRET, "Zq9 w0rd", "Zq9@w0rd"]
    uris = [
        f"postgresql://bob:{SECRET}@127.0.0.1:1/db",
        f"POSTGRESQL://bob:{SECRET}@127.0.0.1:1/db",
        f"postgresql+psycopg://bob:{SECRET}@127.0.0.1:1/db",
        "postgresql://bob:Zq9 w0rd@127.0.0.1:1/db",
        "postgresql://bob:Zq9@w0rd@127.0.0.1:1/db",
        "host=127.0.0.1 port=1 password=Zq9\\ w0rd dbname=db",
    ]
    shown = []
    here = tmp_path / "cwd"  # where a relative --out would be written: nothing may be
    here.mkdir()
    monkeypatch.chdir(here)
    for dsn in uris:
        argvs = [
            ["search", str(index), dsn],  # a DSN where the queries file is expected
            ["search", dsn, str(queries)],
            ["search", str(index), str(queries), "--out", dsn],
            ["embed", model, str(queries), "--out", dsn],
        ]
        for argv in argvs:
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1, err
            shown.append(err)
            assert not list(here.iterdir())  # nothing written
    for typo in (["--api-kye", KEY], [f"--apikey={KEY}"], ["--api-token", KEY]):
        with pytest.raises(SystemExit, match="2"):
            main(["serve", model, *typo])
        shown.append(capsys.readouterr().err)
    for text in shown:
        assert not any(s in text for s in (*secrets, "w0rd", KEY)), text
    # what was hidden stays hidden for the process, but no common word or digit with it: the
    # paths of later messages are shown whole
    from bertforge.errors import redacted

    plain = "two words in /tmp/pytest-1/popen-gw1/words.txt --token-weight 1"
    assert redacted(plain) == plain


def test_an_update_stopped_midway_is_searched_with_a_warning_until_it_ends(
    minilm_dir: Path,
    postgres_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finished table updated in place by a build stopped midway (the second hostile trial's
    kill -9 of an update: it was searched as complete, no sign): searched as before (each
    document is its old or its new version), with a warning saying the update has not ended,
    from the CLI and the library, and in the server's /ready; run again, the warning is gone."""
    path = write_corpus(tmp_path / "corpus.jsonl")
    build(minilm_dir, path, postgres_dsn, "updated")
    more = tmp_path / "more.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows += [{"id": f"n{i}", "text": f"A new document, number {i}."} for i in range(6)]
    more.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_stopped(monkeypatch, 2, minilm_dir, more, postgres_dsn, "updated")
    said = "an update of it has not ended"
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    search = ["search", postgres_dsn, str(queries), "--table", "updated"]
    with pytest.warns(UserWarning, match=said):  # the CLI prints it: bertforge: warning: ...
        assert main(search) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(QUERIES)
    with pytest.warns(UserWarning, match=said):
        index = PgIndex.open(postgres_dsn, PgOptions(table="updated"))
    assert index.search(QUERIES[:1], top_k=3)[0]
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    options = PgOptions(table="updated")
    app = create_app(minilm_dir, index=postgres_dsn, index_options=options, precision="fp32")
    with TestClient(app) as client:
        answer = client.get("/ready")
        assert answer.status_code == 200 and said in answer.json()["index"]
    build(minilm_dir, more, postgres_dsn, "updated")  # run again: it ends
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PgIndex.open(postgres_dsn, PgOptions(table="updated")).update_note is None
