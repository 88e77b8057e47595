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
        [sys.executable, "-m", "bertforge", "serve", str(classifier), "--port", str(port),
         "--max-texts", "8", "--max-chars", "200", "--precision", "fp32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
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
    r = httpx.post(f"{server}/embed", content=b'{"texts": ["unterminated', headers={"content-type": "application/json"})  # fmt: skip
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
