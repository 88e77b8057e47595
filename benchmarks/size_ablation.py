"""The paper's model-size ablation (Devlin et al. 2018, Table 6) at small scale, with its
downstream columns.

Each size (default tiny, mini, small) is pre-trained from scratch with the recommended recipe
(masked LM alone on packed rows, no dropout, batch 64, lr 1e-3, 5% warmup, the lr held until
the last 20% of the steps, then linear decay: mlm-b64-wsd in benchmarks/pretrain_recipes.py)
for the same number of steps, so every size sees the same sequences in the same order;
held-out perplexity is measured on the same fixed rows. Each pre-trained model and its random-initialisation twin (the same architecture, never trained)
are then fine-tuned on SST-2 (2 epochs, dev accuracy) and MRPC (3 epochs, 3 seeds, dev accuracy
and F1) with the same settings. `--extra NAME=DIR` adds checkpoints pre-trained elsewhere (the
H100 runs) to the fine-tuning columns.

Resumable: pre-training resumes from its checkpoints, and every fine-tuning result is saved as
it finishes (re-running skips what is done), so the study can span sessions.

    python benchmarks/size_ablation.py --data PREPARED [--steps 1300] [--sizes tiny,mini,small]
        [--warmup-ratio R] [--extra mini-h100=DIR,small-h100=DIR]
        [--stage pretrain|finetune|report|all]

A run this short needs a longer warmup than the recipe's 5% for the wider models: small with 65
warmup steps (5% of 1,300) spiked (gradient norm 14) as the rate reached 1e-3 and collapsed to one
guess for every mask; `--warmup-ratio 0.2` (260 steps, about the H100 run's 250) trains it. The
report gives each run's warmup in steps.

Writes benchmarks/results/size_ablation.{json,md,png}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch

from bertforge.config import SIZES, BertConfig
from bertforge.data.shards import ShardSet
from bertforge.heads import BertForMaskedLM
from bertforge.train.finetune import FinetuneConfig
from bertforge.train.finetune import run as finetune
from bertforge.train.logs import read_metrics
from bertforge.train.pretrain import PretrainConfig
from bertforge.train.pretrain import run as pretrain
from common import RESULTS, machine, table
from pretrain_recipes import RECIPES

RECIPE = RECIPES["mlm-b64-wsd"]  # the recommended recipe
TASKS = {"sst2": {"epochs": 2, "seeds": (0,)}, "mrpc": {"epochs": 3, "seeds": (0, 1, 2)}}


def pretrain_sizes(args: argparse.Namespace) -> None:
    for size in args.sizes.split(","):
        cfg = PretrainConfig(
            data=args.data,
            out=str(Path(args.runs) / size),
            model_size=size,
            steps=args.steps,
            max_seq_length=128,
            eval_every=max(1, args.steps // 10),
            eval_batches=args.eval_batches,
            save_every=max(1, args.steps // 10),
            keep_checkpoints=1,
            progress=False,
            **recipe(args),
        )
        started = time.perf_counter()
        result = pretrain(cfg)
        print(f"{size}: {result} in {time.perf_counter() - started:.0f} s", flush=True)
        if result.get("interrupted"):
            raise SystemExit(130)


def recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recommended recipe, with --warmup-ratio where given."""
    return {**RECIPE, **({} if args.warmup_ratio is None else {"warmup_ratio": args.warmup_ratio})}


def random_twin(size: str, pretrained: Path, runs: Path) -> Path:
    """The pre-trained model's architecture with BERT's random initialisation, saved once."""
    out = runs / f"random-{size}"
    if not (out / "model.safetensors").exists():
        torch.manual_seed(0)
        BertForMaskedLM(BertConfig.from_pretrained(pretrained)).save_pretrained(out)
        from bertforge.tokenizer import Tokenizer

        Tokenizer.from_pretrained(pretrained).save_pretrained(out)
    return out


def models(args: argparse.Namespace) -> dict[str, Path]:
    runs = Path(args.runs)
    found: dict[str, Path] = {}
    for size in args.sizes.split(","):
        if (runs / size / "model.safetensors").exists():
            found[size] = runs / size
            found[f"{size} (random init)"] = random_twin(size, runs / size, runs)
    for item in filter(None, (args.extra or "").split(",")):
        name, _, path = item.partition("=")
        found[name] = Path(path)
        size = name.split("-")[0]  # mini-h100: the twin of mini, from the checkpoint's config
        if size in SIZES and f"{size} (random init)" not in found:
            found[f"{size} (random init)"] = random_twin(size, Path(path), runs)
    return found


def finetune_all(args: argparse.Namespace) -> None:
    data = Path(args.data_root)
    files = {"sst2": data / "glue/SST-2", "mrpc": data / "glue/MRPC"}
    results = _load(args)
    for name, model in models(args).items():
        for task, setup in TASKS.items():
            for seed in setup["seeds"]:
                key = f"{name}|{task}|{seed}"
                if key in results["finetune"]:
                    continue
                # resumable: a killed fine-tuning resumes from its last epoch on the next run
                out = Path(args.runs) / "finetune" / key.replace("|", "-").replace(" ", "_")
                started = time.perf_counter()
                best = finetune(
                    FinetuneConfig(
                        model=str(model),
                        task=task,
                        train=str(files[task] / "train.tsv"),
                        dev=str(files[task] / "dev.tsv"),
                        out=str(out),
                        epochs=setup["epochs"],
                        lr=args.ft_lr,
                        batch_size=32,
                        seed=seed,
                        progress=False,
                    )
                )
                shutil.rmtree(out)
                results["finetune"][key] = {**best, "seconds": time.perf_counter() - started}
                print(
                    key,
                    {k: round(v, 4) for k, v in best.items() if isinstance(v, float)},
                    flush=True,
                )
                _save(args, results)


