"""`bertforge demo`: what exists, end to end, on text every Python install has.

Steps: gather the stdlib's docstrings -> train a WordPiece vocabulary -> tokenize with offsets
-> build a mini BERT with MLM + NSP heads -> run it on a batch -> save in the HF layout ->
reload and check the outputs are identical -> show what the checkpoint holds.
The same functions as the real commands (`bertforge vocab train`, `bertforge info`).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .config import BertConfig
from .data.stdlib_corpus import stdlib_documents
from .heads import BertForPreTraining, masked_lm_loss
from .tokenizer import Tokenizer, train_vocab


def _say(step: str) -> None:
    print(f"\n== {step}", flush=True)


def run_demo(out: Path, seed: int = 0, vocab_size: int = 8000) -> dict[str, float]:
    """Run the demo, writing into `out`; returns a few numbers for tests."""
    t0 = time.time()
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)

    _say("1. corpus: docstrings of the Python standard library (no download)")
    docs = list(stdlib_documents())
    corpus = out / "stdlib_docstrings.txt"
    # Google's pre-training format: one paragraph per line, a blank line between documents.
    corpus.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    n_chars = corpus.stat().st_size
    print(f"{len(docs):,} documents, {n_chars / 1e6:.1f} MB -> {corpus}")

    _say(f"2. vocabulary: WordPiece, {vocab_size:,} tokens, uncased")
    tok = train_vocab([corpus], vocab_size, show_progress=True)
    print(f"{tok.vocab_size:,} tokens; first learned pieces: {tok.tokens[5:15]}")

    _say("3. tokenize a sentence pair")
    a, b = "The tokenizer splits unaffable words into pieces.", "Offsets point back into the text."
    enc = tok.encode(a, b)
    for token, (s, e), seg in list(zip(enc.tokens, enc.offsets, enc.token_type_ids))[:14]:
        source = (a if seg == 0 else b)[s:e] if e > s else ""
        print(f"  {token:<14} segment {seg}  chars {s:>2}-{e:<2} {source!r}")
    print(f"  decode: {tok.decode(enc.ids)!r}")

    _say("4. a mini BERT (4 layers, hidden 256, 4 heads) with masked-LM and next-sentence heads")
    config = BertConfig.from_size("mini", vocab_size=tok.vocab_size)
    model = BertForPreTraining(config).eval()
    print(f"{model.num_parameters():,} parameters")
    texts = [p for d in docs[:8] for p in d][:8]
    batch = tok(texts, max_length=64)
    with torch.no_grad():
        result = model(**batch)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    loss = masked_lm_loss(result.mlm_logits, labels).item()
    print(
        f"batch {tuple(batch['input_ids'].shape)} -> MLM logits {tuple(result.mlm_logits.shape)}, "
        f"NSP logits {tuple(result.nsp_logits.shape)}"
    )
    print(
        f"untrained MLM loss {loss:.2f} (chance: ln V = {torch.log(torch.tensor(float(tok.vocab_size))):.2f})"
    )

    _say("5. save in the Hugging Face layout, reload, compare")
    model_dir = out / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    again = BertForPreTraining.from_pretrained(model_dir)
    tok2 = Tokenizer.from_pretrained(model_dir)
    with torch.no_grad():
        result2 = again(**tok2(texts, max_length=64))
    diff = (result.mlm_logits - result2.mlm_logits).abs().max().item()
    print(f"{sorted(p.name for p in model_dir.iterdir())}; max |logit difference| = {diff:.1e}")

    _say("6. what the checkpoint holds (bertforge info)")
    from .cli import main as cli_main

    cli_main(["info", str(model_dir)])

    elapsed = time.time() - t0
    print(f"\ndone in {elapsed:.0f} s. Next steps with your own data:")
    print("  bertforge vocab train YOUR_TEXT_FILES --size 30522 --out my-vocab")
    print(f"  bertforge info {model_dir}")
    print("  python -c \"from bertforge import BertModel; BertModel.from_pretrained('DIR')\"")
    return {"mlm_loss": loss, "reload_diff": diff, "seconds": elapsed}
