"""Every endpoint's request body, in one place: pydantic models, which FastAPI reads, checks and
shows in /openapi.json, and request_model, which makes a catalogue entry's body from its
Pipeline method. (The answers are plain dicts, shaped by their routes: routes.py.)"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from .. import embedding
from ..catalogue import Entry
from ..embedding import POOLINGS
from ..pipelines import Pipeline
from ..search.options import FirstStage


class Body(BaseModel):
    """A request body whose explicit null is the field's default (some versions of OpenAI's
    client send a null for each field left unset); a null for a required field is still
    refused. It ignores a field it does not know, as text-embeddings-inference does."""

    @model_validator(mode="before")
    @classmethod
    def null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if v is not None or k not in fields or fields[k].is_required()
        }


class Strict(Body):
    """A body that refuses a field it does not know (422 naming it), as OpenAI's and Cohere's
    APIs do, and bertforge's own: a misspelt option left at its default answers another
    question."""

    model_config = ConfigDict(extra="forbid")


class EmbedRequest(Strict):  # pooling, normalize, prompt: the model's own unless given
    texts: list[str]
    pooling: str | None = Field(None, pattern=f"^({'|'.join(POOLINGS)})$")
    normalize: bool | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    dimensions: int | None = Field(None, strict=True)  # true is not 1
    embedding_precision: str = Field(
        "float32", pattern=f"^({'|'.join(embedding.EMBEDDING_PRECISIONS)})$"
    )


class OpenAIEmbeddingRequest(Strict):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: str = Field("float", pattern="^(float|base64)$")
    dimensions: int | None = Field(None, strict=True)  # true is not 1
    user: str | None = None


class RerankRequest(Body):  # text-embeddings-inference's /rerank: tolerant, as TEI is
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


class Document(BaseModel):  # Cohere's v1 answers it as given: its other fields are kept
    model_config = ConfigDict(extra="allow")

    text: str


class CohereRerankRequest(Strict):  # Cohere's and Jina's /v1/rerank
    query: str
    documents: list[str | Document]
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class CohereV2RerankRequest(Strict):  # Cohere's /v2/rerank: documents are strings
    query: str
    documents: list[str]
    model: str | None = None  # Cohere requires it; the server has one model
    top_n: int | None = Field(None, ge=1)
    max_tokens_per_doc: int = Field(4096, ge=1)  # Cohere's default
    return_documents: bool = False  # dropped from Cohere's v2 in 2025; older clients send it


class SearchRequest(Strict):  # POST /search, with --index
    queries: list[str]
    top_k: int = Field(10, ge=1, le=1000)
    mode: str = Field("dense", pattern="^(dense|bm25|hybrid)$")
    fusion: str = Field(FirstStage.fusion, pattern="^(rrf|zscore)$")
    alpha: float = Field(0.5, ge=0.0, le=1.0)
    return_text: bool = False
    return_passage: bool = False
    where: dict[str, str] | None = None  # a PostgreSQL index's metadata filters


def request_model(entry: Entry, defaults: dict[str, Any] | None = None) -> type:
    """The request body of a catalogue entry: its inputs as lists of texts (an optional one may
    be left out) and its options with the Pipeline method's types and defaults, but those in
    `defaults` (the server's: Server.defaults)."""
    method = getattr(Pipeline, entry.method)
    hints, params = typing.get_type_hints(method), inspect.signature(method).parameters
    fields: dict[str, Any] = {
        i.param: (list[str] | None, None) if i.optional else (list[str], ...) for i in entry.inputs
    }
    defaults = {name: params[name].default for name in entry.options} | (defaults or {})
    fields.update({name: (hints[name], defaults[name]) for name in entry.options})
    name = "".join(part.title() for part in entry.name.split("-")) + "Request"
    return create_model(name, __base__=Strict, **fields)  # type: ignore[misc]
