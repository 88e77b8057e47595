"""Sentence embeddings: token states pooled into one vector, the way the model directory says.

A sentence-transformers model directory says how its vectors are made: modules.json lists the
modules (Transformer, Pooling, Normalize), 1_Pooling/config.json the pooling, and
sentence_bert_config.json the max_seq_length (sentence-transformers 6 leaves it out: then
tokenizer_config.json's model_max_length, as sentence-transformers reads it). Every module
path is confined to the directory (fileio.inside). `settings` reads them, so `bertforge embed MODEL`
gives the vectors `SentenceTransformer(MODEL).encode` gives; a plain BERT directory gets mean
pooling, not normalised, the model's own length. `pool` is sentence-transformers' Pooling for
right-padded rows: several modes are concatenated in sentence-transformers' order.

The rest of what `SentenceTransformer.encode` does with a directory lives here too, for the
pipeline, the CLI, and later the server and the index: the prompts of
config_sentence_transformers.json (`prompt_text`; the Pooling's include_prompt: `pool`'s
`skip`), Matryoshka truncation (`check_dimensions`), and `quantize`, bit for bit
sentence-transformers' quantize_embeddings on numpy arrays.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .errors import CheckpointError, ConfigError, DataError, InputError, check_choice
from .fileio import inside, read_json, write_json

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
# sentence-transformers' names for ours: 1_Pooling/config.json's pooling_mode (v5+) and its
# older flag, in the order sentence-transformers concatenates the flags' modes
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
# SentenceTransformer's own prompt names, empty unless the model gives them (sentence-transformers
# 6), so that prompt_name="query" / "document" is valid for every model
ST_PROMPTS = {"query": "", "document": ""}
# quantize's precisions: sentence-transformers' names (encode(precision=...))
EMBEDDING_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


@dataclass(frozen=True)
class Embedding:
    """How a model's sentence vectors are made."""

    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_length: int | None = None  # pieces per window (None: the model's)
    source: str = "no sentence-transformers modules.json: mean pooling, not normalised"
    # config_sentence_transformers.json's prompts (name -> text put before every input), with
    # ST_PROMPTS; the one applied when none is asked for; whether pooling counts its tokens
    prompts: dict[str, str] = field(default_factory=lambda: dict(ST_PROMPTS))
    default_prompt_name: str | None = None
    include_prompt: bool = True


def settings(path: str | os.PathLike[str]) -> Embedding:
    """The embedding settings of a model directory (see the module docstring)."""
    path = Path(path)
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Embedding()
    modules = _modules(path)
    (pooling, include_prompt), normalize = (("mean",), True), False
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Transformer" and m.get("path", "") not in ("", "."):
            raise CheckpointError(
                f"{modules_file}: the Transformer module lives in {m['path']!r}; "
                f"pass {path / str(m['path'])} as the model"
            )
        if kind == "Pooling":
            pooling, include_prompt = _pooling(_module_file(path, m, "config.json"))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise CheckpointError(
                f"{modules_file}: module {m.get('type')!r} is not supported (bertforge embeds with "
                "Transformer, Pooling and Normalize modules only)"
            )
    prompts, default = _prompts(path / "config_sentence_transformers.json")
    max_length = _max_seq_length(path)
    return Embedding(
        pooling, normalize, max_length, f"{modules_file}", prompts, default, include_prompt
    )


def _prompts(config_file: Path) -> tuple[dict[str, str], str | None]:
    """config_sentence_transformers.json's prompts (with ST_PROMPTS) and default_prompt_name,
    as SentenceTransformer reads them: a null prompt is an empty one (its None placeholder);
    any other text that is not a string, or a default that names no prompt, is refused."""
    config = read_json(config_file, CheckpointError) if config_file.is_file() else {}
    given = config.get("prompts") or {}
    if not isinstance(given, dict):
        raise CheckpointError(f"{config_file}: prompts must be an object of name: text")
    bad = [name for name, text in given.items() if text is not None and not isinstance(text, str)]
    if bad:
        raise CheckpointError(f"{config_file}: prompt {bad[0]!r} is not a string")
    prompts = {**ST_PROMPTS, **{name: text or "" for name, text in given.items()}}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"{config_file}: default_prompt_name {default!r} is not one of its prompts "
            f"({', '.join(prompts)})"
        )
    return prompts, default


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


