"""Heads on top of the encoder, and their losses as plain functions.

pretraining  masked LM + next sentence prediction (BertForPreTraining), their losses
tasks        fine-tuning: sequence classification / regression, token classification,
             span question answering, multiple choice, their losses
"""

from __future__ import annotations

from .pretraining import (
    IGNORE_INDEX,
    BertForMaskedLM,
    BertForPreTraining,
    MaskedLMHead,
    PreTrainingOutput,
    cross_entropy_sum,
    masked_lm_loss,
    next_sentence_loss,
    pretraining_loss,
)
from .tasks import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    MultipleChoiceOutput,
    QuestionAnsweringOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
    classification_loss,
    classifier_dropout,
    multi_label_loss,
    multiple_choice_loss,
    regression_loss,
    sequence_classification_loss,
    span_loss,
    token_classification_loss,
)

__all__ = [
    "IGNORE_INDEX",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "MaskedLMHead",
    "MultipleChoiceOutput",
    "PreTrainingOutput",
    "QuestionAnsweringOutput",
    "SequenceClassifierOutput",
    "TokenClassifierOutput",
    "classification_loss",
    "classifier_dropout",
    "cross_entropy_sum",
    "masked_lm_loss",
    "multi_label_loss",
    "multiple_choice_loss",
    "next_sentence_loss",
    "pretraining_loss",
    "regression_loss",
    "sequence_classification_loss",
    "span_loss",
    "token_classification_loss",
]
