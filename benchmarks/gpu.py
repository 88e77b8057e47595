"""Every GPU comparison of issue 42 in one process (benchmarks/gpu.sh runs it):

pretrain  a pre-training step of BERT-base in bf16 (seq 128 x 256 rows, seq 512 x 64):
          bertforge's default CUDA path (the step's forward and loss compiled, as
          `bertforge pretrain` does it; fused AdamW) and its eager path, against
          transformers' BertForPreTraining (SDPA) eager and under torch.compile. Same weights,
          same batches, interleaved rounds; tokens/s and MFU against the chip's spec dense
          bf16 peak (989 TFLOP/s, H100 SXM and H200), useful FLOPs counted alike for both
          (benchmarks/pretrain_throughput.model_flops). At seq 128 also ours with
          model.LOW_PRECISION_LAYERNORM (MosaicBERT's bf16 LayerNorm), "ours_lp_layernorm".
check     correctness in the same run: 50 steps of the compiled step, and of the compiled
          step with the low-precision LayerNorm, against the eager one (same weights and
          batches of mixed lengths, dropout 0), their losses' largest relative difference;
          embeddings of the unpadded bf16 path against padded fp32, cosine (min over
          sentences).
embed     embeddings of N real Wikipedia sentences (tokenising included) with
          all-MiniLM-L6-v2's and BERT-base's shapes (weights drawn at random: throughput does
          not depend on them): bertforge's Pipeline.embed (unpadded and padded) against
          sentence-transformers' encode in bf16 at its best batch size; and the host's own
          floor: the rate with a model that does next to no device work, and the seconds of
          tokenising and cutting the sentences into rows.
finetune  one epoch of SST-2 on BERT-base, bf16, batch 32: `bertforge finetune` (compiled and
          not) against transformers' Trainer with its default data collator (train() timed;
          its tokenising is not).
(and with pretrain, unless --no-profile: each compiled step's kernel time by category,
GEMM, attention, Triton fusions, optimizer, other, from torch.profiler)

  python benchmarks/gpu.py --out DIR [--sections pretrain,check,embed,finetune,profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bertforge import BertConfig, BertForPreTraining  # noqa: E402
from bertforge.data.pretraining import Batch  # noqa: E402
from bertforge.tasks.pretraining import batch_statistics  # noqa: E402
from bertforge.train.loop import compiled  # noqa: E402
from bertforge.train.optim import build_optimizer  # noqa: E402
from common import machine, matmul_gflops, table  # noqa: E402
from pretrain_throughput import build, make_batch, model_flops  # noqa: E402

SPEC_PEAK = {"H100": 989e12, "H200": 989e12}  # dense bf16, SXM, per the datasheets
GPU_DATA = HERE.parent / ".gpu"  # sentences.txt, sst2_train.tsv, minilm/ (gpu.sh carries it)


def spec_peak() -> float | None:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((v for k, v in SPEC_PEAK.items() if k in name), None)


# ---------------------------------------------------------------------------------------------
# pre-training


def our_batch(b: dict[str, torch.Tensor], padded: bool = False) -> Batch:
    mask = b["attention_mask"]
    return Batch(
        b["input_ids"],
        b["token_type_ids"],
        mask,
        b["mlm_positions"],
        b["mlm_labels"],
        b["nsp"],
        num_tokens=int(mask.sum()),
        padded=padded,
    )


def our_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """PretrainingTask.loss on one process: MLM mean + NSP mean."""
    mlm_sum, nsp_sum, _ = batch_statistics(model, batch)
    return mlm_sum / (batch.mlm_labels != -100).sum() + nsp_sum / len(batch.nsp_labels)


def steps_of(ours, hf, batch, dev, low_precision_layernorm: bool = False):
    """name -> one optimizer step (forward, loss, backward, AdamW), bf16 autocast; with
    low_precision_layernorm also ours compiled with model.LOW_PRECISION_LAYERNORM on."""
    from bertforge import model as model_module

    opt_ours = build_optimizer(ours, "adamw", 1e-4, 0.01)  # fused on CUDA
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01)  # fused default on CUDA
    ours_compiled = compiled(our_loss)
    hf_compiled = torch.compile(hf)
    ob = our_batch(batch)

    def step(fn, opt):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return run

    def hf_call(m):
        return lambda: (
            m(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                labels=batch["labels"],
                next_sentence_label=batch["nsp"],
            ).loss
        )

    def low(run):  # the switch on for the whole step (a guard of the compiled graph)
        def switched():
            model_module.LOW_PRECISION_LAYERNORM = True
            try:
                run()
            finally:
                model_module.LOW_PRECISION_LAYERNORM = False

        return switched

    fns = {
        "ours": step(lambda: ours_compiled(ours, ob), opt_ours),
        "ours_eager": step(lambda: our_loss(ours, ob), opt_ours),
        "hf_eager": step(hf_call(hf), opt_hf),
        "hf_compiled": step(hf_call(hf_compiled), opt_hf),
    }
    if low_precision_layernorm:
        fns["ours_lp_layernorm"] = low(step(lambda: ours_compiled(ours, ob), opt_ours))
    return fns


def time_steps(fns: dict, rounds: int, per_round: int) -> dict[str, float]:
    """Median seconds per step of each, interleaved rounds, CUDA events."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(per_round):
                fn()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3 / per_round)
    return {k: statistics.median(v) for k, v in times.items()}


