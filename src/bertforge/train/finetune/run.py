"""`bertforge finetune`, `evaluate` and `predict`: one command for every task family.

    sentence.py   GLUE (sst2 mrpc stsb cola rte qnli wnli mnli qqp) and csv: classification,
                  regression
    tagging.py    conll2003: token classification (NER)
    squad.py      squad, squad2: span question answering
    choice.py     swag: multiple choice

The paper's recipe (section 4): every parameter trains, AdamW with 10% warmup then linear
decay, a few epochs at a small learning rate, on the same loop as pre-training
(train/loop.py). Training batches are length-grouped (common.epoch_batches); the dev set is
evaluated at the end of every epoch with the task's metrics, and the best model by the first
metric (MCC for CoLA, F1 for MRPC, entity F1 for CoNLL, F1 for SQuAD) is kept.

OUT/
    config.json, model.safetensors, vocab.txt, tokenizer_config.json   the best model
    eval_results.json      its dev metrics, step and epoch; every evaluation is in metrics.jsonl
    predictions_*          its dev predictions in the task's own format (GLUE TSV, CoNLL
                           columns, SQuAD predictions.json / null_odds.json, SWAG CSV)
    run.json               the settings; re-running a finished run says so
    checkpoints/step-N/    for resuming an interrupted run (the last one kept)
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...checkpoint import load_with_fresh
from ...data.tasks import GLUE_TASKS, TASK_NAMES, split_train_test
from ...errors import ConfigError, DataError
from ...fileio import write_json
from ...tokenizer import Tokenizer
from .. import distributed
from ..loop import LoopConfig, autocast, train
from .choice import ChoiceTask
from .common import FinetuneTask
from .sentence import SentenceTask
from .squad import SquadTask
from .tagging import TaggingTask

FAMILIES: dict[str, type[FinetuneTask]] = {
    **{name: SentenceTask for name in (*GLUE_TASKS, "csv")},
    "conll2003": TaggingTask,
    "squad": SquadTask,
    "squad2": SquadTask,
    "swag": ChoiceTask,
}
TASKS = TASK_NAMES
assert set(FAMILIES) == set(TASK_NAMES), "a task without a family, or a family without a name"


@dataclass
class FinetuneConfig:
    model: str
    task: str  # one of TASKS
    train: str
    out: str
    dev: str | None = None
    dev_split: float = 0.0  # >0: hold out this fraction of the train file as dev (fixed seed 0)
    epochs: float = 3.0
    batch_size: int = 32
    lr: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_seq_length: int | None = None  # default 384 for SQuAD, 128 otherwise
    seed: int = 0
    precision: str = "auto"
    # --task csv: columns (header names or 0-based indices) and labels of a table of your own
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    labels: str | None = None  # comma-separated label (or tag) set; default: the train file's
    regression: bool = False
    no_header: bool = False
    delimiter: str | None = None
    # conll2003: the tag column (negative counts from the end; the token is column 0)
    tag_column: int = -1
    # squad, squad2
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best_size: int = 20
    null_score_diff_threshold: float = 0.0
    log_every: int = 10
    progress: bool = True
    device: str | None = None

    def __post_init__(self) -> None:
        if self.task not in FAMILIES:
            raise ConfigError(f"task={self.task!r}: must be one of {', '.join(TASKS)}")
        if self.max_seq_length is None:
            self.max_seq_length = 384 if self.task.startswith("squad") else 128
        if not 0.0 <= self.dev_split < 1.0:
            raise ConfigError(f"dev_split={self.dev_split}: must be in [0, 1)")
        if self.dev_split and self.dev:
            raise ConfigError("give --dev or --dev-split, not both")
        for name in ("epochs", "batch_size", "lr", "max_seq_length", "doc_stride",
                     "max_query_length", "max_answer_length", "n_best_size"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)}: must be positive")


def make_task(cfg: FinetuneConfig, d: distributed.Dist, tok: Tokenizer) -> Any:
    return FAMILIES[cfg.task](cfg, d, tok)  # type: ignore[call-arg]


def load_data(task: Any, cfg: FinetuneConfig) -> tuple[list[Any], list[Any] | None]:
    """Read the train file (and the dev file, or the --dev-split part of train), settle the
    label set, and set task.train / task.dev features; returns (train, dev) examples."""
    train_examples = task.read(cfg.train)
    if len(train_examples) == 0:
        raise DataError(f"{cfg.train}: no examples")
    dev_examples = None
    if cfg.dev_split:
        train_examples, dev_examples = split_train_test(train_examples, cfg.dev_split)
    task.set_labels(train_examples)
    if cfg.dev:
        dev_examples = task.read(cfg.dev)
    task.train = task.featurize(train_examples, training=True)
    if dev_examples:
        task.dev = (dev_examples, task.featurize(dev_examples))
    return train_examples, dev_examples


def run(cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune cfg.model on cfg.task into cfg.out; returns the best dev metrics."""
    d = distributed.init(cfg.device)
    try:
        return _run(cfg, d)
    finally:
        distributed.shutdown(d)


def _settings(cfg: FinetuneConfig) -> dict[str, Any]:
    return {
        k: v
        for k, v in dataclasses.asdict(cfg).items()
        if k not in {"progress", "device", "log_every"}
    }


