"""bertforge's server beside infinity-emb's on the same model, the same requests, one machine.

Two loads, each run against each server in turn for --rounds interleaved rounds (bertforge,
infinity, bertforge, infinity, ...: one server up at a time, so neither competes with the other
for the cores), a warm-up before each:

- rerank: --rerank-requests (120) requests at concurrency --rerank-concurrency (8), each a SQuAD
  v1.1 dev question with 20 paragraphs (its own and 19 others drawn with a fixed seed), sent to
  bertforge's /v1/rerank and infinity's /rerank (both Cohere-shaped); the cross-encoder is
  --cross-encoder (default: all-MiniLM-L6-v2's encoder with a fresh one-output head, seeded).
  The two servers' scores of the first round are compared (largest difference).
- embed: --embed-requests (2,000) requests of one real Wikipedia sentence at concurrency 32,
  to bertforge's /v1/embeddings and infinity's /embeddings (both OpenAI-shaped), all-MiniLM-L6-v2.

Both servers on their CPU defaults (infinity: `infinity_emb v2 --engine torch --device cpu`).
Reported per load: requests/s, p50 / p99 per server and round, and the same-run ratios
(bertforge over infinity: throughput, p99). infinity is found as --infinity (an `infinity_emb`
executable, e.g. in a venv of its own: pip install "infinity-emb[server,torch]"), else on PATH;
without it the run stops and says so.

    python benchmarks/serve_load.py --peers [--infinity /path/to/venv/bin/infinity_emb]
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np


def rerank_requests(data: Path, n: int, documents: int = 20, seed: int = 0) -> list[dict]:
    """n (question, paragraphs) requests from SQuAD v1.1 dev: each question of a paragraph
    in turn, its paragraph first among `documents` (the others drawn with `seed`)."""
    dev = json.loads((data / "squad" / "dev-v1.1.json").read_text())
    paragraphs = [p for article in dev["data"] for p in article["paragraphs"]]
    rng = random.Random(seed)
    out = []
    for p in paragraphs[:n]:
        others = [o["context"] for o in rng.sample(paragraphs, documents) if o is not p]
        docs = [p["context"], *others][:documents]
        out.append({"query": p["qas"][0]["question"], "documents": docs})
    return out


def _quantiles(latencies: list[float]) -> dict[str, float]:
    q = statistics.quantiles(sorted(latencies), n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3}


async def drive(url: str, path: str, bodies: list[dict], concurrency: int) -> dict[str, Any]:
    """`bodies` POSTed to url+path by `concurrency` clients (one pool), each taking the next;
    every answer's JSON kept (in order) for the score comparison."""
    latencies: list[float] = []
    codes: collections.Counter[int] = collections.Counter()
    answers: list[Any] = [None] * len(bodies)
    next_i = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            nonlocal next_i
            while next_i < len(bodies):
                i = next_i
                next_i += 1
                t = time.perf_counter()
                r = await client.post(path, json=bodies[i])
                latencies.append(time.perf_counter() - t)
                codes[r.status_code] += 1
                answers[i] = r.json() if r.status_code == 200 else None

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    result = {"requests": len(bodies), "concurrency": concurrency, "seconds": wall}
    result |= {"requests_per_s": len(bodies) / wall, **_quantiles(latencies)}
    return {**result, "status_codes": dict(codes), "answers": answers}


def _wait(url: str, proc: subprocess.Popen, what: str) -> None:
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not answer /health in 120 s")


def start_infinity(exe: str, model: Path, port: int) -> subprocess.Popen:
    cmd = [exe, "v2", "--model-id", str(model), "--engine", "torch", "--device", "cpu"]
    cmd += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}", proc, "infinity_emb")
    return proc


def bodies_for(server: str, load: str, items: list[Any], name: str) -> list[dict]:
    """The same requests in each server's shape."""
    if load == "rerank":
        return [{"model": name, **r} for r in items] if server == "infinity" else items
    return [{"model": name, "input": [t]} for t in items]


PATHS = {
    ("bertforge", "rerank"): "/v1/rerank",
    ("infinity", "rerank"): "/rerank",
    ("bertforge", "embed"): "/v1/embeddings",
    ("infinity", "embed"): "/embeddings",
}


def scores_of(server: str, answer: dict) -> list[float]:
    """Scores by document index from a Cohere-shaped rerank answer (both servers)."""
    by_index = {r["index"]: r["relevance_score"] for r in answer["results"]}
    return [by_index[i] for i in range(len(by_index))]


