"""`bertforge merge MODEL MODEL... --out DIR`: a weighted average of checkpoints' weights.

Models fine-tuned from one base can be averaged tensor by tensor into one model of the same
size and speed: a "model soup" (Wortsman et al., 2022) of several fine-tunings, or WiSE-FT
(Wortsman et al., 2022), a fine-tuned model averaged with the base it started from (say
weights 0.9 and 0.1), which keeps some of the base's robustness on data unlike the training
set. Whether it helps is for a dev set to say; merge only does the arithmetic, in float64,
each tensor written back in the first model's dtype.

The models must have one architecture (config.json's sizes, activation and position
settings), one vocabulary (the same pieces and casing) and the same encoder tensors with the
same shapes; each mismatch is one error naming the file and the tensor or field. Heads may
differ: the merged model has the first model's, each averaged over the models that have it
(their weights scaled to sum to 1), so WiSE-FT of a classifier with its pre-training base keeps
the classifier's head and leaves the base's MLM/NSP heads out; a task head the first model
lacks is left out with a warning. Buffers that
loading ignores (position_ids) are not needed in every model. OUT gets the first model's
files (config, tokenizer, sentence-transformers modules, any README), its training records
(run.json, metrics.jsonl, ...) left out, merge.json naming the models and weights, and
model.safetensors; it is built in a hidden folder beside OUT and renamed into place, so a
failed merge leaves nothing (a killed one's folder is removed by the next merge to OUT), and an
OUT that already has files is refused.
"""

from __future__ import annotations

import glob
import math
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .checkpoint import PRETRAINING_HEADS, counterpart, ignored, is_head, read_tensors
from .config import CONFIG_FILES
from .errors import CheckpointError, ConfigError
from .fileio import copy_file, inside, write_json
from .modeldir import ModelDir
from .tokenizer import VOCAB_FILES

