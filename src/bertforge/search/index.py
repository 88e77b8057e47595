"""The directory backend: a searchable corpus, dense vectors of a bi-encoder beside a BM25
index, searched exactly, by BM25, or both fused (`bertforge index`, `search`; mining.py mines
hard negatives from it, rerank.py reranks its hits).

    index = Index.build("all-MiniLM-L6-v2", "corpus.jsonl", "runs/idx")   # or bertforge index
    index = Index.load("runs/idx")
    index.search(["who wrote hamlet"], top_k=10, mode="hybrid")  # [[{id, score, rank}]]

The corpus is a text file (one document per line, its id the line number), JSONL objects with
an id and a text field, or a CSV/TSV table with a header naming them (corpus.py). Documents
are embedded in chunks of `chunk` documents, each chunk written as a part file when it is done
(no more than a chunk's texts and vectors are held while embedding, a sha256 of its files
written last), and a killed build resumes at the first part missing or not whole (its files not
the bytes its sha256 records: damaged since, it is made again); a part made with another model,
corpus or settings is refused. A
document longer than a window (`window` pieces, default the model's length) is cut into
overlapping windows (`stride` pieces apart, default half a window), each embedded on its own; a
document's score is its best window's (max inner product). Queries are read at the model's
length whatever the window. Windows shorter than the model's find a sentence in a long document
better (SQuAD's paragraphs: README, "Search and rerank").
The finished index holds vectors.npy (float32, the model's own normalisation), windows.npy
(each window's document), documents.jsonl (ids and texts), bm25/ (bm25s' files: arrays and
JSON, no pickle) and, written last, index.json: the model's identity (identity.py: a sha256 of
its config.json and weights, and what else makes its vectors: pooling, normalisation, length,
tokenizer), its embedding settings, the window settings, the counts and a sha256 of each of
the index's other files, all checked at every load (a file damaged or replaced in place, even by
one of the same shape, would give other documents with plausible scores). A search with another
model, or the same weights set up otherwise, is one error naming what differs.

Dense search is exact by default: the queries' vectors times every window's, in blocks of
queries and of windows (memory bounded for any corpus), the best window per document, the top
k (ties: the earlier document first). An index built with approximate="hnsw"
(`--approximate hnsw`, faiss) searches an HNSW graph of the windows instead (for millions of
vectors). Hybrid search fuses the dense and BM25 top-100 lists (top-k where more are asked
for): by their scores standardised per query (`fusion="zscore"`, the default, FirstStage's:
each list's z-scores, a document it leaves out given its lowest, summed; fusion.py) or by
reciprocal rank (`fusion="rrf"`, k = 60); `alpha` weighs the dense list against BM25's (0.5:
equal).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError, check_choice, need_extra
from ..fileio import (
    atomic_path,
    files_sha256,
    json_text,
    read_json,
    read_lines,
    sole_writer,
    write_json,
    write_text,
)
from ..runner import progress_bar, release_memory
from ..tasks.windows import windows_of
from .corpus import DEFAULT_FORMAT, CorpusFormat, corpus_file, read_search_corpus
from .fusion import FUSED, FUSIONS, best_columns, fuse_runs
from .identity import build_start, model_mismatch, query_pipeline
from .options import MODES, FirstStage, IndexOptions, PgOptions, QueryModel, SearchOptions
from .windows import chunks, cut_windows, embedded_windows

FORMAT = 1
QUERY_BLOCK = 1024  # queries scored against the corpus at once
WINDOW_BLOCK = 16_384  # windows scored at once per query block: (1024, 16384) floats, 64 MB
_BM25_EXTRA = "a BM25 index needs bm25s: pip install 'bertforge[search]' (or --no-bm25)"
_FAISS_EXTRA = "an approximate index needs faiss: pip install 'bertforge[search]' (or faiss-cpu)"


# -- building --------------------------------------------------------------------------------------


def bm25_tokens(texts: Sequence[str]) -> Any:
    import bm25s

    return bm25s.tokenize(list(texts), stopwords="en", show_progress=False)


def bm25_matches(docs: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bm25s' top k with the documents that share no word with the query (score 0: bm25s fills
    its k with them in index order) marked -1, none: they are not BM25's answers, and fused
    with a dense list they would add arbitrary documents."""
    unmatched = scores <= 0
    return np.where(unmatched, -1, docs), np.where(unmatched, 0.0, scores)


