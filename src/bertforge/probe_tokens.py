"""`bertforge probe --task conll2003`: the paper's feature-based NER study (section 5.3, Table 7).

The encoder stays frozen and runs once over the training and dev sentences: every hidden-state
output (0 = the embeddings, then each layer) of each word's FIRST piece, the piece fine-tuning
labels (tasks.tagging.first_pieces on the words tokenized as given, split_into_words), goes to
an on-disk cache, one .npy memmap per layer of (words, H) in float16 (or float32). Sentences
longer than the model are read in windows, each piece from its max-context window
(Pipeline.per_token, the `features` pipeline's path), a few thousand pieces at a time, so
memory holds one chunk's states, never all layers of all words. A word without a piece (one
the tokenizer drops) gets zeros and is predicted "O", as fine-tuning predicts it.

Each layer choice (probe.parse_choice: `0`, `-1`, `sum:...`, `concat:...`, and here `mix:...`,
ELMo's scalar mix: gamma * sum_k softmax(w)_k h_k, learned with the classifier) feeds a
classifier trained with Adam on the cached features: the paper's two-layer BiLSTM (768 units
per direction) before a linear layer, or one linear layer per token (`linear`, a quick look).
Each epoch is scored on dev by entity-level F1 (evaluate.entity_scores, the metric `evaluate`
uses); a row reports its best epoch. Runs are deterministic given the seed.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .checkpoint import load_torch
from .data.tasks import TaggedSentence
from .errors import ConfigError, DataError
from .evaluate import entity_scores
from .options import MAX_SEED, check_options, option
from .pipelines import Pipeline
from .probe import parse_choice
from .tasks import tagging

# Table 7's rows (the paper's BERT-base has 12 layers; "all" is every output here)
TOKEN_CHOICES = (
    "0",
    "-2",
    "-1",
    "mix:-1,-2,-3,-4",
    "concat:-1,-2,-3,-4",
    "sum:-1,-2,-3,-4",
    "mix:all",
)
KINDS = ("one", "sum", "concat", "mix")
CHUNK_BYTES = 256 << 20  # hidden states held at once while the cache is written


@dataclass(kw_only=True)
class TokenProbeOptions:
    """The classifier on frozen token features and its training (the paper: a two-layer
    768-unit BiLSTM before the classification layer)."""

    classifier: str = option(
        "bilstm",
        "tagging: bilstm (the paper's) or linear (per token, quick)",
        choices=("bilstm", "linear"),
    )
    lstm_hidden: int = option(768, "tagging: BiLSTM units per direction (the paper's 768)", min=1)
    lstm_layers: int = option(2, "tagging: BiLSTM layers (the paper's 2)", min=1)
    dropout: float = option(
        0.0, "tagging: dropout on the features and between LSTM layers", min=0, below=1
    )
    epochs: int = option(4, "tagging: epochs per layer choice (the best on dev is reported)", min=1)
    lr: float = option(1e-3, "tagging: Adam learning rate", above=0)
    train_batch_size: int = option(32, "tagging: sentences per training batch", min=1)
    seed: int = option(
        0, "tagging: seed of the classifier's weights and batch order", min=0, max=MAX_SEED
    )
    cache: str | None = option(
        None,
        "tagging: directory for the frozen features, reused when they match "
        "(default: a temporary one, removed after)",
    )
    cache_dtype: str = option(
        "float16", "tagging: dtype of the cached features", choices=("float16", "float32")
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass
class TokenFeatures:
    """One file's cached features: per layer a (words, H) memmap, the words of each sentence
    (`starts`: sentence i is words starts[i]:starts[i + 1]) and which words have a piece."""

    layers: list[np.ndarray]
    starts: np.ndarray
    has_piece: np.ndarray
    where: Path  # the cache's directory

    def sentence_words(self, sentences: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        """The word indices of these sentences, in order, and each one's length."""
        spans = [(int(self.starts[i]), int(self.starts[i + 1])) for i in sentences]
        index = np.concatenate([np.arange(a, b) for a, b in spans]) if spans else np.zeros(0, int)
        return index, [b - a for a, b in spans]


