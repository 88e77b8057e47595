"""The `bertforge` command: a thin layer over functions importable on their own.

    bertforge info PATH                      what a checkpoint holds and what it can do
    bertforge vocab train FILES... --size N --out DIR [--cased]
    bertforge prepare / pretrain / plot      pre-training (see README)
    bertforge distill                        a smaller student taught by a teacher
    bertforge finetune / evaluate / predict  GLUE, csv, CoNLL NER, SQuAD v1.1/v2.0, SWAG
    bertforge embed / features / fill-mask / nsp / classify / ner / qa MODEL [FILE]
                                             inference pipelines (catalogue.py), JSONL out
    bertforge serve MODEL                    HTTP server (FastAPI): the catalogue's endpoints
    bertforge demo                           the whole life cycle in minutes, on the stdlib's text

`commands()` is the table: each command's name, its one-line description, the function that
adds its arguments (`args_*`, beside the command) and the function that runs it (`cmd_*`).
Options come from the config dataclasses and the functions' signatures (options.py); the
pipeline verbs are one row per catalogue entry. Errors a user can cause print one line
(`bertforge: error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .cli_search import (
    args_beir,
    args_embed_ray,
    args_index,
    args_mine,
    args_search,
    cmd_beir,
    cmd_index,
    cmd_mine,
    cmd_search,
    embed_on_ray,
)
from .data.corpus import expand_inputs
from .errors import BertforgeError, ConfigError, DataError, hide, redacted
from .options import (
    INFERENCE_HELP,
    Parser,
    add_no_progress,
    add_options,
    changed_options,
    float_list,
    join_layer_lists,
    options_of,
    parameters,
    port,
    show_defaults,
    values_of,
)

if TYPE_CHECKING:
    from .catalogue import Entry, Input

ENCODING_HELP = "bytes that are not UTF-8: stop (strict), replace or ignore"


def _inference_options(p: argparse.ArgumentParser, *names: str) -> None:
    """--device and --precision (help: INFERENCE_HELP), those named, in their order."""
    from .runner import PRECISIONS

    extra: dict[str, Any] = {"device": {}, "precision": {"choices": PRECISIONS, "default": "auto"}}
    for name in names:
        p.add_argument(f"--{name}", **extra[name], help=INFERENCE_HELP[name])


# ------------------------------------------------------------------------------------------------
# info, vocab, prepare


def args_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory (config.json, model.safetensors, vocab.txt)")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_info(args: argparse.Namespace) -> None:
    from .catalogue import inspect

    info = inspect(args.path)
    print(json.dumps(info.report(), indent=2) if args.json else info.text())


def args_vocab(p: argparse.ArgumentParser) -> None:
    from .data.corpus import FORMATS
    from .fileio import ENCODING_ERRORS
    from .subwords import KINDS
    from .tokenizer import train_vocab

    vsub = p.add_subparsers(dest="vocab_command", metavar="ACTION", required=True)
    text = "train a vocabulary from text files (WordPiece; --kind bpe or unigram for RoBERTa's)"
    t = vsub.add_parser("train", help=text, description=text)
    t.add_argument("files", nargs="+", help="text files, directories or glob patterns (UTF-8)")
    t.add_argument("--out", required=True, help="output directory for vocab.txt")
    t.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
    t.add_argument(
        "--format",
        dest="fmt",
        choices=FORMATS,
        default="auto",
        help="input format, read as prepare reads it (auto: detected per file)",
    )
    add_options(
        t,
        train_vocab,
        skip=("lowercase", "show_progress"),
        flags={"vocab_size": "--size"},
        choices={"encoding_errors": ENCODING_ERRORS, "kind": KINDS},
        help={
            "kind": "wordpiece (BERT's), bpe (RoBERTa's byte-level BPE) or unigram "
            "(XLM-RoBERTa's); bpe and unigram keep case",
            "vocab_size": "vocabulary size",
            "min_frequency": "minimum pair frequency",
            "limit_alphabet": "maximum initial characters",
            "encoding_errors": ENCODING_HELP,
        },
    )


def cmd_vocab_train(args: argparse.Namespace) -> None:
    from .data.corpus import corpus_sentences
    from .fileio import refuse_other_kind, refuse_overwrite
    from .tokenizer import train_vocab, train_vocab_from_texts

    files = expand_inputs(args.files)
    if not files:
        raise DataError("no input files found")
    refuse_overwrite(args.out, {"corpus": [*args.files, *files]}, "--out")
    refuse_other_kind(args.out, "--out", "vocabulary")
    kind = "WordPiece" if args.kind == "wordpiece" else args.kind
    cased = "cased" if args.cased or args.kind != "wordpiece" else "uncased"
    print(
        f"training a {cased} {kind} vocabulary of {args.vocab_size:,} tokens on {len(files)} file(s)"
    )
    options = options_of(args, train_vocab)
    # read as prepare reads them: JSONL's fields and WikiExtractor's markup stay out
    texts = corpus_sentences(files, args.fmt, options.pop("encoding_errors"))
    tok = train_vocab_from_texts(texts, lowercase=not args.cased, **options)
    tok.save_pretrained(args.out)
    written = "vocab.txt" if args.kind == "wordpiece" else "tokenizer.json"
    print(f"wrote {Path(args.out) / written} ({tok.vocab_size:,} tokens) and tokenizer_config.json")


def args_prepare(p: argparse.ArgumentParser) -> None:
    from .data.corpus import FORMATS
    from .data.shards import prepare
    from .fileio import ENCODING_ERRORS

    p.add_argument("inputs", nargs="+", help="text files, directories or glob patterns")
    p.add_argument("--tokenizer", required=True, help="model directory or vocab.txt")
    p.add_argument("--out", required=True, help="output directory for the shards")
    add_options(
        p,
        prepare,
        skip=("batch_sentences",),
        flags={"fmt": "--format", "progress": "--no-progress"},
        choices={"fmt": FORMATS, "encoding_errors": ENCODING_ERRORS},
        help={
            "fmt": "input format (auto: detected per file; see bertforge.data.corpus)",
            "heldout": "share of documents held out for evaluation",
            "shard_tokens": "tokens per shard",
            "seed": "held-out choice",
            "encoding_errors": ENCODING_HELP,
            "progress": "no progress bar",
        },
    )


def cmd_prepare(args: argparse.Namespace) -> None:
    from .data.shards import prepare
    from .fileio import refuse_other_kind, refuse_overwrite
    from .tokenizer import Tokenizer

    corpus = [*args.inputs, *expand_inputs(args.inputs)]
    refuse_overwrite(args.out, {"corpus": corpus, "tokenizer": args.tokenizer}, "--out")
    refuse_other_kind(args.out, "--out", "pre-training data")
    prepare(
        args.inputs,
        Tokenizer.from_pretrained(args.tokenizer),
        args.out,
        **options_of(args, prepare),
    )


# ------------------------------------------------------------------------------------------------
# pretrain, finetune, distill, evaluate, predict


# the training commands: each is train/<name>.py, its config class and its run(config)
TRAINERS = {"pretrain": "PretrainConfig", "finetune": "FinetuneConfig", "distill": "DistillConfig"}


def _trainer(name: str) -> tuple[Any, Callable[[Any], dict[str, Any]]]:
    """The config class and the run function of a training command."""
    module = importlib.import_module(f".train.{name}", __package__)
    return getattr(module, TRAINERS[name]), module.run


def args_train(p: argparse.ArgumentParser, name: str) -> None:
    if name == "distill":
        p.add_argument(
            "--data",
            dest="files",
            nargs="+",
            default=[],
            help="general distillation: text files, directories or globs (as prepare reads)",
        )
    add_options(p, _trainer(name)[0])


def cmd_train(args: argparse.Namespace) -> None:
    config, run = _trainer(args.command)
    data = {"data": list(args.files)} if args.command == "distill" else {}
    if run(config(**options_of(args, config), **data)).get("interrupted"):
        raise SystemExit(130)  # stopped by a signal, checkpoint saved: not finished


def args_evaluate(p: argparse.ArgumentParser, predict: bool = False) -> None:
    from .data.tasks import TASK_NAMES
    from .runner import PRECISIONS
    from .tasks import TaskOptions
    from .train import finetune

    p.add_argument("--model", required=True, help="fine-tuned model directory")
    p.add_argument("--data", required=True, help="a file in the task's format")
    p.add_argument(
        "--out",
        required=predict,
        help="directory for the predictions in the task's format"
        + ("" if predict else " (default: none, metrics only: the model's files stay its run's)"),
    )
    add_options(
        p,
        finetune.predict if predict else finetune.evaluate_model,
        skip=("out",),
        flags={"progress": "--no-progress"},
        choices={"precision": PRECISIONS},
        help={
            **INFERENCE_HELP,
            "max_rows": "only the first N examples of --data, in file order",
            "progress": "no progress bar",
        },
    )
    p.add_argument(
        "--task",
        choices=TASK_NAMES,
        help="default: the task of the model's run.json (`finetune` writes it), whose columns, "
        "lengths and other options below apply too unless given here",
    )
    add_options(p, TaskOptions, skip=("task",))
    if not predict:
        p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")


def _run_task(args: argparse.Namespace, fn: Callable[..., Any]) -> Any:
    """fn (finetune.evaluate_model or predict) on --model, --task, --data and --out, with the
    task options given on the command line, those that differ from their defaults: the others
    come from the model's run.json (tasks.run_task_options)."""
    from .fileio import refuse_overwrite
    from .tasks import TaskOptions

    refuse_overwrite(args.out, {"model": args.model, "data": args.data}, "--out")
    changed = changed_options(args, TaskOptions)
    return fn(args.model, args.task, args.data, out=args.out, **options_of(args, fn), **changed)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from .evaluate import metrics_text
    from .fileio import json_text
    from .train.finetune import evaluate_model

    metrics = _run_task(args, evaluate_model)
    print(json_text(metrics) if args.json else metrics_text(metrics))
    if args.out is not None and not args.json:
        print(f"predictions in {args.out}")


