"""Pre-training step throughput: bertforge against transformers' BertForPreTraining (SDPA).

Identical weights and batches (B x T random token ids, 15% of positions predicted, NSP
labels), one full optimizer step each (forward, loss, backward, AdamW), interleaved
(A B A B ...) in one process; the median step time of each gives tokens/s and the ratio.
MFU is model FLOPs per second (encoder, attention, the MLM head on predicted positions,
counted the same way for both) over the dense matmul GFLOP/s measured in the same run.
Peak memory comes from a separate child process per model: the process's peak resident
set during training steps (VmHWM, reset after the models are built) on CPU,
max_memory_allocated on CUDA.

    python benchmarks/pretrain_throughput.py                      # mini and base, fp32 and bf16
    python benchmarks/pretrain_throughput.py --sizes base --seq 512 --device cuda --precisions bf16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge import BertConfig, BertForPreTraining
from bertforge.tasks.pretraining import masked_lm_loss, next_sentence_loss
from bertforge.train.optim import build_optimizer
from common import machine, matmul_gflops, table, timed, write_results

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_batch(
    config: BertConfig, batch: int, seq: int, device: torch.device, seed: int = 0
) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, config.vocab_size, (batch, seq), generator=g)
    types = torch.zeros_like(ids)
    types[:, seq // 2 :] = 1
    P = round(0.15 * seq)
    positions = (
        torch.stack([torch.randperm(seq - 2, generator=g)[:P] + 1 for _ in range(batch)])
        .sort(1)
        .values
    )
    originals = ids.gather(1, positions)
    ids = ids.scatter(1, positions, 103)  # [MASK]
    labels = torch.full_like(ids, -100).scatter(1, positions, originals)
    nsp = torch.randint(0, 2, (batch,), generator=g)
    out = {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": torch.ones_like(ids),
        "mlm_positions": positions,
        "mlm_labels": originals,
        "labels": labels,
        "nsp": nsp,
    }
    return {k: v.to(device) for k, v in out.items()}


def model_flops(config: BertConfig, batch: int, seq: int) -> float:
    """Useful FLOPs of one training step (3x forward)."""
    H, I, L, V = (
        config.hidden_size,
        config.intermediate_size,
        config.num_hidden_layers,
        config.vocab_size,
    )
    per_layer = seq * (8 * H * H + 4 * H * I + 4 * seq * H)
    P = round(0.15 * seq)
    head = P * (2 * H * H + 2 * H * V) + 2 * H * H
    return 3.0 * batch * (L * per_layer + head)


def build(size: str, seq: int, device: torch.device):
    import transformers

    config = BertConfig.from_size(size, max_position_embeddings=max(512, seq))
    torch.manual_seed(0)
    ours = BertForPreTraining(config)
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        hf = transformers.BertForPreTraining.from_pretrained(tmp, attn_implementation="sdpa")
    return config, ours.to(device).train(), hf.to(device).train()


def steps(config, ours, hf, batch, precision: str, device: torch.device):
    amp = (
        torch.autocast(device.type, dtype=DTYPES[precision])
        if precision != "fp32"
        else contextlib.nullcontext()
    )
    opt_ours = build_optimizer(ours, "adamw", 1e-4, 0.01) if ours is not None else None
    opt_hf = (
        torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01) if hf is not None else None
    )

    def step_ours():
        with amp:
            out = ours(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                mlm_positions=batch["mlm_positions"],
            )
            loss = masked_lm_loss(out.mlm_logits, batch["mlm_labels"]) + next_sentence_loss(
                out.nsp_logits, batch["nsp"]
            )
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_hf():
        with amp:
            out = hf(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                labels=batch["labels"],
                next_sentence_label=batch["nsp"],
            )
        out.loss.backward()
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)

    return step_ours, step_hf


def probe_memory(
    which: str, size: str, batch_size: int, seq: int, precision: str, device: torch.device
) -> float:
    """Peak memory (MB) of a few steps of one model, in this (fresh) process."""
    config, ours, hf = build(size, seq, device)
    model_ours, model_hf = (ours, None) if which == "ours" else (None, hf)
    del ours, hf
    batch = make_batch(config, batch_size, seq, device)
    step_ours, step_hf = steps(config, model_ours, model_hf, batch, precision, device)
    fn = step_ours if which == "ours" else step_hf
    fn()  # first step: optimizer state exists from here on
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) after building
    for _ in range(3):
        fn()
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    status = Path("/proc/self/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM"))) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="mini,base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json")
    ap.add_argument(
        "--probe", nargs=4, metavar=("WHICH", "SIZE", "PRECISION", "SEQ"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.probe:
        which, size, precision, seq = args.probe
        print(
            json.dumps(
                {"peak_mb": probe_memory(which, size, args.batch, int(seq), precision, device)}
            )
        )
        return

    peaks = {p: matmul_gflops(DTYPES[p], device) for p in args.precisions.split(",")}
    print(f"machine: {machine()}")
    print("matmul peak GFLOP/s: " + ", ".join(f"{p} {g:,.0f}" for p, g in peaks.items()))
    rows = []
    for size in args.sizes.split(","):
        config, ours, hf = build(size, args.seq, device)
        batch = make_batch(config, args.batch, args.seq, device)
        flops = model_flops(config, args.batch, args.seq)
        for precision in args.precisions.split(","):
            step_ours, step_hf = steps(config, ours, hf, batch, precision, device)
            for _ in range(2):  # warm up both (allocator, autotuning)
                step_ours()
                step_hf()
            t_ours, t_hf = [], []
            for _ in range(args.rounds):
                for _ in range(args.steps_per_round):
                    t_ours.append(timed(step_ours, device))
                for _ in range(args.steps_per_round):
                    t_hf.append(timed(step_hf, device))
            tokens = args.batch * args.seq
            mo, mh = statistics.median(t_ours), statistics.median(t_hf)
            row = {
                "size": size,
                "precision": precision,
                "seq": args.seq,
                "ours_tok_s": tokens / mo,
                "hf_tok_s": tokens / mh,
                "ratio": mh / mo,
                "ours_mfu": flops / mo / (peaks[precision] * 1e9),
                "hf_mfu": flops / mh / (peaks[precision] * 1e9),
                "ours_step_s": mo,
                "hf_step_s": mh,
            }
            if not args.no_memory:
                for which in ("ours", "hf"):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--device",
                        args.device,
                        "--batch",
                        str(args.batch),
                        "--probe",
                        which,
                        size,
                        precision,
                        str(args.seq),
                    ]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    row[f"{which}_peak_mb"] = json.loads(out.strip().splitlines()[-1])["peak_mb"]
            rows.append(row)
            print(table([row], list(row)), flush=True)
        del ours, hf
    ours_fp32 = {r["size"]: r["ours_tok_s"] for r in rows if r["precision"] == "fp32"}
    for r in rows:
        if r["precision"] == "bf16" and r["size"] in ours_fp32:
            r["bf16_over_our_fp32"] = r["ours_tok_s"] / ours_fp32[r["size"]]
    columns = [
        "size",
        "precision",
        "seq",
        "ours_tok_s",
        "hf_tok_s",
        "ratio",
        "ours_mfu",
        "hf_mfu",
        "ours_peak_mb",
        "hf_peak_mb",
        "bf16_over_our_fp32",
    ]
    print()
    print(table(rows, columns))
    path = write_results(
        "pretrain_throughput" + ("" if args.device == "cpu" else f"_{args.device}"),
        {"machine": machine(), "matmul_gflops": peaks, "batch": args.batch, "rows": rows},
        args.json,
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
