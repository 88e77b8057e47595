"""Smoke tests of every `bertforge` entry point, run as a user runs them (subprocesses)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bertforge import BertForPreTraining, Tokenizer


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bertforge", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


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
    assert "(default: 3e-5)" in shown and "default: 0" in " ".join(shown.split())


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "bertforge"
    out = subprocess.run([str(exe), "vocab", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout


def test_info_on_real_weights(minilm_dir: Path) -> None:
    out = run("info", str(minilm_dir))
    assert out.returncode == 0, out.stderr
    assert "L=6 H=384 A=12 I=1536" in out.stdout
    assert "22,713,216" in out.stdout  # all-MiniLM-L6-v2's parameter count
    assert "30,522 tokens, uncased" in out.stdout
    report = json.loads(run("info", str(minilm_dir), "--json").stdout)
    assert report["parameters"] == 22_713_216 and report["heads_present"] == ["pooler"]


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


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """The demo's whole path, made small: every step runs and leaves its outputs."""
    from bertforge.demo import run_demo
    from bertforge.heads import BertForSequenceClassification

    out = tmp_path / "demo"
    result = run_demo(out, steps=4, progress=False, sentences=200, epochs=1)
    assert len(result["before"]) == len(result["after"]) == 3
    assert 0.0 <= result["accuracy"] <= 1.0
    assert (out / "shards" / "meta.json").is_file() and (out / "vocab" / "vocab.txt").is_file()
    model = BertForPreTraining.from_pretrained(out / "pretrained")
    assert model.config.num_hidden_layers == 4
    classifier = BertForSequenceClassification.from_pretrained(out / "classifier")
    assert set(classifier.config.label2id) == {"real", "shuffled"}
    rows = (out / "acceptability" / "train.tsv").read_text().splitlines()
    assert rows[0] == "sentence\tlabel" and len(rows) == 201
