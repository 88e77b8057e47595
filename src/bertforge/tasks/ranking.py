"""Cross-encoders: a (query, document) pair read together, one relevance score out.

A cross-encoder is a `BertForSequenceClassification` with one label, as sentence-transformers
writes a CrossEncoder. Its scores go through the activation the model directory names, read
where each sentence-transformers version keeps it: `config_sentence_transformers.json`'s
"activation_fn" (version 6), config.json's `sentence_transformers.activation_fn` (4 and 5),
config.json's `sbert_ce_default_activation_function` (before 4); none: sigmoid, as
`CrossEncoder.predict` does for one label. `pair_rows` lays a pair out as rows the model reads: the
pair itself when it fits, else the query (cut to half a row at most) with each window of the
document in turn, `stride` pieces apart; a document's score is its best window's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.tasks import RetrievalExample, read_retrieval, teacher_scores
from ..errors import CheckpointError, ConfigError, DataError
from ..evaluate import retrieval_scores, unrankable
from ..fileio import json_text, read_json, write_json, write_text
from ..heads import BertForSequenceClassification
from ..runner import Runner
from .base import Batch, Features, TaskFamily, infer, soft_cross_entropy
from .choice import grouped_rows
from .windows import windows_of

# the activations sentence-transformers saves (torch.nn classes), by their class name
ACTIVATIONS = ("Sigmoid", "Identity", "Tanh")


def activation(path: str | os.PathLike[str]) -> str:
    """The activation a cross-encoder directory names (one of ACTIVATIONS), sigmoid if none."""
    path = Path(path)
    config_file, st_file = path / "config.json", path / "config_sentence_transformers.json"
    # Google's bert_config.json (a directory without config.json) names no activation
    config = read_json(config_file, CheckpointError) if config_file.is_file() else {}
    st_config = read_json(st_file, CheckpointError) if st_file.is_file() else {}
    places = [  # version 6's place comes first; each a file, its JSON and the keys to the name
        (st_file, st_config, ("activation_fn",)),
        (config_file, config, ("sentence_transformers", "activation_fn")),
        (config_file, config, ("sbert_ce_default_activation_function",)),
    ]
    for file, value, keys in places:
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if not value:
            continue
        name = str(value).rsplit(".", 1)[-1]
        if not str(value).startswith("torch.") or name not in ACTIVATIONS:
            raise CheckpointError(
                f"{file}: {'.'.join(keys)} = {value!r}: bertforge applies torch.nn's "
                f"{', '.join(ACTIVATIONS)} (pass raw scores and apply your own)"
            )
        return name.lower()
    return "sigmoid"


def save_activation(out: str | os.PathLike[str], name: str) -> None:
    """Name a saved cross-encoder's activation (one of ACTIVATIONS) where sentence-transformers
    reads it: config_sentence_transformers.json (version 6's file) and config.json's
    `sentence_transformers` entry, which versions 4 to 6 read for a model directory without
    modules.json (version 6 ignores the first there)."""
    value = f"torch.nn.modules.{'linear' if name == 'Identity' else 'activation'}.{name}"
    out = Path(out)
    write_json(
        out / "config_sentence_transformers.json",
        {"activation_fn": value, "model_type": "CrossEncoder"},
    )
    config = read_json(out / "config.json", CheckpointError)
    write_json(out / "config.json", {**config, "sentence_transformers": {"activation_fn": value}})


def activate(logits: torch.Tensor, name: str) -> torch.Tensor:
    """A cross-encoder's scores from its (N,) logits."""
    if name == "sigmoid":
        return torch.sigmoid(logits)
    return torch.tanh(logits) if name == "tanh" else logits


def pair_rows(
    query: Sequence[int],
    document: Sequence[int],
    tok: Any,
    max_length: int,
    stride: int | None = None,
    truncate: bool = False,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input ids, token type ids) of each row that reads the pair of piece lists (no special
    tokens): one row [CLS] query [SEP] document [SEP] (tok.row: the family's layout) when it
    fits in max_length; else the query, cut to fit beside the whole document or to half a row
    at most, with each window of the document (stride: default half a window); truncate: the
    first window only."""
    extra = tok.specials.pair_extra
    room = max_length - extra
    if room < 2:
        raise ConfigError(
            f"max_length={max_length}: a (query, document) row needs at least {extra + 2} "
            f"pieces ({extra} special tokens and a piece of each)"
        )
    q = list(query)[: max(room - len(document), min(len(query), room // 2))]
    size = room - len(q)
    spans = windows_of(len(document), size, stride or max(1, size // 2))
    rows = []
    for start, length in spans[: 1 if truncate else None]:
        rows.append(tok.row(q, list(document[start : start + length])))
    return rows


def ranked(scores: Sequence[float]) -> list[int]:
    """Indices by score, highest first (ties: in the given order). A score that is not finite
    is evaluate's unrankable InputError naming its document: a NaN compares false with every
    score, so a sort would leave it wherever it fell."""
    values = np.asarray(scores, np.float64)
    if not np.isfinite(values).all():
        i = int(np.flatnonzero(~np.isfinite(values))[0])
        raise unrankable(f"document {i}", float(values[i]))
    return sorted(range(len(scores)), key=lambda i: -scores[i])


# -- training: `bertforge finetune --task rerank` -------------------------------------------------


# Each loss: summed over the groups of (B, C) logits, the positive first; `teacher` (B, C) is a
# teacher's scores of the same pairs (the distillation losses' targets, unused by the others).


def listwise_loss(logits: torch.Tensor, teacher: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over each group's scores, the positive first: cross-entropy."""
    targets = torch.zeros(len(logits), dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def pointwise_loss(logits: torch.Tensor, teacher: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy of every pair: the positive (first) 1, the negatives 0, summed over
    a group's pairs (sentence-transformers' BinaryCrossEntropyLoss per pair)."""
    targets = torch.zeros_like(logits, dtype=torch.float)
    targets[:, 0] = 1
    return F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="sum")


def margin_mse_loss(logits: torch.Tensor, teacher: torch.Tensor | None = None) -> torch.Tensor:
    """Margin-MSE (Hofstaetter et al. 2020): the squared difference between the student's and
    the teacher's margins, positive minus each negative, averaged over a group's negatives
    (sentence-transformers' cross-encoder MarginMSELoss, per group)."""
    assert teacher is not None
    student = logits[:, :1].float() - logits[:, 1:].float()
    target = teacher[:, :1].float() - teacher[:, 1:].float()
    return ((student - target) ** 2).mean(1).sum()


def listnet_loss(logits: torch.Tensor, teacher: torch.Tensor | None = None) -> torch.Tensor:
    """ListNet (Cao et al. 2007): cross-entropy of the group's softmax against the teacher's
    softmax over its scores (here as the KL divergence, which differs from it by the teacher's
    entropy: the same gradient)."""
    assert teacher is not None
    return soft_cross_entropy(logits, teacher, 1.0)


BASELINES = {  # the dev orders a reranker's is compared with: key, in words
    "first_stage_mrr@10": "the first stage's order",
    "chance_mrr@10": "a random order",
}


def baseline(examples: Sequence[RetrievalExample]) -> dict[str, float]:
    """What reranking the dev groups must beat: with every group's first-stage "ranks" (bertforge
    mine's), their MRR@10 in that order (a passage below the depth mined after the others,
    ties by the given order); else that of a random order (each group's expected reciprocal
    rank of its positive in the top 10)."""
    if examples and all(e.ranks for e in examples):
        run = {}
        for i, e in enumerate(examples):
            last = len(e.ranks) + max(r or 0 for r in e.ranks)
            run[str(i)] = {str(j): -float(r or last + j) for j, r in enumerate(e.ranks)}
        qrels = {str(i): {"0": 1} for i in range(len(examples))}
        return {"first_stage_mrr@10": retrieval_scores(qrels, run)["mrr@10"]}
    sizes = [1 + len(e.negatives) for e in examples]
    chance = [sum(1 / r for r in range(1, min(n, 10) + 1)) / n for n in sizes]
    return {"chance_mrr@10": float(np.mean(chance))} if chance else {}


LOSSES = {
    "listwise": listwise_loss,
    "pointwise": pointwise_loss,
    "margin-mse": margin_mse_loss,
    "listnet": listnet_loss,
}
DISTILLED = ("margin-mse", "listnet")  # the losses that learn a teacher's scores


class RerankTask(TaskFamily):
    """Cross-encoder training on (query, positive, negatives) groups, read as retrieval files
    are (data/tasks/retrieval.py): each group a (C, T) row of pairs [CLS] query [SEP] passage
    [SEP], the positive first; `rerank_loss` listwise (softmax over the group), pointwise
    (binary cross-entropy per pair), or distilled from a teacher's scores of the group's pairs
    (margin-mse, listnet). Dev: the positive's rank among its group (MRR@10,
    recall@1), beside the MRR@10 of the order it would replace (baseline; warned about when not
    beaten: warning); a score that is not finite is an error naming the dev row. Saved as sentence-transformers saves a CrossEncoder (one label; its activation,
    sigmoid, named where each version reads it: save_activation). A step reads its groups'
    pairs in one pass unless --micro-batch-size cuts it: 32 groups of 8 are 256 pairs, 7.7 GB for
    MiniLM on the CPU (bf16, 128 pieces); --micro-batch-size 4, 2.0 GB and faster, the same
    gradients but for dropout's draws (figures: train/finetune.py)."""

    head = BertForSequenceClassification
    metric = "mrr@10"

    def read(self, path: str, labelled: bool = True) -> list[RetrievalExample]:
        examples = read_retrieval(path)
        if examples and not examples[0].negatives:
            raise DataError(
                f"{path}: rerank training needs negatives beside each positive (mine them: "
                "bertforge mine)"
            )
        return examples

    @property
    def distilled(self) -> bool:
        return self.options.rerank_loss in DISTILLED

    def head_kwargs(self) -> dict[str, Any]:
        return {"num_labels": 1}

    def featurize(self, examples: Sequence[RetrievalExample], training: bool = False) -> Features:
        groups = [[(e.query, p) for p in (e.positive, *e.negatives)] for e in examples]
        ids, types = grouped_rows(groups, self.tok, self.options.max_seq_length)
        if training and self.distilled:  # the teacher's scores (a dev file needs none)
            teacher = teacher_scores(examples, f"--rerank-loss {self.options.rerank_loss}")
            return Features(ids, types, np.array(teacher, np.float32))
        return Features(ids, types, np.zeros(len(examples), np.int64))

    def loss_sum(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _Grouped(model)(*batch.inputs())
        teacher = batch.labels.to(logits.device) if self.distilled else None
        loss = LOSSES[self.options.rerank_loss](logits, teacher)
        return loss, (logits.argmax(-1) == 0).sum()

    def evaluate(
        self, runner: Runner, model: nn.Module, examples: Sequence[Any], features: Features
    ) -> tuple[dict[str, float], Any]:
        rows = infer(runner, _Grouped(model), features, self.tok.pad_id, outputs=lambda out: out)
        for e, r in zip(examples, rows):  # a NaN positive (listed first) would rank first
            if not np.isfinite(r).all():
                j = int(np.flatnonzero(~np.isfinite(r))[0])
                what = "the positive" if j == 0 else f"negative {j}"
                raise unrankable(f"{e.source}: passage {j} ({what})", float(r[j]))
        run = {str(i): {str(j): float(s) for j, s in enumerate(r)} for i, r in enumerate(rows)}
        qrels = {str(i): {"0": 1} for i in range(len(examples))}
        return {**retrieval_scores(qrels, run, recall_at=(1,)), **baseline(examples)}, run

    def warning(self, best: dict[str, Any]) -> str | None:
        """The run's verdict when its order of the dev groups is not better than the one it
        would replace (the first stage's, else a random one): reranking with it would not help
        search (the user of issue 54 lost 55 MRR@10 points to a head left at chance)."""
        for key, what in BASELINES.items():
            if key in best and not best["mrr@10"] > best[key]:
                return (
                    f"the reranker's dev MRR@10 {best['mrr@10']:.4f} is not better than {what} "
                    f"of the same groups ({best[key]:.4f}): reranking with it would not improve "
                    "search (train longer or on more groups, or fuse it: search --rerank-fuse "
                    "zscore)"
                )
        return None

    def write_predictions(self, out: Any, examples: Sequence[Any], preds: Any) -> list[Path]:
        """predictions_rerank.jsonl: per dev group its scores, the positive's first."""
        lines = [
            json_text({"query": e.query, "scores": list(preds[str(i)].values())})
            for i, e in enumerate(examples)
        ]
        path = Path(out) / "predictions_rerank.jsonl"
        write_text(path, "".join(line + "\n" for line in lines))
        return [path]

    def save_files(self, out: Path) -> None:
        save_activation(out, "Sigmoid")


class _Grouped(nn.Module):
    """A cross-encoder over (B, C, T) groups of pairs: (B, C) scores."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, C, T = ids.shape
        flat = (x.reshape(B * C, T) for x in (ids, types, mask))
        return self.model(*flat).logits.reshape(B, C)
