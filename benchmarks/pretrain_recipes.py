"""Pre-training recipes on a small budget: held-out masked-LM loss against training time.

Each recipe is a set of `bertforge pretrain` settings (PretrainConfig fields). For a time budget
the schedule must end when the budget does, so a recipe's step count is its budget over its
measured seconds per step on this machine (`calibrate`). Every run evaluates the same fixed
held-out rows with the same 15% masks (pretrain.py's held-out evaluation), so the losses compare
across recipes. The time axis is steps x the recipe's calibrated seconds per step on this CPU
for every run (a step's cost is constant, and other work on the machine cannot stretch a
curve); a CPU run's measured `train_seconds` (no evaluation or checkpoint writing) is shown
beside it.

    python benchmarks/pretrain_recipes.py calibrate --data PREPARED              # s/step per recipe
    python benchmarks/pretrain_recipes.py run --data PREPARED --recipes paper,mlm --minutes 60
    python benchmarks/pretrain_recipes.py report                                 # md, json, png

`run` resumes: re-running it continues unfinished runs (pretrain's own resume) and skips
finished ones, so a study can span sessions. `run --device cuda --cpu-steps` runs a recipe on a
GPU for exactly the steps of its CPU budget: the same batches and schedule, so its curve against
step x CPU seconds per step projects the CPU run (marked "projected" in the report).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bertforge.train.logs import read_metrics
from bertforge.train.pretrain import PretrainConfig, run
from common import RESULTS, machine, matmul_gflops, write_results

# The paper's recipe (Devlin et al. 2018, A.2): MLM + NSP, batch 256, lr 1e-4, warmup 1% of
# steps then linear decay, dropout 0.1, 15% masking; the candidates change one thing or several.
PAPER = {"nsp": True, "batch_size": 256, "lr": 1e-4, "warmup_ratio": 0.01}
RECIPES: dict[str, dict[str, Any]] = {
    "paper": PAPER,
    "paper-lr1e-3": {**PAPER, "lr": 1e-3, "warmup_ratio": 0.05},
    "nsp-b64": {"nsp": True, "dropout": 0.0, "batch_size": 64, "lr": 1e-3, "warmup_ratio": 0.05},
    "mlm-b64": {"nsp": False, "dropout": 0.0, "batch_size": 64, "lr": 1e-3, "warmup_ratio": 0.05},
    "mlm-b64-lr2e-3": {
        "nsp": False,
        "dropout": 0.0,
        "batch_size": 64,
        "lr": 2e-3,
        "warmup_ratio": 0.05,
    },
    "mlm-b128": {"nsp": False, "dropout": 0.0, "batch_size": 128, "lr": 1e-3, "warmup_ratio": 0.05},
    "mlm-b32": {"nsp": False, "dropout": 0.0, "batch_size": 32, "lr": 7e-4, "warmup_ratio": 0.05},
    "mlm-b64-dropout": {
        "nsp": False,
        "dropout": 0.1,
        "batch_size": 64,
        "lr": 1e-3,
        "warmup_ratio": 0.05,
    },
    "mlm-b64-wsd": {
        "nsp": False,
        "dropout": 0.0,
        "batch_size": 64,
        "lr": 1e-3,
        "warmup_ratio": 0.05,
        "decay_ratio": 0.2,
    },
    "mlm-b64-mask25": {
        "nsp": False,
        "dropout": 0.0,
        "batch_size": 64,
        "lr": 1e-3,
        "warmup_ratio": 0.05,
        "masked_lm_prob": 0.25,
    },
}
COMMON = {"model_size": "mini", "max_seq_length": 128, "precision": "auto", "seed": 0}
CALIBRATION = Path(RESULTS / "pretrain_recipes_calibration.json")


def config(name: str, data: str, out: Path, steps: int, **extra: Any) -> PretrainConfig:
    settings = {**COMMON, **RECIPES[name], **extra}
    return PretrainConfig(data=data, out=str(out), steps=steps, progress=False, **settings)


def calibrate(args: argparse.Namespace) -> None:
    """Seconds per optimizer step of each recipe on this machine (steps 5..N, no evaluation)."""
    saved = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {"recipes": {}}
    for name in args.recipes.split(","):
        out = Path(args.runs) / "calibration" / name
        cfg = config(name, args.data, out, args.steps, eval_every=0, save_every=0, log_every=5)
        run(cfg)
        records = [r for r in read_metrics(out) if "train_seconds" in r and "loss" in r]
        first, last = records[0], records[-1]
        per_step = (last["train_seconds"] - first["train_seconds"]) / (last["step"] - first["step"])
        saved["recipes"][name] = {
            "seconds_per_step": per_step,
            "steps_timed": last["step"] - first["step"],
        }
        print(f"{name}: {per_step:.3f} s/step", flush=True)
        for p in sorted(out.rglob("*"), reverse=True):  # only the timing is kept
            p.unlink() if p.is_file() else p.rmdir()
    saved["machine"] = machine()
    saved["matmul_gflops"] = {
        "fp32": matmul_gflops(__import__("torch").float32, __import__("torch").device("cpu"))
    }
    CALIBRATION.parent.mkdir(parents=True, exist_ok=True)
    CALIBRATION.write_text(json.dumps(saved, indent=2) + "\n")


def study(args: argparse.Namespace) -> None:
    per_step = json.loads(CALIBRATION.read_text())["recipes"]
    for name in args.recipes.split(","):
        steps = max(20, round(args.minutes * 60 / per_step[name]["seconds_per_step"]))
        tag = "gpu" if args.device and args.device.startswith("cuda") else "cpu"
        out = Path(args.runs) / f"{name}-{args.minutes:g}min-{tag}"
        cfg = config(
            name,
            args.data,
            out,
            steps,
            eval_every=max(1, steps // args.evals),
            eval_batches=args.eval_batches,
            save_every=max(1, steps // 10),
            keep_checkpoints=1,
            device=args.device,
        )
        start = time.time()
        print(f"{name}: {steps:,} steps into {out}", flush=True)
        result = run(cfg)
        print(f"{name}: {result} in {time.time() - start:.0f} s wall", flush=True)


def curves(runs: Path) -> dict[str, dict[str, Any]]:
    per_step = json.loads(CALIBRATION.read_text())["recipes"]
    found: dict[str, dict[str, Any]] = {}
    for run_json in sorted(runs.glob("*/run.json")):
        run_dir = run_json.parent
        name, _, rest = run_dir.name.rpartition("-")
        name, minutes = name.rsplit("-", 1)[0], name.rsplit("-", 1)[1]
        evals = [r for r in read_metrics(run_dir) if "eval_mlm_loss" in r]
        if name not in RECIPES or not evals:
            continue
        # Time on this CPU = steps x the recipe's calibrated seconds per step, for every run:
        # GPU runs are projected that way, and CPU runs are too so that other work on the
        # machine (tests, builds) cannot stretch a curve; their measured seconds are kept.
        projected = rest == "gpu"
        seconds = [r["step"] * per_step[name]["seconds_per_step"] for r in evals]
        found[run_dir.name] = {
            "recipe": name,
            "settings": RECIPES[name],
            "budget": minutes,
            "where": rest,
            "projected": projected,
            "seconds": seconds,
            "measured_seconds": None if projected else [r["train_seconds"] for r in evals],
            "steps": [r["step"] for r in evals],
            "mlm_loss": [r["eval_mlm_loss"] for r in evals],
            "mlm_acc": [r["eval_mlm_acc"] for r in evals],
            "finished": json.loads(run_json.read_text()).get("finished", False),
        }
    return found


LEVELS = (6.5, 6.0, 5.5, 5.0)  # held-out losses whose arrival times the table shows


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 60, 1)


def time_to(curve: dict[str, Any], loss: float) -> float | None:
    """Training seconds at which the held-out loss first reaches `loss` (linear between evals)."""
    prev_s, prev_l = 0.0, float("inf")
    for s, value in zip(curve["seconds"], curve["mlm_loss"]):
        if value <= loss:
            if prev_l == float("inf"):
                return s
            return prev_s + (s - prev_s) * (prev_l - loss) / (prev_l - value)
        prev_s, prev_l = s, value
    return None


def report(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = curves(Path(args.runs))
    paper = next(
        (c for k, c in found.items() if c["recipe"] == "paper" and not c["projected"]), None
    )
    paper = paper or next((c for c in found.values() if c["recipe"] == "paper"), None)
    target = paper["mlm_loss"][-1] if paper else None
    rows = []
    for key, c in sorted(found.items(), key=lambda kv: kv[1]["mlm_loss"][-1]):
        t = time_to(c, target) if target is not None else None
        rows.append(
            {
                "run": key,
                "recipe": c["recipe"],
                "where": "H100 (CPU steps)" if c["projected"] else "this CPU",
                "minutes": round(c["seconds"][-1] / 60, 1),
                "measured_minutes": _minutes(c["measured_seconds"] and c["measured_seconds"][-1]),
                "final_mlm_loss": round(c["mlm_loss"][-1], 3),
                "final_mlm_acc": round(c["mlm_acc"][-1], 3),
                "minutes_to_paper_final": None if t is None else round(t / 60, 1),
                **{f"minutes_to_{x}": _minutes(time_to(c, x)) for x in LEVELS},
            }
        )
    fig, ax = plt.subplots(figsize=(8, 5))
    for c in found.values():
        ax.plot(
            [s / 60 for s in c["seconds"]],
            c["mlm_loss"],
            "--" if c["projected"] else "-",
            label=f"{c['recipe']}{' (projected)' if c['projected'] else ''}",
        )
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8)
    ax.set_xlabel("training minutes on the 2-core CPU")
    ax.set_ylabel("held-out masked-LM loss (15% masks)")
    ax.set_title("BERT mini: recipes on a small budget")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "pretrain_recipes.png", dpi=120)
    write_results(
        "pretrain_recipes", {"recipes": RECIPES, "common": COMMON, "rows": rows, "curves": found}
    )
    levels = " | ".join(f"min. to {x}" for x in LEVELS)
    lines = [
        "| run | recipe | where | CPU minutes | measured | held-out MLM loss | MLM acc | min. to "
        f"the paper's final ({target:.3f}) | {levels} |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(LEVELS),
    ]
    lines += [
        f"| {r['run']} | {r['recipe']} | {r['where']} | {r['minutes']} | {r['measured_minutes']} | "
        f"{r['final_mlm_loss']} | "
        f"{r['final_mlm_acc']} | {r['minutes_to_paper_final']} | "
        + " | ".join(str(r[f"minutes_to_{x}"]) for x in LEVELS)
        + " |"
        for r in rows
    ]
    (RESULTS / "pretrain_recipes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("calibrate", "run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--runs", default="/work/runs/recipes")
        if name != "report":
            p.add_argument("--data", required=True)
            p.add_argument("--recipes", default=",".join(RECIPES))
        if name == "calibrate":
            p.add_argument("--steps", type=int, default=30)
        if name == "run":
            p.add_argument("--minutes", type=float, default=60)
            p.add_argument("--evals", type=int, default=20)
            p.add_argument("--eval-batches", type=int, default=10)
            p.add_argument("--device")
    args = ap.parse_args()
    {"calibrate": calibrate, "run": study, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