def cmd_predict(args: argparse.Namespace) -> None:
    from .train.finetune import predict

    for path in _run_task(args, predict):
        print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------
# the inference pipelines: one verb per catalogue entry


def args_pipeline(p: argparse.ArgumentParser, name: str) -> None:
    """The model, the input file, --out, the Pipeline's options, the entry's own options and a
    flag per optional input (--pairs)."""
    from .catalogue import ENTRIES
    from .pipelines import Pipeline
    from .runner import PRECISIONS

    entry = ENTRIES[name]
    p.add_argument("model", help="model directory")
    p.add_argument("input", nargs="?", default="-", help="text file, .jsonl, or - (stdin)")
    p.add_argument("--out", help="output file (default: JSONL on stdout)")
    add_options(
        p,
        Pipeline,
        skip=tuple(entry.unused),
        choices={"precision": PRECISIONS, "quantize": ("int8",)},
        help={
            **INFERENCE_HELP,
            "batch_size": "rows per batch (default: 32 on the CPU, 512 on a GPU)",
            "max_tokens": "pieces a batch may hold, padded (default: none on the CPU, 65536 on a GPU)",
            "max_length": "pieces per window (default: the model's)",
            "stride": "pieces between windows of a longer text (default: half a window)",
            "truncate": "read only the first window of a longer text",
            "quantize": "int8: dynamic int8 quantisation (CPU)",
        },
    )
    columns = "lines are " + "<TAB>".join(i.field.upper() for i in entry.inputs)
    for i in entry.inputs:
        if i.optional:
            p.add_argument(f"--{i.param}", action="store_true", help=columns)
    p.add_argument(
        "--skip-blank",
        action="store_true",
        help="drop blank lines (default: a blank line is an error); JSONL rows say their line",
    )
    if len(entry.inputs) == 1:
        p.add_argument(
            "--keep-tabs", action="store_true", help="a tab is part of the text (default: an error)"
        )
    add_no_progress(p)
    method = getattr(Pipeline, entry.method)
    hidden = [name for name, *_ in parameters(method) if name not in entry.options]
    add_options(p, method, skip=hidden, choices=entry.choices, help=entry.options)
    if entry.post:  # e.g. embed's --embedding-precision
        add_options(p, entry.post, choices=entry.choices, help=entry.post_options)
    if name == "embed":  # --ray: on a Ray cluster, into Parquet parts
        args_embed_ray(p)
    for unused in entry.unused:  # given anyway: refused by name (_refuse_unused), not ignored
        flag = f"--{unused.replace('_', '-')}"
        p.add_argument(flag, dest=f"unused_{unused}", nargs="?", const="", help=argparse.SUPPRESS)
    p.set_defaults(pipeline=name)


