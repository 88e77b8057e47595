"""BertConfig: the encoder's hyper-parameters, with the field names of HF `config.json`.

Reads HF `config.json` and Google's `bert_config.json` (same names, fewer of them), writes
either, and validates on construction: a wrong value fails with a message naming the field
and the allowed range. Keys we do not use (e.g. `transformers_version`) are kept in `extras`
so that loading and saving a checkpoint does not silently drop them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, check_choice
from .families import Blocks, Family, family
from .fileio import read_json, write_json

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

CONFIG_FILES = ("config.json", "bert_config.json")  # a checkpoint's config, in the order looked for
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

# HF config keys that turn BERT into a decoder: refused when true (older files write them false).
_DECODER_KEYS = ("is_decoder", "add_cross_attention")
# Keys HF writes that carry no information for us; dropped on read so they are not echoed back.
_HF_NOISE = {"model_type", "architectures", "transformers_version", "torch_dtype", "dtype"}

# A family's config keys, defaults and checkpoint names: bertforge.families (one file each).

# HF's `problem_type` values: which loss a sequence-classification head trains with.
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
# HF's number of labels when a config names none (a binary classifier, LABEL_0 / LABEL_1).
DEFAULT_NUM_LABELS = 2
# Fields that are optional (None = absent from config.json) and validated on their own.
_OPTIONAL = ("id2label", "label2id", "problem_type", "classifier_dropout")


def default_labels(num_labels: int) -> dict[int, str]:
    """HF's label names for a head of `num_labels` outputs: {0: 'LABEL_0', ...}."""
    return {i: f"LABEL_{i}" for i in range(num_labels)}


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
    # the family (bertforge.families): "bert", "distilbert", "roberta", "xlm-roberta"...
    model_type: str = "bert"
    sinusoidal_pos_embds: bool = False  # fixed sin/cos positions (DistilBERT's option)
    # Task heads (fine-tuning). Label names as HF stores them: None when the file names none,
    # which HF reads as two labels (see `num_labels`). `label2id` is derived from `id2label`
    # when absent, and must invert it when given.
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # Loss of a sequence-classification head (one of PROBLEM_TYPES); None = chosen from the
    # labels as HF does: regression for num_labels == 1, else by the labels' dtype.
    problem_type: str | None = None
    # Dropout before the classification heads; None = hidden_dropout_prob (as HF).
    classifier_dropout: float | None = None
    # Keys of the source file we do not interpret; written back unchanged.
    extras: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._coerce_and_validate()

    # ----------------------------------------------------------------------------------------
    # validation

    def _coerce_and_validate(self) -> None:
        for f in dataclasses.fields(self):
            if f.name in _OPTIONAL or f.name == "extras":
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
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        family(self.model_type, "config")  # a ConfigError naming the supported ones
        if self.type_vocab_size < (1 if self.family.segments else 0):
            raise ConfigError(f"type_vocab_size={self.type_vocab_size}: must be >= 1")
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
        check_choice("hidden_act", self.hidden_act, ACTIVATIONS)
        blocks = self.blocks  # a ConfigError for a family's key it cannot build
        if blocks.head_act is not None:
            check_choice("classifier_activation", blocks.head_act, ACTIVATIONS)
        if self.position_embedding_type != "absolute":
            raise ConfigError(
                f"position_embedding_type={self.position_embedding_type!r}: only 'absolute' "
                "(BERT's learned positions) is supported"
            )
        if self.max_tokens < 1:
            raise ConfigError(
                f"max_position_embeddings={self.max_position_embeddings}: a {self.model_type} "
                f"counts positions past pad_token_id={self.pad_token_id}, so it needs more than "
                f"{self.pad_token_id + 1}"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(
                f"pad_token_id={self.pad_token_id}: must be in [0, vocab_size={self.vocab_size})"
            )
        self._check_fits_in_memory()
        self._validate_labels()

    def _check_fits_in_memory(self) -> None:
        """A size no machine here can hold (a typo, a crafted config.json: vocab_size 1e9) is an
        error naming the sizes, not an attempt to allocate terabytes."""
        H, L, I = self.hidden_size, self.num_hidden_layers, self.intermediate_size
        rows = self.vocab_size + self.max_position_embeddings + self.type_vocab_size
        params = rows * H + L * (4 * H * H + 2 * H * I)  # embeddings and layers, roughly
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if 4 * params > memory:
            raise ConfigError(
                f"vocab_size={self.vocab_size}, hidden_size={H}, num_hidden_layers={L}, "
                f"intermediate_size={I}, max_position_embeddings={self.max_position_embeddings}:"
                f" about {params / 1e9:,.1f}B parameters, {4 * params / 2**30:,.0f} GiB in fp32; "
                f"this machine has {memory / 2**30:,.0f} GiB"
            )

    def _validate_labels(self) -> None:
        if self.classifier_dropout is not None:
            p = self.classifier_dropout
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
                raise ConfigError(f"classifier_dropout={p!r}: must be None or a number in [0, 1)")
            self.classifier_dropout = float(p)
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ConfigError(
                f"problem_type={self.problem_type!r}: must be None or one of "
                f"{', '.join(PROBLEM_TYPES)}"
            )
        if self.id2label is not None or self.label2id is not None:
            self._validate_label_maps()
        if self.problem_type == "single_label_classification" and self.num_labels == 1:
            raise ConfigError(
                "problem_type='single_label_classification' needs num_labels >= 2, but "
                "id2label names 1 label: use num_labels=2 for a binary classifier, or "
                "problem_type='regression' for one output"
            )

    def _validate_label_maps(self) -> None:
        if self.id2label is None:
            pairs = _label_pairs(self.label2id)
            self.id2label = {i: name for name, i in pairs}
            if len(self.id2label) != len(pairs):
                raise ConfigError(f"label2id={self.label2id!r}: two labels share one id")
        if not isinstance(self.id2label, dict):
            raise ConfigError(f"id2label={self.id2label!r}: must be a mapping id -> name")
        try:
            # JSON object keys are strings: HF writes {"0": "negative", ...}
            id2label = {int(k): str(v) for k, v in self.id2label.items()}
        except (TypeError, ValueError) as e:
            raise ConfigError(f"id2label={self.id2label!r}: keys must be integers ({e})") from None
        if len(id2label) != len(self.id2label):
            raise ConfigError(f"id2label={self.id2label!r}: two keys name the same id")
        self.id2label = id2label
        if not id2label:
            raise ConfigError("id2label={}: must name at least one label")
        if sorted(id2label) != list(range(len(id2label))):
            raise ConfigError(f"id2label={id2label!r}: keys must be 0..{len(id2label) - 1}")
        expected = {name: i for i, name in id2label.items()}
        if len(expected) != len(id2label):
            raise ConfigError(f"id2label={id2label!r}: label names must be unique")
        if self.label2id is not None and dict(_label_pairs(self.label2id)) != expected:
            raise ConfigError(
                f"label2id={self.label2id!r} does not invert id2label={id2label!r}: "
                "they must name the same labels with the same ids"
            )
        self.label2id = expected

    # ----------------------------------------------------------------------------------------
    # derived values

    @property
    def family(self) -> Family:
        """The encoder family (bertforge.families) of model_type."""
        return family(self.model_type)

    @property
    def blocks(self) -> Blocks:
        """How the family's encoder is assembled (families.Blocks), from its config keys."""
        return self.family.blocks(self.num_hidden_layers, self.extras)

    @property
    def max_tokens(self) -> int:
        """The longest row the model reads: its positions (a RoBERTa's past the padding id)."""
        return self.family.max_tokens(self.max_position_embeddings, self.pad_token_id)

    @property
    def num_labels(self) -> int:
        """Outputs of a task head: len(id2label), or HF's default of 2 when no labels are named."""
        return len(self.id2label) if self.id2label is not None else DEFAULT_NUM_LABELS

    @property
    def labels(self) -> dict[int, str]:
        """id2label, or HF's LABEL_i names when the config names none."""
        return dict(self.id2label) if self.id2label is not None else default_labels(self.num_labels)

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some fields changed (validated again).

        Accepts `num_labels` as HF's config does: a count different from the current one (or any
        count when no labels are named) gives the labels LABEL_0..LABEL_{n-1}; with id2label or
        label2id it must agree with them. Changing one of id2label / label2id re-derives the other.
        """
        changes = _resolve_num_labels(self, changes)
        if "id2label" in changes and "label2id" not in changes:
            changes["label2id"] = None
        elif "label2id" in changes and "id2label" not in changes:
            changes["id2label"] = None
        return dataclasses.replace(self, **changes)

    def with_layers(self, layers: list[int] | int) -> BertConfig:
        """The config of a model of some of these layers (a list of their indices: what each
        keeps, e.g. its local or global attention), or of a new count of them (each layer as
        the family's default pattern has it)."""
        extras = dict(self.extras)
        for key in self.family.layer_keys:
            if key in extras:
                if isinstance(layers, int):
                    del extras[key]
                else:
                    extras[key] = [extras[key][i] for i in layers]
        count = layers if isinstance(layers, int) else len(layers)
        return self.replace(num_hidden_layers=count, extras=extras)

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
        model_type = d.get("model_type", "bert")
        kind = family(model_type, source)  # its keys as ours, its defaults and fixed values
        d = {**kind.defaults, **{kind.keys.get(k, k): v for k, v in d.items()}, **kind.fixed}
        d["model_type"] = model_type
        known = {f.name for f in dataclasses.fields(cls)} - {"extras"}
        values = {k: v for k, v in d.items() if k in known}
        # Older files (and hand-written ones) may carry num_labels instead of label names.
        extras = {
            k: v
            for k, v in d.items()
            if k not in known and k not in _HF_NOISE and k != "num_labels"
        }
        decoder = [k for k in _DECODER_KEYS if d.get(k)]
        if decoder:
            # HF's BertModel then attends causally (and to an encoder's states); ours would
            # attend both ways and give other outputs without a word
            raise ConfigError(
                f"{source}: {decoder[0]}={d[decoder[0]]!r}: a BERT decoder (causal attention, "
                "cross-attention) is not supported; bertforge's encoder attends both ways"
            )
        try:
            if "num_labels" in d:
                values = _resolve_num_labels(None, {**values, "num_labels": d["num_labels"]})
            return cls(**values, extras=extras)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> BertConfig:
        """Read HF `config.json` or Google's `bert_config.json`."""
        return cls.from_dict(read_json(path, ConfigError), source=str(path))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> BertConfig:
        """From a checkpoint directory (config.json, else bert_config.json) or a JSON file."""
        path = Path(path)
        if path.is_dir():
            found = config_file(path)
            if found is None:
                raise ConfigError(f"{path}: no config.json or bert_config.json in this directory")
            return cls.from_json_file(found)
        return cls.from_json_file(path)

    # ----------------------------------------------------------------------------------------
    # output

    def to_dict(self, google: bool = False) -> dict[str, Any]:
        """HF `config.json` content, or Google's `bert_config.json` keys with google=True."""
        if google:
            return {k: getattr(self, k) for k in GOOGLE_KEYS}
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extras" or (
                f.name == "sinusoidal_pos_embds" and self.model_type != "distilbert"
            ):
                continue
            value = getattr(self, f.name)
            if f.name in _OPTIONAL and value is None:
                continue  # as HF: absent means "not set"
            if f.name == "id2label":
                value = {str(k): v for k, v in value.items()}  # JSON keys are strings
            d[f.name] = value
        kind = self.family
        if kind.keys or kind.dropped:
            ours = {v: k for k, v in kind.keys.items()}
            d = {ours.get(k, k): v for k, v in d.items() if k not in kind.dropped}
        for k, v in self.extras.items():
            d.setdefault(k, v)
        return d

    def save(self, path: str | os.PathLike[str], google: bool = False, **extra: Any) -> None:
        """Write `config.json` (or Google's format) atomically; `extra` keys are added on top."""
        d = self.to_dict(google=google)
        d.update(extra)
        write_json(path, d)


