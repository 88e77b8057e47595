"""Inference front doors: fill-mask, classify, ner, qa, embed, nsp, features.

    pipe = Pipeline("path/to/model")
    pipe.embed(["a sentence", "another"], pooling="mean", normalize=True)   # (N, H) numpy
    pipe.fill_mask(["the capital of france is [MASK]."])                     # top-k per [MASK]
    pipe.classify(["a fine film"]); pipe.ner(["Alice lives in Paris."])
    pipe.qa(["Where?"], ["Alice lives in Paris."]); pipe.nsp(["A."], ["B."])
    pipe.features(["text"], layers=(-1, -2, -3, -4), combine="concat")

Fast by construction: inputs are sorted by length into batches (little padding) and results
come back in the input order; bf16 autocast where it pays (a GPU, or a CPU with AMX) unless
precision says otherwise; no gradients. A pipeline that needs a trained head (fill-mask: the
MLM head; nsp; classify; ner; qa) refuses a checkpoint without one instead of answering
with random weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .checkpoint import load_with_fresh
from .errors import ConfigError, InputError
from .heads import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel
from .tokenizer import Tokenizer

POOLINGS = ("cls", "mean", "max")
COMBINES = ("concat", "sum", "mean")


def cpu_has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def inference_precision(precision: str, device: torch.device) -> str:
    """auto: bf16 on a GPU that has it or a CPU with AMX, else fp32."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"precision={precision!r}: must be auto, fp32 or bf16")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_amx() else "fp32"


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


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class Pipeline:
    """One model directory; each task loads the head it needs once and keeps it."""

    def __init__(
        self,
        model: str | Path,
        *,
        device: str | None = None,
        precision: str = "auto",
        batch_size: int = 32,
        max_length: int | None = None,
        quantize: str | None = None,
    ) -> None:
        """quantize "int8": dynamic int8 quantisation of the Linear layers (CPU only; weights
        int8, activations quantised per batch): faster on CPUs without bf16 units, at a small
        cost in accuracy (benchmarks/inference_throughput.py measures both)."""
        self.path = Path(model)
        self.tok = Tokenizer.from_pretrained(self.path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.precision = inference_precision(precision, self.device)
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size}: must be positive")
        self.batch_size = batch_size
        self.max_length = max_length
        if quantize not in (None, "int8"):
            raise ConfigError(f"quantize={quantize!r}: must be None or int8")
        if quantize and self.device.type != "cpu":
            raise ConfigError("quantize=int8 is for the CPU (dynamic quantisation)")
        if quantize and self.precision != "fp32":
            self.precision = "fp32"  # int8 kernels take fp32 activations
        self.quantize = quantize
        self._models: dict[type, nn.Module] = {}

    # -- loading and batching ----------------------------------------------------------------

    def model(self, cls: type, needs_head: str | None = None) -> Any:
        """The checkpoint as `cls` (cached); needs_head names the trained head it must have."""
        if cls not in self._models:
            m, fresh = load_with_fresh(cls, self.path)
            head_missing = [n for n in fresh if "pooler" not in n]
            if needs_head and head_missing and cls is not BertModel:
                raise ConfigError(
                    f"{self.path}: has no trained {needs_head} ({', '.join(head_missing)}); "
                    "fine-tune it first, or use a checkpoint that has one"
                )
            m = m.to(self.device).eval()
            if self.quantize == "int8":
                m = quantize_int8(m)
            self._models[cls] = m
        return self._models[cls]

    def _autocast(self) -> Any:
        if self.precision == "fp32":
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def batches(self, lengths: Sequence[int]) -> Iterator[np.ndarray]:
        """Row indices in length order, cut into batches of at most batch_size rows, and cut
        earlier where the next row would make the batch more than half padding (a few long
        texts among many short ones: a server's micro-batch, a document with a long table
        row), so short texts do not pay for the long ones' length."""
        order = np.argsort(np.asarray(lengths), kind="stable")
        start, tokens = 0, 0
        for k, r in enumerate(order):
            n, length = k - start, int(lengths[r])
            if n and (n == self.batch_size or (n + 1) * length > 2 * (tokens + length)):
                yield order[start:k]
                start, tokens = k, 0
            tokens += length
        if start < len(order):
            yield order[start:]

    def run(
        self,
        encodings: Sequence[Any],
        fn: Callable[[dict[str, torch.Tensor]], Any],
    ) -> list[Any]:
        """fn(batch) for length-sorted batches of encodings; fn returns one item per row (its
        batch index order); the items come back in the encodings' order."""
        out: list[Any] = [None] * len(encodings)
        pad = self.tok.pad_id
        with torch.inference_mode(), self._autocast():
            for rows in self.batches([len(e.ids) for e in encodings]):
                T = max(len(encodings[r].ids) for r in rows)
                ids = torch.full((len(rows), T), pad, dtype=torch.long)
                types = torch.zeros((len(rows), T), dtype=torch.long)
                mask = torch.zeros((len(rows), T), dtype=torch.long)
                for j, r in enumerate(rows):
                    n = len(encodings[r].ids)
                    ids[j, :n] = torch.tensor(encodings[r].ids)
                    types[j, :n] = torch.tensor(encodings[r].token_type_ids)
                    mask[j, :n] = 1
                batch = {"input_ids": ids.to(self.device), "token_type_ids": types.to(self.device),
                         "attention_mask": mask.to(self.device)}  # fmt: skip
                for r, item in zip(rows, fn(batch)):
                    out[r] = item
        return out

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[Any]:
        if isinstance(texts, str):
            raise InputError("pass a list of texts (a single string is not a list)")
        return self.tok.encode_batch(list(texts), None if pairs is None else list(pairs),
                                     max_length=self.max_length)  # fmt: skip

    # -- the pipelines -------------------------------------------------------------------------

    def embed(
        self, texts: Sequence[str], pooling: str = "mean", normalize: bool = False
    ) -> np.ndarray:
        """(N, H) sentence embeddings: [CLS], or the mean / max over real tokens."""
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling={pooling!r}: must be one of {', '.join(POOLINGS)}")
        model = self.model(BertModel)

        def fn(b: dict[str, torch.Tensor]) -> np.ndarray:
            h = model(b["input_ids"], b["token_type_ids"], b["attention_mask"]).last_hidden_state
            h = h.float()
            m = b["attention_mask"].unsqueeze(-1).to(h.dtype)  # (B, T, 1)
            if pooling == "cls":
                v = h[:, 0]
            elif pooling == "mean":
                v = (h * m).sum(1) / m.sum(1).clamp(min=1)
            else:
                v = h.masked_fill(m == 0, -torch.inf).amax(1)
            if normalize:
                v = torch.nn.functional.normalize(v, dim=-1)
            return v.cpu().numpy()

        rows = self.run(self.encode(texts), fn)
        return np.stack(rows) if rows else np.zeros((0, model.config.hidden_size), np.float32)

    def features(
        self,
        texts: Sequence[str],
        layers: Sequence[int] = (-1,),
        combine: str | None = "concat",
    ) -> list[dict[str, Any]]:
        """Per text: tokens, and the hidden states of `layers` (0 = embeddings, -1 = last):
        "layers" {index: (T, H)}, and with combine "values" (T, H * k) or (T, H)."""
        if combine is not None and combine not in COMBINES:
            raise ConfigError(f"combine={combine!r}: must be one of {', '.join(COMBINES)}")
        model = self.model(BertModel)
        n = model.config.num_hidden_layers + 1
        for layer in layers:
            if not -n <= layer < n:
                raise ConfigError(f"layer {layer}: this model has layers -{n}..{n - 1}")
        encodings = self.encode(texts)

        def fn(b: dict[str, torch.Tensor]) -> list[dict[int, np.ndarray]]:
            out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"],
                        output_hidden_states=True)  # fmt: skip
            states = {k: out.hidden_states[k].float().cpu().numpy() for k in layers}
            lengths = b["attention_mask"].sum(1).tolist()
            return [{k: v[j, : lengths[j]] for k, v in states.items()} for j in range(len(lengths))]

        results = []
        for enc, per_layer in zip(encodings, self.run(encodings, fn)):
            item: dict[str, Any] = {"tokens": enc.tokens, "layers": per_layer}
            if combine is not None:
                stack = [per_layer[k] for k in layers]
                item["values"] = (
                    np.concatenate(stack, -1)
                    if combine == "concat"
                    else np.sum(stack, 0)
                    if combine == "sum"
                    else np.mean(stack, 0)
                )
            results.append(item)
        return results

    def fill_mask(self, texts: Sequence[str], top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
        """Per text, per [MASK] in it: the top_k tokens with their probabilities."""
        model = self.model(BertForMaskedLM, needs_head="masked-LM head (cls.predictions)")
        mask_id = self.tok.convert_tokens_to_ids(["[MASK]"])[0]
        encodings = self.encode(texts)
        for i, e in enumerate(encodings):
            if mask_id not in e.ids:
                raise InputError(f"text {i}: no [MASK] token in {texts[i][:80]!r}")

        def fn(b: dict[str, torch.Tensor]) -> list[list[dict[str, Any]]]:
            logits = model(b["input_ids"], b["token_type_ids"], b["attention_mask"]).mlm_logits
            probs = logits.float().softmax(-1)
            out = []
            for j in range(len(b["input_ids"])):
                where = (b["input_ids"][j] == mask_id).nonzero().flatten().tolist()
                per_mask = []
                for pos in where:
                    p, ids = probs[j, pos].topk(top_k)
                    tokens = self.tok.convert_ids_to_tokens(ids.tolist())
                    per_mask.append([{"token": t, "id": int(k), "score": float(s)}
                                     for t, k, s in zip(tokens, ids.tolist(), p.tolist())])  # fmt: skip
                out.append(per_mask)
            return out

        return self.run(encodings, fn)

    def nsp(self, texts: Sequence[str], pairs: Sequence[str]) -> list[float]:
        """P(IsNext) of each (text, pair): does the pair follow the text?"""
        if len(texts) != len(pairs):
            raise InputError(f"{len(texts)} texts but {len(pairs)} pairs")
        model = self.model(BertForPreTraining, needs_head="next-sentence head")

        def fn(b: dict[str, torch.Tensor]) -> list[float]:
            logits = model(b["input_ids"], b["token_type_ids"], b["attention_mask"]).nsp_logits
            return logits.float().softmax(-1)[:, 0].tolist()  # index 0 = IsNext (Google's)

        return self.run(self.encode(texts, pairs), fn)

    def classify(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Per text (or pair): the label, its probability and every label's (or the score, for
        a regression model)."""
        model = self.model(BertForSequenceClassification, needs_head="classifier")
        names = model.config.labels

        def fn(b: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
            logits = model(b["input_ids"], b["token_type_ids"], b["attention_mask"]).logits
            logits = logits.float().cpu().numpy()
            if model.config.num_labels == 1:
                return [{"score": float(x[0])} for x in logits]
            probs = _softmax(logits)
            return [{"label": names[int(p.argmax())], "score": float(p.max()),
                     "scores": {names[k]: float(v) for k, v in enumerate(p)}} for p in probs]  # fmt: skip

        return self.run(self.encode(texts, pairs), fn)

    def ner(self, texts: Sequence[str]) -> list[list[dict[str, Any]]]:
        """Per text: entities {entity, text, start, end, score}, words tagged by their first
        piece, B-/I- words merged into spans (character offsets into the text)."""
        model = self.model(BertForTokenClassification, needs_head="token classifier")
        names = model.config.labels
        encodings = self.encode(texts)

        def fn(b: dict[str, torch.Tensor]) -> list[np.ndarray]:
            logits = model(b["input_ids"], b["token_type_ids"], b["attention_mask"]).logits
            return list(_softmax(logits.float().cpu().numpy()))

        results = []
        for text, enc, probs in zip(texts, encodings, self.run(encodings, fn)):
            words: list[tuple[str, float, int, int]] = []  # tag, score, start, end
            previous = None
            for j, w in enumerate(enc.word_ids):
                if w is None:
                    continue
                start, end = enc.offsets[j]
                if w != previous:
                    k = int(probs[j].argmax())
                    words.append((names[k], float(probs[j, k]), start, end))
                else:  # a later piece of the same word: extend its span
                    tag, score, s0, _ = words[-1]
                    words[-1] = (tag, score, s0, end)
                previous = w
            results.append(_merge_entities(text, words))
        return results

    def qa(
        self,
        questions: Sequence[str],
        contexts: Sequence[str],
        *,
        max_seq_length: int = 384,
        doc_stride: int = 128,
        max_answer_length: int = 30,
        allow_no_answer: bool = False,
    ) -> list[dict[str, Any]]:
        """Per question: the answer text, its probability among the n-best, its character span
        in the context (long contexts go through overlapping windows, as in training)."""
        from .data.tasks import SquadExample
        from .train.finetune.common import Features, collate
        from .train.finetune.squad import featurize, postprocess

        if len(questions) != len(contexts):
            raise InputError(f"{len(questions)} questions but {len(contexts)} contexts")
        model = self.model(BertForQuestionAnswering, needs_head="question-answering head")
        examples = [SquadExample(str(i), q, c, [], False, "")
                    for i, (q, c) in enumerate(zip(questions, contexts))]  # fmt: skip
        f: Features = featurize(examples, self.tok, max_seq_length=max_seq_length,
                                doc_stride=doc_stride)  # fmt: skip
        starts: list[Any] = [None] * len(f)
        ends: list[Any] = [None] * len(f)
        with torch.inference_mode(), self._autocast():
            for rows in self.batches(f.lengths):
                b = collate(f, rows, self.tok.pad_id).to(self.device)
                out = model(b.input_ids, b.token_type_ids, b.attention_mask)
                s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
                for j, r in enumerate(rows):
                    starts[r], ends[r] = s[j, : f.lengths[r]], e[j, : f.lengths[r]]
        answers = postprocess(examples, f, starts, ends, version_2=allow_no_answer,
                              max_answer_length=max_answer_length)  # fmt: skip
        results = []
        for ex in examples:
            best = next((c for c in answers.nbest[ex.qid] if c["text"] == answers.predictions[ex.qid]),
                        answers.nbest[ex.qid][0])  # fmt: skip
            start = best["start"]
            results.append({"answer": answers.predictions[ex.qid], "score": best["probability"],
                            "start": start, "end": start + len(best["text"]) if start >= 0 else -1})  # fmt: skip
        return results


def _merge_entities(text: str, words: list[tuple[str, float, int, int]]) -> list[dict[str, Any]]:
    """Words' IOB tags -> entity spans (an I- after O or another type starts an entity)."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    scores: list[float] = []

    def close() -> None:
        nonlocal current
        if current is not None:
            current["score"] = float(np.mean(scores))
            current["text"] = text[current["start"] : current["end"]]
            out.append(current)
        current = None

    for tag, score, start, end in words:
        prefix, _, kind = tag.partition("-")
        if tag == "O" or not kind:
            close()
            continue
        if prefix == "I" and current is not None and current["entity"] == kind:
            current["end"] = end
            scores.append(score)
            continue
        close()
        current, scores = {"entity": kind, "start": start, "end": end}, [score]
    close()
    return out