def _refuse_unused(args: argparse.Namespace, entry: Entry, second: Input | None) -> None:
    """A ConfigError naming a Pipeline option the verb does not read (entry.unused; with its
    optional second input `second` given, entry.paired_unused too), instead of ignoring it."""
    from .pipelines import Pipeline

    refused = [
        (name, why, entry.name)
        for name, why in entry.unused.items()
        if getattr(args, f"unused_{name}", None) is not None
    ]
    if second is not None:
        defaults = {name: default for name, default, *_ in parameters(Pipeline)}
        refused += [
            (name, why, f"{entry.name} --{second.param}")
            for name, why in entry.paired_unused.items()
            if getattr(args, name) != defaults[name]
        ]
    if refused:
        name, why, verb = refused[0]
        raise ConfigError(f"--{name.replace('_', '-')} is not used by {verb}: {why}")


def cmd_pipeline(args: argparse.Namespace) -> None:
    """Read the inputs, run the entry's Pipeline method, write JSONL rows (each with its input's
    line number, and id if the JSONL input had one) or the entry's arrays. Refused before any
    work: an option the verb does not read, an --out that is one of its input files."""
    from .catalogue import ENTRIES
    from .fileio import refuse_overwrite
    from .inputs import answers, columns, read_inputs, write_results
    from .pipelines import Pipeline

    entry = ENTRIES[args.pipeline]
    if entry.name == "embed" and embed_on_ray(args):
        return
    inputs = [i for i in entry.inputs if not i.optional or getattr(args, i.param)]
    unasked = [i for i in entry.inputs if i not in inputs]
    _refuse_unused(args, entry, next((i for i in inputs if i.optional), None))
    files = {"input": args.input, "calibration": getattr(args, "calibration", None)}
    refuse_overwrite(args.out, {**files, "model": args.model}, "--out")
    keep_tabs = getattr(args, "keep_tabs", False)
    rows = read_inputs(args.input, inputs, args.skip_blank, keep_tabs, unasked, entry.documents)
    texts = columns(rows, inputs)
    pipe = Pipeline(args.model, **options_of(args, Pipeline))
    options = options_of(args, getattr(Pipeline, entry.method))
    results = answers(entry, pipe, texts, options, args.progress)
    post = options_of(args, entry.post) if entry.post else {}
    # JSONL rows are written as their part is run; an array file is written whole, and so is
    # what post changes (embed's int8 buckets come from every vector written)
    array = bool(args.out and entry.save and args.out.endswith(entry.arrays))
    defaults = {name: default for name, default, *_ in parameters(entry.post)} if post else {}
    if array or post != defaults:
        listed: Any = list(results)
        if array and not rows:  # no input lines: the entry's own empty answer, (0, D) vectors
            listed = entry.run(pipe, texts, options)
        results = listed if entry.post is None else entry.post(listed, **post)
    write_results(entry, args.out, rows, texts, results)


