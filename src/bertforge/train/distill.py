"""`bertforge distill`: a smaller student taught by a teacher on unlabelled text (general,
embedding distillation: DistilBERT's initialisation, TinyBERT's hidden-state losses).

Student. `--student-layers 0,2,5` keeps those layers of the teacher (and its embeddings), at
the teacher's width, starting from their weights (DistilBERT's initialisation); student layer
i is taught by teacher layer student_layers[i], the embeddings by the embeddings.

Loss, per sentence: the mean squared error between the student's and the teacher's sentence
embeddings, pooled (and normalised) as the teacher's directory says (tasks.embedding), plus
`hidden_weight` x the mean squared error of the mapped hidden states over the real tokens,
averaged over the mapped layers. The teacher runs without gradients, each batch once.

Data: the text files `prepare` reads (lines, paragraphs, WikiExtractor, JSONL), cut into
sentences; each sentence is one row of at most max_seq_length pieces. The one training loop
(train/loop.py): bf16 where the device has it, exact resume after a kill, progress bar,
metrics.jsonl. The student is written in the teacher's layout: HF files, plus the
sentence-transformers modules when the teacher has them, so `bertforge embed`, the server and
sentence-transformers use it as they use the teacher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import load_with_fresh
from ..config import check_options, option
from ..data.corpus import expand_inputs, read_corpus
from ..errors import ConfigError, DataError
from ..fileio import ENCODING_ERRORS, write_json
from ..hub import resolve
from ..model import BertModel
from ..runner import PRECISIONS
from ..tasks import embedding
from ..tasks.base import Batch, Features
from ..tokenizer import Tokenizer
from . import checkpoints, distributed
from .finetune import FinetuneTask
from .loop import LoopConfig, train


@dataclass(kw_only=True)
class DistillConfig:
    """`bertforge distill`: teacher, student, data and hyper-parameters."""

    # fmt: off
    teacher: str = option(help="the teacher's model directory (sentence-transformers layouts keep their pooling)")
    out: str = option(help="output directory: the student, in the teacher's layout")
    data: list[str] = field(default_factory=list)  # text files, dirs or globs, read as `prepare` reads them
    student_layers: str = option(help="the teacher's layers the student keeps, e.g. 0,2,5 (0 = the first)")
    steps: int = option(300, "optimizer steps", min=1)
    batch_size: int = option(64, "sentences per step, all processes together", min=1)
    lr: float = option(1e-3, "peak AdamW learning rate (warmup, then linear decay)", above=0)
    warmup_ratio: float = option(0.1, "fraction of the steps spent warming up", min=0, max=1)
    weight_decay: float = option(0.01, "AdamW weight decay", min=0)
    max_seq_length: int = option(128, "pieces per sentence", min=3)
    hidden_weight: float = option(0.01, "weight of the hidden-state loss (0: the embedding loss alone)", min=0)
    encoding_errors: str = option("strict", "bytes that are not UTF-8: strict, replace or ignore", choices=ENCODING_ERRORS)
    precision: str = option("auto", "auto: bf16 where the device has it, else fp32", choices=PRECISIONS)
    seed: int = option(0, "sentence order")
    save_every: int = option(100, "checkpoint every N steps", min=1)
    log_every: int = option(10, "log every N steps", min=1)
    progress: bool = option(True, "progress bars", flag="--no-progress")
    device: str | None = option(None, "cpu, cuda, cuda:1 (default: a GPU if there is one)")
    # fmt: on

    def __post_init__(self) -> None:
        check_options(self)
        if not self.data:
            raise ConfigError("data (--data): give the text files to distil on")

    @property
    def layers(self) -> list[int]:
        try:
            return [int(x) for x in self.student_layers.replace(" ", "").split(",") if x]
        except ValueError:
            raise ConfigError(
                f"student_layers={self.student_layers!r} (--student-layers): "
                "expected layer indices separated by commas, e.g. 0,2,5"
            ) from None


def make_student(teacher: BertModel, layers: list[int]) -> BertModel:
    """The teacher's embeddings and `layers` (its weights, copied) as a smaller BertModel."""
    n = teacher.config.num_hidden_layers
    if not layers or any(not 0 <= k < n for k in layers) or sorted(set(layers)) != layers:
        raise ConfigError(
            f"student layers {layers}: must be distinct increasing indices of the teacher's "
            f"{n} layers (0..{n - 1})"
        )
    config = teacher.config.replace(num_hidden_layers=len(layers))
    student = BertModel(config, add_pooling_layer=teacher.pooler is not None)
    state = {k: v for k, v in teacher.state_dict().items() if not k.startswith("layers.")}
    for i, k in enumerate(layers):
        prefix = f"layers.{k}."
        state.update({f"layers.{i}." + name[len(prefix) :]: v
                      for name, v in teacher.state_dict().items() if name.startswith(prefix)})  # fmt: skip
    student.load_state_dict(state)
    return student