@dataclasses.dataclass
class Build:
    """A directory build under way (Index.begin): its directory, its settings (build.json's,
    then index.json's), its options, the model's pipeline and how many documents it reads. Its
    parts are written by write_part, here (Index.build) or by a cluster's workers
    (distributed.py), each named by its chunk's number; `finish` joins them."""

    out: Path
    settings: dict[str, Any]
    options: IndexOptions
    pipe: Any
    documents: int

    @property
    def cut(self) -> tuple[int, int, str]:
        """How a document is cut and read: (window, stride, the documents' prompt)."""
        s = self.settings
        return s["window"], s["stride"], s["document_prompt"]

    def part(self, k: int) -> Path:
        """Where chunk `k`'s part is written (its files: this path with their suffixes)."""
        return self.out / "parts" / f"{k:06d}"

    def finish(self, parts: int, documents: int) -> Index:
        """The index, once `parts` parts of `documents` documents are whole: parts numbered
        from `parts` on (left by a longer corpus before) removed, the rest joined."""
        for stale in (self.out / "parts").glob("*[0-9].npy"):
            if int(stale.stem) >= parts:
                for f in stale.parent.glob(f"{stale.stem}.*"):
                    f.unlink()
        o = self.options
        return Index.join(self.out, self.settings, documents, o.bm25, o.approximate)


