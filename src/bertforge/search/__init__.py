"""Search: an index of a corpus, searched by a bi-encoder's vectors, BM25 or both fused; its
hits reranked by a cross-encoder; hard negatives mined from it. Library functions the command
line (`bertforge index`, `search`, `mine`), the server's /search and Python users call alike.

    from bertforge.search import Index, mine, rerank
    index = Index.build("all-MiniLM-L6-v2", "corpus.jsonl", "runs/idx")  # or Index.load
    hits = index.search(["who wrote hamlet"], top_k=50, mode="hybrid", text=True)
    best = rerank("runs/ce", ["who wrote hamlet"], hits, top_k=10)

    options.py   the options of building, searching and mining (defaults, help, allowed values)
    corpus.py    reading a corpus file: (id, text) documents from text lines, JSONL or a table
    identity.py  what an index records of its model (a sha256 of its files), its prompts
    windows.py   a document's windows (index --window): their settings, cutting, embedding
    index.py     the directory backend: building (resumable parts), dense/BM25/hybrid search
    postgres.py  the PostgreSQL backend (pgvector): built, changed in place and searched there
    pgsql.py     its SQL side: the DSN (never shown with its password), a pool, checked names
    fusion.py    reciprocal-rank and score fusion of ranked lists
    mining.py    hard negatives for retrieval training, scored by a teacher if asked
    rerank.py    a first stage's hits reordered (or fused) by a cross-encoder
    evaluation.py  a search scored against relevance judgements (search --qrels, BEIR sets)
"""

from ..checkpoint import model_identity
from .corpus import CorpusFormat, read_search_corpus
from .evaluation import Judged, SearchScores, score_search
from .fusion import FUSIONS, RRF_K, fuse, fuse_runs, fuse_scores
from .index import Index, open_index
from .mining import (
    Mined,
    mine,
    mine_examples,
    mine_groups,
    mined_groups,
    mining_report,
    score_groups,
)
from .options import (
    MISSING,
    MODES,
    NEAR_DUPLICATE,
    FirstStage,
    IndexOptions,
    MineOptions,
    PgOptions,
    QueryModel,
    SearchOptions,
    parse_where,
)
from .rerank import rerank, search_queries, searched

__all__ = [
    "FUSIONS",
    "MISSING",
    "MODES",
    "NEAR_DUPLICATE",
    "RRF_K",
    "CorpusFormat",
    "FirstStage",
    "Index",
    "IndexOptions",
    "Judged",
    "MineOptions",
    "Mined",
    "PgOptions",
    "QueryModel",
    "SearchOptions",
    "SearchScores",
    "fuse",
    "fuse_runs",
    "fuse_scores",
    "mine",
    "mine_examples",
    "mine_groups",
    "mined_groups",
    "mining_report",
    "model_identity",
    "open_index",
    "parse_where",
    "read_search_corpus",
    "rerank",
    "score_groups",
    "score_search",
    "search_queries",
    "searched",
]
