"""The `bertforge` command: a thin layer over functions importable on their own.

    bertforge info PATH                      what a checkpoint holds
    bertforge vocab train FILES... --size N --out DIR [--cased]
    bertforge prepare / pretrain / plot      pre-training (see README)
    bertforge finetune / evaluate / predict  GLUE, csv, CoNLL NER, SQuAD v1.1/v2.0, SWAG
    bertforge fill-mask / classify / ner / qa / embed / nsp / features MODEL [FILE]
                                             inference pipelines, JSONL out
    bertforge serve MODEL                    HTTP server (FastAPI): embed, classify, ner, qa, fill-mask
    bertforge demo                           the whole life cycle in minutes, on the stdlib's text

Errors a user can cause print one line (`bertforge: error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .data.corpus import expand_inputs
from .data.tasks import TASK_NAMES as TASKS
from .errors import BertforgeError, DataError

# ------------------------------------------------------------------------------------------------
# commands


def cmd_info(args: argparse.Namespace) -> None:
    from .checkpoint import inspect
    from .tokenizer import Tokenizer

    info = inspect(args.path)
    c = info.config
    vocab = None
    if (info.directory / "vocab.txt").is_file():
        tok = Tokenizer.from_pretrained(info.directory)
        vocab = {"size": tok.vocab_size, "cased": not tok.lowercase}
    report = {
        "directory": str(info.directory),
        "layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
        "parameters": info.num_parameters,
        "dtypes": info.dtypes,
        "heads_present": info.heads,
        "labels": c.id2label,
        "vocab": vocab,
        "weights": [str(p.name) for p in info.weights_files],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"checkpoint   {info.directory}")
    print(
        f"encoder      L={c.num_hidden_layers} H={c.hidden_size} A={c.num_attention_heads} "
        f"I={c.intermediate_size} max_len={c.max_position_embeddings} act={c.hidden_act}"
    )
    print(f"parameters   {info.num_parameters:,} ({', '.join(info.dtypes)})")
    print(f"heads        {', '.join(info.heads) or 'none (encoder only)'}")
    if c.id2label:
        print(f"labels       {', '.join(c.id2label[i] for i in sorted(c.id2label))}")
    if vocab:
        casing = "cased" if vocab["cased"] else "uncased"
        print(
            f"vocabulary   {vocab['size']:,} tokens, {casing} (config vocab_size {c.vocab_size:,})"
        )
    else:
        print(f"vocabulary   no vocab.txt (config vocab_size {c.vocab_size:,})")
    print(f"weights      {', '.join(p.name for p in info.weights_files)}")


def cmd_vocab_train(args: argparse.Namespace) -> None:
    from .tokenizer import train_vocab

    files = expand_inputs(args.files)
    if not files:
        raise DataError("no input files found")
    print(
        f"training a {'cased' if args.cased else 'uncased'} WordPiece vocabulary of "
        f"{args.size:,} tokens on {len(files)} file(s)",
        file=sys.stderr,
    )
    tok = train_vocab(
        files,
        args.size,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
        limit_alphabet=args.limit_alphabet,
        encoding_errors=args.encoding_errors,
    )
    tok.save_pretrained(args.out)
    print(
        f"wrote {Path(args.out) / 'vocab.txt'} ({tok.vocab_size:,} tokens) and tokenizer_config.json"
    )


def cmd_prepare(args: argparse.Namespace) -> None:
    from .data.shards import prepare
    from .tokenizer import Tokenizer

    prepare(
        args.inputs,
        Tokenizer.from_pretrained(args.tokenizer),
        args.out,
        fmt=args.format,
        heldout=args.heldout,
        shard_tokens=args.shard_tokens,
        seed=args.seed,
        encoding_errors=args.encoding_errors,
    )


def cmd_pretrain(args: argparse.Namespace) -> None:
    from .train.pretrain import PretrainConfig, run

    fields = {f for f in PretrainConfig.__dataclass_fields__}
    cfg = PretrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    if run(cfg).get("interrupted"):
        raise SystemExit(130)  # stopped by a signal, checkpoint saved: not finished


def cmd_finetune(args: argparse.Namespace) -> None:
    from .train.finetune import FinetuneConfig, run

    fields = set(FinetuneConfig.__dataclass_fields__)
    cfg = FinetuneConfig(**{k: v for k, v in vars(args).items() if k in fields})
    if run(cfg).get("interrupted"):
        raise SystemExit(130)


def _task_options(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of evaluate / predict that shape the features (columns, lengths, SQuAD)."""
    from .train.finetune import FinetuneConfig

    skip = {"model", "task", "train", "out", "dev", "dev_split"}
    return {
        k: v
        for k, v in vars(args).items()
        if k in FinetuneConfig.__dataclass_fields__ and k not in skip
    }


