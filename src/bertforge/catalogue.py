"""The inference front doors, one entry each: what a checkpoint can do, and how it is exposed.

An entry names a `Pipeline` method (pipelines.py), the model class it loads and the trained
head it needs (with the refusal's advice), the `config.json` architectures and tensor names
that show the head, its inputs (the method's parameters, the request's fields, the columns of
an input file), the method's options the CLI and the server offer, the row a JSONL output holds
per input, array files it may write instead, whether the server offers it, and the graph
outputs `export --onnx` writes for a checkpoint with that head. The CLI's pipeline verbs
(cli.py), the server's endpoints (serve/), `export` and `info` (`inspect` here) read
this table; adding a pipeline is one entry here plus its `Pipeline` method.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import parameter_shapes, weights_files
from .config import BertConfig
from .embedding import EMBEDDING_PRECISIONS, POOLINGS, quantize, read_calibration
from .errors import ConfigError
from .fileio import atomic_path
from .heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel
from .modeldir import ModelDir
from .tasks.summarize import MODES as SUMMARY_MODES

COMBINES = ("concat", "sum", "mean")  # how `features` combines several layers


@dataclass(frozen=True)
class Input:
    """One input of a pipeline: `param` is the method's parameter and the request's field
    ("texts"), `field` the JSONL field and tab-separated column of an input line ("text")."""

    param: str
    field: str
    optional: bool = False  # a second text given when wanted: the CLI's --<param>


TEXTS = (Input("texts", "text"),)


@dataclass(frozen=True)
class Entry:
    name: str  # the CLI verb and the endpoint (POST /<name>)
    method: str  # the Pipeline method
    help: str
    model: type  # what the method loads (BertModel: the encoder, no head needed)
    row: Callable[[dict[str, Any], Any, int], dict[str, Any]]  # (inputs, result, index) -> JSONL
    inputs: tuple[Input, ...] = TEXTS
    needs: str = ""  # the trained head it must have, as its refusal names it ("": none)
    remedy: str = ""  # the refusal's advice: where a checkpoint with that head comes from
    also: tuple[str, ...] = ()  # other architectures that have the head (BertForPreTraining)
    tensors: tuple[str, ...] = ()  # tensor-name prefixes of the head
    head_label: str = ""  # the head as `info` names it
    options: dict[str, str] = field(default_factory=dict)  # the method's options: help
    choices: dict[str, Sequence[Any]] = field(default_factory=dict)
    arrays: tuple[str, ...] = ()  # --out suffixes written by `save` instead of JSONL
    save: Callable[[str, Any], None] | None = None
    # the CLI's step between the method's results and the output: a function of the results
    # whose keyword parameters are options of the verb (help: post_options), e.g. embed's
    # quantisation, kept out of the method so that it returns what the server and index use
    post: Callable[..., Any] | None = None
    post_options: dict[str, str] = field(default_factory=dict)
    served: bool = True  # POST /<name> (with {"results": [...]}; /embed has its own shape)
    # its input may also be WikiExtractor output (a file or a directory), an article's body a
    # document, as finetune --task summarize reads it (inputs.read_inputs)
    documents: bool = False
    onnx: tuple[str, ...] = ()  # graph outputs of `export --onnx` for a checkpoint with the head
    labels: int | None = None  # the outputs its head must have (rerank: 1; None: any)
    # Pipeline options (max_length, stride, truncate) the method does not read, and why: the
    # CLI leaves them out of the verb's help and refuses them by name rather than ignore them;
    # paired_unused: those it does not read when its optional second input is given
    unused: dict[str, str] = field(default_factory=dict)
    paired_unused: dict[str, str] = field(default_factory=dict)

    @property
    def architectures(self) -> tuple[str, ...]:
        """config.json "architectures" of a checkpoint with this head."""
        return (self.model.hf_architecture, *self.also)  # type: ignore[attr-defined]

    def available(self, architectures: Sequence[str], labels: int | None = None) -> bool:
        """Whether a checkpoint of these architectures (and head outputs, if known) has what
        this pipeline needs."""
        if self.labels is not None and labels is not None and labels != self.labels:
            return False
        return not self.needs or bool(set(self.architectures) & set(architectures))

    def run(self, pipe: Any, inputs: dict[str, list[Any]], options: dict[str, Any]) -> Any:
        """The pipeline's results for columns of inputs (an optional one absent)."""
        return getattr(pipe, self.method)(**inputs, **options)


