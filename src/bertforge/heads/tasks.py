"""Fine-tuning heads (paper section 4) and their losses as plain functions.

Each head is one small module on BertModel, with HF's class, parameter and tensor names, so
checkpoints load both ways (`bert.*`, `classifier.*`, `qa_outputs.*`):
    sequence classification / regression:  W dropout(pooler_output)    (B, K)
    token classification (tagging):        W dropout(h_t) for every t  (B, T, K)
    span question answering:               W h_t -> start, end logits  (B, T) each
    multiple choice:                       w dropout(pooler_output) per (context, ending) pair,
                                           (B, C, T) inputs run as (B*C, T) -> (B, C) logits
Dropout before a classifier is config.classifier_dropout, or hidden_dropout_prob when None (HF).
Models return logits; each task's loss is a plain function beside its task (bertforge.tasks).

Shape legend (besides model.py's B, T, H): K number of labels (config.num_labels),
C number of choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..checkpoint import Pretrained
from ..config import BertConfig
from ..errors import ConfigError, InputError
from ..model import BertModel, BertOutput, dropout, init_bert_weights


def classifier_dropout(config: BertConfig) -> float:
    """Dropout before a task classifier: classifier_dropout, else hidden_dropout_prob (as HF)."""
    if config.classifier_dropout is not None:
        return config.classifier_dropout
    return config.hidden_dropout_prob


def _init_head(head: nn.Module, config: BertConfig) -> None:
    """BERT's initialisation for a fresh head: N(0, initializer_range) weights, zero biases."""
    head.apply(lambda m: init_bert_weights(m, config.initializer_range))


@dataclass
class ClassifierOutput:
    """logits: (B, K) for sequence classification ((B, 1) for regression), (B, T, K) for tokens,
    (B, C) for multiple choice (encoder: the (B*C, T, ...) run of all pairs)."""

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


class BertForSequenceClassification(Pretrained, nn.Module):
    """Single sentences or sentence pairs -> K classes, or a score with num_labels == 1 (STS-B).

    HF `BertForSequenceClassification` layout: `bert.*` (with pooler), `classifier.*`.
    """

    hf_architecture = "BertForSequenceClassification"
    per_token = False  # the classifier reads the pooled [CLS] (token classification: each token)
    outputs: int | None = None  # the classifier's rows; None: one per label (multiple choice: 1)

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        if self.outputs is None:  # named by the error on a checkpoint classifier of another size
            self.num_labels = config.num_labels
        # ModernBERT's token heads read each token through its head: the pooler's transform
        token_head = config.blocks.token_head
        self.bert = BertModel(config, add_pooling_layer=not self.per_token or token_head)
        self.p = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, self.outputs or config.num_labels)
        _init_head(self.classifier, config)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> ClassifierOutput:
        """input_ids, token_type_ids, attention_mask (B, T) -> logits (B, K), or (B, T, K)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, **encoder_kwargs)
        # (B, T, H) or (B, H)
        h = self.bert.token_states(out.last_hidden_state) if self.per_token else out.pooler_output
        return ClassifierOutput(
            logits=self.classifier(dropout(h, self.p, self.training)), encoder=out
        )


class BertForTokenClassification(BertForSequenceClassification):
    """A label for every token (NER: train and score the first piece of each word).

    HF `BertForTokenClassification` layout: `bert.*` (no pooler), `classifier.*`.
    """

    hf_architecture = "BertForTokenClassification"
    per_token = True


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
        self.bert = BertModel(config, add_pooling_layer=config.blocks.token_head)
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
        logits = self.qa_outputs(self.bert.token_states(out.last_hidden_state))  # (B, T, 2)
        start, end = logits.unbind(dim=-1)  # each (B, T)
        return QuestionAnsweringOutput(
            start_logits=start.contiguous(), end_logits=end.contiguous(), encoder=out
        )


class BertForMultipleChoice(BertForSequenceClassification):
    """One score per (context, ending) pair, compared across choices (SWAG).

    HF `BertForMultipleChoice` layout: `bert.*` (with pooler), `classifier.*` of 1 row.
    """

    hf_architecture = "BertForMultipleChoice"
    outputs = 1  # the sequence classifier's score of each pair

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> ClassifierOutput:
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

        out = super().forward(
            input_ids.reshape(B * C, T),  # every (context, ending) pair is one sequence
            flat(token_type_ids, "token_type_ids"),
            flat(attention_mask, "attention_mask"),
            position_ids=flat(position_ids, "position_ids"),
            **encoder_kwargs,
        )
        return ClassifierOutput(out.logits.view(B, C), out.encoder)  # (B*C, 1) -> (B, C)
