"""Smoke tests of every `bertforge` entry point, run as a user runs them (subprocesses)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge import Tokenizer


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bertforge", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


@pytest.mark.slow
def test_help_and_version() -> None:
    out = run("--help")
    assert out.returncode == 0
    for command in ("info", "vocab", "demo"):
        assert command in out.stdout
    assert run("--version").stdout.startswith("bertforge ")
    assert run().returncode == 0  # no command: help, not a crash


def test_every_option_help_says_its_default() -> None:
    from bertforge.cli import build_parser

    def parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = [p]
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for child in set(a.choices.values()):
                    found += parsers(child)
        return found

    checked = 0
    for p in parsers(build_parser()):
        for a in p._actions:
            valued = a.option_strings and not isinstance(
                a, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction)
            )
            if valued and a.default is not None and a.default is not argparse.SUPPRESS:
                assert "default" in (a.help or ""), (p.prog, a.option_strings)
                checked += 1
    assert checked > 50
    shown = run("finetune", "--help").stdout
    joined = " ".join(shown.split())
    assert "(default: 0.01)" in joined and "default: 0" in joined  # --weight-decay, --seed
    assert "(default: 3e-5, the paper tries" in joined and "1e-3 for the document" in joined


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "bertforge"
    out = subprocess.run([str(exe), "vocab", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout


@pytest.mark.slow
def test_info_on_real_weights(minilm_dir: Path) -> None:
    out = run("info", str(minilm_dir))
    assert out.returncode == 0, out.stderr
    assert "L=6 H=384 A=12 I=1536" in out.stdout
    assert "22,713,216" in out.stdout  # all-MiniLM-L6-v2's parameter count
    assert "30,522 tokens, uncased" in out.stdout
    report = json.loads(run("info", str(minilm_dir), "--json").stdout)
    assert report["parameters"] == 22_713_216 and report["heads_present"] == ["pooler"]


@pytest.mark.slow
def test_errors_are_one_line_with_status_2(tmp_path: Path) -> None:
    out = run("info", str(tmp_path / "missing"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"bertforge: error: {tmp_path / 'missing'}: no such file or directory"
    ]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\ncaf\xe9\n")
    out = run("vocab", "train", str(bad), "--size", "100", "--out", str(tmp_path / "v"))
    assert out.returncode == 2 and "bad.txt: line 2: byte 3" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "v").exists()  # nothing half-written


def test_vocab_train_writes_a_loadable_vocabulary(tmp_path: Path) -> None:
    corpus = tmp_path / "texts"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The cat sat on the mat.\nA dog barked at the cat.\n" * 40)
    (corpus / "b.txt").write_text("Émile's café served naïve customers.\n" * 40)
    out = run(
        "vocab", "train", str(corpus), "--size", "200", "--out", str(tmp_path / "vocab"), "--cased"
    )
    assert out.returncode == 0, out.stderr
    tok = Tokenizer.from_pretrained(tmp_path / "vocab")
    assert tok.lowercase is False and tok.vocab_size <= 200
    assert tok.decode(tok.encode("Émile's cat").ids) == "Émile's cat"


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """The demo's whole path, made small: every step runs and leaves its outputs."""
    from bertforge.demo import run_demo
    from bertforge.heads import BertForSequenceClassification

    out = tmp_path / "demo"
    result = run_demo(out, steps=4, progress=False, sentences=200, epochs=1)
    assert len(result["before"]) == len(result["after"]) == 3
    assert 0.0 <= result["accuracy"] <= 1.0
    assert (out / "shards" / "meta.json").is_file() and (out / "vocab" / "vocab.txt").is_file()
    from bertforge.heads import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(out / "pretrained")  # masked LM alone: no NSP head
    assert model.config.num_hidden_layers == 2  # tiny: the size that learns soonest in the demo
    assert all(0 <= x <= 1 for x in result["mlm_acc"])
    for hits, distinct in result["top5"]:  # of the 10 held-out probe sentences
        assert 0 <= hits <= 10 and 1 <= distinct <= 10
    classifier = BertForSequenceClassification.from_pretrained(out / "classifier")
    assert set(classifier.config.label2id) == {"real", "shuffled"}
    rows = (out / "acceptability" / "train.tsv").read_text().splitlines()
    assert rows[0] == "sentence\tlabel" and len(rows) == 201


