"""`finetune --task summarize` with `--summarizer document` (the default): the document scorer of
tasks/document_scorer.py trained over a frozen encoder's sentence embeddings.

Every training and dev sentence is embedded once (pooled as the model directory says), each
document's features computed, the oracle labels drawn as BertSum's (tasks/summarize.oracle);
then the scorer trains on the one loop (train/loop.py: AdamW, warmup and linear decay,
checkpoints and exact resume, dev ROUGE-2 after every epoch, the best epoch kept by
supervised.fit). A step reads --batch-size documents' blocks (of at most BLOCK sentences).

OUT/ holds the encoder as it was (its weights, vocabulary and sentence-transformers modules, so
the directory still embeds) and the scorer (summarizer.safetensors, summarizer.json).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import embedding
from ..checkpoint import load_trained, load_with_fresh
from ..data.tasks import split_train_test
from ..errors import ConfigError, DataError
from ..model import BertModel
from ..modeldir import ModelDir
from ..runner import Runner, progress_bar
from ..tasks import TaskFamily, TaskOptions, family
from ..tasks import document_scorer as ds
from ..tasks.summarize import Summary, oracle, rouge_of, summaries
from ..tokenizer import Tokenizer
from . import distributed
from .checkpoints import RunDir
from .supervised import SupervisedTask, TrainingOptions, fit

EMBED_CHUNK = 4096  # sentences embedded at a time (their encodings held at once)


class Summarizer:
    """What the output directory holds: the encoder as it was, and the scorer."""

    def __init__(self, encoder: nn.Module, scorer: ds.DocumentScorer) -> None:
        self.encoder, self.scorer = encoder, scorer

    def save_pretrained(self, out: str | Path) -> None:
        self.encoder.save_pretrained(out)
        self.scorer.save_pretrained(out)


class DocumentTask(SupervisedTask):
    """The loop's Task over documents' blocks (train/loop.Task), and what supervised.fit reads:
    the dev ROUGE of the scorer's choices after every epoch."""

    def __init__(self, fam: TaskFamily, cfg: TrainingOptions, d: distributed.Dist) -> None:
        super().__init__(fam, cfg, d)
        self.blocks: list[ds.ScoredDocument] = []
        self.dev_docs: list[ds.ScoredDocument] = []

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.blocks) / self.cfg.batch_size)

    def batches(self, position: Any) -> Iterator[tuple[list[Any], Any]]:
        """Each step: --batch-size blocks, in an order drawn per epoch from the seed;
        position: (epoch, step within it)."""
        epoch, start = position or (0, 0)
        size, per_epoch = self.cfg.batch_size, self.steps_per_epoch
        while True:
            order = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.blocks))
            for b in range(start, per_epoch):
                step = order[b * size : (b + 1) * size]
                micro = [ds.collate_documents([self.blocks[i] for i in step.tolist()])]
                yield micro, (epoch, b + 1) if b + 1 < per_epoch else (epoch + 1, 0)
            epoch, start = epoch + 1, 0

    def normalizers(self, micro_batches: list[Any]) -> torch.Tensor:
        return torch.tensor([float(sum(m.num_tokens for m in micro_batches))])

    def loss(
        self, model: nn.Module, micro: ds.DocumentBatch, totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(*micro.inputs())
        loss_sum = ds.document_loss(logits, micro.labels, micro.mask)
        correct = ((logits > 0).float() == micro.labels)[micro.mask].sum().float()
        n = micro.mask.sum().float()
        loss = loss_sum / totals[0] * self.d.world_size
        return loss, torch.stack([loss_sum.detach(), n, correct])

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self.dev is None:
            return {}
        examples = self.dev[0]
        scores = ds.score_documents(model, self.dev_docs)
        self.dev_predictions = summaries(examples, scores, self.family.options.summary_sentences)
        return rouge_of(examples, self.dev_predictions)


def embed_sentences(
    runner: Runner,
    encoder: nn.Module,
    tok: Tokenizer,
    settings: embedding.Embedding,
    sentences: Sequence[str],
    progress: bool,
) -> np.ndarray:
    """ds.sentence_vectors of many sentences, in chunks, with the runner's progress bar."""
    parts = []
    bar = progress_bar("embedding sentences", len(sentences), "sentences") if progress else None
    with runner.showing(bar):
        for s in range(0, len(sentences), EMBED_CHUNK):
            chunk = sentences[s : s + EMBED_CHUNK]
            parts.append(ds.sentence_vectors(runner, encoder, tok, settings, chunk))
    width = ds.vector_width(encoder.config, settings)
    return np.concatenate(parts) if parts else np.zeros((0, width), np.float32)


def documents(
    task: DocumentTask, encoder: nn.Module, examples: Sequence[Any], progress: bool
) -> list[ds.ScoredDocument]:
    """The examples as the scorer reads them: embedded, their features, their oracle labels."""
    fam, size = task.family, task.family.options.summary_sentences
    settings = fam.source.embedding if fam.source else embedding.Embedding()
    sentences = [e.sentences for e in examples]
    flat = [s for doc in sentences for s in doc]
    vectors = embed_sentences(task.runner, encoder, fam.tok, settings, flat, progress)
    labels = [oracle(e.sentences, e.summary, size) if e.summary else None for e in examples]
    return ds.scored_documents(sentences, vectors, labels)


def train_document_summarizer(
    run: RunDir, cfg: TrainingOptions, source: ModelDir, fam: TaskFamily, d: distributed.Dist
) -> dict[str, Any]:
    """Embed, label and featurize the training and dev documents (by `source`, the encoder
    trained over, and its pooling), then train the scorer."""
    if d.world_size > 1:
        raise ConfigError(
            "--summarizer document trains in one process (its scorer is small: minutes on a "
            "CPU); run it without torchrun, or use --summarizer bertsum"
        )
    for option, value in (
        ("--micro-batch-size", cfg.micro_batch_size),
        ("--cache-chunk", cfg.cache_chunk),
    ):
        if value is not None:
            raise ConfigError(f"{option}: not for --summarizer document (a step's blocks fit)")
    task = DocumentTask(fam, cfg, d)
    fam.set_model(source)
    train, dev = fam.read(cfg.train), None
    if not train:
        raise DataError(f"{cfg.train}: no documents")
    if cfg.dev_split:  # as supervised.load_data: split first, then the row limits
        train, dev = split_train_test(train, cfg.dev_split)
    train = train[: cfg.max_train_rows]
    if cfg.dev:
        dev = fam.read(cfg.dev)
    dev = dev[: cfg.max_dev_rows] if dev is not None else None
    with source.reading():
        encoder, _ = load_with_fresh(BertModel, source.path)
    encoder = encoder.to(task.runner.device).eval()
    started = time.perf_counter()
    task.blocks, _ = ds.split_blocks(documents(task, encoder, train, cfg.progress and d.is_main))
    if dev:
        task.dev = (dev, None)
        task.dev_docs = documents(task, encoder, dev, cfg.progress and d.is_main)
    prepared = time.perf_counter() - started
    torch.manual_seed(cfg.seed)
    width = ds.vector_width(encoder.config, source.embedding)
    scorer = ds.DocumentScorer(ds.ScorerConfig(dim=width))
    header = (
        f"training a document summarizer over {cfg.model}'s sentence embeddings (the encoder "
        f"frozen): {len(train):,} training documents ({len(task.blocks):,} blocks), "
        f"{len(dev) if dev else 0:,} dev; embedded and labelled in {prepared:.0f} s"
    )
    return fit(
        run,
        task,
        scorer,
        source.tokenizer,
        header,
        "finetune summarize",
        Summarizer(encoder, scorer),
    )


class TrainedSummarizer:
    """A document summarizer's directory loaded for `evaluate` and `predict`."""

    def __init__(self, source: ModelDir, fam: TaskFamily, runner: Runner) -> None:
        self.fam, self.runner = fam, runner
        self.settings = source.embedding
        with source.reading():
            self.encoder = load_trained(BertModel, source.path, "").to(runner.device).eval()
            self.scorer = ds.DocumentScorer.from_pretrained(source.path).to(runner.device)
        width = ds.vector_width(self.encoder.config, self.settings)
        ds.check_width(self.scorer, width, source.path)

    def predict(self, examples: Sequence[Any]) -> list[Summary]:
        sentences = [e.sentences for e in examples]
        scores = ds.document_scores(
            self.scorer, self.runner, self.encoder, self.fam.tok, self.settings, sentences
        )
        return summaries(examples, scores, self.fam.options.summary_sentences)

    def evaluate(self, examples: Sequence[Any]) -> tuple[dict[str, float], list[Summary]]:
        preds = self.predict(examples)
        return rouge_of(examples, preds), preds


def document_summarizer(
    model: str | os.PathLike[str] | ModelDir,
    opts: TaskOptions,
    device: str | None,
    precision: str,
) -> tuple[TaskFamily, TrainedSummarizer]:
    """(the summarize family, the trained summarizer) of a document summarizer's directory."""
    source = ModelDir.open(model)
    fam = family(opts, source.tokenizer)
    return fam, TrainedSummarizer(source, fam, Runner.create(device, precision))