def _save_embeddings(out: str, vectors: np.ndarray) -> None:
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.save(f, vectors)
    print(f"wrote {vectors.shape} {vectors.dtype} to {out}", file=sys.stderr)


def _quantized(
    vectors: np.ndarray, embedding_precision: str = "float32", calibration: str | None = None
) -> np.ndarray:
    """embed's vectors at an output precision (bertforge.embedding.quantize, sentence-transformers'
    quantize_embeddings); int8/uint8 buckets from `calibration`, a .npy of float embeddings
    (N, D) like these (a corpus's, from `bertforge embed --out corpus.npy`), else from the
    vectors written."""
    if calibration is not None and not embedding_precision.endswith("int8"):
        raise ConfigError("--calibration is for --embedding-precision int8 or uint8")
    vectors = np.asarray(vectors)  # the rows' vectors as the parts gave them: (N, D)
    if calibration is None:
        return quantize(vectors, embedding_precision)
    reference = read_calibration(calibration, vectors.shape[-1])
    return quantize(vectors, embedding_precision, calibration=reference)


def _save_features(out: str, results: list[dict[str, Any]]) -> None:
    """.npz: values_<i> and tokens_<i> per text; .npy: one zero-padded (N, T, D) array."""
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        if out.endswith(".npz"):
            arrays = {f"values_{i}": r["values"] for i, r in enumerate(results)}
            arrays.update({f"tokens_{i}": np.array(r["tokens"]) for i, r in enumerate(results)})
            np.savez(f, **arrays)
        else:
            T = max((len(r["values"]) for r in results), default=0)
            D = results[0]["values"].shape[-1] if results else 0
            padded = np.zeros((len(results), T, D), np.float32)
            for i, r in enumerate(results):
                padded[i, : len(r["values"])] = r["values"]
            np.save(f, padded)
    print(f"wrote features of {len(results):,} texts to {out}", file=sys.stderr)


def _google_features(inputs: dict[str, Any], result: dict[str, Any], i: int) -> dict[str, Any]:
    """Google's extract_features.py JSONL: every token with the values of every layer."""
    layers = result["layers"]
    return {
        "linex_index": i,
        "features": [
            {
                "token": token,
                "layers": [
                    {"index": k, "values": [round(float(x), 6) for x in v[j]]}
                    for k, v in layers.items()
                ],
            }
            for j, token in enumerate(result["tokens"])
        ],
    }


PAIRS = (Input("texts", "text"), Input("pairs", "text_pair"))
# what fill-mask, nsp and classify --pairs do with a long input: one row, cut (Pipeline.encode)
ONE_ROW = {
    "stride": "each input is one row of at most --max-length pieces, not read in windows",
    "truncate": "each input is one row, always cut to --max-length pieces",
}
FINE_TUNE = "fine-tune one first (bertforge finetune), or use a checkpoint that has one"
PRE_TRAIN = "a pre-training checkpoint (bertforge pretrain, or BERT's own) has one"
# a sequence or token classifier: the same tensors, told apart by the architecture
CLASSIFIER: dict[str, Any] = {
    "remedy": FINE_TUNE,
    "tensors": ("classifier.",),
    "head_label": "classifier",
    "onnx": ("logits",),
}