def test_demo_probe_masks_a_frequent_word_that_is_not_a_function_word() -> None:
    """The demo's held-out probe: each sentence's masked word is one piece of the vocabulary
    ranked from COMMON to FREQUENT in the corpus (not "the"), at most `limit` sentences."""
    import random

    from bertforge.demo import COMMON, masked_sentences, word_ranks

    docs = [[" ".join(["the"] * 50 + [f"w{i}" for i in range(60)] + ["parser"] * 3)]]
    ranks = word_ranks([[p.replace("w", "word") for p in d] for d in docs])
    assert ranks["the"] == 0 and ranks["parser"] == 1
    ranks = {w: COMMON + r for w, r in ranks.items() if w != "the"} | {"the": 0}
    tok = type("T", (), {"tokenize": staticmethod(lambda w: [w])})()
    sentences = ["the parser reads the file", "the the the", "a parser and the parser"] * 5
    masked = masked_sentences(sentences, tok, random.Random(0), ranks, limit=4)
    assert len(masked) == 4
    for text, word in masked:
        assert word == "parser" and "[MASK]" in text and "the" in text.split()


# ------------------------------------------------------------------------------------------------
# Every error a user can cause: one line, status 2, nothing written


# Bad command lines and what their one line of error must say. {pre} and {fine} stand for a
# valid pretrain / finetune command line, {S} shards, {M} a tiny model without task heads,
# {T} a training table, {O} an output that must not appear, {P} a text file, {X} MiniLM.
BAD_LINES = """
{pre} --precision fp16                         | fp16 (with loss scaling) is for CUDA GPUs
{pre} --batch-size 0                           | batch_size=0 (--batch-size): must be >= 1
{pre} --lr -1                                  | lr=-1.0 (--lr): must be > 0
{pre} --masked-lm-prob 1.5                     | masked_lm_prob=1.5 (--masked-lm-prob): must be > 0 and < 1
{pre} --warmup-ratio 2                         | warmup_ratio=2.0 (--warmup-ratio): must be >= 0 and <= 1
{pre} --max-seq-length 100000                  | max_position_embeddings=512
{pre} --micro-batch-size 7                     | split evenly
{pre} --model-size huge                        | invalid choice: 'huge'
{pre} --steps ten                              | invalid int value: 'ten'
{pre} --dropout 1                              | dropout=1.0 (--dropout): must be >= 0 and < 1
{pre} --config {tmp}/config.json --init {M}    | not both
{pre} --device tpu                             | device='tpu'
{pre} --seed -1                                | seed=-1 (--seed): must be >= 0 and <= 4294967295
{pre} --seed 4294967296                        | seed=4294967296 (--seed): must be >= 0
{pre} --seed 1e23                              | invalid int value: '1e23'
{pre} --minutes 1e308                          | minutes=1e+308 (--minutes): must be <= 1e+06 and > 0
pretrain --data {S} --out {S}                  | --out {S} is the run's --data
pretrain --data {S} --out {M} --init {M}       | --out {M} is the run's --init
pretrain --data {tmp}/nowhere --out {O}        | nowhere
{fine} --precision fp16                        | fp16 (with loss scaling) is for CUDA GPUs
{fine} --max-seq-length 100000                 | max_seq_length=100000 (--max-seq-length): the model has
{fine} --epochs 0                              | epochs=0.0 (--epochs): must be > 0
{fine} --dev-split 1.5                         | dev_split=1.5
{fine} --warmup-ratio -0.1                     | warmup_ratio=-0.1
{fine} --seed -1                               | seed=-1 (--seed): must be >= 0
finetune --model {M} --task sst2 --train {T} --out {M} | --out {M} is the run's --model
distill --teacher {X} --out {X} --data {P} --student-layers 0 | --out {X} is the run's --teacher
distill --teacher {X} --student {M} --out {M} --data {P} | --out {M} is the run's --student
demo --out {O} --seed -1                       | seed=-1 (--seed)
demo --out {O} --minutes -2                    | minutes=-2.0 (--minutes): must be > 0
demo --out {O} --minutes nan                   | minutes=nan (--minutes): must be > 0
demo --out {O} --steps 0                       | steps=0 (--steps): must be >= 1
serve {X} --port 0                             | a TCP port is an integer in 1-65535
serve {X} --port 70000                         | a TCP port is an integer in 1-65535
prepare {tmp}/corpus.txt --tokenizer {M} --out {O} --seed -1 | seed=-1 (--seed)
finetune --model {M} --task nope --train {T} --out {O}          | invalid choice: 'nope'
finetune --model {tmp}/nomodel --task sst2 --train {T} --out {O} | nomodel
finetune --model {M} --task sst2 --train {tmp}/gone.tsv --out {O} | gone.tsv
finetune --task sst2 --train {T} --out {O}     | the following arguments are required: --model
evaluate --model {M} --task sst2 --data {T}    | no trained BertForSequenceClassification head
predict --model {M} --task sst2 --data {T}     | required: --out
embed {X} {P} --pooling foo                    | invalid choice: 'foo'
embed {X} {P} --batch-size 0                   | batch_size=0
embed {X} {P} --precision fp16                 | fp16
distill --teacher {X} --out {O} --data {P} --student-layers 0,9 | student layers [0, 9]
distill --teacher {X} --out {O} --data {P} --student-layers 0 --steps 0 | steps=0
distill --teacher {X} --out {O} --data {P} --student-layers x | --student-layers
distill --teacher {X} --out {O} --data {P}   | give the student once
distill --teacher {X} --out {O} --data {P} --student-layers 0 --student-size mini | got ['--student-layers', '--student-size']
distill --teacher {X} --out {O} --data {P} --student-size huge | student_size='huge'
distill --teacher {X} --out {O} --student-layers 0 | data (--data)
distill --teacher {X} --out {O} --student-layers 0 --task sst2 | --task sst2: give the training file (--train)
distill --teacher {X} --out {O} --data {P} --student-layers 0 --task sst2 --train {T} | --data is for general distillation
distill --teacher {X} --out {O} --student-layers 0 --task sst2 --train {T} | no trained BertForSequenceClassification head
distill --teacher {X} --out {O} --student-layers 0 --task sst2 --train {T} --alpha 2 | alpha=2.0 (--alpha): must be >= 0 and <= 1
distill --teacher {X} --out {O} --student-layers 0 --task sst2 --train {T} --token-weight 1 | token_weight=1.0 (--token-weight) is for general distillation
distill --teacher {X} --out {O} --data {P} --student-layers 0 --dropout 1 | dropout=1.0 (--dropout): must be >= 0 and < 1
features {X} {P} --layers 99                   | layer 99
fill-mask {M} {P}                              | no [MASK] token
classify {X} {P}                               | no trained classifier
qa {M} {tmp}/qa.txt                            | tab-separated fields
qa {M} {tmp}/qa.txt --max-length 64            | --max-length is not used by qa: qa's windows are --max-seq-length pieces
qa {M} {tmp}/qa.txt --stride 8                 | --stride is not used by qa: qa's windows are --doc-stride pieces apart
qa {M} {tmp}/qa.txt --truncate                 | --truncate is not used by qa
fill-mask {M} {P} --stride 8                   | --stride is not used by fill-mask: each input is one row
nsp {M} {P} --truncate                         | --truncate is not used by nsp
classify {X} {P} --pairs --stride 8            | --stride is not used by classify --pairs
classify {X} {tmp}/pairs.jsonl                 | line 1: field "text_pair" is read with --pairs
embed {X} {P} --out {P}                        | --out {P} is the input file
embed {X} {P} --quantize int8 --precision bf16 | quantize=int8 with precision=bf16
serve {X} --max-batch 0                        | max_batch=0 (--max-batch): must be >= 1
prepare {tmp}/corpus.txt --tokenizer {M} --out {O} --heldout 1.5 | heldout=1.5
prepare {tmp}/corpus.txt --tokenizer {M} --out {O} --format nope | invalid choice: 'nope'
vocab train {tmp}/corpus.txt --size 3 --out {O}                  | vocab_size=3
export {X} --onnx {O}/m.onnx --atol -1         | atol=-1.0
attention {X} hello --out {O}/v.txt            | .html or .png
probe --model {X} --task mrpc --train {T} --dev {T} | single-sentence
info {tmp}/missing                             | no such file or directory
plot {tmp}/norun                               | nothing to plot
"""


