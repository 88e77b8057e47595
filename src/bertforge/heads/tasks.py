"""Fine-tuning heads (paper section 4) and their losses as plain functions.

Each head is one small module on BertModel, with HF's class, parameter and tensor names, so
checkpoints load both ways (`bert.*`, `classifier.*`, `qa_outputs.*`):
    sequence classification / regression:  W dropout(pooler_output)    (B, K)
    token classification (tagging):        W dropout(h_t) for every t  (B, T, K)
    span question answering:               W h_t -> start, end logits  (B, T) each
    multiple choice:                       w dropout(pooler_output) per (context, ending) pair,
                                           (B, C, T) inputs run as (B*C, T) -> (B, C) logits
Dropout before a classifier is config.classifier_dropout, or hidden_dropout_prob when None (HF).
Models return logits; the losses take logits and labels and match HF's `loss` outputs.

Shape legend (besides model.py's B, T, H): K number of labels (config.num_labels),
C number of choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import Pretrained
from ..config import BertConfig
from ..errors import ConfigError, InputError
from ..model import BertModel, BertOutput, dropout, init_bert_weights
from .pretraining import IGNORE_INDEX


def classifier_dropout(config: BertConfig) -> float:
    """Dropout before a task classifier: classifier_dropout, else hidden_dropout_prob (as HF)."""
    if config.classifier_dropout is not None:
        return config.classifier_dropout
    return config.hidden_dropout_prob


def _init_head(head: nn.Module, config: BertConfig) -> None:
    """BERT's initialisation for a fresh head: N(0, initializer_range) weights, zero biases."""
    head.apply(lambda m: init_bert_weights(m, config.initializer_range))


@dataclass
class SequenceClassifierOutput:
    """logits: (B, K); for regression (num_labels == 1) (B, 1)."""

    logits: torch.Tensor
    encoder: BertOutput


@dataclass
class TokenClassifierOutput:
    """logits: (B, T, K), one score per label for every token."""

    logits: torch.Tensor
    encoder: BertOutput


@dataclass
class QuestionAnsweringOutput:
    """start_logits, end_logits: (B, T), scores for the answer span's first and last token."""

    start_logits: torch.Tensor
    end_logits: torch.Tensor
    encoder: BertOutput

    @property
    def logits(self) -> torch.Tensor:
        """(B, T, 2): start and end logits stacked, as HF's qa_outputs produces them."""
        return torch.stack((self.start_logits, self.end_logits), dim=-1)


@dataclass
class MultipleChoiceOutput:
    """logits: (B, C), one score per choice. encoder: the (B*C, T, ...) run of all pairs."""

    logits: torch.Tensor
    encoder: BertOutput


class BertForSequenceClassification(Pretrained, nn.Module):
    """Single sentences or sentence pairs -> K classes, or a score with num_labels == 1 (STS-B).

    HF `BertForSequenceClassification` layout: `bert.*` (with pooler), `classifier.*`.
    """

    hf_architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=True)
        self.p = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        _init_head(self.classifier, config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> SequenceClassifierOutput:
        """input_ids, token_type_ids, attention_mask (B, T) -> logits (B, K)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, **encoder_kwargs)
        assert out.pooler_output is not None
        pooled = dropout(out.pooler_output, self.p, self.training)  # (B, H)
        return SequenceClassifierOutput(logits=self.classifier(pooled), encoder=out)


class BertForTokenClassification(Pretrained, nn.Module):
    """A label for every token (NER: train and score the first piece of each word).

    HF `BertForTokenClassification` layout: `bert.*` (no pooler), `classifier.*`.
    """

    hf_architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.p = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        _init_head(self.classifier, config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> TokenClassifierOutput:
        """input_ids, token_type_ids, attention_mask (B, T) -> logits (B, T, K)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, **encoder_kwargs)
        h = dropout(out.last_hidden_state, self.p, self.training)  # (B, T, H)
        return TokenClassifierOutput(logits=self.classifier(h), encoder=out)


