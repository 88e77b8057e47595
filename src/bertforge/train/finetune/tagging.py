"""Token classification (NER, CoNLL-2003): a label for every word, trained and predicted on
the first piece of each word (the paper's section 5.3; HF's `label_all_tokens=False`).

Words are tokenized as given by the file (split_into_words), so every word maps back to its
line. A sentence longer than max_seq_length pieces keeps its first words; the words cut off
are predicted "O" and counted in one warning. Scores are entity-level precision, recall and
F1 (conlleval rules, see evaluate.entity_scores); predictions are written as a CoNLL column
file: `token gold predicted` (conlleval's input) or `token predicted` for unlabelled input.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...config import BertConfig
from ...data.tasks import TaggedSentence, read_conll
from ...errors import ConfigError, DataError
from ...evaluate import entity_scores
from ...fileio import write_text
from ...heads import BertForTokenClassification
from ...tokenizer import Tokenizer
from .. import distributed
from .common import IGNORE_INDEX, Batch, Features, FinetuneTask

OUTSIDE = "O"


def tag_set(sentences: Sequence[TaggedSentence]) -> list[str]:
    """ "O" first, then the other tags sorted (B-/I- of a type side by side)."""
    tags = {t for s in sentences for t in s.tags}
    return [OUTSIDE, *sorted(tags - {OUTSIDE}, key=lambda t: (t[2:], t))]


def featurize(
    sentences: Sequence[TaggedSentence],
    tok: Tokenizer,
    labels: Sequence[str],
    max_seq_length: int,
) -> Features:
    """Pieces of each sentence's words; the tag index on each word's first piece, IGNORE_INDEX
    elsewhere. meta[i]: the row position of every word's first piece (-1: no piece, cut off
    by truncation or a word the tokenizer drops entirely)."""
    encodings = tok.encode_batch(
        [s.tokens for s in sentences], max_length=max_seq_length, split_into_words=True
    )
    index = {t: i for i, t in enumerate(labels)}
    ids, types, row_labels, meta = [], [], [], []
    cut = 0
    for s, enc in zip(sentences, encodings):
        first = np.full(len(s.tokens), -1, np.int64)
        previous = None
        for j, w in enumerate(enc.word_ids):
            if w is not None and w != previous:
                first[w] = j
            previous = w
        y = np.full(len(enc.ids), IGNORE_INDEX, np.int64)
        for w, tag in enumerate(s.tags):
            if first[w] < 0:
                continue
            if tag not in index:
                raise DataError(
                    f'{s.source}: word {w + 1} ({s.tokens[w]!r}): field "tag": {tag!r} is not '
                    f"one of the model's tags: {', '.join(labels)}"
                )
            y[first[w]] = index[tag]
        if len(enc.ids) >= max_seq_length:  # truncated: the words after the last kept one
            cut += len(s.tokens) - 1 - max((w for w in enc.word_ids if w is not None), default=-1)
        ids.append(np.asarray(enc.ids, np.int64))
        types.append(np.asarray(enc.token_type_ids, np.int64))
        row_labels.append(y)
        meta.append(first)
    if cut:
        warnings.warn(
            f"{cut:,} words beyond max_seq_length={max_seq_length} pieces were cut off their "
            "sentences (predicted O); raise --max-seq-length to keep them",
            stacklevel=2,
        )
    return Features(ids, types, row_labels, meta=meta)


class TaggingTask(FinetuneTask):
    """Loss over first pieces, entity-level evaluation, CoNLL column predictions."""

    head = BertForTokenClassification
    metric = "f1"

    def __init__(self, cfg: Any, d: distributed.Dist, tok: Tokenizer) -> None:
        super().__init__(cfg, d, tok.pad_id)
        self.tok = tok
        self.labels: list[str] = (
            [x.strip() for x in cfg.labels.split(",") if x.strip()] if cfg.labels else []
        )

    def read(self, path: str, labelled: bool = True) -> list[TaggedSentence]:
        return read_conll(
            path,
            tag_column=self.cfg.tag_column,
            labels=self.labels or None,
            labelled=labelled,
        )

    def set_labels(
        self, train: Sequence[TaggedSentence] | None = None, config: BertConfig | None = None
    ) -> None:
        if config is not None:
            names = config.labels
            self.labels = [names[i] for i in range(len(names))]
        elif not self.labels:
            self.labels = tag_set(train or [])
        if len(self.labels) < 2:
            raise ConfigError(f"tags {self.labels}: token classification needs at least 2")

    def featurize(self, sentences: Sequence[TaggedSentence], training: bool = False) -> Features:
        return featurize(sentences, self.tok, self.labels, self.cfg.max_seq_length)

    def head_kwargs(self) -> dict[str, Any]:
        return {"id2label": dict(enumerate(self.labels))}

    def count(self, micro: Batch) -> int:
        return int((micro.labels != IGNORE_INDEX).sum())

    def loss_sum(self, model: nn.Module, micro: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(micro.input_ids, micro.token_type_ids, micro.attention_mask).logits
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), micro.labels.flatten(), reduction="sum"
        )
        labelled = micro.labels != IGNORE_INDEX
        return loss, ((logits.argmax(-1) == micro.labels) & labelled).sum()

    def predict_examples(
        self, model: nn.Module, sentences: Sequence[TaggedSentence], features: Features
    ) -> list[list[str]]:
        """The predicted tag of every word of every sentence."""
        logits = self.infer(model, features, lambda out: out.logits, per_token=True)
        out = []
        for first, row in zip(features.meta, logits):
            best = row.argmax(-1)
            out.append([self.labels[best[j]] if j >= 0 else OUTSIDE for j in first])
        return out

    def evaluate_examples(
        self, model: nn.Module, sentences: Sequence[TaggedSentence], features: Features
    ) -> tuple[dict[str, float], list[list[str]]]:
        preds = self.predict_examples(model, sentences, features)
        gold = [s.tags for s in sentences]
        scores = entity_scores(gold, preds)
        words = sum(len(g) for g in gold)
        right = sum(a == b for g, p in zip(gold, preds) for a, b in zip(g, p))
        metrics = {k: scores[k] for k in ("f1", "precision", "recall")}
        return {**metrics, "accuracy": right / max(words, 1)}, preds

    def write_predictions(
        self, out: Path, sentences: Sequence[TaggedSentence], preds: Any
    ) -> list[Path]:
        lines = []
        for s, tags in zip(sentences, preds):
            for w, (token, tag) in enumerate(zip(s.tokens, tags)):
                lines.append(f"{token} {s.tags[w]} {tag}" if s.tags else f"{token} {tag}")
            lines.append("")
        path = out / "predictions_conll.txt"
        write_text(path, "\n".join(lines) + "\n")
        return [path]
