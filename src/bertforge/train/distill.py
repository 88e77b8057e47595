"""`bertforge distill`: a smaller student taught by a teacher: general (embedding)
distillation on unlabelled text, or task distillation from a fine-tuned teacher.

Student, one of:
    --student-layers 0,2,5   those layers of the teacher (and its embeddings, pooler and task
                             head), at its width, from its weights (DistilBERT's initialisation);
                             student layer i is taught by teacher layer student_layers[i]
    --student-size mini      a fresh model of a named size, or of the shape a config.json gives
                             (layers, width, heads, feed-forward, activation; the vocabulary,
                             positions and labels stay the teacher's), BERT's initialisation
    --student DIR            a checkpoint to start from (e.g. a general-distilled student:
                             TinyBERT's two stages)
The last two map student layer i to teacher layer round((i+1) L_t / L_s) - 1 (TinyBERT's
uniform mapping). A student narrower than its teacher learns one linear projection per mapped
layer (embeddings included) for the hidden-state losses (TinyBERT's W_h); the projections are
in the checkpoints (exact resume) but not in the student.

Losses (each checked against a hand computation in tests/test_distill.py):
    general   per sentence: the MSE of the pooled (and normalised) sentence embeddings, as the
              teacher's sentence-transformers directory pools them (bertforge.embedding)
    task      (1 - alpha) x the task's own loss on the labels + alpha x the soft-target loss of
              the task family (TaskFamily.soft_loss_sum: temperature^2 x KL of the teacher's and
              student's distributions at the temperature; SQuAD's start and end, NER's tokens;
              squared error to the teacher's score for regression)
    both      + hidden_weight x the MSE of the mapped hidden states over the real tokens, and
              + attention_weight x the KL of the mapped layers' attention distributions (MiniLM's
              self-attention transfer; same number of heads), each averaged over the layers
The teacher runs without gradients, each batch once.

General distillation reads the text files `prepare` reads (lines, paragraphs, WikiExtractor,
JSONL), cut into sentences, each one row; it runs --steps steps and writes the student in the
teacher's layout (the sentence-transformers modules too), so `bertforge embed`, the server and
sentence-transformers use it as they use the teacher. Task distillation reads --train/--dev as
`finetune` does and is fine-tuning's loop (supervised.fit): --epochs, dev evaluation after each
epoch, the best student kept, its predictions written. Both: the one training loop
(train/loop.py; bf16 where the device has it, exact resume after a kill, torchrun, progress bar,
metrics.jsonl) and run directory (checkpoints.RunDir: run.json holds the settings; re-running
resumes, or says the run finished). The options shared with `finetune` are
supervised.TrainingOptions; those left None take their mode's default (MODE_DEFAULTS).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from .. import embedding
from ..checkpoint import (
    load_state,
    load_trained,
    load_with_fresh,
    read_safetensors,
    read_tensors,
)
from ..config import SIZES, BertConfig
from ..data.corpus import expand_inputs, read_corpus
from ..data.tasks import TASK_NAMES
from ..errors import CheckpointError, ConfigError, DataError
from ..fileio import ENCODING_ERRORS
from ..model import BertModel, init_bert_weights, set_dropout
from ..modeldir import ModelDir
from ..options import option
from ..runner import pad_multiple, resolve_precision
from ..tasks import family
from ..tasks.base import Batch, Features, TaskFamily
from ..tokenizer import Tokenizer
from . import distributed
from .checkpoints import RunDir
from .loop import train
from .supervised import (
    LengthGroupedBatches,
    SupervisedTask,
    TrainingOptions,
    adamw_loop,
    fit,
    load_data,
)

SHAPE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
)
PROJECTIONS = "projections.safetensors"  # in training checkpoints of a narrower student


# What the options left None mean in each mode, measured (benchmarks/results/distill*.md):
# general distillation's student learns without dropout (the teacher's targets have none);
# task distillation's keeps its own (None) and has no token-state loss.
MODE_DEFAULTS: dict[str, tuple[float | None, float | None]] = {  # option: (general, task)
    "batch_size": (64, 32),
    "lr": (1e-3, 1e-4),
    "hidden_weight": (0.01, 0.0),
    "dropout": (0.0, None),
    "token_weight": (1.0, 0.0),
}


# The task families a teacher's soft targets do not fit (in-batch and grouped losses over
# (B, C, T) rows), and how they learn from a teacher instead.
NOT_DISTILLED = {
    "retrieval": "a bi-encoder learns a cross-encoder's scores with bertforge mine --teacher "
    "and finetune --task retrieval --teacher-weight",
    "rerank": "a cross-encoder learns a teacher's scores with bertforge mine --teacher and "
    "finetune --task rerank --rerank-loss margin-mse (or listnet)",
}


@dataclass(kw_only=True)
class DistillConfig(TrainingOptions):
    """`bertforge distill`: teacher, student, data and hyper-parameters (with --task, also
    fine-tuning's options: the task's files, columns and epochs)."""

    # named `model` as run.json has always recorded it (existing runs resume)
    model: str | None = option(None, "the student: a checkpoint to start from", flag="--student")
    train: str | None = option(None, "--task: the training file (in the task's own format)")
    batch_size: int | None = option(
        None,
        "sentences or examples per step, all processes together (default: 64 general, 32 task)",
        min=1,
    )
    lr: float | None = option(
        None,
        "peak AdamW learning rate, warmup then linear decay (default: 1e-3 general, 1e-4 task)",
        above=0,
    )
    teacher: str = option(
        help="the teacher's model directory: a sentence-transformers or BERT model, or with "
        "--task one fine-tuned for it"
    )
    student_layers: str | None = option(
        None,
        "the student: these layers of the teacher, e.g. 0,2,5 (0 = the first), from its weights",
    )
    student_size: str | None = option(
        None,
        f"the student: a fresh model of this size ({', '.join(SIZES)}) or of the shape a "
        "config.json gives",
    )
    task: str | None = option(
        None,
        "task distillation from a teacher fine-tuned for this task (default: general distillation "
        "on --data)",
        choices=TASK_NAMES,
    )
    # general: text files, dirs or globs, read as `prepare` reads them (not an option: cli's --data)
    data: list[str] = field(default_factory=list)
    steps: int = option(300, "general: optimizer steps (--task: --epochs)", min=1)
    hidden_weight: float | None = option(
        None, "weight of the hidden-state loss (default: 0.01 general, 0 task)", min=0
    )
    dropout: float | None = option(
        None,
        "the student's dropout while it learns (default: 0 general, the teacher's targets have "
        "none; the student's own with --task)",
        min=0,
        below=1,
    )
    token_weight: float | None = option(
        None,
        "general: weight of the MSE of the last layer's token states, the ones the sentence "
        "embedding pools (default 1; 0 with --task, which has no such loss)",
        min=0,
    )
    attention_weight: float = option(
        0.0, "weight of the attention-transfer loss (MiniLM); 0: none", min=0
    )
    alpha: float = option(
        0.5, "--task: weight of the teacher's soft targets; 1 - alpha on the labels", min=0, max=1
    )
    temperature: float = option(2.0, "--task: softmax temperature of the soft targets", above=0)
    min_words: int = option(
        5, "general: skip sentences of fewer words (headings, list items, markup debris)", min=1
    )
    encoding_errors: str = option(
        "strict",
        "general: bytes that are not UTF-8: strict, replace or ignore",
        choices=ENCODING_ERRORS,
    )
    save_every: int = option(100, "general: checkpoint every N steps (--task: every epoch)", min=1)

    def __post_init__(self) -> None:
        general = self.task is None
        for name, defaults in MODE_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, defaults[0 if general else 1])
        if self.task in NOT_DISTILLED:
            raise ConfigError(
                f"--task {self.task}: task distillation learns a teacher's output distributions, "
                f"and {self.task} has none to learn; {NOT_DISTILLED[self.task]}"
            )
        if not general and self.token_weight:
            raise ConfigError(
                f"token_weight={self.token_weight} (--token-weight) is for general distillation; "
                "with --task, --hidden-weight weighs the hidden states"
            )
        super().__post_init__()
        students = {
            "--student-layers": self.student_layers,
            "--student-size": self.student_size,
            "--student": self.model,
        }
        given = [flag for flag, value in students.items() if value]
        if len(given) != 1:
            raise ConfigError(
                "give the student once: --student-layers 0,2,5 (teacher layers), --student-size "
                f"NAME|config.json (fresh) or --student DIR (a checkpoint); got {given or 'none'}"
            )
        if general and self.train:
            raise ConfigError("--train is for task distillation: give --task too")
        if general and (self.max_train_rows or self.max_dev_rows):
            raise ConfigError(
                "--max-train-rows and --max-dev-rows are for task distillation (--task, --train)"
            )
        if general and not self.data:
            raise ConfigError(
                "data (--data): give the text files to distil on (or --task and --train for "
                "task distillation)"
            )
        if not general and not self.train:
            raise ConfigError(f"--task {self.task}: give the training file (--train)")
        if not general and self.data:
            raise ConfigError("--data is for general distillation; with --task the data is --train")

    @property
    def layers(self) -> list[int]:
        try:
            return [int(x) for x in (self.student_layers or "").replace(" ", "").split(",") if x]
        except ValueError:
            raise ConfigError(
                f"student_layers={self.student_layers!r} (--student-layers): "
                "expected layer indices separated by commas, e.g. 0,2,5"
            ) from None


# ------------------------------------------------------------------------------------------------
# The student


def make_student(teacher: nn.Module, layers: list[int]) -> nn.Module:
    """The teacher (a BertModel or a BertFor... head) with only `layers`: its embeddings, those
    layers, pooler and head, weights copied."""
    n = teacher.config.num_hidden_layers
    if not layers or any(not 0 <= k < n for k in layers) or sorted(set(layers)) != layers:
        raise ConfigError(
            f"student layers {layers}: must be distinct increasing indices of the teacher's "
            f"{n} layers (0..{n - 1})"
        )
    student = _like(teacher, teacher.config.with_layers(layers))
    state = {}
    for name, v in teacher.state_dict().items():
        m = re.match(r"(.*?\blayers\.)(\d+)(\..*)", name)
        if m is None:
            state[name] = v
        elif int(m[2]) in layers:
            state[f"{m[1]}{layers.index(int(m[2]))}{m[3]}"] = v
    # pre-norm (ModernBERT): the first layer reads the embeddings' norm, with no norm of its
    # own; a later teacher layer taken first leaves its attention norm behind
    wanted = student.state_dict()
    dropped = [n for n in state if n not in wanted and ".layers.0.attn_norm." in f".{n}"]
    for name in dropped:
        del state[name]
    student.load_state_dict(state)
    return student


def fresh_student(teacher: nn.Module, size: str) -> nn.Module:
    """A fresh model of a named size or of a config.json's shape (SHAPE_KEYS); everything else
    (vocabulary, positions, segments, labels) as the teacher's config."""
    if size in SIZES:
        shape = BertConfig.from_size(size)
    elif Path(size).exists():
        shape = BertConfig.from_pretrained(size)
    else:
        raise ConfigError(
            f"student_size={size!r} (--student-size): a size ({', '.join(SIZES)}) or a "
            "config.json (or a directory holding one)"
        )
    config = teacher.config.with_layers(shape.num_hidden_layers)
    config = config.replace(**{k: getattr(shape, k) for k in SHAPE_KEYS})
    return _like(teacher, config)