ENTRIES: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "embed",
            "embed",
            "sentence embeddings, pooled as the model says (sentence-transformers modules); "
            "--out x.npy",
            BertModel,
            lambda x, r, i: {"embedding": r.tolist()},
            options={
                "pooling": "default: the model's",
                "normalize": "unit length (default: the model's)",
                "prompt_name": "a prompt of the model's config_sentence_transformers.json "
                "(default: its default_prompt_name)",
                "prompt": 'a literal prompt put before every text ("": none)',
                "dimensions": "keep the first N dimensions (Matryoshka), renormalised when "
                "the vectors are normalised",
            },
            choices={"pooling": POOLINGS, "embedding_precision": EMBEDDING_PRECISIONS},
            arrays=(".npy",),
            save=_save_embeddings,
            post=_quantized,
            post_options={
                "embedding_precision": "the vectors written: int8/uint8 (255 buckets per "
                "dimension), binary/ubinary (packed bits), as sentence-transformers quantises",
                "calibration": "int8/uint8: a .npy of float embeddings whose per-dimension "
                "min and max set the buckets (default: the embeddings written)",
            },
            onnx=("last_hidden_state", "pooler_output"),
        ),
        Entry(
            "features",
            "features",
            "hidden states of --layers (JSONL like Google's extract_features, or .npy/.npz)",
            BertModel,
            _google_features,
            options={"layers": "e.g. -1,-2,-3,-4 (0: embeddings)", "combine": "how layers combine"},
            choices={"combine": COMBINES},
            arrays=(".npy", ".npz"),
            save=_save_features,
            served=False,  # every layer of every piece: a file, not an answer
        ),
        Entry(
            "fill-mask",
            "fill_mask",
            "top-k tokens for each [MASK] (a model with its MLM head)",
            BertForMaskedLM,
            lambda x, r, i: {"text": x["texts"], "masks": r},
            needs="masked-LM head",
            remedy=PRE_TRAIN,
            also=("BertForPreTraining",),
            tensors=("cls.predictions.", "vocab_transform.", "lm_head."),
            head_label="masked LM (mlm)",
            options={"top_k": "tokens per [MASK]"},
            unused=ONE_ROW,
        ),
        Entry(
            "nsp",
            "nsp",
            "P(IsNext) of lines TEXT<TAB>NEXT (a model with its NSP head)",
            BertForPreTraining,
            lambda x, r, i: {"is_next": r},
            inputs=PAIRS,
            needs="next-sentence head",
            remedy=PRE_TRAIN,
            tensors=("cls.seq_relationship.",),
            head_label="next sentence (nsp)",
            unused=ONE_ROW,
        ),
        Entry(
            "classify",
            "classify",
            "labels and probabilities (a fine-tuned classifier); --pairs: TEXT<TAB>PAIR",
            BertForSequenceClassification,
            lambda x, r, i: r,
            inputs=(Input("texts", "text"), Input("pairs", "text_pair", optional=True)),
            needs="classifier",
            paired_unused=ONE_ROW,
            **CLASSIFIER,
        ),
        Entry(
            "ner",
            "ner",
            "entity spans with character offsets (a fine-tuned token classifier)",
            BertForTokenClassification,
            lambda x, r, i: {"text": x["texts"], "entities": r},
            needs="token classifier",
            **CLASSIFIER,
        ),
        Entry(
            "qa",
            "qa",
            "answers: lines QUESTION<TAB>CONTEXT or JSONL {question, context}",
            BertForQuestionAnswering,
            lambda x, r, i: r,
            inputs=(Input("questions", "question"), Input("contexts", "context")),
            needs="question-answering head",
            remedy=FINE_TUNE,
            tensors=("qa_outputs.",),
            head_label="span QA",
            options={
                "max_seq_length": "pieces per window (default: 384, at most the model's positions)",
                "doc_stride": "pieces between windows of a long context",
                "max_answer_length": "longest answer in pieces",
                "allow_no_answer": "answer '' when no span beats [CLS] (SQuAD v2.0)",
            },
            unused={  # its windows are SQuAD's, set by its own options
                "max_length": "qa's windows are --max-seq-length pieces",
                "stride": "qa's windows are --doc-stride pieces apart",
                "truncate": "qa reads every window of a long context (the answer may be in any)",
            },
            onnx=("start_logits", "end_logits"),
        ),
        Entry(
            "rerank",
            "score",
            "a cross-encoder's relevance score of lines QUERY<TAB>DOCUMENT (JSONL {query, "
            "document}); served as /rerank and /v1/rerank",
            BertForSequenceClassification,
            lambda x, r, i: {"score": r},
            inputs=(Input("queries", "query"), Input("documents", "document")),
            needs="cross-encoder",
            options={"raw_scores": "the logits, without the model's activation"},
            labels=1,
            **{
                **CLASSIFIER,
                "remedy": "train one (bertforge finetune --task rerank), or use a "
                "sentence-transformers CrossEncoder",
            },
        ),
        Entry(
            "summarize",
            "summarize",
            "extractive summaries, one document a line (JSONL {text}: paragraphs on lines; "
            "WikiExtractor files: each article's body, as finetune --task summarize reads "
            "them): the best sentences by a fine-tuned summarizer (finetune --task summarize), "
            "else by k-means over any model's sentence embeddings",
            BertModel,
            lambda x, r, i: r,
            documents=True,
            options={
                "sentences": "sentences per summary (default: 3)",
                "ratio": "keep this share of each document's sentences instead of --sentences "
                "(0 < r <= 1)",
                "mode": "trained (a summarizer's scores), kmeans or centroid (sentence "
                "embeddings); auto: trained for a summarizer, else kmeans",
                "block_trigrams": "keep a sentence that shares a word trigram with one chosen "
                "(default: skip it)",
            },
            choices={"mode": SUMMARY_MODES},
        ),
    )
}