def pretrain(dev: torch.device, args: Any, results: dict) -> None:
    peak = spec_peak() or results["matmul_bf16_tflops"] * 1e12
    rows = results.setdefault("pretrain", [])
    for seq, bs in ((128, 256), (512, 64)):
        config, ours, hf = build("base", seq, dev)  # the CPU benchmark's pair
        batch = make_batch(config, bs, seq, dev)
        fns = steps_of(ours, hf, batch, dev, low_precision_layernorm=seq == 128)
        compile_s = {}
        for name, fn in fns.items():  # warm-up: compiles, autotunes, allocates
            t = time.perf_counter()
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            compile_s[name] = round(time.perf_counter() - t, 1)
        step_s = time_steps(fns, args.rounds, args.steps_per_round)
        flops = model_flops(config, bs, seq)
        row = {"seq": seq, "batch": bs, "warmup_s": compile_s}
        for name, s in step_s.items():
            row[f"{name}_tok_s"] = bs * seq / s
            row[f"{name}_mfu"] = flops / s / peak
        row["ours_vs_hf_compiled"] = step_s["hf_compiled"] / step_s["ours"]
        row["ours_vs_hf_eager"] = step_s["hf_eager"] / step_s["ours"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.profile:
            for name in ("ours", "hf_compiled"):
                prof = results.setdefault("profile", {})[f"{name}_seq{seq}"] = profile_step(
                    fns[name]
                )
                print(name, seq, json.dumps(prof["ms_per_step"]), flush=True)
                for ms, k in prof["top"][:12]:
                    print(f"  {ms:8.3f} ms  {k}", flush=True)
        del fns, ours, hf
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# correctness


def mixed_batches(config: BertConfig, n: int, bs: int, seq: int, dev: torch.device):
    """n batches of rows of mixed lengths (each batch's own longest), 15% predicted."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        lengths = torch.randint(seq // 4, seq + 1, (bs,), generator=g)
        T = int(lengths.max())
        ids = torch.randint(1000, config.vocab_size, (bs, T), generator=g)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        ids = ids * mask
        P = round(0.15 * seq)
        pos = torch.stack([torch.randint(1, int(n_) - 1, (P,), generator=g) for n_ in lengths])
        labels = ids.gather(1, pos)
        b = Batch(
            ids,
            torch.zeros_like(ids),
            mask,
            pos,
            labels,
            torch.randint(0, 2, (bs,), generator=g),
            int(mask.sum()),
            bool(mask.numel() > mask.sum()),
        )
        out.append(b.to(dev))
    return out


def check(dev: torch.device, args: Any, results: dict) -> None:
    # BERT-small's shape: the same code paths as base, compiled in a fraction of its time
    config = BertConfig.from_size(
        "small", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    batches = mixed_batches(config, 50, 32, 128, dev)
    from bertforge import model as model_module

    losses = {}
    for name in ("eager", "compiled", "compiled_lp_layernorm"):
        torch.manual_seed(0)
        model = BertForPreTraining(config).to(dev).train()
        opt = build_optimizer(model, "adamw", 1e-4, 0.01)
        fn = our_loss if name == "eager" else compiled(our_loss)
        model_module.LOW_PRECISION_LAYERNORM = name.endswith("lp_layernorm")
        seen = []
        try:
            for b in batches:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = fn(model, b)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                seen.append(loss.detach().float())
        finally:
            model_module.LOW_PRECISION_LAYERNORM = False
        losses[name] = torch.stack(seen).cpu()
    eager = losses["eager"]
    results["check_steps"] = {"steps": 50}
    for name, seen in losses.items():
        if name != "eager":
            rel = ((seen - eager).abs() / eager.abs()).max()
            results["check_steps"][f"max_rel_loss_diff_{name}"] = float(rel)
        results["check_steps"][f"first_last_{name}"] = [float(seen[0]), float(seen[-1])]
    print(json.dumps(results["check_steps"]), flush=True)


# ---------------------------------------------------------------------------------------------
# embeddings


def model_dir(kind: str, root: Path) -> Path:
    """A sentence-transformers directory with all-MiniLM-L6-v2's files, its config (minilm) or
    BERT-base's, and weights drawn with seed 0."""
    import shutil

    from bertforge.model import BertModel

    out = root / kind
    shutil.copytree(GPU_DATA / "minilm", out)
    config = BertConfig.from_pretrained(out) if kind == "minilm" else BertConfig.from_size("base")
    if kind == "floor":  # next to no device work: what the host alone allows
        config = config.replace(
            num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64
        )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)
    return out


