"""`bertforge finetune`, `evaluate` and `predict`: one command for every task family of
bertforge.tasks (GLUE and csv tables, CoNLL NER, SQuAD v1.1/v2.0, SWAG, bi-encoders for
retrieval, cross-encoders for reranking).

The paper's recipe (section 4): every parameter trains, AdamW with 10% warmup then linear
decay, a few epochs at a small learning rate, on the same loop as pre-training
(train/loop.py), through the supervised machinery it shares with task distillation
(train/supervised.py). Training batches are length-grouped (LengthGroupedBatches); the dev set is
evaluated at the end of every epoch with the task's metrics, and the best model by the first
metric (MCC for CoLA, F1 for MRPC, entity F1 for CoNLL, F1 for SQuAD), or by --metric, is kept.
Classification reports each class's precision, recall and F1 beside it, and a warning when the
best model answers one class for every dev row (the majority class alone).

Memory. A training pass keeps what backward needs of every row it reads: about 18 MB per
128-piece row of all-MiniLM-L6-v2 in bf16 on the CPU (attention 42%, its probabilities twice,
before and after dropout, 26%; the feed-forward 26%), against 0.36 GB for the weights,
gradients and AdamW's state and 0.5 GB for the imports, tokenizer and data. At the defaults
(--batch-size 32, 128 pieces) retrieval on 300 SQuAD pairs peaks at 2.1 GB; rows of query,
positive and 7 negatives (retrieval or rerank: 256 passages a step) at 7.7 GB. Fewer rows a
pass bound it where a step needs more: --micro-batch-size N (accumulation, for losses that sum
over rows: rerank, N=4: 2.0 GB, and faster here) or --cache-chunk N (retrieval's in-batch
negatives, GradCache: N=32, 1.9 GB); the dev pass reads twice a training pass's rows at once.

OUT/
    config.json, model.safetensors, vocab.txt, tokenizer_config.json   the best model
    eval_results.json      its dev metrics, step and epoch; every evaluation is in metrics.jsonl
    predictions_*          its dev predictions in the task's own format (GLUE TSV, CoNLL
                           columns, SQuAD predictions.json / null_odds.json, SWAG CSV)
    run.json               the settings (checkpoints.RunDir); re-running a finished run says so
    checkpoints/step-N/    for resuming an interrupted run (the last one), removed when the run
                           finishes unless --keep-checkpoints N (checkpoints.RunDir.finish)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load_trained, load_with_fresh
from ..errors import ConfigError
from ..modeldir import ModelDir
from ..options import option
from ..runner import Runner, progress_bar, resolve_precision
from ..tasks import TaskFamily, TaskOptions, family, run_task_options
from ..tasks.document_scorer import is_document_summarizer
from . import distributed
from .checkpoints import RunDir
from .summarizer import document_summarizer, train_document_summarizer
from .supervised import SupervisedTask, TrainingOptions, fit, load_data


@dataclass(kw_only=True)
class FinetuneConfig(TrainingOptions):
    """`bertforge finetune`: the model, the files, the hyper-parameters (and TaskOptions)."""

    model: str = option(help="pre-trained checkpoint directory")
    train: str = option(help="training file (in the task's own format)")
    batch_size: int | None = option(
        None,
        "examples per step, all processes together (default: 32; 8 documents for the document "
        "summarizer)",
        min=1,
    )
    lr: float | None = option(
        None,
        "peak AdamW learning rate (default: 3e-5, the paper tries 5e-5, 3e-5, 2e-5; 1e-3 for the "
        "document summarizer, whose scorer starts fresh)",
        above=0,
    )

    def __post_init__(self) -> None:
        document = self.task == "summarize" and self.summarizer == "document"
        if self.batch_size is None:
            self.batch_size = 8 if document else 32
        if self.lr is None:
            self.lr = 1e-3 if document else 3e-5
        super().__post_init__()


def run(cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune cfg.model on cfg.task into cfg.out; returns the best dev metrics."""
    return distributed.launched(_run, cfg)


def _run(cfg: FinetuneConfig, d: distributed.Dist) -> dict[str, Any]:
    run = RunDir(cfg.out, cfg, d)
    if saved := run.finished(f"this run already finished; the model is in {run.path}"):
        return saved.get("best", {})
    source = ModelDir.open(cfg.model)  # its tokenizer, pooling and weights: each file read once
    tok = source.tokenizer
    if cfg.cache_chunk is not None and (cfg.micro_batch_size or d.world_size > 1):
        raise ConfigError(
            "--cache-chunk replaces accumulation: one process, no --micro-batch-size (GradCache "
            "sees the whole batch at once)"
        )
    if cfg.task == "retrieval" and cfg.micro_batch_size:
        raise ConfigError(
            f"--micro-batch-size {cfg.micro_batch_size}: retrieval's loss is over the whole "
            "batch (in-batch negatives, CoSENT's pairs), which accumulation would cut into "
            "smaller ones; --cache-chunk N bounds memory and keeps the whole batch's negatives"
        )
    if cfg.cache_chunk is not None and resolve_precision(cfg.precision, d.device) == "fp16":
        raise ConfigError("--cache-chunk needs bf16 or fp32 (its backward runs unscaled)")
    if cfg.task == "summarize" and cfg.summarizer == "document":
        return train_document_summarizer(run, cfg, source, family(cfg, tok), d)
    task = SupervisedTask(family(cfg, tok), cfg, d)
    task.family.set_model(source)
    train_examples, dev_examples = load_data(task, cfg)

    torch.manual_seed(cfg.seed)
    # a missing task head is what fine-tuning expects: said in the first lines, not warned about
    with source.reading():
        model, fresh = load_with_fresh(task.family.head, source.path, **task.family.head_kwargs())
    cfg.check_model(model.config)
    frozen = tuple(task.family.freeze_unused(model))  # not trained: not said to be
    fresh = [n for n in fresh if not n.endswith(frozen)]
    rows = f" ({len(task.train):,} windows)" if len(task.train) != len(train_examples) else ""
    header = (
        f"fine-tuning {cfg.model} on {cfg.task}: {len(train_examples):,} training examples"
        f"{rows}, {len(dev_examples) if dev_examples else 0:,} dev"
    )
    if fresh:
        header += f"\nnew task head, initialised here and trained now: {', '.join(fresh)}"
    return fit(run, task, model, tok, header, describe=f"finetune {cfg.task}")