def cmd_evaluate(args: argparse.Namespace) -> None:
    from .train.finetune import evaluate_model

    out = args.out if args.out is not None else args.model
    metrics = evaluate_model(args.model, args.task, args.data, out=out, **_task_options(args))
    if args.json:
        print(json.dumps(metrics))
    else:
        for k, v in metrics.items():
            print(f"{k:>20}  {v:.4f}")
        print(f"predictions in {out}")


def cmd_predict(args: argparse.Namespace) -> None:
    from .train.finetune import predict

    for path in predict(args.model, args.task, args.data, args.out, **_task_options(args)):
        print(f"wrote {path}")


def _read_inputs(path: str, fields: int, names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Inputs of a pipeline command: JSONL objects with `names` (file ends in .jsonl), or
    lines of text (fields > 1: tab-separated); "-" reads stdin. Blank lines are skipped."""
    if path == "-":
        lines = list(enumerate(sys.stdin.read().splitlines(), 1))
        where = "<stdin>"
    else:
        from .data.corpus import read_lines

        lines = list(read_lines(Path(path)))
        where = path
    rows: list[tuple[str, ...]] = []
    for lineno, line in lines:
        if not line.strip():
            continue
        if where.endswith(".jsonl"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: line {lineno}: invalid JSON: {e.msg}") from None
            missing = [n for n in names[:fields] if not isinstance(obj.get(n), str)]
            if missing:
                raise DataError(
                    f'{where}: line {lineno}: field "{missing[0]}": missing or not text'
                )
            rows.append(tuple(obj[n] for n in names[:fields]))
            continue
        parts = line.split("\t") if fields > 1 else [line]
        if len(parts) != fields:
            raise DataError(
                f"{where}: line {lineno}: {len(parts)} tab-separated fields, expected "
                f"{fields} ({', '.join(names[:fields])})"
            )
        rows.append(tuple(parts))
    return rows


def _write_jsonl(out: str | None, items: Sequence[Any]) -> None:
    text = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items)
    if out is None:
        sys.stdout.write(text)
    else:
        from .fileio import write_text

        write_text(out, text)
        print(f"wrote {len(items):,} lines to {out}", file=sys.stderr)


def cmd_pipeline(args: argparse.Namespace) -> None:
    import numpy as np

    from .pipelines import Pipeline

    pipe = Pipeline(args.model, device=args.device, precision=args.precision,
                    batch_size=args.batch_size, max_length=args.max_length)  # fmt: skip
    kind = args.pipeline
    if kind in ("classify", "nsp", "qa"):
        names = ("question", "context") if kind == "qa" else ("text", "text_pair")
        fields = 2 if kind != "classify" or args.pairs else 1
        rows = _read_inputs(args.input, fields, names)
    else:
        rows = _read_inputs(args.input, 1, ("text",))
    first = [r[0] for r in rows]
    second = [r[1] for r in rows] if rows and len(rows[0]) > 1 else None
    if kind == "fill-mask":
        items: list[Any] = [
            {"text": t, "masks": m} for t, m in zip(first, pipe.fill_mask(first, args.top_k))
        ]
    elif kind == "classify":
        items = pipe.classify(first, second)
    elif kind == "ner":
        items = [{"text": t, "entities": e} for t, e in zip(first, pipe.ner(first))]
    elif kind == "qa":
        items = pipe.qa(first, second or [])
    elif kind == "nsp":
        items = [{"is_next": p} for p in pipe.nsp(first, second or [])]
    elif kind == "embed":
        vectors = pipe.embed(first, pooling=args.pooling, normalize=args.normalize)
        if args.out and args.out.endswith(".npy"):
            from .fileio import atomic_path

            with atomic_path(args.out) as tmp, open(tmp, "wb") as f:
                np.save(f, vectors)
            print(f"wrote {vectors.shape} to {args.out}", file=sys.stderr)
            return
        items = [{"embedding": v.tolist()} for v in vectors]
    else:  # features
        layers = [int(x) for x in args.layers.split(",")]
        results = pipe.features(first, layers=layers, combine=args.combine)
        if args.out and args.out.endswith((".npy", ".npz")):
            _write_arrays(args.out, results)
            return
        # Google's extract_features.py JSONL: every token with the values of every layer
        items = [{"linex_index": i, "features": [
            {"token": tok, "layers": [{"index": k, "values": [round(float(x), 6) for x in r["layers"][k][j]]}
                                      for k in layers]}
            for j, tok in enumerate(r["tokens"])]} for i, r in enumerate(results)]  # fmt: skip
    _write_jsonl(args.out, items)


def _write_arrays(out: str, results: list[dict[str, Any]]) -> None:
    """.npz: values_<i> and tokens_<i> per text; .npy: one zero-padded (N, T, D) array."""
    import numpy as np

    from .fileio import atomic_path

    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        if out.endswith(".npz"):
            arrays = {f"values_{i}": r["values"] for i, r in enumerate(results)}
            arrays.update({f"tokens_{i}": np.array(r["tokens"]) for i, r in enumerate(results)})
            np.savez(f, **arrays)
        else:
            T = max((len(r["values"]) for r in results), default=0)
            D = results[0]["values"].shape[-1] if results else 0
            padded = np.zeros((len(results), T, D), np.float32)
            for i, r in enumerate(results):
                padded[i, : len(r["values"])] = r["values"]
            np.save(f, padded)
    print(f"wrote features of {len(results):,} texts to {out}", file=sys.stderr)


def cmd_serve(args: argparse.Namespace) -> None:
    from .serve import serve

    print(f"serving {args.model} on http://{args.host}:{args.port} (docs at /docs)", flush=True)
    serve(args.model, host=args.host, port=args.port, precision=args.precision,
          device=args.device, max_texts=args.max_texts, max_chars=args.max_chars,
          max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue)  # fmt: skip


def cmd_export(args: argparse.Namespace) -> None:
    from .export import export_onnx

    result = export_onnx(args.model, args.onnx, atol=args.atol)
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in result["max_abs_diff"].items())
    print(f"wrote {args.onnx} ({result['architecture']}: {', '.join(result['outputs'])}); "
          f"onnxruntime vs PyTorch max |difference|: {diffs}")  # fmt: skip


def cmd_attention(args: argparse.Namespace) -> None:
    from .attention import render

    path = render(args.model, args.text, args.out, pair=args.pair, layer=args.layer, head=args.head)
    print(f"wrote {path}")


def cmd_probe(args: argparse.Namespace) -> None:
    from .probe import DEFAULT_CHOICES, probe
    from .tokenizer import Tokenizer
    from .train.distributed import Dist
    from .train.finetune import FinetuneConfig, make_task

    options = {k: v for k, v in _task_options(args).items() if k != "max_seq_length"}
    cfg = FinetuneConfig(model=args.model, task=args.task, train=args.train, out="", **options)
    if cfg.task not in (
        "csv",
        "sst2",
        "cola",
        "mrpc",
        "stsb",
        "rte",
        "qnli",
        "wnli",
        "mnli",
        "qqp",
    ):
        raise DataError(f"--task {cfg.task}: probe takes sentence tasks (GLUE or csv)")
    task = make_task(cfg, Dist(), Tokenizer.from_pretrained(args.model))
    if task.spec.is_pair:
        raise DataError(f"--task {cfg.task}: probe takes single-sentence tasks")
    train = task.read(args.train)[: args.max_train] if args.max_train else task.read(args.train)
    dev = task.read(args.dev)
    choices = args.layers.split(";") if args.layers else DEFAULT_CHOICES
    rows = probe(args.model, ([e.text for e in train], [e.label for e in train]),
                 ([e.text for e in dev], [e.label for e in dev]), choices,
                 pooling=args.pooling, precision=args.precision)  # fmt: skip
    print(f"{len(train):,} training and {len(dev):,} dev sentences; frozen features "
          f"({args.pooling} pooling) in {rows[0]['feature_seconds']:.0f} s")  # fmt: skip
    print(f"{'layers':<22} {'dim':>6}  dev accuracy")
    for r in rows:
        print(f"{r['layers']:<22} {r['dim']:>6}  {r['dev_accuracy']:.4f}")
    best = max(rows, key=lambda r: r["dev_accuracy"])
    print(f"best: {best['layers']} ({best['dev_accuracy']:.4f})")
    if args.json:
        from .fileio import write_json

        write_json(args.json, rows)


def cmd_plot(args: argparse.Namespace) -> None:
    from .train.plot import plot_run

    print(f"wrote {plot_run(args.run, args.out)}")


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(Path(args.out), seed=args.seed, steps=args.steps, progress=args.progress)


# ------------------------------------------------------------------------------------------------
# parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertforge",
        description="BERT (Devlin et al., 2018): tokenize, pre-train, fine-tune, extract features, serve.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", help="show what a checkpoint directory holds")
    p.add_argument("path", help="checkpoint directory (config.json, model.safetensors, vocab.txt)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("vocab", help="WordPiece vocabularies")
    vsub = p.add_subparsers(dest="vocab_command", metavar="ACTION", required=True)
    t = vsub.add_parser("train", help="train a WordPiece vocabulary from text files")
    t.add_argument("files", nargs="+", help="text files, directories or glob patterns (UTF-8)")
    t.add_argument("--size", type=int, default=30522, help="vocabulary size (default 30522)")
    t.add_argument("--out", required=True, help="output directory for vocab.txt")
    t.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
    t.add_argument(
        "--min-frequency", type=int, default=2, help="minimum pair frequency (default 2)"
    )
    t.add_argument(
        "--limit-alphabet", type=int, default=1000, help="maximum initial characters (default 1000)"
    )
    t.add_argument(
        "--encoding-errors",
        choices=("strict", "replace", "ignore"),
        default="strict",
        help="what to do with bytes that are not UTF-8 (default: stop with an error)",
    )
    t.set_defaults(func=cmd_vocab_train)

    p = sub.add_parser("prepare", help="tokenize a corpus into shards for pre-training")
    p.add_argument("inputs", nargs="+", help="text files, directories or glob patterns")
    p.add_argument("--tokenizer", required=True, help="model directory or vocab.txt")
    p.add_argument("--out", required=True, help="output directory for the shards")
    p.add_argument(
        "--format",
        choices=("auto", "lines", "paragraphs", "wiki", "jsonl"),
        default="auto",
        help="input format (default: detected per file; see bertforge.data.corpus)",
    )
    p.add_argument(
        "--heldout",
        type=float,
        default=0.01,
        help="share of documents held out for evaluation (default 0.01)",
    )
    p.add_argument(
        "--shard-tokens", type=int, default=1 << 22, help="tokens per shard (default 4M)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encoding-errors", choices=("strict", "replace", "ignore"), default="strict")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("pretrain", help="pre-train with masked LM + next sentence prediction")
    p.add_argument("--data", required=True, help="directory made by `bertforge prepare`")
    p.add_argument("--out", required=True, help="run directory (re-running the command resumes it)")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--model-size", default="mini", choices=("tiny", "mini", "small", "medium", "base", "large")
    )
    size.add_argument("--config", help="config.json of the model to train from scratch")
    size.add_argument("--init", help="start from this checkpoint (phase 2, domain adaptation)")
    p.add_argument("--steps", type=int, default=10_000, help="optimizer steps (default 10000)")
    p.add_argument(
        "--batch-size", type=int, default=32, help="sequences per step, all processes together"
    )
    p.add_argument(
        "--micro-batch-size",
        type=int,
        help="sequences per forward pass and process (gradient accumulation)",
    )
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions-per-seq", type=int, help="default: 15%% of max-seq-length")
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument(
        "--no-nsp",
        dest="nsp",
        action="store_false",
        help="masked LM only, on rows of contiguous text packed across sentences and documents",
    )
    p.add_argument(
        "--dropout",
        type=float,
        help="the model's dropout while pre-training (default: its config's)",
    )
    p.add_argument(
        "--dupe-factor",
        type=int,
        help="static masking with this many fixed copies (default: dynamic)",
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--warmup-ratio",
        type=float,
        default=0.01,
        help="share of steps of linear warmup (default 0.01)",
    )
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16", "fp16"),
        default="auto",
        help="auto: bf16 where the CPU/GPU supports it, fp16 + loss scaling on older GPUs",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--eval-every", type=int, default=500, help="held-out evaluation every N steps (0: never)"
    )
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: a GPU if there is one)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser(
        "finetune",
        help="fine-tune: GLUE, tables of your own, CoNLL NER, SQuAD v1.1/v2.0, SWAG",
    )
    p.add_argument("--model", required=True, help="pre-trained checkpoint directory")
    p.add_argument("--task", required=True, choices=TASKS, help="a task, or csv (yours)")
    p.add_argument("--train", required=True, help="training file (in the task's own format)")
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--dev", help="dev file: evaluated every epoch; the best model is kept")
    dev.add_argument(
        "--dev-split",
        type=float,
        default=0.0,
        help=(
            "hold out this fraction of the train file as the dev set (a fixed split, seed 0; "
            "default 0: none)"
        ),
    )
    p.add_argument("--out", required=True, help="output directory (the fine-tuned model)")
    p.add_argument(
        "--epochs",
        type=float,
        default=3.0,
        help="passes over train, may be fractional",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="examples per step, all processes together",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=3e-5,
        help="peak AdamW learning rate; the paper tries 5e-5, 3e-5, 2e-5 (default: 3e-5)",
    )
    p.add_argument(
        "--warmup-ratio",
        type=float,
        default=0.1,
        help="fraction of the steps spent warming up, then linear decay",
    )
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW")
    p.add_argument("--seed", type=int, default=0, help="head initialisation, order, dropout")
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16", "fp16"),
        default="auto",
        help="auto: bf16 autocast where supported (fp16 on older GPUs), else fp32",
    )
    _feature_arguments(p)
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: a GPU if there is one)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("evaluate", help="metrics of a fine-tuned model on a labelled task file")
    p.add_argument("--model", required=True, help="fine-tuned model directory")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--data", required=True, help="labelled file (e.g. GLUE dev.tsv)")
    p.add_argument("--out", help="where the predictions go (default: the model directory)")
    _feature_arguments(p)
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("predict", help="a fine-tuned model's predictions for new inputs")
    p.add_argument("--model", required=True, help="fine-tuned model directory")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--data", required=True, help="inputs in the task's format (labels unused)")
    p.add_argument("--out", required=True, help="directory for the predictions file(s)")
    _feature_arguments(p)
    p.set_defaults(func=cmd_predict)

    helps = {
        "fill-mask": "top-k tokens for each [MASK] (a model with its MLM head)",
        "classify": "labels and probabilities (a fine-tuned classifier); --pairs: TEXT<TAB>PAIR",
        "ner": "entity spans with character offsets (a fine-tuned token classifier)",
        "qa": "answers: lines QUESTION<TAB>CONTEXT or JSONL {question, context}",
        "embed": "sentence embeddings (cls / mean / max pooling); --out x.npy for an array",
        "nsp": "P(IsNext) of lines TEXT<TAB>NEXT (a model with its NSP head)",
        "features": "hidden states of --layers (JSONL like Google's extract_features, or .npy/.npz)",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("model", help="model directory")
        p.add_argument("input", nargs="?", default="-", help="text file, .jsonl, or - (stdin)")
        p.add_argument("--out", help="output file (default: JSONL on stdout)")
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("--max-length", type=int, help="pieces per input (default: the model's)")
        p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
        p.add_argument("--device", help="cpu, cuda (default: a GPU if there is one)")
        if name == "fill-mask":
            p.add_argument("--top-k", type=int, default=5)
        if name == "classify":
            p.add_argument("--pairs", action="store_true", help="lines are TEXT<TAB>PAIR")
        if name == "embed":
            p.add_argument("--pooling", choices=("cls", "mean", "max"), default="mean")
            p.add_argument("--normalize", action="store_true", help="unit length")
        if name == "features":
            p.add_argument("--layers", default="-1", help="e.g. -1,-2,-3,-4 (0: embeddings)")
            p.add_argument("--combine", choices=("concat", "sum", "mean"), default="concat")
        p.set_defaults(func=cmd_pipeline, pipeline=name)

    p = sub.add_parser("serve", help="HTTP server: /embed, /classify, /fill-mask, /ner, /qa")
    p.add_argument("model", help="model directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--device", help="cpu, cuda (default: a GPU if there is one)")
    p.add_argument("--max-texts", type=int, default=64, help="texts per request (else 413)")
    p.add_argument("--max-chars", type=int, default=10_000, help="characters per text (else 413)")
    p.add_argument("--max-batch", type=int, default=64, help="texts per model call")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="batching wait")
    p.add_argument("--max-queue", type=int, default=1024, help="waiting requests (else 503)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("export", help="the model as ONNX, checked against PyTorch")
    p.add_argument("model", help="model directory")
    p.add_argument("--onnx", required=True, help="output .onnx file")
    p.add_argument("--atol", type=float, default=1e-4, help="allowed max |difference|")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("attention", help="attention views: an HTML head view or a PNG heatmap")
    p.add_argument("model", help="model directory")
    p.add_argument("text", help="the text to look at")
    p.add_argument("--pair", help="a second text (sentence pair)")
    p.add_argument("--layer", type=int, default=-1, help="layer (default -1: the last)")
    p.add_argument("--head", type=int, help="head (default: the mean of all heads)")
    p.add_argument("--out", required=True, help="view.html or view.png")
    p.set_defaults(func=cmd_attention)

    p = sub.add_parser("probe", help="logistic regression on frozen features, per layer choice")
    p.add_argument("--model", required=True)
    p.add_argument("--task", default="sst2", help="a single-sentence GLUE task, or csv")
    p.add_argument("--train", required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--layers", help='choices separated by ";" e.g. "-1;-2;concat:-1,-2,-3,-4"')
    p.add_argument("--pooling", choices=("mean", "cls"), default="mean")
    p.add_argument("--max-train", type=int, help="use the first N training sentences")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--json", help="also write the table as JSON here")
    _feature_arguments(p, sentences_only=True)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("plot", help="training curves of a run as a PNG")
    p.add_argument("run", help="run directory (with metrics.jsonl)")
    p.add_argument("--out", help="PNG file (default RUN/curves.png)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser(
        "demo", help="the BERT life cycle in minutes on the stdlib's docstrings (start here)"
    )
    p.add_argument(
        "--out", default="bertforge-demo", help="output directory (default bertforge-demo)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=600, help="pre-training steps (default 600)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=cmd_demo)
    _show_defaults(parser)
    return parser


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's --help says its default, unless its help text already does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _show_defaults(child)
            continue
        if (
            not action.option_strings
            or any(action.default is v for v in (None, False, argparse.SUPPRESS))
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            or "default" in (action.help or "")
        ):
            continue
        action.help = (
            f"{action.help} (default: %(default)s)" if action.help else "default: %(default)s"
        )


def _feature_arguments(p: argparse.ArgumentParser, sentences_only: bool = False) -> None:
    """Column and length settings of the task readers (probe: sentence tasks only)."""
    p.add_argument(
        "--max-seq-length", type=int, default=None, help="pieces per row (384 SQuAD, else 128)"
    )
    g = p.add_argument_group("--task csv: a table of your own")
    g.add_argument("--text-column", default="text", help="header name, or index with --no-header")
    g.add_argument("--text-pair-column", help="second text of sentence-pair tasks")
    g.add_argument("--label-column", default="label")
    g.add_argument("--regression", action="store_true", help="float labels (one output)")
    g.add_argument("--no-header", action="store_true", help="columns are 0-based indices")
    g.add_argument(
        "--delimiter", help="default: tab (write tab or \\t) unless the file ends in .csv"
    )
    g.add_argument(
        "--labels", help="comma-separated label (csv) or tag (conll2003) set (default: train's)"
    )
    if sentences_only:
        return
    g = p.add_argument_group("--task conll2003")
    g.add_argument("--tag-column", type=int, default=-1, help="tag column (default -1: the last)")
    g = p.add_argument_group("--task squad / squad2")
    g.add_argument("--doc-stride", type=int, default=128, help="pieces between window starts")
    g.add_argument("--max-query-length", type=int, default=64)
    g.add_argument("--max-answer-length", type=int, default=30)
    g.add_argument("--n-best-size", type=int, default=20)
    g.add_argument(
        "--null-score-diff-threshold",
        type=float,
        default=0.0,
        help="squad2: answer '' when null score - best span score exceeds this",
    )


def _join_layer_lists(argv: list[str]) -> list[str]:
    """`--layers -1,-2` (or `-1;-2`) as `--layers=-1,-2`: argparse reads "-1,-2" as an option
    (only a plain "-1" looks like a negative number to it)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--layers" and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"--layers={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_layer_lists(list(sys.argv[1:] if argv is None else argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"bertforge: warning: {msg}\n"  # type: ignore[assignment]
    try:
        args.func(args)
    except BertforgeError as e:
        print(f"bertforge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
