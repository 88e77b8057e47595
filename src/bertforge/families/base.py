"""The shape of a family (see the package docstring): its config keys, checkpoint names,
positions and special tokens, as data."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Table = tuple[tuple[str, tuple[str, ...]], ...]  # our name (regex) -> the file's name(s)


@dataclass(frozen=True)
class Specials:
    """A tokenizer's special tokens as its family writes them, and how many a text pair takes
    (BERT's [CLS] A [SEP] B [SEP]: 3; RoBERTa's <s> A </s></s> B </s>: 4)."""

    cls: str = "[CLS]"
    sep: str = "[SEP]"
    pad: str = "[PAD]"
    unk: str = "[UNK]"
    mask: str = "[MASK]"
    pair_extra: int = 3

    @property
    def tokens(self) -> tuple[str, str, str, str, str]:
        """(pad, unk, cls, sep, mask): the order Tokenizer keeps their ids in."""
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


@dataclass(frozen=True)
class Blocks:
    """How a family's encoder is assembled, as its config chooses (BERT's by default): where
    the LayerNorms sit (post-norm; pre-norm with a final norm and none before the first
    attention), the feed-forward (GELU; GeGLU: the up projection gives a value and a gate),
    which projections and norms have biases, the positions (learned; rotary with a base per
    layer), each layer's attention (global: None; local: keys within `window` positions either
    side), and the head over the encoder (its non-linearity, bias, pooling of the tokens
    (cls / mean); whether task heads read each token through it; the decoder's bias)."""

    pre_norm: bool = False
    glu: bool = False
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    rotary: tuple[float, ...] = ()  # one rotary base per layer; () for learned positions
    windows: tuple[int | None, ...] = ()  # per layer; () or None: global attention
    embedding_dropout: float | None = None  # None: hidden_dropout_prob (BERT's)
    head_act: str | None = None  # None: hidden_act
    head_bias: bool = True
    head_norm: bool = False  # the pooler is dense + act + LayerNorm (ModernBERT's head)
    token_head: bool = False  # token and span heads read each token through that head
    pooling: str = "cls"  # what the pooler reads: the first token, or the mean of the tokens
    decoder_bias: bool = True

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s local attention half-width (keys within it either side), or None."""
        return self.windows[layer] if self.windows else None


def bert_blocks(layers: int, extras: dict[str, Any]) -> Blocks:
    """BERT's blocks, whatever the config: post-norm, GELU, biases, learned positions."""
    return Blocks()


@dataclass(frozen=True)
class Family:
    """One encoder family as its checkpoints lay it out (see the module docstring).

    name: config.json's model_type written back; display: the name people write; base: the
    architecture it is built on (pretrain --arch: bert, roberta); architecture: the prefix of transformers'
    class names ("Bert" -> "BertForMaskedLM"); prefix: the encoder's name in a task model's file;
    keys: config.json keys of this family -> ours; defaults: values of keys a file leaves out
    (transformers' defaults for the family); fixed: values the family implies, not in its files;
    dropped: our keys its config.json does not write;
    table: our parameter names -> the file's; heads: per head (the end of an architecture name,
    "SequenceClassification"), entries tried before `table`; pretraining_heads: file prefixes of
    the pre-training heads; task_heads: file prefixes of the task heads; ignored: file tensors
    loading skips (buffers, a decoder tied to the word embeddings); aliases: other spellings
    of a name found in older files; decoder: the tied decoder's name in the file (a warning when
    it is not the word embeddings); position_offset: positions count from pad_token_id + 1 past
    the padding (RoBERTa's), not from 0; relative_buckets: a table of relative position buckets
    (MPNet's) adds a score per head to every layer's attention; pooler: whether the bare encoder has one; pooler_act:
    its non-linearity; segments:
    whether the family has segment embeddings at all; specials: its tokenizer's tokens;
    any_specials: a model of the family may be trained with any tokenizer's special tokens (its
    config names their ids); blocks: the encoder's blocks from the layer count and config keys
    (ModernBERT's choices; a ConfigError for a value it cannot build); layer_keys: config keys
    that list a value per layer (ModernBERT's layer_types), cut with the layers.
    """

    name: str
    display: str
    base: str
    architecture: str
    prefix: str
    table: Table
    pretraining_heads: tuple[str, ...]
    task_heads: tuple[str, ...]
    ignored: str
    keys: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    heads: dict[str, Table] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    decoder: str = ""
    position_offset: bool = False
    relative_buckets: bool = False
    pooler: bool = True
    pooler_act: str = "tanh"
    segments: bool = True
    specials: Specials = Specials()
    any_specials: bool = False
    blocks: Callable[[int, dict[str, Any]], Blocks] = bert_blocks
    layer_keys: tuple[str, ...] = ()

    def compiled(self, head: str = "") -> list[tuple[re.Pattern[str], tuple[str, ...]]]:
        """The name table for a model of architecture ending in `head`, compiled."""
        return _compiled(self, head)

    def file_names(self, ours: str, architecture: str = "") -> tuple[str, ...]:
        """The file's tensor names for our parameter `ours` (in file order for fused tensors),
        in a model of transformers' class `architecture` ("BertForSequenceClassification";
        the head decides a few names in some families)."""
        prefix = ""
        if ours.startswith(BODY):
            prefix, ours = self.prefix, ours[len(BODY) :]
        head = next((h for h in self.heads if architecture.endswith(h)), "")
        for pattern, names in self.compiled(head):
            m = pattern.match(ours)
            if m:
                return tuple(
                    n[1:].format(*m.groups())
                    if n.startswith("/")
                    else prefix + n.format(*m.groups())
                    for n in names
                )
        raise KeyError(f"no {self.name} checkpoint name for parameter {ours!r}")

    @property
    def known_heads(self) -> tuple[str, ...]:
        """File prefixes of the parts a checkpoint may lack or hold unused: heads and pooler."""
        return (*self.pretraining_heads, *self.task_heads, self.prefix + "pooler.", "pooler.")

    def max_tokens(self, max_position_embeddings: int, pad_token_id: int) -> int:
        """The longest row the position table holds: all its positions, or (positions counted
        past the padding id) those after pad_token_id + 1 (RoBERTa's 514 hold 512)."""
        if self.position_offset:
            return max_position_embeddings - pad_token_id - 1
        return max_position_embeddings


BODY = "bert."  # the encoder's name in our task models, whatever the family


_CACHE: dict[tuple[str, str], list[tuple[re.Pattern[str], tuple[str, ...]]]] = {}


def _compiled(family: Family, head: str) -> list[tuple[re.Pattern[str], tuple[str, ...]]]:
    key = (family.name, head)
    if key not in _CACHE:
        table = (*family.heads.get(head, ()), *family.table)
        _CACHE[key] = [(re.compile(p + "$"), names) for p, names in table]
    return _CACHE[key]