@pytest.fixture(scope="module")
def bad_lines(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, minilm_dir: Path) -> list:
    from bertforge.data.shards import prepare
    from tests.task_files import keyword_table

    tmp = tmp_path_factory.mktemp("bad")
    docs = (f"Line one of {d}.\nLine two of {d}.\nAnd a third." for d in range(30))
    (tmp / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    prepare(
        [tmp / "corpus.txt"],
        Tokenizer.from_pretrained(tiny_model),
        tmp / "shards",
        fmt="lines",
        progress=False,
    )
    keyword_table(tmp / "train.tsv", 20, seed=0)
    (tmp / "plain.txt").write_text("no mask in this line\n")
    (tmp / "qa.txt").write_text("a question without its context\n")
    (tmp / "pairs.jsonl").write_text('{"text": "a premise", "text_pair": "its hypothesis"}\n')
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
    (tmp / "config.json").write_text(json.dumps(config))
    names = {
        "S": tmp / "shards",
        "M": tiny_model,
        "T": tmp / "train.tsv",
        "O": tmp / "out",
        "P": tmp / "plain.txt",
        "X": minilm_dir,
        "tmp": tmp,
    }
    names["pre"] = "pretrain --data {S} --out {O}".format(**names)
    names["fine"] = "finetune --model {M} --task sst2 --train {T} --out {O}".format(**names)
    lines = []
    for row in BAD_LINES.strip().splitlines():
        args, expected = row.rsplit("|", 1)
        expected = expected.strip().format(**names)
        lines.append((shlex.split(args.format(**names)), expected, tmp / "out"))
    return lines


def test_bad_command_lines_end_in_one_line_and_status_2(
    bad_lines: list, capsys: pytest.CaptureFixture
) -> None:
    from bertforge.cli import main

    assert len(bad_lines) >= 25
    verbs = set()
    for argv, expected, out in bad_lines:
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (argv, err)
        assert len(err) == 1 and err[0].startswith("bertforge: error: "), (argv, err)
        assert expected in err[0], (argv, err[0])
        assert not out.exists(), (argv, "wrote something")
        verbs.add(argv[0])
    assert len(verbs) >= 14


def test_cli_defaults_are_the_configs_defaults() -> None:
    import inspect

    from bertforge.cli import build_parser
    from bertforge.config import SIZES
    from bertforge.data.corpus import FORMATS
    from bertforge.data.shards import prepare
    from bertforge.data.tasks import TASK_NAMES
    from bertforge.demo import run_demo
    from bertforge.export import export_onnx
    from bertforge.pipelines import Pipeline
    from bertforge.runner import PRECISIONS
    from bertforge.serve import Limits, serve
    from bertforge.tasks import TaskOptions
    from bertforge.tokenizer import train_vocab
    from bertforge.train.distill import DistillConfig
    from bertforge.train.finetune import FinetuneConfig, evaluate_model, predict
    from bertforge.train.pretrain import PretrainConfig

    pipelines = [Pipeline, Pipeline.embed, Pipeline.fill_mask, Pipeline.features]
    targets = {
        "pretrain": [PretrainConfig],
        "finetune": [FinetuneConfig],
        "distill": [DistillConfig],
        "evaluate": [TaskOptions, evaluate_model],
        "predict": [TaskOptions, predict],
        "prepare": [prepare],
        "train": [train_vocab],
        "serve": [Limits, serve, Pipeline],
        "export": [export_onnx],
        "demo": [run_demo],
        "probe": [TaskOptions],
        **{
            v: pipelines for v in ("embed", "features", "fill-mask", "classify", "ner", "qa", "nsp")
        },
    }

    def defaults(target: object) -> dict[str, object]:
        return {
            n: p.default
            for n, p in inspect.signature(target).parameters.items()
            if p.default is not inspect.Parameter.empty
        }

    def parsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found = {}
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    found[name] = child
                    found.update(parsers(child))
        return found

    checked = 0
    for verb, p in parsers(build_parser()).items():
        known: dict[str, object] = {}
        for target in targets.get(verb, []):
            known.update(defaults(target))
        for a in p._actions:
            if a.dest in known and a.option_strings:
                assert a.default == known[a.dest], (verb, a.dest, a.default, known[a.dest])
                checked += 1
            if a.dest == "precision":
                assert tuple(a.choices) == PRECISIONS, verb
    assert checked > 100
    options = {a.dest: a for a in parsers(build_parser())["pretrain"]._actions}
    assert tuple(options["model_size"].choices) == tuple(SIZES)
    assert (
        tuple(parsers(build_parser())["finetune"]._option_string_actions["--task"].choices)
        == TASK_NAMES
    )
    assert (
        tuple(parsers(build_parser())["prepare"]._option_string_actions["--format"].choices)
        == FORMATS
    )


# Every verb with a path the user gave that cannot be used: {U} an output under a regular file
# (not writable, even by root), {F} an existing file where a directory is written, {D} a
# directory where a file is written or read, {N} a file that does not exist. {C} is a
# classifier, {R} a run with metrics; the rest as in BAD_LINES.
OS_ERRORS = """
vocab train {P} --size 100 --out {U}                                   | {P}
vocab train {P} --size 100 --out {F}                                   | {F}
vocab train {N} --size 100 --out {O}                                   | {N}
prepare {P} --tokenizer {M} --out {U}                                  | {P}
prepare {P} --tokenizer {M} --out {F}                                  | {F}
prepare {N} --tokenizer {M} --out {O}                                  | {N}
pretrain --data {S} --out {U} --steps 1                                | {P}
pretrain --data {S} --out {F} --steps 1                                | {F}
pretrain --data {D} --out {O} --steps 1                                | {D}
finetune --model {M} --task sst2 --train {T} --out {U} --epochs 1      | {P}
finetune --model {M} --task sst2 --train {T} --out {F} --epochs 1      | {F}
finetune --model {M} --task sst2 --train {D} --out {O} --epochs 1      | {D}
distill --teacher {M} --student-layers 0 --data {P} --out {U} --steps 1 | {P}
distill --teacher {M} --student-layers 0 --data {P} --out {F} --steps 1 | {F}
distill --teacher {M} --student-layers 0 --data {N} --out {O} --steps 1 | {N}
evaluate --model {C} --task sst2 --data {T} --out {U}                  | {P}
evaluate --model {C} --task sst2 --data {T} --out {F}                  | {F}
evaluate --model {C} --task sst2 --data {D}                            | {D}
predict --model {C} --task sst2 --data {T} --out {U}                   | {P}
predict --model {C} --task sst2 --data {T} --out {F}                   | {F}
predict --model {C} --task sst2 --data {N} --out {O}                   | {N}
embed {M} {P} --out {U}/e.npy                                          | {P}
embed {M} {P} --out {D}                                                | {D}
embed {M} {D}                                                          | {D}
features {M} {P} --out {U}/f.jsonl                                     | {P}
features {M} {P} --out {D}                                             | {D}
classify {C} {P} --out {U}/c.jsonl                                     | {P}
classify {C} {N}                                                       | {N}
attention {M} hello --out {U}/v.html                                   | {P}
attention {M} hello --out {D}.html                                      | {D}.html
plot {R} --out {U}/c.png                                               | {P}
plot {R} --out {D}                                                     | {D}
plot {D}                                                               | {D}
info {D}                                                               | {D}
info {P}                                                               | {P}
"""


def test_os_errors_on_every_verb_are_one_line(
    bad_lines: list, tiny_model: Path, capsys: pytest.CaptureFixture
) -> None:
    """Unwritable outputs, files where directories go and the reverse, missing and unreadable
    inputs: one line naming the path, status 2, for every verb that reads or writes a path."""
    from bertforge import BertConfig, BertForSequenceClassification
    from tests.conftest import TINY

    tmp = bad_lines[0][2].parent
    tok = Tokenizer.from_pretrained(tiny_model)
    classifier = tmp / "classifier"
    labels = {0: "0", 1: "1"}
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size, "id2label": labels})
    BertForSequenceClassification(config).save_pretrained(classifier)
    tok.save_pretrained(classifier)
    run = tmp / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n')
    (tmp / "dir").mkdir(exist_ok=True)
    (tmp / "dir.html").mkdir(exist_ok=True)
    names = {
        "P": tmp / "plain.txt",
        "U": tmp / "plain.txt" / "out",
        "F": tmp / "plain.txt",
        "D": tmp / "dir",
        "N": tmp / "nowhere.txt",
        "S": tmp / "shards",
        "M": tiny_model,
        "T": tmp / "train.tsv",
        "O": tmp / "out",
        "C": classifier,
        "R": run,
    }
    before = (tmp / "plain.txt").read_bytes()
    verbs, failures = set(), []
    for row in OS_ERRORS.strip().splitlines():
        args, expected = row.rsplit("|", 1)
        argv, code, err = run_row(args, names, capsys)
        if code != 2 or len(err) != 1 or expected.strip().format(**names) not in err[0]:
            failures.append((args.strip(), code, err[-3:]))
        assert not (tmp / "out").exists(), (argv, "wrote something")
        verbs.add(argv[0])
    assert not failures, "\n".join(map(str, failures))
    assert (tmp / "plain.txt").read_bytes() == before  # the file in the way is left alone
    assert len(verbs) >= 11


