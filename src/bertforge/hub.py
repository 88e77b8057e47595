"""Where a pretrained name points: a local directory, or else a download from the HF hub.

Local paths never touch the network. A name that is not a local path but looks like a hub
repository id ("bert-base-uncased", "org/model") is fetched with `huggingface_hub` (the `hub`
extra) into its usual cache.
"""

from __future__ import annotations

import os
import re
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
        local = Path(snapshot_download(repo_id=name, allow_patterns=_FILES))
        if not any(local.glob("*.safetensors")):  # older repositories have only the pickle
            local = Path(snapshot_download(repo_id=name, allow_patterns=[*_FILES, *_PICKLES]))
        return local
    except Exception as e:  # network, auth, missing repo: all end the same way for the user
        raise CheckpointError(
            f"{name}: not a local directory, and the hub download failed: {e}"
        ) from None
