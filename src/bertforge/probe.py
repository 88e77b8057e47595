"""`bertforge probe`: the paper's feature-based approach (section 5.3, Table 7) on a sentence task.

The encoder stays frozen: every layer's hidden states are pooled per sentence (mean over real
tokens, or [CLS]) once, and a scikit-learn logistic regression is fitted on the training
features of each layer choice and scored on the dev set. Layer choices (the paper's):

    0                   the embeddings
    -1, -2, ...         one layer (-1: the last)
    sum:-1,-2,-3,-4     the sum of several layers (pooled vectors summed)
    concat:-1,-2,-3,-4  their concatenation
    sum:all             every layer's sum

A bare choice is one layer: "-1,-2" (features' spelling) is refused, not silently summed.

Which layer is best says how far up the network a task's information lives. Tagging tasks
(CoNLL-2003) take the token-level path: per-word features, a BiLSTM, entity F1
(probe_tokens.py, which adds `mix:...`, a learned weighted sum).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from . import embedding
from .data.tasks import GLUE_TASKS
from .embedding import POOLINGS
from .errors import ConfigError, check_choice
from .model import BertModel
from .modeldir import ModelDir
from .pipelines import Pipeline
from .runner import progress_bar
from .tasks import TaskFamily, TaskOptions, family

DEFAULT_CHOICES = ("0", "-1", "-2", "-3", "-4", "sum:-1,-2,-3,-4", "concat:-1,-2,-3,-4", "sum:all")
# the tasks it takes: single-sentence GLUE tasks, a table with one text column (csv), and tagging
# (conll2003: probe_tokens.py)
TASKS = (*(name for name, spec in GLUE_TASKS.items() if not spec.is_pair), "csv", "conll2003")
# the task options a classifier on frozen features cannot use (not offered): the features are
# the pipeline's (windows of the model's length), not --max-seq-length rows
UNUSED_OPTIONS = (
    *("doc_stride", "max_query_length", "max_answer_length", "n_best_size"),
    "null_score_diff_threshold",
    *("text_pair_column", "regression", "multi_label", "tune_threshold", "max_seq_length"),
)


def pooled_layers(pipe: Pipeline, texts: Sequence[str], pooling: str = "mean") -> np.ndarray:
    """(N, L + 1, H): every layer's hidden states (0 = embeddings) pooled per text (one of
    bertforge.embedding's poolings)."""
    check_choice("pooling", pooling, POOLINGS)
    model = pipe.model(BertModel)

    def fn(b: dict[str, Any]) -> np.ndarray:
        out = model(*b["inputs"], output_hidden_states=True)
        h = torch.stack(out.hidden_states, 1)  # (B, L+1, T, H)
        B, n, T, H = h.shape
        mask = b["attention_mask"].repeat_interleave(n, 0)  # (B * (L+1), T)
        return embedding.pool(h.reshape(B * n, T, H), mask, (pooling,)).view(B, n, H).cpu().numpy()

    return np.stack(pipe.run(pipe.encode(list(texts)), fn))


def parse_choice(
    choice: str, n_layers: int, kinds: Sequence[str] = ("one", "sum", "concat")
) -> tuple[str, list[int]]:
    """(how, layer indices in 0..n_layers - 1) of one layer choice (see the module docstring;
    "mix:" is the token probe's learned weighted sum), checked against a model of n_layers
    hidden-state outputs (its layers + the embeddings): one ConfigError line if it is not one."""
    how, _, spec = choice.partition(":") if ":" in choice else ("one", "", choice)
    if how not in kinds:
        spelled = ", ".join("N" if k == "one" else f"{k}:N,M,..." for k in kinds)
        raise ConfigError(f"layer choice {choice!r}: use {spelled} or <how>:all")
    try:
        layers = list(range(n_layers)) if spec == "all" else [int(x) for x in spec.split(",")]
    except ValueError:
        raise ConfigError(f"layer choice {choice!r}: layers are integers") from None
    if how == "one" and len(layers) != 1:  # features' spelling: which combination is meant?
        prefixes = [f"{k}:" for k in kinds if k != "one"]
        combining = " or ".join(filter(None, (", ".join(prefixes[:-1]), prefixes[-1])))
        raise ConfigError(
            f"layer choice {choice!r}: {len(layers)} layers; a bare choice is one layer: to "
            f"combine layers use {combining} (e.g. sum:{spec})"
        )
    for k in layers:
        if not -n_layers <= k < n_layers:
            raise ConfigError(
                f"layer choice {choice!r}: layer {k} is not in -{n_layers}..{n_layers - 1} "
                f"(this model has {n_layers - 1} layers and the embeddings, 0)"
            )
    return how, [k % n_layers for k in layers]


