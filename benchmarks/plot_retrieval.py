"""The retrieval table as a chart: benchmarks/results/retrieval.json -> retrieval.png.

MRR@10 and recall@1 on SQuAD v1.1 dev as a retrieval set (4,874 questions of the evaluation
half against all 2,067 paragraphs; `benchmarks/retrieval.py` measured them) for the rows that
help choose a setting: BM25, zero-shot all-MiniLM-L6-v2, trained bi-encoders (read whole or in
32-piece windows), hybrids fused by z-scores, and the cross-encoder's reranking. Nothing is
measured here: the figures are read from the JSON as they are.

    python benchmarks/plot_retrieval.py [--json benchmarks/results/retrieval.json] [--out PNG]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SOUP = "bertforge bi-encoder distilled (teacher weight 1), 4 seeds + MiniLM 0.15 merged, H100"
WINDOWS = ", read in windows of 32 pieces (bertforge index --window 32)"
ONE_NEG = (
    "bertforge bi-encoder, lr 5e-5, 1 BM25-mined negative, retrained 2026-11-26+bm25 (z-score)"
)

# (label on the chart, group, where: "rows" or "rerank", the row's name in the JSON)
BARS: list[tuple[str, str, str, str]] = [
    ("BM25", "lexical", "rows", "bm25"),
    ("all-MiniLM-L6-v2, zero-shot", "dense", "rows", "minilm"),
    ("bertforge bi-encoder, 1 epoch", "dense", "rows", "bertforge bi-encoder"),
    (
        "sentence-transformers, trained the same way",
        "dense",
        "rows",
        "sentence-transformers bi-encoder",
    ),
    ("distilled soup (bertforge)", "dense", "rows", SOUP),
    ("zero-shot MiniLM, 32-piece windows", "dense", "rows", "minilm" + WINDOWS),
    ("distilled soup, 32-piece windows", "dense", "rows", SOUP + WINDOWS),
    ("MiniLM + BM25 (z-score fusion)", "hybrid", "rows", "minilm+bm25 (z-score)"),
    ("one-negative bi-encoder + BM25 (z-score)", "hybrid", "rows", ONE_NEG),
    (
        "soup, 32-piece windows + BM25 (z-score)",
        "hybrid",
        "rows",
        SOUP + WINDOWS + "+bm25 (z-score)",
    ),
    (
        "hybrid 89.0, top 50 reranked (cross-encoder)",
        "reranked",
        "rerank",
        ONE_NEG + ", top 50 reranked",
    ),
    (
        "the same, fused with the first stage (z-score)",
        "reranked",
        "rerank",
        ONE_NEG + ", top 50 reranked + first stage (z-score)",
    ),
]
COLOURS = {
    "lexical": "tab:gray",
    "dense": "tab:blue",
    "hybrid": "tab:green",
    "reranked": "tab:orange",
}


def picked(result: dict[str, Any]) -> list[tuple[str, str, dict[str, float]]]:
    """(label, group, metrics) of each bar, from the JSON's rows or its rerank rows."""
    out = []
    for label, group, where, name in BARS:
        rows = result["rows"] if where == "rows" else result["rerank"]["rows"]
        out.append((label, group, rows[name]))
    return out


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bars = picked(result)[::-1]  # the first bar on top
    labels = [b[0] for b in bars]
    mrr = [100 * b[2]["mrr@10"] for b in bars]
    r1 = [100 * b[2]["recall@1"] for b in bars]
    y = range(len(bars))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    drawn = ax.barh([k + 0.2 for k in y], mrr, height=0.4, color=[COLOURS[b[1]] for b in bars])
    lighter = ax.barh(
        [k - 0.2 for k in y], r1, height=0.4, color=[COLOURS[b[1]] for b in bars], alpha=0.4
    )
    ax.bar_label(drawn, fmt="%.1f", padding=2, fontsize=8)
    ax.bar_label(lighter, fmt="%.1f", padding=2, fontsize=8, color="dimgray")
    ax.axvline(100 * result["rows"]["bm25"]["mrr@10"], color="tab:gray", ls="--", lw=0.8)
    ax.set_yticks(list(y), labels, fontsize=9)
    ax.set_xlim(55, 100)
    ax.set_xlabel("MRR@10 (dark) and recall@1 (light), x 100")
    ax.set_title(
        f"SQuAD v1.1 dev as retrieval: {result['queries']:,} questions, "
        f"{result['documents']:,} paragraphs",
        fontsize=10,
    )
    ax.legend(
        handles=[Patch(color=c, label=g) for g, c in COLOURS.items()],
        loc="upper right",
        fontsize=8,
    )
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=str(RESULTS / "retrieval.json"))
    p.add_argument("--out", default=str(RESULTS / "retrieval.png"))
    args = p.parse_args()
    chart(json.loads(Path(args.json).read_text()), Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