# ------------------------------------------------------------------------------------------------
# index, search, mine: in cli_search.py; serve, export, merge, attention, probe, plot, demo


def args_serve(p: argparse.ArgumentParser) -> None:
    from .search import PgOptions
    from .serve import Access, Limits

    p.add_argument("model", help="model directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000, help="TCP port, 1-65535")
    p.add_argument(
        "--index",
        help="an index directory (bertforge index) of this model, or a PostgreSQL DSN "
        "(postgresql://... or host=... dbname=...) with --table: POST /search",
    )
    p.add_argument(
        "--index-model",
        help="the index's own model, when the one served is another (a cross-encoder for "
        "/rerank, say): it embeds /search's queries (checked to be the index's)",
    )
    p.add_argument(
        "--rerank-model",
        metavar="CROSS_ENCODER",
        help='a cross-encoder that reranks /search\'s hits when a request asks ("rerank", as '
        "search --rerank): the served model itself (loaded once) or another",
    )
    p.add_argument(
        "--calibration",
        help="a .npy of the model's float embeddings of a corpus (bertforge embed --out F.npy): "
        'the buckets of /embed\'s "embedding_precision": int8 and uint8',
    )
    _inference_options(p, "device", "precision")
    add_options(p, Limits)
    add_options(p, Access)
    add_options(p, PgOptions)


def args_export(p: argparse.ArgumentParser) -> None:
    from .export import export_onnx

    p.add_argument("model", help="model directory")
    p.add_argument("--onnx", required=True, help="output .onnx file")
    add_options(
        p,
        export_onnx,
        help={
            "atol": "allowed max |difference|",
            "sentence_embedding": "add the output sentence_embedding, pooled and normalised as "
            "the directory says (default: for a sentence-transformers directory)",
        },
    )


def args_merge(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", metavar="MODEL", help="two or more model directories")
    p.add_argument("--out", required=True, help="the new model directory")
    p.add_argument(
        "--weights",
        type=float_list,
        help="one weight per model, e.g. 0.9,0.1 (scaled to sum to 1; default: equal)",
    )


def args_attention(p: argparse.ArgumentParser) -> None:
    from .attention import PNG_PIECES, render

    p.add_argument("model", help="model directory")
    p.add_argument("text", help="the text to look at")
    p.add_argument("--out", required=True, help="view.html or view.png")
    add_options(
        p,
        render,
        help={
            "pair": "a second text (sentence pair)",
            "layer": "layer (-1: the last)",
            "head": "head (default: the mean of all heads)",
            "max_length": "pieces shown, the rest left out with a warning (default: as many as "
            f"the model reads; an HTML view holds at most 2 million weights, a PNG {PNG_PIECES} "
            "pieces)",
        },
    )


def args_probe(p: argparse.ArgumentParser) -> None:
    from .embedding import POOLINGS
    from .probe import TASKS, UNUSED_OPTIONS
    from .probe_tokens import TokenProbeOptions
    from .tasks import TaskOptions

    p.add_argument("--model", required=True, help="model directory: its encoder, frozen")
    p.add_argument("--train", required=True, help="training file (the task's format)")
    p.add_argument("--dev", required=True, help="dev file, scored per layer choice")
    p.add_argument(
        "--layers",
        help='choices separated by ";" e.g. "-1;-2;concat:-1,-2,-3,-4" (tagging also '
        '"mix:-1,-2,-3,-4", a learned weighted sum)',
    )
    p.add_argument(
        "--pooling",
        choices=POOLINGS,
        default="mean",
        help="sentence tasks: cls is seed 004's recipe ([CLS] + logistic regression)",
    )
    p.add_argument("--max-train", type=int, help="use the first N training sentences")
    _inference_options(p, "precision")
    p.add_argument("--json", help="also write the table as JSON here")
    add_no_progress(p)

    def single_sentence(name: str) -> str:  # argparse's "invalid choice" would not say why
        if name not in TASKS:
            raise argparse.ArgumentTypeError(
                f"{name!r}: probe takes single-sentence tasks: {', '.join(TASKS[:-1])}; "
                f"and tagging: {TASKS[-1]}"
            )
        return name

    p.add_argument(
        "--task",
        default="sst2",
        type=single_sentence,
        choices=TASKS,
        help="a single-sentence GLUE task, csv (one text column), or conll2003 (tagging: token "
        "features, a BiLSTM or linear classifier, entity F1)",
    )
    add_options(p, TaskOptions, skip=("task", *UNUSED_OPTIONS))
    add_options(p, TokenProbeOptions)


def args_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory (with metrics.jsonl)")
    p.add_argument("--out", help="PNG file (default RUN/curves.png)")


def args_demo(p: argparse.ArgumentParser) -> None:
    from .demo import run_demo

    p.add_argument("--out", default="bertforge-demo", help="output directory")
    add_options(
        p,
        run_demo,
        skip=("vocab_size", "sentences", "epochs"),
        flags={"progress": "--no-progress"},
        help={
            "minutes": "pre-training time: the steps that fit, timed on this machine",
            "steps": "a fixed number of pre-training steps instead of --minutes",
            "seed": "everything random",
            "progress": "no progress bars",
        },
    )


def cmd_serve(args: argparse.Namespace) -> None:
    from .search import PgOptions
    from .serve import Access, Limits, serve

    # serve() says where it serves once the model has loaded (a corrupt one ends it first)
    serve(
        args.model,
        limits=Limits(**options_of(args, Limits)),
        access=Access(**options_of(args, Access)),
        index_options=PgOptions(**options_of(args, PgOptions)),
        **values_of(args, "host", "port", "index", "index_model", "calibration", "rerank_model"),
        **values_of(args, "precision", "device"),
    )


def cmd_export(args: argparse.Namespace) -> None:
    from .export import export_onnx
    from .fileio import refuse_overwrite

    refuse_overwrite(args.onnx, {"model": args.model}, "--onnx")
    result = export_onnx(args.model, args.onnx, **options_of(args, export_onnx))
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in result["max_abs_diff"].items())
    print(
        f"wrote {args.onnx} ({result['architecture']}: {', '.join(result['outputs'])}); "
        f"onnxruntime vs PyTorch max |difference|: {diffs}"
    )


def cmd_merge(args: argparse.Namespace) -> None:
    from .fileio import refuse_overwrite
    from .merge import merge

    refuse_overwrite(args.out, {"model": args.models}, "--out")
    record = merge(args.models, args.out, args.weights)
    parts = ", ".join(f"{w:.3g} x {m}" for m, w in zip(record["models"], record["weights"]))
    print(f"wrote {args.out}: {parts}")


def cmd_attention(args: argparse.Namespace) -> None:
    from .attention import render
    from .fileio import refuse_overwrite

    refuse_overwrite(args.out, {"model": args.model}, "--out")
    path = render(args.model, args.text, args.out, **options_of(args, render))
    print(f"wrote {path}")


def cmd_probe(args: argparse.Namespace) -> None:
    from .fileio import refuse_overwrite, write_json
    from .probe import DEFAULT_CHOICES, probe, read_task, table
    from .probe_tokens import TOKEN_CHOICES, TokenProbeOptions, probe_tagging
    from .tasks import TaskOptions
    from .tasks.tagging import TaggingTask

    inputs = {"model": args.model, "train": args.train, "dev": args.dev}
    refuse_overwrite(args.json, inputs, "--json")
    options = TaskOptions(task=args.task, **options_of(args, TaskOptions))
    fam, train, dev = read_task(args.model, options, args.train, args.dev, args.max_train)
    choices = args.layers.split(";") if args.layers else None
    if isinstance(fam, TaggingTask):
        token_options = TokenProbeOptions(**options_of(args, TokenProbeOptions))
        say = partial(print, flush=True)
        rows = probe_tagging(
            args.model,
            fam,
            train,
            dev,
            choices or TOKEN_CHOICES,
            token_options,
            log=say,
            precision=args.precision,
        )
        print(table(rows, "f1", "dev entity F1", lambda x: f"{100 * x:.2f}", seconds=True))
    else:
        rows = probe(
            args.model,
            ([e.text for e in train], [e.label for e in train]),
            ([e.text for e in dev], [e.label for e in dev]),
            choices or DEFAULT_CHOICES,
            pooling=args.pooling,
            precision=args.precision,
            progress=args.progress,
        )
        print(
            f"{len(train):,} training and {len(dev):,} dev sentences; frozen features "
            f"({args.pooling} pooling) in {rows[0]['feature_seconds']:.0f} s"
        )
        print(table(rows, "dev_accuracy", "dev accuracy", lambda x: f"{x:.4f}"))
    if args.json:
        write_json(args.json, rows)


def cmd_plot(args: argparse.Namespace) -> None:
    from .fileio import refuse_overwrite
    from .train.plot import plot_run

    refuse_overwrite(args.out, {"metrics": Path(args.run) / "metrics.jsonl"}, "--out")
    print(f"wrote {plot_run(args.run, args.out)}")


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo
    from .fileio import refuse_other_kind

    refuse_other_kind(args.out, "--out", "demo")  # its own directory holds each kind below
    if run_demo(Path(args.out), **options_of(args, run_demo)).get("interrupted"):
        raise SystemExit(130)  # stopped by Ctrl-C, checkpoint saved: as cmd_train


# ------------------------------------------------------------------------------------------------
# the table of commands, and the parser made from it

Command = tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[..., None]]