def _like(teacher: nn.Module, config: BertConfig) -> nn.Module:
    if isinstance(teacher, BertModel):
        return BertModel(config, add_pooling_layer=teacher.pooler is not None)
    return type(teacher)(config)


def layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """TinyBERT's uniform mapping: student layer i learns from teacher layer
    round((i + 1) L_t / L_s) - 1 (the last from the last)."""
    return [round((i + 1) * teacher_layers / student_layers) - 1 for i in range(student_layers)]


class Trainee(nn.Module):
    """What a distillation trains: the student, and for a student narrower than its teacher
    one projection per mapped layer onto the teacher's width (TinyBERT's W_h, embeddings
    first). Training checkpoints hold both; the output directory the student alone."""

    def __init__(
        self,
        student: nn.Module,
        teacher_width: int,
        layers: list[int],
        used: list[int] | None = None,
    ) -> None:
        """used: the mapped positions whose projections the losses use (default all); only
        those are made, so every parameter has a gradient (DDP)."""
        super().__init__()
        self.student, self.layers = student, layers
        width = student.config.hidden_size
        self.projections: nn.ModuleDict | None = None
        if width != teacher_width:
            used = list(range(len(layers) + 1)) if used is None else used
            self.projections = nn.ModuleDict(
                {str(i): nn.Linear(width, teacher_width) for i in used}
            )
            self.projections.apply(lambda m: init_bert_weights(m, student.config.initializer_range))

    @property
    def config(self) -> BertConfig:
        return self.student.config  # type: ignore[return-value]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.student(*args, **kwargs)

    def project(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Hidden state of mapped position i (0: embeddings) on the teacher's width."""
        return h if self.projections is None else self.projections[str(i)](h)

    def save_pretrained(self, directory: str | Path) -> None:
        self.student.save_pretrained(directory)  # type: ignore[operator]
        if self.projections is not None:
            state = {k: v.contiguous() for k, v in self.projections.state_dict().items()}
            save_file(state, str(Path(directory) / PROJECTIONS))

    def load_checkpoint(self, directory: Path) -> None:
        """The student's and the projections' weights from a training checkpoint."""
        load_state(self.student, *read_tensors(directory))
        if self.projections is not None:
            if not (directory / PROJECTIONS).is_file():
                raise CheckpointError(
                    f"{directory}: no {PROJECTIONS} for the student's projections"
                )
            self.projections.load_state_dict(read_safetensors(directory / PROJECTIONS))


def make_trainee(cfg: DistillConfig, teacher: nn.Module, **head_kwargs: Any) -> Trainee:
    """The student the options name, as a Trainee of this teacher."""
    if cfg.student_layers:
        student = make_student(teacher, cfg.layers)
    elif cfg.student_size:
        student = fresh_student(teacher, cfg.student_size)
    else:
        start = ModelDir.open(str(cfg.model))
        with start.reading():
            student = load_with_fresh(type(teacher), start.path, **head_kwargs)[0]
        if student.config.vocab_size != teacher.config.vocab_size:
            raise ConfigError(
                f"--student {cfg.model}: vocabulary of {student.config.vocab_size:,} pieces, "
                f"the teacher's has {teacher.config.vocab_size:,}: they must share one"
            )
    n = student.config.num_hidden_layers
    layers = cfg.layers if cfg.student_layers else layer_map(n, teacher.config.num_hidden_layers)
    if (
        cfg.attention_weight
        and student.config.num_attention_heads != teacher.config.num_attention_heads
    ):
        raise ConfigError(
            f"attention_weight={cfg.attention_weight} (--attention-weight): the student has "
            f"{student.config.num_attention_heads} attention heads, the teacher "
            f"{teacher.config.num_attention_heads}; attention transfer needs the same number"
        )
    general = cfg.task is None
    if cfg.dropout is not None:
        set_dropout(student, cfg.dropout)  # the saved config keeps its own, for fine-tuning
    if general and getattr(student, "pooler", None) is not None:
        student.pooler.requires_grad_(False)  # no loss reads it: kept as it is (and DDP-safe)
    # general: the projection of the sentence embedding's layer
    used = list(range(len(layers) + 1)) if cfg.hidden_weight else [len(layers)] if general else []
    return Trainee(student.train(), teacher.config.hidden_size, layers, used)


# ------------------------------------------------------------------------------------------------
# Losses


def representation_loss(
    student: Any,
    teacher: Any,
    mask: torch.Tensor,
    trainee: Trainee | list[int],
    hidden_weight: float,
    attention_weight: float = 0.0,
) -> torch.Tensor:
    """Per row (B,): hidden_weight x the MSE of the mapped hidden states over the real tokens
    (embeddings and each student layer vs its teacher layer, projected when narrower), plus
    attention_weight x KL(teacher || student) of the mapped layers' attention distributions,
    averaged over heads and real query tokens; each averaged over its mapped layers. Zeros
    when both weights are 0 (nothing read from the outputs)."""
    layers = trainee.layers if isinstance(trainee, Trainee) else trainee
    project = trainee.project if isinstance(trainee, Trainee) else (lambda i, h: h)
    s, t = (getattr(o, "encoder", o) for o in (student, teacher))  # head outputs hold the encoder's
    m = mask.reshape(-1, mask.shape[-1]).float()  # (B', T): multiple choice runs B x C rows
    tokens = m.sum(1).clamp(min=1)
    total = m.new_zeros(m.shape[0])
    if hidden_weight:
        pairs = [(0, 0)] + [(i + 1, k + 1) for i, k in enumerate(layers)]
        hidden = 0.0
        for i, k in pairs:
            err = (project(i, s.hidden_states[i].float()) - t.hidden_states[k].float()) ** 2
            hidden = hidden + (err.mean(-1) * m).sum(1) / tokens
        total = total + hidden_weight * (hidden / len(pairs))
    if attention_weight:
        kl = 0.0
        for i, k in enumerate(layers):
            ps, pt = s.attentions[i].float(), t.attentions[k].float()  # (B', heads, T, T)
            per_query = (torch.xlogy(pt, pt) - pt * ps.clamp(min=1e-12).log()).sum(-1)
            kl = kl + (per_query.mean(1) * m).sum(1) / tokens
        total = total + attention_weight * kl / len(layers)
    return total


def distillation_loss(
    student: Any,
    teacher: Any,
    mask: torch.Tensor,
    trainee: Trainee | list[int],
    own: embedding.Embedding,
    hidden_weight: float,
    attention_weight: float = 0.0,
    token_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """General distillation: (summed loss, summed embedding loss) over the batch's sentences.
    Per sentence: the MSE of the pooled (normalised as the teacher's) embeddings, plus
    token_weight x the MSE of the last layer's token states over the real tokens (the ones the
    embedding pools), the student's projected when narrower, plus representation_loss."""
    layers = trainee.layers if isinstance(trainee, Trainee) else trainee
    project = trainee.project if isinstance(trainee, Trainee) else (lambda i, h: h)
    last = len(layers)  # the student's last layer's position (0: the embeddings)

    hs, ht = student.last_hidden_state.float(), teacher.last_hidden_state.float()

    def sentence(h: torch.Tensor, projected: bool) -> torch.Tensor:
        v = embedding.pool(h, mask, own.pooling)
        v = project(last, v) if projected else v
        return F.normalize(v, dim=-1) if own.normalize else v

    per_row = ((sentence(hs, True) - sentence(ht, False)) ** 2).mean(-1)  # (B,)
    emb = per_row.sum()
    if token_weight:
        m = mask.float()
        per_token = ((project(last, hs) - ht) ** 2).mean(-1) * m
        per_row = per_row + token_weight * per_token.sum(1) / m.sum(1).clamp(min=1)
    per_row = per_row + representation_loss(
        student, teacher, mask, trainee, hidden_weight, attention_weight
    )
    return per_row.sum(), emb.detach()


def _outputs(cfg: DistillConfig) -> dict[str, bool]:
    return {
        "output_hidden_states": bool(cfg.hidden_weight),
        "output_attentions": bool(cfg.attention_weight),
    }


def _unwrapped(model: nn.Module) -> Trainee:
    return getattr(model, "module", model)  # type: ignore[return-value]  # DDP's


class DistillTask:
    """General distillation as the training loop sees it: sentences in fine-tuning's
    length-grouped batches, the distillation loss against the teacher (run here without
    gradients, each batch once)."""

    def __init__(
        self,
        cfg: DistillConfig,
        d: distributed.Dist,
        tok: Tokenizer,
        teacher: BertModel,
        own: embedding.Embedding,
    ) -> None:
        self.grouped = LengthGroupedBatches(
            cfg,
            d,
            tok.pad_id,
            multiple=pad_multiple(resolve_precision(cfg.precision, d.device)),
            positions=teacher.config.max_tokens,
        )
        self.cfg, self.d, self.teacher, self.own = cfg, d, teacher, own
        self.train: Features | None = None

    def batches(self, position: Any) -> Iterator[tuple[list[Batch], Any]]:
        return self.grouped.batches(self.train, position)

    def normalizers(self, micro_batches: list[Batch]) -> torch.Tensor:
        return torch.tensor([float(sum(len(m.input_ids) for m in micro_batches))])

    def loss(
        self, model: nn.Module, micro: Batch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        kw = _outputs(cfg)  # the sentence embedding pools last_hidden_state
        with torch.no_grad():
            theirs = self.teacher(*micro.inputs(), **kw)
        ours = model(*micro.inputs(), **kw)
        weights = cfg.hidden_weight, cfg.attention_weight, cfg.token_weight
        total, emb = distillation_loss(
            ours, theirs, micro.attention_mask, _unwrapped(model), self.own, *weights
        )
        n = torch.tensor(float(len(micro.input_ids)), device=total.device)
        return total / totals[0] * self.d.world_size, torch.stack([total.detach(), n, emb])

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        n = float(s[1].clamp(min=1))
        return {"loss": float(s[0]) / n, "embedding_loss": float(s[2]) / n}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return {}


class TaskDistillTask(SupervisedTask):
    """Task distillation as the training loop sees it: fine-tuning's batches and dev
    evaluation; the loss mixes the labels' and the teacher's soft targets (alpha)."""

    cfg: DistillConfig

    def __init__(
        self, fam: TaskFamily, cfg: DistillConfig, d: distributed.Dist, teacher: nn.Module
    ) -> None:
        super().__init__(fam, cfg, d)
        self.teacher = teacher

    def loss(
        self, model: nn.Module, micro: Batch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, fam = self.cfg, self.family
        with torch.no_grad():
            theirs = self.teacher(*micro.inputs(), **_outputs(cfg))
        ours = model(*micro.inputs(), **_outputs(cfg))
        hard, correct = fam.loss_of(ours, micro)
        soft = fam.soft_loss_sum(ours, theirs, micro, cfg.temperature)
        weights = cfg.hidden_weight, cfg.attention_weight
        rep = representation_loss(ours, theirs, micro.attention_mask, _unwrapped(model), *weights)
        total = (1 - cfg.alpha) * hard + cfg.alpha * soft + rep.sum()
        n = torch.tensor(float(fam.count(micro)), device=total.device)
        stats = torch.stack([total.detach(), n, correct.float(), hard.detach(), soft.detach()])
        return total / totals[0] * self.d.world_size, stats

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        n = float(s[1].clamp(min=1))
        return {**super().summarize(s), "hard_loss": float(s[3]) / n, "soft_loss": float(s[4]) / n}


def read_sentences(cfg: DistillConfig) -> list[str]:
    """The corpus's sentences of at least cfg.min_words words."""
    files = expand_inputs(list(cfg.data))
    sentences = [
        s
        for doc in read_corpus(files, encoding_errors=cfg.encoding_errors)
        for s in doc.sentences
        if len(s.split()) >= cfg.min_words
    ]
    if not sentences:
        raise DataError(
            f"{', '.join(map(str, files))}: no sentences of {cfg.min_words} words or more to "
            "distil on (--min-words)"
        )
    return sentences


def run(cfg: DistillConfig) -> dict[str, Any]:
    """Distil cfg.teacher into a student in cfg.out; returns {"step": ...} (general) or the best
    dev metrics (task); {} for a finished general run."""
    return distributed.launched(_run, cfg)


def _run(cfg: DistillConfig, d: distributed.Dist) -> dict[str, Any]:
    run = RunDir(cfg.out, cfg, d)
    if saved := run.finished(f"this distillation already finished; the student is in {run.path}"):
        return saved.get("best", {})
    source = ModelDir.open(cfg.teacher)  # its files read once, whoever asks
    return (_general if cfg.task is None else _task)(run, source, source.tokenizer)


def _describe(cfg: DistillConfig, trainee: Trainee, teacher: nn.Module) -> str:
    c = trainee.config
    what = (
        f"its layers {cfg.student_layers}"
        if cfg.student_layers
        else f"a fresh {cfg.student_size}"
        if cfg.student_size
        else str(cfg.model)
    )
    return (
        f"distilling {cfg.teacher} ({teacher.config.num_hidden_layers} layers, width "
        f"{teacher.config.hidden_size}) into {what} ({c.num_hidden_layers} layers, width "
        f"{c.hidden_size}; taught by teacher layers {trainee.layers} of "
        f"0..{teacher.config.num_hidden_layers - 1})"
    )


def _task(run: RunDir, source: ModelDir, tok: Tokenizer) -> dict[str, Any]:
    cfg, d = run.cfg, run.d
    fam = family(cfg, tok)
    with source.reading():
        teacher = load_trained(
            fam.head, source.path, f"{fam.head.hf_architecture} head for --task {cfg.task}"
        )
    cfg.check_model(teacher.config)
    fam.set_labels(config=teacher.config)  # the student predicts the teacher's labels
    if getattr(fam, "order", None) is not None:  # evaluate maps them; the soft targets cannot
        raise ConfigError(
            f"--teacher {cfg.teacher}: its head names --task {cfg.task}'s labels in another "
            f"order ({', '.join(teacher.config.labels.values())}); a student learns the "
            "teacher's outputs as they are: name them in the task's order in its config.json"
        )
    teacher = teacher.to(d.device).eval().requires_grad_(False)
    task = TaskDistillTask(fam, cfg, d, teacher)
    train_examples, dev_examples = load_data(task, cfg)
    torch.manual_seed(cfg.seed)
    trainee = make_trainee(cfg, teacher, **fam.head_kwargs())
    header = (
        f"{_describe(cfg, trainee, teacher)} on {cfg.task}: {len(train_examples):,} "
        f"training examples, {len(dev_examples) if dev_examples else 0:,} dev"
    )
    return fit(
        run, task, trainee, tok, header, describe=f"distill {cfg.task}", kept=trainee.student
    )


def corpus_rows(tok: Tokenizer, sentences: list[str], max_length: int) -> Features:
    """[CLS] sentence [SEP] rows of corpus text, cut to max_length: a special token's string
    in the text ("use [SEP] between") is text, as prepare reads a corpus (Tokenizer.encode_ids)."""
    rows = [tok.row(ids[: max_length - 2])[0] for ids in tok.encode_ids(sentences)]
    return Features(rows, [np.zeros(len(r), np.int64) for r in rows], np.zeros(len(rows), np.int64))


def _general(run: RunDir, source: ModelDir, tok: Tokenizer) -> dict[str, Any]:
    cfg, d = run.cfg, run.d
    own = source.embedding
    with source.reading():
        teacher = load_with_fresh(BertModel, source.path)[0]
    teacher = teacher.to(d.device).eval().requires_grad_(False)
    torch.manual_seed(cfg.seed)  # the student's initialisation
    trainee = make_trainee(cfg, teacher).to(d.device)
    sentences = read_sentences(cfg)
    task = DistillTask(cfg, d, tok, teacher, own)
    task.train = corpus_rows(tok, sentences, cfg.max_seq_length)
    epochs = math.ceil(cfg.steps / math.ceil(len(task.train) / cfg.batch_size))
    run.start(
        f"{_describe(cfg, trainee, teacher)} on {len(sentences):,} sentences; "
        f"{cfg.steps:,} steps of {cfg.batch_size} ({epochs} epochs)"
    )
    loop = adamw_loop(cfg, cfg.steps, eval_every=0)  # saved every --save-every steps
    result = train(
        trainee, task, loop, run.path, d, save_extra=tok.save_pretrained, describe="distill"
    )
    if not run.finish(
        result,
        f"done: the student ({trainee.config.num_hidden_layers} layers) is in {run.path}",
        trainee.student.save_pretrained,
        tok.save_pretrained,
        lambda out: source.write_layout(out, trainee.config.hidden_size),
    ):
        return {"interrupted": True, "step": result["step"]}
    return {"step": result["step"]}
