"""ModernBERT (Warner et al., 2024): BERT with today's blocks.

Pre-norm layers (no LayerNorm before the first attention; one after the last layer), rotary
positions instead of a position table (a base of 160,000 in the global layers, 10,000 in the
local ones), a GeGLU feed-forward, no biases in the projections or norms, and attention that is
global in one layer of three and local (keys within 64 positions either side) in the others;
8,192 positions. No segments, no pooler in the bare encoder: its task models put a `head`
(dense + GELU + LayerNorm) over the first token or the mean of the tokens for classification,
and over every token for tagging and span QA (whose `classifier` holds the start and end rows).
Its tokenizer is a byte-level BPE with BERT's [CLS] A [SEP] B [SEP]. Config keys read as
transformers' ModernBertConfig reads them (`layer_types` and `rope_parameters`, or the older
`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Blocks, Family

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers' layer_types
# transformers' ModernBertConfig defaults for the keys a file may leave out
THETAS = {GLOBAL: 160_000.0, LOCAL: 10_000.0}
_OLD_THETA_KEYS = {GLOBAL: "global_rope_theta", LOCAL: "local_rope_theta"}
LOCAL_ATTENTION = 128  # the local window, both sides together
GLOBAL_EVERY = 3  # layers 0, 3, 6... attend globally


def modernbert_blocks(layers: int, extras: dict[str, Any]) -> Blocks:
    """ModernBERT's blocks from its config keys (transformers' defaults where absent)."""
    kinds = extras.get("layer_types")
    if kinds is None:
        every = _integer(extras, "global_attn_every_n_layers", GLOBAL_EVERY, 1)
        kinds = [LOCAL if i % every else GLOBAL for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or set(kinds) - {GLOBAL, LOCAL}:
        raise ConfigError(
            f"layer_types={kinds!r}: must list {layers} entries (num_hidden_layers), each "
            f"{GLOBAL!r} or {LOCAL!r}"
        )
    window = _integer(extras, "local_attention", LOCAL_ATTENTION, 2)
    thetas = {kind: _theta(extras, kind) for kind in (GLOBAL, LOCAL)}
    flags = {k: _flag(extras, k, d) for k, d in _FLAGS.items()}
    pooling = extras.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise ConfigError(f"classifier_pooling={pooling!r}: must be 'cls' or 'mean'")
    dropout = extras.get("embedding_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(f"embedding_dropout={dropout!r}: must be a number in [0, 1)")
    return Blocks(
        pre_norm=True,
        glu=True,
        attention_bias=flags["attention_bias"],
        mlp_bias=flags["mlp_bias"],
        norm_bias=flags["norm_bias"],
        rotary=tuple(thetas[k] for k in kinds),
        windows=tuple(None if k == GLOBAL else window // 2 for k in kinds),
        embedding_dropout=float(dropout),
        head_act=str(extras.get("classifier_activation", "gelu")),
        head_bias=flags["classifier_bias"],
        head_norm=True,
        token_head=True,
        pooling=pooling,
        decoder_bias=flags["decoder_bias"],
    )


_FLAGS = {
    "attention_bias": False,
    "mlp_bias": False,
    "norm_bias": False,
    "classifier_bias": False,
    "decoder_bias": True,
}


def _flag(extras: dict[str, Any], key: str, default: bool) -> bool:
    value = extras.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: must be true or false")
    return value


def _integer(extras: dict[str, Any], key: str, default: int, least: int) -> int:
    value = extras.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{key}={value!r}: must be an integer >= {least}")
    return value


def _theta(extras: dict[str, Any], kind: str) -> float:
    """The rotary base of a layer kind: rope_parameters[kind], else the older key, else
    transformers' default; only plain rotary positions ("default") are built."""
    params = (extras.get("rope_parameters") or {}).get(kind) or {}
    kind_of = params.get("rope_type", "default")
    if kind_of != "default":
        raise ConfigError(
            f"rope_parameters.{kind}.rope_type={kind_of!r}: only 'default' rotary positions are "
            "supported"
        )
    theta = params.get("rope_theta", extras.get(_OLD_THETA_KEYS[kind], THETAS[kind]))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ConfigError(f"rope_parameters.{kind}.rope_theta={theta!r}: must be a number > 1")
    return float(theta)


