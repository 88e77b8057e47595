"""The nine GLUE tasks: what each TSV holds, its labels and metrics, and a reader for it.

Why a table of specs: the GLUE files disagree in small ways (CoLA has no header, MRPC starts
with a byte-order mark, STS-B's label is a float column named "score", MNLI calls its label
"gold_label" and QQP "is_duplicate"), and a fine-tuning run needs the same facts again to
size the head and pick the metric. One plain dict, `GLUE_TASKS`, states them once.

Columns are read by header name, so extra columns (MNLI's parses, STS-B's genre and year)
and column order do not matter. The files are split on tabs with no quote processing.

Labelled or not: GLUE's test files (test.tsv, test_matched.tsv, ...) have no label column.
By default a file whose name starts with "test" is read unlabelled (label None) and any
other file must have the label column; pass labelled=True/False to decide yourself.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...evaluate import MULTI_LABEL_METRICS
from .table import Example, ExampleFields, open_table

METRIC_NAMES = ("accuracy", "f1", "mcc", "pearson", "spearman", *MULTI_LABEL_METRICS)


@dataclass(frozen=True)
class TaskSpec:
    """What a sentence(-pair) classification or regression task's file holds.

    labels None means regression (one float output). positive_label is the class F1 is
    computed for. headerless_columns names the fields of files that have no header row
    (CoLA's train and dev). guid is "<file stem>-<id_column value>" when the file has that
    column, else "<file stem>-<row number from 0>" (google-research/bert's convention).
    """

    name: str
    text_column: str
    text_pair_column: str | None
    label_column: str
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    positive_label: str | None = None
    id_column: str | None = "index"
    headerless_columns: tuple[str, ...] | None = None
    multi_label: bool = False  # several labels per example (label: a tuple of names)

    def __post_init__(self) -> None:
        for m in self.metrics:
            if m not in METRIC_NAMES:
                raise InputError(f"TaskSpec {self.name}: metric {m!r}: one of {METRIC_NAMES}")
        if "f1" in self.metrics and self.positive_label not in (self.labels or ()):
            raise InputError(f"TaskSpec {self.name}: f1 needs a positive_label among the labels")

    @property
    def is_pair(self) -> bool:
        return self.text_pair_column is not None

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Outputs of the head: the number of classes, or 1 for regression."""
        return 1 if self.labels is None else len(self.labels)


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

# Label orders follow google-research/bert's processors (MNLI: contradiction, entailment,
# neutral), so class indices match checkpoints fine-tuned there.
GLUE_TASKS: dict[str, TaskSpec] = {
    "cola": TaskSpec(
        "cola",
        "sentence",
        None,
        "label",
        _BINARY,
        ("mcc",),
        headerless_columns=("source", "label", "label_mark", "sentence"),
    ),
    "sst2": TaskSpec("sst2", "sentence", None, "label", _BINARY, ("accuracy",)),
    "mrpc": TaskSpec("mrpc", "#1 String", "#2 String", "Quality", _BINARY, ("f1", "accuracy"), "1"),
    "stsb": TaskSpec("stsb", "sentence1", "sentence2", "score", None, ("spearman", "pearson")),
    "qqp": TaskSpec(
        "qqp", "question1", "question2", "is_duplicate", _BINARY, ("f1", "accuracy"), "1", "id"
    ),
    "mnli": TaskSpec(
        "mnli",
        "sentence1",
        "sentence2",
        "gold_label",
        ("contradiction", "entailment", "neutral"),
        ("accuracy",),
    ),
    "qnli": TaskSpec("qnli", "question", "sentence", "label", _NLI2, ("accuracy",)),
    "rte": TaskSpec("rte", "sentence1", "sentence2", "label", _NLI2, ("accuracy",)),
    "wnli": TaskSpec("wnli", "sentence1", "sentence2", "label", _BINARY, ("accuracy",)),
}


def glue_task(name: str) -> TaskSpec:
    """The spec of a GLUE task by name; case, "-" and "_" are ignored ("SST-2", "sts_b")."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        raise InputError(f"GLUE task {name!r}: unknown; one of {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def read_glue(
    task: str | TaskSpec,
    path: str | os.PathLike[str],
    *,
    labelled: bool | None = None,
    skip_empty: bool = False,
) -> list[Example]:
    """Examples of one GLUE TSV file (train, dev, dev_matched, test, ...).

    labelled None: unlabelled iff the file name starts with "test". An empty text is an
    error naming file, line and column; skip_empty=True skips such rows instead, with one
    warning that counts them (no such row exists in the GLUE files in shared/data; QQP
    and MNLI are not there, so their full files are unchecked).
    """
    spec = glue_task(task) if isinstance(task, str) else task
    path = Path(path)
    if labelled is None:
        labelled = not path.name.lower().startswith("test")
    headerless = spec.headerless_columns
    table = open_table(
        path,
        header=lambda first: headerless is None or spec.text_column in first,
        names=headerless,
        what=f"{spec.name} files without a header have {len(headerless or ())} columns",
    )
    text_i = table.column(spec.text_column, f"{spec.name} text column")
    pair_i = None
    if spec.text_pair_column is not None:
        pair_i = table.column(spec.text_pair_column, f"{spec.name} second text column")
    label_i = table.column(spec.label_column, f"{spec.name} label column") if labelled else None
    names = table.names or []
    id_i = names.index(spec.id_column) if spec.id_column in names else None
    fields = ExampleFields(text_i, pair_i, label_i, (), id_i, guid_prefix=f"{path.stem}-")

    out: list[Example] = []
    skipped: list[int] = []
    texts = [i for i in (text_i, pair_i) if i is not None]
    for row in table.records():
        if skip_empty and any(not row.fields[i].strip() for i in texts):
            skipped.append(row.lineno)
            continue
        out.append(fields.example(row, len(out), spec.labels, spec.is_regression))
    if skipped:
        lines = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        warnings.warn(
            f"{path}: skipped {len(skipped)} rows with an empty text (lines {lines})", stacklevel=2
        )
    return out
