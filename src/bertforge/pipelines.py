"""Inference front doors: fill-mask, classify, ner, qa, embed, nsp, features, rerank,
summarize.

    pipe = Pipeline("path/to/model")
    pipe.embed(["a sentence", "another"], pooling="mean", normalize=True)   # (N, H) numpy
    pipe.embed(["a query"], prompt_name="query", dimensions=128)             # (N, 128)
    pipe.fill_mask(["the capital of france is [MASK]."])                     # top-k per [MASK]
    pipe.classify(["a fine film"]); pipe.ner(["Alice lives in Paris."])
    pipe.qa(["Where?"], ["Alice lives in Paris."]); pipe.nsp(["A."], ["B."])
    pipe.features(["text"], layers=(-1, -2, -3, -4), combine="concat")
    pipe.rerank("query", ["a document", "another"], top_k=1)   # a cross-encoder's order
    pipe.summarize(["A long document. ..."], sentences=3)        # its best sentences, in order

Every pipeline runs through the one inference runner (runner.py: length-sorted batches,
results in the input order, precision "auto" = bf16 wherever the device has bf16 arithmetic)
and decodes with its task's own decoder (bertforge.tasks: the classifier's labels, NER's
entity decoder, SQuAD's windows and n-best), the same code `evaluate` uses. Each method is
one entry of the catalogue (catalogue.py: the model class it loads, the head it needs, its
inputs and options, how the CLI and the server expose it); a pipeline that needs a trained
head (fill-mask: the MLM head; nsp; classify; ner; qa; rerank) refuses a checkpoint without
one instead of answering with random weights.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from . import embedding
from .catalogue import COMBINES, ENTRIES
from .checkpoint import load_trained, load_with_fresh
from .config import BertConfig
from .data.tasks import SquadExample
from .data.tasks.documents import SummaryExample, document
from .embedding import POOLINGS
from .errors import ConfigError, InputError, ItemError, check_choice
from .heads import BertForTokenClassification
from .model import BertModel
from .modeldir import ModelDir
from .runner import Runner, prepared, progress_bar
from .tasks import (
    TaskOptions,
    document_scorer,
    family,
    ranking,
    run_task_options,
    sentence,
    summarize,
    tagging,
)
from .tasks.base import Features, infer, on_device
from .tasks.windows import Layout, Stitcher, Windows, contributions, split


def quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantisation: per-channel int8 weights for every Linear layer except each
    FFN's down-projection, which stays fp32: its inputs (GELU outputs) have the outliers that
    per-batch activation scales handle worst. On all-MiniLM-L6-v2 (64 STS-B sentences) the
    embeddings' cosine to fp32 is 0.989 mean / 0.984 min this way, against 0.954 / 0.931 for
    the default per-tensor quantisation of every layer."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    spec = {
        name: qconfig
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not name.endswith("ffn.down")
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for qint8 tensors
        return torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)


def _first(enc: Any, n: int) -> Any:
    """An encoding cut to its first n results: [CLS], n - 2 pieces, its [SEP] (truncate)."""
    if n == len(enc.ids):
        return enc
    keep = [*range(n - 1), len(enc.ids) - 1]
    return SimpleNamespace(
        **{k: [getattr(enc, k)[j] for j in keep] for k in ("ids", "tokens", "offsets", "word_ids")}
    )


# Texts per part where the runner overlaps (Pipeline._parts; 0: all at once). On the 2-core CPU
# with a model that does nothing, tokenising the next part in a thread made 50,000 sentences
# slower (2.1-2.3 s against 1.7-1.9 s: the tokenizer's threads take both cores); a GPU machine
# has cores to spare: benchmarks/gpu.py measures both there.
PART = 4096


class Pipeline:
    """One model directory; each task loads the head it needs once and keeps it."""

    def __init__(
        self,
        model: str | Path | ModelDir,
        *,
        device: str | None = None,
        precision: str = "auto",
        batch_size: int | None = None,
        max_tokens: int | None = None,
        max_length: int | None = None,
        stride: int | None = None,
        truncate: bool = False,
        quantize: str | None = None,
    ) -> None:
        """batch_size: rows per batch (default: 32 on the CPU, 512 on a GPU); max_tokens: the
        pieces a batch may hold, padded (default: no cap on the CPU, 65,536 on a GPU): rows of
        similar length go together, so short texts make large batches and long ones small.
        max_length: pieces per row (default: the model's; embed: its sentence-transformers
        max_seq_length). A longer text is read in windows `stride` pieces apart (default: half
        a window), each piece from the window where it has the most context (tasks.windows);
        truncate: the first window only. A sentence pair (nsp, classify with pairs) and a
        fill-mask text are one row each, cut to max_length (default: the tokenizer's
        model_max_length), the longer text of a pair first; all rows at most the model's
        positions. qa reads its own windows (its max_seq_length and doc_stride).
        quantize "int8": dynamic int8 quantisation of the Linear layers (CPU only; weights
        int8, activations quantised per batch; precision auto or fp32, as its kernels take
        fp32 activations): faster on CPUs without bf16 units, at a small cost in accuracy
        (benchmarks/inference_throughput.py measures both)."""
        self.source = ModelDir.open(model)  # read once, whatever each task asks of it
        self.path = self.source.path
        self.tok = self.source.tokenizer
        self.runner = Runner.create(device, precision, batch_size, max_tokens)
        self.device = self.runner.device
        self.max_length, self.stride, self.truncate = max_length, stride, truncate
        for name, value in (("max_length", max_length), ("stride", stride)):
            if value is not None and value < (3 if name == "max_length" else 1):
                raise ConfigError(f"{name}={value}: must be >= {3 if name == 'max_length' else 1}")
        if quantize not in (None, "int8"):
            raise ConfigError(f"quantize={quantize!r}: must be None or int8")
        if quantize and self.device.type != "cpu":
            raise ConfigError("quantize=int8 is for the CPU (dynamic quantisation)")
        if quantize and precision not in ("auto", "fp32"):
            raise ConfigError(
                f"quantize=int8 with precision={precision}: int8 kernels take fp32 activations; "
                "leave precision auto (or fp32), or drop quantize"
            )
        if quantize:
            self.runner.precision = "fp32"  # int8 kernels take fp32 activations
        self.quantize = quantize
        self._models: dict[type, nn.Module] = {}

    # -- loading and batching ----------------------------------------------------------------

    def model(self, cls: type, needs_head: str | None = None, remedy: str = "") -> Any:
        """The checkpoint as `cls` (cached); needs_head names the trained head it must have,
        remedy says where to find one."""
        if cls is BertModel and cls not in self._models and (bert := self._loaded_encoder()):
            self._models[cls] = bert
        if cls not in self._models:
            with self.source.reading():
                m = (
                    load_trained(cls, self.path, needs_head, remedy)
                    if needs_head
                    else load_with_fresh(cls, self.path)[0]
                )
            m = m.to(self.device).eval()
            if self.quantize == "int8":
                m = quantize_int8(m)
            self._models[cls] = m
        return self._models[cls]

    def _loaded_encoder(self) -> BertModel | None:
        """The encoder of a head model already loaded (its `bert`): embedding with a
        classifier's encoder neither reads its weights again nor keeps a second copy."""
        encoders = (getattr(m, "bert", None) for m in self._models.values())
        return next((m for m in encoders if isinstance(m, BertModel)), None)

    def model_for(self, pipeline: str) -> Any:
        """The model a pipeline of the catalogue loads, refused without the head it needs."""
        entry = ENTRIES[pipeline]
        return self.model(entry.model, entry.needs or None, entry.remedy)

    @functools.cached_property
    def config(self) -> BertConfig:
        """The checkpoint's config (read once; no weights loaded)."""
        return self.source.config

    @functools.cached_property
    def embedding_settings(self) -> embedding.Embedding:
        """How the model directory pools its sentence vectors (read once; bertforge.embedding)."""
        return self.source.embedding

    @functools.cached_property
    def activation(self) -> str:
        """A cross-encoder's activation, as its directory names it (read once; tasks.ranking)."""
        return self.source.read(ranking.activation)

    @property
    def precision(self) -> str:
        return self.runner.precision

    def run(self, rows: Sequence[Any] | Features, fn: Callable[[dict[str, Any]], Any]) -> list[Any]:
        """fn(batch) for the runner's batches of rows (encodings or Features); fn returns one
        item per row (its batch's order; batch["rows"]: their indices); the items come back in
        the rows' order. batch["inputs"]: input_ids, token_type_ids, attention_mask, the model's
        positional inputs; input_ids and attention_mask also under their own names;
        batch["packing"]: where the runner overlaps (a GPU), the rows as the host knows them
        (BertModel's `rows`: its ids checked here, so the device reads nothing back), else None."""
        features = rows if isinstance(rows, Features) else Features.from_encodings(rows)
        lengths = features.lengths  # computed once (the property goes over every row)

        def make(rows: np.ndarray) -> dict[str, Any]:
            b, packing = on_device(
                features, rows, lengths, self.tok.pad_id, self.runner, self.config
            )
            return {
                "inputs": (b.input_ids, b.token_type_ids, b.attention_mask),
                "input_ids": b.input_ids,
                "attention_mask": b.attention_mask,
                "rows": torch.from_numpy(rows),
                "packing": packing,
            }

        return self.runner(lengths, make, fn)

    def windows(
        self,
        texts: Sequence[str],
        max_length: int | None = None,
        *,
        views: bool = True,
        warn: bool = True,
    ) -> tuple[list[Any], Features, Windows]:
        """Whole texts' encodings and their rows: one per text, or windows (tasks.windows).
        views=False: each text's ids as an array instead of its Encoding (what a caller that
        needs only the rows passes: the views cost host time). warn: say how many texts
        truncate cut (a caller reading texts in parts says it once, `_warn_cut`)."""
        if isinstance(texts, str):
            raise InputError("pass a list of texts (a single string is not a list)")
        strings = [t for t in texts if isinstance(t, str)]
        if not strings:
            encoded: Any = iter([])
        elif views:
            encoded = iter(self.tok.encode_batch(strings, truncation=False))
        else:
            encoded = iter(self.tok.ids_batch(strings))
        encodings = [
            next(encoded) if isinstance(t, str) else self._pieces(t, i, views)
            for i, t in enumerate(texts)
        ]
        features, windows = split(encodings, self._limit(max_length), self.stride, self.truncate)
        if warn:
            self._warn_cut(windows.texts_cut, len(encodings), max_length)
        return encodings, features, windows

    def _limit(self, max_length: int | None) -> int:
        """Pieces per row: the pipeline's max_length, else the caller's, at most the model's."""
        positions = self.config.max_tokens
        return min(self.max_length or max_length or positions, positions)

    def _warn_cut(self, cut: int, texts: int, max_length: int | None) -> None:
        if self.truncate and cut:
            warnings.warn(
                f"{cut} of {texts} texts are longer than {self._limit(max_length)} pieces: "
                "truncate keeps their first window only",
                stacklevel=4,
            )

    def _pieces(self, ids: Sequence[int], i: int, view: bool = True) -> Any:
        """An input given as piece ids (no [CLS]/[SEP]) as an encoding of its own (view=False:
        its ids as an array)."""
        vocab = self.tok.vocab_size
        if isinstance(ids, (bytes, dict)) or not isinstance(ids, Iterable):
            kind = type(ids).__name__
            raise ItemError("input", i, f"expected a text or a list of piece ids, got {kind}")
        ids = list(ids)
        if not all(isinstance(k, (int, np.integer)) and 0 <= k < vocab for k in ids):
            raise ItemError("input", i, f"piece ids must be integers in [0, {vocab})")
        row, _ = self.tok.row(ids)
        return SimpleNamespace(ids=row.tolist()) if view else row

    def per_token(
        self, texts: Sequence[str], fn: Callable[[dict[str, Any]], list[np.ndarray]]
    ) -> tuple[list[Any], list[Any]]:
        """Whole texts' encodings (cut to what was read, with truncate) and fn's per-token
        results of each text (n + 2 rows, or a dict of such), stitched from its windows."""
        encodings, features, windows = self.windows(texts)
        layout = Layout(windows, len(texts))
        stitchers: dict[Any, Stitcher] = {}  # per key of fn's dicts (None: fn gives arrays)

        def stitched(b: dict[str, Any]) -> list[None]:
            # Each row goes into its text's results as its batch comes: holding every window's
            # rows until the end would take twice the answer's memory (the windows overlap).
            items = fn(b)
            for k, item in zip(b["rows"].tolist(), items):
                for key, row in item.items() if isinstance(item, dict) else [(None, item)]:
                    if key not in stitchers:
                        stitchers[key] = Stitcher(layout)
                    stitchers[key].add(k, row)
            return [None] * len(items)

        self.run(features, stitched)
        if not stitchers or None in stitchers:
            results: list[Any] = stitchers[None].results if stitchers else []
            sizes = [len(r) for r in results]
        else:
            parts = [s.results for s in stitchers.values()]
            results = [dict(zip(stitchers, values)) for values in zip(*parts)]
            sizes = [len(parts[0][i]) for i in range(len(results))]
        return [_first(e, n) for e, n in zip(encodings, sizes)], results

    def _row_limit(self) -> int:
        """Pieces per row read whole, not in windows (a sentence pair, a cross-encoder's row, a
        fill-mask text): the pipeline's max_length, else the tokenizer's model_max_length, at
        most the model's positions (a model pre-trained at 128 saves model_max_length 512)."""
        return self._limit(self.tok.model_max_length)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[Any]:
        """Each text (or pair) as one row, cut to `_row_limit` pieces (a pair: the longer text
        loses pieces first)."""
        if isinstance(texts, str):
            raise InputError("pass a list of texts (a single string is not a list)")
        return self.tok.encode_batch(
            list(texts), None if pairs is None else list(pairs), max_length=self._row_limit()
        )

    # -- the pipelines -------------------------------------------------------------------------

    def embed(
        self,
        texts: Sequence[str] | Sequence[Sequence[int]],
        pooling: str | None = None,
        normalize: bool | None = None,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """(N, D) float32 sentence embeddings, pooled as the model directory says
        (bertforge.embedding: its sentence-transformers modules; else mean, not normalised) unless
        pooling (one of POOLINGS) or normalize say otherwise. A text longer than the window is
        pooled over all its pieces, each from its max-context window (cls: the first window's
        [CLS]). An input may be given as its piece ids instead (without [CLS] and [SEP]).

        prompt_name: one of the model's prompts (config_sentence_transformers.json, and
        sentence-transformers' own "query" and "document", empty unless the model gives them);
        prompt: a literal text instead; neither: the model's default_prompt_name, if any. The
        prompt goes before every text (its pieces before piece ids), and pooling leaves its
        tokens out where the Pooling says include_prompt: false, as
        SentenceTransformer.encode(prompt_name=..., prompt=...) does.

        dimensions: the first D of the pooled dimensions (Matryoshka), renormalised when the
        vectors are normalised (the model's Normalize, or normalize=True). That is
        SentenceTransformer(dir, truncate_dim=D).encode(normalize_embeddings=True) for
        normalised vectors, and with normalize_embeddings=False for the others; unlike
        sentence-transformers' default, the first D of a unit vector are made unit length
        again, so dot products stay cosines."""
        if pooling is not None:
            check_choice("pooling", pooling, POOLINGS)
        own = self.embedding_settings
        modes = (pooling,) if pooling else own.pooling
        embedding.check_dimensions(dimensions, self.config.hidden_size * len(modes))
        texts, skip = self._prompted(texts, embedding.prompt_text(own, prompt_name, prompt))
        out = self._pooled(texts, modes, skip)
        return embedding.shortened(
            out, dimensions, own.normalize if normalize is None else normalize
        )

    def _prompted(self, texts: Any, prompt: str) -> tuple[Any, int]:
        """The inputs with the prompt before each (text, or its pieces before piece ids), and
        the tokens pooling leaves out: none, or (include_prompt false) [CLS] and the prompt's
        pieces, counted as sentence-transformers counts them (the prompt encoded alone, less
        its [SEP]). An empty prompt is none."""
        if not prompt or isinstance(texts, str):  # a single string: windows() refuses it
            return texts, 0
        ids = self.tok.encode(prompt, truncation=False).ids  # [CLS] prompt [SEP]
        pieces = ids[1:-1]
        prompted = [prompt + t if isinstance(t, str) else [*pieces, *t] for t in texts]
        return prompted, 0 if self.embedding_settings.include_prompt else len(ids) - 1

    def _pooled(self, texts: Any, modes: tuple[str, ...], skip: int) -> np.ndarray:
        """(N, H * len(modes)) float32: the texts' pooled states, not normalised, read in parts
        (`_parts`: where the runner overlaps, the next part is tokenised while the device
        reads this one)."""
        model = self.model_for("embed")
        out = np.zeros((len(texts), model.config.hidden_size * len(modes)), np.float32)
        running: dict[int, embedding.RunningPool] = {}  # per long text: its pool so far
        parts = self._parts(texts)
        limit = self.embedding_settings.max_length
        listed = texts if len(parts) == 1 else list(texts)  # by position (a pandas Series too)

        def rows_of(part: np.ndarray) -> tuple[list[Any], Features, Windows]:
            some = texts if len(parts) == 1 else [listed[i] for i in part]
            return self.windows(some, limit, views=False, warn=len(parts) == 1)

        cut = 0
        for part, (_, features, windows) in prepared(iter(parts), rows_of, len(parts) > 1):
            cut += windows.texts_cut
            self._pool_part(model, features, windows, part, out, running, (modes, skip))
        if len(parts) > 1:
            self._warn_cut(cut, len(texts), limit)
        for i, pooled in running.items():
            out[i] = pooled.vector().cpu().numpy()
        return out

    def _parts(self, texts: Any) -> list[np.ndarray]:
        """The texts' indices in the parts they are read in: all at once; or, where the runner
        overlaps and every input is a string, parts of PART texts of similar lengths (sorted by
        characters, so the batches are still cut from rows of similar lengths)."""
        n = len(texts)
        if not (self.runner.overlaps and PART) or n <= PART or isinstance(texts, str):
            return [np.arange(n)]
        if not all(isinstance(t, str) for t in texts):  # piece ids among them: all at once
            return [np.arange(n)]
        order = np.argsort(np.fromiter(map(len, texts), np.int64, n), kind="stable")
        return np.array_split(order, -(-n // PART))

    def _pool_part(
        self,
        model: nn.Module,
        features: Features,
        windows: Windows,
        part: np.ndarray,
        out: np.ndarray,
        running: dict[int, embedding.RunningPool],
        pooling: tuple[tuple[str, ...], int],
    ) -> None:
        """The rows of one part of the texts (`part`: their indices among all the texts), pooled
        into `out` (whole texts) and `running` (a long text's windows, by its index)."""
        whole, lengths, (modes, skip) = windows.whole, features.lengths, pooling
        layout = Layout(windows, len(part)) if windows.cut else None

        def fn(b: dict[str, Any]) -> Any:
            h = model(*b["inputs"], rows=b["packing"]).last_hidden_state
            rows = b["rows"].numpy()
            ours = whole[rows]  # the rows that are their whole text (most)
            if layout is not None and not ours.all():
                for j in np.flatnonzero(~ours).tolist():
                    text, keep, positions = layout.place(int(rows[j]), int(lengths[rows[j]]))
                    key = int(part[text])
                    if key not in running:
                        running[key] = embedding.RunningPool(modes, int(layout.sizes[text]), skip)
                    # index_select: torch's h[j, keep] takes milliseconds on a busy CPU
                    states = h[j].index_select(0, torch.from_numpy(keep).to(h.device))
                    running[key].add(states, torch.from_numpy(positions).to(h.device))
            vectors = embedding.pool(h, b["attention_mask"], modes, skip)

            def put(v: np.ndarray) -> None:
                out[part[windows.text[rows[ours]]]] = v[ours]

            return self.runner.later(vectors, put)

        self.run(features, fn)

    def features(
        self,
        texts: Sequence[str],
        layers: Sequence[int] = (-1,),
        combine: str | None = "concat",
    ) -> list[dict[str, Any]]:
        """Per text: tokens, their character offsets, and the hidden states of `layers`
        (0 = embeddings, -1 = last): "layers" {index: (T, H)}, and with combine "values"
        (T, H * k) or (T, H). Every piece of a long text, each from its max-context window."""
        if combine is not None:
            check_choice("combine", combine, COMBINES)
        model = self.model_for("features")
        n = model.config.num_hidden_layers + 1
        for layer in layers:
            if not -n <= layer < n:
                raise ConfigError(f"layer {layer}: this model has layers -{n}..{n - 1}")

        def fn(b: dict[str, Any]) -> list[dict[int, np.ndarray]]:
            out = model(*b["inputs"], output_hidden_states=True, rows=b["packing"])
            states = {k: out.hidden_states[k].float().cpu().numpy() for k in layers}
            lengths = b["attention_mask"].sum(1).tolist()
            return [{k: v[j, : lengths[j]] for k, v in states.items()} for j in range(len(lengths))]

        combined = {  # the layers' (T, H) arrays as one
            "concat": lambda stack: np.concatenate(stack, -1),
            "sum": lambda stack: np.sum(stack, 0),
            "mean": lambda stack: np.mean(stack, 0),
        }
        results = []
        for enc, per_layer in zip(*self.per_token(texts, fn)):
            item: dict[str, Any] = {
                "tokens": enc.tokens,
                "offsets": enc.offsets,
                "layers": per_layer,
            }
            if combine is not None:
                stack = [per_layer[k] for k in layers]
                # one layer: its own array (concat, sum and mean of one give its very values; a
                # copy would double the memory of a long text's answer)
                item["values"] = stack[0] if len(stack) == 1 else combined[combine](stack)
            results.append(item)
        return results

    def fill_mask(self, texts: Sequence[str], top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
        """Per text, per [MASK] in it: the top_k tokens with their probabilities."""
        model = self.model_for("fill-mask")
        if not 1 <= top_k <= model.config.vocab_size:
            raise ConfigError(f"top_k={top_k}: must be in [1, {model.config.vocab_size}]")
        mask_id = self.tok.mask_id
        if mask_id is None:
            raise ConfigError(f"{self.tok.source}: the tokenizer has no mask token")
        encodings = self.encode(texts)
        for i, e in enumerate(encodings):
            if (why := self._masks_unread(texts[i], e.ids, mask_id)) is not None:
                raise ItemError("text", i, why)

        def fn(b: dict[str, Any]) -> list[list[dict[str, Any]]]:
            hits = b["input_ids"] == mask_id  # (B, T)
            counts = hits.sum(1).tolist()
            # each row's [MASK] positions first, in order: the head scores those only (the whole
            # vocabulary at every position of a batch of 65,536 pieces would be 20 GB)
            first = torch.argsort((~hits).to(torch.int8), dim=1, stable=True)[:, : max(counts)]
            logits = model(*b["inputs"], rows=b["packing"], mlm_positions=first).mlm_logits
            p, ids = logits.float().softmax(-1).topk(top_k, dim=-1)  # (B, P, top_k)
            p, ids = p.tolist(), ids.tolist()
            # a token's text, as transformers' fill-mask shows it: "it", not the byte-level
            # piece "Ġit" (a BERT piece decodes to itself: "##ing")
            text = functools.partial(self.tok.decode, skip_special_tokens=False)
            return [
                [
                    [{"token": text([k]), "id": k, "score": s} for k, s in zip(ids[j][m], p[j][m])]
                    for m in range(n)
                ]
                for j, n in enumerate(counts)
            ]

        return self.run(encodings, fn)

    def _masks_unread(self, text: str, row: Sequence[int], mask_id: int) -> str | None:
        """Why a text's row (its pieces, cut at the length limit) cannot answer it: it has no
        [MASK], or the limit cut off one or more of its [MASK]s (answering the others alone
        would pass for the whole answer); None: the row holds every one."""
        limit = self._row_limit()
        if mask_id in row and len(row) < limit:
            return None  # nothing was cut
        whole = self.tok.encode(text, truncation=False).ids
        at = [k for k, piece in enumerate(whole) if piece == mask_id]
        cut = at[list(row).count(mask_id) :]
        mask = self.tok.specials.mask  # [MASK], RoBERTa's <mask>
        if not at:
            return f"no {mask} token in {text[:80]!r}"
        if not cut:
            return None
        why = f"max_length, at most the model's {self.config.max_tokens} positions"
        if len(at) == 1:
            return (
                f"its {mask} is piece {at[0]} of {len(whole)}, cut off by the length limit of "
                f"{limit} pieces ({why}): shorten the text before it"
            )
        return (
            f"{len(cut)} of its {len(at)} {mask} tokens are past the length limit of {limit} "
            f"pieces (pieces {', '.join(map(str, cut))} of {len(whole)}; {why}) in "
            f"{text[:40]!r}...: shorten the text before them, or split it"
        )

    def nsp(self, texts: Sequence[str], pairs: Sequence[str]) -> list[float]:
        """P(IsNext) of each (text, pair): does the pair follow the text?"""
        if len(texts) != len(pairs):
            raise InputError(f"{len(texts)} texts but {len(pairs)} pairs")
        model = self.model_for("nsp")

        def fn(b: dict[str, Any]) -> list[float]:
            logits = model(*b["inputs"], rows=b["packing"]).nsp_logits
            return logits.float().softmax(-1)[:, 0].tolist()  # index 0 = IsNext (Google's)

        return self.run(self.encode(texts, pairs), fn)

    def classify(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Per text (or pair): the label, its probability and every label's; a multi-label
        model: the labels over their thresholds and every label's probability; a regression
        model: the score. The model's problem object (tasks.sentence) decides, as `evaluate`
        does; a long text's windows are averaged in probability space."""
        model = self.model_for("classify")
        problem = sentence.problem_of_model(model.config)
        if pairs is None:
            _, features, windows = self.windows(texts)
            owners, weights = [w.text for w in windows], contributions(windows)
        else:  # a pair is one row
            features = Features.from_encodings(self.encode(texts, pairs))
            owners, weights = list(range(len(texts))), np.ones(len(texts))
        rows = infer(self.runner, model, features, self.tok.pad_id, encoder=self.config)
        if not rows:
            return []
        probs = problem.probabilities(np.stack(rows))
        groups: list[list[int]] = [[] for _ in texts]
        for row, owner in enumerate(owners):
            groups[owner].append(row)
        # a long text: its windows' probabilities (scores) averaged, weighted by the pieces each
        # window answers for
        mean = [
            probs[g[0]] if len(g) == 1 else np.average(probs[g], axis=0, weights=weights[g])
            for g in groups
        ]
        return problem.answers(np.stack(mean))

    def score(
        self,
        queries: Sequence[str | Sequence[int]],
        documents: Sequence[str | Sequence[int]],
        raw_scores: bool = False,
        truncate: bool | None = None,
    ) -> list[float]:
        """A cross-encoder's relevance score of each (query, document) pair, through the
        activation its directory names (tasks.ranking; raw_scores: the logit). A document
        longer than the model reads is read in windows beside the query: its best window's
        score (truncate, default the pipeline's: the first window's). A query or document may
        be given as its piece ids (piece_ids), as the server gives them."""
        if isinstance(queries, str) or isinstance(documents, str):
            raise InputError("pass lists of queries and documents (a single string is not a list)")
        if len(queries) != len(documents):
            raise InputError(f"{len(queries)} queries but {len(documents)} documents")
        model = self.model_for("rerank")
        if model.config.num_labels != 1:
            raise ConfigError(
                f"{self.path.name}: a classifier of {model.config.num_labels} labels; rerank "
                "needs a cross-encoder (one output: bertforge finetune --task rerank)"
            )
        name = "identity" if raw_scores else self.activation
        if not queries:
            return []
        features, owners = self.pair_rows(queries, documents, truncate)
        logits = infer(self.runner, model, features, self.tok.pad_id, encoder=self.config)
        values = ranking.activate(torch.from_numpy(np.stack(logits)[:, 0]), name).numpy()
        best = np.full(len(queries), -np.inf)
        np.maximum.at(best, owners, values)
        return best.tolist()

    def pair_rows(
        self,
        queries: Sequence[str | Sequence[int]],
        documents: Sequence[str | Sequence[int]],
        truncate: bool | None = None,
    ) -> tuple[Features, np.ndarray]:
        """The rows a cross-encoder reads for (query, document) pairs, texts or piece ids
        (ranking.pair_rows: a long document in windows beside the query; truncate, None: the
        pipeline's) and (rows,) the pair each row reads; the server counts a request's pieces
        with it."""
        pieces = self.piece_ids([*queries, *documents])
        limit, first = self._row_limit(), self.truncate if truncate is None else truncate
        ids, types, owners = [], [], []
        for i, (q, d) in enumerate(zip(pieces[: len(queries)], pieces[len(queries) :])):
            for row, kinds in ranking.pair_rows(q, d, self.tok, limit, self.stride, first):
                ids.append(row)
                types.append(kinds)
                owners.append(i)
        return Features(ids, types, np.zeros(len(ids), np.int64)), np.asarray(owners, np.int64)

    def piece_ids(self, texts: Sequence[str | Sequence[int]]) -> list[np.ndarray]:
        """Each text's piece ids without [CLS] and [SEP], whole; a text given as piece ids is
        checked to be in the vocabulary and kept. Each distinct text is tokenised once (a query
        beside N documents is one text): the server tokenises a rerank request's texts with it,
        once, and hands the ids to its cost and to the model call."""
        strings = list(dict.fromkeys(t for t in texts if isinstance(t, str)))
        found = dict(zip(strings, self.tok.ids_batch(strings))) if strings else {}
        return [
            found[t][1:-1] if isinstance(t, str) else self._pieces(t, i, view=False)[1:-1]
            for i, t in enumerate(texts)
        ]

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        raw_scores: bool = False,
    ) -> list[dict[str, Any]]:
        """The documents ordered by a cross-encoder's score for the query (ties: input order):
        [{"index", "score"}], the top_k first ones (default: all)."""
        if not isinstance(query, str):
            raise InputError("query: expected a string")
        if top_k is not None and top_k < 1:
            raise ConfigError(f"top_k={top_k}: must be >= 1")
        scores = self.score([query] * len(documents), documents, raw_scores)
        return [{"index": i, "score": scores[i]} for i in ranking.ranked(scores)[:top_k]]

    def ner(self, texts: Sequence[str]) -> list[list[dict[str, Any]]]:
        """Per text: entities {entity, text, start, end, score}: each word tagged by its first
        piece and the tags decoded into spans by the metric's own decoder (tasks.tagging),
        character offsets into the text."""
        model = self.model_for("ner")
        tags = tagging.model_tags(model.config, self.path)

        def fn(b: dict[str, Any]) -> list[np.ndarray]:
            logits = model(*b["inputs"], rows=b["packing"]).logits
            values, lengths = logits.float().cpu().numpy(), b["attention_mask"].sum(1).tolist()
            return [values[j, :n] for j, n in enumerate(lengths)]

        encodings, rows = self.per_token(texts, fn)
        results = []
        for text, enc, logits in zip(texts, encodings, rows):
            n = 1 + max((w for w in enc.word_ids if w is not None), default=-1)
            first = tagging.first_pieces(enc.word_ids, n)
            spans = [[0, 0] for _ in range(n)]
            for j, w in enumerate(enc.word_ids):  # a word spans its first to its last piece
                if w is not None:
                    spans[w] = [
                        enc.offsets[j][0] if j == first[w] else spans[w][0],
                        enc.offsets[j][1],
                    ]
            predicted, scores = tagging.word_tags(logits, first, tags)
            results.append(tagging.entities(text, predicted, scores, spans))
        return results

    def qa_options(
        self,
        max_seq_length: int | None = None,
        doc_stride: int = 128,
        max_answer_length: int = 30,
        allow_no_answer: bool = False,
    ) -> TaskOptions:
        """`qa`'s options as the SQuAD task reads them, checked against this model (one
        ConfigError naming a bad one: a stride under 1 would never end); max_seq_length None:
        SQuAD's 384, at most the model's positions. The server counts a request's pieces by
        them before any work."""
        options = TaskOptions(
            task="squad2" if allow_no_answer else "squad",
            max_seq_length=max_seq_length,
            doc_stride=doc_stride,
            max_answer_length=max_answer_length,
        )
        if max_seq_length is None:  # SQuAD's 384; a model of 128 positions reads 128
            assert options.max_seq_length is not None  # TaskOptions sets it
            rows = min(options.max_seq_length, self.config.max_tokens)
            options = dataclasses.replace(options, max_seq_length=rows)
        options.check_model(self.config)
        return options

    def qa(
        self,
        questions: Sequence[str],
        contexts: Sequence[str],
        *,
        max_seq_length: int | None = None,
        doc_stride: int = 128,
        max_answer_length: int = 30,
        allow_no_answer: bool = False,
    ) -> list[dict[str, Any]]:
        """Per question: the answer text, its probability among the n-best, its character span
        in the context: SQuAD's family (windows, max-context, n-best), as `evaluate` answers.
        Its windows are max_seq_length pieces (default: SQuAD's 384, at most the model's
        positions), doc_stride apart, whatever the pipeline's max_length, stride and truncate."""
        if len(questions) != len(contexts):
            raise InputError(f"{len(questions)} questions but {len(contexts)} contexts")
        model = self.model_for("qa")
        options = self.qa_options(max_seq_length, doc_stride, max_answer_length, allow_no_answer)
        fam = family(options, self.tok)
        examples = [
            SquadExample(str(i), q, c, [], False, "")
            for i, (q, c) in enumerate(zip(questions, contexts))
        ]
        answers = fam.predict(self.runner, model, examples, fam.featurize(examples))
        results = []
        for ex in examples:
            best = next(
                (c for c in answers.nbest[ex.qid] if c["text"] == answers.predictions[ex.qid]),
                answers.nbest[ex.qid][0],
            )
            start = best["start"]
            results.append(
                {
                    "answer": answers.predictions[ex.qid],
                    "score": best["probability"],
                    "start": start,
                    "end": start + len(best["text"]) if start >= 0 else -1,
                }
            )
        return results

    def summarize(
        self,
        texts: Sequence[str],
        sentences: int | None = None,
        ratio: float | None = None,
        mode: str = "auto",
        block_trigrams: bool = True,
        progress: bool = False,
    ) -> list[dict[str, Any]]:
        """Per document (its paragraphs on lines): an extractive summary, {"summary": the chosen
        sentences joined by spaces, "sentences": [{index, text, start, end, score}] in document
        order (character offsets into the text), "mode"}. `sentences` per summary (default 3),
        or round(ratio x the document's sentences), not both; trigram blocking skips a sentence
        sharing a word trigram with one chosen before it (tasks.summarize).

        mode: trained, the sentences a fine-tuned summarizer (finetune --task summarize) scores
        best; kmeans, with any embedding model, the sentence nearest each centre of k-means over
        the document's sentence embeddings (k = the summary's length), as the
        bert-extractive-summarizer package does; centroid, those nearest the document's mean
        embedding; auto, trained for a summarizer, else kmeans. An empty document has an empty
        summary; one shorter than the summary is kept whole. progress: show how many of the
        sentences are read (runner.progress_bar; the CLI's, whose documents may take minutes)."""
        check_choice("mode", mode, summarize.MODES)
        summarize.summary_length(0, sentences, ratio)  # checked before any work, or any text
        if isinstance(texts, str):
            raise InputError("pass a list of texts (a single string is not a list)")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(f"text {i}: expected a string, got {type(t).__name__}")
        docs = [document(t, str(i)) for i, t in enumerate(texts)]
        counts = [summarize.summary_length(len(d.sentences), sentences, ratio) for d in docs]
        if mode == "auto":
            mode = "trained" if self._is_summarizer else "kmeans"
        total = sum(len(d.sentences) for d in docs)  # a row each (BertSum's: _summary_scores)
        with self.runner.showing(
            progress_bar("summarize", total, "sentences") if progress else None
        ):
            if mode == "trained":
                scores = self._summary_scores(docs)
                chosen = [
                    summarize.select(s, d.sentences, k, block_trigrams)
                    for d, s, k in zip(docs, scores, counts)
                ]
            else:
                chosen, scores = self._unsupervised_summaries(docs, counts, mode, block_trigrams)
        return [summarize.answer(d, c, s, mode) for d, c, s in zip(docs, chosen, scores)]

    @property
    def _is_summarizer(self) -> bool:
        """A trained summarizer: a document scorer's directory, or a BertSum token classifier."""
        return document_scorer.is_document_summarizer(self.path) or summarize.is_summarizer(
            self.config
        )

    @functools.cached_property
    def _document_scorer(self) -> document_scorer.DocumentScorer:
        scorer = document_scorer.DocumentScorer.from_pretrained(self.path).to(self.device)
        width = document_scorer.vector_width(self.config, self.embedding_settings)
        document_scorer.check_width(scorer, width, self.path)
        return scorer

    def _summary_scores(self, docs: Sequence[SummaryExample]) -> list[np.ndarray]:
        """Each document's sentence scores by the model's summarizer: its document scorer over
        the sentences' embeddings, or its BertSum head."""
        if document_scorer.is_document_summarizer(self.path):
            with torch.inference_mode():
                return document_scorer.document_scores(
                    self._document_scorer,
                    self.runner,
                    self.model_for("embed"),
                    self.tok,
                    self.embedding_settings,
                    [d.sentences for d in docs],
                )
        if not summarize.is_summarizer(self.config):
            raise ConfigError(
                f"{self.path}: not a summarizer (its labels are not {list(summarize.SUMMARY_LABELS)}"
                "); train one with `bertforge finetune --task summarize`, or use mode kmeans"
            )
        model = self.model(BertForTokenClassification, "summarizer head", "")
        # rows as long as the model was trained on (its run.json), unless max_length is given
        options = run_task_options(self.source, "summarize", {})
        rows = min(self.max_length or options.max_seq_length or 512, self.config.max_tokens)
        fam = family(dataclasses.replace(options, max_seq_length=rows), self.tok)
        features = fam.featurize(docs)
        if self.runner.progress is not None and self.runner.progress_end is None:
            # summarize's own bar, in sentences: its rows are windows of sentences
            self.runner.progress.unit = " windows"
            self.runner.progress.reset(total=len(features.input_ids))
        rows = infer(
            self.runner, model, features, self.tok.pad_id, per_token=True, encoder=self.config
        )
        return fam.sentence_scores(docs, features, rows)

    def _unsupervised_summaries(
        self, docs: Sequence[SummaryExample], counts: Sequence[int], mode: str, block: bool
    ) -> tuple[list[list[int]], list[np.ndarray]]:
        """(chosen sentences, scores) of each document from its sentence embeddings."""
        flat = [s for d in docs for s in d.sentences]
        vectors = self.embed(flat) if flat else np.zeros((0, 1), np.float32)
        chosen, scores, start = [], [], 0
        for d, k in zip(docs, counts):
            x = vectors[start : start + len(d.sentences)]
            start += len(d.sentences)
            if k == len(d.sentences):  # the whole document (or an empty one)
                chosen.append(list(range(k)))
                scores.append(np.zeros(k))
                continue
            picked, s = summarize.unsupervised(x, d.sentences, k, mode, block)
            chosen.append(picked)
            scores.append(s)
        return chosen, scores