def one_round(server: str, load: str, model: Path, items: list, concurrency: int, ctx: dict):
    """Start `server` on `model`, warm it up, run the load, stop it."""
    from servers import free_port, start

    if server == "bertforge":
        proc, url = start(str(model), ctx["server_src"], ctx["serve_options"])
    else:
        port = free_port()
        proc, url = start_infinity(ctx["infinity"], model, port), f"http://127.0.0.1:{port}"
    try:
        bodies = bodies_for(server, load, items, model.name)
        path = PATHS[(server, load)]
        asyncio.run(drive(url, path, bodies[: 2 * concurrency], concurrency))  # warm-up
        return asyncio.run(drive(url, path, bodies, concurrency))
    finally:
        proc.terminate()
        proc.wait(30)


def run_load(load: str, model: Path, items: list, concurrency: int, ctx: dict) -> dict:
    rounds: dict[str, list[dict]] = {"bertforge": [], "infinity": []}
    for _ in range(ctx["rounds"]):
        for server in rounds:
            result = one_round(server, load, model, items, concurrency, ctx)
            rounds[server].append(result)
            shown = {k: round(v, 2) for k, v in result.items() if isinstance(v, float)}
            print(load, server, shown, result["status_codes"], flush=True)
    summary = {s: _summary(r) for s, r in rounds.items()}
    out: dict[str, Any] = {"rounds": {s: [_bare(x) for x in r] for s, r in rounds.items()}}
    out["summary"] = summary
    out["ratio_throughput"] = (
        summary["bertforge"]["requests_per_s"] / summary["infinity"]["requests_per_s"]
    )
    out["ratio_p99"] = summary["bertforge"]["p99_ms"] / summary["infinity"]["p99_ms"]
    if load == "rerank":
        out |= compare_scores(model, items, rounds["bertforge"][0], rounds["infinity"][0])
    return out


def compare_scores(model: Path, items: list[dict], ours: dict, theirs: dict) -> dict[str, Any]:
    """The largest score difference between the servers over the pairs the cross-encoder reads
    whole, and over those whose document is longer than it reads (bertforge scores its best
    window beside the query, infinity the truncated pair: they differ there by design)."""
    from bertforge.pipelines import Pipeline

    pipe = Pipeline(model)
    whole, windowed = 0.0, 0.0
    count = 0
    for item, x, y in zip(items, ours["answers"], theirs["answers"]):
        _, owners = pipe.pair_rows([item["query"]] * len(item["documents"]), item["documents"])
        rows = np.bincount(owners, minlength=len(item["documents"]))
        for n, a, b in zip(rows, scores_of("bertforge", x), scores_of("infinity", y)):
            if n == 1:
                whole = max(whole, abs(a - b))
            else:
                windowed, count = max(windowed, abs(a - b)), count + 1
    return {
        "max_score_difference_read_whole": whole,
        "pairs_read_in_windows": count,
        "max_score_difference_windowed": windowed,
    }


def _bare(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "answers"}


def _summary(results: list[dict]) -> dict[str, float]:
    """The median over rounds of each figure."""
    keys = ("requests_per_s", "p50_ms", "p99_ms")
    return {k: statistics.median(r[k] for r in results) for k in keys}


def cross_encoder_at(model: str | None, minilm: Path, tmp: Path) -> Path:
    from servers import cross_encoder

    return Path(model) if model else cross_encoder(minilm, tmp / "ce")


def run_peers(args: Any) -> dict[str, Any]:
    from inference_throughput import real_sentences

    exe = args.infinity or shutil.which("infinity_emb")
    if not exe:
        raise SystemExit(
            "infinity_emb not found: install it (pip install 'infinity-emb[server,torch]', "
            "best in a venv of its own) and pass --infinity PATH"
        )
    ctx = {"infinity": exe, "rounds": args.peer_rounds, "server_src": args.server_src}
    ctx["serve_options"] = args.serve_options
    data, results = Path(args.data), {}
    with tempfile.TemporaryDirectory() as tmp:
        ce = cross_encoder_at(args.cross_encoder, Path(args.model), Path(tmp))
        if "rerank" in args.loads:
            items = rerank_requests(data, args.rerank_requests)
            results["rerank"] = run_load("rerank", ce, items, args.rerank_concurrency, ctx)
        if "embed" in args.loads:
            items = real_sentences(data, args.embed_requests)
            results["embed"] = run_load("embed", Path(args.model), items, 32, ctx)
    version = "import importlib.metadata as m; print(m.version('infinity_emb'))"
    python = Path(exe).parent / "python"
    results["infinity"] = subprocess.run(
        [str(python), "-c", version], capture_output=True, text=True
    ).stdout.strip()
    return results
