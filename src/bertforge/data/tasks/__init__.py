"""Fine-tuning task readers: task files in, typed examples out (no tokenization, no tensors).

One module per file family, each a set of pure functions that read a file and return
dataclasses, or end in one `DataError` naming file, line and field:

    table   Example; generic TSV / CSV / JSONL reader; the fixed 80/20 split; the pieces
            every table reader shares (open_table, Table, Record, ExampleFields)
    glue    TaskSpec, GLUE_TASKS (the nine GLUE tasks: columns, labels, metrics), read_glue
    squad   SquadExample, read_squad (v1.1 and v2.0, answer offsets verified)
    conll   TaggedSentence, read_conll (CoNLL-2003 column files), to_iob2
    swag    ChoiceExample, read_swag (multiple choice)
    retrieval  RetrievalExample, read_retrieval (query, positive, hard negatives), teacher_scores
    documents  SummaryExample, read_documents (JSONL documents, Wikipedia's leads as summaries)

Turning examples into features (token ids, spans, first-piece labels) is the heads' and
the training loop's business, kept out of here so readers stay testable on plain files.
"""

from __future__ import annotations

from .conll import TaggedSentence, read_conll, to_iob2
from .glue import GLUE_TASKS, TaskSpec, glue_task, read_glue
from .retrieval import RetrievalExample, read_retrieval, teacher_scores
from .squad import SquadExample, gold_answers, read_squad
from .swag import ChoiceExample, read_swag
from .table import Example, label_set, read_examples, split_train_test

# Every task `bertforge finetune --task` knows: the GLUE tasks, csv (a table of your own),
# CoNLL NER, SQuAD v1.1 and v2.0, SWAG, bi- and cross-encoders, extractive summaries.
TASK_NAMES = (
    *GLUE_TASKS,
    *("csv", "conll2003", "squad", "squad2", "swag", "retrieval", "rerank", "summarize"),
)

__all__ = [
    "GLUE_TASKS",
    "TASK_NAMES",
    "ChoiceExample",
    "Example",
    "RetrievalExample",
    "SquadExample",
    "TaggedSentence",
    "TaskSpec",
    "glue_task",
    "gold_answers",
    "label_set",
    "read_conll",
    "read_examples",
    "read_glue",
    "read_retrieval",
    "read_squad",
    "read_swag",
    "split_train_test",
    "teacher_scores",
    "to_iob2",
]
