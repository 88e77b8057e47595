"""Bi-encoders: queries and passages embedded apart, trained so that a query's vector is
nearest its own passage's (`bertforge finetune --task retrieval`).

A training row is the query, its positive and its hard negatives, side by side: a (C, T) row
as multiple choice has. The loss is sentence-transformers' MultipleNegativesRankingLoss:
cross-entropy over the cosine similarities (times `scale`, 20) of each query against every
passage of the batch, its own positive the target; the other queries' positives and every
hard negative are its negatives. Batches keep queries of the same positive apart (as
sentence-transformers' no-duplicates sampler does); where that cannot be helped, a passage
that is the query's own positive text elsewhere in the batch is masked out of its negatives
rather than taught as one. `cache_chunk` computes it GradCache's way (in-batch negatives beyond
memory); `symmetric` adds the other direction (each positive against the batch's queries);
`hardness_mode`/`hardness_strength` weight harder negatives up (Lan et al. 2025);
`group_batches` cuts batches from the rows in "group" order (harder in-batch negatives);
`matryoshka` sums it over leading dimensions (each renormalised), so the vectors can
be cut; `teacher_weight` adds a cross-encoder's knowledge (rows of `bertforge mine --teacher`):
that weight times ListNet over each query's own passages, the KL divergence of its softmax over
their scaled cosines from the teacher's softmax over its scores. Scored pairs (STS-B style)
train by CoSENT instead and are scored by Spearman; the training file's kind is how the model
trains, the dev file's how it is scored. Both losses are over the whole batch: no accumulation
(finetune refuses --micro-batch-size), and under torchrun every process's vectors are gathered
(gather_rows), each process taking the loss of the whole batch.
Sentences are pooled as the model directory says (bertforge.embedding); the dev set is scored
each epoch by retrieval metrics (evaluate.retrieval_scores: every distinct dev query, its
relevant passages the positives of all its rows, against all dev passages), MRR@10 first. The result is written in the sentence-transformers layout
(modules.json, pooling, normalisation), so `SentenceTransformer(dir)`, `bertforge embed` and
`bertforge index` give the same vectors.
Memory: a step's forward keeps every text of the batch for backward, about 18 MB each at 128
pieces (MiniLM, bf16, CPU): 300 pairs at the defaults peak at 2.1 GB, and 7 hard negatives a
row make 256 passages a step, 7.7 GB; `cache_chunk` 32 holds one chunk's, 1.9 GB (figures:
train/finetune.py).
"""

from __future__ import annotations

import hashlib
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .. import embedding
from ..config import BertConfig
from ..data.tasks import RetrievalExample, read_retrieval, teacher_scores
from ..errors import ConfigError, DataError
from ..evaluate import pearson, retrieval_scores, spearman, unrankable
from ..fileio import json_text, write_text
from ..model import BertModel
from ..modeldir import ModelDir
from ..runner import Runner
from .base import Batch, Features, TaskFamily, infer, soft_cross_entropy
from .choice import grouped_rows

SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss: cosine x 20


