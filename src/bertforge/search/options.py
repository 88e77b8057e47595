"""The options of building, searching and mining an index, each written once: its default,
help text and allowed values in a config dataclass field (options.option), checked by
check_options; the library functions take their defaults from here and the command line
(`bertforge index`, `search`, `mine`) its options (options.add_options).

    IndexOptions  how Index.build embeds a corpus (corpus.CorpusFormat: where its ids and texts are)
    FirstStage    the first stage of search and mine: dense, BM25 or both fused
    QueryModel    the model that embeds the queries, and their prompt (open_index)
    SearchOptions how many hits, with what, reranked by a cross-encoder (search_queries)
    MineOptions   hard negatives per query, which candidates are left out, a teacher (mine)
    PgOptions     a PostgreSQL index's table and how its dense search runs (postgres.py)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..embedding import EMBEDDING_PRECISIONS
from ..errors import ConfigError
from ..options import check_options, option
from ..runner import PRECISIONS
from .fusion import FUSIONS, RERANK_FUSION

MODES = ("dense", "bm25", "hybrid")
NEAR_DUPLICATE = 0.8  # mining: a candidate whose words are this like its positive's is no negative
MISSING = ("error", "skip", "keep")  # mining: what to do with positives not in the corpus
EF_SEARCH_MAX = 1000  # pgvector's largest hnsw.ef_search: the most candidates its graph gives
# queries searched (and mining: their candidates' texts held) at a time: search's rows are written
# and a bar over the queries moves a part at a time, a part taking seconds on a CPU
QUERIES_AT_ONCE = 256


def _prompt_help(what: str, default: str) -> tuple[str, str]:
    """The help of prompt_name and prompt: the text put before each of `what` (a
    sentence-transformers model's prompts, config_sentence_transformers.json)."""
    return (
        f"the model's prompt of that name before {what} (default: {default})",
        f'this text before {what} instead ("": none)',
    )


_DOCUMENT_PROMPT = _prompt_help(
    "the documents", "the model's document prompt (document, passage or corpus)"
)
_QUERY_PROMPT = _prompt_help(
    "each query", "the prompt the index recorded: the model's query prompt"
)


@dataclass(kw_only=True)
class IndexOptions:
    """How Index.build embeds a corpus: chunks (the unit a killed build resumes at), windows of
    a long document, the documents' prompt, the vectors' precision, BM25 and an HNSW graph
    beside them, and the model's batches, precision and device."""

    chunk: int = option(10_000, "documents per part (resume unit)", min=1)
    window: int | None = option(
        None,
        "pieces per window: a longer document is cut into overlapping windows and scores as its "
        "best (default: the model's length; shorter windows find a sentence better)",
    )
    stride: int | None = option(
        None, "pieces between windows of a long document (default: half a window)"
    )
    prompt_name: str | None = option(None, _DOCUMENT_PROMPT[0])
    prompt: str | None = option(None, _DOCUMENT_PROMPT[1])
    embedding_precision: str = option(
        "float32",
        "keep the vectors quantised (sentence-transformers' quantize_embeddings; int8/uint8 "
        "buckets from the corpus's own vectors): 4 (int8) or 32 (binary) times smaller, float "
        "queries scored against them",
        choices=EMBEDDING_PRECISIONS,
    )
    bm25: bool = option(True, "no BM25 index beside the vectors", flag="--no-bm25")
    approximate: str | None = option(
        None, "an HNSW graph (faiss) for millions of vectors", choices=("hnsw",)
    )
    batch_size: int | None = option(
        None, "windows per batch (default: 32 on the CPU, 512 on a GPU)", min=1
    )
    precision: str = option("auto", choices=PRECISIONS)  # help: the command line's, as elsewhere
    device: str | None = option(None)
    progress: bool = option(True, "no progress bar", flag="--no-progress")

    def __post_init__(self) -> None:
        check_options(self)
        if self.approximate and self.embedding_precision != "float32":
            raise ConfigError(
                "approximate (--approximate) searches float32 vectors: leave out "
                "--embedding-precision, or build an exact index"
            )


@dataclass(kw_only=True)
class FirstStage:
    """The first stage of search and mine: which lists, and how hybrid search fuses them."""

    mode: str = option("dense", "first stage (default: dense)", choices=MODES)
    # z-scores: on 300 SQuAD questions, MRR@10 86.5 against reciprocal rank's 80.4, which fell
    # below full text alone (81.8; docs/search.md, benchmarks/results/postgres.md)
    fusion: str = option(
        "zscore",
        "hybrid: by each list's scores standardised per query and summed (zscore), or by "
        "reciprocal rank (rrf) (default: zscore)",
        choices=FUSIONS,
    )
    alpha: float = option(
        0.5, "hybrid: the dense list's weight, BM25's 1 - it (default: 0.5, equal)"
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(kw_only=True)
class QueryModel:
    """The model that embeds the queries (default: the one the index records) and the prompt
    before them (default: the one the index recorded)."""

    model: str | None = option(None, "the index's model at another path (checked to be the same)")
    prompt_name: str | None = option(None, _QUERY_PROMPT[0])
    prompt: str | None = option(None, _QUERY_PROMPT[1])

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(kw_only=True)
class SearchOptions:
    """How many hits per query, with what beside each, and their reranking: the first stage's
    top rerank_depth reordered by the cross-encoder `rerank`, or that order fused with the first
    stage's (rerank_fuse)."""

    top_k: int = option(10, "documents per query", min=1)
    text: bool = option(False, "each hit with its document's text")
    passage: bool = option(
        False,
        "each hit with its window nearest the query (its text span; index --window sets the "
        "windows' size)",
    )
    rerank: str | None = option(None, "rerank the first stage's top hits", metavar="CROSS_ENCODER")
    rerank_depth: int = option(50, "first-stage hits reranked")
    rerank_fuse: str | None = option(
        None,
        "with --rerank: the cross-encoder's order fused with the first stage's, by z-scores of "
        "the first stage's scores and the cross-encoder's raw ones, equal weights (zscore), or "
        f"by reciprocal rank (rrf); the flag alone: {RERANK_FUSION}; score: the fused one",
        choices=FUSIONS,
        const=RERANK_FUSION,
    )

    def __post_init__(self) -> None:
        if self.rerank and self.rerank_depth < self.top_k:
            raise ConfigError(f"--rerank-depth {self.rerank_depth} is below --top-k {self.top_k}")
        if self.rerank_fuse and not self.rerank:
            raise ConfigError("--rerank-fuse: needs --rerank CROSS_ENCODER")
        check_options(self)


@dataclass(kw_only=True)
class MineOptions:
    """Hard negatives per query: how many, from which candidates, which are left out (likely
    false negatives, near-copies of the positive), rows whose positive is not in the index, and
    a teacher cross-encoder that scores each group."""

    negatives: int = option(4, "hard negatives per query")
    skip: int = option(0, "candidates skipped at the top")
    depth: int = option(50, "candidates looked at per query")
    margin: float | None = option(
        None,
        "leave out candidates scored above the positive's score minus this (likely false "
        "negatives; dense or bm25)",
    )
    near_duplicate: float = option(
        NEAR_DUPLICATE,
        "leave out candidates whose word sets are this alike the positive's (Jaccard; a copy of "
        "it with small edits is no negative)",
    )
    missing: str = option(
        "error",
        "positives that are not documents of the index: stop (error), write no row for them "
        "(skip), or mine them guarded by --near-duplicate alone (keep)",
        choices=MISSING,
    )
    teacher: str | None = option(
        None,
        "score each group's pairs (the positive, then the negatives) by this cross-encoder's "
        'raw output, as "scores": what finetune --task rerank --rerank-loss margin-mse or '
        "listnet, or --task retrieval --teacher-weight W, learns from",
        metavar="CROSS_ENCODER",
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(kw_only=True)
class PgOptions:
    """A PostgreSQL index (postgres.py): its table, how dense search runs there (through the
    HNSW graph looking at ef_search candidates, more: better recall, slower; or exact), and how
    long a statement may run: a bound on every query, so a slow or locked database is an error
    (503 from serve) within that time, never a request that hangs."""

    table: str = option(
        "bertforge",
        "PostgreSQL: the documents' table (its windows and its model's record beside it, "
        "TABLE_windows and TABLE_index)",
    )
    ef_search: int = option(
        100,
        "PostgreSQL: HNSW candidates per query (at least 4 windows per hit asked for; more: "
        "better recall, slower)",
        min=1,
        max=EF_SEARCH_MAX,
    )
    exact: bool = option(False, "PostgreSQL: exact dense search (every window; no HNSW)")
    statement_timeout: float = option(
        60.0,
        "PostgreSQL: seconds a search's statement may run (a slow database, a table locked by "
        "another session) before it is canceled: an error, 503 from serve",
        above=0,
        max=3600,
    )
    partial: bool = option(
        False,
        "PostgreSQL: search a table whose build has not finished (stopped midway, or still "
        "running) as it is, its documents so far, with a warning (else an error)",
    )

    def __post_init__(self) -> None:
        check_options(self)


def parse_where(items: Sequence[str] | None) -> dict[str, str]:
    """`--where field=value` options as {field: value} (split at the first =)."""
    out = {}
    for item in items or ():
        field, equals, value = item.partition("=")
        if not equals or not field:
            raise ConfigError(f"--where {item!r}: must be FIELD=VALUE (a metadata field)")
        out[field] = value
    return out