def commands() -> list[Command]:
    """(name, one-line description, add its arguments, run it) of every command, in --help's
    order; the pipeline verbs come from the catalogue."""
    from .catalogue import ENTRIES

    return [
        ("info", "show what a checkpoint directory holds and which pipelines it serves",
         args_info, cmd_info),
        ("vocab", "WordPiece vocabularies", args_vocab, cmd_vocab_train),
        ("prepare", "tokenize a corpus into shards for pre-training", args_prepare, cmd_prepare),
        ("pretrain", "pre-train: masked LM + next sentence prediction, or masked LM alone",
         partial(args_train, name="pretrain"), cmd_train),
        ("finetune", "fine-tune: GLUE, tables, CoNLL NER, SQuAD, SWAG, retrieval, rerank",
         partial(args_train, name="finetune"), cmd_train),
        ("distill", "a smaller student taught by a teacher: on unlabelled text, or on a task",
         partial(args_train, name="distill"), cmd_train),
        ("evaluate", "metrics of a fine-tuned model on a labelled task file",
         args_evaluate, cmd_evaluate),
        ("predict", "a fine-tuned model's predictions for new inputs",
         partial(args_evaluate, predict=True), cmd_predict),
        *[(e.name, e.help, partial(args_pipeline, name=e.name), cmd_pipeline)
          for e in ENTRIES.values()],
        ("index", "an index of a corpus: a bi-encoder's vectors and BM25, resumable",
         args_index, cmd_index),
        ("search", "search an index: dense, BM25 or hybrid, reranked by a cross-encoder",
         args_search, cmd_search),
        ("mine", "hard negatives for retrieval training, from an index", args_mine, cmd_mine),
        ("beir", "a SQuAD file as a retrieval set in BEIR's layout (search --qrels scores it)",
         args_beir, cmd_beir),
        ("serve", "HTTP server: the pipelines the model has a head for, and /v1/embeddings",
         args_serve, cmd_serve),
        ("merge", "a weighted average of models fine-tuned from one base (soups, WiSE-FT)",
         args_merge, cmd_merge),
        ("export", "the model as ONNX, checked against PyTorch", args_export, cmd_export),
        ("attention", "attention views: an HTML head view or a PNG heatmap",
         args_attention, cmd_attention),
        ("probe", "logistic regression on frozen features, per layer choice",
         args_probe, cmd_probe),
        ("plot", "training curves of a run as a PNG", args_plot, cmd_plot),
        ("demo", "the BERT life cycle in minutes on the stdlib's docstrings (start here)",
         args_demo, cmd_demo),
    ]  # fmt: skip  # one command per row reads as a table


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bertforge",
        description="BERT (Devlin et al., 2018): tokenize, pre-train, fine-tune, extract "
        "features, serve.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, text, arguments, command in commands():
        p = sub.add_parser(name, help=text, description=text)
        arguments(p)
        p.set_defaults(func=command)
    show_defaults(parser)
    return parser


