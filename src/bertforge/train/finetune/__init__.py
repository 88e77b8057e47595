"""Fine-tuning on every task family of the paper (see run.py for the command).

run.py        FinetuneConfig, run (`bertforge finetune`), evaluate_model, predict
common.py     Features, collate, length-grouped epoch_batches, the FinetuneTask base
sentence.py   GLUE and tables of your own: classification and regression
tagging.py    CoNLL NER: first-piece labels, entity-level F1
squad.py      SQuAD v1.1 / v2.0: windows, max-context, n-best, the null threshold
choice.py     SWAG: multiple choice
"""

from __future__ import annotations

from .common import Batch, Features, collate, epoch_batches
from .run import TASKS, FinetuneConfig, evaluate_model, make_task, predict, run
from .sentence import SentenceTask, featurize

__all__ = [
    "TASKS",
    "Batch",
    "Features",
    "FinetuneConfig",
    "SentenceTask",
    "collate",
    "epoch_batches",
    "evaluate_model",
    "featurize",
    "make_task",
    "predict",
    "run",
]