# Row limits, --minutes, evaluate/predict without --task, probe's tasks: one line, status 2.
LIMITS_AND_BUDGETS = """
finetune --model {M} --task sst2 --train {T} --out {O} --max-train-rows 0 | max_train_rows=0 (--max-train-rows): must be >= 1
finetune --model {M} --task sst2 --train {T} --out {O} --max-dev-rows x | invalid int value: 'x'
distill --teacher {X} --out {O} --data {P} --student-layers 0 --max-train-rows 5 | are for task distillation
evaluate --model {M} --data {T}                | no run.json saying which task
predict --model {M} --data {T} --out {O}       | give the task (--task)
pretrain --data {S} --out {O} --minutes 0      | minutes=0.0 (--minutes): must be <= 1e+06 and > 0
probe --model {X} --task stsb --train {T} --dev {T} | probe takes single-sentence tasks: cola, sst2, csv
"""


def test_row_limits_budgets_and_run_settings_errors(
    bad_lines: list, tiny_model: Path, minilm_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    from bertforge.cli import main

    tmp = bad_lines[0][2].parent  # the files the bad_lines fixture wrote
    files = {"S": "shards", "T": "train.tsv", "O": "out", "P": "plain.txt"}
    names = {**{k: tmp / v for k, v in files.items()}, "M": tiny_model, "X": minilm_dir}
    for row in LIMITS_AND_BUDGETS.strip().splitlines():
        args, expected = row.rsplit("|", 1)
        argv = shlex.split(args.format(**names))
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (argv, err)
        assert err[0].startswith("bertforge: error: ") and expected.strip() in err[0], (argv, err)
        assert not (tmp / "out").exists(), (argv, "wrote something")


# Every path a command writes, where it resolves inside something the command reads (an
# index, a model directory, shards, a corpus directory, a run's files), links followed: one
# line naming the option, the path and the input, status 2, and nothing written or changed.
# {L} is a link to the model directory {M}; {K} a link to {M}/config.json.
INSIDE_INPUTS = """
mine {I} {Y} --out {I}/documents.jsonl            | --out {I}/documents.jsonl is inside the index directory {I}
mine {I} {Y} --out {I}/index.json                 | --out {I}/index.json is inside the index directory {I}
mine {I} {Y} --out {I}/vectors.npy                | --out {I}/vectors.npy is inside the index directory {I}
mine {I} {Y} --out {I}                            | --out {I} is the index directory {I}
mine {I} {Y} --out {K}                            | --out {K} is inside the index's model directory
search {I} {Q} --out {I}/documents.jsonl          | --out {I}/documents.jsonl is inside the index directory {I}
search {I} {Q} --out {L}/vocab.txt                | --out {L}/vocab.txt is inside the index's model directory
search {I} {Q} --rerank {N} --out {N}/c.jsonl     | --out {N}/c.jsonl is inside the reranker directory {N}
embed {L} {P} --out {M}/config.json               | --out {M}/config.json is inside the model directory {L}
embed {M} {P} --out {K}                           | --out {K} is inside the model directory {M}
features {M} {P} --out {L}/f.npy                  | --out {L}/f.npy is inside the model directory {M}
fill-mask {M} {P} --out {M}                       | --out {M} is the model directory {M}
summarize {M} {P} --out {M}/summarizer.json       | --out {M}/summarizer.json is inside the model directory {M}
index {M} {C} --out {L}/idx                       | --out {L}/idx is inside the model directory {M}
merge {M} {N} --out {M}/merged                    | --out {M}/merged is inside the model directory {M}
export {M} --onnx {M}/model.onnx                  | --onnx {M}/model.onnx is inside the model directory {M}
attention {M} hello --out {L}/view.png            | --out {L}/view.png is inside the model directory {M}
probe --model {M} --train {T} --dev {T} --json {M}/p.json | --json {M}/p.json is inside the model directory {M}
plot {R} --out {R}/metrics.jsonl                  | --out {R}/metrics.jsonl is the metrics file
evaluate --model {M} --task sst2 --data {T} --out {M}/p | --out {M}/p is inside the model directory {M}
predict --model {M} --task sst2 --data {T} --out {L} | --out {L} is the model directory {M}
prepare {C} --tokenizer {M} --out {M}/shards      | --out {M}/shards is inside the tokenizer directory {M}
prepare {D} --tokenizer {M} --out {D}/shards      | --out {D}/shards is inside the corpus directory {D}
vocab train {D} --size 200 --out {D}/vocab        | --out {D}/vocab is inside the corpus directory {D}
pretrain --data {S} --out {S}/run --steps 1       | --out {S}/run is inside the run's --data directory {S}
pretrain --data {S} --init {L} --out {M}/run --steps 1 | --out {M}/run is inside the run's --init directory {L}
finetune --model {M} --task sst2 --train {T} --out {L}/run --epochs 1 | --out {L}/run is inside the run's --model directory {M}
finetune --model {M} --task sst2 --train {T} --dev {T} --out {T} --epochs 1 | --out {T} is the run's --train file
distill --teacher {M} --student-layers 0 --data {D} --out {D}/s --steps 1 | --out {D}/s is inside the run's --data directory {D}
distill --teacher {M} --student-layers 0 --data {P} --out {M}/s --steps 1 | --out {M}/s is inside the run's --teacher directory {M}
search {I} {Q} --out {C}                          | --out {C} is the index's corpus file
mine {I} {Y} --out {C}                            | --out {C} is the index's corpus file
vocab train {P} --size 200 --out {N}              | --out {N} holds a model (config.json)
prepare {C} --tokenizer {M} --out {I}             | --out {I} holds an index (index.json)
prepare {C} --tokenizer {M} --out {N}             | --out {N} holds a model (config.json)
demo --out {N}                                    | --out {N} holds a model (config.json)
"""


def test_outputs_inside_what_a_command_reads_are_refused(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture
) -> None:
    """mine --out idx/documents.jsonl and its kind wrote over the index, model or data the
    command was reading, exit 0: each written path is now checked against every input."""
    import os
    import shutil

    from bertforge.data.shards import prepare
    from bertforge.search import Index
    from tests.task_files import keyword_table

    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    shutil.copytree(tiny_model, tmp_path / "model2")
    (tmp_path / "link").symlink_to(model, target_is_directory=True)
    (tmp_path / "k.jsonl").symlink_to(model / "config.json")
    docs = [f"Document {d} is about the number {d} and its neighbours." for d in range(6)]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "c.txt").write_text("\n".join(docs) + "\n")
    tok = Tokenizer.from_pretrained(model)
    prepare([tmp_path / "corpus" / "c.txt"], tok, tmp_path / "shards", fmt="lines", progress=False)
    Index.build(model, tmp_path / "corpus" / "c.txt", tmp_path / "idx", progress=False)
    (tmp_path / "q.txt").write_text("the number 3\n")
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"query": "3", "positive": docs[3]}) + "\n")
    keyword_table(tmp_path / "train.tsv", 12, seed=0)
    (tmp_path / "plain.txt").write_text("a [MASK] here\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    files = {"I": "idx", "Y": "pairs.jsonl", "Q": "q.txt", "L": "link", "K": "k.jsonl"}
    files |= {"M": "model", "P": "plain.txt", "C": "corpus/c.txt", "D": "corpus"}
    files |= {"S": "shards", "T": "train.tsv", "R": "run", "N": "model2"}
    names = {k: tmp_path / v for k, v in files.items()}

    def snapshot() -> dict[str, bytes]:
        return {
            str(Path(d) / f): (Path(d) / f).read_bytes()
            for d, _, fs in os.walk(tmp_path)
            for f in fs
        }

    before, failures = snapshot(), []
    for row in INSIDE_INPUTS.strip().splitlines():
        args, expected = row.rsplit("|", 1)
        _, code, err = run_row(args, names, capsys)
        said = expected.strip().format(**names)
        if code != 2 or len(err) != 1 or said not in err[0] or snapshot() != before:
            failures.append((args.strip(), code, err[-2:]))
    assert not failures, "\n".join(map(str, failures))


def test_help_texts_say_what_the_flags_do() -> None:
    from bertforge.cli import build_parser

    (verbs,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]

    def shown(verb: str) -> str:
        return " ".join(verbs.choices[verb].format_help().split())

    for verb in ("pretrain", "finetune", "distill", "demo"):
        assert "--no-progress no progress bars" in shown(verb), verb
    assert "--task {cola,sst2,csv,conll2003}" in shown("probe")
    # a pipeline verb offers the Pipeline options it reads, not those it does not
    assert "--max-length" in shown("embed") and "--stride" in shown("classify")
    assert "--max-seq-length" in shown("qa") and "--max-length" not in shown("qa")
    assert "--stride" not in shown("fill-mask") and "--truncate" not in shown("nsp")
    assert "default: none, metrics only" in shown("evaluate")
    assert "default: the task of the model's run.json" in shown("predict")
    assert "--max-train-rows MAX_TRAIN_ROWS train on the first N" in shown("finetune")
    assert "--minutes MINUTES train for about M minutes instead of --steps" in shown("pretrain")


def run_row(
    args: str, names: dict[str, Path], capsys: pytest.CaptureFixture
) -> tuple[list[str], object, list[str]]:
    """A table row's command line (its {X} names filled in) run through main: (argv, exit
    status, the lines it printed on stderr)."""
    from bertforge.cli import main

    argv = shlex.split(args.format(**names))
    try:
        code: object = main(argv)
    except SystemExit as e:
        code = e.code
    return argv, code, capsys.readouterr().err.strip().splitlines()
