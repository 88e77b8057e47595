"""What an index records of its model, and which models it takes: the model's identity (a
sha256 of its config.json and weights, so a model retrained or replaced in place is caught),
its embedding settings, its prompts (the documents' and the queries'), and the refusal of a
cross-encoder (it scores pairs; its vectors are not made to be compared)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError
from .windows import window_settings


def model_identity(path: str | Path) -> str:
    """sha256 over a model directory's config.json and weight files (names and bytes)."""
    from ..checkpoint import weights_files

    path = Path(path)
    return sha256([path / "config.json", *weights_files(path)], names=True)


def sha256(files: Sequence[Path], names: bool = False) -> str:
    """sha256 over the files' bytes, read 1 MB at a time; with `names`, each file's name and a
    NUL byte before its bytes."""
    h = hashlib.sha256()
    for f in files:
        if names:
            h.update(f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            while block := stream.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def refuse_cross_encoder(model: str | Path) -> None:
    """A cross-encoder (a one-output sequence-classification head, no sentence-transformers
    modules) scores pairs; its encoder's pooled states are not trained to be compared, so
    indexing with it would give arbitrary hits: one ConfigError."""
    from ..catalogue import ENTRIES
    from ..checkpoint import architectures
    from ..config import BertConfig
    from ..hub import resolve

    path = resolve(model)
    if (path / "modules.json").is_file():
        return
    labels = BertConfig.from_pretrained(path).num_labels
    if ENTRIES["rerank"].needs and ENTRIES["rerank"].available(architectures(path), labels):
        raise ConfigError(
            f"{model}: a cross-encoder (it scores query-document pairs); an index needs a "
            "bi-encoder (an embedding model): rerank with this one (search --rerank)"
        )


def prompts(pipe: Any, prompt_name: str | None, prompt: str | None) -> dict[str, str]:
    """The documents' prompt (given, else the model's document prompt) and the queries'."""
    from ..embedding import prompt_text, role_prompt

    own = pipe.embedding_settings
    given = prompt_name is not None or prompt is not None
    document = prompt_text(own, prompt_name, prompt) if given else role_prompt(own, "document")
    return {"document_prompt": document, "query_prompt": role_prompt(own, "query")}


def model_record(pipe: Any) -> dict[str, Any]:
    """What an index keeps of its model: where it was, its name, its identity, its pooling."""
    path = Path(pipe.path).resolve()
    return {
        "model": str(path),
        "model_name": path.name,
        "model_sha256": model_identity(path),
        "pooling": list(pipe.embedding_settings.pooling),
        "normalize": pipe.embedding_settings.normalize,
    }


def query_pipeline(
    where: Any, meta: dict[str, Any], recorded: Path, model: str | Path | None, **pipeline: Any
) -> Any:
    """The pipeline that embeds an index's queries: `model`, or the model the index records
    (`recorded`), checked to be the one the index was built with (its config.json and
    weights' sha256, meta["model_sha256"]), else one ConfigError naming both: a model
    retrained or replaced in place would give other hits without a word. `where`: the index,
    as its errors name it."""
    from ..hub import resolve
    from ..pipelines import Pipeline

    given = model is not None
    path = resolve(model) if model is not None else recorded
    if not Path(path).is_dir():
        raise ConfigError(f"{where}: its model {path} is gone; pass the same model (--model)")
    if model_identity(path) != meta["model_sha256"]:
        what = "" if given else "the model at the path the index records, "
        raise ConfigError(
            f"{model if given else path}: {what}not the model this index was built with "
            f"({meta['model_name']}, sha256 {meta['model_sha256'][:12]}...; changed since?): "
            "search with that model (--model), or build an index with this one"
        )
    return Pipeline(path, **{"precision": meta["precision"], **pipeline})


def same_model(pipe: Any, meta: dict[str, Any]) -> bool:
    """Whether `pipe` (a loaded Pipeline) is an index's model in the index's precision."""
    from ..runner import resolve_precision

    same = model_identity(pipe.path) == meta["model_sha256"]
    return same and resolve_precision(meta["precision"], pipe.device) == pipe.precision


def build_start(
    model: str | Path, corpus: Path, options: Any, count: Callable[[], int]
) -> tuple[Any, dict[str, Any], int]:
    """What every backend's build does first: the bi-encoder's pipeline (a cross-encoder
    refused), the record of its model, prompts and windows (index.json's, the PostgreSQL
    side table's), and the number of documents, `count()` reading every row of the corpus
    (so a bad row fails before anything is written; an empty corpus is an error too)."""
    from ..pipelines import Pipeline

    o = options
    refuse_cross_encoder(model)
    pipe = Pipeline(model, device=o.device, precision=o.precision, batch_size=o.batch_size)
    roles = prompts(pipe, o.prompt_name, o.prompt)
    window, stride = window_settings(pipe, o.window, o.stride, roles["document_prompt"])
    if not corpus.is_file():
        raise DataError(f"{corpus}: file not found")
    total = count()
    if not total:
        raise DataError(f"{corpus}: no documents")
    return pipe, {**model_record(pipe), **roles, "window": window, "stride": stride}, total