def embed(dev: torch.device, args: Any, results: dict) -> None:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from bertforge import model as model_module
    from bertforge.pipelines import Pipeline

    texts = (GPU_DATA / "sentences.txt").read_text().splitlines()[: args.sentences]
    rows = results.setdefault("embed", [])
    root = Path(tempfile.mkdtemp())
    results["embed_host"] = host_floor(texts, root, args.embed_batch)
    print(json.dumps(results["embed_host"]), flush=True)
    for kind in ("minilm", "base"):
        path = model_dir(kind, root)
        st = SentenceTransformer(str(path), device="cuda").to(torch.bfloat16)
        fns: dict[str, Any] = {}
        for bs in (256, 512):  # 128 was slower for both models (H200, 2026-11-27)
            fns[f"st_{bs}"] = lambda bs=bs, st=st: st.encode(texts, batch_size=bs)
        pipe = Pipeline(str(path), device="cuda", precision="bf16", batch_size=args.embed_batch)
        fns["ours"] = lambda pipe=pipe: pipe.embed(texts)

        def ours_padded(pipe=pipe):
            model_module.UNPAD_ON_GPU = False
            try:
                return pipe.embed(texts)
            finally:
                model_module.UNPAD_ON_GPU = True

        fns["ours_padded"] = ours_padded
        pipe.embed(texts[:2000])
        st.encode(texts[:2000], batch_size=256)
        secs: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(2):
            for name, fn in fns.items():
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                secs[name].append(time.perf_counter() - t)
        best = {k: min(v) for k, v in secs.items()}
        st_best = min((v, k) for k, v in best.items() if k.startswith("st_"))
        row = {"model": kind, "sentences": len(texts), "ours_batch": pipe.runner.batch_size}
        row.update({f"{k}_per_s": len(texts) / v for k, v in best.items()})
        row["st_best_batch"] = int(st_best[1].split("_")[1])
        row["ours_vs_st"] = st_best[0] / best["ours"]
        row["ours_padded_vs_st"] = st_best[0] / best["ours_padded"]
        # accuracy: the unpadded bf16 path against padded fp32
        sample = texts[:2000]
        a = np.asarray(pipe.embed(sample))
        fp32 = Pipeline(str(path), device="cuda", precision="fp32", batch_size=args.embed_batch)
        b = np.asarray(fp32.embed(sample))
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        row["cosine_bf16_unpadded_vs_fp32_min"] = float(cos.min())
        row["cosine_bf16_unpadded_vs_fp32_mean"] = float(cos.mean())
        rows.append(row)
        print(json.dumps(row), flush=True)
        fns.clear()
        torch.cuda.empty_cache()