def _run(cfg: FinetuneConfig, d: distributed.Dist) -> dict[str, Any]:
    out = Path(cfg.out)
    run_file = out / "run.json"
    if run_file.is_file():
        saved = json.loads(run_file.read_text(encoding="utf-8"))
        if saved.get("settings") != _settings(cfg):
            raise ConfigError(
                f"{out} holds a fine-tuning run with other settings; use another --out"
            )
        if saved.get("finished"):
            if d.is_main:
                print(f"{out}: this run already finished; the model is in {out}")
            return saved.get("best", {})
    tok = Tokenizer.from_pretrained(cfg.model)
    task = make_task(cfg, d, tok)
    train_examples, dev_examples = load_data(task, cfg)

    torch.manual_seed(cfg.seed)
    # a missing task head is what fine-tuning expects: said in the first lines, not warned about
    model, fresh = load_with_fresh(task.head, cfg.model, **task.head_kwargs())
    model.train()
    steps = max(1, math.ceil(cfg.epochs * task.steps_per_epoch))
    main_metric = task.metric
    best: dict[str, Any] = {}
    if (out / "checkpoints").is_dir() and (out / "eval_results.json").is_file():
        # resuming: the best so far stays unless beaten
        best.update(json.loads((out / "eval_results.json").read_text(encoding="utf-8")))
        best.pop("task", None)

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        if not d.is_main or not metrics:
            return
        if best and metrics[main_metric] <= best[main_metric]:
            return
        best.clear()
        best.update(metrics, step=step, epoch=round(step / task.steps_per_epoch, 2))
        model.save_pretrained(out)
        tok.save_pretrained(out)
        task.write_predictions(out, task.dev[0], task.dev_predictions)  # of this evaluation
        write_json(out / "eval_results.json", {"task": cfg.task, **best})

    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_json(run_file, {"settings": _settings(cfg), "finished": False})
        rows = f" ({len(task.train):,} windows)" if len(task.train) != len(train_examples) else ""
        print(
            f"fine-tuning {cfg.model} on {cfg.task}: {len(train_examples):,} training examples"
            f"{rows}, {len(dev_examples) if dev_examples else 0:,} dev; {steps:,} steps "
            f"({cfg.epochs:g} epochs of {task.steps_per_epoch:,}), batch {cfg.batch_size}"
            + (f" over {d.world_size} processes" if d.world_size > 1 else "")
        )
        if fresh:
            print(f"new task head, initialised here and trained now: {', '.join(fresh)}")
    loop = LoopConfig(
        steps=steps,
        lr=cfg.lr,
        warmup_steps=round(cfg.warmup_ratio * steps),
        weight_decay=cfg.weight_decay,
        precision=cfg.precision,
        log_every=cfg.log_every,
        eval_every=task.steps_per_epoch if task.dev is not None else 0,
        save_every=task.steps_per_epoch,
        keep_checkpoints=1,
        progress=cfg.progress,
        seed=cfg.seed,
    )
    result = train(
        model,
        task,
        loop,
        out,
        d,
        save_extra=tok.save_pretrained,
        describe=f"finetune {cfg.task}",
        on_eval=on_eval,
    )
    if result["interrupted"]:
        return {"interrupted": True, "step": result["step"]}
    if d.is_main:
        if task.dev is None:  # nothing to choose by: the last model
            model.save_pretrained(out)
            tok.save_pretrained(out)
        write_json(run_file, {"settings": _settings(cfg), "finished": True, "best": best})
        if best:
            shown = ", ".join(
                f"{k} {v:.4f}" for k, v in best.items() if k not in {"step", "epoch", "loss"}
            )
            print(f"best dev {shown} (epoch {best['epoch']:g}); the model is in {out}")
        else:
            print(f"done: the model is in {out}")
    distributed.barrier(d)
    return dict(best)


def _load(model_dir: str, task: str, data: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """(task family object with the model's labels, the model in eval mode)."""
    cfg = FinetuneConfig(model=model_dir, task=task, train=data, out="", **options)
    tok = Tokenizer.from_pretrained(model_dir)
    t = make_task(cfg, distributed.Dist(), tok)
    model = t.head.from_pretrained(model_dir)
    t.set_labels(config=model.config)
    return t, model.eval()


def evaluate_model(
    model_dir: str,
    task: str,
    data: str,
    *,
    out: str | None = None,
    **options: Any,
) -> dict[str, float]:
    """Metrics of a fine-tuned model directory on a labelled task file (e.g. GLUE dev); with
    `out`, its predictions are written there in the task's format."""
    t, model = _load(model_dir, task, data, options)
    examples = t.read(data)
    features = t.featurize(examples)
    with torch.no_grad(), autocast(t.precision, t.d.device):
        metrics, preds = t.evaluate_examples(model, examples, features)
    if out is not None:
        t.write_predictions(Path(out), examples, preds)
    return metrics


def predict(model_dir: str, task: str, data: str, out: str, **options: Any) -> list[Path]:
    """Predictions of a fine-tuned model for the inputs of `data` (labels, if any, unused),
    written to the directory `out` in the task's format; returns the files written."""
    t, model = _load(model_dir, task, data, options)
    examples = t.read(data, labelled=False)
    features = t.featurize(examples)
    with torch.no_grad(), autocast(t.precision, t.d.device):
        preds = t.predict_examples(model, examples, features)
    return t.write_predictions(Path(out), examples, preds)
