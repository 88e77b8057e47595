"""Where a pretrained name points: a local directory, or else a download from the HF hub.

Local paths never touch the network. A name that is not a local path but looks like a hub
repository id ("bert-base-uncased", "org/model") is fetched with `huggingface_hub` (the `hub`
extra) into its usual cache: the files bertforge reads (config, tokenizer, weights, and a
sentence-transformers model's modules.json, module configs and settings), nothing else.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from .errors import CheckpointError, need_extra

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_FILES = [
    "config.json",
    "bert_config.json",
    "vocab.txt",
    "tokenizer.json",  # transformers 5 and sentence-transformers 6 save no vocab.txt
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*.safetensors",
]
_PICKLES = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
# a sentence-transformers model's own files (embedding.py reads them): without them its vectors
# would be mean-pooled, not normalised, over the model's whole window; each module's folder
# (modules.json names it) gives its config files too
_SENTENCE_FILES = [
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
]


def resolve(path: str | os.PathLike[str]) -> Path:
    """A local path for `path`: itself if it exists, else a hub snapshot."""
    local = Path(path)
    if local.exists():
        return local
    name = str(path)
    looks_local = (
        not _REPO_ID.match(name)
        or local.suffix in (".txt", ".json", ".bin", ".safetensors")
        or (len(local.parts) > 1 and Path(local.parts[0]).exists())  # a typo below a real folder
    )
    if looks_local:
        raise CheckpointError(f"{name}: no such file or directory")
    snapshot_download = need_extra(
        "huggingface_hub",
        f"{name}: no such local directory; to download it from the Hugging Face hub, "
        "install the hub extra (pip install 'bertforge[hub]')",
        CheckpointError,
    ).snapshot_download
    try:
        return _download(snapshot_download, name)
    except Exception as e:  # network, auth, missing repo: all end the same way for the user
        raise CheckpointError(
            f"{name}: not a local directory, and the hub download failed: {e}"
        ) from None


def _download(snapshot_download: Callable[..., str], name: str) -> Path:
    """The snapshot of the files bertforge reads: a second call (files already there are not
    fetched again) adds the config files of the modules that modules.json names, and the
    pickled weights of an older repository that has no safetensors."""
    patterns = [*_FILES, *_SENTENCE_FILES]
    local = Path(snapshot_download(repo_id=name, allow_patterns=patterns))
    more = _module_files(local)
    if not any(local.glob("*.safetensors")):
        more += _PICKLES
    if more:
        local = Path(snapshot_download(repo_id=name, allow_patterns=[*patterns, *more]))
    return local


def _module_files(snapshot: Path) -> list[str]:
    """Patterns for the JSON files in the folder of each module modules.json names (a
    Pooling's config.json); none when it is absent or unreadable (embedding.settings names
    the fault, and confines the folders, when the model is used)."""
    try:
        modules = json.loads((snapshot / "modules.json").read_text(encoding="utf-8"))
        folders = {str(m.get("path") or "").strip("/") for m in modules}
    except (OSError, ValueError, TypeError, AttributeError):
        return []
    return sorted(f"{folder}/*.json" for folder in folders if folder not in ("", "."))
