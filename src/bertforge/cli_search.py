"""The search verbs of the command line: index, search, mine (cli.py's table lists them; their
options are the search package's, search/options.py)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .options import INFERENCE_HELP, add_no_progress, add_options, changed_options, options_of


def args_index(p: argparse.ArgumentParser) -> None:
    from .distributed import RayOptions
    from .search import CorpusFormat, IndexOptions, PgOptions

    p.add_argument("model", help="bi-encoder (embedding model) directory")
    p.add_argument(
        "corpus",
        nargs="?",
        help="documents: text lines, .jsonl or .csv/.tsv with id and text (other fields: "
        "metadata, kept in PostgreSQL)",
    )
    p.add_argument("--out", help="index directory (re-run to resume a build)")
    p.add_argument(
        "--to",
        nargs="?",
        const="",
        metavar="DSN",
        help="a PostgreSQL database (postgresql://user@host/db or host=... dbname=...; alone: "
        "$DATABASE_URL or the PG* environment) instead of --out: re-run with a changed corpus to update it in place",
    )
    p.add_argument(
        "--delete",
        metavar="IDS_FILE",
        help="with --to: remove these documents (one id a line) instead of indexing a corpus",
    )
    add_options(p, PgOptions, skip=("ef_search", "exact", "statement_timeout", "partial"))
    add_options(p, CorpusFormat)
    add_options(p, IndexOptions, help=INFERENCE_HELP)
    add_options(p, RayOptions)


def cmd_index(args: argparse.Namespace) -> None:
    from .fileio import refuse_overwrite
    from .search import CorpusFormat, Index, IndexOptions, PgOptions

    fmt = CorpusFormat(**options_of(args, CorpusFormat))
    _ray_options(args)  # first: `--ray CORPUS` took the corpus as its address
    if args.to is not None:
        return _index_postgres(args, fmt)
    wrong = args.delete is not None or changed_options(args, PgOptions)  # --to's options
    if args.out is None or args.corpus is None or wrong:
        raise ConfigError(
            "index MODEL CORPUS --out DIR, or --to DSN (PostgreSQL, --table T; with --delete "
            "IDS_FILE to remove documents): a directory index is built whole, not changed"
        )
    refuse_overwrite(args.out, {"model": args.model, "corpus": args.corpus}, "--out")
    index = _builder(args, Index.build)(
        args.model, args.corpus, args.out, fmt=fmt, **options_of(args, IndexOptions)
    )
    m = index.meta
    print(
        f"indexed {m['documents']:,} documents ({m['vectors']:,} windows of {m['dimensions']} "
        f"dimensions{', and BM25' if m['bm25'] else ''}) in {args.out}"
    )


def _builder(args: argparse.Namespace, here: Any) -> Any:
    """The build of index: `here` (Index.build, PgIndex.build), or with --ray a Ray cluster's
    (distributed.index_corpus: the same arguments, the same index)."""
    from .distributed import index_corpus

    ray = _ray_options(args)
    return here if ray.address is None else functools.partial(index_corpus, ray=ray)


def _ray_options(args: argparse.Namespace) -> Any:
    """index's --ray options (distributed.RayOptions), checked: the address's form, and the
    shape of workers only with --ray."""
    from .distributed import RayOptions

    ray = RayOptions(**options_of(args, RayOptions))
    if ray.address is None and changed_options(args, RayOptions):
        raise ConfigError("--workers, --cpus-per-worker and --gpus-per-worker need --ray")
    return ray


def _index_postgres(args: argparse.Namespace, fmt: Any) -> None:
    """index --to DSN: a corpus upserted into the table, or --delete's ids removed from it."""
    from .search import IndexOptions, PgOptions
    from .search.postgres import PgIndex, read_ids

    if args.out is not None or (args.corpus is None) == (args.delete is None):
        raise ConfigError("index MODEL CORPUS --to DSN, or index MODEL --to DSN --delete IDS_FILE")
    pg = PgOptions(**options_of(args, PgOptions))
    if args.delete is not None:  # no search: a table whose build has not finished takes it
        index = PgIndex.open(args.to, dataclasses.replace(pg, partial=True))
        index.use_model(args.model)  # the table's model, checked
        removed = index.delete(read_ids(args.delete))
        absent, first = index.absent
        more = f" and {absent - len(first):,} more" if absent > len(first) else ""
        named = f"; {absent:,} id{'s' * (absent != 1)} not in the table: {', '.join(first)}{more}"
        print(f"deleted {removed:,} documents from {index.path}{named if absent else ''}")
    else:
        options = options_of(args, IndexOptions)
        build = _builder(args, PgIndex.build)
        index = build(args.model, args.corpus, args.to, table=pg.table, fmt=fmt, **options)
        docs, windows = index.count()
        said = ", ".join(f"{v:,} {k}" for k, v in index.written.items())
        totals = f"{docs:,} documents, {windows:,} windows"
        print(f"indexed {args.corpus} into {index.path} ({said}): {totals}")
    index.close()


