"""`bertforge finetune` for sentence and sentence-pair tasks: classification and regression.

The paper's recipe (section 4.1): every parameter trains, one linear layer on the pooled [CLS]
vector, AdamW with 10% warmup then linear decay, a few epochs at a small learning rate. The
same loop as pre-training (train/loop.py) runs it; what is particular to fine-tuning lives here:

- features: each example tokenized once (pairs truncated longest-first to max_seq_length);
- batches: every epoch a seeded shuffle, then windows of 64 batches sorted by length, so that a
  batch holds sequences of similar length and little is padded; the windows' batches are
  shuffled again. A position (epoch, batch) resumes the stream exactly;
- evaluation on the dev file at the end of every epoch with the task's metrics; the best
  model by the first metric (e.g. MCC for CoLA, F1 for MRPC) is written to OUT in the HF layout
  with its label names, and its metrics to OUT/eval_results.json.

OUT/
    config.json, model.safetensors, vocab.txt, tokenizer_config.json   the best model
    eval_results.json      its dev metrics, step and epoch; every evaluation is in metrics.jsonl
    run.json               the settings; re-running a finished run says so
    checkpoints/step-N/    for resuming an interrupted run (the last one kept)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.tasks import Example, TaskSpec, glue_task, label_set, read_examples, read_glue
from ..errors import ConfigError, DataError
from ..evaluate import compute_metrics
from ..fileio import write_json
from ..heads import BertForSequenceClassification
from ..tokenizer import Tokenizer
from . import distributed
from .loop import LoopConfig, autocast, resolve_precision, train

GROUP_BATCHES = 64  # batches per length-sorted window


@dataclass
class FinetuneConfig:
    model: str
    task: str  # a GLUE task name (sst2, mrpc, stsb, cola, rte, qnli, wnli, mnli, qqp) or "csv"
    train: str
    out: str
    dev: str | None = None
    epochs: float = 3.0
    batch_size: int = 32
    lr: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_seq_length: int = 128
    seed: int = 0
    precision: str = "auto"
    # --task csv: columns (header names or 0-based indices) and labels of a table of your own
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    labels: str | None = None  # comma-separated label set (default: those in the train file)
    regression: bool = False
    no_header: bool = False
    delimiter: str | None = None
    log_every: int = 10
    progress: bool = True
    device: str | None = None


# ------------------------------------------------------------------------------------------------
# Data


def task_spec(cfg: FinetuneConfig, train_examples: list[Example] | None = None) -> TaskSpec:
    """The GLUE spec, or one made for a table of your own from the flags and the train file."""
    if cfg.task != "csv":
        return glue_task(cfg.task)
    if cfg.regression:
        labels = None
    elif cfg.labels:
        labels = tuple(x.strip() for x in cfg.labels.split(",") if x.strip())
    else:
        labels = tuple(label_set(train_examples or []))
    return TaskSpec(
        "csv",
        cfg.text_column,
        cfg.text_pair_column,
        cfg.label_column,
        labels,
        ("pearson", "spearman") if cfg.regression else ("accuracy",),
        id_column=None,
    )


def read_task_file(cfg: FinetuneConfig, path: str, spec: TaskSpec | None) -> list[Example]:
    if cfg.task != "csv":
        return read_glue(cfg.task, path, labelled=True)

    def column(name: str) -> str | int:
        return int(name) if cfg.no_header else name

    return read_examples(
        path,
        column(cfg.text_column),
        column(cfg.label_column),
        column(cfg.text_pair_column) if cfg.text_pair_column else None,
        delimiter={"\\t": "\t", "tab": "\t"}.get(cfg.delimiter or "", cfg.delimiter),
        header=not cfg.no_header,
        labels=spec.labels if spec is not None else None,
        regression=cfg.regression,
    )


@dataclass
class Features:
    """Tokenized examples: ids and segment ids per example, labels (class index or score)."""

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    labels: np.ndarray  # (N,) int64 class indices, or float32 scores

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter(map(len, self.input_ids), np.int64, count=len(self.input_ids))


def featurize(
    examples: Sequence[Example], tok: Tokenizer, spec: TaskSpec, max_seq_length: int
) -> Features:
    """[CLS] text [SEP] (pair [SEP]), truncated longest-first; labels as indices or floats."""
    pairs = [e.text_pair for e in examples] if spec.is_pair else None
    if pairs is not None:
        for e in examples:
            if e.text_pair is None:
                raise DataError(f"{e.source}: field {spec.text_pair_column!r}: missing text pair")
    encodings = tok.encode_batch(
        [e.text for e in examples],
        pairs,
        max_length=max_seq_length,  # type: ignore[arg-type]
    )
    if spec.is_regression:
        labels = np.array([float(e.label) for e in examples], np.float32)  # type: ignore[arg-type]
    else:
        index = {name: i for i, name in enumerate(spec.labels or ())}
        labels = np.empty(len(examples), np.int64)
        for i, e in enumerate(examples):
            if e.label not in index:
                raise DataError(
                    f"{e.source}: field {spec.label_column!r}: label {e.label!r} is not one of "
                    f"{', '.join(map(repr, index))}"
                )
            labels[i] = index[e.label]  # type: ignore[index]
    return Features(
        [np.asarray(x.ids, np.int64) for x in encodings],
        [np.asarray(x.token_type_ids, np.int64) for x in encodings],
        labels,
    )


@dataclass
class Batch:
    input_ids: torch.Tensor  # (b, T)
    token_type_ids: torch.Tensor  # (b, T)
    attention_mask: torch.Tensor  # (b, T)
    labels: torch.Tensor  # (b,)
    num_tokens: int = 0

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            *(t.to(device, non_blocking=True) for t in dataclasses.astuple(self)[:4]),
            num_tokens=self.num_tokens,
        )


def collate(features: Features, rows: Sequence[int] | np.ndarray, pad_id: int) -> Batch:
    T = max(len(features.input_ids[i]) for i in rows)
    B = len(rows)
    ids = np.full((B, T), pad_id, np.int64)
    types = np.zeros((B, T), np.int64)
    mask = np.zeros((B, T), np.int64)
    for j, i in enumerate(rows):
        n = len(features.input_ids[i])
        ids[j, :n], types[j, :n], mask[j, :n] = features.input_ids[i], features.token_type_ids[i], 1
    return Batch(
        torch.from_numpy(ids),
        torch.from_numpy(types),
        torch.from_numpy(mask),
        torch.from_numpy(features.labels[np.asarray(rows)]),
        num_tokens=int(mask.sum()),
    )


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The epoch's batches (row indices): shuffled, length-grouped in windows, shuffled again."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    window = batch_size * GROUP_BATCHES
    for w in range(0, len(order), window):
        rows = order[w : w + window]
        rows = rows[np.argsort(lengths[rows], kind="stable")]
        batches += [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


# ------------------------------------------------------------------------------------------------
# The task for the training loop


class ClassificationTask:
    """Loss, batches and dev evaluation of sentence(-pair) classification or regression."""

    def __init__(
        self,
        train_features: Features,
        dev_features: Features | None,
        spec: TaskSpec,
        cfg: FinetuneConfig,
        d: distributed.Dist,
        pad_id: int,
    ) -> None:
        if cfg.batch_size % d.world_size:
            raise ConfigError(
                f"batch_size={cfg.batch_size} must split evenly into {d.world_size} processes"
            )
        self.train, self.dev, self.spec, self.cfg, self.d = (
            train_features,
            dev_features,
            spec,
            cfg,
            d,
        )
        self.pad_id = pad_id
        self.lengths = train_features.lengths
        self.precision = resolve_precision(cfg.precision, d.device)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.train) / self.cfg.batch_size)

    def batches(self, position: Any) -> Iterator[tuple[list[Batch], Any]]:
        epoch, b = (position["epoch"], position["batch"]) if position else (0, 0)
        r, w = self.d.rank, self.d.world_size
        while True:
            batches = epoch_batches(self.lengths, self.cfg.batch_size, self.cfg.seed, epoch)
            for i in range(b, len(batches)):
                last = i + 1 == len(batches)
                nxt = {"epoch": epoch + 1, "batch": 0} if last else {"epoch": epoch, "batch": i + 1}
                rows = batches[i][r::w]
                if len(rows) == 0:  # a last batch smaller than the number of processes
                    continue
                yield [collate(self.train, rows, self.pad_id)], nxt
            epoch, b = epoch + 1, 0

    def normalizers(self, micro_batches: list[Batch]) -> torch.Tensor:
        return torch.tensor([float(sum(len(m.labels) for m in micro_batches))])

    def _loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.spec.is_regression:
            return F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="sum")
        return F.cross_entropy(logits.float(), labels, reduction="sum")

    def loss(
        self, model: nn.Module, micro: Batch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(micro.input_ids, micro.token_type_ids, micro.attention_mask).logits
        loss_sum = self._loss_sum(logits, micro.labels)
        # The mean over the global batch; x world size because DDP averages over ranks.
        loss = loss_sum / totals[0] * self.d.world_size
        with torch.no_grad():
            correct = (
                torch.zeros((), device=logits.device)
                if self.spec.is_regression
                else (logits.argmax(-1) == micro.labels).sum().float()
            )
            stats = torch.stack(
                [
                    loss_sum.detach(),
                    torch.tensor(float(len(micro.labels)), device=logits.device),
                    correct,
                ]
            )
        return loss, stats

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        out = {"loss": float(s[0] / s[1])}
        if not self.spec.is_regression:
            out["acc"] = float(s[2] / s[1])
        return out

    def predict(self, model: nn.Module, features: Features) -> np.ndarray:
        """Logits (N, K) in the features' order (batches sorted by length, then restored)."""
        order = np.argsort(features.lengths, kind="stable")
        out = np.empty((len(features), self.spec.num_labels), np.float32)
        size = self.cfg.batch_size * 2
        for i in range(0, len(order), size):
            rows = order[i : i + size]
            batch = collate(features, rows, self.pad_id).to(self.d.device)
            logits = model(batch.input_ids, batch.token_type_ids, batch.attention_mask).logits
            out[rows] = logits.float().cpu().numpy()
        return out

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self.dev is None:
            return {}
        logits = self.predict(model, self.dev)
        refs = self.dev.labels
        if self.spec.is_regression:
            preds = logits[:, 0]
            loss = float(np.mean((preds - refs) ** 2))
        else:
            preds = logits.argmax(-1)
            shifted = logits - logits.max(-1, keepdims=True)
            logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            loss = float(-logp[np.arange(len(refs)), refs].mean())
        positive = (
            self.spec.labels.index(self.spec.positive_label)
            if self.spec.positive_label is not None and self.spec.labels
            else 1
        )
        metrics = compute_metrics(self.spec.metrics, refs, preds, positive_label=positive)
        return {**metrics, "loss": loss}