# config.json fields that must agree: the ones that change what the weights compute.
ARCHITECTURE = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "position_embedding_type",
    "sinusoidal_pos_embds",
    "layer_norm_eps",
)
# Files of the first model not copied: a training run's records (they describe another model)
# and weights in any format (model.safetensors is written anew).
_RECORDS = {"run.json", "metrics.jsonl", "eval_results.json", "merge.json", "trainer_state.json"}
_FIXED = ("tokenizer_config.json", "special_tokens_map.json", "modules.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


def check_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """The merge's weights, scaled to sum to 1 (None: equal); a ConfigError naming --weights
    unless there is one finite, non-negative weight per model and not all are zero."""
    if weights is None:
        return [1.0 / n] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise ConfigError(f"--weights: {len(weights)} weights for {n} models: give one per model")
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(
            f"--weights {','.join(f'{w:g}' for w in weights)}: must be finite, non-negative "
            "and not all zero"
        )
    total = sum(weights)
    return [w / total for w in weights]


def _check_alike(first: ModelDir, other: ModelDir) -> None:
    """A CheckpointError unless `other` has the architecture and vocabulary of `first`."""
    a, ta, b = first.config, first.tokenizer, other.config
    for name in ARCHITECTURE:
        if getattr(a, name) != getattr(b, name):
            raise CheckpointError(
                f"{other}: config {name} = {getattr(b, name)!r}, but {first} has "
                f"{getattr(a, name)!r}: only models of one architecture can be merged"
            )
    if a.id2label and b.id2label and a.id2label != b.id2label:  # heads' rows mean other labels
        raise CheckpointError(
            f"{other}: config id2label = {b.id2label}, but {first} has {a.id2label}: only heads "
            "with the same labels in the same order can be merged"
        )
    tb = other.tokenizer
    if ta.tokens != tb.tokens or ta.lowercase != tb.lowercase:
        at = next((i for i, (x, y) in enumerate(zip(ta.tokens, tb.tokens)) if x != y), None)
        what = (
            f"piece {at} is {tb.tokens[at]!r} there, {ta.tokens[at]!r} in {first}"
            if at is not None
            else f"{len(tb.tokens)} pieces, lowercase {tb.lowercase}; {first}: "
            f"{len(ta.tokens)}, lowercase {ta.lowercase}"
        )
        raise CheckpointError(
            f"{tb.source}: not the vocabulary of {first} ({what}): only models that read text "
            "the same way can be merged"
        )


def average(
    models: Sequence[Path], weights: Sequence[float], kind: str = "bert"
) -> dict[str, torch.Tensor]:
    """The weighted average of the models' tensors, under the first model's names (the others'
    found with or without the encoder's prefix), each in the first model's dtype; integer
    tensors are the first model's. Models are read one at a time. `kind`: the models'
    model_type (config.json), which names the encoder's prefix.

    The encoder's tensors must be in every model. A head's (or the pooler's) that only some
    models have is the average over those, their weights scaled to sum to 1: WiSE-FT of a
    classifier and its base keeps the classifier's head. Heads the first model lacks are left
    out (the merged model is the first's): a base's pre-training heads quietly, a task head with
    a warning (the model whose head was wanted is not first)."""
    first, origin = read_tensors(models[0])
    sums = {n: t.double() * weights[0] for n, t in first.items() if t.is_floating_point()}
    totals = {n: weights[0] for n in first}  # the weight of the models that have each tensor
    keep, partial = set(first), set()  # partial: tensors some model lacks (heads)
    for path, weight in zip(models[1:], weights[1:]):
        tensors, where = read_tensors(path)
        used = set()
        for name, t in first.items():
            found = counterpart(name, tensors, kind)
            if found is None:
                if not (ignored(name, kind) or is_head(name, kind)):
                    raise CheckpointError(
                        f"{path}: has no tensor {name} (it is in {origin[name]}): only models "
                        "with the same encoder tensors can be merged"
                    )
                if ignored(name, kind):
                    keep.discard(name)  # a buffer the loader ignores: not needed in the output
                partial.add(name)
                continue
            used.add(found)
            if tensors[found].shape != t.shape:
                raise CheckpointError(
                    f"{where[found]}: tensor {found} has shape {tuple(tensors[found].shape)}, "
                    f"{tuple(t.shape)} in {origin[name]}"
                )
            totals[name] += weight
            if name in sums:
                sums[name] += tensors[found].double() * weight
        extra = sorted(n for n in set(tensors) - used if not ignored(n, kind))
        _extra(models[0], path, where, extra, kind)
    return {
        # a tensor in every model is the plain weighted sum (the weights sum to 1)
        n: (
            (sums[n] / totals[n] if n in partial else sums[n]).to(t.dtype) if n in sums else t
        ).contiguous()
        for n, t in first.items()
        if n in keep
    }


def _extra(first: Path, path: Path, where: dict[str, Path], extra: list[str], kind: str) -> None:
    """Tensors of `path` with no counterpart in the first model: a CheckpointError for the
    encoder's, a warning for a task head's (left out), nothing for a pre-training head's."""
    body = [n for n in extra if not is_head(n, kind)]
    if body:
        raise CheckpointError(
            f"{where[body[0]]}: tensor {body[0]} has no counterpart in {first}"
            + (f" (nor {len(body) - 1} more)" if len(body) > 1 else "")
            + ": only models with the same encoder tensors can be merged"
        )
    task = [n for n in extra if not n.startswith(PRETRAINING_HEADS)]
    if task:
        warnings.warn(
            f"{path}: head tensor {task[0]}"
            + (f" (and {len(task) - 1} more)" if len(task) > 1 else "")
            + f" not in {first}: left out, the merged model has {first}'s head (list the model "
            "whose head you want first)",
            stacklevel=3,
        )


def merge(
    models: Sequence[str | os.PathLike[str] | ModelDir],
    out: str | os.PathLike[str],
    weights: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Write the weighted average of `models` (weights: one per model, scaled to sum to 1;
    None: equal) to the new directory `out` (the module docstring); returns what merge.json
    records."""
    if len(models) < 2:
        raise ConfigError(f"merge: {len(models)} model given: merging needs two or more")
    scaled = check_weights(weights, len(models))
    out = Path(out)
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not empty: merge writes a new one")
    sources = [ModelDir.open(m) for m in models]  # each read once: checked, then averaged
    paths, config = [s.path for s in sources], sources[0].config
    for other in sources[1:]:
        _check_alike(sources[0], other)
    tensors = average(paths, scaled, config.model_type)
    record = {"models": [str(m) for m in models], "weights": scaled}
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        if not _running(old.name.rsplit("-", 1)[-1]):  # left by a merge that was killed
            shutil.rmtree(old, ignore_errors=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"  # renamed to out when complete
    tmp.mkdir()
    try:
        _copy_files(sources[0], tmp, config.hidden_size)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json(tmp / "merge.json", record)
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _copy_files(first: ModelDir, out: Path, width: int) -> None:
    """The first model's files but its weights and training records, and its
    sentence-transformers module folders, into `out`; what the checks read is not read again."""
    _ = first.embedding  # its modules' files read (and kept) before they are copied
    with first.reading():
        for f in sorted(first.path.iterdir()):
            if f.is_file() and f.name not in _RECORDS and not _weights_file(f.name):
                if _leads_out(first.path, f):
                    warnings.warn(f"{f}: a link out of {first}: not copied", stacklevel=3)
                    continue
                copy_file(f, out / f.name)
    first.write_layout(out, width)


def _leads_out(directory: Path, f: Path) -> bool:
    """Whether `f`, a file of the first model that is not one of the files every model has
    (config, vocabulary, tokenizer settings), is a link that leads out of its directory: such
    a file is not copied into the merged model (fileio.inside's rule for a model's own files)."""
    if f.name in (*CONFIG_FILES, *VOCAB_FILES, *_FIXED) or not f.is_symlink():
        return False
    try:
        inside(directory, f.name, directory, "file")
        return False
    except CheckpointError:
        return True


def _running(pid: str) -> bool:
    """Whether a process `pid` (a folder name's suffix) is alive (another user's counts)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _weights_file(name: str) -> bool:
    return name.endswith((*_WEIGHT_SUFFIXES, ".bin.index.json", ".safetensors.index.json"))