def _search_args(p: argparse.ArgumentParser) -> None:
    from .search import FirstStage, PgOptions, QueryModel

    p.add_argument(
        "index",
        help="index directory (bertforge index), or a PostgreSQL DSN (postgresql://... or "
        "host=... dbname=...; postgresql:// alone: $DATABASE_URL or the PG* environment) with "
        "--table",
    )
    add_options(p, FirstStage)
    add_options(p, QueryModel)
    add_options(p, PgOptions)


def _open_index(args: argparse.Namespace, **inputs: str | None) -> Any:
    """The index of search and mine; their --out refused first when it lies inside the index or
    the command's other `inputs`, then inside the index's model, once that is known."""
    from .fileio import refuse_overwrite
    from .search import PgOptions, QueryModel, open_index

    refuse_overwrite(args.out, {"index": args.index, **inputs}, "--out")
    pg = PgOptions(**options_of(args, PgOptions))
    index = open_index(args.index, pg, **options_of(args, QueryModel))
    # the corpus a directory index was built from is not read, but written over it is lost
    source = getattr(index, "meta", {}).get("corpus")
    refuse_overwrite(
        args.out, {"index's model": index.use_model().path, "index's corpus": source}, "--out"
    )
    return index


def args_search(p: argparse.ArgumentParser) -> None:
    from .search import SearchOptions

    _search_args(p)
    p.add_argument(
        "queries",
        nargs="?",
        help="text lines, .jsonl {text, id?}, a BEIR set's directory (its queries.jsonl), or - "
        "(default: stdin; with --qrels DIR, the set's judged queries)",
    )
    add_options(p, SearchOptions)
    p.add_argument(
        "--where",
        action="append",
        metavar="FIELD=VALUE",
        help="PostgreSQL: only documents whose metadata FIELD is VALUE (again: all of them)",
    )
    p.add_argument("--skip-blank", action="store_true", help="drop blank lines (default: error)")
    p.add_argument(
        "--out",
        help="JSONL output file (default: stdout, a row as each is ready; with --qrels: none)",
    )
    p.add_argument(
        "--qrels",
        metavar="FILE_OR_DIR[:SPLIT]",
        help="score the search against these judgements (BEIR's qrels TSV, or a BEIR set's "
        "directory: its split SPLIT, default test, and its queries): print MRR@10, nDCG@10 and "
        "recall@1/10/100 (with --rerank: the first stage's beside the reranked ones)",
    )
    p.add_argument("--metrics-out", metavar="FILE", help="with --qrels: the scores as JSON")
    add_no_progress(p)


def cmd_search(args: argparse.Namespace) -> None:
    """Per query line: {"line", "id"?, "query", "results": [{id, score, rank, text?,
    passage?}]}; with --rerank, the first stage's top --rerank-depth reordered by the
    cross-encoder's score (with --rerank-fuse: by the fusion of that order and the first
    stage's, each hit with its cross-encoder score as rerank_score)."""
    from .fileio import refuse_overwrite
    from .inputs import write_jsonl
    from .search import FirstStage, SearchOptions, parse_where, searched

    options = SearchOptions(**options_of(args, SearchOptions))
    where = parse_where(args.where)
    if args.metrics_out is not None and args.qrels is None:
        raise ConfigError("--metrics-out: needs --qrels (the judgements to score the search by)")
    inputs = {"queries": args.queries, "qrels": args.qrels, "reranker": options.rerank}
    refuse_overwrite(args.metrics_out, {"index": args.index, **inputs}, "--metrics-out")
    index = _open_index(args, **inputs)
    rows = _query_rows(args.queries, args.qrels, args.skip_blank)
    queries = [r.texts[0] for r in rows]
    stage = FirstStage(**options_of(args, FirstStage))
    if args.qrels is None:
        results = searched(index, queries, stage, options, where, args.progress)
    else:
        results = iter(_scored_search(args, index, rows, stage, options, where))
        if args.out is None:
            return
    write_jsonl(args.out, rows, ({"query": q, "results": h} for q, h in zip(queries, results)))


