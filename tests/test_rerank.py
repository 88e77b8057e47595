"""Cross-encoders (tasks/ranking.py, Pipeline.score/rerank, `bertforge rerank`, the server's
/rerank and /v1/rerank): scores as sentence-transformers' CrossEncoder.predict gives them, the
activation read where each version keeps it, long documents read in windows."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge import BertConfig, Tokenizer
from bertforge.catalogue import available, inspect
from bertforge.cli import main
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.heads import BertForSequenceClassification
from bertforge.pipelines import Pipeline
from bertforge.tasks import ranking
from tests.conftest import TINY

QUERIES = ["where is the eiffel tower", "what do cats eat", "who wrote hamlet"]
DOCS = [
    "The Eiffel Tower stands in Paris, the capital of France.",
    "Cats are carnivores and eat meat such as fish and mice.",
    "Hamlet is a tragedy written by William Shakespeare.",
    "The stock market fell sharply on Monday.",
]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """all-MiniLM-L6-v2 as a one-label CrossEncoder (a seeded head), saved by
    sentence-transformers itself."""
    st = pytest.importorskip("sentence_transformers")
    torch.manual_seed(0)
    ce = st.CrossEncoder(str(minilm_dir), num_labels=1)
    out = tmp_path_factory.mktemp("ce")
    ce.save(str(out))
    return out


@pytest.fixture(scope="module")
def tiny_ce(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    tok = Tokenizer.from_pretrained(tiny_model)
    out = tmp_path_factory.mktemp("tiny_ce")
    torch.manual_seed(0)
    BertForSequenceClassification(
        BertConfig(**{**TINY, "vocab_size": tok.vocab_size}).replace(num_labels=1)
    ).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def pairs() -> list[tuple[str, str]]:
    return [(q, d) for q in QUERIES for d in DOCS]


def test_scores_are_crossencoder_predict(cross_encoder: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    ce = st.CrossEncoder(str(cross_encoder))
    want = ce.predict(pairs())
    pipe = Pipeline(cross_encoder, precision="fp32")
    got = pipe.score([q for q, _ in pairs()], [d for _, d in pairs()])
    np.testing.assert_allclose(got, want, atol=1e-5)
    raw = ce.predict(pairs(), activation_fn=torch.nn.Identity())
    got_raw = pipe.score([q for q, _ in pairs()], [d for _, d in pairs()], raw_scores=True)
    np.testing.assert_allclose(got_raw, raw, atol=1e-5)
    # rerank: the documents by score, as CrossEncoder.rank orders them
    ranks = ce.rank(QUERIES[0], DOCS)
    mine = pipe.rerank(QUERIES[0], DOCS)
    assert [r["corpus_id"] for r in ranks] == [r["index"] for r in mine]
    np.testing.assert_allclose([r["score"] for r in ranks], [r["score"] for r in mine], atol=1e-5)
    assert [r["index"] for r in pipe.rerank(QUERIES[0], DOCS, top_k=2)] == [
        r["index"] for r in mine[:2]
    ]


@pytest.mark.parametrize("where", ["v6", "v4", "v3"])
@pytest.mark.parametrize("name", ["Identity", "Tanh", "Sigmoid"])
def test_the_activation_is_read_where_each_version_keeps_it(
    cross_encoder: Path, tmp_path: Path, where: str, name: str
) -> None:
    st = pytest.importorskip("sentence_transformers")
    d = tmp_path / "ce"
    shutil.copytree(cross_encoder, d)
    path = f"torch.nn.modules.{'linear' if name == 'Identity' else 'activation'}.{name}"
    st_config = json.loads((d / "config_sentence_transformers.json").read_text())
    config = json.loads((d / "config.json").read_text())
    st_config.pop("activation_fn")
    if where == "v6":
        st_config["activation_fn"] = path
    elif where == "v4":
        config["sentence_transformers"] = {"activation_fn": path}
    else:
        config["sbert_ce_default_activation_function"] = path
    (d / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    (d / "config.json").write_text(json.dumps(config))
    assert ranking.activation(d) == name.lower()
    ref = st.CrossEncoder(str(d), activation_fn=getattr(torch.nn, name)()).predict(pairs()[:4])
    got = Pipeline(d, precision="fp32").score(QUERIES[:1] * 4, DOCS)
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_no_activation_named_is_sigmoid_and_an_unknown_one_is_refused(
    cross_encoder: Path, tmp_path: Path
) -> None:
    d = tmp_path / "ce"
    shutil.copytree(cross_encoder, d)
    (d / "config_sentence_transformers.json").unlink()
    assert ranking.activation(d) == "sigmoid"
    (d / "config_sentence_transformers.json").write_text(
        json.dumps({"activation_fn": "mypackage.Activation"})
    )
    with pytest.raises(CheckpointError, match=r"config_sentence_transformers.json: activation_fn"):
        Pipeline(d).score(["q"], ["d"])


def _frame(cls_id: int, sep_id: int) -> Any:
    """A stand-in tokenizer for pair_rows over made-up piece ids: BERT's frame ([CLS] a [SEP]
    b [SEP]) around them with these ids, as Tokenizer.row lays it."""
    from types import SimpleNamespace

    from bertforge.families import Specials
    from bertforge.tokenizer import Tokenizer

    tok = SimpleNamespace(cls_id=cls_id, sep_id=sep_id, specials=Specials())
    tok.row = lambda a, b=None: Tokenizer.row(tok, a, b)  # type: ignore[arg-type]
    return tok


def test_pair_rows_cover_the_document_with_the_query_in_every_row() -> None:
    q, d = list(range(100, 110)), list(range(200, 300))
    frame = _frame(1, 2)
    rows = ranking.pair_rows(q, d, frame, max_length=40, stride=10)
    seen: set[int] = set()
    for ids, types in rows:
        assert len(ids) <= 40 and ids[0] == 1 and ids[-1] == 2
        assert list(ids[1:11]) == q and ids[11] == 2
        assert list(types) == [0] * 12 + [1] * (len(ids) - 12)
        seen.update(ids[12:-1].tolist())
    assert seen == set(d)
    # a pair that fits: one row, the tokenizer's own pair layout
    assert len(ranking.pair_rows(q, d[:5], frame, 40)) == 1
    # a long query is cut to half a row beside a long document; beside a short one, to fit
    ids, _ = ranking.pair_rows(list(range(100, 160)), d, frame, 40)[0]
    assert list(ids[1:19]) == list(range(100, 118)) and ids[19] == 2
    (ids, _), *more = ranking.pair_rows(list(range(100, 160)), d[:5], frame, 40)
    assert not more and len(ids) == 40 and list(ids[-6:-1]) == d[:5]
    assert len(ranking.pair_rows(q, d, frame, 40, truncate=True)) == 1


def test_ranked_refuses_a_score_that_is_not_finite(tiny_ce: Path) -> None:
    """A NaN compares false with every score, so a sort leaves it wherever it falls; ranked
    refuses it, naming the document, as evaluate refuses a non-finite ranking score; so do rerank and
    the server's three rerank APIs (one error, not an order with NaN in it)."""
    assert ranking.ranked([0.1, 0.9, 0.5, 0.9]) == [1, 3, 2, 0]
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(InputError, match=re.escape(f"document 2: score {bad}: rankings need")):
            ranking.ranked([0.3, 0.9, bad])
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    with TestClient(create_app(tiny_ce, precision="fp32")) as client:
        pipe = client.app.state.server.pipe  # type: ignore[attr-defined]
        pipe.score = lambda queries, documents, *a, **k: [0.2, float("nan"), 0.7][: len(documents)]
        with pytest.raises(InputError, match="document 1: score nan"):
            pipe.rerank("q", ["a", "b", "c"])
        bodies = [
            ("/rerank", {"query": "q", "texts": ["a", "b", "c"]}),
            ("/v1/rerank", {"query": "q", "documents": ["a", "b", "c"]}),
            ("/v2/rerank", {"model": "m", "query": "q", "documents": ["a", "b", "c"]}),
        ]
        for path, body in bodies:
            r = client.post(path, json=body)
            assert r.status_code == 422 and "document 1: score nan" in r.text, (path, r.text)


