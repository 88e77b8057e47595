"""What an index records of its model, and which models it takes: the model's identity (a
sha256 of its config.json and weights, so a model retrained or replaced in place is caught),
what else makes its vectors (SETUP: its pooling, normalisation, length and tokenizer, so a copy
of the weights with another 1_Pooling/config.json, no Normalize module, another max_seq_length
or another casing is caught too), its prompts (the documents' and the queries'), and the
refusal of a cross-encoder (it scores pairs; its vectors are not made to be compared). Both
backends (index.py, postgres.py) check a model by model_differences: one rule."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..checkpoint import model_identity as model_identity  # its home before ModelDir.identity
from ..errors import ConfigError, DataError
from ..modeldir import ModelDir
from .corpus import corpus_file
from .windows import window_settings

# What besides config.json and the weights makes an index's vectors, as errors name it. Each is
# recorded with the index and compared where the index records it: an index written before a
# field was recorded is checked without it (pooling and normalize were recorded from the start).
SETUP = {
    "pooling": "pooling (1_Pooling/config.json)",
    "include_prompt": "pooling's include_prompt (1_Pooling/config.json)",
    "normalize": "normalisation (a Normalize module in modules.json)",
    "max_length": "max_seq_length (sentence_bert_config.json)",
    "tokenizer_sha256": "tokenizer (its vocabulary, casing or accents)",
}


def refuse_cross_encoder(model: str | Path | ModelDir) -> None:
    """A cross-encoder (a one-output sequence-classification head, no sentence-transformers
    modules) scores pairs; its encoder's pooled states are not trained to be compared, so
    indexing with it would give arbitrary hits: one ConfigError."""
    from ..catalogue import ENTRIES

    source = ModelDir.open(model)
    if source.is_sentence_transformers:
        return
    labels = source.config.num_labels
    if ENTRIES["rerank"].needs and ENTRIES["rerank"].available(source.architectures, labels):
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


def tokenizer_identity(tok: Any) -> str:
    """sha256 of what decides a tokenizer's pieces: its vocabulary, in order, and its rules
    (casing, accents, CJK characters, the longest word), whichever files they came from."""
    strip = tok.lowercase if tok.strip_accents is None else tok.strip_accents
    rules = [tok.lowercase, strip, tok.tokenize_chinese_chars, tok.max_input_chars_per_word]
    h = hashlib.sha256(json.dumps(rules).encode() + b"\0")
    h.update("\n".join(tok.tokens).encode())
    h.update(tok.definition().encode())  # another family's engine, whole ("" for BERT's)
    return h.hexdigest()


def model_setup(pipe: Any) -> dict[str, Any]:
    """The SETUP of a loaded Pipeline: what besides its weights makes its vectors."""
    own = pipe.embedding_settings
    return {
        "pooling": list(own.pooling),
        "include_prompt": own.include_prompt,
        "normalize": own.normalize,
        "max_length": own.max_length,
        "tokenizer_sha256": tokenizer_identity(pipe.tok),
    }


def model_record(pipe: Any) -> dict[str, Any]:
    """What an index keeps of its model: where it was, its name, its identity, its SETUP."""
    path = Path(pipe.path).resolve()
    return {
        "model": str(path),
        "model_name": path.name,
        "model_sha256": pipe.source.identity,
        **model_setup(pipe),
    }


def model_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The identity fields (model_sha256, then SETUP's) of `current` that differ from the
    index's record, a SETUP field compared only where the record holds it (an index written
    before it was recorded); empty: the same model."""
    sha = recorded.get("model_sha256") != current.get("model_sha256")
    setup = [k for k in SETUP if k in recorded and recorded[k] != current.get(k)]
    return ["model_sha256"] * sha + setup


def differing(fields: Sequence[str]) -> str:
    """model_differences' fields in words: "its pooling (...) and tokenizer (...)"."""
    said = ["config.json and weights" if f == "model_sha256" else SETUP.get(f, f) for f in fields]
    return "its " + (", ".join(said[:-1]) + " and " if len(said) > 1 else "") + said[-1]


def query_pipeline(
    where: Any, meta: dict[str, Any], recorded: Path, model: str | Path | None, **pipeline: Any
) -> Any:
    """The pipeline that embeds an index's queries: `model`, or the model the index records
    (`recorded`), checked to be the one the index was built with (model_differences: its
    config.json and weights' sha256, then, loaded, its SETUP), else one ConfigError naming
    what differs: a model retrained, replaced or set up otherwise in place would give other
    hits without a word. `where`: the index, as its errors name it."""
    from ..hub import resolve
    from ..pipelines import Pipeline

    given = model is not None
    path = resolve(model) if model is not None else recorded
    if not Path(path).is_dir():
        raise ConfigError(f"{where}: its model {path} is gone; pass the same model (--model)")
    what = "" if given else "the model at the path the index records, "
    source = ModelDir.open(path)  # its identity and the pipeline's reading: each file once
    if source.identity != meta["model_sha256"]:
        raise ConfigError(
            f"{model if given else path}: {what}not the model this index was built with "
            f"({meta['model_name']}, sha256 {meta['model_sha256'][:12]}...; changed since?): "
            "search with that model (--model), or build an index with this one"
        )
    pipe = Pipeline(source, **{"precision": meta["precision"], **pipeline})
    differs = model_differences(meta, {**model_setup(pipe), "model_sha256": meta["model_sha256"]})
    if differs:
        raise ConfigError(
            f"{model if given else path}: {what}the weights this index was built with "
            f"({meta['model_name']}), but {differing(differs)} differ from when it was built "
            "(they change the vectors): search with the model as it was (--model), or build an "
            "index with this one"
        )
    return pipe


def model_mismatch(pipe: Any, meta: dict[str, Any]) -> list[str]:
    """What keeps `pipe` (a loaded Pipeline) from embedding an index's queries, in words
    (differing's, then its precision); empty: the index's model in the index's precision."""
    from ..runner import resolve_precision

    current = {"model_sha256": pipe.source.identity, **model_setup(pipe)}
    said = [differing(differs)] if (differs := model_differences(meta, current)) else []
    if resolve_precision(meta["precision"], pipe.device) != pipe.precision:
        said.append(f"its precision ({pipe.precision}; the index's {meta['precision']})")
    return said


def build_start(
    model: str | Path, corpus: Path | str, options: Any, count: Callable[[], int]
) -> tuple[Any, dict[str, Any], int]:
    """What every backend's build does first: the bi-encoder's pipeline (a cross-encoder
    refused), the record of its model, prompts and windows (index.json's, the PostgreSQL
    side table's), and the number of documents, `count()` reading every row of the corpus
    (so a bad row fails before anything is written; an empty corpus is an error too).
    `corpus`: its file, or (a str) the name of documents that are not one (a Ray Dataset)."""
    from ..pipelines import Pipeline

    o = options
    refuse_cross_encoder(model)
    pipe = Pipeline(model, device=o.device, precision=o.precision, batch_size=o.batch_size)
    roles = prompts(pipe, o.prompt_name, o.prompt)
    window, stride = window_settings(pipe, o.window, o.stride, roles["document_prompt"])
    if isinstance(corpus, Path) and not corpus_file(corpus).is_file():  # BEIR: its corpus.jsonl
        raise DataError(f"{corpus}: file not found")
    total = count()
    if not total:
        raise DataError(f"{corpus}: no documents")
    return pipe, {**model_record(pipe), **roles, "window": window, "stride": stride}, total