def cosent_loss(a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """CoSENT (Su, 2022), as sentence-transformers' CoSENTLoss: log(1 + sum over pairs (i, j)
    with scores[i] > scores[j] of exp(20 (cos_j - cos_i))), for a batch of pairs (a, b)."""
    cos = SCALE * F.cosine_similarity(a.float(), b.float(), dim=-1)
    diff = cos[None, :] - cos[:, None]  # [i, j] = cos_j - cos_i
    diff = diff - (scores[:, None] <= scores[None, :]).float() * 1e12  # keep score_i > score_j
    return torch.logsumexp(torch.cat([torch.zeros(1, device=cos.device), diff.flatten()]), 0)


HARDNESS = ("all_negatives", "in_batch_negatives", "hard_negatives")  # sentence-transformers'


def ranking_loss(
    queries: torch.Tensor,
    passages: torch.Tensor,
    targets: torch.Tensor,
    same: torch.Tensor,
    symmetric: bool = False,
    hardness: tuple[str, float] | None = None,
) -> torch.Tensor:
    """Summed in-batch negatives loss: queries (B, H), passages (P, H; each query's positive
    then its hard negatives, query by query), targets (B,) the index of each query's positive
    among the passages, same (B, P) True where a passage other than the target is the target's
    very text (left out of the softmax). Symmetric: the mean of that and each positive's
    cross-entropy over the batch's queries (a query whose positive is the same text left out),
    as sentence-transformers' MultipleNegativesRankingLoss with directions query_to_doc and
    doc_to_query, partition_mode per_direction. Hardness (mode, alpha): alpha x the cosine,
    without its gradient, added to the logits of the query's negatives that the mode names
    (all of them, the other queries' passages, or its own hard negatives), as that loss's
    hardness_mode and hardness_strength (Lan et al. 2025), in the query -> passages direction."""
    cos = F.normalize(queries, dim=-1) @ F.normalize(passages, dim=-1).T
    scores = (SCALE * cos).masked_fill(same, -torch.inf)
    forward = scores
    if hardness is not None:
        mode, alpha = hardness
        B, P = cos.shape
        column = torch.arange(P, device=cos.device)
        own = (column // (P // B))[None, :] == torch.arange(B, device=cos.device)[:, None]
        positive = (column % (P // B) == 0)[None, :]
        apply = {
            "all_negatives": ~(own & positive),
            "in_batch_negatives": ~own,
            "hard_negatives": own & ~positive,
        }[mode]
        forward = scores + alpha * cos.detach() * apply
    loss = F.cross_entropy(forward, targets, reduction="sum")
    if not symmetric:
        return loss
    back = scores[:, targets].T  # [j, i]: positive j against query i
    mine = torch.arange(len(targets), device=back.device)
    return (loss + F.cross_entropy(back, mine, reduction="sum")) / 2


class Pooled(nn.Module):
    """An encoder whose output is each row's sentence vector, pooled as `modes` say. Rows are
    cut to their batch's longest first, and a (B, C, T) batch is read a column at a time (the
    queries apart from the passages), so a short query is not computed at a passage's length."""

    def __init__(self, encoder: nn.Module, modes: tuple[str, ...]) -> None:
        super().__init__()
        self.encoder, self.modes = encoder, modes

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        if input_ids.dim() == 3:  # (B, C, T) -> (B, C, H)
            columns = [
                self(input_ids[:, c], token_type_ids[:, c], attention_mask[:, c])
                for c in range(input_ids.shape[1])
            ]
            return torch.stack(columns, 1)
        T = max(int(attention_mask.sum(-1).max()), 1)
        ids, types, mask = input_ids[:, :T], token_type_ids[:, :T], attention_mask[:, :T]
        h = self.encoder(ids, types, mask).last_hidden_state
        return embedding.pool(h, mask, self.modes)


def gather_rows(
    vectors: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, slice]:
    """Every process's rows of the step's batch, in rank order, for a loss over the whole batch
    (in-batch negatives are the batch's under torchrun too, as sentence-transformers'
    gather_across_devices): (B, C, H) vectors, this process's joined to its graph, their
    labels, and the slice of them that is this process's. In one process, its own rows."""
    labels = labels.to(vectors.device)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return vectors, labels, slice(0, len(vectors))
    n = torch.tensor([len(vectors)], device=vectors.device)
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    counts = [int(s) for s in sizes]  # a batch's rows split unevenly: 3 and 2
    start = sum(counts[: dist.get_rank()])
    mine = slice(start, start + len(vectors))
    return _Gathered.apply(vectors.float(), counts, mine), _gather(labels, counts), mine


def _gather(x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """The processes' x (counts[r] rows on process r), concatenated in rank order."""
    padded = torch.cat([x, x.new_zeros((max(counts) - len(x), *x.shape[1:]))])  # same shapes
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:c] for p, c in zip(parts, counts)])


class _Gathered(torch.autograd.Function):
    """_gather with a gradient. Every process takes the same loss of the gathered rows, so each
    finds the whole loss's gradient of its own rows in its own backward: their part of the
    gradient, nothing exchanged here (DDP's exchange of the parameters' gradients joins them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, counts: list[int], mine: slice) -> torch.Tensor:
        ctx.mine = mine
        return _gather(x, counts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad[ctx.mine], None, None


def own_share(loss: torch.Tensor, mine: slice, n: int) -> torch.Tensor:
    """The whole batch's loss with its gradient, valued at this process's share of its n rows:
    summed over the processes (the logs), the loss."""
    return loss + loss.detach() * ((mine.stop - mine.start) / n - 1)


def is_scored(examples: Sequence[RetrievalExample]) -> bool:
    """Whether the examples are scored pairs (a file's rows are all one kind)."""
    return bool(examples) and examples[0].score is not None


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class RetrievalTask(TaskFamily):
    head = BertModel
    metric = "mrr@10"
    scored = False  # scored pairs (CoSENT) rather than (query, positive) pairs

    settings = embedding.Embedding()

    def set_model(self, model: str | os.PathLike[str] | ModelDir) -> None:
        super().set_model(model)
        self.settings = self.source.embedding if self.source else self.settings

    @property
    def dims(self) -> list[int | None]:
        """The leading dimensions the loss is taken over (None: all of them)."""
        text = getattr(self.options, "matryoshka", None)
        if text is None:
            return [None]
        try:
            dims = [int(x) for x in text.split(",")]
        except ValueError:
            dims = []
        if not dims or min(dims) < 1:
            raise ConfigError(
                f"matryoshka={text!r} (--matryoshka): comma-separated positive dimensions"
            )
        return dims  # type: ignore[return-value]

    def read(self, path: str, labelled: bool = True) -> list[RetrievalExample]:
        """The file's examples: (query, positive) pairs or scored pairs, as featurize sees."""
        return read_retrieval(path)

    @property
    def hardness(self) -> tuple[str, float] | None:
        """(--hardness-mode, --hardness-strength), or None: no hardness weighting."""
        mode = getattr(self.options, "hardness_mode", None)
        return None if mode is None else (mode, getattr(self.options, "hardness_strength", 0.0))

    @property
    def teacher_weight(self) -> float | None:
        return getattr(self.options, "teacher_weight", None)

    def featurize(self, examples: Sequence[RetrievalExample], training: bool = False) -> Features:
        """Training: (C, T) rows of query, positive, negatives; labels: each passage's text
        digest (to find the same passage twice in a batch), then, with teacher_weight, the
        teacher's scores of the passages (float64 bits in the int64 array); scored pairs: the
        (2, T) pair and its score. Else: the queries alone.
        The training file's kind is how the task trains (CoSENT or in-batch negatives); a dev
        file's is how it is scored (Spearman or MRR@10 first), whatever the training file's:
        a model trained on pairs scored on STS-style pairs is sentence-transformers' own recipe
        (NLI pairs, STS-B dev), and one trained on scores can be scored on retrieval."""
        scored = is_scored(examples)
        if training:
            self.scored = scored
            self.reports_accuracy = not scored  # CoSENT ranks pairs: no accuracy to report
        else:
            self.metric = "spearman" if scored else "mrr@10"
        texts = [[e.query, e.positive, *e.negatives] for e in examples]
        if not training:
            texts = [t[:1] for t in texts]
        ids, types = grouped_rows(texts, self.tok, self.options.max_seq_length)
        digests = np.asarray([[_digest(t) for t in row[1:]] or [0] for row in texts], np.int64)
        if scored:  # labels: the pairs' scores
            if training:
                self._check_cosent()
            return Features(ids, types, np.array([e.score for e in examples], np.float32))
        if training and self.teacher_weight is not None:
            teacher = np.array(teacher_scores(examples, "--teacher-weight"), np.float64)
            digests = np.concatenate([digests, teacher.view(np.int64)], 1)
        groups = None  # meta: each row's group as a number (--group-batches)
        if training and getattr(self.options, "group_batches", False):
            names: dict[str, int] = {}
            for e in examples:
                if e.group is None:
                    raise DataError(
                        f'{e.source}: --group-batches fills each batch from one "group", and '
                        "the row has none"
                    )
                names.setdefault(e.group, len(names))
            groups = np.array([names[e.group] for e in examples], np.int64)  # type: ignore[index]
        return Features(ids, types, digests, groups)

    def _check_cosent(self) -> None:
        """The options of in-batch negatives are errors for a scored training file."""
        if self.teacher_weight is not None:
            raise ConfigError("--teacher-weight: scored pairs (CoSENT) have no teacher")
        for flag in ("symmetric", "group_batches", "hardness_mode"):
            if getattr(self.options, flag, False):
                name = "--" + flag.replace("_", "-")
                raise ConfigError(f"{name}: scored pairs train by CoSENT, not in-batch")

    def batch_keys(self, features: Features) -> np.ndarray | None:
        """The positive's digest: a passage is never in one batch twice (a false negative)."""
        return None if self.scored else np.asarray(features.labels)[:, 0]

    def batch_groups(self, features: Features) -> np.ndarray | None:
        """The rows' groups, with --group-batches (featurize keeps them in meta)."""
        return features.meta if isinstance(features.meta, np.ndarray) else None

    def freeze_unused(self, model: nn.Module) -> list[str]:
        """The pooler: a sentence vector pools the token states and no loss here reads it, so it
        stays as loaded (DDP stops at the second step over a parameter without a gradient)."""
        pooler = getattr(model, "pooler", None)
        if pooler is None:
            return []
        pooler.requires_grad_(False)
        return [f"pooler.{name}" for name, _ in pooler.named_parameters()]

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed loss of the step's batch (its rows on every process: gather_rows), the
        value of this process's share of it, and the number of its queries ranked right."""
        pooled = Pooled(model, self.settings.pooling)
        chunk = getattr(self.options, "cache_chunk", None)
        if chunk is not None and not self.scored:  # one process: finetune refuses torchrun
            return self._cached(pooled, batch, chunk)
        vectors, labels, mine = gather_rows(pooled(*batch.inputs()), batch.labels)
        if self.scored:  # a batch-level loss: times B, as the loop divides the sum by B
            loss = cosent_loss(vectors[:, 0], vectors[:, 1], labels) * len(vectors)
            correct = torch.zeros((), device=vectors.device)
        else:
            loss, correct = self._loss(vectors, labels, mine)
        return own_share(loss, mine, len(vectors)), correct

    def _loss(
        self, vectors: torch.Tensor, labels: torch.Tensor, mine: slice = slice(None)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, queries of the rows `mine` whose positive scores best) of (B, C, H) row
        vectors and their (B, C - 1) passage digests, then any teacher scores (featurize's
        labels)."""
        B, C = vectors.shape[:2]
        if C < 2:
            raise DataError("retrieval training rows need a query and a positive")
        passages = vectors[:, 1:].reshape(B * (C - 1), -1)
        targets = torch.arange(B, device=vectors.device) * (C - 1)
        labels = labels.to(vectors.device)
        teacher = labels[:, C - 1 :].view(torch.float64)  # (B, C - 1), or (B, 0): none
        digests = labels[:, : C - 1].reshape(-1)  # (B * (C - 1),)
        same = digests[targets].unsqueeze(1) == digests.unsqueeze(0)
        same[torch.arange(B), targets] = False
        width = vectors.shape[-1]
        if any(d is not None and d > width for d in self.dims):
            raise ConfigError(f"--matryoshka {self.options.matryoshka}: the vectors have {width}")
        symmetric = bool(getattr(self.options, "symmetric", False))
        loss = sum(
            ranking_loss(
                vectors[:, 0, :d], passages[:, :d], targets, same, symmetric, self.hardness
            )
            for d in self.dims
        )
        if self.teacher_weight:  # each query against its own passages, as the teacher saw them
            own = F.cosine_similarity(vectors[:, :1].float(), vectors[:, 1:].float(), dim=-1)
            loss = loss + self.teacher_weight * soft_cross_entropy(SCALE * own, teacher, 1.0)
        with torch.no_grad():
            q = F.normalize(vectors[:, 0], dim=-1) @ F.normalize(passages, dim=-1).T
            correct = (q.masked_fill(same, -torch.inf).argmax(-1) == targets)[mine].sum()
        return loss, correct

    def _cached(
        self, pooled: Pooled, batch: Batch, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GradCache (Gao et al., 2021): every row embedded in chunks without gradients, the
        loss's gradient taken with respect to the vectors, then each chunk embedded again
        (its dropout replayed from the saved random state) and backpropagated with its part
        of that gradient, so memory holds one chunk's activations however large the batch.
        The parameters' gradients are those of the summed loss over the batch's B queries
        divided by B, what the loop's own backward would give for a whole batch in one
        process; the returned loss is the value, joined to the graph by a zero."""
        B, C, T = batch.input_ids.shape
        # column by column (every query, then every positive, ...): a chunk holds rows of
        # like length, cut to its longest by Pooled
        flat = [x.transpose(0, 1).reshape(C * B, T) for x in batch.inputs()]
        pieces, states = [], []
        with torch.no_grad():
            for start in range(0, B * C, chunk):
                # CPU and CUDA random states (dropout's), to replay this pass exactly below
                cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
                states.append((torch.get_rng_state(), cuda))
                pieces.append(pooled(*(x[start : start + chunk] for x in flat)).float())
        vectors = torch.cat(pieces).requires_grad_()  # (C * B, H), column by column
        loss, correct = self._loss(vectors.reshape(C, B, -1).transpose(0, 1), batch.labels)
        (loss / B).backward()
        grad = vectors.grad
        for (cpu, cuda), start in zip(states, range(0, B * C, chunk)):
            torch.set_rng_state(cpu)
            if cuda:
                torch.cuda.set_rng_state_all(cuda)
            again = pooled(*(x[start : start + chunk] for x in flat)).float()
            again.backward(grad[start : start + chunk])
        anchor = next(p for p in pooled.parameters() if p.requires_grad)
        return loss.detach() + 0.0 * anchor.reshape(-1)[0], correct

    # -- evaluation: every dev query against every dev passage ------------------------------

    def embed(self, runner: Runner, model: nn.Module, texts: Sequence[str]) -> np.ndarray:
        """(N, H) unit vectors of texts, through the inference runner."""
        encodings = self.tok.encode_batch(list(texts), max_length=self.options.max_seq_length)
        features = Features.from_encodings(encodings)
        rows = infer(
            runner,
            Pooled(model, self.settings.pooling),
            features,
            self.tok.pad_id,
            outputs=lambda out: out,
        )
        vectors = np.stack(rows) if rows else np.zeros((0, 1), np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)

    def evaluate(
        self, runner: Runner, model: nn.Module, examples: Sequence[Any], features: Features
    ) -> tuple[dict[str, float], Any]:
        if is_scored(examples):  # Spearman and Pearson of the pairs' cosines against their scores
            a = self.embed(runner, model, [e.query for e in examples])
            b = self.embed(runner, model, [e.positive for e in examples])
            cos, gold = (a * b).sum(-1), [e.score for e in examples]
            metrics = {"spearman": spearman(gold, cos), "pearson": pearson(gold, cos)}
            return metrics, {str(i): {"cosine": float(c)} for i, c in enumerate(cos)}
        return self._ranked(runner, model, examples)

    def _ranked(
        self, runner: Runner, model: nn.Module, examples: Sequence[RetrievalExample]
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Retrieval metrics of every distinct dev query against every dev passage, and each
        query's top 100 ({query: {passage index: score}}). A query's relevant passages are the
        positives of all its rows (a query of several rows is one query, as trec_eval and
        sentence-transformers' InformationRetrievalEvaluator take it: a row's own positive
        alone would make the others misses, and count the query once per row)."""
        corpus = list(dict.fromkeys(t for e in examples for t in (e.positive, *e.negatives)))
        where = {t: str(i) for i, t in enumerate(corpus)}
        qrels: dict[str, dict[str, int]] = {}
        for e in examples:
            qrels.setdefault(e.query, {})[where[e.positive]] = 1
        queries = list(qrels)
        scores = self.embed(runner, model, queries) @ self.embed(runner, model, corpus).T  # (Q, P)
        if not np.isfinite(scores).all():  # argsort puts NaN last: a broken passage would hide
            i, j = np.argwhere(~np.isfinite(scores))[0]
            source = next(e.source for e in examples if e.query == queries[i])
            passage = textwrap.shorten(corpus[j], 60)
            raise unrankable(f"{source}: query {queries[i]!r}, passage {passage!r}", scores[i, j])
        top = np.argsort(-scores, axis=1, kind="stable")[:, :100]
        run = {q: {str(j): float(scores[i, j]) for j in top[i]} for i, q in enumerate(queries)}
        return retrieval_scores(qrels, run), run

    def write_predictions(self, out: Any, examples: Sequence[Any], preds: Any) -> list[Path]:
        """predictions_retrieval.jsonl: per distinct dev query its top 10 dev passages (index,
        score); per scored pair, its cosine."""
        if is_scored(examples):
            lines = [
                json_text({"text": e.query, "text_pair": e.positive, **preds[str(i)]})
                for i, e in enumerate(examples)
            ]
        else:
            lines = [
                json_text({"query": q, "top": list(top.items())[:10]}) for q, top in preds.items()
            ]
        path = Path(out) / "predictions_retrieval.jsonl"
        write_text(path, "".join(line + "\n" for line in lines))
        return [path]

    def save_files(self, out: Path) -> None:
        """The sentence-transformers modules of the model trained from (mean pooling and
        normalisation when it has none), so the directory embeds as it was trained."""
        width = BertConfig.from_pretrained(out).hidden_size
        if self.source and self.source.is_sentence_transformers:
            self.source.write_layout(out, width)
        else:
            embedding.write_default_layout(out, width)