def combine(features: np.ndarray, choice: str) -> np.ndarray:
    """(N, L + 1, H) -> (N, D) for one layer choice (see the module docstring)."""
    how, layers = parse_choice(choice, features.shape[1])
    picked = features[:, layers]  # (N, k, H)
    if how == "concat":
        return picked.reshape(len(features), -1)
    return picked.sum(1) if how == "sum" else picked[:, 0]


def probe(
    model: str,
    train: tuple[list[str], list[Any]],
    dev: tuple[list[str], list[Any]],
    choices: Sequence[str] = DEFAULT_CHOICES,
    pooling: str = "mean",
    c: float = 1.0,
    progress: bool = False,
    **pipeline_options: Any,
) -> list[dict[str, Any]]:
    """Dev accuracy of a logistic regression on each layer choice of frozen features.
    progress: a bar over the texts whose features are computed, on stderr."""
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler
    except ImportError as e:  # an optional dependency: the extra that brings it
        raise ConfigError(
            f'bertforge probe needs scikit-learn ({e}): pip install "bertforge[probe]"'
        ) from None
    pipe = Pipeline(model, **pipeline_options)
    for choice in choices:  # a bad choice is refused before the features are computed
        parse_choice(choice, pipe.config.num_hidden_layers + 1)
    start = time.perf_counter()
    texts = len(train[0]) + len(dev[0])
    with pipe.runner.showing(progress_bar("features", texts, "texts") if progress else None):
        x_train = pooled_layers(pipe, train[0], pooling)  # a row a text
        x_dev = pooled_layers(pipe, dev[0], pooling)
    seconds = time.perf_counter() - start
    rows = []
    for choice in choices:
        a, b = combine(x_train, choice), combine(x_dev, choice)
        scaler = StandardScaler().fit(a)
        clf = LogisticRegression(C=c, max_iter=2000).fit(scaler.transform(a), train[1])
        acc = float((clf.predict(scaler.transform(b)) == np.asarray(dev[1])).mean())
        rows.append({"layers": choice, "dim": a.shape[1], "dev_accuracy": acc})
    rows[0]["feature_seconds"] = seconds
    return rows


def read_task(
    model: str, options: TaskOptions, train: str, dev: str, max_train: int | None = None
) -> tuple[TaskFamily, list[Any], list[Any]]:
    """The task family of `options` (with the model's tokenizer), its training examples (the
    first max_train, if given) and its dev examples, read as fine-tuning reads them."""
    fam = family(options, ModelDir.open(model).tokenizer)
    examples = fam.read(train)[:max_train] if max_train else fam.read(train)
    return fam, examples, fam.read(dev)


def table(
    rows: Sequence[dict[str, Any]],
    key: str,
    title: str,
    fmt: Callable[[float], str],
    seconds: bool = False,
) -> str:
    """The probe's table (rows[key] under `title`, formatted by fmt; with seconds, each row's
    training time) and its best row, as `bertforge probe` prints them."""
    lines = [f"{'layers':<22} {'dim':>6}  {title}" + ("  seconds" if seconds else "")]
    for r in rows:
        took = f"  {r['seconds']:7.0f}" if seconds else ""
        lines.append(f"{r['layers']:<22} {r['dim']:>6}  {fmt(r[key]):>{len(title)}}{took}")
    best = max(rows, key=lambda r: r[key])
    lines.append(f"best: {best['layers']} ({fmt(best[key])})")
    return "\n".join(lines)
