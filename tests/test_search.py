"""Index, search and mining (bertforge.search, `bertforge index/search/mine`): exact dense search
as brute force over Pipeline.embed, long documents by their best window, BM25 as bm25s gives it,
hybrid as reciprocal-rank or standardised-score fusion by hand, resumable builds, the model's
identity checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.errors import ConfigError, DataError
from bertforge.pipelines import Pipeline
from bertforge.search import RRF_K, Index, fuse_scores, mine

bm25s = pytest.importorskip("bm25s")

FILLER = "the weather was mild and the river ran slowly past the old mill . " * 40
DOCS = [
    "The Eiffel Tower stands in Paris, the capital of France.",
    "Cats are carnivores and eat meat such as fish and mice.",
    "Hamlet is a tragedy written by William Shakespeare.",
    "The stock market fell sharply on Monday.",
    "Tea is brewed from the leaves of the camellia plant.",
    FILLER + "The Great Wall of China stretches for thousands of kilometres.",
]
QUERIES = ["who wrote hamlet", "where is the eiffel tower", "what do cats eat", "great wall length"]


def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS))
    )
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Index:
    tmp = tmp_path_factory.mktemp("index")
    return Index.build(
        minilm_dir, corpus(tmp), tmp / "idx", chunk=2, progress=False, precision="fp32"
    )


def test_dense_search_is_brute_force(built: Index, minilm_dir: Path) -> None:
    pipe = Pipeline(minilm_dir, precision="fp32")
    q, d = pipe.embed(QUERIES[:3]), pipe.embed(DOCS[:5])  # the short ones: one window each
    hits = built.search(QUERIES[:3], top_k=6)
    for i, row in enumerate(hits):
        assert [h["rank"] for h in row] == list(range(1, 7))
        short = [h for h in row if h["id"] != "d5"]
        want = np.argsort(-(q[i] @ d.T), kind="stable")
        assert [h["id"] for h in short] == [f"d{j}" for j in want]
        np.testing.assert_allclose([h["score"] for h in short], (q[i] @ d.T)[want], atol=1e-5)
    assert [row[0]["id"] for row in hits] == ["d2", "d0", "d1"]


def test_a_long_document_scores_its_best_window(built: Index, minilm_dir: Path) -> None:
    pipe = Pipeline(minilm_dir, precision="fp32")
    pieces = pipe.tok.encode(DOCS[5], add_special_tokens=False, truncation=False).ids
    window, stride = built.meta["window"], built.meta["stride"]
    assert len(pieces) > window  # several windows
    starts = list(range(0, len(pieces) - window + stride, stride))
    rows = [pieces[s : s + window] for s in starts if s < len(pieces)]
    best = float((pipe.embed(rows) @ pipe.embed([QUERIES[3]])[0]).max())
    (hit,) = [h for h in built.search([QUERIES[3]], top_k=6)[0] if h["id"] == "d5"]
    assert hit["score"] == pytest.approx(best, abs=1e-5)
    assert (built.windows == 5).sum() == len(rows)


def test_shorter_windows_and_queries_read_whole(minilm_dir: Path, tmp_path: Path) -> None:
    """window=N cuts every document into windows of N pieces (stride N // 2), each scored on
    its own, a document by its best; the queries are still read at the model's length. With
    passage=True each hit carries its best window's characters, whatever the first stage."""
    index = Index.build(
        minilm_dir,
        corpus(tmp_path),
        tmp_path / "idx",
        window=12,
        progress=False,
        precision="fp32",
    )
    assert (index.meta["window"], index.meta["stride"]) == (12, 6)
    pipe = Pipeline(minilm_dir, precision="fp32")
    query = "which long wall, built over centuries by many dynasties, crosses northern china?"
    assert len(pipe.tok.encode(query, add_special_tokens=False).ids) > 12
    q = pipe.embed([query])[0]
    want, passage = {}, {}
    for i, text in enumerate(DOCS):
        enc = pipe.tok.encode(text, add_special_tokens=False, truncation=False)
        starts = range(0, max(len(enc.ids) - 6, 1), 6)
        rows = [enc.ids[s : s + 12] for s in starts]
        assert (index.windows == i).sum() == len(rows)
        sims = pipe.embed(rows) @ q
        want[f"d{i}"] = float(sims.max())
        first = starts[int(sims.argmax())]  # the best window's characters, its words whole
        last = min(first + 12, len(enc.ids)) - 1
        words = enc.word_ids
        first = words.index(words[first])
        last = len(words) - 1 - words[::-1].index(words[last])
        passage[f"d{i}"] = text[enc.offsets[first][0] : enc.offsets[last][1]]
    (hits,) = index.search([query], top_k=6, passage=True)
    assert [h["id"] for h in hits] == sorted(want, key=lambda d: -want[d])
    np.testing.assert_allclose([h["score"] for h in hits], sorted(want.values())[::-1], atol=1e-5)
    assert hits[0]["id"] == "d5"  # its last window holds the wall
    assert [h["passage"] for h in hits] == [passage[h["id"]] for h in hits]
    assert "Great Wall of China" in hits[0]["passage"] and len(hits[0]["passage"]) < 80
    for i, text in enumerate(DOCS):  # a document of one window: all of it
        assert (passage[f"d{i}"] == text) == ((index.windows == i).sum() == 1)
        assert passage[f"d{i}"] in text
    for mode in ("bm25", "hybrid"):  # any first stage's hits: their nearest windows
        for h in index.search([query], top_k=6, mode=mode, passage=True)[0]:
            assert h["passage"] == passage[h["id"]]
    # an index built before spans.npy: its documents cut again, to the same passages
    index.spans = None
    for mode in ("dense", "bm25"):
        for h in index.search([query], top_k=6, mode=mode, passage=True)[0]:
            assert h["passage"] == passage[h["id"]]
    index.meta["stride"] = 3  # as if the tokenizer now cut the documents otherwise
    with pytest.raises(
        DataError, match="cuts document .d5. into 188 windows where the index holds 95: rebuild"
    ):
        index.search([query], top_k=6, passage=True)
    for bad, message in (
        ({"window": 0}, "window=0"),
        ({"window": 255}, "254 pieces"),
        ({"window": 8, "stride": 9}, "stride=9"),
    ):
        with pytest.raises(ConfigError, match=message):
            Index.build(minilm_dir, corpus(tmp_path), tmp_path / "no", progress=False, **bad)
    assert not (tmp_path / "no").exists()


def test_bm25_and_hybrid(built: Index) -> None:
    ref = bm25s.BM25()
    ref.index(bm25s.tokenize(DOCS, stopwords="en", show_progress=False), show_progress=False)
    docs, scores = ref.retrieve(
        bm25s.tokenize(QUERIES, stopwords="en", show_progress=False), k=3, show_progress=False
    )
    got = built.search(QUERIES, top_k=3, mode="bm25")
    for row, want_d, want_s in zip(got, docs, scores):  # bm25s pads k with unmatched ones (0)
        matched = want_s > 0
        assert 0 < matched.sum() < 3 and not want_s[~matched].any()
        assert [h["id"] for h in row] == [f"d{j}" for j in want_d[matched]]
        np.testing.assert_allclose([h["score"] for h in row], want_s[matched], rtol=1e-6)
    dense = built.search(QUERIES, top_k=6)
    sparse = built.search(QUERIES, top_k=6, mode="bm25")
    hybrid = built.search(QUERIES, top_k=6, mode="hybrid", fusion="rrf", text=True)
    for d_row, s_row, h_row in zip(dense, sparse, hybrid):
        fused: dict[str, float] = {}
        for row in (d_row, s_row):
            for h in row:
                fused[h["id"]] = fused.get(h["id"], 0.0) + 1 / (RRF_K + h["rank"])
        want = sorted(fused.items(), key=lambda x: -x[1])
        assert [h["id"] for h in h_row] == [i for i, _ in want]
        np.testing.assert_allclose([h["score"] for h in h_row], [s for _, s in want])
        assert all(h["text"] == DOCS[int(h["id"][1:])] for h in h_row)


def test_hybrid_fuses_by_z_scores_unless_told_otherwise(
    built: Index, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Hybrid's default fusion is the one the measurements favour: on 300 SQuAD questions
    reciprocal rank (80.4 MRR@10) fell below full text alone (81.8), z-scores reached 86.5
    (docs/search.md). The library, the command line (and its --help) and the server's /search
    take it from one place, FirstStage."""
    from bertforge.cli import build_parser
    from bertforge.search import FirstStage
    from bertforge.serve.schemas import SearchRequest

    zscore = built.search(QUERIES, top_k=6, mode="hybrid", fusion="zscore")
    assert built.search(QUERIES, top_k=6, mode="hybrid") == zscore
    assert zscore != built.search(QUERIES, top_k=6, mode="hybrid", fusion="rrf")
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    common = ["search", str(built.path), str(queries), "--mode", "hybrid", "--no-progress"]
    assert main(common) == 0
    default = capsys.readouterr().out
    assert main([*common, "--fusion", "zscore"]) == 0
    assert capsys.readouterr().out == default
    assert FirstStage().fusion == SearchRequest(queries=["q"]).fusion == "zscore"
    (verbs,) = [a for a in build_parser()._actions if hasattr(a, "choices") and a.choices]
    shown = " ".join(verbs.choices["search"].format_help().split())
    assert "--fusion {rrf,zscore} hybrid: by each list's scores" in shown
    assert "(rrf) (default: zscore) --alpha" in shown, shown


def test_a_query_that_shares_no_word_with_the_corpus(built: Index) -> None:
    """BM25 answers only documents that share a word with the query: none for a query of
    unknown words or stopwords (bm25s itself pads its k with score-0 documents in index order),
    so its hybrid is the dense list alone, and mining from BM25 finds nothing to keep."""
    queries = ["zyxwv qwerty", "what is it of the", "日本語の質問"]
    assert built.search(queries, top_k=6, mode="bm25") == [[], [], []]
    dense = built.search(queries, top_k=6)
    for fusion in ("rrf", "zscore"):
        hybrid = built.search(queries, top_k=6, mode="hybrid", fusion=fusion)
        for d_row, h_row in zip(dense, hybrid):
            assert [h["id"] for h in h_row] == [h["id"] for h in d_row]
        if fusion == "rrf":
            np.testing.assert_allclose(
                [[h["score"] for h in row] for row in hybrid],
                [[1 / (RRF_K + r) for r in range(1, 7)]] * 3,
            )
    assert mine(built, queries[:1], DOCS[:1], negatives=1, depth=6, mode="bm25").negatives == [None]
    # --margin scores the positive as the search does: 0 for a query of unknown words, or of
    # stopwords alone, no word left (bm25s itself raised IndexError on no words)
    words = ["to be or not to be", "a b c", queries[0]]
    assert built.search(words, top_k=6, mode="bm25") == [[], [], []]
    assert built.scores_of(words, [2, 2, 2], "bm25").tolist() == [0.0, 0.0, 0.0]
    margin = {"negatives": 1, "depth": 6, "mode": "bm25", "margin": 0.0}
    assert mine(built, words[:1], DOCS[2:3], **margin).negatives == [None]  # type: ignore[arg-type]
    (one,) = built.search(["hamlet"], top_k=6, mode="bm25")
    assert [h["id"] for h in one] == ["d2"]


def test_a_build_shows_its_documents_done_with_the_time_left(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a terminal the build's bar (tqdm's, in windows, no total) piled its carriage returns
    on one line with no time left: it counts documents of the corpus's total (runner.progress_bar,
    a line every LINE_SECONDS off a terminal: here always), moving as each part's windows are
    embedded."""
    from bertforge import runner

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)
    Index.build(minilm_dir, corpus(tmp_path), tmp_path / "idx", chunk=4, precision="fp32")
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(x.startswith("index: ") and "\r" not in x for x in lines), lines
    assert any(x.startswith("index: 4/6 documents (67%)") for x in lines), lines
    assert lines[-1].startswith("index: 6/6 documents (100%)"), lines


def test_a_killed_build_resumes_without_redoing_parts(
    built: Index, minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = corpus(tmp_path)
    embedded: list[int] = []
    from bertforge.pipelines import Pipeline

    real = Pipeline.embed

    def counting(self, rows, *a, **k):  # type: ignore[no-untyped-def]
        embedded.append(len(rows))
        if len(embedded) == 2:
            raise KeyboardInterrupt  # killed in the second part
        return real(self, rows, *a, **k)

    monkeypatch.setattr(Pipeline, "embed", counting)
    with pytest.raises(KeyboardInterrupt):
        Index.build(minilm_dir, path, tmp_path / "idx", chunk=2, progress=False, precision="fp32")
    with pytest.raises(DataError, match="unfinished index"):
        Index.load(tmp_path / "idx")
    embedded.clear()
    monkeypatch.setattr(
        Pipeline, "embed", lambda self, *a, **k: (embedded.append(1), real(self, *a, **k))[1]
    )
    again = Index.build(
        minilm_dir, path, tmp_path / "idx", chunk=2, progress=False, precision="fp32"
    )
    assert len(embedded) == 2  # parts 2 and 3; part 1 was kept
    assert np.array_equal(np.asarray(again.vectors), np.asarray(built.vectors))
    assert again.ids == built.ids and np.array_equal(again.windows, built.windows)
    assert np.array_equal(again.spans, built.spans)
    assert not (tmp_path / "idx" / "parts").exists()


def test_a_second_build_into_the_same_directory_is_refused(
    built: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    """A build holds its directory alone while it runs (as embed --ray's): a second one started
    on it (the command run twice) is refused in one line, before it writes anything; the
    first's lock given back, the build runs. A build refused before writing (a bad row found
    while counting) leaves no directory it made."""
    from bertforge.fileio import sole_writer

    out = tmp_path / "idx"
    options = dict(chunk=2, progress=False, precision="fp32")
    with sole_writer(out, "index build"):
        with pytest.raises(ConfigError, match=r"idx: another index build is writing it now"):
            Index.build(minilm_dir, corpus(tmp_path), out, **options)
        assert list(out.iterdir()) == []
    got = Index.build(minilm_dir, corpus(tmp_path), out, **options)
    assert got.ids == built.ids
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "one"}\n{not json\n')
    with pytest.raises(DataError, match="bad.jsonl: line 2"):
        Index.build(minilm_dir, bad, tmp_path / "new" / "idx", **options)
    assert not (tmp_path / "new").exists()  # neither it nor the parent it made


def test_hybrid_weighted_and_by_standardised_scores(built: Index) -> None:
    """alpha weighs the dense list against BM25's in both fusions: reciprocal rank (2 alpha and
    2 (1 - alpha), so 0.5 is the plain sum) and z-scores (each list's scores standardised per
    query, a weighted sum), computed here by hand from the two searches."""
    dense = built.search(QUERIES, top_k=6)
    sparse = built.search(QUERIES, top_k=6, mode="bm25")
    for fusion, alpha in (("rrf", 0.8), ("zscore", 0.5), ("zscore", 0.2)):
        hybrid = built.search(QUERIES, top_k=6, mode="hybrid", fusion=fusion, alpha=alpha)
        for d_row, s_row, h_row in zip(dense, sparse, hybrid):
            want: dict[str, float] = {}
            for w, row in ((alpha, d_row), (1 - alpha, s_row)):
                s = np.array([h["score"] for h in row])
                z = (s - s.mean()) / (s.std() or 1.0)  # BM25's lists here: one document
                for h, value in zip(row, z):
                    part = 2 * w / (RRF_K + h["rank"]) if fusion == "rrf" else w * value
                    want[h["id"]] = want.get(h["id"], 0.0) + part
            assert [h["id"] for h in h_row] == sorted(want, key=lambda i: -want[i])
            np.testing.assert_allclose([h["score"] for h in h_row], sorted(want.values())[::-1])


def test_hybrid_gives_as_many_hits_as_asked_beyond_its_lists(
    built: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hybrid search fuses lists FUSED (100) deep, deeper where more hits are asked for: a top_k
    beyond it (search --top-k 500, --rerank-depth 300, mine --depth 300) once got 2 FUSED hits
    at most, silently; here FUSED is 2 and top_k 5."""
    import bertforge.search.index as index_module

    monkeypatch.setattr(index_module, "FUSED", 2)
    queries = ["zyxwv qwerty", QUERIES[0]]  # no BM25 hits; some
    hits = built.search(queries, top_k=5, mode="hybrid")
    assert [len(row) for row in hits] == [5, 5]
    dense = built.search(queries, top_k=5)
    assert [h["id"] for h in hits[0]] == [h["id"] for h in dense[0]]  # dense alone
    (negs,) = mine(built, queries[1:], DOCS[2:3], negatives=4, depth=5, mode="hybrid").negatives
    assert negs is not None and len(negs) == 4 and DOCS[2] not in negs


def test_score_fusion_of_lists_that_differ(built: Index) -> None:
    """A document one list leaves out counts as that list's lowest; -1 pads a short list."""
    a = (np.array([[3, 1, 2]]), np.array([[0.9, 0.5, 0.1]]))
    b = (np.array([[1, 4, -1]]), np.array([[7.0, 3.0, 0.0]]))
    docs, scores = fuse_scores([a, b], (0.25, 0.75), k=4)
    za = (a[1][0] - a[1][0].mean()) / a[1][0].std()
    zb = {1: 1.0, 4: -1.0}  # 7 and 3 standardised
    want = {
        d: 0.25 * dict(zip([3, 1, 2], za)).get(d, za.min()) + 0.75 * zb.get(d, -1.0)
        for d in (3, 1, 2, 4)
    }
    order = sorted(want, key=lambda d: -want[d])
    assert docs.tolist() == [order]
    np.testing.assert_allclose(scores[0], [want[d] for d in order])
    fused = {"mode": "hybrid", "fusion": "zscore", "alpha": 0.3}
    (negs,) = mine(built, QUERIES[:1], DOCS[2:3], negatives=2, depth=6, **fused).negatives  # type: ignore
    hits = built.search(QUERIES[:1], top_k=6, **fused)[0]  # type: ignore[arg-type]
    assert negs == [DOCS[int(h["id"][1:])] for h in hits if h["id"] != "d2"][:2]
    for bad in ({"fusion": "mean"}, {"alpha": 1.5}, {"alpha": -0.1}):
        with pytest.raises(ConfigError, match="fusion|alpha"):
            built.search(["q"], mode="hybrid", **bad)  # type: ignore[arg-type]


def test_refusals(built: Index, minilm_dir: Path, tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not the model this index was built with"):
        built.use_model(tiny_model)
    with pytest.raises(ConfigError, match="already holds a finished index"):
        Index.build(minilm_dir, corpus(tmp_path), built.path, progress=False)
    with pytest.raises(DataError, match="not an index"):
        Index.load(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(built.path, broken)
    (broken / "vectors.npy").unlink()
    with pytest.raises(DataError, match="vectors.npy missing"):
        Index.load(broken)
    # an unfinished build of another corpus is not resumed
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "text": "another corpus"}) + "\n")
    (tmp_path / "half").mkdir()
    shutil.copy(built.path / "index.json", tmp_path / "half" / "build.json")
    with pytest.raises(ConfigError, match="unfinished index of another build"):
        Index.build(minilm_dir, other, tmp_path / "half", progress=False)
    for bad in ({"top_k": 0}, {"mode": "sparse"}):
        with pytest.raises(ConfigError):
            built.search(["q"], **bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "text": "x"}', "{nope"], "line 2: invalid JSON"),
        (['{"id": "a"}'], 'line 1: field "text"'),
        (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], "line 2: id 'a' repeats line 1"),
    ],
)
def test_malformed_corpus(minilm_dir: Path, tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        Index.build(minilm_dir, path, tmp_path / "idx", progress=False)


def test_mining(built: Index) -> None:
    queries = ["cats eat fish, and tea leaves in paris", "shakespeare, paris and tea"]
    positives = [DOCS[1], DOCS[2]]
    found = mine(built, queries, positives, negatives=2, depth=6, mode="bm25").negatives
    for negs, positive, hits in zip(found, positives, built.search(queries, 6, mode="bm25")):
        assert len(hits) == 3  # the three documents that share a word with the query
        want = [DOCS[int(h["id"][1:])] for h in hits]
        assert negs == [t for t in want if t != positive]
    # a margin above every candidate's score leaves too few: the row is dropped
    assert mine(built, QUERIES[:1], DOCS[2:3], negatives=2, depth=6, margin=10.0).negatives == [
        None
    ]
    hits = built.search(QUERIES[:1], top_k=6)[0]
    pos = next(h["score"] for h in hits if h["id"] == "d2")
    (negs,) = mine(built, QUERIES[:1], DOCS[2:3], negatives=1, depth=6, margin=0.0).negatives
    assert negs is not None
    (chosen,) = [h for h in hits if DOCS[int(h["id"][1:])] == negs[0]]
    assert chosen["score"] < pos
    with pytest.raises(ConfigError, match="depth - skip >= negatives"):
        mine(built, QUERIES[:1], DOCS[:1], skip=5, depth=5)
    with pytest.raises(ConfigError, match="depth - skip >= negatives"):  # 40 of 30: never
        mine(built, QUERIES[:1], DOCS[:1], negatives=40, depth=30)


def test_cli(minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = corpus(tmp_path)
    out = tmp_path / "idx"
    assert (
        main(["index", str(minilm_dir), str(path), "--out", str(out), "--precision", "fp32"]) == 0
    )
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    capsys.readouterr()
    assert main(["search", str(out), str(queries), "--top-k", "2", "--mode", "hybrid"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["results"][0]["id"] == "d2" and len(rows[0]["results"]) == 2
    assert main(["search", str(out), str(queries), "--top-k", "6", "--passage"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["results"] for r in rows] == Index.load(out).search(QUERIES, 6, passage=True)
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"query": QUERIES[0], "positive": DOCS[2], "group": 7}) + "\n")
    mined = tmp_path / "mined.jsonl"
    args = [
        "mine",
        str(out),
        str(train),
        "--out",
        str(mined),
        "--negatives",
        "2",
        "--mode",
        "hybrid",
    ]
    assert main(args) == 0
    (row,) = [json.loads(x) for x in mined.read_text().splitlines()]
    assert row["positive"] == DOCS[2] and len(row["negatives"]) == 2
    assert row["group"] == "7"  # kept for --group-batches
    # each passage's rank in the first stage that mined it, the positive first
    hits = Index.load(out).search(QUERIES[:1], 30, mode="hybrid", text=True)[0]
    rank_of = {h["text"]: h["rank"] for h in hits}
    assert row["ranks"] == [rank_of[t] for t in (row["positive"], *row["negatives"])]
    assert main(["search", str(tmp_path), str(queries)]) == 2
    assert "not an index" in capsys.readouterr().err
    assert main(["search", str(out), str(queries), "--mode", "hybrid", "--alpha", "2"]) == 2
    assert "alpha=2.0 (--alpha): must be between 0 and 1" in capsys.readouterr().err
    assert (
        main(
            [
                "search",
                str(out),
                str(queries),
                "--top-k",
                "5",
                "--rerank",
                str(minilm_dir),
                "--rerank-depth",
                "2",
            ]
        )
        == 2
    )
    assert "--rerank-depth 2 is below --top-k 5" in capsys.readouterr().err
    shorter = ["index", str(minilm_dir), str(path), "--out", str(tmp_path / "w"), "--no-bm25"]
    assert main([*shorter, "--window", "300"]) == 2
    assert "window=300 (--window): must be between 1 and the model's 254" in capsys.readouterr().err
    assert main([*shorter, "--window", "16", "--no-progress"]) == 0
    assert Index.load(tmp_path / "w").meta["window"] == 16


def test_search_reranked_and_fused_by_hand(
    built: Index, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """search --rerank: the first stage's top hits in the cross-encoder's order; with
    --rerank-fuse rrf, in the reciprocal-rank fusion of both orders, and with --rerank-fuse
    alone (zscore, what the measurements advise), in the equal-weight sum of both lists'
    z-scores (the CE's raw logits), computed here by hand."""
    import torch

    from bertforge import BertConfig, Tokenizer
    from bertforge.heads import BertForSequenceClassification
    from tests.conftest import TINY

    ce = tmp_path / "ce"
    tok = Tokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size}).replace(num_labels=1)
    model = BertForSequenceClassification(config)
    with torch.no_grad():  # logits of several units: its sigmoid saturates, so raw scores matter
        model.classifier.weight.mul_(300)
    model.save_pretrained(ce)
    tok.save_pretrained(ce)
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    first = built.search(QUERIES, top_k=4, text=True)
    pipe = Pipeline(ce)
    common = ["search", str(built.path), str(queries), "--top-k", "3", "--rerank", str(ce)]
    for fusion in (None, "rrf", "zscore"):
        capsys.readouterr()
        flags = ["--rerank-fuse", *([fusion] if fusion == "rrf" else [])] if fusion else []
        assert main([*common, "--rerank-depth", "4", *flags]) == 0
        rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        for query, hits, row in zip(QUERIES, first, rows):
            order = pipe.rerank(query, [h["text"] for h in hits])  # all 4, best first
            ce_rank = {o["index"]: r for r, o in enumerate(order, 1)}
            ce_score = {o["index"]: o["score"] for o in order}
            if fusion == "rrf":
                fused = {i: 1 / (RRF_K + i + 1) + 1 / (RRF_K + ce_rank[i]) for i in range(4)}
            elif fusion == "zscore":  # first-stage scores and the raw logits, standardised
                logits = np.array(pipe.score([query] * 4, [h["text"] for h in hits], True))
                dense = np.array([h["score"] for h in hits])
                z = [(x - x.mean()) / x.std() for x in (dense, logits)]
                fused = {i: 0.5 * z[0][i] + 0.5 * z[1][i] for i in range(4)}
            if fusion:
                want = sorted(range(4), key=lambda i: -fused[i])[:3]
            else:
                want = [o["index"] for o in order[:3]]
            got = row["results"]
            assert [h["first_stage_rank"] - 1 for h in got] == want
            assert [h["id"] for h in got] == [hits[i]["id"] for i in want]
            assert [h["rank"] for h in got] == [1, 2, 3] and "text" not in got[0]
            for h, i in zip(got, want):
                if fusion:
                    assert h["score"] == pytest.approx(fused[i], abs=1e-6)
                    assert h["rerank_score"] == pytest.approx(ce_score[i], abs=1e-6)
                else:
                    assert h["score"] == pytest.approx(ce_score[i], abs=1e-6)
                    assert "rerank_score" not in h
    assert main(["search", str(built.path), str(queries), "--rerank-fuse"]) == 2
    assert "--rerank-fuse: needs --rerank" in capsys.readouterr().err


def _saturating_cross_encoder(tiny_model: Path, out: Path) -> Path:
    """A tiny random cross-encoder whose logits are several units (its sigmoid saturates)."""
    import torch

    from bertforge import BertConfig, Tokenizer
    from bertforge.heads import BertForSequenceClassification
    from tests.conftest import TINY

    tok = Tokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size}).replace(num_labels=1)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(300)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_rerank_from_python_is_search_rerank(
    built: Index, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """search.rerank over Index.search's hits (a path or a loaded Pipeline) gives what
    `bertforge search --rerank [--rerank-fuse F] [--text]` writes, the first stage untouched."""
    from bertforge.search import rerank

    ce = _saturating_cross_encoder(tiny_model, tmp_path / "ce")
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    first = built.search(QUERIES, top_k=4, mode="hybrid", text=True)
    before = json.dumps(first)
    pipe = Pipeline(ce)
    common = ["search", str(built.path), str(queries), "--mode", "hybrid", "--top-k", "3"]
    for fusion, text in ((None, False), ("rrf", True), ("zscore", False)):
        flags = ["--rerank-fuse", fusion] if fusion else []
        args = [*common, "--rerank", str(ce), "--rerank-depth", "4", *flags]
        assert main([*args, *(["--text"] if text else [])]) == 0
        rows = [json.loads(x)["results"] for x in capsys.readouterr().out.splitlines()]
        for model in (ce, pipe):
            assert rerank(model, QUERIES, first, top_k=3, fusion=fusion, text=text) == rows
    assert json.dumps(first) == before
    with pytest.raises(ConfigError, match="reads each hit's text"):
        rerank(pipe, QUERIES, built.search(QUERIES, top_k=4))
    with pytest.raises(ConfigError, match="fusion='borda'"):
        rerank(pipe, QUERIES, first, fusion="borda")


def test_search_writes_each_row_when_ready_and_shows_how_far_it_is(
    built: Index,
    tiny_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """search --rerank over 300 questions ran 400 s with nothing shown and nothing written: a
    query's row is on stdout before the next query is reranked (the first stage runs a part of
    the queries at a time), and stderr says how far it is (off a terminal, a line every
    LINE_SECONDS: here always); the rows are what reranking all the queries at once gives."""
    import importlib

    from bertforge import runner
    from bertforge.search import rerank

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)
    # the module, not search.rerank the function
    monkeypatch.setattr(importlib.import_module("bertforge.search.rerank"), "QUERIES_AT_ONCE", 2)
    ce = _saturating_cross_encoder(tiny_model, tmp_path / "ce")
    asked = [*QUERIES, "tea leaves"]
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(asked) + "\n")
    out: list[str] = []
    err: list[str] = []
    seen: dict[str, list[int]] = {"first stage": [], "rerank": []}  # stdout's rows by then

    def counting(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            got = capsys.readouterr()
            out.extend(got.out.splitlines())
            err.extend(got.err.splitlines())
            seen[name].append(len(out))
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(Index, "search", counting("first stage", Index.search))
    monkeypatch.setattr(Pipeline, "score", counting("rerank", Pipeline.score))
    common = ["search", str(built.path), str(queries), "--top-k", "3"]
    assert main([*common, "--rerank", str(ce), "--rerank-depth", "4"]) == 0
    got = capsys.readouterr()
    out.extend(got.out.splitlines())
    assert seen == {"first stage": [0, 2, 4], "rerank": [0, 1, 2, 3, 4]}
    first = built.search(asked, top_k=4, text=True)
    assert [json.loads(x)["results"] for x in out] == rerank(ce, asked, first, top_k=3)
    lines = err + got.err.splitlines()
    assert lines and all(x.startswith("search: ") for x in lines), lines
    assert lines[-1].startswith("search: 5/5 queries (100%)"), lines
    assert any(x.startswith("search: 1/5 queries (20%)") for x in lines), lines  # per query

    out.clear()
    err.clear()
    seen["first stage"].clear()
    assert main([*common, "--no-progress"]) == 0
    got = capsys.readouterr()
    assert seen["first stage"] == [0, 2, 4] and err == [] and got.err == ""
    assert [json.loads(x)["line"] for x in out + got.out.splitlines()] == [1, 2, 3, 4, 5]


def test_mining_from_python_is_the_mine_command(
    built: Index, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """mine_examples over read_retrieval's rows, then mined_groups, gives the rows `bertforge
    mine` writes, and mining_report the words it prints."""
    from bertforge.data.tasks import read_retrieval
    from bertforge.search import mine_examples, mined_groups, mining_report

    train = tmp_path / "train.jsonl"
    rows = [
        {"query": QUERIES[0], "positive": DOCS[2], "group": "plays"},
        {"query": QUERIES[1], "positive": DOCS[0], "positive_id": "d0"},
        {"query": QUERIES[2], "positive": "not a document here"},
    ]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "mined.jsonl"
    options = ["--negatives", "2", "--depth", "6", "--mode", "hybrid", "--missing", "skip"]
    assert main(["mine", str(built.path), str(train), "--out", str(out), *options]) == 0
    said = capsys.readouterr().out
    examples = read_retrieval(train)
    found = mine_examples(built, examples, negatives=2, depth=6, mode="hybrid", missing="skip")
    groups = mined_groups(examples, found)
    assert [json.loads(x) for x in out.read_text().splitlines()] == groups and len(groups) == 2
    assert said == f"wrote 2 of 3 rows to {out}: {mining_report(found, examples, 'skip', 2)}\n"


def test_server_search(built: Index, minilm_dir: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    with TestClient(create_app(minilm_dir, index=built.path, precision="fp32")) as client:
        for mode in ("dense", "hybrid"):
            r = client.post("/search", json={"queries": QUERIES, "top_k": 3, "mode": mode})
            assert r.status_code == 200
            assert r.json()["results"] == built.search(QUERIES, top_k=3, mode=mode)
        fused = {"mode": "hybrid", "fusion": "zscore", "alpha": 0.7}
        r = client.post("/search", json={"queries": QUERIES, "top_k": 3, **fused})
        want = built.search(QUERIES, top_k=3, **fused)  # type: ignore[arg-type]
        assert r.json()["results"] == want
        for bad in ({"fusion": "mean"}, {"alpha": 2}):
            assert client.post("/search", json={"queries": ["q"], **bad}).status_code == 422
        r = client.post("/search", json={"queries": QUERIES[:1], "return_text": True})
        assert r.json()["results"][0][0]["text"] == DOCS[2]
        r = client.post("/search", json={"queries": QUERIES, "top_k": 6, "return_passage": True})
        want = built.search(QUERIES, top_k=6, passage=True)
        assert r.json()["results"] == [[h | {"passage_truncated": False} for h in w] for w in want]
        long = [h["passage"] for row in want for h in row if h["id"] == "d5"]
        assert len(long) == 4 and all(p in DOCS[5] and p != DOCS[5] for p in long)
        assert client.post("/search", json={"queries": [], "top_k": 3}).status_code == 422
        assert client.post("/search", json={"queries": ["q"], "top_k": 0}).status_code == 422
        assert "search" in client.get("/metadata").json()["endpoints"]
    plain = TestClient(create_app(minilm_dir))
    assert plain.post("/search", json={"queries": ["q"]}).status_code == 404


def test_serve_refuses_an_index_of_another_model(
    built: Index, minilm_dir: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """`serve OTHER --index DIR` once answered /embed with one model and /search with another,
    silently; now one model serves both, or the index's own is named with --index-model (and
    checked); an index whose recorded model moved is served by the model given."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    with pytest.raises(ConfigError, match="built with the model .*--index-model"):
        create_app(tiny_model, index=built.path, precision="fp32")
    with pytest.raises(ConfigError, match="not the model this index was built with"):
        create_app(tiny_model, index=built.path, index_model=tiny_model, precision="fp32")
    app = create_app(tiny_model, index=built.path, index_model=str(minilm_dir), precision="fp32")
    with TestClient(app) as client:
        r = client.post("/search", json={"queries": QUERIES, "top_k": 3})
        assert r.json()["results"] == built.search(QUERIES, top_k=3)
        width = len(client.post("/embed", json={"texts": ["a"]}).json()["embeddings"][0])
        assert width == 128  # the served model's, not the index's 384
    moved = tmp_path / "moved"
    shutil.copytree(built.path, moved)
    meta = json.loads((moved / "index.json").read_text())
    (moved / "index.json").write_text(json.dumps({**meta, "model": "/nowhere/model"}))
    with TestClient(create_app(minilm_dir, index=moved, precision="fp32")) as client:
        r = client.post("/search", json={"queries": QUERIES, "top_k": 3})
        assert r.json()["results"] == built.search(QUERIES, top_k=3)
    with pytest.raises(ConfigError, match="needs an index"):
        create_app(minilm_dir, index_model=str(minilm_dir))


def test_blank_lines_of_a_text_corpus(minilm_dir: Path, tmp_path: Path) -> None:
    """A text corpus's ids are line numbers: a blank line is an error, or skipped with
    --skip-blank (the ids stay the lines')."""
    from bertforge.search import CorpusFormat
    from bertforge.search import read_search_corpus as read_corpus

    path = tmp_path / "c.txt"
    path.write_text("first doc\n\nthird doc\n")
    with pytest.raises(DataError, match="line 2: blank line"):
        list(read_corpus(path))
    assert list(read_corpus(path, CorpusFormat(skip_blank=True))) == [
        ("1", "first doc"),
        ("3", "third doc"),
    ]


def test_an_approximate_index_finds_what_exact_search_finds(
    built: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("faiss")
    options = {"approximate": "hnsw", "progress": False, "precision": "fp32", "bm25": False}
    hnsw = Index.build(minilm_dir, corpus(tmp_path), tmp_path / "h", **options)
    assert (hnsw.path / "hnsw.faiss").is_file() and hnsw.meta["approximate"] == "hnsw"
    got, want = hnsw.search(QUERIES, top_k=3), built.search(QUERIES, top_k=3)
    assert [[h["id"] for h in r] for r in got] == [[h["id"] for h in r] for r in want]
    np.testing.assert_allclose(
        [[h["score"] for h in r] for r in got], [[h["score"] for h in r] for r in want], atol=1e-5
    )
    with pytest.raises(ConfigError, match="built without a BM25 index"):
        hnsw.search(QUERIES, mode="bm25")


def test_the_hnsw_graph_recalls_the_exact_neighbours(tmp_path: Path) -> None:
    faiss = pytest.importorskip("faiss")
    from bertforge.search.index import _write_hnsw

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(tmp_path / "v.npy", x)
    _write_hnsw(tmp_path / "v.npy", tmp_path / "g.faiss", block=1000)
    graph = faiss.read_index(str(tmp_path / "g.faiss"))
    graph.hnsw.efSearch = 64
    q = x[:200] + 0.1 * rng.standard_normal((200, 32)).astype(np.float32)
    _, found = graph.search(q, 10)
    exact = np.argsort(-(q @ x.T), axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])
    assert recall > 0.95


@pytest.mark.parametrize("name", ["vectors.npy", "windows.npy", "documents.jsonl", "index.json"])
def test_a_truncated_index_file_is_one_error(built: Index, tmp_path: Path, name: str) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(built.path, broken)
    data = (broken / name).read_bytes()
    (broken / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="broken"):
        Index.load(broken)


def test_an_empty_corpus_is_one_error(minilm_dir: Path, tmp_path: Path) -> None:
    for name in ("c.txt", "c.jsonl"):
        (tmp_path / name).write_text("")
        with pytest.raises(DataError, match="no documents|no rows"):
            Index.build(minilm_dir, tmp_path / name, tmp_path / f"idx-{name}", progress=False)


def test_dense_search_in_blocks_is_exact_with_ties_in_document_order(
    built: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows scored a block at a time (a document's windows kept together) rank as the whole
    corpus at once; scores tied at the k-th place go to the earlier document."""
    import bertforge.search.index as index_module
    from bertforge.search.fusion import best_columns

    whole = built.ranked(QUERIES, 4, "dense")
    monkeypatch.setattr(index_module, "WINDOW_BLOCK", 2)
    monkeypatch.setattr(index_module, "QUERY_BLOCK", 3)
    blocked = built.ranked(QUERIES, 4, "dense")
    assert np.array_equal(blocked[0], whole[0])
    np.testing.assert_allclose(blocked[1], whole[1], atol=1e-6)
    tied = np.array([[0.0] * 1000 + [1.0], [2.0, 1.0, 1.0, 3.0] + [1.0] * 997])
    assert best_columns(tied, 3).tolist() == [[1000, 0, 1], [3, 0, 1]]


def test_bad_stride_and_corrupt_files_are_one_error(
    built: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    for stride in (0, -1, built.meta["window"] + 1):
        with pytest.raises(ConfigError, match=f"stride={stride} "):
            Index.build(minilm_dir, corpus(tmp_path), tmp_path / "s", stride=stride)
    broken = tmp_path / "broken"
    shutil.copytree(built.path, broken)
    (broken / "bm25" / "params.index.json").write_text("{")
    with pytest.raises(DataError, match="params.index.json: not the file this index was built"):
        Index.load(broken)
    shutil.copy(built.path / "bm25" / "params.index.json", broken / "bm25")
    np.save(broken / "windows.npy", np.sort(built.windows)[::-1])
    with pytest.raises(DataError, match="windows.npy: not the file this index was built with"):
        Index.load(broken)
    # the checks behind the digests: an index built before them
    with pytest.warns(UserWarning), pytest.raises(DataError, match="windows.npy does not number"):
        Index.load(_built_before_digests(broken))
    shutil.copy(built.path / "windows.npy", broken)
    (broken / "bm25" / "params.index.json").write_text("{")
    with pytest.warns(UserWarning), pytest.raises(DataError, match="broken/bm25: a missing, corr"):
        Index.load(broken).search(QUERIES, mode="bm25")


# -- what a tester found: each case as it was met ---------------------------------------------


def test_mining_never_takes_the_positive_for_a_negative(built: Index) -> None:
    """The positive is found by id when the row gives one, else by its text with spacing and
    case aside (a trailing or doubled space once made the query's own paragraph a "hard
    negative"); a near-copy of it is never a negative either; a positive that is not in the
    corpus stops mining unless the rows are skipped or kept (guarded by likeness alone)."""
    from bertforge.search.mining import likeness

    queries = [QUERIES[0], QUERIES[2], "which tragedy is by shakespeare"]
    positives = [DOCS[2] + " ", DOCS[1].replace(" ", "  "), DOCS[2].upper()]
    found = mine(built, queries, positives, negatives=2, depth=6)
    assert (found.by_text, found.by_id, found.missing) == (3, 0, [])
    assert found.positives == [2, 1, 2]
    for negs, d in zip(found.negatives, found.positives):
        assert negs is not None and DOCS[d] not in negs  # type: ignore[index]
    # by id: its document's text, spacing and case aside, is still never a negative
    by_id = mine(built, [QUERIES[0]], [DOCS[2].lower() + " "], positive_ids=["d2"], depth=6)
    assert by_id.by_id == 1 and DOCS[2] not in (by_id.negatives[0] or [])
    # an id whose document is not the row's positive: which is meant is not known
    with pytest.raises(DataError, match=r"1 of 2 positives .* row 2: positive_id 'd2'"):
        ids = ["d0", "d2"]
        mine(built, QUERIES[:2], [DOCS[0], "a summary of the play"], positive_ids=ids, depth=6)
    # not in the corpus: the rows named, nothing mined
    edited = "Hamlet is a tragedy, written by William Shakespeare!"  # a near-copy of d2
    with pytest.raises(DataError, match=r"1 of 2 positives are not documents .* row 2"):
        mine(built, [QUERIES[1], QUERIES[0]], [DOCS[0], edited], negatives=1, depth=6)
    with pytest.raises(DataError, match="not documents"):
        mine(built, [QUERIES[0]], ["nowhere"], positive_ids=["d99"], depth=6)
    skipped = mine(built, [QUERIES[0]], [edited], negatives=1, depth=6, missing="skip")
    assert skipped.negatives == [None] and skipped.missing == [0]
    kept = mine(built, [QUERIES[0]], [edited], negatives=1, depth=6, missing="keep")
    assert kept.near_duplicates == 1 and DOCS[2] not in kept.negatives[0]  # type: ignore[operator]
    assert likeness(frozenset("ab"), frozenset("ab")) == 1.0
    for bad in ({"near_duplicate": 0.0}, {"missing": "ignore"}):
        with pytest.raises(ConfigError, match="near_duplicate|missing"):
            mine(built, [QUERIES[0]], [DOCS[2]], **bad)  # type: ignore[arg-type]


def test_mining_leaves_out_every_positive_of_a_query(built: Index) -> None:
    """Rows that share a query (its spacing and case aside: several relevant passages of one
    question) never get each other's positives as negatives, by text or by id; another query's
    positive stays a candidate."""
    hits = built.search(QUERIES[:1], top_k=6)[0]
    order = [int(h["id"][1:]) for h in hits]  # the dense ranking of all six documents
    first, second = order[:2]
    queries = [QUERIES[0], QUERIES[0].upper() + " ", QUERIES[1]]
    positives = [DOCS[first], DOCS[second], DOCS[first]]
    found = mine(built, queries, positives, negatives=2, depth=6)
    want = [DOCS[d] for d in order[2:4]]  # the best two that are neither positive
    assert found.negatives[:2] == [want, want]
    other = [DOCS[int(h["id"][1:])] for h in built.search(QUERIES[1:2], 6)[0]]
    assert found.negatives[2] == [t for t in other if t != DOCS[first]][:2]
    ids = [f"d{first}", f"d{second}", None]
    texts = [DOCS[first] + " ", DOCS[second].upper(), DOCS[first]]
    by_id = mine(built, queries, texts, positive_ids=ids, negatives=2, depth=6)
    assert by_id.negatives[:2] == [want, want]


def test_mine_command_reports_and_refuses(
    built: Index, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = tmp_path / "train.jsonl"
    rows = [
        {"query": QUERIES[0], "positive": DOCS[2] + "  "},
        {
            "query": QUERIES[2],
            "positive": "cats are  carnivores and eat meat such as fish and mice.",
        },
        {"query": QUERIES[1], "positive": DOCS[0], "positive_id": "d0"},
    ]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "mined.jsonl"
    base = ["mine", str(built.path), str(train), "--negatives", "2", "--depth", "6"]
    assert main([*base, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "wrote 3 of 3 rows" in said and "by id 1, by text 2" in said
    mined = [json.loads(x) for x in out.read_text().splitlines()]
    assert [DOCS[i] in m["negatives"] for m, i in zip(mined, (2, 1, 0))] == [False] * 3
    assert mined[2]["positive_id"] == "d0"
    # a positive_id naming another document than the row's positive: refused, nothing written
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("".join(json.dumps({**r, "positive_id": "d1"}) + "\n" for r in rows[1:]))
    assert main(["mine", str(built.path), str(wrong), "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert f"{wrong}:2: positive_id 'd1'" in err and f"{wrong}:1" not in err
    assert not (tmp_path / "w").exists()
    before = train.read_bytes()
    assert main([*base, "--out", str(train)]) == 2  # the input itself
    assert "is the train file" in capsys.readouterr().err and train.read_bytes() == before
    assert (
        main([*base[:3], "--negatives", "40", "--depth", "30", "--out", str(tmp_path / "x")]) == 2
    )
    assert "depth - skip >= negatives" in capsys.readouterr().err
    lost = tmp_path / "lost.jsonl"
    lost.write_text(json.dumps({"query": "q", "positive": "not a document here"}) + "\n")
    assert main(["mine", str(built.path), str(lost), "--out", str(tmp_path / "y")]) == 2
    assert f"{lost}:1" in capsys.readouterr().err and not (tmp_path / "y").exists()
    assert (
        main(
            ["mine", str(built.path), str(lost), "--out", str(tmp_path / "y"), "--missing", "skip"]
        )
        == 2
    )
    assert "no row kept" in capsys.readouterr().err and not (tmp_path / "y").exists()
    # JSONL without its suffix: named as such, not a table error quoting the JSON
    misnamed = tmp_path / "train.txt"
    misnamed.write_text(train.read_text())
    assert main([*base[:2], str(misnamed), "--out", str(tmp_path / "z")]) == 2
    assert "must end in .jsonl" in capsys.readouterr().err


def test_mine_shows_how_far_it_is_on_stderr(
    built: Index,
    tiny_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mine ran 30 s silent: stderr shows the queries searched and the groups a teacher scored
    (off a terminal, a line every LINE_SECONDS: here always), stdout its report alone."""
    from bertforge import runner
    from bertforge.search import mining

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)
    monkeypatch.setattr(mining, "QUERIES_AT_ONCE", 2)
    train = tmp_path / "train.jsonl"
    rows = [{"query": q, "positive": DOCS[i]} for q, i in zip(QUERIES[:3], (2, 0, 1))]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ce = _saturating_cross_encoder(tiny_model, tmp_path / "ce")
    base = ["mine", str(built.path), str(train), "--negatives", "2", "--depth", "6"]
    assert main([*base, "--out", str(tmp_path / "m"), "--teacher", str(ce)]) == 0
    got = capsys.readouterr()
    assert got.out.startswith("wrote 3 of 3 rows")
    lines = got.err.splitlines()
    mined = [x for x in lines if x.startswith("mine: ")]
    assert mined[-2].startswith("mine: 2/3 queries (67%)"), lines  # a line per part
    assert mined[-1].startswith("mine: 3/3 queries (100%)"), lines
    assert lines[len(mined) :] and lines[-1].startswith("teacher: 3/3 groups (100%)"), lines
    assert main([*base, "--out", str(tmp_path / "m2"), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_an_index_is_bound_to_its_model(
    built: Index,
    minilm_dir: Path,
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every search checks that the model it embeds queries with is the index's: the one
    index.json records (a relative path read from the index's directory) or --model; an edited
    index.json or weights replaced in place are one error, never other hits."""
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(minilm_dir, model)
    index = Index.build(model, corpus(tmp_path), tmp_path / "idx", progress=False, precision="fp32")
    want = index.search(QUERIES, top_k=3)
    meta = json.loads((index.path / "index.json").read_text())
    for path in ("../model", str(model)):  # relative to the index, from anywhere
        (index.path / "index.json").write_text(json.dumps({**meta, "model": path}))
        monkeypatch.chdir(tiny_model)
        assert Index.load(index.path).search(QUERIES, top_k=3) == want
    (index.path / "index.json").write_text(json.dumps({**meta, "model": str(tiny_model)}))
    with pytest.raises(ConfigError, match="not the model this index was built with"):
        Index.load(index.path).search(QUERIES, top_k=3)
    (index.path / "index.json").write_text(json.dumps(meta))
    weights = load_file(model / "model.safetensors")
    first = next(iter(weights))
    weights[first] = weights[first] + 0.01  # retrained in place
    save_file(weights, model / "model.safetensors")
    with pytest.raises(ConfigError, match="changed since"):
        Index.load(index.path).search(QUERIES, top_k=3)
    assert Index.load(index.path).use_model(minilm_dir) is not None  # the original, given
    shutil.rmtree(model)
    with pytest.raises(ConfigError, match="is gone; pass the same model"):
        Index.load(index.path).search(QUERIES, top_k=3)


# a model's set-up changed in a copy of its weights: the file, the change, how errors name it
SET_UP_OTHERWISE = {
    "pooling": (
        "1_Pooling/config.json",
        lambda c: c | {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True},
    ),
    "normalisation": (
        "modules.json",
        lambda modules: [m for m in modules if not m["type"].endswith("Normalize")],
    ),
    "max_seq_length": ("sentence_bert_config.json", lambda c: c | {"max_seq_length": 128}),
    "tokenizer": ("tokenizer_config.json", lambda c: c | {"do_lower_case": False}),
}


def set_up_otherwise(minilm_dir: Path, out: Path, what: str) -> Path:
    """A copy of MiniLM with one of SET_UP_OTHERWISE's changes: its weights, other vectors."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(minilm_dir, out)
    name, change = SET_UP_OTHERWISE[what]
    (out / name).write_text(json.dumps(change(json.loads((out / name).read_text()))))
    return out


def test_an_index_is_bound_to_how_its_model_makes_vectors(
    built: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    """The index's weights set up otherwise (another pooling, no Normalize module, another
    max_seq_length, another casing) make other vectors: given with --model, or served, such a
    copy once passed and the hits silently changed; now each is one error naming what differs.
    An index written before these were recorded is checked by what it records."""
    pytest.importorskip("fastapi")
    from bertforge.serve import create_app

    for what in SET_UP_OTHERWISE:
        model = set_up_otherwise(minilm_dir, tmp_path / "model", what)
        with pytest.raises(ConfigError, match=f"weights this index was built with .*{what}"):
            Index.load(built.path).use_model(model)
        with pytest.raises(ConfigError, match=f"not the one served .*{what}"):
            create_app(model, index=built.path, precision="fp32")
    old = tmp_path / "old"
    shutil.copytree(built.path, old)
    meta = json.loads((old / "index.json").read_text())
    for key in ("include_prompt", "max_length", "tokenizer_sha256"):
        del meta[key]
    (old / "index.json").write_text(json.dumps(meta))
    assert Index.load(old).search(QUERIES, top_k=3) == built.search(QUERIES, top_k=3)
    shorter = set_up_otherwise(minilm_dir, tmp_path / "model", "max_seq_length")
    assert Index.load(old).use_model(shorter) is not None  # not recorded: not compared
    with pytest.raises(ConfigError, match="pooling"):  # recorded from the start
        Index.load(old).use_model(set_up_otherwise(minilm_dir, tmp_path / "model", "pooling"))


def test_an_index_refuses_a_cross_encoder(tmp_path: Path, tiny_model: Path) -> None:
    from bertforge import BertConfig, BertForSequenceClassification, Tokenizer

    ce = tmp_path / "ce"
    config = BertConfig.from_pretrained(tiny_model).replace(num_labels=1)
    BertForSequenceClassification(config).save_pretrained(ce)
    Tokenizer.from_pretrained(tiny_model).save_pretrained(ce)
    with pytest.raises(ConfigError, match="a cross-encoder .* needs a bi-encoder"):
        Index.build(ce, corpus(tmp_path), tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx").exists()


def _killed_build(minilm_dir: Path, path: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unfinished build: killed in its second part's embedding."""
    from bertforge.pipelines import Pipeline

    real, calls = Pipeline.embed, []

    def killed(self, rows, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, rows, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Pipeline, "embed", killed)
        with pytest.raises(KeyboardInterrupt):
            Index.build(minilm_dir, path, out, chunk=2, progress=False, precision="fp32")


def test_a_planted_link_is_never_written_through(
    built: Index, minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, elsewhere = tmp_path / "idx", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _killed_build(minilm_dir, corpus(tmp_path), out, monkeypatch)
    (out / ".bm25.tmp").symlink_to(elsewhere)  # where a build once saved BM25 before renaming
    (out / "bm25").symlink_to(elsewhere)
    index = Index.build(
        minilm_dir, corpus(tmp_path), out, chunk=2, progress=False, precision="fp32"
    )
    assert list(elsewhere.iterdir()) == [] and not (out / "bm25").is_symlink()
    assert index.search(QUERIES, 3, mode="bm25") == built.search(QUERIES, 3, mode="bm25")
    assert not list(out.glob(".bm25*"))
    half = tmp_path / "half"
    _killed_build(minilm_dir, corpus(tmp_path), half, monkeypatch)
    shutil.rmtree(half / "parts")
    (half / "parts").symlink_to(elsewhere)
    with pytest.raises(DataError, match="parts: a link"):
        Index.build(minilm_dir, corpus(tmp_path), half, chunk=2, progress=False, precision="fp32")
    assert list(elsewhere.iterdir()) == []


def test_a_late_bad_row_is_found_before_any_work_and_a_fixed_corpus_resumes(
    built: Index, minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertforge.pipelines import Pipeline

    path = corpus(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[0]]) + "\n")  # d0 again, on the last line
    embedded: list[int] = []
    real = Pipeline.embed
    monkeypatch.setattr(
        Pipeline, "embed", lambda s, *a, **k: (embedded.append(1), real(s, *a, **k))[1]
    )
    with pytest.raises(DataError, match="line 7: id 'd0' repeats line 1"):
        Index.build(minilm_dir, path, tmp_path / "idx", chunk=2, progress=False)
    assert embedded == [] and not (tmp_path / "idx").exists()
    monkeypatch.setattr(Pipeline, "embed", real)
    # a build killed, its corpus then edited in a later part: the parts before are kept
    path.write_text("\n".join(lines) + "\n")
    _killed_build(minilm_dir, path, tmp_path / "idx", monkeypatch)
    edited = [*lines[:4], json.dumps({"id": "d4", "text": "Green tea is brewed."}), lines[5]]
    path.write_text("\n".join(edited) + "\n")
    embedded.clear()
    monkeypatch.setattr(
        Pipeline, "embed", lambda s, *a, **k: (embedded.append(1), real(s, *a, **k))[1]
    )
    index = Index.build(
        minilm_dir, path, tmp_path / "idx", chunk=2, progress=False, precision="fp32"
    )
    assert len(embedded) == 2  # parts 2 and 3; part 1 (d0, d1) unchanged and kept
    assert index.texts[4] == "Green tea is brewed."
    fresh = Index.build(minilm_dir, path, tmp_path / "fresh", progress=False, precision="fp32")
    np.testing.assert_allclose(np.asarray(index.vectors), np.asarray(fresh.vectors), atol=1e-6)
    assert index.meta["corpus_sha256"] == fresh.meta["corpus_sha256"]


def test_a_part_killed_between_its_new_listing_and_its_vectors_is_embedded_again(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished part whose document then changed, its rebuild killed after the part's new
    listing was written but before its vectors were: the next build embeds the new text (the
    old vectors were once kept beside the new listing, the old text's hits served as new)."""
    from bertforge.pipelines import Pipeline

    path, out = corpus(tmp_path), tmp_path / "idx"
    _killed_build(minilm_dir, path, out, monkeypatch)  # part 0 (d0, d1) whole, part 1 killed
    lines = path.read_text().splitlines()
    edited = [lines[0], json.dumps({"id": "d1", "text": "Dogs bark at the postman."}), *lines[2:]]
    path.write_text("\n".join(edited) + "\n")

    def killed(self, rows, *a, **k):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # in part 0's embedding: after its listing

    with monkeypatch.context() as m:
        m.setattr(Pipeline, "embed", killed)
        with pytest.raises(KeyboardInterrupt):
            Index.build(minilm_dir, path, out, chunk=2, progress=False, precision="fp32")
    assert "Dogs bark" in (out / "parts" / "000000.jsonl").read_text()
    index = Index.build(minilm_dir, path, out, chunk=2, progress=False, precision="fp32")
    fresh = Index.build(minilm_dir, path, tmp_path / "fresh", progress=False, precision="fp32")
    np.testing.assert_allclose(np.asarray(index.vectors), np.asarray(fresh.vectors), atol=1e-6)
    assert index.search(["which animal barks"], top_k=1)[0][0]["id"] == "d1"


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("000000.npy", lambda b: b[: len(b) // 2]),  # truncated
        ("000000.npy", lambda b: b"not an array"),  # np.load's "pickled (object) data"
        ("000000.npy", None),  # its rows reversed: the same shape
        ("000000.owners.npy", lambda b: b[:-8]),
        ("000000.spans.npy", lambda b: b[:-1] + bytes([b[-1] ^ 1])),  # a bit of its last span
    ],
)
def test_a_damaged_part_of_an_unfinished_build_is_built_again(
    built: Index,
    minilm_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    damage: Any,
) -> None:
    """A finished part of a killed build, damaged before the build is run again (once a
    traceback from np.load, or kept and joined): embedded again like a missing part, and the
    index comes out as an uninterrupted build's."""
    path, out = corpus(tmp_path), tmp_path / "idx"
    _killed_build(minilm_dir, path, out, monkeypatch)  # part 0 (d0, d1) whole, part 1 killed
    part = out / "parts" / name
    if damage is None:
        _rows_reversed(part)
    else:
        part.write_bytes(damage(part.read_bytes()))
    embedded: list[int] = []
    real = Pipeline.embed
    monkeypatch.setattr(
        Pipeline, "embed", lambda s, *a, **k: (embedded.append(1), real(s, *a, **k))[1]
    )
    index = Index.build(minilm_dir, path, out, chunk=2, progress=False, precision="fp32")
    assert len(embedded) == 3  # part 0 again, then parts 1 and 2
    np.testing.assert_allclose(np.asarray(index.vectors), np.asarray(built.vectors), atol=1e-6)
    assert index.ids == built.ids and np.array_equal(index.windows, built.windows)
    assert np.array_equal(index.spans, built.spans)


def test_corrupt_bm25_and_graph_files_are_one_error(
    built: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    """What an index's recorded digests would catch first (an index built before them)."""
    copy = tmp_path / "copy"
    shutil.copytree(built.path, copy)
    _built_before_digests(copy)
    indices = next((copy / "bm25").glob("indices*.npy"))
    values = np.load(indices)
    np.save(indices, values + 1000)  # document numbers past the corpus
    with (
        pytest.warns(UserWarning),
        pytest.raises(DataError, match="bm25: a missing, corrupt or truncated BM25 file"),
    ):
        Index.load(copy).search(QUERIES, 3, mode="bm25")
    graph = Index.build(
        minilm_dir, corpus(tmp_path), tmp_path / "hnsw", approximate="hnsw", progress=False
    )
    _built_before_digests(graph.path)
    data = (graph.path / "hnsw.faiss").read_bytes()
    for broken in (data[: len(data) // 2], b"not a graph"):
        (graph.path / "hnsw.faiss").write_bytes(broken)
        with (
            pytest.warns(UserWarning),
            pytest.raises(DataError, match="hnsw.faiss: a missing, corrupt or truncated graph"),
        ):
            Index.load(graph.path).search(QUERIES, 3)


def _rows_reversed(path: Path) -> None:
    """The array at `path` saved again with its rows in reverse order: its shape and type kept."""
    np.save(path, np.load(path, allow_pickle=False)[::-1])


def _texts_swapped(path: Path) -> None:
    """documents.jsonl with its first two documents' texts swapped, their ids in place."""
    docs = [json.loads(x) for x in path.read_text().splitlines()]
    docs[0]["text"], docs[1]["text"] = docs[1]["text"], docs[0]["text"]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))


def test_an_index_file_changed_in_place_is_one_error(
    built: Index, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every file of a directory index is checked at open against the sha256 its build recorded
    in index.json: vectors.npy with its rows reversed (the same shape: it once loaded and gave
    the wrong documents with plausible scores), spans.npy likewise, two documents' texts
    swapped, BM25's scores scaled: each one error naming the file and saying to rebuild, and
    `bertforge search` exits 2 with it."""
    bm25_data = next(f.name for f in (built.path / "bm25").glob("data*.npy"))
    edits = {
        "vectors.npy": _rows_reversed,
        "spans.npy": _rows_reversed,
        "documents.jsonl": _texts_swapped,
        f"bm25/{bm25_data}": lambda p: np.save(p, np.load(p) * 2),
    }
    for name, edit in edits.items():
        broken = tmp_path / f"edited-{name.replace('/', '-')}"
        shutil.copytree(built.path, broken)
        edit(broken / name)
        with pytest.raises(DataError, match=rf"^{broken / name}: .* rebuild the index"):
            Index.load(broken)
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    assert main(["search", str(tmp_path / "edited-vectors.npy"), str(queries)]) == 2
    err = capsys.readouterr().err
    assert f"bertforge: error: {tmp_path / 'edited-vectors.npy' / 'vectors.npy'}: " in err
    assert "Traceback" not in err


def _built_before_digests(path: Path) -> Path:
    """The index at `path` as one built before index.json recorded its files' sha256."""
    meta = json.loads((path / "index.json").read_text())
    del meta["files_sha256"]
    (path / "index.json").write_text(json.dumps(meta))
    return path


def test_an_index_built_before_digests_loads_with_a_warning(built: Index, tmp_path: Path) -> None:
    """An index whose index.json records no sha256 of its files (built before they were) still
    loads and searches as before, with one warning that its files are not checked."""
    old = tmp_path / "old"
    shutil.copytree(built.path, old)
    _built_before_digests(old)
    with pytest.warns(UserWarning, match=rf"^{old}: built before .* not checked") as said:
        index = Index.load(old)
    assert len(said) == 1
    assert index.search(QUERIES, 3) == built.search(QUERIES, 3)
    meta = json.loads((old / "index.json").read_text())
    for bad in ([1, 2], {"vectors.npy": 1}, {"../index.json": "0" * 64}):
        (old / "index.json").write_text(json.dumps({**meta, "files_sha256": bad}))
        with pytest.raises(DataError, match=r"files_sha256 is not|not a file of the index"):
            Index.load(old)


def test_a_graph_or_quantised_files_changed_in_place_are_one_error(
    built: Index, minilm_dir: Path, tmp_path: Path
) -> None:
    """An approximate index's graph (one of the same vectors in reverse order: a valid graph
    that finds other windows) and an int8 index's vectors and ranges are checked alike."""
    from bertforge.search.index import _write_hnsw

    graph = Index.build(
        minilm_dir, corpus(tmp_path), tmp_path / "hnsw", approximate="hnsw", progress=False
    )
    np.save(tmp_path / "reversed.npy", np.asarray(graph.vectors)[::-1])
    _write_hnsw(tmp_path / "reversed.npy", graph.path / "hnsw.faiss")
    with pytest.raises(DataError, match=rf"^{graph.path / 'hnsw.faiss'}: .* rebuild the index"):
        Index.load(graph.path)
    int8 = Index.build(
        minilm_dir, corpus(tmp_path), tmp_path / "int8", embedding_precision="int8", progress=False
    )
    for name, edit in {
        "vectors.npy": _rows_reversed,
        "ranges.npy": lambda p: np.save(p, np.load(p) * 2),
    }.items():
        broken = tmp_path / f"int8-{name}"
        shutil.copytree(int8.path, broken)
        edit(broken / name)
        with pytest.raises(DataError, match=rf"^{broken / name}: .* rebuild the index"):
            Index.load(broken)


def test_a_huge_document_is_indexed_a_block_at_a_time(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document is tokenized a segment at a time and its windows embedded a block at a time
    (memory bounded by those, progress counted in windows); the index is the one built whole,
    and its passages come from the spans the build recorded."""
    import bertforge.search.windows as windows_module
    import bertforge.tokenizer as tokenizer_module

    path = corpus(tmp_path)
    whole = Index.build(
        minilm_dir, path, tmp_path / "whole", window=16, progress=False, precision="fp32"
    )
    monkeypatch.setattr(tokenizer_module, "SEGMENT_CHARS", 50)
    monkeypatch.setattr(windows_module, "EMBED_BLOCK", 7)
    parts = Index.build(
        minilm_dir, path, tmp_path / "parts", window=16, progress=False, precision="fp32"
    )
    np.testing.assert_allclose(np.asarray(parts.vectors), np.asarray(whole.vectors), atol=1e-5)
    assert np.array_equal(parts.windows, whole.windows) and np.array_equal(parts.spans, whole.spans)
    query = ["great wall of china"]
    got, want = parts.search(query, 3, passage=True)[0], whole.search(query, 3, passage=True)[0]
    assert [(h["id"], h["passage"]) for h in got] == [(h["id"], h["passage"]) for h in want]
    assert got[0]["passage"] == DOCS[5][len(FILLER) :]


def test_search_output_names_its_query_and_keeps_its_input(
    built: Index, minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(QUERIES) + "\n")
    assert main(["search", str(built.path), str(queries), "--top-k", "1"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["query"] for r in rows] == QUERIES
    assert main(["search", str(built.path), str(queries), "--out", str(queries)]) == 2
    assert "is the queries file" in capsys.readouterr().err
    assert queries.read_text() == "\n".join(QUERIES) + "\n"
    misnamed = tmp_path / "corpus.json"
    misnamed.write_text(corpus(tmp_path).read_text())
    with pytest.raises(DataError, match="must end in .jsonl"):
        Index.build(minilm_dir, misnamed, tmp_path / "x", progress=False)


def test_an_index_reads_documents_and_queries_with_their_prompts(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A model with E5's prompts: the documents are embedded after its "passage: " (never the
    default, the query's), the queries after "query: ", as recorded in index.json; the windows
    leave room for the prompt; --prompt / --prompt-name change either."""
    model = tmp_path / "model"
    shutil.copytree(minilm_dir, model)
    config = json.loads((model / "config_sentence_transformers.json").read_text())
    config |= {
        "prompts": {"query": "query: ", "passage": "passage: "},
        "default_prompt_name": "query",
    }
    (model / "config_sentence_transformers.json").write_text(json.dumps(config))
    index = Index.build(model, corpus(tmp_path), tmp_path / "idx", progress=False, precision="fp32")
    assert (index.meta["document_prompt"], index.meta["query_prompt"]) == ("passage: ", "query: ")
    assert index.meta["window"] == 254 - 2  # "passage: " is two pieces
    pipe = Pipeline(model, precision="fp32")
    docs, q = pipe.embed(DOCS[:5], prompt="passage: "), pipe.embed(QUERIES, prompt="query: ")
    for row, v in zip(index.search(QUERIES, top_k=6), q):
        short = {h["id"]: h["score"] for h in row if h["id"] != "d5"}
        np.testing.assert_allclose([short[f"d{i}"] for i in range(5)], docs @ v, atol=1e-5)
    bare = Index.build(
        model, corpus(tmp_path), tmp_path / "bare", prompt="", progress=False, precision="fp32"
    )
    assert bare.meta["document_prompt"] == "" and not np.allclose(bare.vectors, index.vectors)
    queries = tmp_path / "q.txt"
    queries.write_text(QUERIES[0] + "\n")
    capsys.readouterr()
    assert main(["search", str(index.path), str(queries), "--prompt", "", "--top-k", "6"]) == 0
    (row,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    plain = pipe.embed(QUERIES[:1], prompt="")[0]
    got = {h["id"]: h["score"] for h in row["results"]}
    assert got["d2"] == pytest.approx(float(docs[2] @ plain), abs=1e-5)
    assert main(["search", str(index.path), str(queries), "--prompt-name", "nope"]) == 2
    assert "this model's prompts are" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_a_quantised_index(built: Index, minilm_dir: Path, tmp_path: Path, precision: str) -> None:
    """--embedding-precision keeps the windows' vectors as sentence-transformers'
    quantize_embeddings gives them (int8/uint8 buckets from all the corpus's vectors), 4 or 32
    times smaller; float queries are scored against their stand-ins, and find what the float
    index finds first."""
    from sentence_transformers.util.quantization import quantize_embeddings

    from bertforge.embedding import dequantize

    index = Index.build(
        minilm_dir,
        corpus(tmp_path),
        tmp_path / "q",
        chunk=2,
        embedding_precision=precision,
        progress=False,
        precision="fp32",
    )
    floats = np.asarray(built.vectors)
    want = quantize_embeddings(floats, precision, calibration_embeddings=floats)
    assert np.array_equal(np.asarray(index.vectors), want) and index.vectors.dtype == want.dtype
    assert index.vectors.nbytes * (4 if precision.endswith("int8") else 32) == floats.nbytes
    hits = index.search(QUERIES, top_k=6)
    assert [row[0]["id"] for row in hits] == [row[0]["id"] for row in built.search(QUERIES, 6)]
    q = index.queries(QUERIES)
    stand_ins = dequantize(want, precision, floats.shape[1], index.ranges)
    for row, v in zip(hits, q):
        short = {h["id"]: h["score"] for h in row if h["id"] != "d5"}
        np.testing.assert_allclose(
            [short[f"d{i}"] for i in range(5)], stand_ins[:5] @ v, rtol=1e-5, atol=1e-6
        )
    with pytest.raises(ConfigError, match="approximate"):
        Index.build(
            minilm_dir,
            corpus(tmp_path),
            tmp_path / "x",
            embedding_precision=precision,
            approximate="hnsw",
            progress=False,
        )


def test_a_model_in_googles_layout_has_an_identity(tiny_model: Path, tmp_path: Path) -> None:
    """Only bert_config.json (Google's name): the identity hashes it, as it hashes config.json."""
    import shutil

    from bertforge.search.identity import model_identity

    google = tmp_path / "google"
    shutil.copytree(tiny_model, google)
    (google / "config.json").rename(google / "bert_config.json")
    before = model_identity(google)
    assert len(before) == 64 and before != model_identity(tiny_model)  # its name is hashed
    (google / "bert_config.json").write_text("{}")
    assert model_identity(google) != before  # and its bytes


# ------------------------------------------------------------------------------------------------
# BEIR's layout: indexed, searched and scored (search --qrels), mined


@pytest.fixture(scope="module")
def beir_index(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> tuple[Path, Path]:
    """The BEIR fixture (tests/task_files.py) and its index, built by `bertforge index`."""
    from tests.task_files import beir_files

    tmp = tmp_path_factory.mktemp("beir")
    root, out = beir_files(tmp / "set"), tmp / "idx"
    assert (
        main(["index", str(minilm_dir), str(root), "--out", str(out), "--precision", "fp32"]) == 0
    )
    return root, out


def test_index_search_and_mine_read_a_beir_set(
    beir_index: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tests.task_files import BEIR_DOCS, BEIR_QUERIES

    root, out = beir_index
    index = Index.load(out)
    assert index.ids == [d[0] for d in BEIR_DOCS]
    assert index.texts[2] == "Hamlet Hamlet is a tragedy written by William Shakespeare."
    capsys.readouterr()
    assert main(["search", str(out), str(root), "--top-k", "1"]) == 0  # the set's queries
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["line"], r["id"], r["query"]) for r in rows] == [
        (n, q, t) for n, (q, t) in enumerate(BEIR_QUERIES, 1)
    ]
    assert rows[0]["results"][0]["id"] == "d2"
    mined = tmp_path / "mined.jsonl"
    assert main(["mine", str(out), f"{root}:train", "--out", str(mined), "--negatives", "2"]) == 0
    groups = [json.loads(x) for x in mined.read_text().splitlines()]
    assert [(g["positive_id"], g["positive"]) for g in groups] == [
        ("d1", BEIR_DOCS[1][2]),
        ("d2", index.texts[2]),
    ]
    assert all(len(g["negatives"]) == 2 and index.texts[2] not in g["negatives"] for g in groups)


def _trec_eval(qrels_file: Path, hits: Path) -> dict[str, float]:
    """pytrec_eval's means over the judged queries of a search's output, in its order."""
    import pytrec_eval

    qrels: dict[str, dict[str, int]] = {}
    for line in qrels_file.read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    rows = [json.loads(x) for x in hits.read_text().splitlines()]
    run = {r["id"]: {h["id"]: -float(h["rank"]) for h in r["results"]} for r in rows}
    run = {q: hits for q, hits in run.items() if q in qrels}
    measures = {"recip_rank", "ndcg_cut_10", "recall_1", "recall_10", "recall_100", "map_cut_100"}
    found = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    judged = [q for q, j in qrels.items() if any(s > 0 for s in j.values())]
    mean = {m: sum(found.get(q, {}).get(m, 0.0) for q in judged) / len(judged) for m in measures}
    names = {"recip_rank": "mrr@10", "ndcg_cut_10": "ndcg@10", "map_cut_100": "map@100"}
    return {names.get(m, m.replace("_", "@")): v for m, v in mean.items()}


@pytest.mark.parametrize("mode", ["dense", "bm25"])
def test_search_qrels_scores_as_trec_eval_does(
    beir_index: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture, mode: str
) -> None:
    """search --qrels DIR: the set's judged queries (test split) searched and scored, printed
    and written as JSON; equal to pytrec_eval over the same rankings (graded judgements, a tie
    of grades, a query BM25 finds nothing for scoring 0), and to a queries file beside a qrels
    file."""
    root, out = beir_index
    hits, metrics = tmp_path / "hits.jsonl", tmp_path / "m.json"
    capsys.readouterr()
    args = ["search", str(out), "--mode", mode, "--top-k", "6", "--out", str(hits)]
    assert main([*args, "--qrels", str(root), "--metrics-out", str(metrics)]) == 0
    printed = capsys.readouterr().out
    got = json.loads(metrics.read_text())
    assert got["queries"] == 3 and got["qrels"] == str(root / "qrels" / "test.tsv")
    assert "reranked" not in got
    want = _trec_eval(root / "qrels" / "test.tsv", hits)
    for name, value in want.items():
        assert got["first_stage"][name] == pytest.approx(value, abs=1e-9), name
    assert 0 < want["ndcg@10"] < 1
    shown = {line.split()[0]: line.split()[1:] for line in printed.splitlines()[2:]}
    assert shown["mrr@10"] == [f"{got['first_stage']['mrr@10']:.4f}"] and len(shown) == 5
    assert [json.loads(x)["id"] for x in hits.read_text().splitlines()] == ["q1", "q2", "q4"]
    queries = tmp_path / "q.jsonl"  # the same queries in a file, the judgements beside it
    queries.write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t in [
        ("q4", "great wall length"), ("q2", "where is the eiffel tower"),
        ("q1", "who wrote hamlet"), ("q9", "not judged"),
    ]))  # fmt: skip
    again = tmp_path / "again.json"
    qrels = root / "qrels" / "test.tsv"
    args = ["search", str(out), str(queries), "--mode", mode, "--qrels", str(qrels)]
    assert main([*args, "--metrics-out", str(again)]) == 0
    assert json.loads(again.read_text())["first_stage"] == pytest.approx(got["first_stage"])


def test_search_qrels_refusals(
    beir_index: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root, out = beir_index
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq1\td77\t1\n")
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "q1", "text": "who wrote hamlet"}) + "\n")
    capsys.readouterr()
    assert main(["search", str(out), str(queries), "--qrels", str(qrels)]) == 2
    assert (
        f"{qrels}: line 3: field \"corpus-id\": 'd77' is not in the index"
        in capsys.readouterr().err
    )
    assert main(["search", str(out), "--qrels", str(qrels)]) == 2
    assert "a qrels file scores queries given beside it" in capsys.readouterr().err
    assert main(["search", str(out), str(queries), "--metrics-out", str(tmp_path / "m")]) == 2
    assert "--metrics-out: needs --qrels" in capsys.readouterr().err
    assert main(["search", str(out), "--qrels", f"{root}:dev"]) == 2
    assert "dev.tsv: no such split (the set has: test, train;" in capsys.readouterr().err
    m = out / "m.json"
    assert main(["search", str(out), "--qrels", str(root), "--metrics-out", str(m)]) == 2
    assert "inside the index directory" in capsys.readouterr().err and not m.exists()


def test_search_qrels_reranked_beside_the_first_stage_and_warned(
    beir_index: tuple[Path, Path], tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """With --rerank, the first stage's figures are the same as without it, the reranked ones
    beside them (recall@100 the first stage's: the tail beyond --rerank-depth kept in order);
    a random cross-encoder does not beat MiniLM, and says so."""
    root, out = beir_index
    ce = _saturating_cross_encoder(tiny_model, tmp_path / "ce")
    plain, reranked = tmp_path / "plain.json", tmp_path / "reranked.json"
    assert main(["search", str(out), "--qrels", str(root), "--metrics-out", str(plain)]) == 0
    args = ["search", str(out), "--qrels", str(root), "--metrics-out", str(reranked)]
    capsys.readouterr()
    with pytest.warns(UserWarning, match=r"reranking by .*ce did not raise MRR@10 on 3 judged"):
        assert main([*args, "--rerank", str(ce), "--rerank-depth", "3", "--top-k", "3"]) == 0
    printed = capsys.readouterr().out
    got = json.loads(reranked.read_text())
    assert got["first_stage"] == json.loads(plain.read_text())["first_stage"]
    assert got["reranked"]["mrr@10"] < got["first_stage"]["mrr@10"]
    assert got["reranked"]["recall@100"] == got["first_stage"]["recall@100"]
    assert "first stage" in printed and "reranked" in printed