def distillation_loss(
    student: Any, teacher: Any, mask: torch.Tensor, layers: list[int], own: embedding.Embedding,
    hidden_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(summed loss, summed embedding loss) over the batch's sentences: per sentence, the MSE
    of the pooled (normalised as the teacher's) embeddings plus hidden_weight x the MSE of the
    mapped hidden states over real tokens, averaged over the mapped layers (embeddings too)."""

    def sentence(out: Any) -> torch.Tensor:
        v = embedding.pool(out.last_hidden_state, mask, own.pooling)
        return F.normalize(v, dim=-1) if own.normalize else v

    per_row = ((sentence(student) - sentence(teacher)) ** 2).mean(-1)  # (B,)
    emb = per_row.sum()
    if hidden_weight:
        pairs = [(0, 0)] + [(i + 1, k + 1) for i, k in enumerate(layers)]
        m = mask.unsqueeze(-1).float()
        tokens = m.sum((1, 2)).clamp(min=1)  # (B,)
        hidden = sum(
            (((student.hidden_states[s].float() - teacher.hidden_states[t].float()) ** 2) * m)
            .mean(-1).sum(1) / tokens
            for s, t in pairs
        ) / len(pairs)  # fmt: skip
        per_row = per_row + hidden_weight * hidden
    return per_row.sum(), emb.detach()


class DistillTask(FinetuneTask):
    """Sentences as the training loop sees them: FinetuneTask's length-grouped batches, the
    distillation loss against the teacher (run here without gradients, each batch once)."""

    def __init__(self, cfg: DistillConfig, d: distributed.Dist, tok: Tokenizer,
                 teacher: BertModel, own: embedding.Embedding) -> None:  # fmt: skip
        if cfg.batch_size % d.world_size:
            raise ConfigError(
                f"batch_size={cfg.batch_size} must split evenly into {d.world_size} processes"
            )
        self.cfg, self.d, self.pad_id = cfg, d, tok.pad_id
        self.teacher, self.own, self.layers = teacher, own, cfg.layers
        self.train: Features | None = None

    def normalizers(self, micro_batches: list[Batch]) -> torch.Tensor:
        return torch.tensor([float(sum(len(m.input_ids) for m in micro_batches))])

    def loss(self, model: nn.Module, micro: Batch, totals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        with torch.no_grad():
            theirs = self.teacher(*micro.inputs(), output_hidden_states=True)
        ours = model(*micro.inputs(), output_hidden_states=True)
        total, emb = distillation_loss(ours, theirs, micro.attention_mask, self.layers, self.own,
                                       self.cfg.hidden_weight)  # fmt: skip
        n = torch.tensor(float(len(micro.input_ids)), device=total.device)
        return total / totals[0] * self.d.world_size, torch.stack([total.detach(), n, emb])

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        n = float(s[1].clamp(min=1))
        return {"loss": float(s[0]) / n, "embedding_loss": float(s[2]) / n}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return {}


def read_sentences(cfg: DistillConfig) -> list[str]:
    files = expand_inputs(list(cfg.data))
    sentences = [s for doc in read_corpus(files, encoding_errors=cfg.encoding_errors)
                 for s in doc.sentences if s.strip()]  # fmt: skip
    if not sentences:
        raise DataError(f"{', '.join(map(str, files))}: no sentences to distil on")
    return sentences


def run(cfg: DistillConfig) -> dict[str, Any]:
    """Distil cfg.teacher into a student in cfg.out; returns {"step": ...} ({} for a finished run)."""
    return distributed.launched(_run, cfg)


_RESUMABLE = {"progress", "device", "log_every"}


def _run(cfg: DistillConfig, d: distributed.Dist) -> dict[str, Any]:
    out = Path(cfg.out)
    saved = checkpoints.check_run(out, cfg, _RESUMABLE)
    if saved and saved.get("finished"):
        print(f"{out}: this distillation already finished; the student is in {out}")
        return {}
    source = resolve(cfg.teacher)  # a hub name: its local snapshot
    tok = Tokenizer.from_pretrained(source)
    own = embedding.settings(source)
    teacher = load_with_fresh(BertModel, source)[0].to(d.device).eval()
    teacher.requires_grad_(False)
    torch.manual_seed(cfg.seed)  # the student's dropout masks
    student = make_student(teacher, cfg.layers).to(d.device).train()
    sentences = read_sentences(cfg)
    task = DistillTask(cfg, d, tok, teacher, own)
    encodings = tok.encode_batch(sentences, max_length=cfg.max_seq_length)
    task.train = Features.from_encodings(encodings)
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_json(
            out / "run.json",
            {"settings": checkpoints.run_settings(cfg, _RESUMABLE), "finished": False},
        )
        print(f"distilling {cfg.teacher} ({teacher.config.num_hidden_layers} layers) into its layers "
              f"{cfg.student_layers} on {len(sentences):,} sentences; {cfg.steps:,} steps of "
              f"{cfg.batch_size} ({math.ceil(cfg.steps / task.steps_per_epoch)} epochs)")  # fmt: skip
    loop = LoopConfig.of(cfg, warmup_steps=round(cfg.warmup_ratio * cfg.steps), decay_steps=None,
                         eval_every=0, keep_checkpoints=1, optimizer="adamw", clip_norm=1.0)  # fmt: skip
    result = train(student, task, loop, out, d, save_extra=tok.save_pretrained,
                   describe="distill", on_eval=None)  # fmt: skip
    if result["interrupted"]:
        return {"interrupted": True, "step": result["step"]}
    if d.is_main:
        student.save_pretrained(out)
        tok.save_pretrained(out)
        embedding.write_layout(source, out, student.config.hidden_size)
        write_json(
            out / "run.json",
            {"settings": checkpoints.run_settings(cfg, _RESUMABLE), "finished": True},
        )
        print(f"done: the student ({len(cfg.layers)} layers) is in {out}")
    distributed.barrier(d)
    return {"step": result["step"]}