def config_file(directory: str | os.PathLike[str]) -> Path | None:
    """A checkpoint directory's config: config.json, else Google's bert_config.json (None when
    it has neither)."""
    directory = Path(directory)
    return next((directory / n for n in CONFIG_FILES if (directory / n).is_file()), None)


def _label_pairs(label2id: object) -> list[tuple[str, int]]:
    """label2id's (name, id) pairs as strings and integers, else a ConfigError."""
    if not isinstance(label2id, dict):
        raise ConfigError(f"label2id={label2id!r}: must be a mapping name -> id")
    try:
        return [(str(name), int(i)) for name, i in label2id.items()]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"label2id={label2id!r}: ids must be integers ({e})") from None


def _resolve_num_labels(config: BertConfig | None, changes: dict[str, Any]) -> dict[str, Any]:
    """Turn a `num_labels` entry of `changes` into id2label/label2id, as HF's config does.

    `config` is the config being changed (None when building from a file).
    """
    if "num_labels" not in changes:
        return changes
    changes = dict(changes)
    n = changes.pop("num_labels")
    if n is None:
        return changes
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"num_labels={n!r}: must be an integer >= 1")
    given = changes.get("id2label") or changes.get("label2id")
    if given is not None:
        if len(given) != n:
            field_name = "id2label" if changes.get("id2label") is not None else "label2id"
            raise ConfigError(
                f"num_labels={n} does not match {field_name}, which names {len(given)} labels"
            )
        return changes
    if config is not None and config.id2label is not None and config.num_labels == n:
        return changes  # same count: keep the names
    changes["id2label"] = default_labels(n)
    changes["label2id"] = None
    return changes
