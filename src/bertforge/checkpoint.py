"""Checkpoints in the HF layout: config.json + vocab.txt (or tokenizer.json) + model.safetensors.

Reads what users already have: HF checkpoints saved by `BertModel` (no prefix) or by any
`BertFor...` class (`bert.` prefix), `model.safetensors` (also sharded, with
model.safetensors.index.json) or `pytorch_model.bin` (also sharded, with
pytorch_model.bin.index.json; loaded with `weights_only=True`, never a full unpickle),
TF-converted names (`LayerNorm.gamma/beta`), DDP's `module.` prefix. An index's shard names
must lie inside the checkpoint's directory, links followed (fileio.inside). Writes
`model.safetensors` with HF names, so transformers loads our checkpoints too.

Our parameter names differ from HF's (shorter, and one fused `qkv` projection instead of
query/key/value); each family's table in bertforge.families is the whole mapping. Every error names the file and the
tensor: missing files, shapes that do not fit the config (both shapes given), truncated or
corrupt files, a vocab.txt larger than the config's vocab_size.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .config import BertConfig, config_file
from .errors import CheckpointError, CheckpointWarning, FreshWeightsWarning, VocabError
from .families import BODY, FAMILIES, Family, family
from .fileio import atomic_path, files_sha256, inside, read_json
from .hub import resolve
from .tokenizer import VOCAB_FILES, id_count

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
WEIGHTS = (SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX)  # in the order looked for

# Each family's names (our parameter name -> the file's) are in bertforge.families; the file
# prefixes of every family's pre-training heads, for callers that tell them from task heads.
PRETRAINING_HEADS = tuple(sorted({h for f in FAMILIES.values() for h in f.pretraining_heads}))
# a checkpoint must have these; the pooler and heads may be fresh
_REQUIRED = ("embeddings.", "layers.")


def hf_names(ours: str, model_type: str = "bert", architecture: str = "") -> tuple[str, ...]:
    """HF tensor names for one of our parameter names (in file order for fused tensors), in
    the layout of `model_type`'s family, for a model of HF class `architecture` (some families
    name a head's tensors by the head)."""
    try:
        return family(model_type).file_names(ours, architecture)
    except KeyError:
        raise KeyError(f"no HF name for parameter {ours!r}: add it to its family's table") from None


# ------------------------------------------------------------------------------------------------
# Reading files


def weights_files(directory: Path) -> list[Path]:
    for name in WEIGHTS:
        if (directory / name).is_file():
            return _shards(directory, name) if name.endswith(".index.json") else [directory / name]
    raise CheckpointError(f"{directory}: no weights found (looked for {', '.join(WEIGHTS)})")


def _shards(directory: Path, index_name: str) -> list[Path]:
    """The shard files an index names, each kept inside `directory` (fileio.inside)."""
    index = directory / index_name
    try:
        weight_map = read_json(index, CheckpointError)["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index}: not a valid sharded-weights index ({e})") from None
    shards = [inside(directory, name, index, "shard") for name in names]
    missing = [name for name, shard in zip(names, shards) if not shard.is_file()]
    if missing:
        raise CheckpointError(f"{index}: names shard files that are missing: {', '.join(missing)}")
    return shards


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, each finite (check_finite)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except Exception as e:  # SafetensorError, OSError, JSON errors in the header
        size = path.stat().st_size if path.exists() else 0
        raise CheckpointError(
            f"{path}: corrupt or truncated safetensors file ({size} bytes): {e}"
        ) from None
    check_finite(tensors, path)
    return tensors


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The string metadata of a safetensors file's header (no tensor read)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # as read_safetensors
        raise CheckpointError(f"{path}: corrupt or truncated safetensors file: {e}") from None


def read_pickle(path: Path) -> dict[str, torch.Tensor]:
    state = load_torch(path, "a PyTorch state dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state_dict)")
    return state


