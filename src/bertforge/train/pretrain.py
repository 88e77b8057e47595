"""`bertforge pretrain`: masked LM + next sentence prediction on prepared shards, or with
`nsp=False` (`--no-nsp`) masked LM alone on packed rows of contiguous text (RoBERTa, cramming).

RUN/ (the --out directory)
    run.json                the settings; re-running the same command resumes the run (RunDir)
    checkpoints/step-N/     every --save-every steps and on SIGINT/SIGTERM (last K kept)
    metrics.jsonl           training and held-out numbers; tensorboard/ mirrors them
    config.json, model.safetensors, vocab.txt, tokenizer_config.json
                            the final model (HF layout: BertForPreTraining, or
                            BertForMaskedLM for --no-nsp)

Held-out evaluation scores the masked LM the same way for every recipe, so that runs compare:
packed held-out rows of max_seq_length tokens with fixed 15% masks (whatever the run's masking
rate and format); NSP runs add their NSP accuracy on fixed held-out pairs. `train_seconds` in
metrics.jsonl counts training time alone (no evaluation, no checkpoint writing), over resumes.

`--minutes M` trains for a time budget instead of a step count (optim.TimeBudget): it takes
steps until M x 60 seconds of training are spent, however fast they turn out, with warmup and
decay over shares of that time, and run.json keeps the number of steps it took once it ends. A
resumed run goes on with the time its checkpoint had left. A plan fixed by timing the first
steps made a busy machine's slow start cut the run short (issue 54).

The loss of a step is the mean over the whole global batch (masked tokens for the MLM loss,
sequences for NSP) whatever the number of processes or micro-batches, so a run on N processes
follows the same curve as one process with the same global batch.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..config import SIZES, BertConfig
from ..data.instances import IGNORE_INDEX, MaskingSpec
from ..data.pretraining import Batch, Position, PretrainingStream
from ..data.shards import ShardSet
from ..errors import ConfigError, DataError
from ..families.modernbert import modernbert_extras
from ..heads import BertForMaskedLM, BertForPreTraining
from ..model import set_dropout
from ..modeldir import ModelDir
from ..options import MAX_SEED, check_options, option
from ..runner import PRECISIONS, autocast, resolve_precision
from ..tasks.pretraining import batch_statistics
from ..tokenizer import Tokenizer
from . import distributed
from .checkpoints import RunDir
from .loop import COMPILE_HELP, LoopConfig, train
from .optim import OPTIMIZERS, TimeBudget


@dataclass(frozen=True)
class Arch:
    """What --arch sets: the config of a model built from a named size (from the data's
    tokenizer and the size's layers, width and heads), its recipe's masking rate, and whether it trains
    next-sentence prediction. An arch trains the families built on it (Family.base; --config /
    --init of another family is refused)."""

    config: Callable[[Tokenizer, tuple[int, int, int]], dict[str, Any]]
    masked_lm_prob: float = 0.15
    nsp: bool = False


ARCH_CONFIGS: dict[str, Arch] = {
    "bert": Arch(lambda tok, size: {}, nsp=True),
    "roberta": Arch(
        lambda tok, size: {
            "model_type": "roberta",
            "type_vocab_size": 1,
            "layer_norm_eps": 1e-5,
            "max_position_embeddings": 512 + tok.pad_id + 1,  # positions past the padding id
        }
    ),
    # ModernBERT's recipe: 30% of the pieces masked; its GeGLU at 1.5x the width (ModernBERT-
    # base: 1152 for 768), no dropout, 8,192 positions
    "modernbert": Arch(
        lambda tok, size: {
            "model_type": "modernbert",
            "type_vocab_size": 0,
            "layer_norm_eps": 1e-5,
            "max_position_embeddings": 8192,
            "intermediate_size": 3 * size[1] // 2,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "classifier_dropout": 0.0,
            "extras": modernbert_extras(size[0], tok.cls_id, tok.sep_id),
        },
        masked_lm_prob=0.30,
    ),
}
ARCHS = tuple(ARCH_CONFIGS)
MAX_MINUTES = 1e6  # about two years: a time budget beyond it is a typo, not a plan
EVAL_BATCH = 32  # held-out rows per evaluation batch, whatever the training batch size


@dataclass(kw_only=True)
class PretrainConfig:
    """`bertforge pretrain`: data, model, masking, optimisation, bookkeeping."""

    # settings a resumed run may change (the rest must match run.json)
    RESUMABLE: ClassVar[frozenset[str]] = frozenset(
        {
            "steps",
            "save_every",
            "eval_every",
            "log_every",
            "keep_checkpoints",
            "progress",
            "device",
            "compile",
        }
    )

    data: str = option(help="directory made by `bertforge prepare`")
    out: str = option(help="run directory (re-running the command resumes it)")
    model_size: str = option(
        "mini", "a named size (the paper's Table 6 and Google's small BERTs)", choices=tuple(SIZES)
    )
    arch: str | None = option(
        None,
        "bert; roberta: masked LM alone (no NSP) on packed rows, one segment, positions past "
        "the padding id, its data prepared with a bpe or unigram vocabulary; modernbert: the "
        "same with pre-norm GeGLU blocks, rotary positions, local attention and 30%% masking "
        "(default: the --config's or --init's family, else bert)",
        choices=ARCHS,
    )
    config: str | None = option(None, "config.json of the model to train from scratch")
    init: str | None = option(None, "start from this checkpoint (phase 2, domain adaptation)")
    steps: int = option(10_000, "optimizer steps (unless --minutes)", min=1)
    minutes: float | None = option(
        None,
        "train for about M minutes instead of --steps: as many steps as fit, timed as they go "
        "(evaluating and saving not counted), warmup and decay over shares of the time; a "
        "resumed run goes on with the time left",
        above=0,
        max=MAX_MINUTES,
    )
    batch_size: int = option(32, "sequences per optimizer step, all processes together", min=1)
    micro_batch_size: int | None = option(
        None, "sequences per forward pass and process (gradient accumulation)", min=1
    )
    max_seq_length: int = option(128, "pieces per row", min=5)
    max_predictions_per_seq: int | None = option(None, "default: 15%% of max-seq-length", min=1)
    masked_lm_prob: float | None = option(
        None,
        "share of pieces masked (default: 0.15; 0.30 with --arch modernbert)",
        above=0,
        below=1,
    )
    short_seq_prob: float = option(0.1, "NSP: share of shorter target lengths", min=0, max=1)
    whole_word_mask: bool = option(False, "mask all pieces of a word together")
    nsp: bool = option(
        True,
        "masked LM only, on rows of contiguous text packed across sentences and documents",
        flag="--no-nsp",
    )
    dropout: float | None = option(
        None, "the model's dropout while pre-training (default: its config's)", min=0, below=1
    )
    dupe_factor: int | None = option(
        None, "static masking with this many fixed copies (default: dynamic)", min=1
    )
    lr: float = option(1e-4, "peak learning rate", above=0)
    warmup_ratio: float = option(0.01, "share of steps of linear warmup", min=0, max=1)
    decay_ratio: float = option(
        1.0,
        "share of steps of linear decay at the end (1: all after warmup, the paper's; less: the "
        "peak holds until then)",
        above=0,
        max=1,
    )
    weight_decay: float = option(
        0.01, "AdamW / LAMB weight decay (not on LayerNorm and biases)", min=0
    )
    optimizer: str = option("adamw", "optimizer", choices=OPTIMIZERS)
    clip_norm: float = option(1.0, "gradient clipping norm", above=0)
    precision: str = option(
        "auto",
        "auto: bf16 where the device has it, fp16 + loss scaling on older GPUs",
        choices=PRECISIONS,
    )
    seed: int = option(0, "data order, masks, initialisation", min=0, max=MAX_SEED)
    log_every: int = option(10, "log every N steps", min=1)
    eval_every: int = option(500, "held-out evaluation every N steps (0: never)", min=0)
    eval_batches: int = option(20, "held-out batches of 32 rows per evaluation", min=1)
    save_every: int = option(
        1000, "checkpoint every N steps (0: only at the end and on signals)", min=0
    )
    keep_checkpoints: int = option(3, "checkpoints kept", min=1)
    device: str | None = option(None, "cpu, cuda, cuda:1 (default: a GPU if there is one)")
    compile: bool | None = option(None, COMPILE_HELP)
    progress: bool = option(True, "no progress bars", flag="--no-progress")

    def __post_init__(self) -> None:
        check_options(self)
        if sum(x is not None for x in (self.config, self.init)) > 1:
            raise ConfigError("give --config or --init, not both")
        arch = ARCH_CONFIGS[self.arch or "bert"]
        if not arch.nsp:
            self.nsp = False  # RoBERTa's recipe: masked LM alone on full rows of text
        if self.masked_lm_prob is None:
            self.masked_lm_prob = arch.masked_lm_prob


class PretrainingTask:
    """Loss, batches and evaluation of BERT pre-training (see train/loop.py's Task)."""

    # statistics summed for logging: MLM loss sum, masked count, MLM correct, NSP loss sum,
    # sequences, NSP correct (the NSP entries stay 0 without NSP)
    def __init__(
        self,
        stream: PretrainingStream,
        heldout: dict[str, PretrainingStream],
        cfg: PretrainConfig,
        d: distributed.Dist,
    ) -> None:
        self.stream, self.heldout, self.cfg, self.d = stream, heldout, cfg, d
        micro = cfg.micro_batch_size or cfg.batch_size // d.world_size
        per_rank = cfg.batch_size // d.world_size
        if cfg.batch_size % d.world_size or per_rank % micro:
            raise ConfigError(
                f"batch_size={cfg.batch_size} must split evenly into {d.world_size} processes "
                f"x micro-batches of {micro}"
            )
        self.micro = micro

    def batches(self, position: Any) -> Iterator[tuple[list[Batch], Any]]:
        pos = Position(**position) if position else None
        stream = self.stream.batches(self.cfg.batch_size, pos, self.d.rank, self.d.world_size)
        for batch, nxt in stream:
            yield _split(batch, self.micro), nxt.to_dict()

    def normalizers(self, micro_batches: list[Batch]) -> torch.Tensor:
        masked = sum(int((m.mlm_labels != IGNORE_INDEX).sum()) for m in micro_batches)
        sequences = sum(len(m.nsp_labels) for m in micro_batches)
        return torch.tensor([float(masked), float(sequences)])

    def loss(
        self, model: nn.Module, micro: Batch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mlm_sum, nsp_sum, stats = batch_statistics(model, micro)
        # Means over the global batch; x world size because DDP averages gradients over ranks.
        loss = (mlm_sum / totals[0] + nsp_sum / totals[1]) * self.d.world_size
        return loss, stats

    def summarize(self, s: torch.Tensor) -> dict[str, float]:
        mlm_loss = float(s[0] / s[1])
        out = {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_acc": float(s[2] / s[1])}
        if self.cfg.nsp:
            nsp_loss = float(s[3] / s[4])
            out.update(loss=mlm_loss + nsp_loss, nsp_loss=nsp_loss, nsp_acc=float(s[5] / s[4]))
        return out

    def _heldout_stats(self, model: nn.Module, stream: PretrainingStream) -> torch.Tensor:
        total = torch.zeros(6, device=self.d.device)
        # the same rows whatever the training batch size: batches of EVAL_BATCH (or nearly)
        size = max(EVAL_BATCH // self.d.world_size, 1) * self.d.world_size
        batches = stream.batches(size, None, self.d.rank, self.d.world_size)
        for _ in range(self.cfg.eval_batches):
            batch, _ = next(batches)
            for micro in _split(batch, self.micro):
                _, stats = self.loss(
                    model, micro.to(self.d.device), torch.ones(2, device=self.d.device)
                )
                total += stats.float()
        return distributed.all_reduce_sum(total, self.d)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out masked-LM loss, accuracy and perplexity on packed rows with fixed 15% masks
        (comparable across recipes), and NSP accuracy on fixed held-out pairs for NSP runs."""
        out: dict[str, float] = {}
        if "mlm" in self.heldout:
            s = self._heldout_stats(model, self.heldout["mlm"])
            loss = float(s[0] / s[1])
            out.update(
                mlm_loss=loss, mlm_acc=float(s[2] / s[1]), perplexity=math.exp(min(loss, 50.0))
            )
        if "nsp" in self.heldout:
            s = self._heldout_stats(model, self.heldout["nsp"])
            out["nsp_acc"] = float(s[5] / s[4])
        return out


def _split(batch: Batch, size: int) -> list[Batch]:
    """Micro-batches of `size` rows (each trimmed to its own longest row)."""
    if len(batch.nsp_labels) <= size:
        return [batch]
    inputs = (batch.input_ids, batch.token_type_ids, batch.attention_mask)
    targets = (batch.mlm_positions, batch.mlm_labels, batch.nsp_labels)
    parts = []
    for i in range(0, len(batch.nsp_labels), size):
        rows = slice(i, i + size)
        mask = batch.attention_mask[rows]
        T = int(mask.sum(1).max())
        cut = [x[rows, :T] for x in inputs] + [x[rows] for x in targets]
        parts.append(
            Batch(*cut, num_tokens=int(mask.sum()), padded=bool(mask.numel() > mask.sum()))
        )
    return parts


def build_model(
    cfg: PretrainConfig, tok: Tokenizer, init: ModelDir | None = None
) -> BertForPreTraining | BertForMaskedLM:
    """The model to pre-train: from --init (`init`: that directory already opened), a
    config.json or a named size; BertForMaskedLM without NSP. --dropout replaces the config's
    dropout (the saved config keeps its own)."""
    cls = BertForPreTraining if cfg.nsp else BertForMaskedLM
    init = ModelDir.open(init or cfg.init) if cfg.init else None
    if init is not None:
        config = init.config
        if config.vocab_size < tok.vocab_size:
            raise ConfigError(
                f"{cfg.init}: vocab_size={config.vocab_size} is smaller than the data's "
                f"vocabulary ({tok.vocab_size})"
            )
    else:
        overrides = {"vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id}
        if cfg.config:
            config = BertConfig.from_json_file(cfg.config).replace(**overrides)
        else:
            arch = ARCH_CONFIGS[cfg.arch or "bert"].config(tok, SIZES[cfg.model_size])
            config = BertConfig.from_size(cfg.model_size, **arch, **overrides)
    _check_arch(cfg, config, tok)
    if cfg.max_seq_length > config.max_tokens:
        raise ConfigError(
            f"max_seq_length={cfg.max_seq_length} is more than the model's "
            f"{config.max_tokens} positions (max_position_embeddings="
            f"{config.max_position_embeddings})"
        )
    if init is not None:
        with init.reading():
            model = cls.from_pretrained(init.path, config=config)
    else:
        model = cls(config)
    if cfg.dropout is not None:
        set_dropout(model, cfg.dropout)  # the saved config keeps its own, for fine-tuning
    return model.train()


def _check_arch(cfg: PretrainConfig, config: BertConfig, tok: Tokenizer) -> None:
    """The model, its tokenizer and the recipe agree: --arch names the model's family, a
    family without a next-sentence head trains without NSP, whole-word masking finds the
    tokenizer's words."""
    if cfg.arch is not None and config.family.base != cfg.arch:
        where = cfg.config or cfg.init
        raise ConfigError(
            f"--arch {cfg.arch}: {where} is a {config.model_type} model; leave --arch out to "
            "train its own family"
        )
    if cfg.nsp and config.family.name != "bert":
        raise ConfigError(
            f"a {config.family.display} model has no next-sentence head: pass --no-nsp (masked "
            "LM alone)"
        )
    if cfg.whole_word_mask and tok.word_start == "":
        raise ConfigError(
            f"--whole-word-mask: the data's {tok.kind} tokenizer ({tok.source}) marks neither "
            "a word's first piece (byte-level Ġ, SentencePiece's ▁) nor its continuations "
            "(WordPiece's ##), so its words cannot be found from its pieces"
        )
    ours, theirs = config.family.specials, tok.specials
    if not config.family.any_specials and (ours.cls, ours.sep, ours.pad, ours.mask) != (
        theirs.cls,
        theirs.sep,
        theirs.pad,
        theirs.mask,
    ):
        raise ConfigError(
            f"the data's tokenizer ({tok.source}) has the special tokens {theirs.cls} "
            f"{theirs.sep} {theirs.pad} {theirs.mask}; a {config.family.display} model is "
            f"pre-trained with {ours.cls} {ours.sep} {ours.pad} {ours.mask} (prepare the data "
            "with `bertforge vocab train --kind bpe` for RoBERTa's, wordpiece for BERT's)"
        )


def run(cfg: PretrainConfig) -> dict[str, Any]:
    """Pre-train (or resume) into cfg.out; returns a summary."""
    return distributed.launched(_run, cfg)


def make_task(cfg: PretrainConfig, shards: ShardSet, d: distributed.Dist) -> PretrainingTask:
    """The training stream (NSP pairs, or packed rows with --no-nsp) and the held-out streams:
    fixed rows and masks (one version), so that evaluations compare across steps and runs."""
    tok = shards.tokenizer()
    max_predictions = cfg.max_predictions_per_seq or max(
        1, round(cfg.max_seq_length * cfg.masked_lm_prob)
    )
    specials = frozenset({tok.cls_id, tok.sep_id, tok.pad_id})
    spec = MaskingSpec.from_tokens(
        tok.tokens,
        tok.mask_id,
        specials,
        word_start=tok.word_start,
        masked_lm_prob=cfg.masked_lm_prob,
        max_predictions_per_seq=max_predictions,
        whole_word=cfg.whole_word_mask,
    )
    common = {
        "max_seq_length": cfg.max_seq_length,
        "short_seq_prob": cfg.short_seq_prob,
        "cls_id": tok.cls_id,
        "sep_id": tok.sep_id,
        "pad_id": tok.pad_id,
    }
    if cfg.nsp and d.is_main:
        _warn_single_documents(shards)
    stream = PretrainingStream(
        shards, spec, seed=cfg.seed, dupe_factor=cfg.dupe_factor, packed=not cfg.nsp, **common
    )
    heldout: dict[str, PretrainingStream] = {}
    if shards.names("heldout") and cfg.eval_every:
        eval_spec = dataclasses.replace(
            spec,
            masked_lm_prob=0.15,
            whole_word=False,
            max_predictions_per_seq=max(1, round(cfg.max_seq_length * 0.15)),
        )
        fixed = {"split": "heldout", "seed": cfg.seed + 1, "dupe_factor": 1}
        heldout["mlm"] = PretrainingStream(shards, eval_spec, packed=True, **fixed, **common)
        if cfg.nsp:
            heldout["nsp"] = PretrainingStream(shards, spec, **fixed, **common)
    return PretrainingTask(stream, heldout, cfg, d)


def _warn_single_documents(shards: ShardSet) -> None:
    """A warning for shards of one document: NSP takes NotNext text from another document of
    the same shard, so theirs are IsNext pairs only (data/instances.py)."""
    for split, what in (("train", "training"), ("heldout", "held-out")):
        listed = [s for s in shards.meta["shards"] if s["split"] == split]
        single = [s["name"] for s in listed if s["documents"] < 2]
        if single:
            warnings.warn(
                f"{len(single)} of {len(listed)} {what} shards of {shards.directory} hold a single "
                f"document (e.g. {single[0]}): their NSP pairs are all IsNext (NotNext text comes "
                "from another document of the same shard); more documents per shard "
                "(prepare --shard-tokens, --format lines) or --no-nsp avoid it",
                stacklevel=2,
            )


def heldout_scores(cfg: PretrainConfig, model: nn.Module) -> dict[str, float]:
    """The held-out evaluation of a run's settings (the rows and masks its metrics.jsonl uses)
    for any model: e.g. the untrained one, to compare with."""
    d = distributed.Dist()
    model.eval()
    with torch.no_grad(), autocast(resolve_precision(cfg.precision, d.device), d.device):
        return make_task(cfg, ShardSet(cfg.data), d).evaluate(model)


def _check_data(run: RunDir, shards: ShardSet) -> None:
    """The data a run resumes on is the data it started on: run.json keeps its fingerprint
    (ShardSet.fingerprint), since --data names only a directory, which may have been prepared
    again since. A run.json without one (an older run) is taken as it is."""
    mine = shards.fingerprint()
    theirs = (run.saved or {}).get("data_sha256")
    if theirs is not None and theirs != mine:
        raise DataError(
            f"{run.path} was trained on other data than {shards.directory} holds now (its "
            "meta.json differs: prepared again, or from changed files?): resume with the data it "
            "started on, or give another --out"
        )
    run.record["data_sha256"] = mine


def _run(cfg: PretrainConfig, d: distributed.Dist) -> dict[str, Any]:
    resolve_precision(cfg.precision, d.device)  # fp16 on a CPU: an error before anything is written
    # a time budget's steps are known once it ends (run.json keeps them then); its minutes are
    # among the settings a resumed run must match
    run = RunDir(cfg.out, cfg, d, **({} if cfg.minutes is not None else {"steps": cfg.steps}))
    steps = (run.saved or {}).get("steps", cfg.steps)
    if run.finished(f"this run already finished ({steps:,} steps); the model is in {run.path}"):
        return {"step": steps, "interrupted": False, "already_finished": True}
    shards = ShardSet(cfg.data)
    _check_data(run, shards)
    tok = shards.tokenizer()
    init = ModelDir.open(cfg.init) if cfg.init else None  # a hub name resolved; read once
    if init is not None:
        shards.check_tokenizer(init.tokenizer, f"the tokenizer of {cfg.init}")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, tok, init)
    task = make_task(cfg, shards, d)
    run.start(
        f"pre-training {model.num_parameters():,} parameters on {shards.count('train'):,} tokens "
        f"({cfg.data}); {d.world_size} process(es) on {d.device}; "
        f"batch {cfg.batch_size} x {cfg.max_seq_length}"
    )
    result = train(
        model,
        task,
        _loop_config(cfg, task, d),
        run.path,
        d,
        save_extra=tok.save_pretrained,
        describe="pretrain",
    )
    if cfg.minutes is not None:
        run.record["steps"] = result["step"]
        if d.is_main and not result["interrupted"]:
            print(
                f"--minutes {cfg.minutes:g}: {result['step']:,} steps in "
                f"{result['train_seconds']:.1f} s of training",
                flush=True,
            )
    run.finish(
        result,
        f"done: {run.path} holds the model (config.json, model.safetensors) and its tokenizer",
        model.save_pretrained,
        tok.save_pretrained,
        final=result,
    )
    return result


def _loop_config(cfg: PretrainConfig, task: PretrainingTask, d: distributed.Dist) -> LoopConfig:
    """The loop's settings: cfg.steps with warmup and decay of its steps, or (--minutes) a time
    budget with the same shares of its time."""
    eval_every = cfg.eval_every if task.heldout else 0
    if cfg.minutes is None:
        return LoopConfig.of(
            cfg,
            warmup_steps=round(cfg.warmup_ratio * cfg.steps),
            decay_steps=None
            if cfg.decay_ratio == 1
            else max(1, round(cfg.decay_ratio * cfg.steps)),
            eval_every=eval_every,
        )
    budget = TimeBudget(cfg.minutes * 60, cfg.warmup_ratio, cfg.decay_ratio)
    if d.is_main:
        print(
            f"--minutes {cfg.minutes:g}: training for {budget.seconds:g} s (evaluating and saving "
            "not counted), as many steps as fit",
            flush=True,
        )
    return LoopConfig.of(
        cfg, warmup_steps=0, decay_steps=None, eval_every=eval_every, budget=budget
    )
