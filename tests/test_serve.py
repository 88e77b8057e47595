"""The real server on a loopback port: every endpoint, micro-batching, limits, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge import BertConfig, Tokenizer
from bertforge.errors import DataError, InputError
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
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    tok = Tokenizer.from_pretrained(tiny_model)
    d = tmp_path_factory.mktemp("ce")
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size}).replace(num_labels=1)
    BertForSequenceClassification(config).save_pretrained(d)
    tok.save_pretrained(d)
    return d


LOGS: dict[str, Path] = {}  # a served url: its server's output


@contextlib.contextmanager
def running(
    model: Path, log_path: Path, *options: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`bertforge serve MODEL OPTIONS` on a free loopback port (its output in log_path) until
    the block ends; its url."""
    port = free_port()
    log = log_path.open("w")
    command = [sys.executable, "-m", "bertforge", "serve", str(model), "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--precision", "fp32", *options],
        stdout=log,  # a file, not a pipe: a full pipe would block the server
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    LOGS[url] = log_path
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"server exited: {log_path.read_text()}")
            time.sleep(0.1)
        else:
            pytest.fail("server did not start in 30 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def server(classifier: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    limits = ("--max-texts", "8", "--max-chars", "200", "--max-body-bytes", "100000")
    # no key, whatever the environment holds
    with running(classifier, log_path, *limits, env={"BERTFORGE_API_KEY": ""}) as url:
        yield url


def test_endpoints(server: str, classifier: Path) -> None:
    meta = httpx.get(f"{server}/metadata").json()
    assert meta["endpoints"] == ["embed", "classify", "summarize"]
    assert meta["limits"]["max_texts"] == 8
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


def test_summarize_answers_its_shape_and_refuses_bad_options(server: str, classifier: Path) -> None:
    texts = [
        "The river runs through the old town. Its bridges are old.\nBoats carry goods on it.",
        "",
        "One sentence.",
    ]
    r = httpx.post(f"{server}/summarize", json={"texts": texts, "sentences": 2})
    assert r.status_code == 200, r.text
    got = r.json()["results"]
    want = Pipeline(classifier, precision="fp32").summarize(texts, 2)
    assert [[s["index"] for s in g["sentences"]] for g in got] == [
        [s["index"] for s in w["sentences"]] for w in want
    ]
    assert got[0].keys() == {"summary", "sentences", "mode"} and got[0]["mode"] == "kmeans"
    assert got[0]["sentences"][0].keys() == {"index", "text", "start", "end", "score"}
    assert got[1] == {"summary": "", "sentences": [], "mode": "kmeans"}
    for bad in ({"ratio": 2}, {"sentences": 0}, {"mode": "magic"}, {"mode": "trained"}):
        r = httpx.post(f"{server}/summarize", json={"texts": texts, **bad})
        assert 400 <= r.status_code < 500 and r.json()["error"], (bad, r.text)
    # the ratio won silently over sentences; either alone answers
    r = httpx.post(f"{server}/summarize", json={"texts": texts, "sentences": 1, "ratio": 1.0})
    assert r.status_code == 422 and re.search(r"sentences .* or ratio .*not both", r.text), r.text
    r = httpx.post(f"{server}/summarize", json={"texts": texts, "ratio": 1.0})
    assert r.status_code == 200 and len(r.json()["results"][0]["sentences"]) == 3, r.text
    r = httpx.post(f"{server}/summarize", json={"texts": "not a list"})
    assert r.status_code == 422


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
    r = httpx.post(f"{server}/v1/embeddings", json={"input": texts, "dimensions": 129})
    assert r.status_code == 400 and "dimensions=129" in r.json()["error"]["message"]
    for d in (1, 64, 128):  # Matryoshka: the first d, as Pipeline.embed cuts them
        r = httpx.post(f"{server}/v1/embeddings", json={"input": texts, "dimensions": d})
        cut = Pipeline(classifier, precision="fp32").embed(texts, dimensions=d)
        assert np.abs(np.array([x["embedding"] for x in r.json()["data"]]) - cut).max() < 1e-5
    r = httpx.post(f"{server}/v1/embeddings", json={"input": [[1, 10**9]]})
    assert r.status_code == 422 and "piece ids" in r.json()["error"]["message"]


def test_the_openai_client_gets_base64_equal_to_embed(server: str, classifier: Path) -> None:
    """The openai client asks for base64 unless told otherwise and decodes it itself: its
    vectors are /embed's floats (within 1e-6), and base64 is what went over the wire."""
    openai = pytest.importorskip("openai")
    texts = ["a fine film", "a dull, long and tiresome one", "ok"]
    want = np.array(httpx.post(f"{server}/embed", json={"texts": texts}).json()["embeddings"])
    sent, answered = [], []

    def response(r: Any) -> None:
        r.read()
        answered.append(r.json())

    hooks = {"request": [lambda r: sent.append(json.loads(r.content))], "response": [response]}
    http = openai.DefaultHttpxClient(event_hooks=hooks)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", http_client=http)
    got = client.embeddings.create(input=texts, model="mine")
    assert sent[0]["encoding_format"] == "base64"
    assert all(isinstance(d["embedding"], str) for d in answered[0]["data"])
    assert np.abs(np.array([d.embedding for d in got.data]) - want).max() < 1e-6
    tok = Tokenizer.from_pretrained(classifier)
    assert got.usage.prompt_tokens == sum(len(e.ids) for e in tok.encode_batch(texts))


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
    from bertforge.serve import Limits
    from bertforge.serve.batcher import Batcher
    from bertforge.serve.metrics import Metrics

    calls: list[list[str]] = []

    def run(items: list[str], options: dict) -> list[int]:
        calls.append(items)
        return [len(x) for x in items]

    limits = Limits(max_batch=64, max_batch_tokens=100, max_wait_ms=200)
    b = Batcher(run, limits, lambda items, o: [len(x) for x in items], Metrics())

    async def go() -> list[list[int]]:
        texts = ["ab", "cd", "x" * 90, "ef", "y" * 120]
        return await asyncio.gather(*(b.submit([t], {}) for t in texts))

    assert asyncio.run(go()) == [[2], [2], [90], [2], [120]]
    assert ["y" * 120] in calls  # longer than the cap: alone
    assert all(sum(map(len, c)) <= 100 for c in calls if len(c) > 1)


def test_the_limits_import_without_the_serve_extra() -> None:
    """The command line builds serve's options from Limits and Access: they import with FastAPI,
    pydantic, Starlette and uvicorn absent (None in sys.modules: their import fails), as does
    the core (the batcher, the Server: no web framework), and `serve` then says what to
    install, as the CLI's error (exit status 2)."""
    code = """if True:
        import sys
        sys.modules.update(fastapi=None, pydantic=None, starlette=None, uvicorn=None)
        from bertforge.serve import API_KEY_ENV, Access, Limits
        assert Limits(max_texts=3).max_texts == 3 and Access().api_key is None, API_KEY_ENV
        from bertforge.serve.batcher import Batcher
        from bertforge.serve.server import Server
        from bertforge.errors import ConfigError
        try:
            from bertforge.serve import create_app
        except ConfigError as e:
            print("create_app:", e)
        from bertforge.cli import main
        print("status:", main(["serve", "no-such-model"]))
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    extra = "bertforge serve needs the serve extra: pip install 'bertforge[serve]'"
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"create_app: {extra}", "status: 2"]
    assert run.stderr == f"bertforge: error: {extra}\n"


# -- hardening: a bad request, a gone client, a big body, a bug, a broken checkpoint -----------


def local_port(r: Any) -> Any:
    """The client's end of the connection a response came on (while that connection is open)."""
    return r.extensions["network_stream"].get_extra_info("client_addr")


def test_a_bad_request_among_valid_ones_fails_alone(server: str, classifier: Path) -> None:
    texts = [f"valid sentence number {i}" for i in range(20)]

    async def go() -> list[Any]:
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            bad = client.post("/v1/embeddings", json={"input": [[-1]]})
            valid = (client.post("/embed", json={"texts": [t]}) for t in texts)
            return await asyncio.gather(bad, *valid)

    bad, *rs = asyncio.run(go())
    assert bad.status_code == 422 and "input 0: piece ids" in bad.json()["error"]["message"]
    assert [r.status_code for r in rs] == [200] * 20
    want = Pipeline(classifier, precision="fp32").embed(texts)
    assert np.abs(np.array([r.json()["embeddings"][0] for r in rs]) - want).max() < 1e-4


def test_a_connection_serves_on_after_an_error(server: str) -> None:
    """Each error answered on a keep-alive connection, which then serves a valid request;
    nothing in the server's log."""
    with httpx.Client(base_url=server, timeout=60) as client:
        answers = []
        for method, path, body in [
            ("POST", "/v1/embeddings", {"input": [[-1]]}),
            ("POST", "/embed", {"texts": []}),
            ("POST", "/embed", b'{"texts": '),
            ("GET", "/nope", None),
            ("GET", "/embed", None),
            ("POST", "/embed", {"texts": ["fine"]}),
        ]:
            content = body if isinstance(body, bytes) else None
            json_body = None if content is not None else body
            headers = {"content-type": "application/json"} if content else None
            r = client.request(method, path, json=json_body, content=content, headers=headers)
            answers.append((r.status_code, local_port(r)))
    assert [s for s, _ in answers] == [422, 422, 400, 404, 405, 200]
    assert len({port for _, port in answers}) == 1  # one connection throughout
    log = LOGS[server].read_text()
    assert "Traceback" not in log and "error" not in log.lower(), log
    text = httpx.get(f"{server}/metrics").text
    assert 'endpoint="/v1/embeddings",status="422"' in text and 'status="500"' not in text


def test_every_error_body_is_an_error(server: str) -> None:
    """Starlette's own answers too; under /v1/ OpenAI's error object."""
    for r, status in [
        (httpx.get(f"{server}/nope"), 404),
        (httpx.get(f"{server}/docs"), 404),  # not offered: its page needs a CDN
        (httpx.get(f"{server}/embed"), 405),
        (httpx.put(f"{server}/classify", json={}), 405),
    ]:
        assert r.status_code == status and list(r.json()) == ["error"], r.text
        assert isinstance(r.json()["error"], str) and r.json()["error"]
    r = httpx.post(f"{server}/v1/embeddings", json={"inpt": "x"})
    error = r.json()["error"]
    assert r.status_code == 422 and error["type"] == "invalid_request_error"
    assert error["param"] == "input" and "input" in error["message"] and "code" in error


def test_the_openai_client_sees_the_message(server: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(input=["a fine film"], model="mine", dimensions=999)
    e = caught.value
    assert "dimensions=999: must be 1..128, the width of this model's embeddings" in e.message
    assert e.type == "invalid_request_error" and e.param == "dimensions"


def test_no_answer_shows_the_servers_path(server: str, classifier: Path) -> None:
    meta = httpx.get(f"{server}/metadata")
    assert meta.json()["model"] == classifier.name
    api = httpx.get(f"{server}/openapi.json")
    refused = httpx.post(f"{server}/qa", json={"questions": ["q"], "contexts": ["c"]})
    assert refused.status_code == 404
    for r in (meta, api, refused):
        assert str(classifier) not in r.text and str(classifier.parent) not in r.text


def exchange(url: str, request: bytes) -> tuple[int, dict[str, str], Any]:
    """Send raw bytes and read the answer until the server closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_a_body_over_the_limit_is_refused_as_it_arrives(server: str) -> None:
    """--max-body-bytes 100000: a Content-Length over it is refused unread, and a body without
    one once 100,000 bytes have come, unfinished, so before anything parses it."""
    start = b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, headers, body = exchange(server, start + b"Content-Length: 1000000000\r\n\r\n")
    assert status == 413 and headers["connection"] == "close"
    assert body == {"error": "the body is larger than the limit of 100,000 bytes"}
    chunks = [b'{"texts": ["', *[b"x" * 30_000] * 4]  # JSON that never ends
    streamed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    status, headers, body = exchange(
        server, start + b"Transfer-Encoding: chunked\r\n\r\n" + streamed
    )
    assert status == 413 and "100,000 bytes" in body["error"]
    openai_path = start.replace(b"/embed", b"/v1/embeddings")
    status, _, body = exchange(server, openai_path + b"Content-Length: 100001\r\n\r\n")
    assert status == 413 and body["error"]["type"] == "invalid_request_error"
    assert httpx.post(f"{server}/embed", json={"texts": ["still serving"]}).status_code == 200


def test_a_truncated_checkpoint_stops_serve_at_start_up(classifier: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(classifier, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    port = str(free_port())
    done = subprocess.run(
        [sys.executable, "-m", "bertforge", "serve", str(broken), "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertforge: error: "), done.stderr
    assert "model.safetensors" in lines[0] and "truncated" in lines[0]


class Recorder:
    """Pipeline.embed wrapped: records the texts of each call; "hold" waits for `gate`,
    "poison" is refused (an InputError naming the model's path), "crash" is a bug."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe, self.embed = pipe, pipe.embed
        self.calls: list[list[str]] = []
        self.gate = threading.Event()

    def __call__(self, texts: list[str], **options: Any) -> np.ndarray:
        self.calls.append(list(texts))
        if "hold" in texts:
            self.gate.wait(30)
        if "poison" in texts:
            raise InputError(f"{self.pipe.path}: cannot read 'poison'")
        if "crash" in texts:
            raise RuntimeError("a bug")
        return self.embed(texts, **options)


@pytest.fixture
def local(classifier: Path) -> Iterator[tuple[str, Any, Recorder]]:
    """The app in this process (in_thread), its Server, and its pipeline's embed wrapped in a
    Recorder."""
    from bertforge.serve import Limits, create_app

    app = create_app(classifier, Limits(max_wait_ms=20), precision="fp32")
    served = app.state.server
    served.pipe.embed = recorder = Recorder(served.pipe)
    with in_thread(app, recorder.gate) as url:
        yield url, served, recorder


@contextlib.contextmanager
def in_thread(app: Any, gate: threading.Event) -> Iterator[str]:
    """The app served by uvicorn in a thread (logging to the root logger) until the block
    ends, when `gate` is opened first; its url."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, log_level="info")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(300):
        if server.started:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        gate.set()
        server.should_exit = True
        thread.join(30)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_a_batch_that_fails_is_run_one_request_at_a_time(
    local: tuple[str, Any, Recorder], classifier: Path
) -> None:
    """20 valid requests and one the pipeline refuses, in one batch: the batch fails, each runs
    alone, the 20 get their vectors and the bad one its own 422 (with no server path)."""
    url, served, recorder = local
    texts = [f"valid sentence number {i}" for i in range(20)]
    bodies = [{"texts": [t]} for t in texts[:10]] + [{"texts": ["poison"]}]
    bodies += [{"texts": [t]} for t in texts[10:]]

    async def go() -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            held = asyncio.create_task(client.post("/embed", json={"texts": ["hold"]}))
            await until(lambda: bool(recorder.calls))  # the worker is busy: the rest queue
            posts = [asyncio.create_task(client.post("/embed", json=b)) for b in bodies]
            await until(lambda: served.batchers["embed"].waiting == 21)
            recorder.gate.set()
            return [await held, *await asyncio.gather(*posts)]

    held, *rs = asyncio.run(go())
    assert held.status_code == 200 and 21 in [len(c) for c in recorder.calls]
    bad = rs.pop(10)
    assert bad.status_code == 422
    assert bad.json() == {"error": f"{classifier.name}: cannot read 'poison'"}
    assert [r.status_code for r in rs] == [200] * 20
    want = Pipeline(classifier, precision="fp32").embed(texts)
    assert np.abs(np.array([r.json()["embeddings"][0] for r in rs]) - want).max() < 1e-4
    want_counts = {("/embed", 200): 21, ("/embed", 422): 1}  # counted once answered
    asyncio.run(until(lambda: served.metrics.requests == want_counts))


def test_a_request_whose_client_left_is_not_computed(local: tuple[str, Any, Recorder]) -> None:
    url, served, recorder = local
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"texts": ["gone " * 50] * 8}).encode()
    request = (
        b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def go() -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            held = asyncio.create_task(client.post("/embed", json={"texts": ["hold"]}))
            await until(lambda: bool(recorder.calls))  # the worker is busy: the rest queue
            writers = []
            for _ in range(3):
                _, writer = await asyncio.open_connection(host, int(port))
                writer.write(request)
                writers.append(writer)
            await until(lambda: served.batchers["embed"].waiting == 3)
            for writer in writers:  # the clients leave before their turn
                writer.close()
            await until(lambda: served.metrics.requests.get(("/embed", 499)) == 3)
            recorder.gate.set()
            return [await held, await client.post("/embed", json={"texts": ["after"]})]

    assert [r.status_code for r in asyncio.run(go())] == [200, 200]
    assert recorder.calls == [["hold"], ["after"]]


def test_a_bug_is_a_500_logged_once_and_the_connection_serves_on(
    local: tuple[str, Any, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    url, served, _ = local
    with caplog.at_level(logging.INFO), httpx.Client(base_url=url, timeout=60) as client:
        crash = client.post("/embed", json={"texts": ["crash"]})
        crashed_on = local_port(crash)
        fine = client.post("/embed", json={"texts": ["fine"]})
        assert local_port(fine) == crashed_on  # the same keep-alive connection
    assert crash.status_code == 500 and crash.json() == {"error": "internal error: RuntimeError"}
    assert fine.status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].exc_info is None, [r.getMessage() for r in errors]
    assert "POST /embed: internal error: RuntimeError: a bug" in errors[0].getMessage()
    # a request is counted once its answer has gone out: the client may see it first
    want = {("/embed", 500): 1, ("/embed", 200): 1}
    asyncio.run(until(lambda: served.metrics.requests == want))


# -- what API clients expect: a key, an access log, Cohere's v2 rerank, only what is served ---

KEY = "k3y-that-must-not-leak"
ACCESS_LOG = "bertforge.serve.access"  # the access log's logger
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed(cross_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A cross-encoder served with the API key from the environment (not in its command line)."""
    log_path = tmp_path_factory.mktemp("keyed") / "server.log"
    with running(cross_encoder, log_path, env={"BERTFORGE_API_KEY": KEY}) as url:
        yield url


def test_every_endpoint_but_health_and_ready_needs_the_key(keyed: str) -> None:
    """/health (alive) and /ready (able to answer: no index here, so once it listens) answer
    GET and HEAD without the key, as probes send none; everything else needs it."""
    for method in ("GET", "HEAD"):
        for path in ("/health", "/ready"):
            r = httpx.request(method, f"{keyed}{path}")
            assert r.status_code == 200, (method, path, r.status_code)
            assert r.json() == {"status": "ok"} if method == "GET" else r.content == b""
    calls = [
        ("POST", "/embed", {"texts": ["a"]}),
        ("POST", "/rerank", {"query": "q", "texts": ["a"]}),
        ("POST", "/v1/embeddings", {"input": "a"}),
        ("POST", "/v1/rerank", {"query": "q", "documents": ["a"]}),
        ("POST", "/v2/rerank", {"model": "m", "query": "q", "documents": ["a"]}),
        ("GET", "/metrics", None),
        ("GET", "/metadata", None),
        ("GET", "/openapi.json", None),
        ("GET", "/nope", None),  # unknown paths too: nothing is learnt without the key
    ]
    for method, path, body in calls:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
            r = httpx.request(method, f"{keyed}{path}", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
            error = r.json()
            if path.startswith("/v1/"):  # OpenAI's error object
                error = error["error"]
                assert error["code"] == "invalid_api_key" and error["message"]
            elif path.startswith("/v2/"):  # Cohere's
                assert list(error) == ["id", "message"] and error["message"]
            else:
                assert list(error) == ["error"] and error["error"]
        r = httpx.request(method, f"{keyed}{path}", json=body, headers=AUTH)
        assert r.status_code == (404 if path == "/nope" else 200), (path, r.text)
    r = httpx.get(f"{keyed}/metrics", headers={"authorization": f"bearer {KEY}"})
    assert r.status_code == 200  # the scheme's case does not matter (RFC 7235)
    api = httpx.get(f"{keyed}/openapi.json", headers=AUTH).json()
    assert api["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert "security" not in api["paths"]["/health"]["get"]
    assert "security" not in api["paths"]["/ready"]["get"]
    assert api["paths"]["/v2/rerank"]["post"]["security"] == [{"bearer": []}]
    log = LOGS[keyed].read_text()
    assert KEY not in log and "wrong" not in log and "Authorization" not in log, log


def test_the_openai_client_sees_a_wrong_key(keyed: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{keyed}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.embeddings.create(input=["a"], model="m")
    assert "invalid API key" in caught.value.message and caught.value.code == "invalid_api_key"
    client = openai.OpenAI(base_url=f"{keyed}/v1", api_key=KEY, max_retries=0)
    assert len(client.embeddings.create(input=["a"], model="m").data[0].embedding) == 128


def test_a_huge_header_is_a_431_in_the_apis_shape(keyed: str) -> None:
    """A 1 MB Authorization header (or any header block over max_header_bytes) is answered by
    the app, as JSON in the path's error shape, not by uvicorn's h11 (a plain-text 400 "Invalid
    HTTP request received." past its 16 KiB, or a reset connection); its value is not shown or
    logged. A header within the limit is still read: a long wrong key is a 401."""
    huge = {"Authorization": "Bearer " + "k" * 1_000_000}
    for path, body in (
        ("/embed", {"texts": ["a"]}),
        ("/v1/embeddings", {"input": "a"}),
        ("/v2/rerank", {"model": "m", "query": "q", "documents": ["a"]}),
    ):
        r = httpx.post(f"{keyed}{path}", json=body, headers=huge, timeout=60)
        assert r.status_code == 431 and r.headers["content-type"] == "application/json", r.text
        error = r.json()
        if path.startswith("/v1/"):
            message = error["error"]["message"]
        else:
            message = error["message"] if path.startswith("/v2/") else error["error"]
        assert re.fullmatch(
            r"headers of [\d,]+ bytes, more than the limit of 65,536 \(max_header_bytes\); "
            r"the largest: authorization, 1,000,007 bytes",
            message,
        ), message
        assert "kkkk" not in r.text
    long = {"Authorization": "Bearer " + "k" * 30_000}
    r = httpx.post(f"{keyed}/embed", json={"texts": ["a"]}, headers=long)
    assert r.status_code == 401 and r.json() == {"error": "invalid API key"}
    assert "kkkk" not in LOGS[keyed].read_text()


def test_a_long_key_sent_in_pieces_is_read(classifier: Path, tmp_path: Path) -> None:
    """A key of 30,000 characters (within max_header_bytes) whose header arrives in pieces, as
    over a network: uvicorn's h11 answered a plain-text 400 once 16 KiB of it had come
    unfinished, so every request with such a key failed; now it is read and the key checked."""
    key = "K" * 30_000
    body = json.dumps({"texts": ["a"]}).encode()
    head = (
        f"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sent = head.encode() + body
    env = {"BERTFORGE_API_KEY": key}
    with running(classifier, tmp_path / "server.log", env=env) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            for i in range(0, len(sent), 4096):
                connection.sendall(sent[i : i + 4096])
                time.sleep(0.002)  # each piece its own read on the server's side
            answer = b""
            while b"\r\n\r\n" not in answer and (more := connection.recv(65536)):
                answer += more
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_a_key_longer_than_the_header_limit_is_refused_without_showing_it(classifier: Path) -> None:
    """A key that cannot fit in max_header_bytes would make every request a 431: refused at
    start-up, naming both options, the key unshown."""
    from bertforge.errors import ConfigError
    from bertforge.serve import Access, Limits, create_app

    key = "s" * 2000
    with pytest.raises(ConfigError, match="api_key .* --max-header-bytes") as caught:
        create_app(classifier, Limits(max_header_bytes=2048), access=Access(api_key=key))
    assert key[:100] not in str(caught.value)
    create_app(classifier, Limits(max_header_bytes=4096), access=Access(api_key=key))


def test_a_key_that_cannot_be_sent_is_refused_without_showing_it() -> None:
    from bertforge.errors import ConfigError
    from bertforge.serve import Access

    for bad in ("", "has space", "caf\u00e9"):
        with pytest.raises(ConfigError, match="api_key") as caught:
            Access(api_key=bad)
        assert not bad or bad not in str(caught.value)
    assert "secret" not in repr(Access(api_key="secret"))


def test_cohere_v2_rerank(keyed: str, cross_encoder: Path) -> None:
    """Cohere's v2 answer, the pipeline's scores; max_tokens_per_doc cuts each document to
    its first pieces; /v1/rerank has Cohere's id and meta too; errors in Cohere's shape."""
    query, docs = "where is the cat", ["the cat sat on the mat", "a dog ran", "the mat", "rain"]
    pipe = Pipeline(cross_encoder, precision="fp32")
    want = pipe.rerank(query, docs)
    body = {"model": "rerank-v3.5", "query": query, "documents": docs, "top_n": 3}
    r = httpx.post(f"{keyed}/v2/rerank", json=body, headers=AUTH).json()
    assert set(r) == {"id", "results", "meta"} and str(uuid.UUID(r["id"])) == r["id"]
    assert r["meta"] == {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}
    assert [x["index"] for x in r["results"]] == [x["index"] for x in want[:3]]
    got = [x["relevance_score"] for x in r["results"]]
    assert np.allclose(got, [x["score"] for x in want[:3]], atol=1e-6)
    assert all(set(x) == {"index", "relevance_score"} for x in r["results"])
    cut = {**body, "max_tokens_per_doc": 2, "top_n": None, "return_documents": True}
    r = httpx.post(f"{keyed}/v2/rerank", json=cut, headers=AUTH).json()
    scores = pipe.score([query] * 4, ["the cat", "a dog", "the mat", "rain"])
    assert np.allclose(
        [scores[x["index"]] for x in r["results"]],
        [x["relevance_score"] for x in r["results"]],
        atol=1e-6,
    )
    assert [x["document"]["text"] for x in r["results"]] == [docs[x["index"]] for x in r["results"]]
    second = httpx.post(f"{keyed}/v2/rerank", json=body, headers=AUTH).json()["id"]
    assert second != r["id"]
    v1 = httpx.post(f"{keyed}/v1/rerank", json=body, headers=AUTH).json()
    assert v1["meta"]["api_version"] == {"version": "1"} and uuid.UUID(v1["id"])
    assert v1["model"] == "rerank-v3.5" and v1["usage"]["total_tokens"] > 0
    assert [x["index"] for x in v1["results"]] == [x["index"] for x in want[:3]]
    many = {**body, "documents": ["d"] * 201}
    r = httpx.post(f"{keyed}/v2/rerank", json=many, headers=AUTH)
    assert r.status_code == 413 and list(r.json()) == ["id", "message"]  # --max-texts 64
    for bad in ({**body, "documents": [{"text": "v2 takes strings"}]}, {**body, "top_n": 0}):
        r = httpx.post(f"{keyed}/v2/rerank", json=bad, headers=AUTH)
        assert r.status_code == 422 and list(r.json()) == ["id", "message"]


def test_unknown_fields_are_422_where_the_peer_refuses_them_and_null_is_the_default(
    server: str, keyed: str, classifier: Path
) -> None:
    """OpenAI's and Cohere's APIs refuse a field they do not know (OpenAI: "Unrecognized request
    argument", Cohere: "unknown field"), and bertforge's own APIs too (a misspelt option left at
    its default answers another question): 422 naming the field, in the path's error shape;
    text-embeddings-inference ignores one, and so does its /rerank. An explicit null is the
    field's default (OpenAI's client sends nulls for unset fields in some versions)."""
    nulls = {"input": "a", "encoding_format": None, "dimensions": None, "model": None}
    r = httpx.post(f"{server}/v1/embeddings", json={**nulls, "user": None})
    assert r.status_code == 200, r.text
    # "model": null is the served model's name (its directory's; cls0, cls1... by test order)
    assert len(r.json()["data"][0]["embedding"]) == 128 and r.json()["model"] == classifier.name
    r = httpx.post(f"{server}/embed", json={"texts": ["a"], "pooling": None, "normalize": None})
    assert r.status_code == 200, r.text
    strict = [  # (url, path, a valid body, an unknown field, a field of the path's)
        (server, "/v1/embeddings", {"input": "a"}, "encodingformat", "encoding_format"),
        (server, "/embed", {"texts": ["a"]}, "normalise", "normalize"),
        (server, "/classify", {"texts": ["a"]}, "pair", "pairs"),
        (server, "/summarize", {"texts": ["a"]}, "sentence", "sentences"),
        (keyed, "/v1/rerank", {"query": "q", "documents": ["a"]}, "top_k", "top_n"),
        (keyed, "/v2/rerank", {"model": "m", "query": "q", "documents": ["a"]}, "top_k", "top_n"),
    ]
    for url, path, body, unknown, known in strict:
        r = httpx.post(f"{url}{path}", json={**body, unknown: 1}, headers=AUTH)
        assert r.status_code == 422, (path, r.text)
        error = r.json()
        if path.startswith("/v1/"):
            assert error["error"]["param"] == unknown
            message = error["error"]["message"]
        else:
            message = error["message"] if path.startswith("/v2/") else error["error"]
        assert message.startswith(f"{unknown}: unknown field (the fields of POST {path}: ")
        assert f" {known}," in message or f" {known})" in message, message
    r = httpx.post(f"{keyed}/rerank", json={"query": "q", "texts": ["a"], "top_k": 1}, headers=AUTH)
    assert r.status_code == 200 and [x["index"] for x in r.json()] == [0]


def test_cohere_bills_a_search_unit_per_100_documents() -> None:
    from bertforge.serve.routes import cohere_answer

    for n, units in ((1, 1), (100, 1), (101, 2), (250, 3)):
        answer = cohere_answer([0.5] * n, [{"text": "d"}] * n, None, False, "2")
        assert answer["meta"]["billed_units"] == {"search_units": units}


def test_openapi_lists_only_what_the_model_serves(server: str, keyed: str) -> None:
    """The classifier has no cross-encoder, QA, NER, masked-LM or NSP head: none of their
    paths is a route; their paths answer 404 naming the missing head, in each shape."""
    paths = set(httpx.get(f"{server}/openapi.json").json()["paths"])
    assert paths == {
        *("/embed", "/v1/embeddings", "/classify", "/summarize", "/health", "/ready", "/metadata"),
        "/metrics",
    }
    paths = set(httpx.get(f"{keyed}/openapi.json", headers=AUTH).json()["paths"])
    rerank = {"/rerank", "/v1/rerank", "/v2/rerank"}  # a one-label classifier: classify too
    served = {"/embed", "/v1/embeddings", "/classify", "/summarize", "/health", "/ready"}
    served |= {"/metadata"}
    assert paths == served | {"/metrics"} | rerank
    r = httpx.post(f"{server}/ner", json={"texts": ["a"]})
    assert r.status_code == 404
    assert r.json() == {
        "error": "ner: this model has no token classifier (BertForTokenClassification)"
    }
    r = httpx.post(f"{server}/v2/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 404 and "no cross-encoder" in r.json()["message"]
    r = httpx.post(f"{server}/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 404 and "no cross-encoder" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/search", json={"queries": ["q"]})
    assert r.status_code == 404 and "--index" in r.json()["error"]
    r = httpx.get(f"{server}/no/such/path")
    assert r.status_code == 404 and r.json() == {"error": "Not Found: GET /no/such/path"}


def test_json_sent_without_its_content_type_is_a_415_that_says_so(server: str) -> None:
    """curl -d sends application/x-www-form-urlencoded; a body without a Content-Type is not
    read as JSON either (a browser can send both cross-site without asking)."""
    body = b'{"texts": ["a"]}'
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"content-type": content_type} if content_type else {}
        r = httpx.post(f"{server}/embed", content=body, headers=headers)
        assert r.status_code == 415, r.text
        message = r.json()["error"]
        assert (content_type or "no Content-Type") in message and "application/json" in message
    r = httpx.post(f"{server}/v1/embeddings", content=b'{"input": "a"}')
    assert r.status_code == 415 and "Content-Type" in r.json()["error"]["message"]
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = httpx.post(f"{server}/embed", content=body, headers={"content-type": content_type})
        assert r.status_code == 200


def access(line: str) -> tuple[str, ...]:
    """(method, path, status, what follows the milliseconds) of an access-log line."""
    m = re.fullmatch(r"([A-Z]+) (\S+) (\d{3}) \d+\.\d ms(.*)", line)
    assert m is not None, line
    return m.groups()


def settled_lines(log: Path) -> int:
    """The log's line count once no line has come for 0.3 s: a line is written after its
    answer has gone out, so an earlier test's last line can follow its client's return."""
    count, still = -1, 0
    for _ in range(200):
        now = len(log.read_text().splitlines())
        still = still + 1 if now == count else 0
        if still == 6:
            break
        count = now
        time.sleep(0.05)
    return count


def test_the_access_log(server: str) -> None:
    """One line per request: method, path, status, ms, texts and batch size; no body."""
    before = settled_lines(LOGS[server])
    httpx.post(f"{server}/embed", json={"texts": ["secret words", "more", "x"]})
    httpx.post(f"{server}/classify", json={"texts": ["secret words"], "pairs": ["b"]})
    httpx.post(f"{server}/embed", json={"texts": []})
    httpx.get(f"{server}/a%0Afake")  # a newline in the path: still one line
    httpx.get(f"{server}/health")
    for _ in range(100):  # a line is written once its answer has gone out
        lines = LOGS[server].read_text().splitlines()[before:]
        if len(lines) == 5:
            break
        time.sleep(0.05)
    stamps = [line.split(" ", 1)[0] for line in lines]  # the time: 2026-01-31T12:00:00
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", t) for t in stamps), lines
    assert [access(line.split(" ", 1)[1]) for line in lines] == [
        ("POST", "/embed", "200", " texts=3 batch=3"),
        ("POST", "/classify", "200", " texts=1 batch=1"),
        ("POST", "/embed", "422", ""),  # refused before it joined a batch
        ("GET", "/a\\nfake", "404", ""),
        ("GET", "/health", "200", ""),
    ]
    assert "secret" not in "\n".join(lines)


def test_the_three_rerank_apis_share_one_batcher(
    cross_encoder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """/rerank, /v1/rerank and /v2/rerank requests queued together run in one model call; the
    access log gives each its own texts and that call's size; each gets its own scores."""
    from bertforge.serve import Limits, create_app

    app = create_app(cross_encoder, Limits(max_wait_ms=20), precision="fp32")
    served = app.state.server
    score, calls, gate = served.pipe.score, [], threading.Event()

    def held(queries: list[Any], documents: list[Any], **options: Any) -> list[float]:
        calls.append(len(documents))  # each a text's piece ids
        if len(calls) == 1:  # the "hold" request's call holds the worker
            gate.wait(30)
        return score(queries, documents, **options)

    served.pipe.score = held
    docs = ["the cat sat on the mat", "a dog ran", "the mat", "rain"]
    bodies = [
        ("/rerank", {"query": "where is the cat", "texts": docs[:2]}),
        ("/v1/rerank", {"query": "a dog", "documents": docs[:3]}),
        ("/v2/rerank", {"model": "m", "query": "rain", "documents": docs}),
    ]

    async def go(url: str) -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            first = {"query": "q", "texts": ["hold"]}
            held_one = asyncio.create_task(client.post("/rerank", json=first))
            await until(lambda: bool(calls))  # the worker is busy: the rest queue
            posts = [asyncio.create_task(client.post(p, json=b)) for p, b in bodies]
            await until(lambda: served.batchers["rerank"].waiting == 3)
            gate.set()
            return [await held_one, *await asyncio.gather(*posts)]

    with caplog.at_level(logging.INFO, ACCESS_LOG), in_thread(app, gate) as url:
        rs = asyncio.run(go(url))
        asyncio.run(until(lambda: sum(r.name == ACCESS_LOG for r in caplog.records) == 4))
    assert [r.status_code for r in rs] == [200] * 4 and calls == [1, 9]
    pipe = Pipeline(cross_encoder, precision="fp32")
    for (_, body), r in zip(bodies, rs[1:]):
        texts = body.get("texts") or body["documents"]
        want = pipe.rerank(body["query"], texts)
        got = r.json() if isinstance(r.json(), list) else r.json()["results"]
        assert [x["index"] for x in got] == [x["index"] for x in want]
        scores = [x.get("score", x.get("relevance_score")) for x in got]
        assert np.allclose(scores, [x["score"] for x in want], atol=1e-6)
    logged = [access(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOG]
    assert sorted((path, rest) for _, path, _, rest in logged) == [
        ("/rerank", " texts=1 batch=1"),
        ("/rerank", " texts=2 batch=9"),
        ("/v1/rerank", " texts=3 batch=9"),
        ("/v2/rerank", " texts=4 batch=9"),
    ]


def test_no_access_log(classifier: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fastapi.testclient import TestClient

    from bertforge.cli import build_parser
    from bertforge.options import options_of
    from bertforge.serve import Access, create_app

    args = build_parser().parse_args(["serve", "m", "--no-access-log", "--api-key", "k"])
    assert vars(Access(**options_of(args, Access))) == {"api_key": "k", "access_log": False}
    for options, lines in (({}, 1), ({"access_log": False}, 0)):
        caplog.clear()
        app = create_app(classifier, access=Access(**options))
        with caplog.at_level(logging.INFO, ACCESS_LOG), TestClient(app) as client:
            assert client.post("/embed", json={"texts": ["a"]}).status_code == 200
        assert sum(r.name == ACCESS_LOG for r in caplog.records) == lines


def test_embed_prompts_dimensions_and_quantised_output(minilm_dir: Path, tmp_path: Path) -> None:
    """/embed takes a prompt (the model's by name, or a text), Matryoshka dimensions and an
    output precision: vectors as Pipeline.embed gives them, quantised as
    sentence-transformers' quantize_embeddings does; int8/uint8 take their buckets from the
    calibration embeddings the server started with (never from the request's own vectors);
    the openai client gets shortened vectors that are unit length again."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    pytest.importorskip("sentence_transformers")
    from sentence_transformers.util.quantization import quantize_embeddings as quantize

    model = tmp_path / "model"
    shutil.copytree(minilm_dir, model)
    config = json.loads((model / "config_sentence_transformers.json").read_text())
    config["prompts"] = {"query": "query: ", "passage": "passage: "}
    (model / "config_sentence_transformers.json").write_text(json.dumps(config))
    pipe = Pipeline(model, precision="fp32")
    texts = ["what do cats eat", "the eiffel tower is in paris", "ok"]
    calibration = pipe.embed([f"sentence {i} about things" for i in range(20)])
    np.save(tmp_path / "cal.npy", calibration)
    with TestClient(create_app(model, precision="fp32")) as plain:
        r = plain.post("/embed", json={"texts": texts, "embedding_precision": "int8"})
        assert r.status_code == 422 and "--calibration" in r.json()["error"]
    app = create_app(model, calibration=str(tmp_path / "cal.npy"), precision="fp32")
    with TestClient(app) as client:

        def embed(**body: Any) -> np.ndarray:
            r = client.post("/embed", json={"texts": texts, **body})
            assert r.status_code == 200, r.text
            return np.array(r.json()["embeddings"])

        want = pipe.embed(texts, prompt_name="query", dimensions=64)
        assert np.abs(embed(prompt_name="query", dimensions=64) - want).max() < 1e-5
        assert (
            np.abs(embed(prompt="passage: ") - pipe.embed(texts, prompt="passage: ")).max() < 1e-5
        )
        assert np.abs(embed() - embed(prompt="query: ")).max() > 0.05  # a prompt changes them
        for precision in ("binary", "ubinary"):
            got = embed(embedding_precision=precision)
            assert np.array_equal(got, quantize(pipe.embed(texts), precision))
        cal = pipe.embed([f"sentence {i} about things" for i in range(20)], dimensions=32)
        for precision in ("int8", "uint8"):
            got = embed(embedding_precision=precision, dimensions=32)
            want = quantize(pipe.embed(texts, dimensions=32), precision, calibration_embeddings=cal)
            assert np.array_equal(got, want)
        r = client.post("/embed", json={"texts": texts, "prompt_name": "nope"})
        assert r.status_code == 422 and "query, document, passage" in r.json()["error"]
        r = client.post("/embed", json={"texts": texts, "dimensions": 385})
        assert r.status_code == 400 and "1..384" in r.json()["error"]
        openai = pytest.importorskip("openai")
        api = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="x", http_client=client)
        got = api.embeddings.create(input=texts, model="m", dimensions=48)
        vectors = np.array([d.embedding for d in got.data])
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert np.abs(vectors - pipe.embed(texts, dimensions=48)).max() < 1e-5
    # a prompt goes before every text: it counts against the request's budget, and its size
    from bertforge.serve import Limits

    with TestClient(create_app(model, Limits(max_request_tokens=2000), precision="fp32")) as c:
        body = {"texts": ["a b c"] * 20}
        assert c.post("/embed", json=body).status_code == 200  # 20 x 5 pieces
        r = c.post("/embed", json={**body, "prompt": "word " * 200})  # 20 x 205
        assert r.status_code == 413 and "read as 4,100 pieces" in r.json()["error"]
        r = c.post("/embed", json={"texts": ["a"], "prompt": "x" * 20_000})
        assert r.status_code == 413 and r.json()["error"].startswith("prompt[0]: 20,000 characters")
        assert c.post("/embed", json={"texts": ["a"], "dimensions": True}).status_code == 422
    with pytest.raises(DataError, match="calibration embeddings must be floats"):
        np.save(tmp_path / "bad.npy", np.zeros((3, 5), np.float32))
        create_app(model, calibration=str(tmp_path / "bad.npy"))


# -- bounded work: the token budget, slices of big requests in turn, /search's texts cut -------


@pytest.fixture(scope="module")
def classifier_ce(tmp_path_factory: pytest.TempPathFactory, classifier: Path) -> Path:
    """The tiny classifier's encoder with a fresh one-output head: a cross-encoder (rerank)."""
    d = tmp_path_factory.mktemp("ce")
    torch.manual_seed(0)
    config = BertConfig.from_pretrained(classifier).replace(num_labels=1, id2label=None)
    BertForSequenceClassification(config).save_pretrained(d)
    Tokenizer.from_pretrained(classifier).save_pretrained(d)
    return d


def windows_read(pieces: int, window: int, query: int = 0) -> int:
    """Pieces the model reads for a text of `pieces` (no [CLS]/[SEP]), in rows of `window` at
    the default stride (half a window), beside a query of `query` pieces when given."""
    from bertforge.tasks.windows import windows_of

    room = window - (3 + query if query else 2)  # [CLS] (query [SEP]) ... [SEP]
    spans = windows_of(pieces, room, room // 2)
    return sum(window - room + length for _, length in spans)


def test_a_request_over_the_token_budget_is_413_before_any_model_call(
    classifier: Path, classifier_ce: Path
) -> None:
    """Counted as read: a 700-piece text is two windows of the model's 512 (959 pieces with
    [CLS] and [SEP]); two of them pass max_texts and max_chars but not max_request_tokens."""
    from fastapi.testclient import TestClient

    from bertforge.serve import Limits, create_app

    text = "word " * 700  # one piece per word
    read = windows_read(700, 512)
    assert read == 512 + 447
    limits = Limits(max_request_tokens=1000)
    with TestClient(create_app(classifier, limits, precision="fp32")) as client:
        served = client.app.state.server  # type: ignore[attr-defined]
        served.pipe.embed = recorder = Recorder(served.pipe)
        assert client.post("/embed", json={"texts": [text]}).status_code == 200
        assert len(recorder.calls) == 1
        r = client.post("/embed", json={"texts": [text, text]})
        assert r.status_code == 413 and r.json() == {
            "error": f"texts: read as {2 * read:,} pieces (every window, [CLS] and [SEP] "
            "included), more than the limit of 1,000 per request (max_request_tokens)"
        }
        r = client.post("/v1/embeddings", json={"input": [text, text]})
        error = r.json()["error"]
        assert r.status_code == 413 and error["param"] == "input"
        assert f"{2 * read:,} pieces" in error["message"] and "1,000" in error["message"]
        assert len(recorder.calls) == 1  # neither reached the model
    with TestClient(create_app(classifier_ce, limits, precision="fp32")) as client:
        pipe = client.app.state.server.pipe  # type: ignore[attr-defined]
        calls: list[Any] = []
        score = pipe.score
        pipe.score = lambda *a, **k: calls.append(a) or score(*a, **k)
        body = {"query": "word", "texts": [text]}
        assert client.post("/rerank", json=body).status_code == 200 and len(calls) == 1
        body = {"query": "word", "documents": [text, text, "word"]}
        r = client.post("/v1/rerank", json=body)
        pair = windows_read(700, 512, query=1)  # [CLS] word [SEP] a window [SEP], twice
        assert pair == 512 + 450
        read = 2 * pair + 1 + 3 + 1  # and the short document
        assert r.status_code == 413 and r.json()["error"]["param"] == "documents"
        assert f"read as {read:,} pieces" in r.json()["error"]["message"]
        assert len(calls) == 1


def test_usage_counts_the_pieces_the_model_reads(classifier_ce: Path) -> None:
    """/v1/rerank's and /v1/embeddings' usage: what max_request_tokens counts, each input's rows
    as the model reads them: a (query, document) row has [CLS] and two [SEP], and a long
    document is read in windows, each beside the query again."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    text = "word " * 700  # one piece per word
    with TestClient(create_app(classifier_ce, precision="fp32")) as client:
        r = client.post("/v1/rerank", json={"query": "word", "documents": [text, "word"]})
        pair = windows_read(700, 512, query=1)  # 512 + 450 (the test above)
        assert r.status_code == 200 and r.json()["usage"] == {"total_tokens": pair + 5}
        r = client.post("/v1/embeddings", json={"input": [text, "word"]})
        read = windows_read(700, 512) + 3  # 512 + 447 (the test above); [CLS] word [SEP]
        assert r.status_code == 200
        assert r.json()["usage"] == {"prompt_tokens": read, "total_tokens": read}
        r = client.post("/v1/embeddings", json={"input": [7, 8, 9]})  # piece ids
        assert r.json()["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


def test_embeddings_usage_counts_the_models_default_prompt(
    classifier: Path, tmp_path: Path
) -> None:
    """A model whose default prompt goes before every input (config_sentence_transformers.json):
    /v1/embeddings' vectors are the prompted ones, and its usage counts the prompt's pieces."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    model = tmp_path / "prompted"
    shutil.copytree(classifier, model)
    (model / "1_Pooling").mkdir()
    (model / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (model / "modules.json").write_text(json.dumps(modules))
    prompts = {"prompts": {"query": "query: "}, "default_prompt_name": "query"}
    (model / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    texts = ["a fine film", "ok"]
    pipe = Pipeline(model, precision="fp32")
    want = pipe.embed(texts)
    assert np.abs(want - pipe.embed(texts, prompt="")).max() > 1e-3  # the prompt is read
    pieces = sum(len(e.ids) for e in pipe.tok.encode_batch([f"query: {t}" for t in texts]))
    assert pieces == sum(len(e.ids) for e in pipe.tok.encode_batch(texts)) + 2 * 2  # query :
    with TestClient(create_app(model, precision="fp32")) as client:
        r = client.post("/v1/embeddings", json={"input": texts}).json()
    assert np.abs(np.array([d["embedding"] for d in r["data"]]) - want).max() < 1e-5
    assert r["usage"] == {"prompt_tokens": pieces, "total_tokens": pieces}


def test_nothing_is_tokenised_on_the_event_loop(
    classifier_ce: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every endpoint tokenises in threads (counting a request's pieces, cutting /v2/rerank's
    documents, the model calls), never on the event loop: 64 texts of 10,000 characters
    tokenised there would hold up every other client."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    app = create_app(classifier_ce, precision="fp32")
    tok = app.state.server.pipe.tok
    encode, on_loop = tok._encode_raw, []  # every encoding of the tokenizer goes through it

    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # no event loop runs in a worker thread
            on_loop.append(False)
        return encode(*args, **kwargs)

    monkeypatch.setattr(tok, "_encode_raw", watched)
    docs = ["the cat sat on the mat", "a dog ran"]
    calls = [
        ("/embed", {"texts": docs}),
        ("/v1/embeddings", {"input": docs}),
        ("/v1/embeddings", {"input": [[5, 6, 7]]}),
        ("/rerank", {"query": "cat", "texts": docs}),
        ("/v1/rerank", {"query": "cat", "documents": docs}),
        ("/v2/rerank", {"model": "m", "query": "cat", "documents": docs, "max_tokens_per_doc": 2}),
        ("/classify", {"texts": docs}),
    ]
    with TestClient(app) as client:
        for path, body in calls:
            assert client.post(path, json=body).status_code == 200, path
    assert on_loop and not any(on_loop)


def test_a_rerank_request_tokenises_each_text_once(
    classifier_ce: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerank request's query and each document are tokenised once, in one thread, for its
    cost (max_request_tokens, usage), /v2's max_tokens_per_doc cut and the model call: /v2/rerank
    tokenised each document three times and the query twice per document (60 texts for 20
    documents' 21). Its scores and usage are those of the texts tokenised apart."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    app = create_app(classifier_ce, precision="fp32")
    tok = app.state.server.pipe.tok
    encode, seen = tok._encode_raw, []  # every encoding of the tokenizer goes through it

    def counted(texts: Any, *args: Any, **kwargs: Any) -> Any:
        seen.extend(texts)
        return encode(texts, *args, **kwargs)

    monkeypatch.setattr(tok, "_encode_raw", counted)
    query = "where is the cat"
    docs = [f"the cat {i} sat on the mat number {i}" for i in range(20)]
    pipe = Pipeline(classifier_ce, precision="fp32")
    cut = [" ".join(d.split()[:3]) for d in docs]  # one piece a word
    for path, body, want in (
        ("/rerank", {"query": query, "texts": docs}, pipe.score([query] * 20, docs)),
        ("/v1/rerank", {"query": query, "documents": docs}, pipe.score([query] * 20, docs)),
        (
            "/v2/rerank",
            {"model": "m", "query": query, "documents": docs, "max_tokens_per_doc": 3},
            pipe.score([query] * 20, cut),
        ),
    ):
        seen.clear()
        with TestClient(app) as client:
            r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        assert sorted(seen) == sorted([query, *docs]), (path, len(seen))
        got = r.json() if path == "/rerank" else r.json()["results"]
        scores = {x["index"]: x.get("score", x.get("relevance_score")) for x in got}
        assert np.allclose([scores[i] for i in range(20)], want, atol=1e-6), path
        if path == "/v1/rerank":
            rows = pipe.pair_rows([query] * 20, docs)[0]
            assert r.json()["usage"] == {"total_tokens": int(sum(rows.lengths))}


def stub_batchers(
    limits: Any, names: tuple[str, ...] = ("a",), held: int = 1
) -> tuple[dict[str, Any], list[tuple[str, list[str]]], list[threading.Event]]:
    """Batchers over a stub run: each item's row is its text upper-cased, its cost the number
    in its text after ':'; calls (batcher, items) recorded; call k < held waits for gates[k];
    two calls of one batcher at once fail the test."""
    from bertforge.serve.batcher import Batcher
    from bertforge.serve.metrics import Metrics

    calls: list[tuple[str, list[str]]] = []
    gates = [threading.Event() for _ in range(held)]

    def runner(name: str) -> Callable[[list[str], dict], list[str]]:
        running = threading.Lock()

        def run(items: list[str], options: dict) -> list[str]:
            assert running.acquire(blocking=False), "two model calls of one endpoint at once"
            try:
                calls.append((name, list(items)))
                if len(calls) <= held:
                    gates[len(calls) - 1].wait(30)
                return [x.upper() for x in items]
            finally:
                running.release()

        return run

    def cost(items: list[str], options: dict) -> list[int]:
        return [int(x.split(":")[1]) for x in items]

    batchers = {n: Batcher(runner(n), limits, cost, Metrics()) for n in names}
    return batchers, calls, gates


def test_a_big_request_is_answered_in_slices_and_a_small_one_goes_between() -> None:
    """A request of 10 items of 10 pieces, with max_batch_tokens 20: five calls of two. A
    small one that comes during the first call is in the second, and answered then, long
    before the big one; each gets exactly its own rows, in order."""
    from bertforge.serve import Limits

    limits = Limits(max_batch=64, max_batch_tokens=20, max_wait_ms=0)
    batchers, calls, (gate,) = stub_batchers(limits)
    big = [f"big{i}:10" for i in range(10)]
    done: list[str] = []

    async def go() -> tuple[list[str], list[str]]:
        async def ask(name: str, items: list[str]) -> list[str]:
            rows = await batchers["a"].submit(items, {})
            done.append(name)
            return rows

        first = asyncio.create_task(ask("big", big))
        await until(lambda: len(calls) == 1)
        second = asyncio.create_task(ask("small", ["small:1"]))
        await until(lambda: batchers["a"].waiting == 2)
        gate.set()
        return await first, await second

    got_big, got_small = asyncio.run(go())
    assert got_big == [x.upper() for x in big] and got_small == ["SMALL:1"]
    assert (
        [items for _, items in calls]
        == [
            big[0:2],
            ["small:1", big[2]],  # the new request first; the big one fills the call to 20 pieces
            big[3:5],
            big[5:7],
            big[7:9],
            big[9:10],
        ]
    )
    assert done == ["small", "big"]


def test_another_endpoints_request_does_not_wait_for_a_big_ones_call() -> None:
    """Endpoints' calls run side by side (their workers in threads): small requests on one are
    answered while a call of a big request on another is still running."""
    from bertforge.serve import Limits

    limits = Limits(max_batch=64, max_batch_tokens=20, max_wait_ms=0)
    batchers, calls, (gate,) = stub_batchers(limits, ("rerank", "embed"))
    big = [f"big{i}:10" for i in range(6)]

    async def go() -> list[list[str]]:
        first = asyncio.create_task(batchers["rerank"].submit(big, {}))
        await until(lambda: len(calls) == 1)
        small = await asyncio.gather(*(batchers["embed"].submit([f"s{i}:1"], {}) for i in range(3)))
        assert not gate.is_set() and not first.done()  # the big one's first call still runs
        gate.set()
        return [await first, *small]

    rows = asyncio.run(go())
    assert rows == [[x.upper() for x in big], ["S0:1"], ["S1:1"], ["S2:1"]]
    assert calls[0] == ("rerank", big[0:2]) and calls[1][0] == "embed"


def test_slices_of_many_requests_each_get_their_own_rows_in_order() -> None:
    """Requests of mixed sizes and options, some with items over the call's budget, all at
    once: every request gets exactly its rows in its order; no call mixes options or passes
    max_batch items; a call over max_batch_tokens pieces holds one item."""
    from bertforge.serve import Limits

    limits = Limits(max_batch=5, max_batch_tokens=30, max_wait_ms=1)
    batchers, calls, _ = stub_batchers(limits, held=0)
    rng = np.random.default_rng(0)
    requests = [
        [f"r{r}i{i}:{rng.integers(1, 40)}" for i in range(rng.integers(1, 15))] for r in range(12)
    ]
    options = [{"n": r % 2} for r in range(12)]

    async def go() -> list[list[str]]:
        b = batchers["a"]
        return await asyncio.gather(*(b.submit(x, o) for x, o in zip(requests, options)))

    assert asyncio.run(go()) == [[x.upper() for x in items] for items in requests]
    assert sorted(x for _, items in calls for x in items) == sorted(
        x for items in requests for x in items
    )
    for _, items in calls:
        assert len({int(x[1 : x.index("i")]) % 2 for x in items}) == 1  # one option set
        pieces = sum(int(x.split(":")[1]) for x in items)
        assert len(items) <= 5 and (pieces <= 30 or len(items) == 1)


def test_a_big_request_whose_client_left_is_not_computed_further() -> None:
    from bertforge.serve import Limits

    limits = Limits(max_batch=64, max_batch_tokens=20, max_wait_ms=0)
    batchers, calls, (gate,) = stub_batchers(limits)
    big = [f"big{i}:10" for i in range(10)]

    async def go() -> list[str]:
        first = asyncio.create_task(batchers["a"].submit(big, {}))
        await until(lambda: len(calls) == 1)
        first.cancel()  # the handler of a client gone (or cancelled) ends: its slices stop
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        return await batchers["a"].submit(["after:1"], {})

    assert asyncio.run(go()) == ["AFTER:1"]
    assert [items for _, items in calls] == [big[0:2], ["after:1"]]


def test_an_input_refused_in_a_slice_is_named_by_its_place_in_the_request(
    tiny_model: Path,
) -> None:
    """A request cut into model calls by max_batch_tokens (two texts each): the text the
    pipeline refuses is named by its index in the request (20), not in its call (0)."""
    from fastapi.testclient import TestClient

    from bertforge.serve import Limits, create_app

    texts = ["the [MASK] sat down ."] * 24  # 7 pieces each with [CLS] and [SEP]
    texts[20] = "this has no mask ."
    app = create_app(tiny_model, Limits(max_batch_tokens=14, max_wait_ms=0), precision="fp32")
    pipe, calls = app.state.server.pipe, []
    fill_mask = pipe.fill_mask
    pipe.fill_mask = lambda texts, **options: calls.append(texts) or fill_mask(texts, **options)
    with TestClient(app) as client:
        r = client.post("/fill-mask", json={"texts": texts})
        assert r.status_code == 422
        assert r.json() == {"error": f"text 20: no [MASK] token in {texts[20]!r}"}
        # the call that refused it read at most two texts: the pipeline numbered it 0 or 1
        assert len(calls) > 10 and all(len(c) <= 2 for c in calls) and texts[20] in calls[-1]
        r = client.post("/fill-mask", json={"texts": texts[:20]})
        assert r.status_code == 200 and len(r.json()["results"]) == 20


def test_search_answers_are_bounded(classifier: Path, tmp_path: Path) -> None:
    """A document's text and passage are cut at return_chars, saying so (a passage once came
    whole: a one-window document's whole text); hits with a text or passage are at most
    max_text_hits (queries x top_k), else 413 naming top_k before any search."""
    from fastapi.testclient import TestClient

    from bertforge.search import Index
    from bertforge.serve import Limits, create_app

    docs = ["a short document", "a long document " * 20]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    )
    options = {"progress": False, "precision": "fp32", "bm25": False}
    index = Index.build(classifier, corpus, tmp_path / "idx", **options)
    limits = Limits(return_chars=40, max_text_hits=10)  # one query of the default top_k
    app = create_app(classifier, limits, index=index.path, precision="fp32")
    with TestClient(app) as client:
        r = client.post("/search", json={"queries": ["document"], "return_text": True})
        hits = {h["id"]: h for h in r.json()["results"][0]}
        assert hits["d0"]["text"] == docs[0] and hits["d0"]["text_truncated"] is False
        assert hits["d1"]["text"] == docs[1][:40] and hits["d1"]["text_truncated"] is True
        r = client.post("/search", json={"queries": ["document"], "return_passage": True})
        hits = {h["id"]: h for h in r.json()["results"][0]}  # one window each: the whole text
        assert hits["d0"]["passage"] == docs[0] and hits["d0"]["passage_truncated"] is False
        assert hits["d1"]["passage"] == docs[1][:40] and hits["d1"]["passage_truncated"] is True
        r = client.post("/search", json={"queries": ["document"]})
        assert all("text" not in h and "text_truncated" not in h for h in r.json()["results"][0])
        assert all("passage_truncated" not in h for h in r.json()["results"][0])
        served = client.app.state.server  # type: ignore[attr-defined]
        searched = served.batchers["search"].calls
        queries = {"queries": ["document", "a"] * 2, "top_k": 3}  # 12 hits
        for asked in ("return_text", "return_passage"):
            r = client.post("/search", json={**queries, asked: True})
            assert r.status_code == 413 and r.json() == {
                "error": f"queries x top_k: 4 x 3 = 12 hits with {asked}, more than the limit "
                "of 10 per request (max_text_hits): ask for fewer queries or a smaller top_k"
            }
        assert served.batchers["search"].calls == searched  # refused before any search
        r = client.post("/search", json={**queries, "top_k": 2, "return_passage": True})
        assert r.status_code == 200 and [len(x) for x in r.json()["results"]] == [2] * 4
        r = client.post("/search", json=queries)  # no texts: not limited (two documents)
        assert r.status_code == 200 and [len(x) for x in r.json()["results"]] == [2] * 4
        r = client.post("/search", json={**queries, "topk": 1})  # strict: not the default 10
        assert r.status_code == 422 and r.json()["error"].startswith("topk: unknown field")


def test_a_big_request_is_not_starved_by_a_stream_of_small_ones() -> None:
    """Small requests of other options keep coming, one during each call: they go before the
    big one while their tags (the work clock when they came plus their own pieces) are below
    its tag (0 + its 60 pieces), and not after: the big one waits behind later requests for
    at most its own pieces of their work (a tie goes to the one that came first)."""
    from bertforge.serve import Limits

    limits = Limits(max_batch=64, max_batch_tokens=20, max_wait_ms=0)
    batchers, calls, gates = stub_batchers(limits, held=6)
    b = batchers["a"]

    async def go() -> None:
        big = asyncio.create_task(b.submit([f"big{i}:10" for i in range(6)], {"o": "big"}))
        small = []
        for k in range(6):
            await until(lambda k=k: len(calls) == k + 1)
            small.append(asyncio.create_task(b.submit([f"s{k}:10"], {"o": "small"})))
            await until(lambda k=k: any(j.items == [f"s{k}:10"] for j in b.jobs))
            gates[k].set()
        await asyncio.gather(big, *small)

    asyncio.run(go())
    assert [items for _, items in calls] == [
        ["big0:10", "big1:10"],  # work 20
        ["s0:10"],  # tag 20 + 10 = 30, below the big one's 60
        ["s1:10"],  # tag 40
        ["s2:10"],  # tag 50
        ["big2:10", "big3:10"],  # s3's tag is 60: a tie, the big one came first
        ["big4:10", "big5:10"],  # s4 (tag 80) came during the last call
        ["s3:10", "s4:10"],  # same options: one call
        ["s5:10"],
    ]


def test_requests_of_one_size_are_answered_in_the_order_they_came() -> None:
    """Equal requests, each over a call's budget, queued together: the first is answered
    first (its slices first, the next one filling the calls), not all of them at the end."""
    from bertforge.serve import Limits

    limits = Limits(max_batch=64, max_batch_tokens=30, max_wait_ms=0)
    batchers, calls, (gate,) = stub_batchers(limits)
    b = batchers["a"]
    done: list[int] = []

    async def go() -> None:
        async def ask(k: int) -> None:
            await b.submit([f"r{k}i{i}:10" for i in range(4)], {})
            done.append(k)

        hold = asyncio.create_task(b.submit(["hold:1"], {}))
        await until(lambda: len(calls) == 1)
        asks = [asyncio.create_task(ask(k)) for k in range(3)]
        await until(lambda: b.waiting == 3)
        gate.set()
        await asyncio.gather(hold, *asks)

    asyncio.run(go())
    assert [items for _, items in calls][1:] == [
        ["r0i0:10", "r0i1:10", "r0i2:10"],
        ["r0i3:10", "r1i0:10", "r1i1:10"],
        ["r1i2:10", "r1i3:10", "r2i0:10"],
        ["r2i1:10", "r2i2:10", "r2i3:10"],
    ]
    assert done == [0, 1, 2]


@pytest.fixture(scope="module")
def qa_and_mlm(tmp_path_factory: pytest.TempPathFactory, classifier: Path) -> tuple[Path, Path]:
    """The tiny classifier's encoder with a span-QA head, and with a masked-LM head."""
    from bertforge.heads import BertForMaskedLM, BertForQuestionAnswering

    out = []
    for head in (BertForQuestionAnswering, BertForMaskedLM):
        d = tmp_path_factory.mktemp(head.__name__)
        torch.manual_seed(0)
        head(BertConfig.from_pretrained(classifier)).save_pretrained(d)
        Tokenizer.from_pretrained(classifier).save_pretrained(d)
        out.append(d)
    return out[0], out[1]


def test_qa_reads_windows_of_the_servers_max_length_and_stride(
    qa_and_mlm: tuple[Path, Path],
) -> None:
    """The server's pipeline options max_length and stride (create_app's, serve's) are /qa's
    default max_seq_length and doc_stride (they were ignored without a word: SQuAD's 384 and
    128), at most the model's positions; a request's own still win; truncate is refused for a
    model with a QA head (qa reads every window: the answer may be in any), not ignored."""
    from fastapi.testclient import TestClient

    from bertforge.errors import ConfigError
    from bertforge.serve import create_app

    qa, _ = qa_and_mlm
    context = "the river runs through the old town and its bridges are old . " * 8
    body = {"questions": ["what runs through the town?"], "contexts": [context]}
    with TestClient(create_app(qa, precision="fp32", max_length=32, stride=8)) as client:
        pipe = client.app.state.server.pipe  # type: ignore[attr-defined]
        asked, answer = [], pipe.qa
        pipe.qa = lambda *a, **k: asked.append(k) or answer(*a, **k)
        r = client.post("/qa", json=body)
        assert r.status_code == 200, r.text
        assert (asked[-1]["max_seq_length"], asked[-1]["doc_stride"]) == (32, 8)
        want = Pipeline(qa, precision="fp32").qa(
            body["questions"], body["contexts"], max_seq_length=32, doc_stride=8
        )
        assert r.json()["results"][0]["answer"] == want[0]["answer"]
        assert r.json()["results"][0]["score"] == pytest.approx(want[0]["score"], abs=1e-5)
        r = client.post("/qa", json={**body, "max_seq_length": 64, "doc_stride": 16})
        assert r.status_code == 200
        assert (asked[-1]["max_seq_length"], asked[-1]["doc_stride"]) == (64, 16)
        schema = client.get("/openapi.json").json()["components"]["schemas"]["QaRequest"]
        assert schema["properties"]["doc_stride"]["default"] == 8
    with TestClient(create_app(qa, precision="fp32", max_length=100_000)) as client:
        pipe = client.app.state.server.pipe  # type: ignore[attr-defined]
        asked, answer = [], pipe.qa
        pipe.qa = lambda *a, **k: asked.append(k) or answer(*a, **k)
        assert client.post("/qa", json=body).status_code == 200
        assert asked[-1]["max_seq_length"] == pipe.config.max_position_embeddings
    with pytest.raises(ConfigError, match=r"^truncate: qa reads every window of a long context"):
        create_app(qa, precision="fp32", truncate=True)


def test_qa_fill_mask_and_summarize_are_bounded_before_any_model_call(
    qa_and_mlm: tuple[Path, Path], classifier: Path
) -> None:
    """A stride of 0 never ends (422), masks x top_k answers count against the request's
    limit (413), and /summarize counts a row per sentence."""
    from fastapi.testclient import TestClient

    from bertforge.catalogue import ENTRIES
    from bertforge.data.tasks import SquadExample
    from bertforge.serve import Limits, create_app
    from bertforge.tasks.squad import featurize, pieces_read

    qa, mlm = qa_and_mlm
    context = "word " * 100
    body = {"questions": ["q"], "contexts": [context], "max_seq_length": 16}
    with TestClient(create_app(qa, precision="fp32")) as client:
        for stride in (0, -3):
            r = client.post("/qa", json={**body, "doc_stride": stride})
            assert r.status_code == 422 and "doc_stride" in r.json()["error"], r.text
        assert client.post("/qa", json={**body, "doc_stride": 4}).status_code == 200
    tok = Tokenizer.from_pretrained(qa)
    examples = [
        SquadExample("0", "q", context, [], False, ""),
        SquadExample("1", "a b", "c", [], False, ""),
    ]
    for stride in (1, 4, 128):
        window = {"max_seq_length": 16, "doc_stride": stride}
        features = featurize(examples, tok, **window)
        made = np.bincount([w.example for w in features.meta], weights=features.lengths)
        assert pieces_read(examples, tok, **window) == made.astype(int).tolist()
    limits = Limits(max_request_tokens=1000)
    with TestClient(create_app(mlm, limits, precision="fp32")) as client:
        texts = ["a [MASK] b [MASK] c"] * 10  # 20 masks
        assert client.post("/fill-mask", json={"texts": texts, "top_k": 50}).status_code == 200
        r = client.post("/fill-mask", json={"texts": texts, "top_k": 51})
        assert r.status_code == 413 and "20 [MASK] x top_k 51 = 1,020 answers" in r.text
    with TestClient(create_app(classifier, precision="fp32")) as client:
        served = client.app.state.server  # type: ignore[attr-defined]
        cost = served.reading(ENTRIES["summarize"], 1)
        text = "One short sentence. Another one here.\nA third in a new paragraph."
        sentences = ["One short sentence.", "Another one here.", "A third in a new paragraph."]
        assert cost([(text,)], {}) == [sum(len(e.ids) for e in tok.encode_batch(sentences))]


# -- /search reranked by a cross-encoder (serve --rerank-model) -------------------------------

SEARCH_DOCS = [
    "The Eiffel Tower stands in Paris, the capital of France.",
    "Cats are carnivores and eat meat such as fish and mice.",
    "Hamlet is a tragedy written by William Shakespeare.",
    "The stock market fell sharply on Monday.",
    "Tea is brewed from the leaves of the camellia plant.",
    "The Great Wall of China stretches for thousands of kilometres.",
    "Paris hosts the Louvre, the largest art museum in the world.",
    "Shakespeare also wrote Macbeth and King Lear.",
]
SEARCH_QUERIES = ["who wrote hamlet", "where is the eiffel tower", "what do cats eat"]


@pytest.fixture(scope="module")
def search_index(classifier: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An index of SEARCH_DOCS by the tiny classifier's encoder, with BM25 (fp32, as served)."""
    from bertforge.search import Index

    tmp = tmp_path_factory.mktemp("search")
    corpus = tmp / "corpus.jsonl"
    lines = [json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(SEARCH_DOCS)]
    corpus.write_text("\n".join(lines) + "\n")
    return Index.build(classifier, corpus, tmp / "idx", progress=False, precision="fp32").path


def same_hits(got: list[list[dict]], want: list[list[dict]]) -> None:
    """Two searches' answers: the same hits in the same order, the same scores (to float32's
    rounding: the model calls batch the pairs differently)."""
    assert [[h["id"] for h in row] for row in got] == [[h["id"] for h in row] for row in want]
    for g_row, w_row in zip(got, want):
        for g, w in zip(g_row, w_row):
            assert g.keys() - {"text_truncated"} == w.keys(), (g, w)
            for key in ("score", "rerank_score"):
                if key in w:
                    assert g[key] == pytest.approx(w[key], abs=1e-5), (key, g, w)
            assert (g["rank"], g["first_stage_rank"]) == (w["rank"], w["first_stage_rank"])
            assert g.get("text") == w.get("text")


def test_search_with_rerank_is_the_clis_reranked_search(
    classifier: Path,
    cross_encoder: Path,
    search_index: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """serve --rerank-model CE: /search's "rerank" (true, or {depth, fusion}) answers what
    `bertforge search --rerank CE [--rerank-depth D] [--rerank-fuse F]` writes on the same
    index, queries and first stage: the same hits, scores, cross-encoder scores and ranks."""
    from bertforge.cli import main

    # the CLI's cross-encoder runs at precision auto: fp32 here, as the server's, on any CPU
    monkeypatch.setattr("bertforge.runner.cpu_supports_bf16", lambda: False)
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(SEARCH_QUERIES) + "\n")
    cases = [  # (the body's first stage and rerank, the CLI's flags)
        ({"rerank": True, "top_k": 3}, ["--top-k", "3"]),
        (
            {
                "mode": "hybrid",
                "fusion": "zscore",
                "top_k": 3,
                "rerank": {"depth": 5, "fusion": "rrf"},
            },
            [
                "--mode",
                "hybrid",
                "--fusion",
                "zscore",
                "--top-k",
                "3",
                "--rerank-depth",
                "5",
                "--rerank-fuse",
                "rrf",
            ],
        ),
        (
            {"mode": "bm25", "top_k": 2, "rerank": {"depth": 6, "fusion": "zscore"}},
            ["--mode", "bm25", "--top-k", "2", "--rerank-depth", "6", "--rerank-fuse", "zscore"],
        ),
        (
            {"rerank": {"depth": 4}, "top_k": 4, "return_text": True},
            ["--top-k", "4", "--rerank-depth", "4", "--text"],
        ),
    ]
    log = tmp_path / "server.log"
    index = str(search_index)
    with running(classifier, log, "--index", index, "--rerank-model", str(cross_encoder)) as url:
        for i, (body, flags) in enumerate(cases):
            out = tmp_path / f"cli{i}.jsonl"
            argv = ["search", index, str(queries), "--rerank", str(cross_encoder), *flags]
            assert main([*argv, "--out", str(out)]) == 0
            want = [json.loads(line)["results"] for line in out.read_text().splitlines()]
            r = httpx.post(f"{url}/search", json={"queries": SEARCH_QUERIES, **body}, timeout=60)
            assert r.status_code == 200, r.text
            same_hits(r.json()["results"], want)
        r = httpx.post(f"{url}/search", json={"queries": SEARCH_QUERIES, "rerank": False})
        plain = httpx.post(f"{url}/search", json={"queries": SEARCH_QUERIES})
        assert r.status_code == 200 and r.json() == plain.json()
        assert "first_stage_rank" not in r.json()["results"][0][0]
        assert httpx.get(f"{url}/metadata").json()["rerank_model"] == cross_encoder.name


def test_search_rerank_is_refused_without_a_reranker_and_checked(
    classifier: Path, cross_encoder: Path, search_index: Path
) -> None:
    """A rerank asked of a server without --rerank-model is a 422 naming the field and the
    option (it was answered 200, not reranked); a rerank object's unknown field, a depth below
    top_k and an unknown fusion are 422s naming rerank.FIELD; a server given --rerank-model
    that is no cross-encoder, or without --index, does not start."""
    from fastapi.testclient import TestClient

    from bertforge.errors import ConfigError
    from bertforge.serve import create_app

    app = create_app(classifier, index=search_index, precision="fp32")
    with TestClient(app) as client:
        for rerank in (True, {"depth": 5}):
            r = client.post("/search", json={"queries": ["q"], "rerank": rerank})
            assert r.status_code == 422 and r.json() == {
                "error": "rerank: this server has no cross-encoder to rerank with: start it "
                "with --rerank-model CROSS_ENCODER"
            }
    app = create_app(classifier, index=search_index, rerank_model=cross_encoder, precision="fp32")
    with TestClient(app) as client:
        bad = [
            ({"depht": 5}, "rerank.depht: unknown field (the fields of rerank: depth, fusion)"),
            ({"depth": 2}, "rerank.depth 2 is below top_k 10"),
            ({"fusion": "borda"}, "rerank.fusion: String should match pattern '^(rrf|zscore)$'"),
            ({"depth": True}, "rerank.depth: Input should be a valid integer"),
        ]
        for rerank, message in bad:
            r = client.post("/search", json={"queries": ["q"], "rerank": rerank})
            assert r.status_code == 422 and r.json() == {"error": message}, r.text
        r = client.post("/search", json={"queries": ["q"], "rerank": 1})
        assert r.status_code == 422 and r.json()["error"].startswith("rerank: ")
        r = client.post("/search", json={"queries": ["q"], "rerank": None, "top_k": 2})
        assert r.status_code == 200 and "first_stage_rank" not in r.json()["results"][0][0]
    with pytest.raises(ConfigError, match=r"rerank_model \(--rerank-model\): cls\d*: no cross"):
        create_app(classifier, index=search_index, rerank_model=classifier, precision="fp32")
    with pytest.raises(ConfigError, match=r"rerank_model \(--rerank-model\): needs an index"):
        create_app(classifier, rerank_model=cross_encoder, precision="fp32")


def test_a_reranked_search_counts_its_pairs_against_the_limits(
    classifier: Path, cross_encoder: Path, search_index: Path
) -> None:
    """queries x rerank depth is at most max_text_hits (the first stage reads each hit's text
    for the cross-encoder; else 413 naming rerank.depth before any search), and the pieces the
    cross-encoder reads, with the first stage's, at most max_request_tokens (else 413 naming
    rerank before any cross-encoder call)."""
    from fastapi.testclient import TestClient

    from bertforge.serve import Limits, create_app

    limits = Limits(max_text_hits=10, max_request_tokens=60)
    app = create_app(
        classifier, limits, index=search_index, rerank_model=cross_encoder, precision="fp32"
    )
    served = app.state.server
    with TestClient(app) as client:
        body = {"queries": ["who wrote hamlet"] * 3, "top_k": 2, "rerank": {"depth": 4}}
        r = client.post("/search", json=body)  # 12 hits with their texts
        assert r.status_code == 413 and r.json() == {
            "error": "queries x rerank.depth: 3 x 4 = 12 hits the cross-encoder reads, more than "
            "the limit of 10 per request (max_text_hits): ask for fewer queries or a smaller depth"
        }
        assert "search" not in served.batchers  # refused before any search
        r = client.post("/search", json={**body, "queries": ["who wrote hamlet"]})
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert re.fullmatch(
            r"rerank: read as [\d,]+ pieces \(every window, \[CLS\] and \[SEP\] included\), "
            r"more than the limit of 60 per request \(max_request_tokens\)",
            error,
        ), error
        assert served.batchers["search"].calls == 1  # the first stage ran, the reranker did not
        assert all(b.calls == 0 for k, b in served.batchers.items() if k != "search")
        r = client.post("/search", json={**body, "queries": ["a"], "rerank": {"depth": 2}})
        assert r.status_code == 200, r.text


def test_the_served_cross_encoder_reranks_search_too(
    classifier: Path, cross_encoder: Path, search_index: Path
) -> None:
    """Served as MODEL and named by --rerank-model, a cross-encoder is loaded once: /search's
    reranking and /rerank share its pipeline and batcher, and agree on the scores."""
    from fastapi.testclient import TestClient

    from bertforge.serve import create_app

    app = create_app(
        cross_encoder,
        index=search_index,
        index_model=str(classifier),
        rerank_model=str(cross_encoder),
        precision="fp32",
    )
    served = app.state.server
    assert served.reranker is served.pipe
    with TestClient(app) as client:
        query = SEARCH_QUERIES[0]
        first = client.post("/search", json={"queries": [query], "top_k": 5, "return_text": True})
        texts = [h["text"] for h in first.json()["results"][0]]
        r = client.post("/search", json={"queries": [query], "top_k": 5, "rerank": {"depth": 5}})
        assert r.status_code == 200, r.text
        assert served.batchers["rerank"].calls >= 1 and len(served.batchers) == 2
        scores = {h["first_stage_rank"] - 1: h["score"] for h in r.json()["results"][0]}
        tei = client.post("/rerank", json={"query": query, "texts": texts}).json()
        assert scores == pytest.approx({x["index"]: x["score"] for x in tei}, abs=1e-5)
        assert len(served.batchers) == 2  # /rerank in the same batcher


def test_a_reranked_search_that_fails_fails_alone(
    classifier: Path, cross_encoder: Path, search_index: Path
) -> None:
    """Two reranked searches in one cross-encoder call, one of which the model refuses: the
    call is run again one request at a time, the other answered as if alone."""
    from bertforge.search import rerank as search_rerank
    from bertforge.serve import Limits, create_app

    app = create_app(
        classifier,
        Limits(max_wait_ms=20),
        index=search_index,
        rerank_model=cross_encoder,
        precision="fp32",
    )
    served = app.state.server
    reranker, gate, calls = served.reranker, threading.Event(), []
    score = reranker.score
    hold, poison = (reranker.piece_ids([q])[0].tolist() for q in ("hold", "poison"))

    def refusing(queries: list[Any], documents: list[Any], **options: Any) -> list[float]:
        asked = [list(q) for q in queries]
        calls.append(len(queries))
        if hold in asked:
            gate.wait(30)
        if poison in asked:
            raise InputError("cannot read 'poison'")
        return score(queries, documents, **options)

    reranker.score = refusing
    body = {"top_k": 3, "rerank": {"depth": 4}}

    async def go() -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            held = asyncio.create_task(client.post("/search", json={"queries": ["hold"], **body}))
            await until(lambda: bool(calls))  # the reranker is busy: the next two queue
            posts = [
                asyncio.create_task(client.post("/search", json={"queries": [q], **body}))
                for q in (SEARCH_QUERIES[0], "poison")
            ]
            await until(lambda: served.batchers["search:rerank"].waiting == 2)
            gate.set()
            return [await held, *await asyncio.gather(*posts)]

    with in_thread(app, gate) as url:
        held, fine, bad = asyncio.run(go())
    assert calls[:2] == [4, 8]  # hold's 4 pairs, then both requests' in one call
    assert held.status_code == 200 and fine.status_code == 200, fine.text
    assert bad.status_code == 422 and bad.json() == {"error": "cannot read 'poison'"}
    reranker.score = score
    index = app.state.index
    first = index.search([SEARCH_QUERIES[0]], 4, text=True)
    want = search_rerank(reranker, [SEARCH_QUERIES[0]], first, top_k=3)
    same_hits(fine.json()["results"], want)


def test_the_task_pipelines_refuse_an_unknown_field(
    qa_and_mlm: tuple[Path, Path], tiny_model: Path, classifier: Path, tmp_path: Path
) -> None:
    """/qa, /fill-mask, /nsp and /ner (bertforge's own APIs, as /embed, /classify and /summarize
    in test_unknown_fields_...) answer an unknown field with a 422 naming it and listing the
    path's fields: a misspelt option would leave its default and answer another question."""
    from fastapi.testclient import TestClient

    from bertforge.heads import BertForTokenClassification
    from bertforge.serve import create_app

    tagger = tmp_path / "tagger"
    config = BertConfig.from_pretrained(classifier).replace(id2label={0: "O", 1: "B-PER"})
    BertForTokenClassification(config).save_pretrained(tagger)
    Tokenizer.from_pretrained(classifier).save_pretrained(tagger)
    qa, _ = qa_and_mlm
    cases = [  # (model, path, a valid body, an unknown field, a field of the path's)
        (qa, "/qa", {"questions": ["q"], "contexts": ["c"]}, "max_answer_len", "max_answer_length"),
        (tiny_model, "/fill-mask", {"texts": ["a [MASK]"]}, "topk", "top_k"),
        (tiny_model, "/nsp", {"texts": ["a"], "pairs": ["b"]}, "pair", "pairs"),
        (tagger, "/ner", {"texts": ["a"]}, "text", "texts"),
    ]
    for model, path, body, unknown, known in cases:
        with TestClient(create_app(model, precision="fp32")) as client:
            assert client.post(path, json=body).status_code == 200, path
            r = client.post(path, json={**body, unknown: 1})
            assert r.status_code == 422, (path, r.text)
            message = r.json()["error"]
            assert message.startswith(f"{unknown}: unknown field (the fields of POST {path}: ")
            assert f" {known}," in message or f" {known})" in message, message