# ------------------------------------------------------------------------------------------------
# The command


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
    if cfg.epochs <= 0:
        raise ConfigError(f"epochs={cfg.epochs}: must be positive")
    tok = Tokenizer.from_pretrained(cfg.model)
    spec = task_spec(cfg)
    train_examples = read_task_file(cfg, cfg.train, spec if cfg.task != "csv" else None)
    if cfg.task == "csv":
        spec = task_spec(cfg, train_examples)
    if len(train_examples) == 0:
        raise DataError(f"{cfg.train}: no examples")
    dev_examples = read_task_file(cfg, cfg.dev, spec) if cfg.dev else None
    train_features = featurize(train_examples, tok, spec, cfg.max_seq_length)
    dev_features = featurize(dev_examples, tok, spec, cfg.max_seq_length) if dev_examples else None

    torch.manual_seed(cfg.seed)
    if spec.is_regression:
        model = BertForSequenceClassification.from_pretrained(
            cfg.model, num_labels=1, problem_type="regression"
        )
    else:
        labels = dict(enumerate(spec.labels or ()))
        model = BertForSequenceClassification.from_pretrained(cfg.model, id2label=labels)
    model.train()
    task = ClassificationTask(train_features, dev_features, spec, cfg, d, tok.pad_id)
    steps = max(1, math.ceil(cfg.epochs * task.steps_per_epoch))
    main_metric = spec.metrics[0]
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
        write_json(out / "eval_results.json", {"task": spec.name, **best})

    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_json(run_file, {"settings": _settings(cfg), "finished": False})
        print(
            f"fine-tuning {cfg.model} on {spec.name}: {len(train_features):,} training examples, "
            f"{len(dev_features) if dev_features else 0:,} dev; {steps:,} steps "
            f"({cfg.epochs:g} epochs of {task.steps_per_epoch:,}), batch {cfg.batch_size}"
        )
    loop = LoopConfig(
        steps=steps,
        lr=cfg.lr,
        warmup_steps=round(cfg.warmup_ratio * steps),
        weight_decay=cfg.weight_decay,
        precision=cfg.precision,
        log_every=cfg.log_every,
        eval_every=task.steps_per_epoch if dev_features is not None else 0,
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
        describe=f"finetune {spec.name}",
        on_eval=on_eval,
    )
    if result["interrupted"]:
        return {"interrupted": True, "step": result["step"]}
    if d.is_main:
        if dev_features is None:  # nothing to choose by: the last model
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


def evaluate_model(
    model_dir: str,
    task: str,
    data: str,
    *,
    batch_size: int = 64,
    max_seq_length: int = 128,
    **table_options: Any,
) -> dict[str, float]:
    """Metrics of a fine-tuned model directory on a labelled task file (e.g. GLUE dev)."""
    cfg = FinetuneConfig(
        model=model_dir,
        task=task,
        train=data,
        out="",
        batch_size=max(1, batch_size // 2),
        max_seq_length=max_seq_length,
        **table_options,
    )
    tok = Tokenizer.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir)
    spec = task_spec(cfg)
    if cfg.task == "csv" and not cfg.regression:
        names = model.config.labels
        spec = dataclasses.replace(spec, labels=tuple(names[i] for i in range(len(names))))
    features = featurize(read_task_file(cfg, data, spec), tok, spec, max_seq_length)
    d = distributed.Dist()
    task_ = ClassificationTask(features, features, spec, cfg, d, tok.pad_id)
    with torch.no_grad(), autocast(task_.precision, d.device):
        return task_.evaluate(model.eval())
