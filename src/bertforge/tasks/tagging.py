"""Token classification (NER, CoNLL-2003): a label for every word, trained and predicted on
the first piece of each word (the paper's section 5.3; HF's `label_all_tokens=False`).

Words are tokenized as given by the file (split_into_words), so every word maps back to its
line; the pipeline tokenizes raw text and takes the same first pieces. A sentence longer than
max_seq_length pieces keeps its first words; the words cut off are predicted "O" and counted in
one warning. Tags become entities by one decoder for the metric and the pipeline alike
(evaluate.entity_spans: conlleval's rules for IOB1, IOB2 and IOBES), so the family is entity
tagging only: a labelled file's tags and --labels must be entity tags, checked as they are read
(a POS column is refused there, not at the first dev evaluation). Scores are entity-level
precision, recall and F1; predictions are written as a CoNLL column file: `token gold
predicted` (conlleval's input) or `token predicted` for unlabelled input.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import BertConfig
from ..data.tasks import TaggedSentence, read_conll
from ..errors import CheckpointError, ConfigError, DataError
from ..evaluate import ENTITY_TAGS, entity_scores, entity_spans, is_entity_tag
from ..fileio import write_text
from ..heads import BertForTokenClassification
from .base import IGNORE_INDEX, Batch, Features, TaskFamily, classification_loss, softmax

OUTSIDE = "O"


def token_classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Tagging: logits (B, T, K), labels (B, T) with IGNORE_INDEX on positions without a target
    (padding, [CLS]/[SEP], every piece of a word but its first). Cross-entropy over the
    labelled positions: their mean (HF's loss), or the sum."""
    return classification_loss(logits, labels, reduction)


def tag_set(sentences: Sequence[TaggedSentence]) -> list[str]:
    """ "O" first, then the other tags sorted (B-/I- of a type side by side)."""
    tags = {t for s in sentences for t in s.tags}
    return [OUTSIDE, *sorted(tags - {OUTSIDE}, key=lambda t: (t[2:], t))]


def check_entity_tags(sentences: Sequence[TaggedSentence], tag_column: int) -> None:
    """Every tag one that entity_spans reads: the dev metric, `ner` and the probe all decode
    entities, so a tag set that is not one (POS tags, --tag-column 1) is refused as it is read,
    naming its file and line, not at the first dev evaluation or in a saved model."""
    for s in sentences:
        for w, tag in enumerate(s.tags):
            if not is_entity_tag(tag):
                raise DataError(
                    f'{s.where(w)}: field "tag" (--tag-column {tag_column}): {tag!r} is not '
                    f"{ENTITY_TAGS}: conll2003 tags entities; is that the entity column?"
                )


def model_tags(config: BertConfig, model_dir: str | Path) -> list[str]:
    """A token classifier's tags in id order, when each is one entity_spans reads (ner decodes
    entities from them); else a CheckpointError, before any work, naming its config.json and
    id2label: a tagger of something else (parts of speech) or of unnamed labels (LABEL_0)."""
    names = config.labels
    tags = [names[i] for i in range(len(names))]
    if bad := [t for t in tags if not is_entity_tag(t)]:
        shown = ", ".join(f"{i}: {t!r}" for i, t in enumerate(tags[:8]))
        raise CheckpointError(
            f"{Path(model_dir) / 'config.json'}: id2label {{{shown}"
            f"{', ...' if len(tags) > 8 else ''}}}: {len(bad)} of its {len(tags)} labels "
            f"({bad[0]!r} first) are not {ENTITY_TAGS}; ner reads entity tags (a tagger of "
            "CoNLL-2003's kind: finetune --task conll2003), and this token classifier tags "
            "something else"
        )
    return tags


def first_pieces(word_ids: Sequence[int | None], num_words: int) -> np.ndarray:
    """The row position of every word's first piece (-1: no piece, cut off by truncation or a
    word the tokenizer drops entirely)."""
    first = np.full(num_words, -1, np.int64)
    previous = None
    for j, w in enumerate(word_ids):
        if w is not None and w != previous:
            first[w] = j
        previous = w
    return first


def word_tags(
    logits: np.ndarray, first: np.ndarray, labels: Sequence[str]
) -> tuple[list[str], list[float]]:
    """Each word's tag (its first piece's argmax; "O" for a word without a piece) and the
    tag's probability. logits (T, K) of one row."""
    probs = softmax(logits)
    best = probs.argmax(-1)
    tags = [labels[best[j]] if j >= 0 else OUTSIDE for j in first]
    scores = [float(probs[j, best[j]]) if j >= 0 else 1.0 for j in first]
    return tags, scores


