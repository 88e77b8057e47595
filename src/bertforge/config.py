"""BertConfig: the encoder's hyper-parameters, with the field names of HF `config.json`.

Reads HF `config.json` and Google's `bert_config.json` (same names, fewer of them), writes
either, and validates on construction: a wrong value fails with a message naming the field
and the allowed range. Keys we do not use (e.g. `transformers_version`) are kept in `extras`
so that loading and saving a checkpoint does not silently drop them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .fileio import write_json

# The paper's and Google's released sizes: name -> (layers L, hidden H, heads A).
# Feed-forward width is always 4H.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# The keys of Google's bert_config.json, in the order its files use.
GOOGLE_KEYS = (
    "attention_probs_dropout_prob",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
)

# Keys HF writes that carry no information for us; dropped on read so they are not echoed back.
_HF_NOISE = {"model_type", "architectures", "transformers_version", "torch_dtype", "dtype"}


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder (defaults: BERT-base uncased)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    # Task heads (fine-tuning): label names as HF stores them; None for encoders without a head.
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # Keys of the source file we do not interpret; written back unchanged.
    extras: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._coerce_and_validate()

    # ----------------------------------------------------------------------------------------
    # validation

    def _coerce_and_validate(self) -> None:
        for f in dataclasses.fields(self):
            if f.name in ("id2label", "label2id", "extras"):
                continue
            value = getattr(self, f.name)
            if f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    if isinstance(value, float) and value.is_integer():
                        value = int(value)
                        setattr(self, f.name, value)
                    else:
                        raise ConfigError(f"{f.name}={value!r}: must be an integer")
            elif f.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(f"{f.name}={value!r}: must be a number")
                setattr(self, f.name, float(value))
            elif f.type == "str" and not isinstance(value, str):
                raise ConfigError(f"{f.name}={value!r}: must be a string")

        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}: hidden_size must be a multiple "
                "of num_attention_heads (each head gets hidden_size / num_attention_heads dims)"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{name}={p}: must be in [0, 1)")
        if not (self.initializer_range > 0 and math.isfinite(self.initializer_range)):
            raise ConfigError(f"initializer_range={self.initializer_range}: must be > 0")
        if not (0 < self.layer_norm_eps < 1):
            raise ConfigError(f"layer_norm_eps={self.layer_norm_eps}: must be in (0, 1)")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"hidden_act={self.hidden_act!r}: must be one of {', '.join(ACTIVATIONS)}"
            )
        if self.position_embedding_type != "absolute":
            raise ConfigError(
                f"position_embedding_type={self.position_embedding_type!r}: only 'absolute' "
                "(BERT's learned positions) is supported"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(
                f"pad_token_id={self.pad_token_id}: must be in [0, vocab_size={self.vocab_size})"
            )
        self._validate_labels()

    def _validate_labels(self) -> None:
        if self.id2label is None and self.label2id is None:
            return
        if self.id2label is None:
            assert self.label2id is not None
            self.id2label = {i: name for name, i in self.label2id.items()}
        try:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        except (TypeError, ValueError) as e:
            raise ConfigError(f"id2label={self.id2label!r}: keys must be integers ({e})") from None
        if sorted(self.id2label) != list(range(len(self.id2label))):
            raise ConfigError(
                f"id2label={self.id2label!r}: keys must be 0..{len(self.id2label) - 1}"
            )
        expected = {name: i for i, name in self.id2label.items()}
        if len(expected) != len(self.id2label):
            raise ConfigError(f"id2label={self.id2label!r}: label names must be unique")
        if self.label2id is not None and {str(k): int(v) for k, v in self.label2id.items()} != (
            expected
        ):
            raise ConfigError(
                f"label2id={self.label2id!r} does not invert id2label={self.id2label!r}"
            )
        self.label2id = expected

    # ----------------------------------------------------------------------------------------
    # derived values

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 0

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------------------------------
    # construction

    @classmethod
    def from_size(cls, name: str, **overrides: Any) -> BertConfig:
        """One of the named sizes tiny/mini/small/medium/base/large, with optional overrides."""
        if name not in SIZES:
            raise ConfigError(f"model size {name!r}: must be one of {', '.join(SIZES)}")
        layers, hidden, heads = SIZES[name]
        values: dict[str, Any] = {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "intermediate_size": 4 * hidden,
        }
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> BertConfig:
        """Build from a dict with HF / Google key names; unknown keys are kept in `extras`."""
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"extras"}
        values = {k: v for k, v in d.items() if k in known}
        extras = {k: v for k, v in d.items() if k not in known and k not in _HF_NOISE}
        model_type = d.get("model_type", "bert")
        if model_type not in ("bert",):
            # Accept anything BERT-shaped but say so: a RoBERTa config would load wrong weights.
            raise ConfigError(
                f"{source}: model_type={model_type!r}: only 'bert' checkpoints are supported"
            )
        try:
            return cls(**values, extras=extras)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> BertConfig:
        """Read HF `config.json` or Google's `bert_config.json`."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e})") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{path}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}"
            ) from None
        return cls.from_dict(d, source=str(path))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> BertConfig:
        """From a checkpoint directory (config.json, else bert_config.json) or a JSON file."""
        path = Path(path)
        if path.is_dir():
            for name in ("config.json", "bert_config.json"):
                if (path / name).is_file():
                    return cls.from_json_file(path / name)
            raise ConfigError(f"{path}: no config.json or bert_config.json in this directory")
        return cls.from_json_file(path)

    # ----------------------------------------------------------------------------------------
    # output

    def to_dict(self, google: bool = False) -> dict[str, Any]:
        """HF `config.json` content, or Google's `bert_config.json` keys with google=True."""
        if google:
            return {k: getattr(self, k) for k in GOOGLE_KEYS}
        d: dict[str, Any] = {"model_type": "bert"}
        for f in dataclasses.fields(self):
            if f.name == "extras":
                continue
            value = getattr(self, f.name)
            if f.name in ("id2label", "label2id") and value is None:
                continue
            if f.name == "id2label":
                value = {str(k): v for k, v in value.items()}  # JSON keys are strings
            d[f.name] = value
        for k, v in self.extras.items():
            d.setdefault(k, v)
        return d

    def save(self, path: str | os.PathLike[str], google: bool = False, **extra: Any) -> None:
        """Write `config.json` (or Google's format) atomically; `extra` keys are added on top."""
        d = self.to_dict(google=google)
        d.update(extra)
        write_json(path, d)