def available(architectures: Sequence[str], labels: int | None = None) -> list[Entry]:
    """The entries a checkpoint of these architectures (and head outputs) supports, in the
    table's order."""
    return [e for e in ENTRIES.values() if e.available(architectures, labels)]


def head_labels(tensor_names: Sequence[str]) -> list[str]:
    """The heads (as `info` names them) whose tensors are among these names."""
    found: list[str] = []
    for e in ENTRIES.values():
        present = e.tensors and any(n.startswith(e.tensors) for n in tensor_names)
        if present and e.head_label not in found:
            found.append(e.head_label)
    return found


@dataclass
class CheckpointInfo:
    directory: Path
    config: BertConfig
    num_parameters: int
    dtypes: list[str]
    heads: list[str]
    weights_files: list[Path]
    pipelines: list[str]  # the pipelines of this table its architecture serves
    # the directory as inspect opened it: its vocabulary read from there, not again
    source: ModelDir | None = field(default=None, repr=False, compare=False)

    def vocabulary(self) -> dict[str, Any] | None:
        """The directory's vocabulary: its size and whether it is cased (None: it has none)."""
        from .tokenizer import Tokenizer

        if not Tokenizer.exists(self.directory):
            return None
        tok = (self.source or ModelDir.open(self.directory)).tokenizer
        return {"size": tok.vocab_size, "cased": not tok.lowercase}

    def report(self) -> dict[str, Any]:
        """What `bertforge info --json` prints: the encoder's shape, parameters, heads,
        pipelines, labels, vocabulary and weights files."""
        c = self.config
        return {
            "directory": str(self.directory),
            "model_type": c.model_type,
            "layers": c.num_hidden_layers,
            "hidden_size": c.hidden_size,
            "heads": c.num_attention_heads,
            "intermediate_size": c.intermediate_size,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings,
            "parameters": self.num_parameters,
            "dtypes": self.dtypes,
            "heads_present": self.heads,
            "pipelines": self.pipelines,
            "labels": c.id2label,
            "vocab": self.vocabulary(),
            "weights": [str(p.name) for p in self.weights_files],
        }

    def text(self) -> str:
        """What `bertforge info` prints: the same, one line per subject."""
        c, vocab = self.config, self.vocabulary()
        lines = [
            f"checkpoint   {self.directory}",
            f"encoder      {c.family.display} "
            f"L={c.num_hidden_layers} H={c.hidden_size} A={c.num_attention_heads} "
            f"I={c.intermediate_size} max_len={c.max_tokens} act={c.hidden_act}",
            f"parameters   {self.num_parameters:,} ({', '.join(self.dtypes)})",
            f"heads        {', '.join(self.heads) or 'none (encoder only)'}",
            f"pipelines    {', '.join(self.pipelines)}",
        ]
        if c.id2label:
            lines.append(f"labels       {', '.join(c.id2label[i] for i in sorted(c.id2label))}")
        have = "no vocab.txt or tokenizer.json"
        if vocab:
            have = f"{vocab['size']:,} tokens, {'cased' if vocab['cased'] else 'uncased'}"
        lines.append(f"vocabulary   {have} (config vocab_size {c.vocab_size:,})")
        lines.append(f"weights      {', '.join(p.name for p in self.weights_files)}")
        return "\n".join(lines)


def inspect(path: str | os.PathLike[str]) -> CheckpointInfo:
    """What a checkpoint can do: config, parameter count, heads and the pipelines it serves,
    reading only the weights files' headers."""
    source = ModelDir.open(path)
    directory, config = source.path, source.config
    params = parameter_shapes(directory)
    pooler = any(n.endswith(("pooler.dense.weight", "pre_classifier.weight")) for n in params)
    return CheckpointInfo(
        directory=directory,
        config=config,
        num_parameters=sum(math.prod(shape) for shape, _ in params.values()),
        dtypes=sorted({d for _, d in params.values()}),
        heads=["pooler"] * pooler + head_labels(list(params)),
        weights_files=weights_files(directory),
        pipelines=[e.name for e in available(source.architectures, config.num_labels)],
        source=source,
    )
