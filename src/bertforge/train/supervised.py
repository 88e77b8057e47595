"""The supervised machinery shared by fine-tuning and task distillation (finetune.py,
distill.py), and general distillation's batches: the options both commands share
(TrainingOptions), the epoch's length-grouped batches (epoch_batches, apart_by_key,
LengthGroupedBatches), a task family as the training loop sees it (SupervisedTask), the train
and dev files read into features (load_data), the paper's AdamW loop (adamw_loop) and the epoch
loop that keeps the best model on dev (fit).

Both commands' configs are TrainingOptions; each adds its own model, training file (`train`),
batch size (`batch_size`) and learning rate (`lr`), which the functions here read by those names
(distillation's are None until its mode's default fills them: DistillConfig.__post_init__).
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ..data.tasks import split_train_test
from ..errors import ConfigError, DataError
from ..evaluate import class_table, metric_notes, single_class, split_classes
from ..fileio import write_json
from ..options import MAX_SEED, option
from ..runner import PRECISIONS, Runner
from ..tasks import TaskFamily, TaskOptions
from ..tasks.base import Batch, Features, collate
from ..tokenizer import Tokenizer
from . import distributed
from .checkpoints import RunDir
from .loop import LoopConfig, train

GROUP_BATCHES = 64  # batches per length-sorted window


@dataclass(kw_only=True)
class TrainingOptions(TaskOptions):
    """What fine-tuning and distillation share: TaskOptions, output, dev set, epochs, the loop's
    settings. Each command adds its own model, training data, batch size and learning rate."""

    # settings a resumed run may change (the rest must match run.json)
    RESUMABLE: ClassVar[frozenset[str]] = frozenset(
        {"progress", "device", "log_every", "keep_checkpoints", "compile"}
    )

    out: str = option(help="output directory (the fine-tuned model)")
    dev: str | None = option(None, "dev file: evaluated every epoch; the best model is kept")
    dev_split: float = option(
        0.0, "hold out this fraction of the train file as dev (fixed, seed 0)", min=0, below=1
    )
    # the file's first rows, not a sample: the same N rows on every run, a quick try of a recipe
    max_train_rows: int | None = option(
        None,
        "train on the first N examples of the train file, in file order (SQuAD: questions, "
        "CoNLL: sentences; with --dev-split: of the part left for training)",
        min=1,
    )
    max_dev_rows: int | None = option(
        None, "evaluate on the first N dev examples (of --dev or the --dev-split part)", min=1
    )
    epochs: float = option(3.0, "passes over train, may be fractional", above=0)
    micro_batch_size: int | None = option(
        None,
        "examples (rerank: groups) per forward pass and process: gradient accumulation, what "
        "a pass keeps for backward in memory (default: the whole batch)",
        min=1,
    )
    warmup_ratio: float = option(
        0.1, "fraction of the steps spent warming up, then linear decay", min=0, max=1
    )
    weight_decay: float = option(0.01, "AdamW weight decay", min=0)
    seed: int = option(0, "head initialisation, order, dropout", min=0, max=MAX_SEED)
    precision: str = option(
        "auto",
        "auto: bf16 where the device has it (fp16 on older GPUs), else fp32",
        choices=PRECISIONS,
    )
    metric: str | None = option(
        None,
        "the dev metric that picks the best epoch, e.g. macro_f1 or spam_f1 (default: the task's "
        "first: accuracy, MCC for CoLA, F1 for MRPC, CoNLL and SQuAD)",
    )
    keep_checkpoints: int = option(
        0,
        "checkpoints kept when the run finishes (0: none, the run directory holds the model; "
        "the last is kept while it runs, for resuming)",
        min=0,
    )
    log_every: int = option(10, "log every N steps", min=1)
    progress: bool = option(True, "no progress bars", flag="--no-progress")
    device: str | None = option(None, "cpu, cuda, cuda:1 (default: a GPU if there is one)")
    compile: bool = option(
        False,
        "the training step through torch.compile; off by default: fine-tuning's batches vary in "
        "length, and compiling them cost more than it saved (an SST-2 epoch of 20,000 rows on "
        "an H200: 74 s compiled, 19 s eager)",
        flag="--compile",
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # checks every option's type and range, the subclass's too
        if self.dev_split and self.dev:
            raise ConfigError("give --dev or --dev-split, not both")


def epoch_batches(
    lengths: np.ndarray,
    batch_size: int,
    seed: int,
    epoch: int,
    keys: np.ndarray | None = None,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The epoch's batches (row indices): shuffled, length-grouped in windows, shuffled again;
    with groups, the rows in group order instead (the groups shuffled, and the rows within
    each), cut into batches as they come, so a batch holds one group, or the end of one and
    the start of the next (with keys, rows put off join the next batches), and the batches
    shuffled (as many batches either way; not grouped by length);
    with keys, no two rows of a batch share a key while that can be helped (apart_by_key),
    first within each window, whose batches are in length order there, so a row put off joins
    a batch of about its length (rows sharing a key, e.g. the questions of one paragraph, are
    often as long as each other); then once more over the epoch, for what a window could not
    part (a no-op otherwise). Parting them after the shuffle alone padded SQuAD's retrieval
    pairs to 1.49x their pieces (now 1.09x; 1.01x without keys)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    if groups is not None:  # each group's place drawn at random; rows keep their shuffle
        codes = np.unique(groups, return_inverse=True)[1].reshape(-1)
        place = rng.permutation(int(codes.max()) + 1 if len(codes) else 0)
        order = order[np.argsort(place[codes[order]], kind="stable")]
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        if keys is not None:
            batches = apart_by_key(batches, keys, batch_size)
        return [batches[i] for i in rng.permutation(len(batches))]
    window = batch_size * GROUP_BATCHES
    for w in range(0, len(order), window):
        rows = order[w : w + window]
        rows = rows[np.argsort(lengths[rows], kind="stable")]
        grouped = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        batches += grouped if keys is None else apart_by_key(grouped, keys, batch_size)
    batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches if keys is None else apart_by_key(batches, keys, batch_size)


def apart_by_key(batches: list[np.ndarray], keys: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """The same rows in as many batches of the same sizes, in about the same order, with no two
    rows of a batch sharing a key (retrieval: the same positive passage twice in a batch is a
    false negative), as sentence-transformers' no-duplicates sampler: a row whose key its batch
    already has waits for the next batch that has not; one still waiting at the end is swapped
    into an earlier batch for a row the last places can take."""
    sizes = [len(b) for b in batches]
    waiting: list[int] = []
    out: list[list[int]] = []
    stream = iter([int(i) for b in batches for i in b])
    for size in sizes:
        batch: list[int] = []
        seen: set[int] = set()
        pending, waiting = waiting, []
        # the rows put off before, every one of them first; then new rows until the batch is full
        for n, i in enumerate(itertools.chain(pending, stream), 1):
            if len(batch) < size and keys[i] not in seen:
                batch.append(i)
                seen.add(keys[i])
            else:
                waiting.append(i)
            if len(batch) == size and n >= len(pending):
                break
        out.append(batch)
    for t, size in enumerate(sizes):  # rows left over: into the places left
        while len(out[t]) < size and waiting:
            out[t].append(_swap_in(out, t, waiting.pop(0), keys))
    return [np.asarray(b, np.int64) for b in out]


def _swap_in(batches: list[list[int]], t: int, row: int, keys: np.ndarray) -> int:
    """The row to add to batch t for `row`: `row` itself when t lacks its key, else a row of
    another batch that lacks it, swapped for `row` there, whose key t lacks (else `row`)."""
    have = {keys[i] for i in batches[t]}
    if keys[row] not in have:
        return row
    for b, batch in enumerate(batches):
        if b == t or keys[row] in {keys[i] for i in batch}:
            continue
        for j, other in enumerate(batch):
            if keys[other] not in have:
                batch[j] = row
                return other
    return row


@dataclass
class LengthGroupedBatches:
    """How fine-tuning and distillation walk their training rows (train/loop.py's batches):
    each epoch's batches from epoch_batches, each one's rows dealt over the processes and cut
    into micro-batches; the position after a step ({"epoch", "batch"}) resumes exactly. A batch
    with fewer rows than processes is left out (per_epoch)."""

    cfg: TrainingOptions  # batch_size (the command's), micro_batch_size, seed
    d: distributed.Dist
    pad_id: int
    # a key per row: rows sharing one stay out of the same batch (TaskFamily.batch_keys)
    keys: Callable[[Features], np.ndarray | None] | None = None
    # a group per row: batches cut from one group's rows (TaskFamily.batch_groups)
    groups: Callable[[Features], np.ndarray | None] | None = None
    multiple: int = 1  # each micro-batch's length rounded up to it (runner.pad_multiple)
    positions: int | None = None  # but not past the model's max_position_embeddings

    def __post_init__(self) -> None:
        size, w = self.cfg.batch_size, self.d.world_size
        if size % w:
            raise ConfigError(f"batch_size={size} must split evenly into {w} processes")

    def per_epoch(self, n: int) -> int:
        """The batches (optimizer steps) of an epoch of n rows: a batch of fewer rows than
        processes (the one batch_size does not fill) is left out of it, so that every process
        has rows in every step and all of them step together."""
        full, rest = divmod(n, self.cfg.batch_size)
        return full + (rest >= self.d.world_size)

    def batches(self, features: Features, position: Any) -> Iterator[tuple[list[Batch], Any]]:
        epoch, b = (position["epoch"], position["batch"]) if position else (0, 0)
        r, w = self.d.rank, self.d.world_size
        if self.per_epoch(len(features)) == 0:
            raise DataError(f"{len(features)} training rows for {w} processes: fewer than one each")
        while True:
            batches = epoch_batches(
                features.lengths,
                self.cfg.batch_size,
                self.cfg.seed,
                epoch,
                self.keys(features) if self.keys else None,
                self.groups(features) if self.groups else None,
            )
            batches = [rows for rows in batches if len(rows) >= w]  # as per_epoch counts
            for i in range(b, len(batches)):
                last = i + 1 == len(batches)
                nxt = {"epoch": epoch + 1, "batch": 0} if last else {"epoch": epoch, "batch": i + 1}
                rows = batches[i][r::w]
                m = self.cfg.micro_batch_size or len(rows)  # accumulated over micro-batches
                yield (
                    [
                        collate(
                            features, rows[j : j + m], self.pad_id, self.multiple, self.positions
                        )
                        for j in range(0, len(rows), m)
                    ],
                    nxt,
                )
            epoch, b = epoch + 1, 0


class SupervisedTask:
    """A task family as the training loop sees it (train/loop.py's Task): length-grouped
    batches, the family's summed loss over the global batch, dev evaluation."""

    # what an evaluation reports beside its metrics: counts, SQuAD v2's best thresholds
    NOT_METRICS: ClassVar[tuple[str, ...]] = ("n_gold", "n_pred", "n_correct", "_thresh", "total")

    def __init__(self, fam: TaskFamily, cfg: TrainingOptions, d: distributed.Dist) -> None:
        self.family, self.cfg, self.d = fam, cfg, d
        # The dev pass reads twice a training pass's rows at a time (it keeps no activations for
        # backward), so --micro-batch-size and --cache-chunk bound its memory too (rerank with
        # --micro-batch-size 4: 64 groups of 8 pairs a dev pass peaked at 3.1 GB, training 2.1).
        rows = cfg.cache_chunk or cfg.micro_batch_size or cfg.batch_size
        self.runner = Runner.create(str(d.device), cfg.precision, 2 * rows)
        self.grouped = LengthGroupedBatches(
            cfg, d, fam.tok.pad_id, fam.batch_keys, fam.batch_groups, self.runner.pad_multiple
        )
        self.train: Any = None  # Features
        self.dev: tuple[Any, Any] | None = None  # (examples, features)
        self.dev_predictions: Any = None  # of the last `evaluate`, for the predictions file

    @property
    def steps_per_epoch(self) -> int:
        return self.grouped.per_epoch(len(self.train))

    def batches(self, position: Any) -> Iterator[tuple[list[Batch], Any]]:
        return self.grouped.batches(self.train, position)

    def normalizers(self, micro_batches: list[Batch]) -> torch.Tensor:
        return torch.tensor([float(sum(self.family.count(m) for m in micro_batches))])

    def loss(
        self, model: nn.Module, micro: Batch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss_sum, correct = self.family.loss_sum(model, micro)
        # The mean over the global batch; x world size because DDP averages over ranks.
        loss = loss_sum / totals[0] * self.d.world_size
        n = torch.tensor(float(self.family.count(micro)), device=loss_sum.device)
        return loss, torch.stack([loss_sum.detach(), n, correct.float()])

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        out = {"loss": float(s[0] / s[1].clamp(min=1))}
        if self.family.reports_accuracy:
            out["acc"] = float(s[2] / s[1].clamp(min=1))
        return out

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self.dev is None:
            return {}
        metrics, self.dev_predictions = self.family.evaluate(self.runner, model, *self.dev)
        return metrics

    @property
    def metric(self) -> str:
        """The dev metric that picks the best epoch: --metric, else the family's first."""
        return self.cfg.metric or self.family.metric

    def check_metric(self, reported: Collection[str] | None = None) -> None:
        """--metric must name a metric the task reports: checked before training against the
        family's list where it has one (SentenceTask.metrics), else against the keys of the
        first evaluation (`reported`). Not the loss (lower is better) nor a count."""
        if self.cfg.metric is None:
            return
        if self.dev is None:
            raise ConfigError(
                f"--metric {self.cfg.metric}: picks the best epoch on dev; give --dev or "
                "--dev-split"
            )
        known = getattr(self.family, "metrics", None) if reported is None else reported
        if known is None:
            return  # known at the first evaluation
        choices = [m for m in known if m != "loss" and not m.endswith(self.NOT_METRICS)]
        if self.cfg.metric not in choices:
            raise ConfigError(
                f"--metric {self.cfg.metric}: {self.cfg.task} reports {', '.join(choices)}"
            )


def load_data(task: SupervisedTask, cfg: TrainingOptions) -> tuple[list[Any], list[Any] | None]:
    """Read the train file (and the dev file, or the --dev-split part of train), settle the
    label set, keep the first --max-train-rows / --max-dev-rows examples, and set task.train /
    task.dev features; returns (train, dev) examples."""
    fam = task.family
    train_examples = fam.read(cfg.train)
    if len(train_examples) == 0:
        raise DataError(f"{cfg.train}: no examples")
    # the labels of the whole training file: a try on a few rows has the full run's head, and
    # a rare class that --dev-split holds out wholly is still one
    fam.set_labels(train_examples)
    dev_examples = None
    if cfg.dev_split:  # the same split whatever the row limits keep of its parts
        train_examples, dev_examples = split_train_test(train_examples, cfg.dev_split)
    # row limits are a prefix in the file's order, not a sample: the same n, the same rows
    train_examples = train_examples[: cfg.max_train_rows]
    if cfg.dev:
        dev_examples = fam.read(cfg.dev)
    if dev_examples is not None:
        dev_examples = dev_examples[: cfg.max_dev_rows]
    task.train = fam.featurize(train_examples, training=True)
    if task.steps_per_epoch == 0:  # fewer rows than processes
        raise DataError(
            f"{cfg.train}: {len(task.train)} training rows for {task.d.world_size} processes, "
            "which need one each"
        )
    if dev_examples:
        task.dev = (dev_examples, fam.featurize(dev_examples))
    return train_examples, dev_examples


def adamw_loop(cfg: TrainingOptions, steps: int, **values: Any) -> LoopConfig:
    """Fine-tuning's loop, task and general distillation's too: the paper's AdamW, warmup then
    linear decay over `steps`, gradients clipped at 1, the last --keep-checkpoints checkpoints
    kept (at least the last one until the run finishes: RunDir.finish removes them for 0)."""
    return LoopConfig.of(
        cfg,
        steps=steps,
        warmup_steps=round(cfg.warmup_ratio * steps),
        decay_steps=None,
        keep_checkpoints=max(1, cfg.keep_checkpoints),
        optimizer="adamw",
        clip_norm=1.0,
        **values,
    )


def fit(
    run: RunDir,
    task: SupervisedTask,
    model: nn.Module,
    tok: Tokenizer,
    header: str,
    describe: str,
    kept: nn.Module | None = None,
) -> dict[str, Any]:
    """Train `model` on `task` for cfg.epochs (the paper's AdamW, warmup then linear decay),
    evaluate on dev after every epoch and keep the best model by task.metric (`kept`, when what
    is saved is a part of what trains) in the run's directory; returns the best dev metrics,
    said with each class's scores, and a warning if the model answers one class for every dev
    row. Fine-tuning and task distillation share it: it reads their TrainingOptions, batch size
    and lr."""
    cfg, d, out = run.cfg, run.d, run.path
    kept = model if kept is None else kept
    savers = (kept.save_pretrained, tok.save_pretrained, task.family.save_files)
    config = getattr(kept, "config", None)  # a BERT's rows are not padded past its positions
    task.grouped.positions = getattr(config, "max_tokens", None)
    model.train()
    steps = max(1, math.ceil(cfg.epochs * task.steps_per_epoch))
    main_metric = task.metric
    task.check_metric()
    best = _resumed_best(out)

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        if metrics and main_metric not in metrics:  # on every process: all stop alike
            task.check_metric(metrics)
        if not d.is_main or not metrics:
            return
        if best and _score(metrics, main_metric) <= _score(best, main_metric):
            return
        best.clear()
        best.update(metrics, step=step, epoch=round(step / task.steps_per_epoch, 2))
        for save in savers:
            save(out)
        task.family.write_predictions(out, task.dev[0], task.dev_predictions)  # of this evaluation
        write_json(out / "eval_results.json", {"task": cfg.task, **best})

    run.start(_start_line(header, task, steps, d))
    epoch = task.steps_per_epoch  # evaluated and saved after every epoch; the paper's AdamW
    loop = adamw_loop(cfg, steps, eval_every=epoch if task.dev is not None else 0, save_every=epoch)
    result = train(
        model,
        task,
        loop,
        out,
        d,
        save_extra=tok.save_pretrained,
        describe=describe,
        on_eval=on_eval,
    )
    # without dev there is nothing to choose by: the last model
    last = () if task.dev is not None else savers
    if not run.finish(result, _done_line(best, task, out), *last, best=best):
        return {"interrupted": True, "step": result["step"]}
    if d.is_main:
        _warn_if_one_class(best, main_metric)
        if best and (said := task.family.warning(best)):
            warnings.warn(said, stacklevel=2)
    return dict(best)


def _resumed_best(out: Path) -> dict[str, Any]:
    """The best evaluation so far: when resuming (checkpoints beside eval_results.json), the one
    saved, which stays unless beaten; else none."""
    best: dict[str, Any] = {}
    if (out / "checkpoints").is_dir() and (out / "eval_results.json").is_file():
        best.update(json.loads((out / "eval_results.json").read_text(encoding="utf-8")))
        best.pop("task", None)
    return best


def _score(metrics: dict[str, Any], metric: str) -> float:
    """The metric to beat; NaN (null in eval_results.json) below any number."""
    value = metrics[metric]
    return -math.inf if value is None or math.isnan(value) else float(value)


def _warn_if_one_class(best: dict[str, Any], metric: str) -> None:
    """A warning, said at fit's caller, when the best model answers one class for every dev row
    (the majority class alone)."""
    if (one := single_class(best)) is not None:
        warnings.warn(
            f"the model predicts {one!r} for every dev row: its {metric} of "
            f"{_score(best, metric):.4f} is that of always answering {one!r}; it has not learned "
            "the other classes (try more --epochs, another --lr, or more examples of the others)",
            stacklevel=3,
        )


def _start_line(header: str, task: SupervisedTask, steps: int, d: distributed.Dist) -> str:
    """fit's first line: the command's header, then the steps, epochs and batch."""
    cfg = task.cfg
    first, _, rest = header.partition("\n")
    return (
        f"{first}; {steps:,} steps ({cfg.epochs:g} epochs of {task.steps_per_epoch:,}), "
        f"batch {cfg.batch_size}"
        + (f" over {d.world_size} processes" if d.world_size > 1 else "")
        + (f"\n{rest}" if rest else "")
    )


def _done_line(best: dict[str, Any], task: SupervisedTask, out: Path) -> str:
    """fit's last line: the best dev metrics (each class's in a table below, then their scale and
    notes: metric_notes) and where the model is."""
    overall, _ = split_classes(best)
    shown = ", ".join(
        f"{k} {math.nan if v is None else v:.4f}"
        for k, v in overall.items()
        if k not in {"step", "epoch", "loss"}
    )
    where = f"the model is in {out}"
    by = f" by {task.metric}" if task.cfg.metric else ""
    done = f"best dev{by} {shown} (epoch {best['epoch']:g}); {where}" if best else f"done: {where}"
    if table := class_table(best):
        done += "\n" + table
    return "\n".join([done, *metric_notes(best)]) if best else done