class BertForQuestionAnswering(Pretrained, nn.Module):
    """Span extraction (SQuAD): a start and an end score for every token; no dropout (as HF).

    HF `BertForQuestionAnswering` layout: `bert.*` (no pooler), `qa_outputs.*` of 2 rows.
    """

    hf_architecture = "BertForQuestionAnswering"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if config.num_labels != 2:
            # HF sizes qa_outputs by num_labels; any other count would not load there.
            raise ConfigError(
                f"num_labels={config.num_labels}: BertForQuestionAnswering scores a start and "
                "an end per token, so num_labels must be 2 (or id2label unset)"
            )
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        _init_head(self.qa_outputs, config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> QuestionAnsweringOutput:
        """input_ids, token_type_ids, attention_mask (B, T) -> start_logits, end_logits (B, T)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, **encoder_kwargs)
        logits = self.qa_outputs(out.last_hidden_state)  # (B, T, 2)
        start, end = logits.unbind(dim=-1)  # each (B, T)
        return QuestionAnsweringOutput(
            start_logits=start.contiguous(), end_logits=end.contiguous(), encoder=out
        )


class BertForMultipleChoice(Pretrained, nn.Module):
    """One score per (context, ending) pair, compared across choices (SWAG).

    HF `BertForMultipleChoice` layout: `bert.*` (with pooler), `classifier.*` of 1 row.
    """

    hf_architecture = "BertForMultipleChoice"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=True)
        self.p = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        _init_head(self.classifier, config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> MultipleChoiceOutput:
        """input_ids, token_type_ids, attention_mask, position_ids (B, C, T) -> logits (B, C)."""
        if input_ids.dim() != 3:
            raise InputError(
                "input_ids must be (batch, num_choices, seq_len) for multiple choice, got shape "
                f"{tuple(input_ids.shape)}"
            )
        B, C, T = input_ids.shape

        def flat(x: torch.Tensor | None, name: str) -> torch.Tensor | None:
            if x is None:
                return None
            if tuple(x.shape) != (B, C, T):
                raise InputError(
                    f"{name} has shape {tuple(x.shape)}, but input_ids has {(B, C, T)}"
                )
            return x.reshape(B * C, T)

        out = self.bert(
            input_ids.reshape(B * C, T),  # every (context, ending) pair is one sequence
            flat(token_type_ids, "token_type_ids"),
            flat(attention_mask, "attention_mask"),
            position_ids=flat(position_ids, "position_ids"),
            **encoder_kwargs,
        )
        assert out.pooler_output is not None
        pooled = dropout(out.pooler_output, self.p, self.training)  # (B*C, H)
        logits = self.classifier(pooled).view(B, C)  # (B*C, 1) -> (B, C)
        return MultipleChoiceOutput(logits=logits, encoder=out)


# ------------------------------------------------------------------------------------------------
# Losses

# Each gives the number HF's model returns as `loss` for the same logits and labels, accumulated
# in fp32. One difference: where every label of a batch is ignored, HF's mean is 0/0 = NaN; these
# return 0 (as masked_lm_loss does), so such a batch adds nothing instead of poisoning a run.


def _check_class_labels(labels: torch.Tensor, num_classes: int, what: str) -> None:
    """Labels in [0, num_classes) or IGNORE_INDEX; otherwise one clear message, not a torch
    IndexError (or a CUDA device assert)."""
    if labels.is_floating_point():
        raise InputError(f"{what} must be integer class ids, got dtype {labels.dtype}")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
    if bool(bad.any()):
        value = int(labels[bad][0])
        raise InputError(
            f"{what} contains {value}: must be in [0, {num_classes}) or {IGNORE_INDEX} (ignored)"
        )


def _mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (N, K), labels (N,) -> mean over labels != IGNORE_INDEX (0 if there are none)."""
    total = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Single-label classification (GLUE, SST-2, MNLI ...): logits (B, K), labels (B,) in [0, K).

    Mean cross-entropy; labels equal to IGNORE_INDEX are skipped.
    """
    if labels.shape != logits.shape[:-1]:
        raise InputError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(logits.shape[:-1])} "
            f"for logits {tuple(logits.shape)}"
        )
    _check_class_labels(labels, logits.shape[-1], "labels")
    return _mean_cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def regression_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Regression (STS-B): logits (B, 1) with labels (B,), or logits (B, K) with labels (B, K).

    Mean squared error in fp32; integer labels are taken as numbers.
    """
    if logits.shape[-1] == 1 and labels.dim() == logits.dim() - 1:
        logits = logits.squeeze(-1)  # (B, 1) -> (B,)
    if labels.shape != logits.shape:
        raise InputError(
            f"labels have shape {tuple(labels.shape)}, which does not fit regression logits "
            f"{tuple(logits.shape)}"
        )
    return F.mse_loss(logits.float(), labels.float())


def multi_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Multi-label classification: logits (B, K), labels (B, K) of 0/1 (or soft targets).

    Mean binary cross-entropy with logits, in fp32.
    """
    if labels.shape != logits.shape:
        raise InputError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(logits.shape)} "
            "(one 0/1 target per label)"
        )
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def sequence_classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, problem_type: str | None = None
) -> torch.Tensor:
    """The loss HF's BertForSequenceClassification picks: by config.problem_type, or when that
    is None, regression for K == 1, single-label for integer labels, multi-label otherwise."""
    if problem_type is None:
        if logits.shape[-1] == 1:
            problem_type = "regression"
        elif not labels.is_floating_point():
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        return regression_loss(logits, labels)
    if problem_type == "single_label_classification":
        return classification_loss(logits, labels)
    if problem_type == "multi_label_classification":
        return multi_label_loss(logits, labels)
    raise ConfigError(
        f"problem_type={problem_type!r}: must be None, regression, "
        "single_label_classification or multi_label_classification"
    )


def token_classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Tagging (NER): logits (B, T, K), labels (B, T) with IGNORE_INDEX on positions without
    a target (padding, [CLS]/[SEP], and every piece of a word but its first).

    Mean cross-entropy over labelled positions.
    """
    return classification_loss(logits, labels)


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
) -> torch.Tensor:
    """Span QA (SQuAD): (start CE + end CE) / 2, as HF's BertForQuestionAnswering.

    start_logits, end_logits (B, T); start_positions, end_positions (B,) or (B, 1) token
    indices. As HF: positions are clamped to [0, T], and position T (any index past the
    window: the answer is not in this window of a long document) is ignored. Negative positions
    become 0, the [CLS] "no answer" of SQuAD 2.0. Each of the two terms is a mean over the
    examples it does not ignore.
    """
    T = start_logits.shape[-1]
    total = start_logits.new_zeros((), dtype=torch.float32)
    for logits, positions, name in (
        (start_logits, start_positions, "start_positions"),
        (end_logits, end_positions, "end_positions"),
    ):
        if positions.dim() > 1:
            positions = positions.squeeze(-1)  # (B, 1) -> (B,)
        if positions.is_floating_point() or positions.shape != logits.shape[:-1]:
            raise InputError(
                f"{name} must be integer token indices of shape {tuple(logits.shape[:-1])}, "
                f"got {tuple(positions.shape)} {positions.dtype}"
            )
        positions = positions.clamp(0, T)  # T: outside the window, ignored
        valid = positions != T
        per_example = F.cross_entropy(logits.float(), positions.clamp(max=T - 1), reduction="none")
        total = total + (per_example * valid).sum() / valid.sum().clamp(min=1)
    return total / 2


def multiple_choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Multiple choice (SWAG): logits (B, C), labels (B,) the index of the right choice."""
    return classification_loss(logits, labels)
