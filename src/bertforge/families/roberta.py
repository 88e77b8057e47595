"""RoBERTa (Liu et al., 2019) and the models built on its code: XLM-RoBERTa, CamemBERT.

BERT's encoder, tensor for tensor, with three differences a checkpoint shows: positions count
from pad_token_id + 1 (the rows before are never read by a real token; 514 rows hold 512
tokens), one segment (type_vocab_size 1), and its own heads: the masked LM under `lm_head`, and
a sequence classifier `classifier.dense` (tanh) + `classifier.out_proj` on <s>'s state, which is
our pooler + classifier under other names (the encoder of RobertaForSequenceClassification has
no pooler of its own). Its tokenizer is byte-level BPE (XLM-RoBERTa, CamemBERT: SentencePiece
Unigram) with <s> A </s></s> B </s> for pairs.
"""

from __future__ import annotations

from dataclasses import replace

from .base import Family, Specials
from .bert import BERT

# the encoder's names are BERT's; the heads are its own
_ENCODER = tuple(e for e in BERT.table if not e[0].startswith(("mlm", "nsp", "classifier", "qa")))
_HEAD_TABLE = (
    (r"mlm\.transform\.(\w+)", ("lm_head.dense.{0}",)),
    (r"mlm\.norm\.(\w+)", ("lm_head.layer_norm.{0}",)),
    (r"mlm\.bias", ("lm_head.bias",)),
    (r"classifier\.(\w+)", ("classifier.{0}",)),
    (r"qa_outputs\.(\w+)", ("qa_outputs.{0}",)),
)

ROBERTA = Family(
    name="roberta",
    display="RoBERTa",
    base="roberta",
    architecture="Roberta",
    prefix="roberta.",
    table=(*_ENCODER, *_HEAD_TABLE),
    heads={
        "SequenceClassification": (
            (r"pooler\.dense\.(\w+)", ("/classifier.dense.{0}",)),
            (r"classifier\.(\w+)", ("classifier.out_proj.{0}",)),
        )
    },
    pretraining_heads=("lm_head.",),
    task_heads=("classifier.", "qa_outputs."),
    ignored=r"(^|\.)(position_ids|token_type_ids)$|^lm_head\.decoder\.weight$",
    aliases={"lm_head.bias": "lm_head.decoder.bias"},
    decoder="lm_head.decoder.weight",
    defaults={"pad_token_id": 1},
    position_offset=True,
    specials=Specials(cls="<s>", sep="</s>", pad="<pad>", unk="<unk>", mask="<mask>", pair_extra=4),
)
XLM_ROBERTA = replace(ROBERTA, name="xlm-roberta", display="XLM-RoBERTa", architecture="XLMRoberta")
CAMEMBERT = replace(ROBERTA, name="camembert", display="CamemBERT", architecture="Camembert")
