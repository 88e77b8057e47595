"""The catalogue of inference front doors: every entry is a CLI verb and, where served, an
endpoint, and nothing else is; a new entry is exposed everywhere without other changes."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bertforge.catalogue import ENTRIES, available, head_labels, inspect
from bertforge.cli import build_parser, cmd_pipeline, main
from bertforge.pipelines import Pipeline
from tests.conftest import read_more_than_once

pytest.importorskip("fastapi")
pytest.importorskip("httpx")


def verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def post_routes(app: object) -> set[str]:
    routes = app.routes  # type: ignore[attr-defined]
    return {r.path for r in routes if "POST" in (getattr(r, "methods", None) or ())}


def test_every_entry_is_a_verb_and_where_served_an_endpoint(tiny_model: Path) -> None:
    from bertforge.serve import create_app

    found = verbs(build_parser())
    pipeline_verbs = {name for name, p in found.items() if p.get_default("func") is cmd_pipeline}
    assert pipeline_verbs == set(ENTRIES)
    assert all(found[name].get_default("pipeline") == name for name in ENTRIES)
    served = {f"/{e.name}" for e in ENTRIES.values() if e.served}
    app = create_app(tiny_model)
    have = {f"/{name}" for name in app.state.server.endpoints}  # the heads it has: routes
    assert {"/embed", "/fill-mask", "/nsp"} <= have < served
    assert post_routes(app) == have | {"/v1/embeddings"}
    assert not ENTRIES["features"].served and {"/embed", "/classify", "/qa"} <= served


def test_a_new_entry_is_a_verb_and_an_endpoint(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """One row added to the table (here a second name for NSP): the CLI runs it and the
    server answers it, with the same numbers as the Pipeline method."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    monkeypatch.setitem(ENTRIES, "follows", dataclasses.replace(ENTRIES["nsp"], name="follows"))
    texts, pairs = ["the cat sat.", "it rained"], ["it purred.", "stocks fell"]
    want = Pipeline(tiny_model, precision="fp32").nsp(texts, pairs)
    lines = tmp_path / "pairs.txt"
    lines.write_text("".join(f"{t}\t{p}\n" for t, p in zip(texts, pairs)))
    assert main(["follows", str(tiny_model), str(lines), "--precision", "fp32"]) == 0
    got = [json.loads(x)["is_next"] for x in capsys.readouterr().out.splitlines()]
    assert np.allclose(got, want, atol=1e-6)
    client = TestClient(create_app(tiny_model, precision="fp32"))
    r = client.post("/follows", json={"texts": texts, "pairs": pairs})
    assert r.status_code == 200 and np.allclose(r.json()["results"], want, atol=1e-6)
    assert "follows" in client.get("/metadata").json()["endpoints"]


def test_availability_heads_and_exported_outputs_come_from_the_table(tiny_model: Path) -> None:
    # summarize needs no head: any encoder's sentence embeddings summarize (k-means)
    names = [e.name for e in available(["BertForPreTraining"])]
    assert names == ["embed", "features", "fill-mask", "nsp", "summarize"]
    masked = [e.name for e in available(["BertForMaskedLM"])]
    assert masked == ["embed", "features", "fill-mask", "summarize"]
    assert [e.name for e in available([])] == ["embed", "features", "summarize"]
    assert head_labels(["classifier.weight", "bert.encoder.x"]) == ["classifier"]
    info = inspect(tiny_model)
    assert info.pipelines == ["embed", "features", "fill-mask", "nsp", "summarize"]
    assert info.heads == ["pooler", "masked LM (mlm)", "next sentence (nsp)"]


def test_qa_options_reach_the_pipeline_from_the_command_line(
    heads_dir_qa: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    lines = tmp_path / "qa.txt"
    context = " ".join(f"sentence {i} says the value is {i * 7}." for i in range(60))
    lines.write_text(f"What is the value?\t{context}\n")
    args = ["--max-seq-length", "64", "--doc-stride", "16", "--precision", "fp32"]
    assert main(["qa", str(heads_dir_qa), str(lines), *args]) == 0
    got = json.loads(capsys.readouterr().out)
    want = Pipeline(heads_dir_qa, precision="fp32").qa(
        ["What is the value?"], [context], max_seq_length=64, doc_stride=16
    )[0]
    assert got == {"line": 1, **want}


@pytest.fixture
def heads_dir_qa(tmp_path: Path, tiny_model: Path) -> Path:
    import torch

    from bertforge import BertConfig, Tokenizer
    from bertforge.heads import BertForQuestionAnswering
    from tests.conftest import TINY

    tok = Tokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    out = tmp_path / "qa-model"
    BertForQuestionAnswering(BertConfig(**{**TINY, "vocab_size": tok.vocab_size})).save_pretrained(
        out
    )
    tok.save_pretrained(out)
    return out


def test_googles_layout_has_no_head_and_every_front_door_says_so(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A directory with Google's bert_config.json and no config.json (which BertConfig reads):
    info, the server, export and rerank read it as naming no head, as its config names none."""
    from bertforge import BertConfig, CheckpointError
    from bertforge.export import export_onnx
    from bertforge.serve.server import available as served
    from bertforge.tasks.ranking import activation

    google = tmp_path / "google"
    google.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "model.safetensors"):
        (google / name).write_bytes((tiny_model / name).read_bytes())
    BertConfig.from_pretrained(tiny_model).save(google / "bert_config.json", google=True)
    assert inspect(google).pipelines == ["embed", "features", "summarize"]
    assert served(google) == ["embed", "summarize"]
    assert activation(google) == "sigmoid"
    with pytest.raises(CheckpointError, match=r"google: has no trained cross-encoder"):
        Pipeline(google, precision="fp32").rerank("q", ["a document"])
    result = export_onnx(google, tmp_path / "model.onnx")
    assert result["architecture"] == "BertModel" and result["max_abs_diff"]


def test_info_reads_each_file_of_its_model_once(reads, minilm_dir: Path, capsys) -> None:
    """`info` read the vocabulary apart from the directory it inspected (tokenizer.json and
    tokenizer_config.json twice: once for the report, once for its text); once now."""
    counts = reads(minilm_dir)
    assert main(["info", str(minilm_dir)]) == 0
    assert "30,522 tokens, uncased" in capsys.readouterr().out
    assert {"config.json", "tokenizer.json"} <= set(counts)
    assert read_more_than_once(counts) == {}
    info = inspect(minilm_dir)
    assert info.vocabulary() == {"size": 30522, "cased": False} and info.source is not None
