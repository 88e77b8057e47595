"""Encoder families: what sets one apart from BERT, written once per family as data.

A family is read from config.json's `model_type`. Its own small file says what is its own and
nothing else: the config keys it spells differently, the names of its tensors in a checkpoint
(per head where a head is laid out its own way), where its positions start and what its
tokenizer's special tokens are. The encoder (model.py), the loader (checkpoint.py) and the
tokenizer read these fields; none of them holds a copy per family.

    bert.py      BERT (model_type "bert") and DistilBERT ("distilbert")
    roberta.py   RoBERTa ("roberta"), XLM-RoBERTa ("xlm-roberta"), CamemBERT ("camembert")
    mpnet.py     MPNet ("mpnet"): relative position buckets
    modernbert.py  ModernBERT ("modernbert"): pre-norm, rotary, GeGLU, local attention

What a family assembles differently (where the norms sit, the positions, the feed-forward,
biases, local attention, the head) is its `blocks` (base.Blocks), read from its config keys.

A checkpoint name table maps our parameter names (regexes over the names under a task model's
`bert.`) to the file's names; several file names are concatenated along dim 0 (the fused qkv);
a file name starting with "/" sits at the file's top level, outside the encoder's prefix.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import BODY, Blocks, Family, Specials, Table
from .bert import BERT, DISTILBERT
from .modernbert import MODERNBERT
from .mpnet import MPNET
from .roberta import CAMEMBERT, ROBERTA, XLM_ROBERTA

FAMILIES = {
    f.name: f for f in (BERT, DISTILBERT, ROBERTA, XLM_ROBERTA, CAMEMBERT, MPNET, MODERNBERT)
}
MODEL_TYPES = tuple(FAMILIES)


def family(model_type: str, source: str = "config") -> Family:
    """The family of a config.json `model_type`; one ConfigError naming those supported."""
    found = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise ConfigError(
            f"{source}: model_type={model_type!r} is not supported; bertforge reads "
            f"{', '.join(MODEL_TYPES)}"
        )
    return found


__all__ = ["BODY", "FAMILIES", "MODEL_TYPES", "Blocks", "Family", "Specials", "Table", "family"]
