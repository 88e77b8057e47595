"""MPNet (Song et al., 2020): BERT's post-LayerNorm blocks with relative position buckets.

A checkpoint shows four differences from BERT: no segment embeddings; learned absolute positions
counted past the padding id, as RoBERTa's; a table of T5-style relative position buckets (32 of
them, one score per head) shared by every layer and added to each layer's attention scores; and
its own names (`attention.attn.q/k/v/o`, `encoder.relative_attention_bias`). Its heads are
RoBERTa's (`lm_head`; the sequence classifier's `classifier.dense` + `classifier.out_proj`). Its
tokenizer is a WordPiece with <s> A </s></s> B </s>, read by its engine from tokenizer.json.
all-mpnet-base-v2, the most downloaded sentence-transformers model, is one.
"""

from __future__ import annotations

from .base import Family, Specials
from .roberta import ROBERTA

_LAYER = "encoder.layer.{0}."
MPNET = Family(
    name="mpnet",
    display="MPNet",
    base="mpnet",
    architecture="MPNet",
    prefix="mpnet.",
    table=(
        (r"embeddings\.word\.(\w+)", ("embeddings.word_embeddings.{0}",)),
        (r"embeddings\.position\.(\w+)", ("embeddings.position_embeddings.{0}",)),
        (r"embeddings\.norm\.(\w+)", ("embeddings.LayerNorm.{0}",)),
        (r"relative_bias\.(\w+)", ("encoder.relative_attention_bias.{0}",)),
        (
            r"layers\.(\d+)\.attn\.qkv\.(\w+)",
            tuple(_LAYER + f"attention.attn.{x}.{{1}}" for x in "qkv"),
        ),
        (r"layers\.(\d+)\.attn\.out\.(\w+)", (_LAYER + "attention.attn.o.{1}",)),
        (r"layers\.(\d+)\.attn_norm\.(\w+)", (_LAYER + "attention.LayerNorm.{1}",)),
        (r"layers\.(\d+)\.ffn\.up\.(\w+)", (_LAYER + "intermediate.dense.{1}",)),
        (r"layers\.(\d+)\.ffn\.down\.(\w+)", (_LAYER + "output.dense.{1}",)),
        (r"layers\.(\d+)\.ffn_norm\.(\w+)", (_LAYER + "output.LayerNorm.{1}",)),
        (r"pooler\.dense\.(\w+)", ("pooler.dense.{0}",)),
        *(e for e in ROBERTA.table if e[0].startswith(("mlm", "classifier", "qa"))),
    ),
    heads=ROBERTA.heads,
    pretraining_heads=ROBERTA.pretraining_heads,
    task_heads=ROBERTA.task_heads,
    ignored=ROBERTA.ignored,
    aliases=ROBERTA.aliases,
    decoder=ROBERTA.decoder,
    defaults={"pad_token_id": 1, "relative_attention_num_buckets": 32},
    fixed={"type_vocab_size": 0},
    dropped=("type_vocab_size", "position_embedding_type"),
    position_offset=True,
    relative_buckets=True,
    segments=False,
    specials=Specials(cls="<s>", sep="</s>", pad="<pad>", unk="[UNK]", mask="<mask>", pair_extra=4),
)