def _load(
    model_dir: str | ModelDir,
    task: str | TaskOptions | None,
    options: dict[str, Any],
    device: str | None,
    precision: str,
) -> tuple[TaskFamily, Any, Runner]:
    """(task family with the model's labels, the model in eval mode, the runner)."""
    opts = task if isinstance(task, TaskOptions) else run_task_options(model_dir, task, options)
    fam = family(opts, ModelDir.open(model_dir).tokenizer)
    fam.set_model(model_dir)
    runner = Runner.create(device, precision)
    model = load_trained(fam.head, model_dir, f"{fam.head.hf_architecture} head")
    opts.check_model(model.config)
    fam.set_labels(config=model.config)
    return fam, model.to(runner.device).eval(), runner


def _read(fam: TaskFamily, data: str, max_rows: int | None, labelled: bool = True) -> list[Any]:
    """The first max_rows examples of `data` (all of them for None)."""
    if max_rows is not None and max_rows < 1:
        raise ConfigError(f"max_rows={max_rows} (--max-rows): must be >= 1")
    return fam.read(data, labelled=labelled)[:max_rows]


def evaluate_model(
    model_dir: str | ModelDir,
    task: str | TaskOptions | None,
    data: str,
    *,
    out: str | None = None,
    max_rows: int | None = None,
    device: str | None = None,
    precision: str = "auto",
    progress: bool = True,
    **options: Any,
) -> dict[str, float]:
    """Metrics of a fine-tuned model directory on a labelled task file (e.g. GLUE dev), or on
    its first `max_rows` examples; with `out`, its predictions are written there in the task's
    format. `task`: TaskOptions, or a name with TaskOptions fields as keyword arguments, or
    None: the task of the model's run.json (run_task_options fills the fields not given).
    progress: a bar over the examples on stderr (runner.progress_bar; as training's, shown
    unless turned off)."""
    source = ModelDir.open(model_dir)  # read once: its files, whichever reader asks
    with source.reading():
        opts = task if isinstance(task, TaskOptions) else run_task_options(source, task, options)
        if is_document_summarizer(source.path) and opts.task == "summarize":
            fam, scorer = document_summarizer(source, opts, device, precision)
            examples = _read(fam, data, max_rows)
            with _showing(scorer.runner, "evaluate", len(examples), progress):
                metrics, preds = scorer.evaluate(examples)
        else:
            fam, model, runner = _load(source, opts, options, device, precision)
            examples = _read(fam, data, max_rows)
            with _showing(runner, "evaluate", len(examples), progress):
                metrics, preds = fam.evaluate(runner, model, examples, fam.featurize(examples))
        if out is not None:
            fam.write_predictions(Path(out), examples, preds)
        return metrics


def _showing(runner: Runner, what: str, examples: int, progress: bool) -> Any:
    """runner.showing a bar over the examples (their rows are features: windows, choices)."""
    if not progress:
        return runner.showing(None)
    return runner.showing(progress_bar(what, examples, "examples"), units=examples)


def predict(
    model_dir: str | ModelDir,
    task: str | TaskOptions | None,
    data: str,
    out: str,
    *,
    max_rows: int | None = None,
    device: str | None = None,
    precision: str = "auto",
    progress: bool = True,
    **options: Any,
) -> list[Path]:
    """Predictions of a fine-tuned model for the inputs of `data` (labels, if any, unused), or
    of its first `max_rows`, written to the directory `out` in the task's format; returns the
    files written. `task` and progress as evaluate_model takes them."""
    source = ModelDir.open(model_dir)  # read once: its files, whichever reader asks
    with source.reading():
        opts = task if isinstance(task, TaskOptions) else run_task_options(source, task, options)
        if is_document_summarizer(source.path) and opts.task == "summarize":
            fam, scorer = document_summarizer(source, opts, device, precision)
            examples = _read(fam, data, max_rows, labelled=False)
            with _showing(scorer.runner, "predict", len(examples), progress):
                preds = scorer.predict(examples)
        else:
            fam, model, runner = _load(source, opts, options, device, precision)
            examples = _read(fam, data, max_rows, labelled=False)
            with _showing(runner, "predict", len(examples), progress):
                preds = fam.predict(runner, model, examples, fam.featurize(examples))
        return fam.write_predictions(Path(out), examples, preds)
