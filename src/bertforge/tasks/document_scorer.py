"""The summarize family's document-level scorer: a small Transformer over a document's sentences
(BertSumExt's inter-sentence Transformer, Liu 2019), each sentence given as its embedding by a
frozen sentence encoder and a few features of its place in the document.

Why. BertSum's own input reads a document in windows of 512 pieces; a Wikipedia lead draws on
the whole article (about 140 sentences, a window sees about 8), and fine-tuning the encoder on
a CPU gets a few hundred steps. Here the encoder is not trained: every sentence is embedded
once (pooled as the model directory says), and what trains is the scorer, whose attention
spans up to BLOCK sentences at a time (a longer document is read in blocks of BLOCK, its
sentences past the position table on its last slot: block_positions). It trains on 1,388
Wikipedia articles in minutes on a CPU.

Input per sentence: its unit-length embedding and FEATURES (document-wide, computed from the
sentences and their embeddings): its position (i / n, log(1 + i), first or not), its length in
words (log), its similarity to the document (the cosine of its embedding to their mean, and of
its TF-IDF vector to the document's), its mean cosine to the other sentences, and its TextRank
score (PageRank over the sentences' TF-IDF cosines, Mihalcea and Tarau 2004), the document
scores also as z-scores within the document. All linear in the number of sentences (no n x n
table is made). The scorer: the input projected to `hidden`, a learned position embedding,
`layers` pre-norm Transformer layers, a linear score (the log-odds of "summary").

Files beside the encoder's: SCORER_FILE (safetensors) and SCORER_CONFIG (its sizes and the
feature names it was trained with, checked at load).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import embedding
from ..checkpoint import read_safetensors, safetensors_metadata
from ..errors import CheckpointError, need_extra
from ..fileio import atomic_path, read_json, write_json
from ..runner import Runner
from ..tokenizer import Tokenizer
from .base import Features, infer

SCORER_FILE = "summarizer.safetensors"
SCORER_CONFIG = "summarizer.json"
SIZES = ("dim", "hidden", "layers", "heads")  # ScorerConfig's sizes, also in SCORER_FILE's header
POS_WEIGHT = 5.0  # the loss's weight of an oracle sentence (about 2% of Wikipedia's sentences)
BLOCK = 512  # sentences the scorer attends over at once (its position table's size)
FEATURES = (
    "position",
    "log_index",
    "first",
    "log_words",
    "embedding_centrality",
    "embedding_centrality_z",
    "mean_cosine",
    "tfidf_centrality",
    "tfidf_centrality_z",
    "textrank_log",
    "textrank_z",
)
_WORD = re.compile(r"\w+")


# ------------------------------------------------------------------------------------------------
# Features


def _z(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / (x.std() + 1e-6)


def tfidf(sentences: Sequence[str]) -> Any:
    """(n, V) scipy CSR: each sentence's TF-IDF vector over the document's words (lower-cased
    \\w+; idf = log((1 + n) / (1 + df)) + 1, scikit-learn's smooth idf), unit length."""
    sparse = need_extra(
        "scipy.sparse",
        "the document summarizer's TF-IDF needs scipy: pip install 'bertforge[summarize]'",
    )
    words = [_WORD.findall(s.lower()) for s in sentences]
    df = Counter(w for ws in words for w in dict.fromkeys(ws))  # first-seen order
    vocab = {w: i for i, w in enumerate(df)}
    n = len(sentences)
    idf = np.array([math.log((1 + n) / (1 + df[w])) + 1 for w in vocab])
    rows, cols, vals = [], [], []
    for i, ws in enumerate(words):
        for w, c in Counter(ws).items():
            rows.append(i)
            cols.append(vocab[w])
            vals.append(c * idf[vocab[w]])
    m = sparse.csr_matrix((vals, (rows, cols)), shape=(n, len(vocab)), dtype=np.float64)
    norms = np.sqrt(np.asarray(m.multiply(m).sum(1)).ravel())
    return sparse.diags(1 / np.maximum(norms, 1e-12)) @ m


def textrank(t: Any, iterations: int = 30, damping: float = 0.85) -> np.ndarray:
    """PageRank over the sentences' cosines (t: unit rows), each sentence's own left out, by
    power iteration without the n x n table: S r = t (t^T r) - r (the diagonal is 1, or 0 for
    an empty sentence). Scaled so that the mean is 1."""
    n = t.shape[0]
    self_sim = np.asarray(t.multiply(t).sum(1)).ravel()
    degree = t @ np.asarray(t.sum(0)).ravel() - self_sim  # each row of S summed
    inv = np.where(degree > 1e-12, 1 / np.maximum(degree, 1e-12), 0.0)
    r = np.full(n, 1 / n)
    for _ in range(iterations):
        walk = r * inv  # r_j / degree_j: the share each sentence passes on
        spread = t @ (t.T @ walk) - self_sim * walk
        dangling = r[degree <= 1e-12].sum() / n  # a sentence linked to none spreads evenly
        r = (1 - damping) / n + damping * (spread + dangling)
    return r * n


def sentence_features(sentences: Sequence[str], vectors: np.ndarray) -> np.ndarray:
    """(n, len(FEATURES)) float32 of a document's sentences and their unit embeddings (n, D)."""
    n = len(sentences)
    if n == 0:
        return np.zeros((0, len(FEATURES)), np.float32)
    x = np.asarray(vectors, np.float64)
    i = np.arange(n, dtype=np.float64)
    words = np.array([len(_WORD.findall(s)) for s in sentences], np.float64)
    total = x.sum(0)
    mean = total / max(np.linalg.norm(total), 1e-12)
    centrality = x @ mean
    mean_cosine = (x @ total - (x * x).sum(1)) / max(n - 1, 1)
    t = tfidf(sentences)
    doc = np.asarray(t.sum(0)).ravel()
    lexical = t @ (doc / max(np.linalg.norm(doc), 1e-12))
    rank = textrank(t)
    columns = [
        i / n,
        np.log1p(i),
        (i == 0).astype(np.float64),
        np.log1p(words),
        centrality,
        _z(centrality),
        mean_cosine,
        lexical,
        _z(lexical),
        np.log(rank + 1e-3),
        _z(rank),
    ]
    return np.stack(columns, 1).astype(np.float32)


def unit(vectors: np.ndarray) -> np.ndarray:
    x = np.asarray(vectors, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def vector_width(config: Any, settings: embedding.Embedding) -> int:
    """The width of a sentence's vector: the encoder's (its config's hidden_size), once per
    pooling mode (pool joins several modes' vectors end to end)."""
    return int(config.hidden_size) * len(settings.pooling)


def sentence_vectors(
    runner: Runner,
    encoder: nn.Module,
    tok: Tokenizer,
    settings: embedding.Embedding,
    sentences: Sequence[str],
) -> np.ndarray:
    """(N, D) unit float32 embeddings of sentences, pooled as the model directory says; a
    sentence longer than the model's window is cut to it (a sentence is rarely that long)."""
    from .retrieval import Pooled

    if not sentences:
        return np.zeros((0, vector_width(encoder.config, settings)), np.float32)
    limit = min(settings.max_length or 512, encoder.config.max_tokens)
    features = Features.from_encodings(tok.encode_batch(list(sentences), max_length=limit))
    pooled = Pooled(encoder, settings.pooling)
    rows = infer(runner, pooled, features, tok.pad_id, outputs=lambda v: v)
    return unit(np.stack(rows))


# ------------------------------------------------------------------------------------------------
# The scorer


@dataclass
class ScorerConfig:
    """SCORER_CONFIG: the scorer's sizes and the features it reads."""

    dim: int  # the sentence embeddings' width
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    features: tuple[str, ...] = FEATURES
    kind: str = "document"


class DocumentScorer(nn.Module):
    """Scores (B, n) of documents' sentences from their embeddings (B, n, D) and features
    (B, n, F); mask (B, n): real sentences; positions (B, n): each sentence's slot in the
    position table (block_positions). n at most BLOCK."""

    def __init__(self, config: ScorerConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden
        self.project = nn.Linear(config.dim + len(config.features), h)
        self.position = nn.Embedding(BLOCK, h)
        # BERT's 0.02, not N(0, 1): positions past the longest training document are never
        # trained, and at unit scale they would swamp those sentences' projections
        nn.init.normal_(self.position.weight, std=0.02)
        layer = nn.TransformerEncoderLayer(
            h, config.heads, 2 * h, config.dropout, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(h)
        self.score = nn.Linear(h, 1)

    def forward(
        self,
        vectors: torch.Tensor,
        features: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> Any:
        if positions is None:  # one block that starts its document
            positions = torch.arange(vectors.shape[1], device=vectors.device)[None]
        h = self.project(torch.cat([vectors, features], -1))
        h = h + self.position(positions)
        h = self.layers(h, src_key_padding_mask=~mask)
        return self.score(self.norm(h)).squeeze(-1)

    def save_pretrained(self, directory: str | Path) -> None:
        """SCORER_FILE (its header also holds the SIZES: the number of heads is in no
        tensor's shape) and SCORER_CONFIG into `directory` (each written whole, then renamed)."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        sizes = {name: str(getattr(self.config, name)) for name in SIZES}
        with atomic_path(out / SCORER_FILE) as tmp:
            state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(state, str(tmp), metadata={"format": "pt", **sizes})
        config = asdict(self.config)
        config["features"] = list(self.config.features)
        write_json(out / SCORER_CONFIG, config)

    def load_checkpoint(self, directory: str | Path) -> None:
        """The weights of a training checkpoint of this scorer (train/checkpoints.load)."""
        self.load_state_dict(scorer_state(self, Path(directory)))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> DocumentScorer:
        """The scorer of a summarizer directory; one CheckpointError naming the file for a
        config of other features or sizes, or missing, extra, misshapen or non-finite
        weights."""
        path = Path(directory)
        model = cls(read_scorer_config(path / SCORER_CONFIG))
        model.load_state_dict(scorer_state(model, path))
        return model.eval()


def scorer_state(model: DocumentScorer, directory: Path) -> dict[str, torch.Tensor]:
    """SCORER_FILE's tensors (read as every checkpoint is: checkpoint.read_safetensors, so
    corrupt or non-finite ones are refused), checked against `model`, whose config is
    SCORER_CONFIG's: a size the file was saved with that the config does not give names the
    config's field (one line, where load_state_dict gives a size mismatch per tensor); then
    a missing, extra or misshapen tensor names the weights."""
    weights, config = directory / SCORER_FILE, directory / SCORER_CONFIG
    state = read_safetensors(weights)
    for name, saved in saved_sizes(state, safetensors_metadata(weights)).items():
        given = getattr(model.config, name)
        if given != saved:
            raise CheckpointError(
                f"{config}: {name}={given}, but {weights.name} holds a scorer of {name}={saved}"
            )
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing or extra:
        found = [f"missing {', '.join(missing[:3])}"] if missing else []
        found += [f"unexpected {', '.join(extra[:3])}"] if extra else []
        raise CheckpointError(f"{weights}: not this scorer's weights ({'; '.join(found)})")
    for k, t in state.items():
        if t.shape != expected[k].shape:
            raise CheckpointError(
                f"{weights}: tensor {k!r} has shape {tuple(t.shape)} but {config.name} gives "
                f"{tuple(expected[k].shape)}"
            )
    return state


def saved_sizes(state: dict[str, torch.Tensor], metadata: dict[str, str]) -> dict[str, int]:
    """The SIZES a scorer's tensors were saved with: from the file's header where it has them
    (save_pretrained), else those its shapes show (every size but heads)."""
    sizes: dict[str, int] = {}
    project = state.get("project.weight")  # (hidden, dim + len(FEATURES))
    if project is not None and project.dim() == 2:
        sizes["hidden"], sizes["dim"] = project.shape[0], project.shape[1] - len(FEATURES)
    layers = {k.split(".")[2] for k in state if k.startswith("layers.layers.")}
    if layers:
        sizes["layers"] = len(layers)
    sizes.update({k: int(v) for k, v in metadata.items() if k in SIZES and v.isdigit()})
    return sizes


def read_scorer_config(path: Path) -> ScorerConfig:
    """A scorer's config file, checked: one CheckpointError naming it for unknown fields,
    other features, or sizes a scorer cannot have."""
    raw = read_json(path, CheckpointError)
    names = [f.name for f in fields(ScorerConfig)]
    unknown = [k for k in raw if k not in names]
    if unknown:
        raise CheckpointError(
            f"{path}: unknown field {unknown[0]!r} (a scorer's fields: {', '.join(names)})"
        )
    required = [f.name for f in fields(ScorerConfig) if f.default is MISSING]
    missing = [k for k in required if k not in raw]
    if missing:
        raise CheckpointError(f"{path}: missing field {missing[0]!r}")
    features = raw.get("features", [])
    if not isinstance(features, list):
        raise CheckpointError(f"{path}: features={features!r}, expected a list of names")
    config = ScorerConfig(**{**raw, "features": tuple(features)})
    if config.features != FEATURES or config.kind != "document":
        raise CheckpointError(
            f"{path}: a scorer of features {list(config.features)} (kind {config.kind!r}); "
            f"this bertforge reads {list(FEATURES)}"
        )
    for name in ("dim", "hidden", "layers", "heads"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: {name}={value!r}, expected an integer >= 1")
    if config.hidden % config.heads:
        raise CheckpointError(f"{path}: hidden={config.hidden} is not a multiple of heads")
    dropout = config.dropout
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise CheckpointError(f"{path}: dropout={dropout!r}, expected a number in [0, 1)")
    return config


def check_width(scorer: DocumentScorer, width: int, where: str | Path) -> None:
    """One CheckpointError when a scorer reads vectors of another width than the encoder's
    pooling gives (its pooling changed since it was trained)."""
    if scorer.config.dim != width:
        raise CheckpointError(
            f"{Path(where) / SCORER_CONFIG}: the scorer reads sentence vectors of {scorer.config.dim}"
            f" numbers, but the model's pooling gives {width}"
        )


def document_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The summed binary cross-entropy of the real sentences' scores against their oracle
    labels, an oracle sentence weighted POS_WEIGHT."""
    weight = torch.tensor(POS_WEIGHT, device=logits.device)
    return nn.functional.binary_cross_entropy_with_logits(
        logits[mask].float(), labels[mask], pos_weight=weight, reduction="sum"
    )


def is_document_summarizer(path: str | Path) -> bool:
    """Whether a model directory holds a document scorer (SCORER_FILE and SCORER_CONFIG). One
    of them alone is a damaged summarizer, not an encoder to summarize with by k-means: one
    CheckpointError naming the file that is missing."""
    directory = Path(path)
    present = [name for name in (SCORER_FILE, SCORER_CONFIG) if (directory / name).is_file()]
    if len(present) == 1:
        (missing,) = {SCORER_FILE, SCORER_CONFIG} - set(present)
        raise CheckpointError(
            f"{directory}: has {present[0]} but not {missing}: the summarizer is incomplete "
            "(copy its directory whole; `summarize --mode kmeans` reads its encoder alone)"
        )
    return len(present) == 2


# ------------------------------------------------------------------------------------------------
# Documents as the scorer reads them


@dataclass
class ScoredDocument:
    """A document's sentences as the scorer reads them, and its labels when it has any."""

    vectors: np.ndarray  # (n, D) unit embeddings
    features: np.ndarray  # (n, F)
    labels: np.ndarray | None = None  # (n,) 1 for an oracle sentence
    start: int = 0  # a block's first sentence's index in its document


def blocks(n: int) -> list[range]:
    """The sentence ranges the scorer reads a document of n sentences in (BLOCK at a time)."""
    return [range(s, min(s + BLOCK, n)) for s in range(0, n, BLOCK)]


def block_positions(start: int, n: int) -> np.ndarray:
    """(n,) the position slots of a block's sentences: their indices in the document, those
    past the table's last slot on that slot. Not counted again from 0: slot 0 is what the
    scorer learns as the lead, and sentence BLOCK read there scored as the document's first.
    Not wrapped or spread either: every slot past the longest training document is as
    untrained as the next (near zero, DocumentScorer), so the last one says "late in a long
    document" as well as any, and the document-wide features (position, log_index) still
    tell those sentences apart."""
    return np.minimum(np.arange(start, start + n), BLOCK - 1)


@dataclass
class DocumentBatch:
    """Documents' blocks padded to the longest: vectors (B, n, D), features (B, n, F), mask
    (B, n) of real sentences, positions (B, n) (block_positions), labels (B, n) (0 where a
    document has none)."""

    vectors: torch.Tensor
    features: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device | str) -> DocumentBatch:
        return DocumentBatch(*(t.to(device) for t in self.inputs()), self.labels.to(device))

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.vectors, self.features, self.mask, self.positions

    @property
    def num_tokens(self) -> int:  # what the training loop counts: real sentences
        return int(self.mask.sum())


def collate_documents(docs: Sequence[ScoredDocument]) -> DocumentBatch:
    """A DocumentBatch of documents (blocks) of at most BLOCK sentences."""
    n = max((len(d.vectors) for d in docs), default=0)
    dim, width = docs[0].vectors.shape[1], docs[0].features.shape[1]
    x = torch.zeros(len(docs), n, dim)
    f = torch.zeros(len(docs), n, width)
    y = torch.zeros(len(docs), n)
    mask = torch.zeros(len(docs), n, dtype=torch.bool)
    positions = torch.zeros(len(docs), n, dtype=torch.long)  # padding: any slot, masked
    for b, d in enumerate(docs):
        k = len(d.vectors)
        x[b, :k] = torch.from_numpy(d.vectors)
        f[b, :k] = torch.from_numpy(d.features)
        mask[b, :k] = True
        positions[b, :k] = torch.from_numpy(block_positions(d.start, k))
        if d.labels is not None:
            y[b, :k] = torch.from_numpy(d.labels)
    return DocumentBatch(x, f, mask, positions, y)


def split_blocks(docs: Sequence[ScoredDocument]) -> tuple[list[ScoredDocument], list[int]]:
    """Each document cut into its blocks, and the document of each block."""
    parts, owner = [], []
    for k, d in enumerate(docs):
        for r in blocks(len(d.vectors)):
            at = slice(r.start, r.stop)
            labels = None if d.labels is None else d.labels[at]
            parts.append(ScoredDocument(d.vectors[at], d.features[at], labels, d.start + r.start))
            owner.append(k)
    return parts, owner


@torch.no_grad()
def score_documents(
    scorer: DocumentScorer, docs: Sequence[ScoredDocument], batch_size: int = 16
) -> list[np.ndarray]:
    """Every document's sentence scores (the scorer's log-odds), its blocks read apart."""
    device = next(scorer.parameters()).device
    parts, owner = split_blocks(docs)
    out: list[list[np.ndarray]] = [[] for _ in docs]
    order = np.argsort([len(p.vectors) for p in parts], kind="stable")  # like lengths together
    results: dict[int, np.ndarray] = {}
    for s in range(0, len(order), batch_size):
        chunk = [int(i) for i in order[s : s + batch_size]]
        batch = collate_documents([parts[i] for i in chunk]).to(device)
        scores = scorer(*batch.inputs()).float().cpu().numpy()
        for j, i in enumerate(chunk):
            results[i] = scores[j, : len(parts[i].vectors)]
    for i, k in enumerate(owner):
        out[k].append(results[i])
    return [np.concatenate(p) if p else np.zeros(0, np.float32) for p in out]


def document_scores(
    scorer: DocumentScorer,
    runner: Runner,
    encoder: nn.Module,
    tok: Tokenizer,
    settings: embedding.Embedding,
    sentences: Sequence[Sequence[str]],
) -> list[np.ndarray]:
    """Each document's sentence scores by a trained scorer: its sentences embedded by the
    encoder (pooled as `settings` say), their features, the scorer's log-odds."""
    flat = [s for doc in sentences for s in doc]
    vectors = sentence_vectors(runner, encoder, tok, settings, flat)
    return score_documents(scorer, scored_documents(sentences, vectors))


def scored_documents(
    sentences: Sequence[Sequence[str]],
    vectors: np.ndarray,
    labels: Sequence[Sequence[int] | None] | None = None,
) -> list[ScoredDocument]:
    """ScoredDocuments of documents' sentences, given all their sentences' unit embeddings in
    order (N, D), and each document's oracle sentences."""
    out, start = [], 0
    for k, s in enumerate(sentences):
        x = vectors[start : start + len(s)]
        start += len(s)
        y = None
        if labels is not None and labels[k] is not None:
            y = np.zeros(len(s), np.float32)
            y[list(labels[k])] = 1
        out.append(ScoredDocument(x, sentence_features(s, x), y))
    return out
