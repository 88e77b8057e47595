"""Heads on top of the encoder, in HF's class, parameter and tensor names (losses live with
their tasks, in bertforge.tasks).

pretraining  masked LM + next sentence prediction (BertForPreTraining), masked LM alone
             (BertForMaskedLM)
tasks        fine-tuning: sequence classification / regression, token classification,
             span question answering, multiple choice
"""

from __future__ import annotations

from .pretraining import BertForMaskedLM, BertForPreTraining, MaskedLMHead, PreTrainingOutput
from .tasks import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ClassifierOutput,
    QuestionAnsweringOutput,
    classifier_dropout,
)

__all__ = [
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "ClassifierOutput",
    "MaskedLMHead",
    "PreTrainingOutput",
    "QuestionAnsweringOutput",
    "classifier_dropout",
]