def modernbert_extras(layers: int, cls_id: int, sep_id: int) -> dict[str, Any]:
    """The config keys of a ModernBERT built here (pretrain --arch modernbert): every block
    choice written out, so that transformers builds the same model from the file."""
    return {
        "layer_types": [LOCAL if i % GLOBAL_EVERY else GLOBAL for i in range(layers)],
        "rope_parameters": {
            k: {"rope_type": "default", "rope_theta": t} for k, t in THETAS.items()
        },
        "local_attention": LOCAL_ATTENTION,
        **_FLAGS,
        "classifier_pooling": "mean",
        "classifier_activation": "gelu",
        "embedding_dropout": 0.0,
        "cls_token_id": cls_id,
        "bos_token_id": cls_id,
        "sep_token_id": sep_id,
        "eos_token_id": sep_id,
        "tie_word_embeddings": True,
    }


_LAYER = "layers.{0}."
MODERNBERT = Family(
    name="modernbert",
    display="ModernBERT",
    base="modernbert",
    architecture="ModernBert",
    prefix="model.",
    table=(
        (r"embeddings\.word\.(\w+)", ("embeddings.tok_embeddings.{0}",)),
        (r"embeddings\.norm\.(\w+)", ("embeddings.norm.{0}",)),
        (r"layers\.(\d+)\.attn\.qkv\.(\w+)", (_LAYER + "attn.Wqkv.{1}",)),
        (r"layers\.(\d+)\.attn\.out\.(\w+)", (_LAYER + "attn.Wo.{1}",)),
        (r"layers\.(\d+)\.attn_norm\.(\w+)", (_LAYER + "attn_norm.{1}",)),
        (r"layers\.(\d+)\.ffn\.up\.(\w+)", (_LAYER + "mlp.Wi.{1}",)),
        (r"layers\.(\d+)\.ffn\.down\.(\w+)", (_LAYER + "mlp.Wo.{1}",)),
        (r"layers\.(\d+)\.ffn_norm\.(\w+)", (_LAYER + "mlp_norm.{1}",)),
        (r"final_norm\.(\w+)", ("final_norm.{0}",)),
        # the task models' head over the encoder, outside it in the file
        (r"pooler\.dense\.(\w+)", ("/head.dense.{0}",)),
        (r"pooler\.norm\.(\w+)", ("/head.norm.{0}",)),
        # the masked LM: the same head, then the decoder tied to the word embeddings
        (r"mlm\.transform\.(\w+)", ("head.dense.{0}",)),
        (r"mlm\.norm\.(\w+)", ("head.norm.{0}",)),
        (r"mlm\.bias", ("decoder.bias",)),
        (r"classifier\.(\w+)", ("classifier.{0}",)),
        (r"qa_outputs\.(\w+)", ("classifier.{0}",)),  # start and end: the classifier's 2 rows
    ),
    pretraining_heads=("head.", "decoder."),
    task_heads=("classifier.", "head."),
    ignored=r"(^|\.)(position_ids|token_type_ids)$|^decoder\.weight$",
    decoder="decoder.weight",
    keys={
        "hidden_activation": "hidden_act",
        "norm_eps": "layer_norm_eps",
        "mlp_dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob",
    },
    defaults={  # transformers' ModernBertConfig
        "vocab_size": 50368,
        "hidden_size": 768,
        "intermediate_size": 1152,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "max_position_embeddings": 8192,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 50283,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
    },
    fixed={"type_vocab_size": 0},
    dropped=("type_vocab_size", "position_embedding_type"),
    pooler=False,
    segments=False,
    any_specials=True,
    blocks=modernbert_blocks,
    layer_keys=("layer_types",),
)
