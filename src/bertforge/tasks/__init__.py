"""The task layer: each task family defined once, for training, evaluation, the pipelines and
the server alike (features, the head, the loss, decoding into answers, the metric).

    base        Features, padded batches, inference over features, the TaskFamily contract
    sentence    GLUE and tables of your own: classification, regression
    tagging     CoNLL NER: first-piece labels, the entity decoder, CoNLL column predictions
    squad       SQuAD v1.1/v2.0: windows, max-context, n-best, null threshold
    choice      SWAG: multiple choice
    pretraining masked LM and next sentence prediction: losses and batch statistics
    windows     texts longer than the model: windows, max-context, stitching per piece
    retrieval   bi-encoders: in-batch negatives over (query, positive, negatives) rows
    ranking     cross-encoders: activation, a (query, document) pair's rows, best window
    summarize   extractive summaries (BertSum): a [CLS] per sentence, oracle labels, ROUGE

`TaskOptions` are the settings that shape a task's features; `family(options, tok)` gives the
family object for a task name; `run_task_options` the settings a fine-tuned model was trained with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from ..data.tasks import GLUE_TASKS, TASK_NAMES
from ..errors import ConfigError
from ..modeldir import ModelDir
from ..options import check_options, option
from .base import Features, TaskFamily
from .choice import ChoiceTask
from .ranking import LOSSES, RerankTask
from .retrieval import HARDNESS, RetrievalTask
from .sentence import SentenceTask
from .squad import SquadTask
from .summarize import SummarizeTask
from .tagging import TaggingTask

FAMILIES: dict[str, type[TaskFamily]] = {
    **{name: SentenceTask for name in (*GLUE_TASKS, "csv")},
    "conll2003": TaggingTask,
    "squad": SquadTask,
    "squad2": SquadTask,
    "swag": ChoiceTask,
    "retrieval": RetrievalTask,
    "rerank": RerankTask,
    "summarize": SummarizeTask,
}
assert set(FAMILIES) == set(TASK_NAMES), "a task without a family, or a family without a name"


SUMMARIZERS = ("document", "bertsum")  # finetune --task summarize's two kinds


@dataclass(kw_only=True)
class TaskOptions:
    """What shapes a task's features: the task, lengths, the columns of a table of your own,
    CoNLL's tag column, SQuAD's windows and answers."""

    task: str = option(help="a task, or csv (a table of your own)", choices=TASK_NAMES)
    max_seq_length: int | None = option(
        None, "pieces per row (default: 384 for SQuAD, 512 for summarize, else 128)", min=3
    )
    # --task csv
    text_column: str = option("text", "csv: header name, or index with --no-header")
    text_pair_column: str | None = option(None, "csv: second text of sentence-pair tasks")
    label_column: str = option("label", "csv: the label column")
    labels: str | None = option(
        None, "comma-separated label (csv) or tag (conll2003) set (default: train's)"
    )
    regression: bool = option(False, "csv: float labels (one output)")
    multi_label: bool = option(
        False,
        "csv: several labels per text: names separated by | in the label column, or "
        "--label-column a,b,c of 0/1 columns",
    )
    tune_threshold: bool = option(
        False,
        "multi-label: each label's threshold tuned on dev for F1 (default 0.5) and kept in the "
        "model; dev is scored at 0.5, and at the tuned thresholds as tuned_* (optimistic)",
    )
    no_header: bool = option(False, "csv: columns are 0-based indices")
    delimiter: str | None = option(
        None, "csv: default tab (write tab or \\t) unless the file ends in .csv"
    )
    # conll2003
    tag_column: int = option(-1, "conll2003: the tag column (-1: the last; the token is column 0)")
    # squad, squad2
    doc_stride: int = option(128, "squad: pieces between window starts", min=1)
    max_query_length: int = option(64, "squad: question pieces kept", min=1)
    max_answer_length: int = option(30, "squad: longest answer in pieces", min=1)
    n_best_size: int = option(20, "squad: candidate starts and ends per window", min=1)
    null_score_diff_threshold: float = option(
        0.0, "squad2: answer '' when null - best span score exceeds this"
    )
    # retrieval
    cache_chunk: int | None = option(
        None,
        "retrieval: embed the batch in chunks of N rows without gradients, then backpropagate "
        "chunk by chunk (GradCache): --batch-size in-batch negatives, one chunk's memory",
        min=1,
    )
    matryoshka: str | None = option(
        None,
        "retrieval: e.g. 384,256,128,64: the loss summed over these leading dimensions, each "
        "renormalised (Matryoshka), so the vectors can be cut to any of them",
    )
    symmetric: bool = option(
        False,
        "retrieval: the mean of the query -> passages loss and each positive's over the batch's "
        "queries (sentence-transformers' doc_to_query direction)",
    )
    hardness_mode: str | None = option(
        None,
        "retrieval: add --hardness-strength x the cosine (no gradient) to the logits of "
        "all_negatives, in_batch_negatives (the other queries' passages) or hard_negatives (the "
        "query's own), as sentence-transformers' hardness_mode (Lan et al. 2025)",
        choices=HARDNESS,
    )
    hardness_strength: float = option(
        0.0, "retrieval: alpha of --hardness-mode (Lan et al. use 9; EmbeddingGemma 5)", min=0
    )
    group_batches: bool = option(
        False,
        'retrieval: rows in the order of their "group" (a document or topic; groups shuffled, '
        "rows shuffled within them) cut into batches, so a batch's in-batch negatives come from "
        "one group, harder than random ones (TAS-Balanced's topic-aware batches)",
    )
    teacher_weight: float | None = option(
        None,
        'retrieval: rows with a teacher\'s "scores" (bertforge mine --teacher) add this times '
        "the KL divergence of each query's softmax over its own passages (cosine x 20) from the "
        "teacher's softmax over their scores (ListNet) to the in-batch loss",
        min=0,
    )
    # rerank
    rerank_loss: str = option(
        "listwise",
        "rerank: listwise (softmax over a query's group), pointwise (binary cross-entropy "
        "per pair), or from a teacher's scores (the rows' \"scores\": bertforge mine "
        "--teacher): margin-mse (its margins positive - negative) or listnet (its softmax)",
        choices=tuple(LOSSES),
    )

    # summarize
    summary_sentences: int = option(
        3, "summarize: sentences a summary keeps (the oracle labels and the dev ROUGE)", min=1
    )
    summarizer: str = option(
        "document",
        "summarize: document (a Transformer over the document's sentence embeddings and "
        "features trains, the encoder frozen: minutes on a CPU) or bertsum (the encoder "
        "fine-tuned, a [CLS] per sentence, read in windows)",
        choices=SUMMARIZERS,
    )

    def __post_init__(self) -> None:
        check_options(self)
        for name in (
            "cache_chunk",
            "matryoshka",
            "teacher_weight",
            "symmetric",
            "group_batches",
            "hardness_mode",
        ):
            if getattr(self, name) not in (None, False) and self.task != "retrieval":
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{name} ({flag}) is for --task retrieval")
        if self.hardness_strength and self.hardness_mode is None:
            raise ConfigError(
                f"--hardness-strength {self.hardness_strength}: needs --hardness-mode"
            )
        if self.multi_label and (self.task != "csv" or self.regression):
            raise ConfigError("multi_label (--multi-label) is for --task csv classification")
        if self.multi_label and self.no_header and "," in self.label_column:
            raise ConfigError(
                f"label_column={self.label_column!r} (--label-column) with --no-header: one 0/1 "
                "column per label takes each label's name from the header; give the file a "
                "header row naming the labels, or one column of names separated by |"
            )
        if self.max_seq_length is None:
            task = self.task or ""
            self.max_seq_length = (
                384 if task.startswith("squad") else 512 if task == "summarize" else 128
            )

    def check_model(self, config: Any) -> None:
        """Settings that must fit the model: rows no longer than its position table."""
        assert self.max_seq_length is not None
        if self.max_seq_length > config.max_tokens:
            raise ConfigError(
                f"max_seq_length={self.max_seq_length} (--max-seq-length): the model has "
                f"{config.max_tokens} positions (max_position_embeddings="
                f"{config.max_position_embeddings}); use at most that"
            )


def run_task_options(
    model: str | os.PathLike[str] | ModelDir, task: str | None, options: dict[str, Any]
) -> TaskOptions:
    """The task settings for reading data the way a fine-tuned model was trained on it:
    `options`, then those of the run that trained it (its ModelDir's run: run.json, which
    `finetune` and `distill --task` write) when `task` is None (the run's task) or the run's
    task, then TaskOptions' defaults."""
    model_dir = ModelDir.open(model)
    saved = (model_dir.run or {}).get("settings", {})
    if task is None and not saved.get("task"):
        raise ConfigError(
            f"{model_dir}: no run.json saying which task the model was fine-tuned for (one "
            "`bertforge finetune` writes): give the task (--task)"
        )
    task = task or saved["task"]
    # a run for another task says nothing about this one's columns and lengths
    names = {f.name for f in fields(TaskOptions)} if saved.get("task") == task else set()
    settings = {k: v for k, v in saved.items() if k in names}
    return TaskOptions(**{**settings, **options, "task": task})


def family(options: TaskOptions, tok: Any) -> TaskFamily:
    """The family object of options.task, with its settings and tokenizer."""
    return FAMILIES[options.task](options, tok)


__all__ = ["FAMILIES", "Features", "TaskFamily", "TaskOptions", "family", "run_task_options"]