def _load(args: argparse.Namespace) -> dict[str, Any]:
    path = RESULTS / "size_ablation.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("finetune_settings") == _ft_settings(args):
            return saved
    return {"finetune": {}}


def _ft_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"lr": args.ft_lr, "batch_size": 32, "tasks": {k: v["epochs"] for k, v in TASKS.items()}}


def _save(args: argparse.Namespace, results: dict[str, Any]) -> None:
    results.update(finetune_settings=_ft_settings(args), machine=machine())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "size_ablation.json").write_text(json.dumps(results, indent=1) + "\n")


def report(args: argparse.Namespace) -> None:
    results = _load(args)
    rows, curves = [], {}
    vocab = ShardSet(args.data).tokenizer().vocab_size
    for name, model in models(args).items():
        row: dict[str, Any] = {"model": name}
        config = BertConfig.from_pretrained(model)
        row["L/H/A"] = (
            f"{config.num_hidden_layers}/{config.hidden_size}/{config.num_attention_heads}"
        )
        with torch.device("meta"):
            row["params_M"] = round(
                BertForMaskedLM(config.replace(vocab_size=vocab)).num_parameters() / 1e6, 1
            )
        metrics = read_metrics(model)
        evals = [r for r in metrics if "eval_perplexity" in r]
        if evals and "random" not in name:
            row["steps"] = evals[-1]["step"]
            row["train_minutes"] = round(evals[-1].get("train_seconds", 0) / 60, 1)
            run = (
                json.loads((model / "run.json").read_text())
                if (model / "run.json").exists()
                else None
            )
            if run:  # pre-trained here: its warmup, in steps
                row["warmup_steps"] = round(run["settings"]["warmup_ratio"] * run["steps"])
            row["heldout_ppl"] = round(evals[-1]["eval_perplexity"], 1)
            row["heldout_mlm_acc"] = round(100 * evals[-1]["eval_mlm_acc"], 1)
            # x in training tokens: the H100 runs' batch is twice the CPU runs'
            logs = [r for r in metrics if "tokens" in r]
            per_step = statistics.median(
                b["tokens"] / (b["step"] - a["step"])
                for a, b in itertools.pairwise(logs)
                if b["step"] > a["step"]
            )
            row["tokens_M"] = round(evals[-1]["step"] * per_step / 1e6, 1)
            curves[name] = [(r["step"] * per_step / 1e6, r["eval_perplexity"]) for r in evals]
        ft = results["finetune"]
        sst = [ft[k]["accuracy"] for k in ft if k.startswith(f"{name}|sst2|")]
        mrpc = [ft[k] for k in ft if k.startswith(f"{name}|mrpc|")]
        if sst:
            row["sst2_acc"] = round(100 * statistics.mean(sst), 1)
        if mrpc:
            row["mrpc_acc"] = round(100 * statistics.mean(r["accuracy"] for r in mrpc), 1)
            row["mrpc_f1"] = round(100 * statistics.mean(r["f1"] for r in mrpc), 1)
            row["mrpc_seeds"] = len(mrpc)
        rows.append(row)
    for row in rows:  # what pre-training adds over the random-init twin
        twin = next((r for r in rows if r["model"] == f"{row['model']} (random init)"), None)
        size = row["model"].split("-")[0]
        twin = twin or next((r for r in rows if r["model"] == f"{size} (random init)"), None)
        if twin and twin is not row:
            for k in ("sst2_acc", "mrpc_acc", "mrpc_f1"):
                if k in row and k in twin:
                    row[f"{k}_gain"] = round(row[k] - twin[k], 1)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    # the warmup can differ per run (--warmup-ratio): each row gives its own in steps
    common = {k: v for k, v in RECIPE.items() if k != "warmup_ratio"}
    results.update(rows=rows, curves=curves, recipe=common, pretrain_steps=args.steps)
    _save(args, results)
    (RESULTS / "size_ablation.md").write_text("\n".join(md) + "\n")
    _plot(curves, RESULTS / "size_ablation.png")
    print(table(rows, columns))


def _plot(curves: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("training tokens, millions (CPU runs: 1,300 steps of 64 x 128; H100: 128 x 128)")
    ax.set_ylabel("held-out MLM perplexity")
    ax.set_title("Model size ablation: the recommended recipe, same data, same order")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", required=True, help="a directory written by `bertforge prepare`")
    ap.add_argument(
        "--data-root", default=str(here.parent / "shared" / "data"), help="GLUE is read here"
    )
    ap.add_argument("--runs", default="/work/runs/size-ablation")
    ap.add_argument("--sizes", default="tiny,mini,small")
    ap.add_argument(
        "--steps", type=int, default=1300, help="1,300: 33 minutes of small on this 2-core CPU"
    )
    ap.add_argument("--warmup-ratio", type=float, help="instead of the recipe's (pre-training)")
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--ft-lr", type=float, default=1e-4, help="fine-tuning learning rate")
    ap.add_argument("--extra", help="NAME=DIR,... more pre-trained checkpoints to fine-tune")
    ap.add_argument("--stage", default="all", choices=("pretrain", "finetune", "report", "all"))
    args = ap.parse_args()
    if args.stage in ("pretrain", "all"):
        pretrain_sizes(args)
    if args.stage in ("finetune", "all"):
        finetune_all(args)
    report(args)


if __name__ == "__main__":
    main()