def _query_rows(queries: str | None, qrels: str | None, skip_blank: bool) -> list[Any]:
    """search's queries: a file's lines, a BEIR set's queries (all of them; with --qrels, the
    judged ones), or stdin; --qrels DIR alone reads that set's."""
    from .catalogue import TEXTS
    from .data.tasks.beir import beir_root, is_beir, read_queries
    from .inputs import InputLine, read_inputs
    from .search.evaluation import Judged

    if queries is None and qrels is not None and is_beir(qrels):
        judged = Judged.from_beir(qrels)
        return [InputLine(n, q, (t,)) for t, q, n in zip(judged.texts, judged.ids, judged.lines)]
    if queries is not None and Path(queries).is_dir():
        found = read_queries(beir_root(queries).queries)
        return [InputLine(n, q, (t,)) for q, (t, n) in found.items()]
    if queries is None and qrels is not None:
        raise ConfigError(
            f"--qrels {qrels}: a qrels file scores queries given beside it: search INDEX "
            "QUERIES --qrels FILE (a BEIR set's directory brings its own)"
        )
    return read_inputs("-" if queries is None else queries, TEXTS, skip_blank)


def _scored_search(
    args: argparse.Namespace, index: Any, rows: list[Any], stage: Any, options: Any, where: Any
) -> list[Any]:
    """search --qrels: the queries searched and scored; the scores printed (the first stage's
    beside the reranked ones) and written to --metrics-out; the hits returned."""
    from .fileio import write_json
    from .search import Index
    from .search.evaluation import SHOWN, Judged, score_search

    texts = [r.texts[0] for r in rows]
    ids = [str(r.line if r.id is None else r.id) for r in rows]
    judged = Judged.from_lines(texts, ids, [r.line for r in rows], args.qrels)
    if isinstance(index, Index):  # a PostgreSQL table's ids are not read whole
        judged.check_documents(index.ids, f"the index {args.index}")
    scores = score_search(index, judged, stage, options, where)
    columns = {"first stage": scores.first, "reranked": scores.reranked}
    shown = {k: v for k, v in columns.items() if v is not None}
    print(f"{scores.queries:,} judged queries ({judged.path}):")
    print(f"{'':12}" + "".join(f"{name:>14}" for name in shown))
    for metric in SHOWN:
        print(f"{metric:12}" + "".join(f"{v[metric]:14.4f}" for v in shown.values()))
    if args.metrics_out is not None:
        write_json(args.metrics_out, {"qrels": str(judged.path), **scores.report()})
    return scores.results


def args_mine(p: argparse.ArgumentParser) -> None:
    from .search import MineOptions

    _search_args(p)
    p.add_argument(
        "train",
        help="retrieval training file: JSONL {query, positive, positive_id?} or a table; "
        "positive_id (the positive's document id in the index) is matched by id, else the "
        "positive's text (spacing and case aside)",
    )
    p.add_argument("--out", required=True, help="JSONL {query, positive, negatives}")
    add_options(p, MineOptions)
    add_no_progress(p)


def cmd_mine(args: argparse.Namespace) -> None:
    from .data.tasks import read_retrieval
    from .fileio import json_text, write_text
    from .search import FirstStage, MineOptions, mine_groups

    options = MineOptions(**options_of(args, MineOptions))
    index = _open_index(args, train=args.train, teacher=options.teacher)
    examples = read_retrieval(args.train)
    stage = FirstStage(**options_of(args, FirstStage))
    groups, said = mine_groups(index, examples, options, stage, args.train, args.progress)
    write_text(args.out, "".join(json_text(g) + "\n" for g in groups))
    print(f"wrote {len(groups):,} of {len(examples):,} rows to {args.out}: {said}")