def _pooling(config_file: Path) -> tuple[tuple[str, ...], bool]:
    """The Pooling's modes, in the order sentence-transformers concatenates them (pooling_mode's
    own; the older flags' fixed order), and its include_prompt."""
    config = read_json(config_file, CheckpointError)
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise CheckpointError(f"{config_file}: include_prompt {include_prompt!r} is not true/false")
    mode = config.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode)
        unknown = [m for m in modes if m not in _ST_MODES]
        if unknown or not modes:
            raise CheckpointError(
                f"{config_file}: pooling_mode {mode!r} is not one of {', '.join(_ST_MODES)}"
            )
        # sentence-transformers 6 concatenates a list's modes in the list's order
        return tuple(_ST_MODES[m] for m in modes), include_prompt
    found = {ours for key, ours in _ST_FLAGS.items() if config.get(key)}
    return tuple(m for m in _ST_NAMES if m in found) or ("mean",), include_prompt


def pool(
    h: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...], skip: int = 0
) -> torch.Tensor:
    """h (B, T, H) token states of right-padded rows, mask (B, T) 1 = real token ->
    (B, H * len(modes)) in fp32: each mode's vector, concatenated in the given order.
    skip: the rows' first `skip` tokens are left out ([CLS] and a prompt's pieces, where the
    Pooling says include_prompt: false), as sentence-transformers masks them: cls is then the
    first token after them; weightedmean keeps the others' weights (position + 1)."""
    h = h.float()
    last = (mask.sum(1) - 1).clamp(min=0)  # (B,) right padding: the last real token
    if skip:
        mask = mask.clone()
        mask[:, :skip] = 0
    m = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    count = m.sum(1).clamp(min=1e-9)  # (B, 1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(h[:, min(skip, h.shape[1] - 1)])
        elif mode == "max":
            out.append(h.masked_fill(m == 0, -torch.inf).amax(1))
        elif mode in ("mean", "mean_sqrt_len"):
            out.append((h * m).sum(1) / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":
            w = m * torch.arange(1, h.shape[1] + 1, dtype=h.dtype, device=h.device).view(1, -1, 1)
            out.append((h * w).sum(1) / w.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":
            out.append(h[torch.arange(h.shape[0], device=h.device), last])
        else:
            raise ValueError(f"unknown pooling {mode!r}")  # callers check against POOLINGS
    return torch.cat(out, -1)


class RunningPool:
    """`pool` of one sequence whose token states come in parts, in any order, each token once
    with its position: a long text's windows, pooled as they come (Pipeline.embed) instead of
    stitched first, so memory is O(H) however long the text. Sums run in float64, so the vector
    is `pool`'s of the whole sequence up to `pool`'s own fp32 rounding. skip: as `pool`'s."""

    def __init__(self, modes: tuple[str, ...], length: int, skip: int = 0) -> None:
        self.modes, self.length = modes, length  # length: tokens in the whole sequence
        self.skip = min(skip, length - 1)  # (pool's index for cls, clamped the same way)
        self.parts: dict[str, torch.Tensor] = {}  # running sum, weighted sum, max; cls, last
        self.weights = 0.0  # weightedmean's denominator: the sum of (position + 1)

    def add(self, h: torch.Tensor, positions: torch.Tensor) -> None:
        """h (t, H): the states of the tokens at `positions` (t,) of the sequence (from 0)."""
        for key, at in (("cls", self.skip), ("last", self.length - 1)):
            hit = (positions == at).nonzero().flatten().tolist()
            if hit:
                self.parts[key] = h[hit[0]].float()
        if skip := self.skip:
            kept = positions >= skip
            h, positions = h[kept], positions[kept]
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

    def vector(self) -> torch.Tensor:
        """(H * len(modes),) fp32, the modes concatenated as `pool` does; once every token of
        the sequence is in."""
        p, n = self.parts, self.length - self.skip
        by_mode = {
            "cls": p["cls"],
            "max": p["max"],
            "mean": p["sum"] / n,
            "mean_sqrt_len": p["sum"] / n**0.5,
            "weightedmean": p["weighted"] / self.weights,
            "lasttoken": p["last"],
        }
        return torch.cat([by_mode[mode].float() for mode in self.modes])


def prompt_text(own: Embedding, prompt_name: str | None = None, prompt: str | None = None) -> str:
    """The text put before every input, as SentenceTransformer.encode resolves it: `prompt`
    itself (a literal; "" for none), else the model's prompt `prompt_name`, else its
    default_prompt_name's, else none (""). Giving both is an error (sentence-transformers
    would ignore prompt_name with a warning)."""
    if prompt is not None and prompt_name is not None:
        raise ConfigError("give prompt (--prompt) or prompt_name (--prompt-name), not both")
    if prompt is not None:
        return prompt
    name = own.default_prompt_name if prompt_name is None else prompt_name
    if name is None:
        return ""
    if name not in own.prompts:
        raise ConfigError(
            f"prompt_name={name!r} (--prompt-name): this model's prompts are "
            f"{', '.join(own.prompts)} ({own.source})"
        )
    return own.prompts[name]


DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # encode_document's names, in its order


def role_prompt(own: Embedding, role: str) -> str:
    """The prompt of a search's queries ("query") or documents ("document"), as
    sentence-transformers' encode_query / encode_document choose it, except that an empty
    prompt is passed over: queries take the model's "query" prompt, else its default one;
    documents the first of "document", "passage", "corpus" that the model gives, else none
    (never the default, which is a query's prompt in models that have both: E5's "query: ").
    sentence-transformers 6 stops at its own empty "document" and so gives a model's
    "passage: " prompt to nobody."""
    if role == "query":
        return own.prompts.get("query") or prompt_text(own)
    return next((own.prompts[n] for n in DOCUMENT_PROMPTS if own.prompts.get(n)), "")


def check_dimensions(dimensions: int | None, width: int) -> None:
    """A ConfigError unless dimensions (a Matryoshka truncation) is None or in 1..width."""
    ok = isinstance(dimensions, int) and not isinstance(dimensions, bool) and dimensions >= 1
    if dimensions is not None and not (ok and dimensions <= width):
        raise ConfigError(
            f"dimensions={dimensions!r} (--dimensions): must be 1..{width}, the width of this "
            "model's embeddings"
        )


def shortened(vectors: np.ndarray, dimensions: int | None, normalized: bool) -> np.ndarray:
    """The first `dimensions` of each vector (Matryoshka; None: all), made unit length again
    when the vectors are normalised (the same whether they were normalised before the cut or
    after it), so that dot products stay cosines."""
    out = np.ascontiguousarray(vectors[..., :dimensions], np.float32)
    if normalized:
        out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


def read_calibration(path: str | os.PathLike[str], width: int) -> np.ndarray:
    """Calibration embeddings (N >= 2, width) float, from a .npy file (no pickle): the
    int8/uint8 buckets' ends are their per-dimension min and max; a file of anything else is
    one DataError naming it."""
    try:
        reference = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:  # missing, not a .npy, or a pickled object array
        raise DataError(f"{path}: not a readable .npy array ({e})") from None
    floats = isinstance(reference, np.ndarray) and reference.dtype.kind == "f"
    if not floats or reference.ndim != 2 or len(reference) < 2 or reference.shape[1] != width:
        held = f"{reference.dtype} {reference.shape}" if isinstance(reference, np.ndarray) else ""
        raise DataError(
            f"{path}: calibration embeddings must be floats of shape (N >= 2, {width}), the "
            f"width written; it holds {held or 'no single array'}"
        )
    return reference


def quantization_ranges(calibration: np.ndarray) -> np.ndarray:
    """(2, D): the per-dimension minimum and maximum of calibration embeddings (N, D), the
    int8/uint8 buckets' ends (sentence-transformers' _get_quantization_ranges)."""
    calibration = np.asarray(calibration)
    if calibration.ndim != 2 or len(calibration) < 2:
        raise InputError(
            f"int8/uint8 quantisation takes its buckets from several embeddings, got an array "
            f"of shape {calibration.shape}: pass ranges or calibration embeddings (bertforge "
            "embed: --calibration FILE.npy)"
        )
    return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def quantize(
    vectors: np.ndarray,
    precision: str,
    ranges: np.ndarray | None = None,
    calibration: np.ndarray | None = None,
) -> np.ndarray:
    """Embeddings (..., D) at `precision` (EMBEDDING_PRECISIONS), equal bit for bit to
    sentence_transformers.quantize_embeddings (util.quantization, sentence-transformers 6.2):
    float32 as they are; int8/uint8 each dimension cut into 255 equal buckets between `ranges`
    (2, D) min and max, from `calibration` embeddings (N, D) when not given, else from the
    vectors themselves (floor, clipped to 0..255; int8 offset by -128); binary/ubinary one
    bit per dimension (> 0), packed 8 to a byte (..., ceil(D / 8)), binary offset by -128."""
    check_choice("precision", precision, EMBEDDING_PRECISIONS)
    vectors = np.asarray(vectors)
    if vectors.dtype in (np.int8, np.uint8):
        raise InputError(f"embeddings to quantise must be floats, not {vectors.dtype}")
    if precision == "float32":
        return vectors.astype(np.float32)
    if vectors.ndim == 2 and vectors.shape[0] == 0:  # nothing to calibrate or pack
        dim = vectors.shape[1] if precision.endswith("int8") else (vectors.shape[1] + 7) // 8
        return np.zeros((0, dim), np.int8 if precision in ("int8", "binary") else np.uint8)
    if precision.endswith("binary"):
        bits = np.packbits(vectors > 0, axis=-1)  # (..., ceil(D / 8)) uint8
        return bits if precision == "ubinary" else (bits - 128).astype(np.int8)
    if ranges is None:
        ranges = quantization_ranges(vectors if calibration is None else calibration)
    ranges = np.asarray(ranges).astype(np.float32, copy=False)
    if ranges.shape != (2, vectors.shape[-1]):
        raise InputError(
            f"quantisation ranges of shape {ranges.shape} do not fit embeddings of "
            f"{vectors.shape[-1]} dimensions (expected (2, {vectors.shape[-1]}))"
        )
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)  # a constant dimension: bucket 0
    q = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)


def dequantize(
    codes: np.ndarray, precision: str, dimensions: int, ranges: np.ndarray | None = None
) -> np.ndarray:
    """float32 (..., dimensions) stand-ins for quantised embeddings, to score float queries
    against (asymmetric search): int8/uint8 each code's bucket centre between `ranges`;
    binary/ubinary each bit as +-1 / sqrt(dimensions) (a unit vector, so inner products read
    like cosines); float32 as it is."""
    check_choice("precision", precision, EMBEDDING_PRECISIONS)
    codes = np.asarray(codes)
    if precision == "float32":
        return codes.astype(np.float32, copy=False)
    unsigned = codes.astype(np.int16) + (128 if codes.dtype == np.int8 else 0)  # 0..255
    if precision.endswith("binary"):
        bits = np.unpackbits(unsigned.astype(np.uint8), axis=-1)[..., :dimensions]
        return (bits.astype(np.float32) * 2 - 1) / np.float32(np.sqrt(dimensions))
    if ranges is None:
        raise InputError(f"{precision} embeddings need their quantisation ranges to be read")
    starts, ends = np.asarray(ranges, np.float32)
    return starts + (unsigned.astype(np.float32) + 0.5) * ((ends - starts) / 255)
