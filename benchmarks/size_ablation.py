"""The paper's model-size ablation (Devlin et al. 2018, Table 6), reproduced small.

Pre-trains several model sizes (default tiny, mini, small) from scratch on the same prepared
shards with the same budget and the same data order: one seed drives the instance stream,
which does not depend on the model, so every size sees exactly the same sequences, masks and
NSP pairs in the same order, for the same number of optimizer steps, with the same optimizer
settings. Held-out MLM perplexity is measured on the same fixed held-out batches (the
held-out stream is seeded once, independently of the model).

Writes benchmarks/results/size_ablation.{json,md,png}: a table of parameters, layers, hidden
size, heads, wall time and the final held-out MLM perplexity / accuracy and NSP accuracy of
each size, and the held-out perplexity curves. Paper's claim: perplexity falls as the model
grows.

    bertforge prepare ../shared/data/wikipedia_en_sample ../shared/data/pretraining_books_gutenberg \\
        --tokenizer <MiniLM dir> --out /tmp/corpus --encoding-errors replace
    python benchmarks/size_ablation.py --data /tmp/corpus [--steps 800] [--sizes tiny,mini,small]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch

from bertforge.config import BertConfig
from bertforge.data.shards import ShardSet
from bertforge.heads import BertForPreTraining
from bertforge.train.logs import read_metrics
from bertforge.train.pretrain import PretrainConfig, run
from common import RESULTS, machine, table, write_results


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="a directory written by `bertforge prepare`")
    ap.add_argument("--runs", default="/tmp/bertforge-size-ablation")
    ap.add_argument("--sizes", default="tiny,mini,small")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup-ratio", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default="auto")
    args = ap.parse_args()

    vocab_size = ShardSet(args.data).tokenizer().vocab_size
    rows, curves = [], {}
    for size in args.sizes.split(","):
        out = Path(args.runs) / size
        cfg = PretrainConfig(
            data=args.data,
            out=str(out),
            model_size=size,
            steps=args.steps,
            batch_size=args.batch_size,
            max_seq_length=args.max_seq_length,
            lr=args.lr,
            warmup_ratio=args.warmup_ratio,
            eval_every=args.eval_every,
            eval_batches=args.eval_batches,
            save_every=0,
            seed=args.seed,
            precision=args.precision,
        )
        started = time.perf_counter()
        run(cfg)
        seconds = time.perf_counter() - started
        records = read_metrics(out)
        evals = [r for r in records if "eval_perplexity" in r]
        if not evals:
            raise SystemExit(f"{out}: no held-out evaluation in metrics.jsonl")
        curves[size] = [(r["step"], r["eval_perplexity"]) for r in evals]
        last = evals[-1]
        config = BertConfig.from_size(size, vocab_size=vocab_size)
        tokens = sum(r["tokens"] for r in records if "tokens" in r)
        rows.append(
            {
                "size": size,
                "layers": config.num_hidden_layers,
                "hidden": config.hidden_size,
                "heads": config.num_attention_heads,
                "params_M": round(_parameters(config, vocab_size) / 1e6, 2),
                "steps": args.steps,
                "train_tokens": tokens,
                "minutes": round(seconds / 60, 1),
                "heldout_ppl": round(last["eval_perplexity"], 2),
                "heldout_mlm_acc": round(last["eval_mlm_acc"], 4),
                "heldout_nsp_acc": round(last["eval_nsp_acc"], 4),
            }
        )
        print(table(rows, list(rows[0])))

    ppl = [r["heldout_ppl"] for r in rows]
    falls = all(a > b for a, b in itertools.pairwise(ppl))
    columns = list(rows[0])
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    verdict = (
        "Held-out MLM perplexity falls as the model grows, as in the paper's Table 6."
        if falls
        else "Held-out MLM perplexity does NOT fall monotonically with size in this run."
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "size_ablation.md").write_text(
        "\n".join(md) + f"\n\n{verdict}\n\nSettings: {vars(args)}\n"
    )
    write_results(
        "size_ablation",
        {
            "machine": machine(),
            "settings": vars(args),
            "rows": rows,
            "curves": curves,
            "falls": falls,
        },
    )
    _plot(curves, RESULTS / "size_ablation.png", args)
    print(table(rows, columns))
    print(verdict)
    print(f"wrote {RESULTS / 'size_ablation.md'}, .json and .png")


def _parameters(config: BertConfig, vocab_size: int) -> int:
    with torch.device("meta"):
        return BertForPreTraining(config).num_parameters()


def _plot(curves: dict[str, list[tuple[int, float]]], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for size, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=size)
    ax.set_yscale("log")
    ax.set_xlabel(f"step (batch {args.batch_size} x {args.max_seq_length})")
    ax.set_ylabel("held-out MLM perplexity")
    ax.set_title("Model size ablation: same data, same order, same steps")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