def args_beir(p: argparse.ArgumentParser) -> None:
    p.add_argument("squad", help="a SQuAD JSON file (v1.1 or v2.0)")
    p.add_argument("--out", required=True, help="a new directory: the set in BEIR's layout")
    p.add_argument(
        "--train-articles",
        type=int,
        help="articles whose questions are the split train (the rest: test; default: the first "
        "half)",
    )


def cmd_beir(args: argparse.Namespace) -> None:
    """corpus.jsonl (a paragraph a document), queries.jsonl (a question a query), qrels/train.tsv
    and qrels/test.tsv (each question relevant to its paragraph; split by article)."""
    from .data.tasks.beir import squad_beir, write_beir
    from .fileio import refuse_overwrite

    refuse_overwrite(args.out, {"squad": args.squad}, "--out")
    data = squad_beir(args.squad, args.train_articles)
    write_beir(args.out, data)
    said = ", ".join(f"{len(v):,} {k}" for k, v in data.qrels.items())
    print(
        f"wrote {len(data.documents):,} documents and {len(data.queries):,} queries to "
        f"{args.out} (judgements: {said})"
    )


# ------------------------------------------------------------------------------------------------
# serve, export, attention, probe, plot, demo


# -- embed --ray: the embed verb's options for a Ray cluster (cli.args_pipeline adds them)

RAY_CHUNK = 1024  # input lines a worker reads, embeds and writes as one Parquet part


def args_embed_ray(p: argparse.ArgumentParser) -> None:
    from .distributed import RayOptions

    add_options(p, RayOptions)
    p.add_argument(
        "more_inputs",
        nargs="*",
        metavar="FILE",
        help="with --ray: more input files, directories or glob patterns, read in parallel",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=RAY_CHUNK,
        help=f"with --ray: input lines a worker reads, embeds and writes as one Parquet part "
        f"(default: {RAY_CHUNK})",
    )


def embed_on_ray(args: argparse.Namespace) -> bool:
    """embed --ray: the input files embedded by a Ray cluster into --out, a directory of
    Parquet parts (distributed.embed_file); False without --ray (the one-process embed runs).
    A Pipeline option the workers would not apply is refused, not ignored."""
    from .distributed import RayOptions, embed_file
    from .options import parameters
    from .pipelines import Pipeline

    ray = RayOptions(**options_of(args, RayOptions))
    if ray.address is None:
        if changed_options(args, RayOptions) or args.chunk != RAY_CHUNK:
            raise ConfigError(
                "--workers, --cpus-per-worker, --gpus-per-worker and --chunk need --ray"
            )
        if args.more_inputs:
            raise ConfigError(
                f"{args.more_inputs[0]}: embed reads one input file; several are read by a Ray "
                "cluster's workers (--ray)"
            )
        return False
    if not args.out or Path(args.out).suffix:
        raise ConfigError(
            f"--out {args.out}: embed --ray writes a directory of Parquet parts (id, file, line, "
            "vector) and embed.json: give a directory, not a .npy or JSONL file"
        )
    kept = ("device", "precision", "batch_size")
    given = options_of(args, Pipeline)
    for name, default, *_ in parameters(Pipeline):
        if name not in kept and given.get(name, default) != default:
            raise ConfigError(f"--{name.replace('_', '-')} is not used by embed --ray")
    if getattr(args, "embedding_precision", "float32") != "float32":
        raise ConfigError(
            f"--embedding-precision {args.embedding_precision} is not used by embed --ray: its "
            "parts hold float32 vectors (quantise them together, or build an index)"
        )
    embed = options_of(args, Pipeline.embed)
    out = embed_file(
        args.model,
        [args.input, *args.more_inputs],
        args.out,
        ray=ray,
        chunk=args.chunk,
        skip_blank=args.skip_blank,
        keep_tabs=args.keep_tabs,
        progress=args.progress,
        **{k: given[k] for k in kept},
        **embed,
    )
    print(f"wrote the vectors to {out} (Parquet parts, embed.json)")
    return True
