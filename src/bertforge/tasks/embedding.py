"""Sentence embeddings: token states pooled into one vector, the way the model directory says.

A sentence-transformers model directory says how its vectors are made: modules.json lists the
modules (Transformer, Pooling, Normalize), 1_Pooling/config.json the pooling, and
sentence_bert_config.json the max_seq_length (sentence-transformers 6 leaves it out: then
tokenizer_config.json's model_max_length, as sentence-transformers reads it). Every module
path is confined to the directory (fileio.inside). `settings` reads them, so `bertforge embed MODEL`
gives the vectors `SentenceTransformer(MODEL).encode` gives; a plain BERT directory gets mean
pooling, not normalised, the model's own length. `pool` is sentence-transformers' Pooling for
right-padded rows: several modes are concatenated in sentence-transformers' order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..fileio import inside, read_json, write_json

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
# sentence-transformers' names for ours: 1_Pooling/config.json's pooling_mode (v5+) and its
# older flag, in the order sentence-transformers concatenates the modes
_ST_NAMES = {
    "cls": ("cls", "pooling_mode_cls_token"),
    "max": ("max", "pooling_mode_max_tokens"),
    "mean": ("mean", "pooling_mode_mean_tokens"),
    "mean_sqrt_len": ("mean_sqrt_len_tokens", "pooling_mode_mean_sqrt_len_tokens"),
    "weightedmean": ("weightedmean", "pooling_mode_weightedmean_tokens"),
    "lasttoken": ("lasttoken", "pooling_mode_lasttoken"),
}
_ST_MODES = {mode: ours for ours, (mode, _) in _ST_NAMES.items()}
_ST_FLAGS = {flag: ours for ours, (_, flag) in _ST_NAMES.items()}


@dataclass(frozen=True)
class Embedding:
    """How a model's sentence vectors are made."""

    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_length: int | None = None  # pieces per window (None: the model's)
    source: str = "no sentence-transformers modules.json: mean pooling, not normalised"


def settings(path: str | os.PathLike[str]) -> Embedding:
    """The embedding settings of a model directory (see the module docstring)."""
    path = Path(path)
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Embedding()
    modules = _modules(path)
    pooling, normalize = ("mean",), False
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Transformer" and m.get("path", "") not in ("", "."):
            raise CheckpointError(
                f"{modules_file}: the Transformer module lives in {m['path']!r}; "
                f"pass {path / str(m['path'])} as the model"
            )
        if kind == "Pooling":
            pooling = _pooling(_module_file(path, m, "config.json"))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise CheckpointError(
                f"{modules_file}: module {m.get('type')!r} is not supported (bertforge embeds with "
                "Transformer, Pooling and Normalize modules only)"
            )
    return Embedding(pooling, normalize, _max_seq_length(path), f"{modules_file}")


def _modules(path: Path) -> list[dict[str, object]]:
    """modules.json's modules, each one's folder checked to lie inside `path` (links followed),
    so a crafted file can make bertforge neither read nor (write_layout) write elsewhere."""
    modules_file = path / "modules.json"
    modules = read_json(modules_file, CheckpointError, obj=False)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{modules_file}: expected a list of modules")
    for m in modules:
        inside(path, str(m.get("path", "")), modules_file, "module path")
    return modules


def _module_file(directory: Path, module: dict[str, object], name: str) -> Path:
    """`name` in a module's folder of `directory`, kept inside it (a link there is checked)."""
    folder = str(module.get("path", ""))
    return inside(directory, os.path.join(folder, name), directory / "modules.json", "module file")


def _max_seq_length(path: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length; sentence-transformers 6 leaves it out and
    keeps the length as tokenizer_config.json's model_max_length, so that is read next."""
    for name, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        config = read_json(path / name, CheckpointError) if (path / name).is_file() else {}
        if key in config:
            value = config[key]
            # HF writes a huge number for "no limit": the model's own length then
            return value if isinstance(value, int) and 2 < value < 10**9 else None
    return None


def write_layout(source: str | os.PathLike[str], out: str | os.PathLike[str], width: int) -> None:
    """Give the model in `out` the sentence-transformers modules of `source` (modules.json,
    each module's config, sentence_bert_config.json), so it embeds as `source` does; nothing
    when `source` has none. `width`: the model's hidden size (the Pooling config names it).
    Module folders are the ones modules.json names, inside `source` and `out` both."""
    source, out = Path(source), Path(out)
    if not (source / "modules.json").is_file():
        return
    settings(source)  # the source's modules are ones bertforge reads
    modules = _modules(source)
    write_json(out / "modules.json", modules)
    for m in modules:
        path = str(m.get("path", ""))
        if path and _module_file(source, m, "config.json").is_file():
            config = read_json(_module_file(source, m, "config.json"), CheckpointError)
            for key in ("word_embedding_dimension", "embedding_dimension"):
                if key in config:
                    config[key] = width
            target = _module_file(out, m, "config.json")
            target.parent.mkdir(parents=True, exist_ok=True)
            write_json(target, config)
    for name in ("sentence_bert_config.json", "config_sentence_transformers.json"):
        if (source / name).is_file():
            write_json(out / name, read_json(source / name, CheckpointError))


def write_default_layout(out: str | os.PathLike[str], width: int) -> None:
    """sentence-transformers modules for a model trained as a bi-encoder from a directory that
    had none: Transformer, mean Pooling, Normalize (what retrieval training uses)."""
    out = Path(out)
    kinds = ("Transformer", "Pooling", "Normalize")
    paths = ("", "1_Pooling", "2_Normalize")
    modules = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{k}"}
        for i, (k, p) in enumerate(zip(kinds, paths))
    ]
    write_json(out / "modules.json", modules)
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "2_Normalize").mkdir(exist_ok=True)
    write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": width,
            **{k: k == "pooling_mode_mean_tokens" for k in _ST_FLAGS},
        },
    )