def test_a_long_document_scores_its_best_window(cross_encoder: Path) -> None:
    """A document longer than the model reads: the best of its windows' scores, each window
    scored as CrossEncoder.predict scores that pair; truncate: the first window's."""
    st = pytest.importorskip("sentence_transformers")
    ce = st.CrossEncoder(str(cross_encoder))
    filler = "the weather was mild and the river ran slowly past the old mill . " * 6
    doc = filler + DOCS[0]
    pipe = Pipeline(cross_encoder, precision="fp32", max_length=48)
    q_ids = pipe.tok.encode(QUERIES[0], add_special_tokens=False).ids
    d_ids = pipe.tok.encode(doc, add_special_tokens=False, truncation=False).ids
    rows = ranking.pair_rows(q_ids, d_ids, pipe.tok, 48)
    assert len(rows) > 2
    windows = [pipe.tok.decode(ids[len(q_ids) + 2 : -1]) for ids, _ in rows]
    per_window = ce.predict([(QUERIES[0], w) for w in windows])
    got = pipe.score([QUERIES[0]], [doc])[0]
    assert got == pytest.approx(per_window.max(), abs=1e-5)
    first = Pipeline(cross_encoder, precision="fp32", max_length=48, truncate=True)
    assert first.score([QUERIES[0]], [doc])[0] == pytest.approx(per_window[0], abs=1e-5)
    assert pipe.score([QUERIES[0]], [doc], truncate=True)[0] == pytest.approx(
        per_window[0], abs=1e-5
    )


