"""The real server on a loopback port: every endpoint, micro-batching, limits, bad input."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, Tokenizer
from bertforge.heads import BertForSequenceClassification
from bertforge.pipelines import Pipeline
from tests.conftest import TINY

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    tok = Tokenizer.from_pretrained(tiny_model)
    d = tmp_path_factory.mktemp("cls")
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size, "id2label": {0: "neg", 1: "pos"}})
    BertForSequenceClassification(config).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def server(classifier: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertforge",
            "serve",
            str(classifier),
            "--port",
            str(port),
            "--max-texts",
            "8",
            "--max-chars",
            "200",
            "--precision",
            "fp32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"server exited: {proc.stdout.read() if proc.stdout else ''}")
            time.sleep(0.1)
        else:
            pytest.fail("server did not start in 30 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_endpoints(server: str, classifier: Path) -> None:
    meta = httpx.get(f"{server}/metadata").json()
    assert meta["endpoints"] == ["embed", "classify"] and meta["limits"]["max_texts"] == 8
    assert httpx.get(f"{server}/openapi.json").json()["paths"].keys() >= {"/embed", "/classify"}
    texts = ["a fine film", "a dull, long and tiresome one", "ok"]
    r = httpx.post(f"{server}/embed", json={"texts": texts, "normalize": True})
    assert r.status_code == 200
    want = Pipeline(classifier, precision="fp32").embed(texts, normalize=True)
    assert np.abs(np.array(r.json()["embeddings"]) - want).max() < 1e-5
    r = httpx.post(f"{server}/classify", json={"texts": texts})
    got = r.json()["results"]
    want_c = Pipeline(classifier, precision="fp32").classify(texts)
    assert [g["label"] for g in got] == [w["label"] for w in want_c]
    assert np.allclose([g["score"] for g in got], [w["score"] for w in want_c], atol=1e-5)
    r = httpx.post(f"{server}/classify", json={"texts": ["a"], "pairs": ["b"]})
    assert r.status_code == 200 and r.json()["results"][0]["label"] in ("neg", "pos")
    r = httpx.post(f"{server}/qa", json={"questions": ["q"], "contexts": ["c"]})
    assert r.status_code == 404 and "BertForQuestionAnswering" in r.json()["error"]


def test_limits_and_malformed_input(server: str) -> None:
    r = httpx.post(f"{server}/embed", json={"texts": ["x"] * 9})
    assert r.status_code == 413 and "limit of 8" in r.json()["error"]
    r = httpx.post(f"{server}/embed", json={"texts": ["x" * 201]})
    assert r.status_code == 413 and "texts[0]" in r.json()["error"]
    r = httpx.post(
        f"{server}/embed",
        content=b'{"texts": ["unterminated',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json() == {"error": "the body is not valid JSON"}
    r = httpx.post(f"{server}/embed", json={"texts": "not a list"})
    assert r.status_code == 422 and r.json()["error"].startswith("texts")
    r = httpx.post(f"{server}/embed", json={"texts": []})
    assert r.status_code == 422
    r = httpx.post(f"{server}/embed", json={"texts": ["a"], "pooling": "../../etc/passwd"})
    assert r.status_code == 422
    r = httpx.post(f"{server}/classify", json={"texts": ["a", "b"], "pairs": ["c"]})
    assert r.status_code == 422 and "2 texts but 1 pairs" in r.json()["error"]


def test_concurrent_requests_are_batched_and_answered_each_with_its_own(
    server: str, classifier: Path
) -> None:
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(48)]

    async def go() -> list[list[float]]:
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            rs = await asyncio.gather(*(client.post("/embed", json={"texts": [t]}) for t in texts))
        assert all(r.status_code == 200 for r in rs)
        return [r.json()["embeddings"][0] for r in rs]

    got = np.array(asyncio.run(go()))
    want = Pipeline(classifier, precision="fp32").embed(texts)
    assert np.abs(got - want).max() < 1e-4


def test_openai_embeddings_api(server: str, classifier: Path) -> None:
    """POST /v1/embeddings in the shapes the OpenAI client sends; vectors equal /embed's."""
    texts = ["a fine film", "a dull, long and tiresome one"]
    want = np.array(httpx.post(f"{server}/embed", json={"texts": texts}).json()["embeddings"])
    r = httpx.post(f"{server}/v1/embeddings", json={"input": texts, "model": "mine"}).json()
    assert r["object"] == "list" and r["model"] == "mine"
    assert [d["index"] for d in r["data"]] == [0, 1] and r["data"][0]["object"] == "embedding"
    assert np.abs(np.array([d["embedding"] for d in r["data"]]) - want).max() < 1e-6
    tok = Tokenizer.from_pretrained(classifier)
    pieces = [len(e.ids) for e in tok.encode_batch(texts)]
    assert r["usage"] == {"prompt_tokens": sum(pieces), "total_tokens": sum(pieces)}
    one = httpx.post(f"{server}/v1/embeddings", json={"input": texts[0]}).json()
    assert np.abs(np.array(one["data"][0]["embedding"]) - want[0]).max() < 1e-6
    ids = tok.encode_batch(texts, add_special_tokens=False)
    for body in ({"input": ids[0].ids}, {"input": [e.ids for e in ids]}):
        got = httpx.post(f"{server}/v1/embeddings", json=body).json()["data"]
        assert np.abs(np.array([d["embedding"] for d in got]) - want[: len(got)]).max() < 1e-6
    r = httpx.post(f"{server}/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
    decoded = np.frombuffer(__import__("base64").b64decode(r.json()["data"][1]["embedding"]), "<f4")
    assert np.abs(decoded - want[1]).max() < 1e-6
    r = httpx.post(f"{server}/v1/embeddings", json={"input": texts, "dimensions": 64})
    assert r.status_code == 400 and "dimensions=64" in r.json()["error"]
    assert (
        httpx.post(f"{server}/v1/embeddings", json={"input": texts, "dimensions": 128}).status_code
        == 200
    )
    r = httpx.post(f"{server}/v1/embeddings", json={"input": [[1, 10**9]]})
    assert r.status_code == 422 and "piece ids" in r.json()["error"]
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    got = client.embeddings.create(input=texts, model="mine")  # the client asks for base64
    assert np.abs(np.array([d.embedding for d in got.data]) - want).max() < 1e-6
    assert got.usage.prompt_tokens == sum(pieces)


def test_metrics_in_prometheus_text(server: str) -> None:
    httpx.post(f"{server}/embed", json={"texts": ["x"]})
    httpx.post(f"{server}/embed", json={"texts": []})
    text = httpx.get(f"{server}/metrics").text
    assert 'bertforge_requests_total{endpoint="/embed",status="200"}' in text
    assert 'bertforge_requests_total{endpoint="/embed",status="422"}' in text
    assert 'bertforge_request_seconds_bucket{endpoint="/embed",le="+Inf"}' in text
    assert "bertforge_batch_texts_count" in text and "bertforge_queue_depth" in text
    for line in text.splitlines():  # every sample line: name{labels} value
        assert line.startswith("#") or float(line.rsplit(" ", 1)[1]) >= 0


def test_a_long_text_does_not_share_a_batch_beyond_the_token_cap() -> None:
    from bertforge.serve import Batcher, Limits, Metrics

    calls: list[list[str]] = []

    def run(items: list[str], options: dict) -> list[int]:
        calls.append(items)
        return [len(x) for x in items]

    limits = Limits(max_batch=64, max_batch_tokens=100, max_wait_ms=200)
    b = Batcher(run, limits, pieces=len, metrics=Metrics())

    async def go() -> list[list[int]]:
        return await asyncio.gather(*(b.submit([t], {}) for t in ["ab", "cd", "x" * 90, "ef"]))

    assert asyncio.run(go()) == [[2], [2], [90], [2]]
    assert ["x" * 90] in calls and all(len(c) * max(map(len, c)) <= 100 for c in calls)