def _identity(pipe: Pipeline, sentences: Sequence[TaggedSentence], dtype: str) -> str:
    """A key for the cache: the model's files (name, size, mtime), the words, the settings."""
    h = hashlib.sha1()
    for f in sorted(Path(pipe.path).iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    h.update(f"{dtype}:{pipe.precision}:{pipe.max_length}:{pipe.stride};".encode())
    for s in sentences:
        h.update(("\x1f".join(s.tokens) + "\x1e").encode())
    return h.hexdigest()[:16]


def cache_features(
    pipe: Pipeline, sentences: Sequence[TaggedSentence], cache: Path, dtype: str = "float16"
) -> TokenFeatures:
    """Every hidden-state output at each word's first piece, written once under `cache` (a
    directory per model, words and settings; an existing complete one is reused)."""
    model = pipe.model_for("features")
    n_out, hidden = model.config.num_hidden_layers + 1, model.config.hidden_size
    where = Path(cache) / _identity(pipe, sentences, dtype)
    counts = np.array([len(s.tokens) for s in sentences], np.int64)
    starts = np.r_[0, np.cumsum(counts)]
    if (where / "meta.json").exists():  # written last: the cache is complete
        layers = [np.load(where / f"layer{k}.npy", mmap_mode="r") for k in range(n_out)]
        return TokenFeatures(layers, starts, np.load(where / "has_piece.npy"), where)
    where.mkdir(parents=True, exist_ok=True)
    n_words = int(starts[-1])
    layers = [
        np.lib.format.open_memmap(where / f"layer{k}.npy", "w+", dtype, (n_words, hidden))
        for k in range(n_out)
    ]
    has_piece = np.zeros(n_words, bool)
    encodings = pipe.tok.encode_batch(
        [s.tokens for s in sentences], truncation=False, split_into_words=True
    )

    def fn(b: dict[str, Any]) -> list[np.ndarray]:
        out = model(*b["inputs"], output_hidden_states=True)
        h = torch.stack(out.hidden_states, 2).float().cpu().numpy().astype(dtype)  # (B,T,L+1,H)
        lengths = b["attention_mask"].sum(1).tolist()
        return [h[j, :n] for j, n in enumerate(lengths)]

    budget = max(1, CHUNK_BYTES // (n_out * hidden * np.dtype(dtype).itemsize))  # pieces
    i = 0
    while i < len(sentences):
        j, pieces = i, 0
        while j < len(sentences) and (j == i or pieces + len(encodings[j].ids) <= budget):
            pieces += len(encodings[j].ids)
            j += 1
        # the words' pieces as piece ids: windows and stitching as the `features` pipeline's
        _, states = pipe.per_token([encodings[k].ids[1:-1] for k in range(i, j)], fn)
        for k, rows in zip(range(i, j), states):
            first = tagging.first_pieces(encodings[k].word_ids, int(counts[k]))
            a, ok = int(starts[k]), first >= 0
            for layer in range(n_out):
                layers[layer][a : a + counts[k]][ok] = rows[first[ok], layer]
            has_piece[a : a + counts[k]] = ok
        i = j
    for m in layers:
        m.flush()
    np.save(where / "has_piece.npy", has_piece)
    meta = {"words": n_words, "sentences": len(sentences), "outputs": n_out, "hidden": hidden}
    (where / "meta.json").write_text(json.dumps(meta))
    return cache_features(pipe, sentences, cache, dtype)  # read back as read-only memmaps


class ScalarMix(nn.Module):
    """ELMo's scalar mix: gamma * sum_k softmax(w)_k h_k over k layers (w = 0: the mean)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(k))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (..., k, H) -> (..., H)
        return self.gamma * torch.einsum("...kh,k->...h", h, self.weights.softmax(0))


class Tagger(nn.Module):
    """Features (B, T, D) or, to be mixed, (B, T, k, H) -> tag logits (B, T, K)."""

    def __init__(self, dim: int, n_tags: int, mix: int, o: TokenProbeOptions) -> None:
        super().__init__()
        self.mix = ScalarMix(mix) if mix else None
        self.drop = nn.Dropout(o.dropout)
        self.lstm = (
            nn.LSTM(
                dim,
                o.lstm_hidden,
                o.lstm_layers,
                batch_first=True,
                bidirectional=True,
                dropout=o.dropout if o.lstm_layers > 1 else 0.0,
            )
            if o.classifier == "bilstm"
            else None
        )
        self.out = nn.Linear(2 * o.lstm_hidden if self.lstm else dim, n_tags)

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        x = self.drop(self.mix(x) if self.mix is not None else x)
        if self.lstm is not None:
            packed = nn.utils.rnn.pack_padded_sequence(
                x, torch.tensor(lengths), batch_first=True, enforce_sorted=False
            )
            x, _ = self.lstm(packed)
            x, _ = nn.utils.rnn.pad_packed_sequence(x, batch_first=True, total_length=max(lengths))
            x = self.drop(x)
        return self.out(x)


def _batch(
    feats: TokenFeatures, sentences: Sequence[int], how: str, layers: list[int]
) -> tuple[torch.Tensor, list[int], np.ndarray]:
    """Padded features (B, T, D) (mix: (B, T, k, H)) of these sentences, their lengths, and
    where each word goes in the flattened (B * T) positions."""
    index, lengths = feats.sentence_words(sentences)
    parts = [np.asarray(feats.layers[k][index], np.float32) for k in layers]
    x = (
        np.concatenate(parts, -1)
        if how == "concat"
        else np.stack(parts, 1)
        if how == "mix"
        else np.sum(parts, 0)
    )
    T = max(lengths)
    where = np.concatenate([b * T + np.arange(n) for b, n in enumerate(lengths)])
    padded = torch.zeros((len(lengths) * T, *x.shape[1:]))
    padded[torch.from_numpy(where)] = torch.from_numpy(x)
    return padded.view(len(lengths), T, *x.shape[1:]), lengths, where


def _predict(
    net: Tagger, feats: TokenFeatures, how: str, layers: list[int], labels: Sequence[str]
) -> list[list[str]]:
    """Each dev word's tag (a word without a piece: "O")."""
    net.eval()
    n = len(feats.starts) - 1
    order = np.argsort(np.diff(feats.starts), kind="stable")  # similar lengths together
    tags: list[list[str]] = [[] for _ in range(n)]
    with torch.no_grad():
        for a in range(0, n, 64):
            rows = order[a : a + 64].tolist()
            x, lengths, where = _batch(feats, rows, how, layers)
            best = net(x, lengths).argmax(-1).reshape(-1)[torch.from_numpy(where)].numpy()
            index, _ = feats.sentence_words(rows)
            best = np.where(feats.has_piece[index], best, labels.index(tagging.OUTSIDE))
            done = 0
            for i, length in zip(rows, lengths):
                tags[i] = [labels[t] for t in best[done : done + length]]
                done += length
    return tags


@dataclass
class _ChoiceRun:
    """One layer choice's classifier in training: the net, its optimizer, the generator of
    the batch order and the row so far (each epoch's loss and dev F1, the best epoch's)."""

    choice: str
    how: str
    layers: list[int]
    net: Tagger
    optim: torch.optim.Optimizer
    rng: np.random.Generator
    row: dict[str, Any]

    @classmethod
    def setup(
        cls, train: TokenFeatures, labels: Sequence[str], choice: str, o: TokenProbeOptions
    ) -> _ChoiceRun:
        """A fresh classifier for this choice of the cached layers, seeded by o.seed."""
        how, layers = parse_choice(choice, len(train.layers), KINDS)
        hidden = train.layers[0].shape[1]
        dim = hidden * len(layers) if how == "concat" else hidden
        torch.manual_seed(o.seed)
        rng = np.random.default_rng(o.seed)
        net = Tagger(dim, len(labels), len(layers) if how == "mix" else 0, o)
        optim = torch.optim.Adam(net.parameters(), lr=o.lr)
        row: dict[str, Any] = {"layers": choice, "dim": dim, "f1": -1.0, "epochs": []}
        return cls(choice, how, layers, net, optim, rng, row)

    def load(self, resume: Path) -> None:
        """The training as `save` kept it after its last epoch."""
        state = load_torch(resume, "a probe's saved training")  # tensors and strings
        self.net.load_state_dict(state["net"])
        self.optim.load_state_dict(state["optim"])
        self.rng.bit_generator.state = json.loads(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        self.row = json.loads(state["row"])

    def save(self, resume: Path) -> None:
        """Weights, optimizer, random states and the row so far, atomically."""
        state = {
            "net": self.net.state_dict(),
            "optim": self.optim.state_dict(),
            "rng": json.dumps(self.rng.bit_generator.state),
            "torch_rng": torch.get_rng_state(),
            "row": json.dumps(self.row),
        }
        torch.save(state, resume.with_suffix(".tmp"))
        resume.with_suffix(".tmp").replace(resume)

    def train_epoch(
        self,
        train: TokenFeatures,
        y: np.ndarray,
        o: TokenProbeOptions,
        epoch: int,
        log: Callable[[str], None],
    ) -> float:
        """One pass over the training sentences in a fresh random order: the summed loss
        (each batch's mean times its sentences)."""
        loss_fn = nn.CrossEntropyLoss(ignore_index=tagging.IGNORE_INDEX)
        self.net.train()
        t0, total = time.perf_counter(), 0.0
        n = len(train.starts) - 1
        steps = -(-n // o.train_batch_size)
        order = self.rng.permutation(n)
        for step, a in enumerate(range(0, n, o.train_batch_size), 1):
            rows = order[a : a + o.train_batch_size]
            x, lengths, where = _batch(train, rows.tolist(), self.how, self.layers)
            target = torch.full((x.shape[0] * x.shape[1],), tagging.IGNORE_INDEX)
            index, _ = train.sentence_words(rows.tolist())
            target[torch.from_numpy(where)] = torch.from_numpy(y[index])
            logits = self.net(x, lengths)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), target)
            self.optim.zero_grad()
            loss.backward()
            self.optim.step()
            total += float(loss.detach()) * len(rows)
            if step % max(1, steps // 10) == 0 and step < steps:  # a long epoch shows progress
                log(
                    f"  {self.choice} epoch {epoch}: step {step}/{steps}, "
                    f"{time.perf_counter() - t0:.0f} s, loss {total / (a + len(rows)):.4f}"
                )
        return total

    def score(
        self,
        dev: TokenFeatures,
        gold: Sequence[Sequence[str]],
        labels: Sequence[str],
        epoch: int,
        loss: float,
        t0: float,
        log: Callable[[str], None],
    ) -> None:
        """The epoch's dev entity F1 into the row (its loss, and the seconds since t0); the
        best epoch's scores (and mix weights) kept as the row's own."""
        scores = entity_scores(gold, _predict(self.net, dev, self.how, self.layers, labels))
        seconds = time.perf_counter() - t0
        self.row["epochs"].append(
            {"epoch": epoch, "loss": loss, "dev_f1": scores["f1"], "seconds": seconds}
        )
        log(
            f"  {self.choice} epoch {epoch}: loss {loss:.4f}, dev F1 {100 * scores['f1']:.2f} "
            f"({seconds:.0f} s)"
        )
        if scores["f1"] > self.row["f1"]:
            self.row.update(
                f1=scores["f1"],
                precision=scores["precision"],
                recall=scores["recall"],
                best_epoch=epoch,
            )
            if self.net.mix is not None:
                self.row["mix_weights"] = self.net.mix.weights.softmax(0).tolist()
                self.row["mix_gamma"] = float(self.net.mix.gamma.detach())


def train_probe(
    train: TokenFeatures,
    y: np.ndarray,
    dev: TokenFeatures,
    gold: Sequence[Sequence[str]],
    labels: Sequence[str],
    choice: str,
    o: TokenProbeOptions,
    log: Callable[[str], None] = lambda line: None,
    resume: Path | None = None,
) -> dict[str, Any]:
    """One layer choice: the classifier trained on the cached training features (y: each
    word's tag index, -100 for a word without a piece), its best epoch on dev. resume: a file
    that keeps the training after every epoch (weights, optimizer, random states, the row so
    far), so a stopped run goes on from its last epoch with the very results of one that was
    not stopped; removed when the row is done."""
    run = _ChoiceRun.setup(train, labels, choice, o)
    if resume is not None and resume.exists():
        run.load(resume)
        log(f"  {choice}: resumed after epoch {len(run.row['epochs'])}")
    n = len(train.starts) - 1
    for epoch in range(len(run.row["epochs"]) + 1, o.epochs + 1):
        t0 = time.perf_counter()
        total = run.train_epoch(train, y, o, epoch, log)
        run.score(dev, gold, labels, epoch, total / n, t0, log)
        if resume is not None and epoch < o.epochs:
            run.save(resume)
    if resume is not None:
        resume.unlink(missing_ok=True)
    row = run.row
    row["seconds"] = sum(e["seconds"] for e in row["epochs"])  # training and dev, all epochs
    return row


def word_labels(sentences: Sequence[TaggedSentence], labels: Sequence[str]) -> np.ndarray:
    """Each word's tag index, in the cache's word order (the tag set of fine-tuning)."""
    index = {t: i for i, t in enumerate(labels)}
    y = []
    for s in sentences:
        if not s.tags:
            raise DataError(f"{s.source}: a sentence without tags; the probe trains on tags")
        for w, tag in enumerate(s.tags):
            if tag not in index:
                raise DataError(
                    f'{s.source}: word {w + 1} ({s.tokens[w]!r}): field "tag": {tag!r} is not '
                    f"one of the tags: {', '.join(labels)}"
                )
            y.append(index[tag])
    return np.asarray(y, np.int64)


def probe_tags(
    model: str,
    train: Sequence[TaggedSentence],
    dev: Sequence[TaggedSentence],
    labels: Sequence[str],
    choices: Sequence[str] = TOKEN_CHOICES,
    options: TokenProbeOptions | None = None,
    *,
    skip: Sequence[str] = (),
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
    log: Callable[[str], None] = lambda line: None,
    **pipeline_options: Any,
) -> list[dict[str, Any]]:
    """Dev entity F1 of a classifier on each layer choice of frozen token features (choices
    in `skip` are not run: a resumed table's rows). on_row(row) as each row is done; the
    first row carries the seconds the features took."""
    o = options or TokenProbeOptions()
    pipe = Pipeline(model, **pipeline_options)
    n_out = pipe.config.num_hidden_layers + 1
    for choice in choices:  # a bad choice is refused before the encoder runs
        parse_choice(choice, n_out, KINDS)
    if tagging.OUTSIDE not in labels:
        raise ConfigError(f"tags {list(labels)}: the probe needs {tagging.OUTSIDE!r} among them")
    y = word_labels(train, labels)
    gold = [s.tags for s in dev]
    untagged = next((s for s in dev if not s.tags), None)
    if untagged is not None:  # dev tags may be any: the metric compares strings
        raise DataError(f"{untagged.source}: a sentence without tags; the probe scores tags")
    todo = [c for c in choices if c not in skip]
    if not todo:
        return []
    with tempfile.TemporaryDirectory(prefix="bertforge-probe-") as tmp:
        cache = Path(o.cache) if o.cache else Path(tmp)
        start = time.perf_counter()
        f_train = cache_features(pipe, train, cache, o.cache_dtype)
        f_dev = cache_features(pipe, dev, cache, o.cache_dtype)
        seconds = time.perf_counter() - start
        log(
            f"frozen features of {len(y):,} training and {int(f_dev.starts[-1]):,} dev words "
            f"({n_out} outputs: the embeddings and {n_out - 1} layers) in {seconds:.0f} s"
        )
        rows = []
        for k, choice in enumerate(todo):
            # with a cache of its own, each row's training resumes from its last epoch
            key = json.dumps([choice, settings(o), list(labels), f_dev.where.name])
            resume = (
                f_train.where / f"probe-{hashlib.sha1(key.encode()).hexdigest()[:16]}.pt"
                if o.cache
                else None
            )
            row = train_probe(f_train, y, f_dev, gold, labels, choice, o, log, resume)
            row["classifier"] = o.classifier
            if k == 0:
                row["feature_seconds"] = seconds
            rows.append(row)
            on_row(row)
        del f_train, f_dev  # the memmaps, before their temporary directory goes
    return rows


def row_line(row: dict[str, Any]) -> str:
    """A row as `bertforge probe` shows it when it is done: its dev F1 and best epoch."""
    return (
        f"{row['layers']:<22} {row['dim']:>6}  dev F1 {100 * row['f1']:6.2f}  "
        f"(epoch {row['best_epoch']}, {row['seconds']:.0f} s)"
    )


def probe_tagging(
    model: str,
    fam: tagging.TaggingTask,
    train: Sequence[TaggedSentence],
    dev: Sequence[TaggedSentence],
    choices: Sequence[str] = TOKEN_CHOICES,
    options: TokenProbeOptions | None = None,
    *,
    log: Callable[[str], None] = lambda line: None,
    **pipeline_options: Any,
) -> list[dict[str, Any]]:
    """probe_tags on a tagging task's sentences with fine-tuning's tag set (the family's
    --labels, else train's tags); log gets a line as the run starts, as the features are
    made, as each epoch ends and as each row is done (row_line)."""
    o = options or TokenProbeOptions()
    fam.set_labels(train)
    log(f"{len(train):,} training and {len(dev):,} dev sentences; {o.classifier} classifier")
    return probe_tags(
        model,
        train,
        dev,
        fam.labels,
        choices,
        o,
        on_row=lambda row: log(row_line(row)),
        log=log,
        **pipeline_options,
    )


def settings(o: TokenProbeOptions) -> dict[str, Any]:
    """The options that decide a row's result (not where the cache lives)."""
    return {k: v for k, v in asdict(o).items() if k != "cache"}