def entities(
    text: str, tags: Sequence[str], scores: Sequence[float], spans: Sequence[tuple[int, int]]
) -> list[dict[str, Any]]:
    """Entity spans of one text: words' tags decoded by evaluate.entity_spans, each entity
    with its type, character span (from the words' spans), text and mean word score."""
    out = []
    for kind, a, b in entity_spans(tags, "predicted tags"):
        start, end = spans[a][0], spans[b - 1][1]
        out.append(
            {
                "entity": kind,
                "start": start,
                "end": end,
                "text": text[start:end],
                "score": float(np.mean(scores[a:b])),
            }
        )
    return out


def featurize(
    sentences: Sequence[TaggedSentence],
    tok: Any,
    labels: Sequence[str],
    max_seq_length: int,
) -> Features:
    """Pieces of each sentence's words; the tag index on each word's first piece, IGNORE_INDEX
    elsewhere. meta[i]: first_pieces of the row."""
    encodings = tok.encode_batch(
        [s.tokens for s in sentences], max_length=max_seq_length, split_into_words=True
    )
    index = {t: i for i, t in enumerate(labels)}
    features = Features.from_encodings(encodings, meta=[])
    row_labels = []
    cut = 0
    for s, enc in zip(sentences, encodings):
        first = first_pieces(enc.word_ids, len(s.tokens))
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
        row_labels.append(y)
        features.meta.append(first)
    features.labels = row_labels
    if cut:
        warnings.warn(
            f"{cut:,} words beyond max_seq_length={max_seq_length} pieces were cut off their "
            "sentences (predicted O); raise --max-seq-length to keep them",
            stacklevel=2,
        )
    return features


class TaggingTask(TaskFamily):
    """Loss over first pieces, entity-level evaluation, CoNLL column predictions."""

    head = BertForTokenClassification
    metric = "f1"
    per_token = True

    def __init__(self, options: Any, tok: Any) -> None:
        super().__init__(options, tok)
        labels = options.labels
        self.labels: list[str] = (
            [x.strip() for x in labels.split(",") if x.strip()] if labels else []
        )
        if bad := [t for t in self.labels if not is_entity_tag(t)]:
            raise ConfigError(
                f"labels={labels!r} (--labels): {bad[0]!r} is not {ENTITY_TAGS}: conll2003 "
                "tags entities"
            )

    def read(self, path: str, labelled: bool = True) -> list[TaggedSentence]:
        """The file's sentences; labelled, their tags checked (check_entity_tags)."""
        o = self.options
        sentences = read_conll(
            path, tag_column=o.tag_column, labels=self.labels or None, labelled=labelled
        )
        if labelled:
            check_entity_tags(sentences, o.tag_column)
        return sentences

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
        return featurize(sentences, self.tok, self.labels, self.options.max_seq_length)

    def head_kwargs(self) -> dict[str, Any]:
        return {"id2label": dict(enumerate(self.labels))}

    def count(self, batch: Batch) -> int:
        return int((batch.labels != IGNORE_INDEX).sum())

    def loss_of(self, out: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = out.logits
        loss = token_classification_loss(logits, batch.labels, reduction="sum")
        labelled = batch.labels != IGNORE_INDEX
        return loss, ((logits.argmax(-1) == batch.labels) & labelled).sum()

    def distributions(
        self, out: Any, batch: Batch
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        return [(out.logits, batch.labels != IGNORE_INDEX)]  # each word's first piece

    def decode(
        self, sentences: Sequence[Any], features: Features, rows: list[np.ndarray]
    ) -> list[list[str]]:
        """The predicted tag of every word of every sentence."""
        return [word_tags(row, first, self.labels)[0] for first, row in zip(features.meta, rows)]

    def score(
        self,
        sentences: Sequence[TaggedSentence],
        features: Features,
        rows: list[np.ndarray],
        preds: Any,
    ) -> dict[str, float]:
        gold = [s.tags for s in sentences]
        scores = entity_scores(gold, preds)
        words = sum(len(g) for g in gold)
        right = sum(a == b for g, p in zip(gold, preds) for a, b in zip(g, p))
        return {
            **{k: scores[k] for k in ("f1", "precision", "recall")},
            "accuracy": right / max(words, 1),
        }

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