class Index:
    """A built index directory (see the module docstring)."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path, self.meta = path, meta
        try:
            self.vectors = np.load(path / "vectors.npy", mmap_mode="r", allow_pickle=False)
            self.windows = np.load(path / "windows.npy", allow_pickle=False)
            spans = path / "spans.npy"  # an index built before spans were kept has none
            self.spans = (
                np.load(spans, mmap_mode="r", allow_pickle=False) if spans.is_file() else None
            )
            docs = [json.loads(line) for _, line in read_lines(path / "documents.jsonl")]
            self.ids = [d["id"] for d in docs]
            self.texts = [d["text"] for d in docs]
        except (ValueError, OSError, KeyError, TypeError, EOFError) as e:
            raise DataError(
                f"{path}: a corrupt or truncated index file ({e}): rebuild it"
            ) from None
        self.precision = meta.get("embedding_precision", "float32")  # of the stored vectors
        shape = (meta.get("vectors"), meta.get("dimensions"))
        stored = (shape[0], -(-shape[1] // 8)) if self.precision.endswith("binary") else shape
        self.ranges = None  # int8/uint8: the buckets' ends, (2, dimensions)
        if self.precision.endswith("int8"):
            self.ranges = _read_ranges(path / "ranges.npy", shape[1])
        if self.vectors.shape != stored or len(self.windows) != shape[0]:
            raise DataError(
                f"{path}: vectors.npy or windows.npy is not the size index.json says "
                f"({shape[0]} x {shape[1]}): a corrupt or truncated index; rebuild it"
            )
        if self.spans is not None and self.spans.shape != (shape[0], 2):
            raise DataError(f"{path}: spans.npy is not the size index.json says: rebuild it")
        if len(self.ids) != meta.get("documents"):
            raise DataError(f"{path}: documents.jsonl is not the size index.json says: rebuild it")
        # each document's windows, contiguous and in document order: 0 0 1 2 2 2 3 ...
        w = self.windows
        ranks = np.cumsum(np.diff(w, prepend=w[:1]) != 0)  # 0, then +1 wherever w changes
        if not np.array_equal(w, ranks) or len(self.ids) != (w[-1] + 1 if len(w) else 0):
            raise DataError(
                f"{path}: windows.npy does not number the documents in order: rebuild it"
            )
        # each document's windows are contiguous: the first window of each
        self.starts = np.flatnonzero(np.r_[True, self.windows[1:] != self.windows[:-1]])
        self.ends = np.r_[self.starts[1:], len(self.windows)]  # and one past its last
        self._pipe: Any = None
        # the text before each query (an index built before prompts: the model's default)
        self.query_prompt: str | None = meta.get("query_prompt")
        self._bm25: Any = None
        self._graph: Any = None  # the HNSW graph, read at the first approximate search

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        model: str | Path,
        corpus: str | Path,
        out: str | Path,
        *,
        fmt: CorpusFormat = DEFAULT_FORMAT,
        **options: Any,
    ) -> Index:
        """Build an index of `corpus` in `out` with the bi-encoder `model` (see the module
        docstring), resuming an unfinished build of the same settings there; `options`:
        IndexOptions' (chunk, window, stride, bm25, approximate, batch_size, precision, device,
        progress, prompt_name, prompt, embedding_precision). The documents get the prompt
        `prompt_name` or `prompt` names, else the model's document prompt
        (embedding.role_prompt); the queries will get its query prompt. embedding_precision
        int8, uint8, binary or ubinary keeps the vectors quantised (embedding.quantize: 4 or 32
        times smaller; int8/uint8 buckets from the corpus's own vectors), float queries scored
        against their stand-ins (embedding.dequantize)."""
        with sole_writer(out, "index build"):  # a second build on `out` meanwhile: refused
            build = cls.begin(model, corpus, out, fmt=fmt, **options)
            rows = read_search_corpus(Path(corpus), fmt)
            return build.finish(*_build_parts(build, rows))

    @classmethod
    def begin(
        cls,
        model: str | Path,
        corpus: str | Path,
        out: str | Path,
        *,
        fmt: CorpusFormat = DEFAULT_FORMAT,
        count: Callable[[], int] | None = None,
        **options: Any,
    ) -> Build:
        """A build started (or resumed) in `out`: build's first half, before any part is
        written. `corpus`: a corpus file (read once to count its documents), or, with `count`,
        the name of documents read elsewhere (a Ray Dataset: distributed.py), whose bytes are
        not recorded (each kept part is still checked against its documents)."""
        o = IndexOptions(**options)
        _need_extras(o)
        out = Path(out)
        corpus = Path(corpus) if count is None else corpus
        counted = count or (lambda: sum(1 for _ in read_search_corpus(Path(corpus), fmt)))
        pipe, record, documents = build_start(model, corpus, o, counted)
        file = isinstance(corpus, Path)
        settings = {
            "format": FORMAT,
            **record,
            "chunk": o.chunk,
            "precision": o.precision,  # queries are embedded as the documents were
            "corpus": str(corpus.resolve()) if file else str(corpus),  # type: ignore[union-attr]
            "corpus_sha256": files_sha256([corpus_file(corpus)]) if file else None,  # type: ignore[arg-type]
            "fields": [fmt.id_field, fmt.text_field, fmt.skip_blank],
            "embedding_precision": o.embedding_precision,
        }
        _start_build(out, settings)
        return Build(out, settings, o, pipe, documents)

    @classmethod
    def join(
        cls,
        out: Path,
        settings: dict[str, Any],
        documents: int,
        bm25: bool,
        approximate: str | None = None,
    ) -> Index:
        """The parts joined into the index's files; index.json written last."""
        parts = sorted((out / "parts").glob("*[0-9].npy"))
        sizes = [np.load(p, mmap_mode="r", allow_pickle=False).shape for p in parts]
        total, dim = sum(s[0] for s in sizes), sizes[0][1]
        _join_vectors(out, parts, settings["embedding_precision"])
        for name in ("owners", "spans"):  # windows.npy: each window's document; spans.npy
            joined = np.concatenate(
                [np.load(p.with_suffix(f".{name}.npy"), allow_pickle=False) for p in parts]
            )
            target = out / ("windows.npy" if name == "owners" else "spans.npy")
            with atomic_path(target) as tmp, open(tmp, "wb") as f:
                np.save(f, joined)
        with atomic_path(out / "documents.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            for p in parts:
                f.write(p.with_suffix(".jsonl").read_text(encoding="utf-8"))
        if bm25:
            _write_bm25(out)
        if approximate:
            _write_hnsw(out / "vectors.npy", out / "hnsw.faiss")
        meta = {**settings, "documents": documents, "vectors": int(total), "dimensions": int(dim)}
        meta["bm25"], meta["approximate"] = bm25, approximate
        meta["files_sha256"] = {
            name: files_sha256([out / name]) for name in _index_files(out, meta)
        }
        write_json(out / "index.json", meta)
        shutil.rmtree(out / "parts")
        (out / "build.json").unlink()
        return cls.load(out)

    @classmethod
    def load(cls, path: str | Path) -> Index:
        path = Path(path)
        if not (path / "index.json").is_file():
            what = "an unfinished index (run bertforge index again to finish it)"
            raise DataError(
                f"{path}: {what if (path / 'build.json').is_file() else 'not an index'}"
            )
        meta = read_json(path / "index.json", DataError)
        if meta.get("format") != FORMAT:
            raise DataError(f"{path}/index.json: format {meta.get('format')!r}, expected {FORMAT}")
        for name in ("vectors.npy", "windows.npy", "documents.jsonl"):
            if not (path / name).is_file():
                raise DataError(f"{path}: {name} missing: rebuild the index")
        _check_files(path, meta)
        return cls(path, meta)

    def ready(self) -> None:
        """Nothing: loaded, it searches in memory (PgIndex.ready checks its database)."""

    # -- searching -----------------------------------------------------------------------------

    def use_model(self, model: str | Path | None = None, **pipeline: Any) -> Any:
        """The pipeline that embeds queries: `model`, or the model index.json records (a
        relative path read from the index's directory), checked to be the one the index was
        built with (identity.query_pipeline)."""
        if self._pipe is None or model is not None:
            recorded = self.path / self.meta["model"]
            self._pipe = query_pipeline(self.path, self.meta, recorded, model, **pipeline)
        return self._pipe

    def documents(self) -> Iterator[tuple[int, str, str]]:
        """(number, id, text) of each document, in order (mining's positives are found so)."""
        return ((d, i, t) for d, (i, t) in enumerate(zip(self.ids, self.texts)))

    def texts_of(self, numbers: Iterable[int]) -> dict[int, str]:
        """{number: text} of the documents numbered (mining reads its candidates' so)."""
        return {d: self.texts[d] for d in numbers}

    def stored(self, start: int, stop: int) -> np.ndarray:
        """float32 (stop - start, dimensions): windows' vectors, or their quantised vectors'
        stand-ins (embedding.dequantize), to score float queries against."""
        from ..embedding import dequantize

        block = np.asarray(self.vectors[start:stop])
        return dequantize(block, self.precision, self.meta["dimensions"], self.ranges)

    def queries(self, queries: Sequence[str]) -> np.ndarray:
        """The queries' vectors: the index's model, with the queries' prompt (query_prompt:
        the model's, as the index recorded it, unless changed)."""
        return self.use_model().embed(list(queries), prompt=self.query_prompt)

    def adopt(self, pipe: Any) -> list[str]:
        """Embed queries with `pipe` (a Pipeline already loaded: the server's), if it is the
        index's model in the index's precision; what differs, in words (identity.model_mismatch;
        empty: adopted)."""
        differs = model_mismatch(pipe, self.meta)
        if not differs:
            self._pipe = pipe
        return differs

    def dense(
        self, queries: Sequence[str], k: int, vectors: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(documents, scores) of each query's top k by its best window's inner product;
        through the HNSW graph when the index has one (`vectors`: the queries' already)."""
        q = self.queries(queries) if vectors is None else vectors
        k = min(k, len(self.ids))
        if self.meta.get("approximate"):
            return self._hnsw(q, k)
        # documents in blocks of about WINDOW_BLOCK windows (a document's windows stay together)
        cuts = [0]
        while cuts[-1] < len(self.starts):
            fit = int(np.searchsorted(self.ends, self.starts[cuts[-1]] + WINDOW_BLOCK, "right"))
            cuts.append(max(fit, cuts[-1] + 1))
        docs, scores = [], []
        for start in range(0, len(q), QUERY_BLOCK):
            block = q[start : start + QUERY_BLOCK]
            best_d = np.zeros((len(block), 0), np.int64)  # (b, <= k) the best documents so far
            best_s = np.zeros((len(block), 0), np.float32)
            for d0, d1 in pairwise(cuts):
                w0, w1 = self.starts[d0], self.ends[d1 - 1]
                sims = block @ self.stored(w0, w1).T  # (b, windows of the block)
                per_doc = np.maximum.reduceat(sims, self.starts[d0:d1] - w0, axis=1)  # (b, docs)
                # the best so far (earlier documents) first: column order is document order
                cand_s = np.concatenate([best_s, per_doc], 1)
                cand_d = np.concatenate(
                    [best_d, np.broadcast_to(np.arange(d0, d1), per_doc.shape)], 1
                )
                keep = best_columns(cand_s, k)
                best_d = np.take_along_axis(cand_d, keep, 1)
                best_s = np.take_along_axis(cand_s, keep, 1)
            docs.append(best_d)
            scores.append(best_s)
        return np.concatenate(docs), np.concatenate(scores)

    def _hnsw(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Approximate: the HNSW graph's nearest windows (4 k of them, at least 64 looked at),
        each document scored by its best window among them."""
        if self._graph is None:
            self._graph = self._read_graph()
        n = min(len(self.windows), 4 * k)
        self._graph.hnsw.efSearch = max(64, n)
        sims, found = self._graph.search(np.ascontiguousarray(q, np.float32), n)
        docs = np.full((len(q), k), -1, np.int64)
        scores = np.zeros((len(q), k), np.float32)
        for i, (row_s, row_w) in enumerate(zip(sims, found)):
            best: dict[int, float] = {}
            for s, w in zip(row_s.tolist(), row_w.tolist()):
                if w >= 0 and int(self.windows[w]) not in best:  # windows come best first
                    best[int(self.windows[w])] = s
            top = list(best.items())[:k]
            docs[i, : len(top)] = [d for d, _ in top]
            scores[i, : len(top)] = [s for _, s in top]
        return docs, scores

    def _read_graph(self) -> Any:
        """The HNSW graph (faiss), checked to hold one node per window."""
        faiss = need_extra("faiss", _FAISS_EXTRA)
        where = self.path / "hnsw.faiss"
        try:
            graph = faiss.read_index(str(where))
        except RuntimeError as e:  # faiss's every error: a missing, truncated or foreign file
            first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DataError(
                f"{where}: a missing, corrupt or truncated graph ({first}): rebuild the index"
            ) from None
        if graph.ntotal != len(self.windows) or not hasattr(graph, "hnsw"):
            raise DataError(
                f"{where}: not an HNSW graph of this index's {len(self.windows):,} windows: "
                "rebuild the index"
            )
        return graph

    def _bm25_index(self) -> Any:
        """The BM25 index (bm25s), loaded at its first use."""
        if not self.meta.get("bm25"):
            raise ConfigError(f"{self.path}: built without a BM25 index (--no-bm25)")
        if self._bm25 is None:
            try:
                bm25s = need_extra("bm25s", _BM25_EXTRA)
                index = bm25s.BM25.load(str(self.path / "bm25"), mmap=True)
                why = "" if _bm25_fits(index.scores, len(self.ids)) else "its numbers do not fit"
            except (ValueError, OSError, KeyError, TypeError, EOFError, IndexError) as e:
                why = str(e) or type(e).__name__
            if why:
                raise DataError(
                    f"{self.path}/bm25: a missing, corrupt or truncated BM25 file ({why}): "
                    "rebuild the index"
                )
            self._bm25 = index
        return self._bm25

    def bm25(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        index, k = self._bm25_index(), min(k, len(self.ids))
        docs, scores = index.retrieve(bm25_tokens(queries), k=k, show_progress=False)
        return bm25_matches(np.asarray(docs), np.asarray(scores))

    def search(
        self,
        queries: Sequence[str],
        top_k: int = SearchOptions.top_k,
        mode: str = FirstStage.mode,
        text: bool = SearchOptions.text,
        fusion: str = FirstStage.fusion,
        alpha: float = FirstStage.alpha,
        passage: bool = SearchOptions.passage,
        where: Mapping[str, str] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Per query, its top_k documents: [{"id", "score", "rank"} (+ "text", + "passage")];
        hybrid fused by `fusion`, the dense list weighed `alpha` and BM25's 1 - alpha; with
        `passage`, each hit's window nearest the query (see passages). `where` (metadata
        filters) is the PostgreSQL backend's: a directory index keeps no metadata."""
        if where:
            raise ConfigError(
                f"{self.path}: where (--where): a directory index keeps no metadata to filter "
                "on; index into PostgreSQL (index --to DSN) to filter"
            )
        if isinstance(queries, str):
            raise ConfigError("pass a list of queries (a single string is not a list)")
        check_choice("mode", mode, MODES, "--mode")
        if top_k < 1:
            raise ConfigError(f"top_k={top_k} (--top-k): must be >= 1")
        if not queries:
            return []
        vectors = self.queries(queries) if passage else None  # embedded once
        docs, scores = self.ranked(queries, top_k, mode, fusion, alpha, vectors)
        hits = [  # (document, score) of each query, -1 (none) left out
            [(d, s) for d, s in zip(row_d.tolist(), row_s.tolist()) if d >= 0]
            for row_d, row_s in zip(docs, scores)
        ]
        if passage:
            spans = self.passages(queries, [[d for d, _ in row] for row in hits], vectors)
        return [
            [
                {
                    "id": self.ids[d],
                    "score": float(s),
                    "rank": r,
                    **({"text": self.texts[d]} if text else {}),
                    **({"passage": spans[q][r - 1]} if passage else {}),
                }
                for r, (d, s) in enumerate(row, 1)
            ]
            for q, row in enumerate(hits)
        ]

    def passages(
        self,
        queries: Sequence[str],
        docs: Sequence[Sequence[int]],
        vectors: np.ndarray | None = None,
    ) -> list[list[str]]:
        """For each query, the text of each of its documents' window whose vector is nearest the
        query's (the one that scored the document in dense search): the document's own
        characters from the window's first word to its last, a word cut by the window's edge
        given whole (the whole text when it is one window), as the build recorded them
        (spans.npy; an index built before it had them cuts its documents again).
        `vectors`: the queries' already."""
        q = self.queries(queries) if vectors is None else vectors
        out = []
        for vector, row in zip(q, docs):
            found = []
            for d in row:
                if self.ends[d] - self.starts[d] == 1:  # one window: the whole text
                    found.append(self.texts[d])
                    continue
                best = int(np.argmax(self.stored(self.starts[d], self.ends[d]) @ vector))
                a, b = self._spans(d)[best]
                found.append(self.texts[d][a:b])
            out.append(found)
        return out

    def _spans(self, d: int) -> np.ndarray:
        """(windows, 2): the characters of document d's windows, its words whole."""
        if self.spans is not None:
            return np.asarray(self.spans[self.starts[d] : self.ends[d]])
        (pieces,) = self.use_model().tok.encode_long([self.texts[d]])
        windows = windows_of(len(pieces.ids), self.meta["window"], self.meta["stride"])
        if len(windows) != self.ends[d] - self.starts[d]:
            raise DataError(
                f"{self.path}: the model's tokenizer cuts document {self.ids[d]!r} into "
                f"{len(windows)} windows where the index holds {self.ends[d] - self.starts[d]}: "
                "rebuild the index"
            )
        return np.array([pieces.span(a, a + n) for a, n in windows], np.int64)

    def scores_of(self, queries: Sequence[str], docs: Sequence[int], mode: str) -> np.ndarray:
        """Each query's score of one document (docs[i] for queries[i]) as `mode` scores it (BM25:
        0 for a query with no words left once tokenized, stopwords only, as search scores it)."""
        if mode == "dense":
            q = self.queries(queries)
            spans = [(self.starts[d], self.ends[d]) for d in docs]
            return np.array([float((self.stored(a, b) @ v).max()) for v, (a, b) in zip(q, spans)])
        bm25 = self._bm25_index()
        tokenize = need_extra("bm25s", _BM25_EXTRA).tokenize
        words = tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        # bm25s' get_scores fails on no words (it reads the first to tell strings from ids)
        return np.array([float(bm25.get_scores(w)[d]) if w else 0.0 for w, d in zip(words, docs)])

    def ranked(
        self,
        queries: Sequence[str],
        k: int,
        mode: str,
        fusion: str = FirstStage.fusion,
        alpha: float = FirstStage.alpha,
        vectors: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(document indices, scores) of each query's top k by `mode` (-1: none there;
        `vectors`: the queries' already, for dense search)."""
        check_choice("fusion", fusion, FUSIONS, "--fusion")
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha={alpha} (--alpha): must be between 0 and 1")
        if mode == "dense":
            return self.dense(queries, k, vectors)
        if mode == "bm25":
            return self.bm25(queries, k)
        n = max(FUSED, k)  # each list at least as deep as the hits asked for
        runs = [self.dense(queries, n, vectors), self.bm25(queries, n)]
        return fuse_runs(runs, fusion, alpha, k)


def open_index(path: str | Path, pg: PgOptions | None = None, **options: Any) -> Any:
    """The index at `path` as search and mine use it: a directory (Index), or a PostgreSQL DSN
    (postgresql://...: postgres.PgIndex, `pg` its table and search settings); `options`:
    QueryModel's. Its model checked (`model`: the index's model at another path), its queries'
    prompt as `prompt_name` / `prompt` say (default: the one the index recorded)."""
    from ..embedding import prompt_text

    o = QueryModel(**options)
    index = load_index(path, pg)
    pipe = index.use_model(o.model)
    if o.prompt_name is not None or o.prompt is not None:
        index.query_prompt = prompt_text(pipe.embedding_settings, o.prompt_name, o.prompt)
    return index


def load_index(path: str | Path, pg: PgOptions | None = None, pool: int = 1) -> Any:
    """The index an index argument names (search, mine, serve --index): a PostgreSQL DSN
    (pgsql.is_dsn: postgres.PgIndex, `pg` its table and search settings, `pool` connections),
    else a directory (Index), which takes none of pg's settings (one ConfigError)."""
    from .postgres import PgIndex, is_dsn

    if is_dsn(path):
        return PgIndex.open(str(path), pg or PgOptions(), pool)
    if pg is not None and pg != PgOptions():
        *most, last = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(PgOptions)]
        raise ConfigError(
            f"{path}: {', '.join(most)} and {last} are a PostgreSQL index's (a DSN: postgresql://... or host=... "
            "dbname=...); a directory index takes none"
        )
    return Index.load(path)


def _join_vectors(out: Path, parts: Sequence[Path], precision: str, block: int = 65_536) -> None:
    """vectors.npy: the parts' float vectors, or quantised (embedding.quantize) with, for
    int8/uint8, the buckets' ends over all of them in ranges.npy; a block at a time."""
    from ..embedding import quantize

    tables = [np.load(p, mmap_mode="r", allow_pickle=False) for p in parts]
    total, dim = sum(len(t) for t in tables), tables[0].shape[1]
    ranges = None
    if precision.endswith("int8"):
        lows = [t[a : a + block].min(0) for t in tables for a in range(0, len(t), block)]
        highs = [t[a : a + block].max(0) for t in tables for a in range(0, len(t), block)]
        ranges = np.stack([np.min(lows, 0), np.max(highs, 0)]).astype(np.float32)
        with atomic_path(out / "ranges.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, ranges)
    sample = quantize(np.zeros((1, dim), np.float32), precision, ranges=ranges)
    with atomic_path(out / "vectors.npy") as tmp:
        joined = np.lib.format.open_memmap(tmp, "w+", sample.dtype, (total, sample.shape[1]))
        at = 0
        for t in tables:
            for a in range(0, len(t), block):
                chunk = quantize(np.asarray(t[a : a + block]), precision, ranges=ranges)
                joined[at : at + len(chunk)] = chunk
                at += len(chunk)
        joined.flush()
        del joined


def _read_ranges(path: Path, dimensions: int) -> np.ndarray:
    """An int8/uint8 index's ranges.npy: (2, dimensions) float32."""
    try:
        ranges = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: missing or corrupt ({e}): rebuild the index") from None
    if ranges.shape != (2, dimensions) or ranges.dtype.kind != "f":
        raise DataError(f"{path}: not the quantisation ranges of this index: rebuild it")
    return ranges


def _index_files(out: Path, meta: Mapping[str, Any]) -> list[str]:
    """The files of a finished index (relative to it) whose sha256 index.json records."""
    names = ["vectors.npy", "windows.npy", "spans.npy", "documents.jsonl"]
    if meta["embedding_precision"].endswith("int8"):
        names.append("ranges.npy")
    if meta["bm25"]:
        names += sorted(f"bm25/{f.name}" for f in (out / "bm25").iterdir() if f.is_file())
    if meta["approximate"]:
        names.append("hnsw.faiss")
    return names


def _check_files(path: Path, meta: Mapping[str, Any]) -> None:
    """Each file index.json records a sha256 of (_index_files), whole and unchanged, before
    anything is read from it: a file damaged or replaced in place by one of the same shape
    (its rows reversed) passes every other check and gives other documents with plausible
    scores. An index built before the digests were recorded: a warning, nothing checked."""
    recorded = meta.get("files_sha256")
    if recorded is None:
        warnings.warn(
            f"{path}: built before bertforge recorded its files' sha256 in index.json, so they "
            "are not checked (a file damaged in place goes unnoticed); rebuild it to have them "
            "checked",
            stacklevel=3,
        )
        return
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise DataError(f"{path}/index.json: files_sha256 is not {{file: sha256}}: rebuild it")
    for name, digest in recorded.items():
        f = path / name
        if Path(name).is_absolute() or ".." in Path(name).parts or not f.is_file():
            raise DataError(f"{f}: missing, or not a file of the index: rebuild the index")
        if files_sha256([f]) != digest:
            raise DataError(
                f"{f}: not the file this index was built with (its sha256 is not the one "
                "index.json records): damaged or replaced; rebuild the index"
            )


def _bm25_fits(scores: dict[str, Any], documents: int) -> bool:
    """Whether bm25s' sparse matrix (CSC: per word, its documents and scores) is whole and
    numbers `documents` documents: a document number past them would be an IndexError at
    search time."""
    indptr, indices, data = scores["indptr"], scores["indices"], scores["data"]
    return (
        int(scores["num_docs"]) == documents
        and len(indices) == len(data) == (int(indptr[-1]) if len(indptr) else 0)
        and bool(np.all(np.diff(indptr) >= 0))
        and (not len(indices) or (int(np.min(indices)) >= 0 and int(np.max(indices)) < documents))
    )


def _write_hnsw(vectors: Path, out: Path, block: int = 65_536) -> None:
    """An HNSW graph (32 links per node, efConstruction 200, inner product) over the vectors,
    added a block at a time from the memory-mapped file; written atomically."""
    faiss = need_extra("faiss", _FAISS_EXTRA)
    data = np.load(vectors, mmap_mode="r", allow_pickle=False)
    graph = faiss.IndexHNSWFlat(data.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = 200
    for start in range(0, len(data), block):
        graph.add(np.ascontiguousarray(data[start : start + block], np.float32))
    with atomic_path(out) as tmp:
        faiss.write_index(graph, str(tmp))


# -- building: the parts ---------------------------------------------------------------------------


def _need_extras(o: IndexOptions) -> None:
    """The optional extras a build's options need, installed (IndexOptions checked the rest)."""
    if o.bm25:
        need_extra("bm25s", _BM25_EXTRA)
    if o.approximate:
        need_extra("faiss", _FAISS_EXTRA)


# settings a resumed build may change: the corpus's bytes (each kept part is checked against
# its documents, and redone if they changed)
_RESUMABLE = ("corpus_sha256",)


def _start_build(out: Path, settings: dict[str, Any]) -> None:
    """Start or resume a build in `out`: a finished index, another build's unfinished one, a
    directory of other files or parts that are a link elsewhere are refused."""
    if (out / "index.json").is_file():
        raise ConfigError(f"{out}: already holds a finished index; give a new --out")
    started = out / "build.json"
    if started.is_file():
        before = read_json(started, DataError)
        changed = [k for k in settings if k not in _RESUMABLE and before.get(k) != settings[k]]
        if changed:
            raise ConfigError(
                f"{out}: an unfinished index of another build ({', '.join(changed)} differ); "
                "give a new --out, or remove it"
            )
    elif out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not an index being built; give a new --out")
    if (out / "parts").is_symlink():
        raise DataError(f"{out / 'parts'}: a link; an index writes its parts in itself")
    write_json(started, settings)
    (out / "parts").mkdir(parents=True, exist_ok=True)


def _build_parts(build: Build, documents: Iterator[tuple[str, str]]) -> tuple[int, int]:
    """The parts of a build, `chunk` documents each, written in this process (a part already
    whole for the same documents kept): (how many parts, how many documents)."""
    bar = progress_bar("index", build.documents, "documents") if build.options.progress else None
    done = parts = 0
    for k, docs in enumerate(chunks(documents, build.options.chunk)):
        write_part(build.part(k), build.pipe, docs, done, build.cut, bar)
        done, parts = done + len(docs), k + 1
        if bar is not None:  # the part's documents, however many windows it had
            bar.update(done - bar.n)
    if bar is not None:
        bar.close()
    return parts, done


def write_part(
    part: Path,
    pipe: Any,
    docs: list[tuple[str, str]],
    first: int,
    cut: tuple[int, int, str],
    bar: Any = None,
) -> int:
    """One chunk's part: documents (.jsonl), each window's document (.owners.npy, numbered from
    `first`) and characters (.spans.npy), vectors (.npy), and, written last, a sha256 of those
    four (.sha256): the part is whole. A part already whole for the same documents is kept;
    any other is made again, its record removed first, so that a build killed while making it,
    or a part damaged since (truncated, overwritten: once a traceback from np.load, or joined
    into the index), is never taken for whole. Every file is written atomically: a part
    written twice at once (a cluster's task retried while the first still runs) ends whole
    either way. How many windows it holds; `bar` (None: none): a bar over the documents,
    moved by this part's share of its windows as they are embedded."""
    listing = "".join(json_text({"id": i, "text": t}) + "\n" for i, t in docs)
    vectors, record = part.with_suffix(".npy"), part.with_suffix(".sha256")
    if _part_whole(part, listing):
        return int(np.load(vectors, mmap_mode="r", allow_pickle=False).shape[0])
    pieces, owners, starts, lengths, spans = cut_windows(pipe, [t for _, t in docs], *cut[:2])
    record.unlink(missing_ok=True)
    write_text(part.with_suffix(".jsonl"), listing)
    for name, array in {"owners": owners + first, "spans": spans}.items():
        with atomic_path(part.with_suffix(f".{name}.npy")) as tmp, open(tmp, "wb") as f:
            np.save(f, array)
    with atomic_path(vectors) as tmp:
        table, a = None, 0
        for block in embedded_windows(pipe, pieces, owners, starts, lengths, cut[2]):
            if table is None:
                shape = (len(owners), block.shape[1])
                table = np.lib.format.open_memmap(tmp, "w+", np.float32, shape)
            table[a : a + len(block)] = block
            a += len(block)
            if bar is not None:  # the documents' share of the windows embedded
                bar.update(first + len(docs) * a // len(owners) - bar.n)
        table.flush()  # type: ignore[union-attr]
        del table
    write_text(record, files_sha256(_part_files(part)))
    release_memory()  # what the chunk's batches used, before the next one
    return len(owners)


def _part_files(part: Path) -> list[Path]:
    """A part's files, as its .sha256 hashes them."""
    return [part.with_suffix(s) for s in (".jsonl", ".owners.npy", ".spans.npy", ".npy")]


def _part_whole(part: Path, listing: str) -> bool:
    """Whether a part is whole for the documents `listing` lists: its record written and its
    files still the bytes it records."""
    record, files = part.with_suffix(".sha256"), _part_files(part)
    return (
        record.is_file()
        and all(f.is_file() for f in files)
        and files[0].read_bytes() == listing.encode("utf-8")
        and record.read_bytes() == files_sha256(files).encode()
    )


def _write_bm25(out: Path) -> None:
    """bm25/: the documents' BM25 index (bm25s), saved in a new hidden directory and renamed
    (a leftover or a planted link from a killed build is never written through)."""
    import tempfile

    texts = [json.loads(line)["text"] for _, line in read_lines(out / "documents.jsonl")]
    retriever = need_extra("bm25s", _BM25_EXTRA).BM25()
    retriever.index(bm25_tokens(texts), show_progress=False)
    for old in out.glob(".bm25.*"):  # a killed build's: remove the link or the directory
        old.unlink() if old.is_symlink() or not old.is_dir() else shutil.rmtree(old)
    tmp_dir = Path(tempfile.mkdtemp(prefix=".bm25.", dir=out))
    retriever.save(str(tmp_dir))
    if (out / "bm25").is_symlink() or (out / "bm25").is_file():
        (out / "bm25").unlink()
    shutil.rmtree(out / "bm25", ignore_errors=True)
    tmp_dir.rename(out / "bm25")