SECRET_WORDS = {"key", "apikey", "password", "secret", "token"}  # option words hiding a value


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of the parser and its subcommands' (--token-weight...)."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= option_strings(child)
    return found


def hide_api_key(argv: Sequence[str], known: set[str] | frozenset[str] = frozenset()) -> None:
    """The server's API key hidden (errors.hide) before argparse reads argv: a usage error
    quotes what it did not take (`search ... --api-key KEY`: a verb without the option), and
    argparse takes any long enough prefix of the option's name (--api KEY)."""
    from .serve.limits import API_KEY_ENV

    hide(os.environ.get(API_KEY_ENV))
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        prefix = len(name) >= len("--api") and "--api-key".startswith(name)
        # a typo of it (--api-kye, --apikey, --api-token) is quoted back as unrecognized; an
        # option of the parser's (--token-weight 1) or an abbreviation of one is no typo
        secret_like = name.startswith("--api") or SECRET_WORDS & set(name.lstrip("-").split("-"))
        typo = bool(secret_like) and not any(k.startswith(name) for k in known)
        if prefix or typo:
            hide(value if equals else (argv[i + 1] if i + 1 < len(argv) else None))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    hide_api_key(argv, option_strings(parser))
    args = parser.parse_args(join_layer_lists(argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    warnings.simplefilter("default")
    warnings.formatwarning = lambda message, *_, **__: (
        f"bertforge: warning: {redacted(str(message))}\n"
    )
    try:
        args.func(args)
    except BertforgeError as e:  # redacted: a DSN or a key can be anywhere in what was given
        print(f"bertforge: error: {redacted(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # a path the user gave: missing, a directory, no permission, disk full
        where = e.filename2 if e.filename2 is not None else e.filename
        what = redacted(f"{f'{where}: ' if where else ''}{e.strerror or str(e)}")
        print(f"bertforge: error: {what}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