def _pooling(config_file: Path) -> tuple[str, ...]:
    config = read_json(config_file, CheckpointError)
    mode = config.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode)
        unknown = [m for m in modes if m not in _ST_MODES]
        if unknown or not modes:
            raise CheckpointError(
                f"{config_file}: pooling_mode {mode!r} is not one of {', '.join(_ST_MODES)}"
            )
        found = {_ST_MODES[m] for m in modes}
    else:
        found = {ours for key, ours in _ST_FLAGS.items() if config.get(key)}
    return tuple(m for m in _ST_NAMES if m in found) or ("mean",)


def pool(h: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """h (B, T, H) token states of right-padded rows, mask (B, T) 1 = real token ->
    (B, H * len(modes)) in fp32: each mode's vector, concatenated in the given order."""
    h = h.float()
    m = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    count = m.sum(1).clamp(min=1e-9)  # (B, 1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(h[:, 0])
        elif mode == "max":
            out.append(h.masked_fill(m == 0, -torch.inf).amax(1))
        elif mode in ("mean", "mean_sqrt_len"):
            out.append((h * m).sum(1) / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":
            w = m * torch.arange(1, h.shape[1] + 1, dtype=h.dtype, device=h.device).view(1, -1, 1)
            out.append((h * w).sum(1) / w.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = (mask.sum(1) - 1).clamp(min=0)  # right padding: the last real token
            out.append(h[torch.arange(h.shape[0], device=h.device), last])
        else:
            raise ValueError(f"unknown pooling {mode!r}")  # callers check against POOLINGS
    return torch.cat(out, -1)


class RunningPool:
    """`pool` of one sequence whose token states come in parts, in any order, each token once
    with its position: a long text's windows, pooled as they come (Pipeline.embed) instead of
    stitched first, so memory is O(H) however long the text. Sums run in float64, so the vector
    is `pool`'s of the whole sequence up to `pool`'s own fp32 rounding."""

    def __init__(self, modes: tuple[str, ...], length: int) -> None:
        self.modes, self.length = modes, length  # length: tokens in the whole sequence
        self.parts: dict[str, torch.Tensor] = {}  # running sum, weighted sum, max; cls, last
        self.weights = 0.0  # weightedmean's denominator: the sum of (position + 1)

    def add(self, h: torch.Tensor, positions: torch.Tensor) -> None:
        """h (t, H): the states of the tokens at `positions` (t,) of the sequence (from 0)."""
        if not len(h):
            return
        h = h.float()
        h64 = h.double()
        w = positions.to(h64) + 1  # weightedmean: the token at position p weighs p + 1
        for key, value in (("sum", h64.sum(0)), ("weighted", w @ h64), ("max", h.amax(0))):
            old = self.parts.get(key)
            if old is None:
                self.parts[key] = value
            else:
                self.parts[key] = torch.maximum(old, value) if key == "max" else old + value
        self.weights += float(w.sum())
        for key, at in (("cls", 0), ("last", self.length - 1)):
            hit = (positions == at).nonzero().flatten().tolist()
            if hit:
                self.parts[key] = h[hit[0]]

    def vector(self) -> torch.Tensor:
        """(H * len(modes),) fp32, the modes concatenated as `pool` does; once every token of
        the sequence is in."""
        p, n = self.parts, self.length
        by_mode = {
            "cls": p["cls"],
            "max": p["max"],
            "mean": p["sum"] / n,
            "mean_sqrt_len": p["sum"] / n**0.5,
            "weightedmean": p["weighted"] / self.weights,
            "lasttoken": p["last"],
        }
        return torch.cat([by_mode[mode].float() for mode in self.modes])