def test_refusals(tiny_model: Path, tiny_ce: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no trained cross-encoder"):
        Pipeline(tiny_model).score(["q"], ["d"])
    two = tmp_path / "two"
    BertForSequenceClassification(
        BertConfig(**{**TINY, "vocab_size": 30522}).replace(num_labels=2)
    ).save_pretrained(two)
    Tokenizer.from_pretrained(tiny_model).save_pretrained(two)
    with pytest.raises(ConfigError, match="a classifier of 2 labels; rerank needs a cross-encoder"):
        Pipeline(two).score(["q"], ["d"])
    assert "rerank" not in inspect(two).pipelines and "rerank" in inspect(tiny_ce).pipelines
    assert "rerank" not in [e.name for e in available(["BertForSequenceClassification"], 3)]
    pipe = Pipeline(tiny_ce)
    with pytest.raises(InputError, match="2 queries but 1 documents"):
        pipe.score(["a", "b"], ["c"])
    with pytest.raises(InputError, match="single string"):
        pipe.score("a", "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="top_k=0"):
        pipe.rerank("q", ["d"], top_k=0)
    assert pipe.rerank("q", []) == []


def test_cli_rerank_scores_lines(
    tiny_ce: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    lines = tmp_path / "pairs.tsv"
    lines.write_text("".join(f"{q}\t{d}\n" for q, d in pairs()))
    assert main(["rerank", str(tiny_ce), str(lines), "--precision", "fp32"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    want = Pipeline(tiny_ce, precision="fp32").score(
        [q for q, _ in pairs()], [d for _, d in pairs()]
    )
    assert [r["line"] for r in rows] == list(range(1, len(want) + 1))
    np.testing.assert_allclose([r["score"] for r in rows], want, atol=1e-6)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({"id": "a", "query": "q", "document": "d"}) + "\n")
    assert main(["rerank", str(tiny_ce), str(jsonl), "--raw-scores"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "a"
    lines.write_text("only one column\n")
    assert main(["rerank", str(tiny_ce), str(lines)]) == 2
    assert "line 1: 1 tab-separated fields, expected 2" in capsys.readouterr().err


def test_server_rerank_shapes(tiny_ce: Path, tiny_model: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    # one event loop for all requests (the batcher's worker lives in it), as under uvicorn
    with TestClient(create_app(tiny_ce, precision="fp32")) as client:
        pipe = Pipeline(tiny_ce, precision="fp32")
        want = pipe.rerank(QUERIES[0], DOCS)
        raw = pipe.rerank(QUERIES[0], DOCS, raw_scores=True)
        r = client.post("/rerank", json={"query": QUERIES[0], "texts": DOCS})
        assert r.status_code == 200
        assert [x["index"] for x in r.json()] == [x["index"] for x in want]
        np.testing.assert_allclose(
            [x["score"] for x in r.json()], [x["score"] for x in want], atol=1e-6
        )
        r = client.post(
            "/rerank",
            json={"query": QUERIES[0], "texts": DOCS, "raw_scores": True, "return_text": True},
        )
        np.testing.assert_allclose(
            [x["score"] for x in r.json()], [x["score"] for x in raw], atol=1e-6
        )
        assert [x["text"] for x in r.json()] == [DOCS[x["index"]] for x in raw]
        body = {
            "query": QUERIES[0],
            "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]],
            "top_n": 2,
        }
        r = client.post("/v1/rerank", json={**body, "return_documents": True})
        results = r.json()["results"]
        assert [x["index"] for x in results] == [x["index"] for x in want[:2]]
        np.testing.assert_allclose(
            [x["relevance_score"] for x in results], [x["score"] for x in want[:2]], atol=1e-6
        )
        assert results[0]["document"] == {"text": DOCS[results[0]["index"]]}
        assert r.json()["usage"]["total_tokens"] > 0
        assert client.post("/rerank", json={"query": "q", "texts": []}).status_code == 422
        assert client.post("/v1/rerank", json={**body, "top_n": 0}).status_code == 422
        assert "rerank" in client.get("/metadata").json()["endpoints"]
    plain = TestClient(create_app(tiny_model))
    r = plain.post("/rerank", json={"query": "q", "texts": ["d"]})
    assert r.status_code == 404 and "error" in r.json()


def test_cohere_v1_returns_object_documents_as_given(tiny_ce: Path) -> None:
    """Cohere's v1 /rerank with return_documents answers each document as it was sent: an
    object with its other fields (an id, metadata), a string as {"text"}; an object without
    a text is a 422 naming it."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    given = {"text": DOCS[1], "id": "d1", "meta": {"year": 2020, "tags": ["a", None]}}
    body = {"query": QUERIES[1], "documents": [DOCS[0], given], "return_documents": True}
    with TestClient(create_app(tiny_ce, precision="fp32")) as client:
        r = client.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        documents = {x["index"]: x["document"] for x in r.json()["results"]}
        assert documents == {0: {"text": DOCS[0]}, 1: given}
        r = client.post("/v1/rerank", json={**body, "documents": [{"id": "d1"}]})
        assert r.status_code == 422 and "documents.0" in r.json()["error"]["message"]


# -- training: finetune --task rerank -------------------------------------------------------------


def test_the_losses() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 3)
    want = torch.nn.functional.cross_entropy(
        logits, torch.zeros(4, dtype=torch.long), reduction="sum"
    )
    assert float(ranking.listwise_loss(logits)) == pytest.approx(float(want), rel=1e-6)
    labels = torch.tensor([[1.0, 0, 0]] * 4)
    bce = torch.nn.BCEWithLogitsLoss()(logits, labels)  # sentence-transformers' per pair, mean
    assert float(ranking.pointwise_loss(logits)) == pytest.approx(12 * float(bce), rel=1e-6)


def test_the_distillation_losses() -> None:
    torch.manual_seed(0)
    logits, teacher = torch.randn(4, 3), 3 * torch.randn(4, 3)
    # sentence-transformers' MarginMSELoss: MSE of the margins positive - negative, mean over
    # (groups, negatives); ListNetLoss: cross-entropy against the teacher's softmax, mean
    margins = (logits[:, :1] - logits[:, 1:], teacher[:, :1] - teacher[:, 1:])
    want = torch.nn.MSELoss()(*margins)
    got = ranking.margin_mse_loss(logits, teacher) / 4
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    listnet = torch.nn.CrossEntropyLoss()(logits, teacher.softmax(1))
    entropy = -(teacher.softmax(1) * teacher.log_softmax(1)).sum(1).mean()
    got = ranking.listnet_loss(logits, teacher) / 4 + entropy
    assert float(got) == pytest.approx(float(listnet), rel=1e-5)
    assert float(ranking.margin_mse_loss(teacher + 7, teacher)) == pytest.approx(0, abs=1e-5)


def groups(teacher: bool = False) -> list[dict]:
    """Each query with its document first and the others as negatives (teacher: scores that
    put the positive 4 above every negative)."""
    return [
        {
            "query": q,
            "positive": DOCS[i],
            "negatives": [d for d in DOCS if d != DOCS[i]],
            **({"scores": [4.0, 0.0, 0.0, 0.0]} if teacher else {}),
        }
        for i, q in enumerate(QUERIES)
    ]


@pytest.mark.parametrize("loss", ["listwise", "pointwise", "margin-mse"])
def test_training_writes_a_crossencoder(minilm_dir: Path, tmp_path: Path, loss: str) -> None:
    st = pytest.importorskip("sentence_transformers")
    rows = groups(teacher=loss == "margin-mse")
    train, dev = tmp_path / "groups.jsonl", tmp_path / "dev.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    dev.write_text("".join(json.dumps(r) + "\n" for r in groups()))  # a dev file needs no scores
    out = tmp_path / "ce"
    args = ["finetune", "--task", "rerank", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--dev", str(dev), "--out", str(out), "--epochs", "2", "--batch-size", "4"]
    assert (
        main([*args, "--rerank-loss", loss, "--lr", "1e-4", "--precision", "fp32", "--no-progress"])
        == 0
    )
    results = json.loads((out / "eval_results.json").read_text())
    assert results["mrr@10"] > 0.5 and "recall@1" in results
    got = Pipeline(out, precision="fp32").score([q for q, _ in pairs()], [d for _, d in pairs()])
    want = st.CrossEncoder(str(out)).predict(pairs())
    np.testing.assert_allclose(got, want, atol=1e-5)
    # it learned the training queries' order
    assert [Pipeline(out, precision="fp32").rerank(q, DOCS)[0]["index"] for q in QUERIES] == [
        0,
        1,
        2,
    ]


def test_training_ends_scoring_the_first_stages_order_beside_its_own(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The dev groups' "ranks" (bertforge mine's: each passage's rank in the first stage, the
    positive first, null below --depth) order them as the first stage did: its MRR@10 on the
    same groups is reported beside the reranker's, and a reranker that beats it is not warned
    about."""
    rows = groups()
    train, dev, out = tmp_path / "groups.jsonl", tmp_path / "dev.jsonl", tmp_path / "ce"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    # the positive third (1/3), below --depth (last of 4: 1/4), first (1)
    ranks = [[3, 1, 2, 4], [None, 1, 2, 3], [1, 2, 3, 4]]
    dev.write_text("".join(json.dumps({**r, "ranks": k}) + "\n" for r, k in zip(rows, ranks)))
    args = ["finetune", "--task", "rerank", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--dev", str(dev), "--out", str(out), "--epochs", "2", "--batch-size", "4"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: it beats the first stage
        assert main([*args, "--lr", "1e-4", "--precision", "fp32", "--no-progress"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["first_stage_mrr@10"] == pytest.approx((1 / 3 + 1 / 4 + 1) / 3)
    assert results["mrr@10"] > results["first_stage_mrr@10"]
    assert f"first_stage_mrr@10 {results['first_stage_mrr@10']:.4f}" in capsys.readouterr().out


def test_a_reranker_at_chance_is_warned_about(tiny_model: Path, tmp_path: Path) -> None:
    """A fresh head (a random tiny encoder, a learning rate too small to move it) ranks the dev
    groups by chance: the run ends with one warning naming its MRR@10 and the first stage's on
    the same groups (which ranked each positive first)."""
    rows = groups()
    train, dev, out = tmp_path / "groups.jsonl", tmp_path / "dev.jsonl", tmp_path / "ce"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dev.write_text("".join(json.dumps({**r, "ranks": [1, 2, 3, 4]}) + "\n" for r in rows))
    args = ["finetune", "--task", "rerank", "--model", str(tiny_model), "--train", str(train)]
    args += ["--dev", str(dev), "--out", str(out), "--epochs", "1", "--lr", "1e-12"]
    with pytest.warns(UserWarning, match="not better than the first stage's order") as caught:
        assert main([*args, "--precision", "fp32", "--no-progress"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["first_stage_mrr@10"] == 1.0 and results["mrr@10"] < 1.0
    (said,) = [str(w.message) for w in caught if "first stage" in str(w.message)]
    assert f"MRR@10 {results['mrr@10']:.4f} is not better" in said and "(1.0000)" in said
    assert "\n" not in said


def test_training_on_groups_without_ranks_prints_the_chance_figure(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Dev groups without first-stage ranks: finetune's last line gives a random order's MRR@10
    (chance_mrr@10) beside the reranker's, and no first stage's figure (never a nan)."""
    rows = groups()
    train, dev, out = tmp_path / "groups.jsonl", tmp_path / "dev.jsonl", tmp_path / "ce"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["finetune", "--task", "rerank", "--model", str(tiny_model), "--train", str(train)]
    args += ["--dev", str(dev), "--out", str(out), "--epochs", "1", "--lr", "1e-12"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whether this random head beats chance: luck
        assert main([*args, "--precision", "fp32", "--no-progress"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert "first_stage_mrr@10" not in results
    printed = capsys.readouterr().out
    assert f"chance_mrr@10 {results['chance_mrr@10']:.4f}" in printed
    assert "nan" not in printed.lower() and "first_stage" not in printed


def test_groups_without_ranks_are_compared_with_a_random_order() -> None:
    """Dev groups that carry no first-stage ranks (not mined, or by an older bertforge): the
    reranker must beat a random order, each group's expected reciprocal rank (groups of 4: (1 +
    1/2 + 1/3 + 1/4) / 4; of 12: the top 10's sum / 12)."""
    from bertforge.data.tasks import RetrievalExample

    four, twelve = (RetrievalExample("q", "p", ("n",) * k) for k in (3, 11))
    chance = ranking.baseline([four, twelve])["chance_mrr@10"]
    assert chance == pytest.approx((25 / 12 / 4 + sum(1 / r for r in range(1, 11)) / 12) / 2)
    task = ranking.RerankTask.__new__(ranking.RerankTask)
    said = task.warning({"mrr@10": chance, "chance_mrr@10": chance})
    assert said is not None and "not better than a random order" in said
    assert task.warning({"mrr@10": chance + 0.01, "chance_mrr@10": chance}) is None


def test_rerank_cpu_report_gives_the_chance_figure_without_first_stage_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/rerank_cpu.py's report of a reranker whose dev groups carried no first-stage
    ranks: its dev MRR@10 beside a random order's (chance_mrr@10, what training compared it
    with), not a first stage's figure of nan."""
    import importlib

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = importlib.import_module("rerank_cpu")
    run = tmp_path / "ce"
    run.mkdir()
    scores = {"mrr@10": 0.61, "chance_mrr@10": 0.52, "recall@1": 0.4, "step": 10}
    (run / "eval_results.json").write_text(json.dumps(scores))
    (run / "run.json").write_text(json.dumps({"settings": {}}))
    log = tmp_path / "time.log"
    log.write_text(
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02.50\n\tUser time (seconds): 100.0\n"
        "\tSystem time (seconds): 4.0\n\tMaximum resident set size (kbytes): 2300000\n"
    )
    training = bench.training_cost(log, run)
    assert training["dev"] == {"mrr@10": 0.61, "chance_mrr@10": 0.52, "step": 10}
    result = {"date": "d", "queries": 3, "depth": 20, "recipe": "r", "training": training}
    text = bench.markdown({**result, "rows": {}})
    assert "dev MRR@10 0.6100 against a random order of the same groups 0.5200." in text
    assert "nan" not in text
    training["dev"] = {"mrr@10": 0.897, "first_stage_mrr@10": 0.9139, "step": 10}
    text = bench.markdown({**result, "rows": {}})
    assert "dev MRR@10 0.8970 against the first stage's order of the same groups 0.9139." in text


def test_dev_ranks_are_checked(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rows = groups()
    train, dev = tmp_path / "groups.jsonl", tmp_path / "dev.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dev.write_text(json.dumps({**rows[0], "ranks": [1, 2]}) + "\n")
    args = ["finetune", "--task", "rerank", "--model", str(minilm_dir), "--train", str(train)]
    assert main([*args, "--dev", str(dev), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f'{dev}: line 1: field "ranks": expected 4 ranks' in err, err
    assert not (tmp_path / "o").exists()


def test_a_dev_pass_that_scores_nan_stops_training_with_the_row_named(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A positive (always listed first) that scores NaN, as an fp16 overflow gives, kept its
    place in the sort: MRR 1.0, and the broken model kept as the best epoch. Now the run stops
    at that dev pass with one message naming the dev row, and keeps nothing of it."""
    forward = ranking._Grouped.forward

    def nan_on_dev(self: ranking._Grouped, *inputs: torch.Tensor) -> torch.Tensor:
        scores = forward(self, *inputs)
        return scores if self.model.training else scores.index_fill(1, torch.tensor([0]), np.nan)

    monkeypatch.setattr(ranking._Grouped, "forward", nan_on_dev)
    train, dev, out = tmp_path / "groups.jsonl", tmp_path / "dev.jsonl", tmp_path / "ce"
    train.write_text("".join(json.dumps(r) + "\n" for r in groups()))
    dev.write_text("".join(json.dumps(r) + "\n" for r in groups()))
    args = ["finetune", "--task", "rerank", "--model", str(tiny_model), "--train", str(train)]
    assert main([*args, "--dev", str(dev), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"bertforge: error: {dev}:1: passage 0 (the positive): score nan" in err, err
    assert "Traceback" not in err and not (out / "eval_results.json").exists()


def test_rerank_training_needs_negatives(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = tmp_path / "pairs.jsonl"
    train.write_text(json.dumps({"query": "q", "positive": "p"}) + "\n")
    args = ["finetune", "--task", "rerank", "--model", str(minilm_dir), "--train", str(train)]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "rerank training needs negatives" in capsys.readouterr().err


def test_distillation_needs_teacher_scores_of_every_pair(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = tmp_path / "groups.jsonl"
    args = ["finetune", "--task", "rerank", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--out", str(tmp_path / "o"), "--rerank-loss", "listnet"]
    train.write_text("".join(json.dumps(r) + "\n" for r in groups()))
    assert main(args) == 2
    assert (
        "groups.jsonl:1: --rerank-loss listnet learns a teacher's scores, and the rows have "
        'no "scores"' in capsys.readouterr().err
    )
    bad = groups(teacher=True)
    bad[1]["scores"] = [1.0, 2.0]
    train.write_text("".join(json.dumps(r) + "\n" for r in bad))
    assert main(args) == 2
    assert 'line 2: field "scores": expected 4 numbers' in capsys.readouterr().err
    bad[1] = groups()[1]
    train.write_text("".join(json.dumps(r) + "\n" for r in bad))
    assert main(args) == 2
    assert "groups.jsonl:2: no teacher scores, but" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_mine_with_a_teacher_scores_each_group(
    minilm_dir: Path, cross_encoder: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(DOCS) + "\n")
    index = tmp_path / "idx"
    assert main(["index", str(minilm_dir), str(corpus), "--out", str(index), "--no-progress"]) == 0
    train = tmp_path / "pairs.jsonl"
    train.write_text(
        "".join(json.dumps({"query": q, "positive": DOCS[i]}) + "\n" for i, q in enumerate(QUERIES))
    )
    mined = tmp_path / "mined.jsonl"
    args = ["mine", str(index), str(train), "--out", str(mined), "--negatives", "2"]
    assert main([*args, "--teacher", str(cross_encoder)]) == 0
    rows = [json.loads(x) for x in mined.read_text().splitlines()]
    assert len(rows) == 3
    pipe = Pipeline(cross_encoder)
    for r in rows:
        texts = [r["positive"], *r["negatives"]]
        want = pipe.score([r["query"]] * 3, texts, raw_scores=True)
        np.testing.assert_allclose(r["scores"], want, atol=1e-6)


def test_a_regression_model_is_a_crossencoder_of_raw_scores(
    minilm_dir: Path, tmp_path: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    train = tmp_path / "train.tsv"
    lines = ["sentence1\tsentence2\tscore"]
    lines += [
        f"{q}\t{d}\t{5.0 if i == j else 0.5}"
        for i, q in enumerate(QUERIES)
        for j, d in enumerate(DOCS)
    ]
    train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "sts"
    args = ["finetune", "--task", "stsb", "--model", str(minilm_dir), "--train", str(train)]
    assert main([*args, "--out", str(out), "--epochs", "1", "--no-progress"]) == 0
    assert ranking.activation(out) == "identity"
    want = st.CrossEncoder(str(out)).predict(pairs())
    got = Pipeline(out, precision="fp32").score([q for q, _ in pairs()], [d for _, d in pairs()])
    np.testing.assert_allclose(got, want, atol=1e-5)
    raw = Pipeline(out, precision="fp32").score(QUERIES, DOCS[:3], raw_scores=True)
    np.testing.assert_allclose(raw, want[[0, 5, 10]], atol=1e-5)


def test_server_rerank_limits(tiny_ce: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import Limits, create_app

    limits = Limits(max_texts=2, max_chars=50)
    with TestClient(create_app(tiny_ce, limits)) as client:
        r = client.post("/rerank", json={"query": "q", "texts": ["a", "b", "c"]})
        assert r.status_code == 413 and "texts: 3 items" in r.json()["error"]
        r = client.post("/v1/rerank", json={"query": "q" * 60, "documents": ["a"]})
        assert r.status_code == 413 and "query[0]" in r.json()["error"]["message"]
        r = client.post("/rerank", json={"query": "q"})
        assert r.status_code == 422 and "error" in r.json()
        json_type = {"content-type": "application/json"}
        assert client.post("/rerank", content=b"{nope", headers=json_type).status_code == 400
