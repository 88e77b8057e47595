"""BERT (Devlin et al., 2018) and DistilBERT (Sanh et al., 2019): their checkpoint names.

DistilBERT is BERT's encoder without segment embeddings or pooler (type_vocab_size 0),
LayerNorm eps 1e-12, positions that may be fixed sinusoids, its own config keys, and a
classifier's pre_classifier that is the pooler with ReLU instead of tanh.
"""

from __future__ import annotations

from .base import Family

BERT = Family(
    name="bert",
    display="BERT",
    base="bert",
    architecture="Bert",
    prefix="bert.",
    table=(
        (r"embeddings\.word\.(\w+)", ("embeddings.word_embeddings.{0}",)),
        (r"embeddings\.position\.(\w+)", ("embeddings.position_embeddings.{0}",)),
        (r"embeddings\.token_type\.(\w+)", ("embeddings.token_type_embeddings.{0}",)),
        (r"embeddings\.norm\.(\w+)", ("embeddings.LayerNorm.{0}",)),
        (
            r"layers\.(\d+)\.attn\.qkv\.(\w+)",
            tuple(
                f"encoder.layer.{{0}}.attention.self.{x}.{{1}}" for x in ("query", "key", "value")
            ),
        ),
        (r"layers\.(\d+)\.attn\.out\.(\w+)", ("encoder.layer.{0}.attention.output.dense.{1}",)),
        (r"layers\.(\d+)\.attn_norm\.(\w+)", ("encoder.layer.{0}.attention.output.LayerNorm.{1}",)),
        (r"layers\.(\d+)\.ffn\.up\.(\w+)", ("encoder.layer.{0}.intermediate.dense.{1}",)),
        (r"layers\.(\d+)\.ffn\.down\.(\w+)", ("encoder.layer.{0}.output.dense.{1}",)),
        (r"layers\.(\d+)\.ffn_norm\.(\w+)", ("encoder.layer.{0}.output.LayerNorm.{1}",)),
        (r"pooler\.dense\.(\w+)", ("pooler.dense.{0}",)),
        # pre-training heads
        (r"mlm\.transform\.(\w+)", ("cls.predictions.transform.dense.{0}",)),
        (r"mlm\.norm\.(\w+)", ("cls.predictions.transform.LayerNorm.{0}",)),
        (r"mlm\.bias", ("cls.predictions.bias",)),
        (r"nsp\.(\w+)", ("cls.seq_relationship.{0}",)),
        # fine-tuning heads (same names as HF's)
        (r"classifier\.(\w+)", ("classifier.{0}",)),
        (r"qa_outputs\.(\w+)", ("qa_outputs.{0}",)),
    ),
    pretraining_heads=("cls.",),
    task_heads=("classifier.", "qa_outputs."),
    ignored=r"(^|\.)(position_ids|token_type_ids)$|^(bert\.)?cls\.predictions\.decoder\.weight$",
    aliases={"cls.predictions.bias": "cls.predictions.decoder.bias"},
    decoder="cls.predictions.decoder.weight",
)

# DistilBERT's config.json keys -> ours
DISTILBERT_KEYS = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "activation": "hidden_act",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "seq_classif_dropout": "classifier_dropout",
}

DISTILBERT = Family(
    name="distilbert",
    display="DistilBERT",
    base="bert",
    architecture="DistilBert",
    prefix="distilbert.",
    table=(
        (r"embeddings\.word\.(\w+)", ("embeddings.word_embeddings.{0}",)),
        (r"embeddings\.position\.(\w+)", ("embeddings.position_embeddings.{0}",)),
        (r"embeddings\.norm\.(\w+)", ("embeddings.LayerNorm.{0}",)),
        (
            r"layers\.(\d+)\.attn\.qkv\.(\w+)",
            tuple(f"transformer.layer.{{0}}.attention.{x}_lin.{{1}}" for x in "qkv"),
        ),
        (r"layers\.(\d+)\.attn\.out\.(\w+)", ("transformer.layer.{0}.attention.out_lin.{1}",)),
        (r"layers\.(\d+)\.attn_norm\.(\w+)", ("transformer.layer.{0}.sa_layer_norm.{1}",)),
        (r"layers\.(\d+)\.ffn\.up\.(\w+)", ("transformer.layer.{0}.ffn.lin1.{1}",)),
        (r"layers\.(\d+)\.ffn\.down\.(\w+)", ("transformer.layer.{0}.ffn.lin2.{1}",)),
        (r"layers\.(\d+)\.ffn_norm\.(\w+)", ("transformer.layer.{0}.output_layer_norm.{1}",)),
        (r"pooler\.dense\.(\w+)", ("/pre_classifier.{0}",)),
        (r"mlm\.transform\.(\w+)", ("vocab_transform.{0}",)),
        (r"mlm\.norm\.(\w+)", ("vocab_layer_norm.{0}",)),
        (r"mlm\.bias", ("vocab_projector.bias",)),
        (r"classifier\.(\w+)", ("classifier.{0}",)),
        (r"qa_outputs\.(\w+)", ("qa_outputs.{0}",)),
    ),
    pretraining_heads=("vocab_",),
    task_heads=("classifier.", "qa_outputs.", "pre_classifier."),
    ignored=r"(^|\.)(position_ids|token_type_ids)$|^vocab_projector\.weight$",
    keys=DISTILBERT_KEYS,
    fixed={"type_vocab_size": 0, "layer_norm_eps": 1e-12},
    dropped=("type_vocab_size", "layer_norm_eps", "position_embedding_type"),
    decoder="vocab_projector.weight",
    pooler=False,
    pooler_act="relu",
    segments=False,
)
