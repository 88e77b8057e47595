"""A model directory, read once: the one object every verb and the server are handed.

A directory (or a hub name, resolved to its local snapshot once) is opened by `ModelDir.open`;
what it holds is read when first asked for and kept: `config` (config.json, its family decided
by model_type once), `tokenizer` (tokenizer.json or vocab.txt, tokenizer_config.json,
special_tokens_map.json, added tokens), `embedding` (the sentence-transformers modules, pooling,
prompts and max_seq_length), `architectures`, `run` (run.json: the options a fine-tuned model was
trained with), `identity` (the sha256 of config.json and the weights an index records); the
weights are loaded inside `reading()` too, and `write_layout` copies the sentence-transformers
modules into a model saved from this one (finetune, distill, merge) from the files already read.
Who opens one: Pipeline (and so serve, search, export, attention, probe), evaluate, predict,
finetune, distill, merge, an index's query pipeline; a task family is handed it (set_model).
The readers are the project's own (BertConfig.from_pretrained, Tokenizer.from_pretrained,
embedding.settings, checkpoint's loaders); they run inside `reading()`, where every file of
the directory is read from disk once however many readers ask for it (fileio.reads_once):
before, a pipeline that embedded read tokenizer.json and tokenizer_config.json three times,
vocab.txt and config.json twice. Functions that take a model accept a path or a ModelDir
(`ModelDir.open` returns a ModelDir unchanged)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from . import embedding
from .checkpoint import architectures, model_identity
from .config import BertConfig
from .errors import CheckpointError
from .fileio import read_json, reads_once
from .hub import resolve
from .tokenizer import Tokenizer

T = TypeVar("T")


class ModelDir:
    """One model directory and what has been read of it (see the module's docstring)."""

    def __init__(self, model: str | os.PathLike[str]) -> None:
        self.path: Path = resolve(model)  # a hub name: its local snapshot
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a model directory")
        self._read: dict[str, bytes] = {}  # each file's bytes, read once (fileio.reads_once)

    @classmethod
    def open(cls, model: str | os.PathLike[str] | ModelDir) -> ModelDir:
        """`model` itself if it is a ModelDir, else the directory (or hub name) opened."""
        return model if isinstance(model, ModelDir) else cls(model)

    def __fspath__(self) -> str:  # where a path is expected (Path(md), open(md / ...))
        return str(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __str__(self) -> str:  # messages and names show the directory
        return str(self.path)

    def __repr__(self) -> str:
        return f"ModelDir({str(self.path)!r})"

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Readers called inside read the directory's files through this object: once each."""
        with reads_once(self.path, self._read):
            yield

    def read(self, reader: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """reader(self.path, *args, **kwargs) inside `reading()`."""
        with self.reading():
            return reader(self.path, *args, **kwargs)

    @functools.cached_property
    def config(self) -> BertConfig:
        """config.json (or bert_config.json); its model_type decides the family."""
        return self.read(BertConfig.from_pretrained)

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return self.read(Tokenizer.from_pretrained)

    @functools.cached_property
    def embedding(self) -> embedding.Embedding:
        """How the directory pools its sentence vectors (sentence-transformers' files)."""
        return self.read(embedding.settings)

    @functools.cached_property
    def architectures(self) -> list[str]:
        return self.read(architectures)

    @functools.cached_property
    def run(self) -> dict[str, Any] | None:
        """run.json's content (bertforge's record of a fine-tuning run), None without one."""
        if not (self.path / "run.json").is_file():
            return None
        with self.reading():
            return read_json(self.path / "run.json", CheckpointError)

    @functools.cached_property
    def identity(self) -> str:
        """sha256 of config.json and the weights (checkpoint.model_identity): what an index and
        a summarizer record of their encoder; config.json is read once with the config's."""
        return self.read(model_identity)

    def write_layout(self, out: str | os.PathLike[str], width: int) -> None:
        """Give the model saved in `out` this directory's sentence-transformers modules
        (embedding.write_layout), from the files its pooling was read from: not read again."""
        with self.reading():
            embedding.write_layout(self.path, out, width)

    @property
    def is_sentence_transformers(self) -> bool:
        return (self.path / "modules.json").is_file()