def load_torch(path: Path, what: str) -> Any:
    """A file of torch.save read with weights_only=True (tensors, numbers, strings and
    containers of them; never a full unpickle), its tensors finite (check_finite); one
    CheckpointError naming the file and `what` it should be when it cannot be read."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for unsafe content, EOFError/RuntimeError if truncated
        raise CheckpointError(f"{path}: cannot read as {what} (weights_only=True): {e}") from None
    check_finite(state, path)
    return state


def check_finite(state: Any, path: Path, name: str = "") -> None:
    """One CheckpointError naming the file and the tensor where a floating tensor in `state`
    (a tensor, or dicts, lists and tuples of them) holds a NaN or an infinity. Every weights
    file is read through here: a damaged one would otherwise run, every output NaN or a
    choice made among NaNs, with no error anywhere."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            bad = state[~torch.isfinite(state)]
            n = bad.numel()
            numbers = "1 number that is" if n == 1 else f"{n:,} numbers that are"
            raise CheckpointError(
                f"{path}: tensor {name!r} has {numbers} not finite ({bad[0].item()}): "
                "the file is damaged, or saved from a run that diverged"
            )
    elif isinstance(state, dict):
        for key, value in state.items():
            check_finite(value, path, f"{name}.{key}" if name else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            check_finite(value, path, f"{name}[{i}]")


def read_tensors(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """All tensors of a checkpoint directory, with the file each came from."""
    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for path in weights_files(directory):
        part = read_safetensors(path) if path.suffix == ".safetensors" else read_pickle(path)
        for name, t in part.items():
            name = _canonical(name)
            tensors[name] = t
            origin[name] = path
    return tensors, origin


def _canonical(name: str) -> str:
    """HF's spelling of a file's tensor name (DDP and TF-conversion leftovers removed)."""
    if name.startswith("module."):
        name = name[len("module.") :]
    if name.endswith((".LayerNorm.gamma", ".LayerNorm.beta")):
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias")
    return name


def _find(name: str, tensors: dict[str, Any], kind: Family) -> str | None:
    """The file's spelling of HF `name`: as is, with or without the encoder's prefix (`bert.`,
    `roberta.`...), or an alias."""
    candidates = [name]
    if name.startswith(kind.prefix):
        candidates.append(name[len(kind.prefix) :])
    elif not name.startswith((*kind.pretraining_heads, *kind.task_heads)):
        candidates.append(kind.prefix + name)
    if name in kind.aliases:
        candidates.append(kind.aliases[name])
    return next((c for c in candidates if c in tensors), None)


def counterpart(name: str, tensors: dict[str, Any], model_type: str = "bert") -> str | None:
    """The name under which `tensors` (another file's, read by read_tensors) holds HF `name`
    of a `model_type` checkpoint, or None: what load_state matches a name by."""
    return _find(name, tensors, family(model_type))


def is_head(name: str, model_type: str = "bert") -> bool:
    """Whether a file's tensor belongs to a head or the pooler (parts a checkpoint may lack, or
    have fresh) rather than the encoder's embeddings and layers, which every one has."""
    return name.startswith(family(model_type).known_heads)


def ignored(name: str, model_type: str = "bert") -> bool:
    """Whether loading ignores a file's tensor of this name (a buffer, a tied decoder)."""
    return bool(re.search(family(model_type).ignored, name))


# ------------------------------------------------------------------------------------------------
# Loading into a model

M = TypeVar("M", bound=nn.Module)

# from_pretrained keyword arguments that change the config rather than go to the model class.
_CONFIG_KEYS = ({f.name for f in fields(BertConfig)} - {"extras"}) | {"num_labels"}


def check_vocab_file(vocab_file: Path, config: BertConfig, config_name: str) -> None:
    """A vocab.txt (or tokenizer.json) with more tokens (its added tokens counted) than the
    embedding matrix has rows cannot work."""
    n = id_count(vocab_file)
    if n is None:
        return  # the weights load without it; the tokenizer names the fault when loaded
    if n > config.vocab_size:
        raise VocabError(
            f"{vocab_file} has {n} tokens but {config_name} says vocab_size={config.vocab_size}: "
            "the vocabulary does not belong to this model"
        )
    if n < config.vocab_size:
        # Padded embedding matrices (vocab_size rounded up for speed) are common and harmless.
        warnings.warn(
            f"{vocab_file} has {n} tokens, fewer than vocab_size={config.vocab_size} in "
            f"{config_name}: the last {config.vocab_size - n} embedding rows are never used",
            CheckpointWarning,
            stacklevel=4,
        )


def load_state(model: nn.Module, tensors: dict[str, torch.Tensor], origin: dict[str, Path]) -> None:
    """Copy a checkpoint's tensors into `model`, mapping names and checking shapes.

    Missing encoder weights are an error; missing pooler or head weights keep their fresh
    initialisation, with a warning that lists them.
    """
    expected = model.state_dict()
    dtype = next(model.parameters()).dtype
    model_type = getattr(getattr(model, "config", None), "model_type", "bert")
    kind = family(model_type)
    architecture = getattr(model, "hf_architecture", "")
    loaded: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    missing: list[tuple[str, str]] = []
    for ours, target in expected.items():
        names = hf_names(ours, model_type, architecture)
        found = [_find(n, tensors, kind) for n in names]
        if any(f is None for f in found):
            missing.append((ours, names[found.index(None)]))
            continue
        rows = target.shape[0] // len(names)
        parts = []
        for f in found:
            assert f is not None
            t = tensors[f]
            want = (rows, *target.shape[1:]) if len(names) > 1 else tuple(target.shape)
            if tuple(t.shape) != tuple(want):
                raise CheckpointError(
                    f"{origin[f]}: tensor {f!r} has shape {tuple(t.shape)} but the config needs "
                    f"{tuple(want)}: " + _mismatch_hint(ours, tuple(t.shape), model)
                )
            if not t.is_floating_point():
                raise CheckpointError(
                    f"{origin[f]}: tensor {f!r} has dtype {t.dtype}, expected floats"
                )
            parts.append(t)
            used.add(f)
        loaded[ours] = (torch.cat(parts) if len(parts) > 1 else parts[0]).to(dtype)

    body_missing = [hf for ours, hf in missing if ours.removeprefix(BODY).startswith(_REQUIRED)]
    if body_missing:
        files = sorted({str(p) for p in origin.values()})
        raise CheckpointError(
            f"{', '.join(files)}: missing {len(body_missing)} encoder tensors, e.g. "
            f"{', '.join(repr(n) for n in body_missing[:5])}: is this a {model_type} checkpoint?"
        )
    if missing:
        fresh = [n for ours in dict(missing) for n in hf_names(ours, model_type, architecture)]
        warnings.warn(
            FreshWeightsWarning(
                f"{len(fresh)} tensors not in the checkpoint, freshly initialised (train "
                f"before use): {', '.join(fresh)}",
                fresh,
            ),
            stacklevel=3,
        )
    _check_tied_decoder(tensors, loaded, model, kind)
    unknown = sorted(
        n
        for n in tensors
        if not (n in used or ignored(n, model_type) or n.startswith(kind.known_heads))
    )
    if unknown:
        warnings.warn(
            f"ignored {len(unknown)} unknown tensors in the checkpoint: {', '.join(unknown[:8])}",
            CheckpointWarning,
            stacklevel=3,
        )
    model.load_state_dict(loaded, strict=False)


def _mismatch_hint(ours: str, found: tuple[int, ...], model: nn.Module) -> str:
    """Why a tensor's shape differs: a classifier sized by num_labels, or the encoder's config."""
    asked = getattr(model, "num_labels", None)
    if ours.startswith("classifier.") and asked is not None:
        return (
            f"the checkpoint's classifier has {found[0]} labels but the model was built with "
            f"num_labels={asked}; pass num_labels={found[0]}, or leave num_labels and id2label "
            "out to use the checkpoint's own labels"
        )
    return "config.json and the weights do not match"


def _check_tied_decoder(
    tensors: dict[str, torch.Tensor], loaded: dict[str, Any], model: nn.Module, kind: Family
) -> None:
    decoder = tensors.get(kind.decoder)
    embeddings = loaded.get("bert.embeddings.word.weight")
    if decoder is None or embeddings is None or not hasattr(model, "mlm"):
        return
    if decoder.shape != embeddings.shape or not torch.equal(
        decoder.to(embeddings.dtype), embeddings
    ):
        warnings.warn(
            f"the checkpoint's {kind.decoder} differs from the word embeddings; "
            f"{kind.architecture} ties them, and bertforge uses the word embeddings",
            CheckpointWarning,
            stacklevel=3,
        )


def load_pretrained(
    cls: type[M],
    path: str | os.PathLike[str],
    *,
    config: BertConfig | None = None,
    **kwargs: Any,
) -> M:
    """`cls(config)` with the weights of an HF-layout checkpoint directory (or hub name).

    Keyword arguments named like a BertConfig field, or `num_labels`, change the config before
    the model is built (as HF's from_pretrained): `num_labels=3` or `id2label={0: ..}` on an
    encoder-only checkpoint gives a fresh head of that size; on a checkpoint with a head of
    another size it is an error naming the tensor. Other keyword arguments go to `cls`.
    """
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in _CONFIG_KEYS}
    directory = resolve(path)
    if not directory.is_dir():
        raise CheckpointError(
            f"{directory}: not a directory (a checkpoint is a directory with "
            "config.json and model.safetensors)"
        )
    if config is None:
        config = BertConfig.from_pretrained(directory)
    if overrides:
        config = config.replace(**overrides)
    vocab_file = next((directory / n for n in VOCAB_FILES if (directory / n).is_file()), None)
    if vocab_file is not None:
        check_vocab_file(vocab_file, config, str(config_file(directory) or directory))
    tensors, origin = read_tensors(directory)
    model = cls(config, **kwargs)  # type: ignore[call-arg]
    load_state(model, tensors, origin)
    return model.eval()


# ------------------------------------------------------------------------------------------------
# Saving


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s parameters under HF names (fused tensors split), as contiguous CPU copies."""
    out: dict[str, torch.Tensor] = {}
    kind = model.config.model_type  # type: ignore[union-attr]
    architecture = getattr(model, "hf_architecture", "")
    for ours, t in model.state_dict().items():
        names = hf_names(ours, kind, architecture)
        for name, part in zip(names, t.detach().chunk(len(names), dim=0)):
            out[name] = part.to("cpu").contiguous().clone()
    return out


def save_pretrained(model: nn.Module, directory: str | os.PathLike[str]) -> None:
    """Write config.json and model.safetensors (HF names; DistilBERT's for a DistilBERT)
    atomically into `directory`."""
    config: BertConfig = model.config  # type: ignore[assignment]
    name = type(model).hf_architecture  # type: ignore[attr-defined]
    kind = config.family
    if kind.name != "bert":
        if getattr(model, "nsp", None) is not None:
            raise CheckpointError(
                f"{kind.architecture} has no next-sentence head: save a BertForMaskedLM"
            )
        name = name.replace("Bert", kind.architecture, 1)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / SAFETENSORS) as tmp:
        save_file(hf_state_dict(model), str(tmp), metadata={"format": "pt"})
    config.save(directory / "config.json", architectures=[name])


class Pretrained:
    """`from_pretrained` / `save_pretrained` for our model classes (HF layout)."""

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        """Load from a checkpoint directory (or hub name); returns the model in eval mode."""
        return load_pretrained(cls, path, **kwargs)  # type: ignore[type-var]

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write config.json and model.safetensors into `directory`."""
        save_pretrained(self, directory)  # type: ignore[arg-type]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # type: ignore[attr-defined]


def load_with_fresh(
    cls: type, path: str | os.PathLike[str], **kwargs: Any
) -> tuple[Any, list[str]]:
    """`cls.from_pretrained(path)` and the names of the tensors the checkpoint lacked (a task
    head, a pooler), for callers that expect them and say so their own way (fine-tuning, the
    pipelines); every other checkpoint warning is passed on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = cls.from_pretrained(path, **kwargs)  # type: ignore[attr-defined]
    fresh: list[str] = []
    for w in caught:
        if isinstance(w.message, FreshWeightsWarning):
            fresh.extend(w.message.names)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return model, fresh


def architectures(path: str | os.PathLike[str]) -> list[str]:
    """The `architectures` a checkpoint's config.json names, as HF's BertFor... class names
    (a DistilBertFor... is read as the BertFor... that bertforge loads it into); none for
    Google's bert_config.json, which names no head."""
    directory = resolve(path)
    found = config_file(directory) or directory / "config.json"  # neither: the error names it
    if found.name != "config.json":
        return []
    names = read_json(found, CheckpointError).get("architectures")
    if not isinstance(names, list):
        return []
    # the family's class prefix read as Bert's (RobertaForMaskedLM: BertForMaskedLM); the longest
    # first, so that XLMRoberta is not read as XLM + Roberta
    prefixes = sorted({f.architecture for f in FAMILIES.values()}, key=len, reverse=True)
    return [re.sub(f"^({'|'.join(prefixes)})For", "BertFor", str(a)) for a in names]


def load_trained(
    cls: type,
    path: str | os.PathLike[str],
    head: str,
    remedy: str = "fine-tune it first, or use a checkpoint that has one",
) -> Any:
    """`cls.from_pretrained(path)` for inference: an error naming `head` and the `remedy` when
    the checkpoint lacks the trained head that `cls` adds, or the pooler that head reads (a
    fresh pooler is fine only where nothing reads it: an encoder's own)."""
    model, fresh = load_with_fresh(cls, path)
    pooler = [n for n in fresh if "pooler" in n or "pre_classifier" in n]
    if len(pooler) < len(fresh):
        raise CheckpointError(f"{path}: has no trained {head}; {remedy}")
    # a head builds a pooler only to read it (sequence classification, multiple choice, NSP);
    # token classification, QA and the masked LM have none, and a bare encoder's is not read
    if pooler and getattr(getattr(model, "bert", None), "pooler", None) is not None:
        files = ", ".join(str(f) for f in weights_files(resolve(path)))
        raise CheckpointError(
            f"{files}: has no pooler ({', '.join(pooler)}), which the {head or 'head'} reads: "
            f"it would run on freshly initialised weights; {remedy}"
        )
    return model


# ------------------------------------------------------------------------------------------------
# Inspecting without loading


def model_identity(path: str | os.PathLike[str]) -> str:
    """sha256 over a model directory's config (config.json, else Google's bert_config.json)
    and weight files (names and bytes): what an index and a summarizer record of the encoder
    they were made with."""
    path = Path(path)
    return files_sha256([config_file(path) or path / "config.json", *weights_files(path)], True)


def parameter_shapes(directory: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every parameter's shape and dtype by its canonical name, read from the weights files'
    headers (a .bin file is read whole, weights only); buffers and ignored names left out."""
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in weights_files(directory):
        if f.suffix == ".safetensors":
            try:
                with safe_open(str(f), framework="pt", device="cpu") as h:
                    for name in h.keys():  # noqa: SIM118
                        sl = h.get_slice(name)
                        shapes[_canonical(name)] = (tuple(sl.get_shape()), sl.get_dtype())
            except Exception as e:
                raise CheckpointError(f"{f}: corrupt or truncated safetensors file: {e}") from None
        else:
            for name, t in read_pickle(f).items():
                shapes[_canonical(name)] = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
    return {n: s for n, s in shapes.items() if not any(ignored(n, t) for t in FAMILIES)}


__all__ = [
    "Pretrained",
    "hf_names",
    "hf_state_dict",
    "load_pretrained",
    "load_state",
    "load_with_fresh",
    "parameter_shapes",
    "save_pretrained",
]