def host_floor(texts: list[str], root: Path, batch: int) -> dict[str, float]:
    """What the host allows on this machine: Pipeline.embed's rate with a model that does next
    to no device work (1 layer of 32), with the next part tokenised in a thread (the default,
    pipelines.PART) and all at once (PART 0); and the seconds of tokenising and cutting the
    sentences into rows."""
    from bertforge import pipelines

    pipe = pipelines.Pipeline(
        str(model_dir("floor", root)), device="cuda", precision="bf16", batch_size=batch
    )
    pipe.embed(texts[:2000])
    default = pipelines.PART
    secs: dict[str, list[float]] = {"floor_per_s": [], "floor_one_part_per_s": []}
    for _ in range(2):
        for key, part in (("floor_per_s", default), ("floor_one_part_per_s", 0)):
            pipelines.PART = part
            torch.cuda.synchronize()
            t = time.perf_counter()
            pipe.embed(texts)
            torch.cuda.synchronize()
            secs[key].append(time.perf_counter() - t)
    pipelines.PART = default
    out = {k: len(texts) / min(v) for k, v in secs.items()}
    t = time.perf_counter()
    pipe.windows(texts, pipe.embedding_settings.max_length, views=False)
    out["tokenise_and_rows_s"] = time.perf_counter() - t
    return out


# ---------------------------------------------------------------------------------------------
# fine-tuning


def finetune(dev: torch.device, args: Any, results: dict) -> None:
    import transformers

    root = Path(tempfile.mkdtemp())
    path = model_dir("base", root)
    train = GPU_DATA / "sst2_train.tsv"
    if args.sst2_rows:
        lines = train.read_text().splitlines()[: args.sst2_rows + 1]
        train = root / "sst2.tsv"
        train.write_text("\n".join(lines) + "\n")
    row: dict[str, Any] = {"rows": len(train.read_text().splitlines()) - 1, "batch": 32}
    variants = [("ours", [])] + (
        [("ours_compiled", ["--compile"])] if args.finetune_compile else []
    )
    for name, flag in variants:
        cmd = [
            sys.executable,
            "-m",
            "bertforge",
            "finetune",
            "--task",
            "sst2",
            "--model",
            str(path),
            "--train",
            str(train),
            "--out",
            str(root / name),
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--lr",
            "2e-5",
            "--precision",
            "bf16",
            "--no-progress",
            flag,
        ]
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        row[f"{name}_s"] = time.perf_counter() - t
        if done.returncode:
            row[f"{name}_error"] = done.stderr[-2000:]
        for metrics in (root / name).rglob("metrics.jsonl"):  # the loop's own training time
            records = [json.loads(x) for x in metrics.read_text().splitlines()]
            row[f"{name}_train_seconds"] = max(r.get("train_seconds", 0) for r in records)
        print(name, row[f"{name}_s"], done.stderr[-500:], flush=True)
    # transformers' Trainer, its default collator (DataCollatorWithPadding with a tokenizer)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    lines = train.read_text().splitlines()[1:]
    pairs = [ln.rsplit("\t", 1) for ln in lines]
    enc = tok([p[0] for p in pairs], truncation=True, max_length=128)
    data = [
        {
            "input_ids": enc["input_ids"][i],
            "token_type_ids": enc["token_type_ids"][i],
            "attention_mask": enc["attention_mask"][i],
            "labels": int(p[1]),
        }
        for i, p in enumerate(pairs)
    ]
    model = transformers.BertForSequenceClassification.from_pretrained(str(path), num_labels=2)
    targs = transformers.TrainingArguments(
        output_dir=str(root / "hf"),
        per_device_train_batch_size=32,
        num_train_epochs=1,
        learning_rate=2e-5,
        bf16=True,
        report_to="none",
        save_strategy="no",
        logging_steps=500,
        disable_tqdm=True,
        weight_decay=0.01,
        warmup_steps=round(0.1 * len(data) / 32),
    )
    trainer = transformers.Trainer(
        model=model, args=targs, train_dataset=data, processing_class=tok
    )
    t = time.perf_counter()
    trainer.train()
    torch.cuda.synchronize()
    row["hf_trainer_s"] = time.perf_counter() - t
    for name, _ in variants:  # whole command / Trainer.train(), and training alone
        row[f"{name}_vs_hf"] = row["hf_trainer_s"] / row[f"{name}_s"]
        if f"{name}_train_seconds" in row:
            row[f"{name}_train_vs_hf"] = row["hf_trainer_s"] / row[f"{name}_train_seconds"]
    results["finetune"] = row
    print(json.dumps(row), flush=True)


# ---------------------------------------------------------------------------------------------
# profile


def profile_step(fn, steps: int = 5) -> dict[str, Any]:
    """Kernel time per step by category, and the top kernels, of one warmed-up step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    cats: dict[str, float] = {}
    top = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us <= 0:
            continue
        name = e.key.lower()
        cat = (  # attention first: cuDNN's flash kernels' names hold "sm90" too
            "attention"
            if any(k in name for k in ("flash", "fmha", "attention", "sdpa"))
            else "gemm"
            if any(k in name for k in ("gemm", "cutlass", "sm90", "nvjet", "matmul"))
            else "triton"
            if "triton" in name
            else "optimizer"
            if "adam" in name or "foreach" in name
            else "copy/memset"
            if any(k in name for k in ("memcpy", "memset", "copy"))
            else "other"
        )
        cats[cat] = cats.get(cat, 0.0) + us / steps / 1e3
        top.append((round(us / steps / 1e3, 3), e.key[:100]))
    top.sort(reverse=True)
    cats["total"] = sum(cats.values())
    return {"ms_per_step": {k: round(v, 3) for k, v in cats.items()}, "top": top[:20]}


SECTIONS = {"pretrain": pretrain, "check": check, "embed": embed, "finetune": finetune}


def markdown(results: dict) -> str:
    lines = [
        f"# GPU comparisons ({results['device']})",
        "",
        f"{results['date']}, torch {results['torch']}, transformers "
        f"{results.get('transformers')}, sentence-transformers "
        f"{results.get('sentence_transformers')}; bf16 matmul "
        f"{results['matmul_bf16_tflops']:.0f} TFLOP/s (8192^3, random data, same run).",
        "",
    ]
    if results.get("pretrain"):
        cols = ["seq", "batch"] + [
            f"{n}_tok_s"
            for n in ("ours", "ours_lp_layernorm", "ours_eager", "hf_eager", "hf_compiled")
        ]
        cols += ["ours_mfu", "ours_lp_layernorm_mfu", "hf_compiled_mfu", "ours_vs_hf_compiled"]
        cols += ["ours_vs_hf_eager"]
        lines += [
            "## Pre-training step (BERT-base, bf16)",
            "",
            "```",
            table(results["pretrain"], cols),
            "```",
            "",
        ]
    if results.get("embed"):
        cols = [
            "model",
            "sentences",
            "ours_per_s",
            "ours_padded_per_s",
            "st_128_per_s",
            "st_256_per_s",
            "st_512_per_s",
            "ours_vs_st",
            "cosine_bf16_unpadded_vs_fp32_min",
        ]
        lines += ["## Embeddings", "", "```", table(results["embed"], cols), "```", ""]
    for key in ("embed_host", "finetune", "check_steps", "errors"):
        if key in results:
            lines += [f"## {key}", "", "```", json.dumps(results[key], indent=1), "```", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="pretrain,check,embed,finetune")
    ap.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="no kernel profile of the pre-training steps",
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps-per-round", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=50_000)
    ap.add_argument(
        "--embed-batch", type=int, default=None, help="rows per batch (default: Pipeline's)"
    )
    ap.add_argument("--sst2-rows", type=int, default=20_000, help="0: all 67,349")
    ap.add_argument(
        "--finetune-compile",
        action="store_true",
        help="also `finetune --compile` (74 s against 19 s eager on 20,000 rows)",
    )
    ap.add_argument("--budget-s", type=float, default=450, help="skip sections after this")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
    }
    for pkg in ("transformers", "sentence_transformers"):
        try:
            results[pkg] = __import__(pkg).__version__
        except Exception as e:
            results[pkg] = f"missing: {e}"
    results["matmul_bf16_tflops"] = matmul_gflops(torch.bfloat16, dev, n=8192) / 1e3
    print(
        json.dumps({k: results[k] for k in ("device", "torch", "matmul_bf16_tflops")}), flush=True
    )
    start = time.perf_counter()
    for name in args.sections.split(","):
        if time.perf_counter() - start > args.budget_s:
            results.setdefault("errors", {})[name] = "skipped: over the time budget"
            continue
        t = time.perf_counter()
        try:
            SECTIONS[name](dev, args, results)
        except Exception:
            results.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
            print(traceback.format_exc(), flush=True)
        results.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 1)
        (out / "gpu.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "gpu.md").write_text(markdown(results))
    if "profile" in results:
        results_md = {k: v["ms_per_step"] for k, v in results["profile"].items()}
        (out / "gpu.md").write_text(
            markdown(results)
            + "## profile (ms per step)\n\n```\n"
            + json.dumps(results_md, indent=1)
            + "\n```\n"
        )
    print((out / "gpu.md").read_text())


if __name__ == "__main__":
    main()
