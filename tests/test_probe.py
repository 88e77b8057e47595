"""`bertforge probe`: frozen features per layer choice + logistic regression."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data.tasks import TaggedSentence
from bertforge.errors import ConfigError
from bertforge.pipelines import Pipeline
from bertforge.probe import combine, parse_choice
from bertforge.probe_tokens import (
    KINDS,
    TokenProbeOptions,
    cache_features,
    probe_tags,
    train_probe,
    word_labels,
)
from bertforge.tasks import tagging
from bertforge.tasks.base import IGNORE_INDEX
from bertforge.tasks.tagging import tag_set
from bertforge.tokenizer import Tokenizer
from tests.task_files import CITIES, conll_text, keyword_table, ner_sentences

pytest.importorskip("sklearn")


def test_combine_layer_choices() -> None:
    f = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)  # N=2, 3 layers + embeddings
    assert np.array_equal(combine(f, "-1"), f[:, 3])
    assert np.array_equal(combine(f, "0"), f[:, 0])
    assert np.array_equal(combine(f, "sum:-1,-2"), f[:, 3] + f[:, 2])
    assert combine(f, "concat:-1,-2").shape == (2, 6)
    assert np.array_equal(combine(f, "sum:all"), f.sum(1))
    with pytest.raises(ConfigError, match="layer 4"):
        combine(f, "4")
    with pytest.raises(ConfigError, match="integers"):
        combine(f, "sum:x")


def test_probe_on_frozen_minilm(
    tmp_path: Path,
    minilm_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bertforge import runner

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)  # off a terminal: a line each time
    train = keyword_table(tmp_path / "train.tsv", 96, seed=0)
    dev = keyword_table(tmp_path / "dev.tsv", 48, seed=1)
    out = tmp_path / "probe.json"
    rc = main(
        [
            "probe",
            "--model",
            str(minilm_dir),
            "--train",
            str(train),
            "--dev",
            str(dev),
            "--layers",
            "-1;0;concat:-1,-2",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["layers"] for r in rows] == ["-1", "0", "concat:-1,-2"]
    assert [r["dim"] for r in rows] == [384, 384, 768]
    # the tone words are easy to read off MiniLM's top layer; all choices beat chance
    assert rows[0]["dev_accuracy"] >= 0.9 and min(r["dev_accuracy"] for r in rows) > 0.6
    got = capsys.readouterr()
    assert "best: " in got.out
    # the features of thousands of sentences took minutes in silence: stderr says how far
    assert got.err.splitlines()[-1].startswith("features: 144/144 texts (100%)"), got.err


def test_probe_without_scikit_learn_is_one_clear_error(
    tmp_path: Path,
    minilm_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("sklearn", "sklearn.linear_model", "sklearn.preprocessing"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` raises ImportError: not installed
    train = keyword_table(tmp_path / "train.tsv", 8, seed=0)
    argv = ["probe", "--model", str(minilm_dir), "--train", str(train), "--dev", str(train)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs scikit-learn" in err[0]
    assert 'pip install "bertforge[probe]"' in err[0]


# -- the token probe (probe --task conll2003): frozen token features, a tagger, entity F1 --------


def conll_file(path: Path, sentences: list[list[tuple[str, str]]]) -> Path:
    path.write_text(conll_text(sentences))
    return path


def tagged(words: list[tuple[str, str]], source: str = "s") -> TaggedSentence:
    return TaggedSentence([w for w, _ in words], [t for _, t in words], source)


# words of several pieces ("Gwendolyn", "Tbilisi", "Smithson"), and one long enough for windows
SENTENCES = [
    tagged(
        [
            ("Gwendolyn", "B-PER"),
            ("Smithson", "I-PER"),
            ("went", "O"),
            ("to", "O"),
            ("Tbilisi", "B-LOC"),
        ]
    ),
    tagged([("Bob", "B-PER"), ("stayed", "O")]),
    tagged([(w, "B-LOC" if w in CITIES else "O") for w in ("the " * 12).split() + CITIES]),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cached_token_features_are_the_features_pipelines_first_pieces(
    tmp_path: Path, tiny_model: Path, dtype: str
) -> None:
    # max_length 12: the long sentence (20 words, more pieces) is read in overlapping windows
    pipe = Pipeline(tiny_model, max_length=12, precision="fp32")
    feats = cache_features(pipe, SENTENCES, tmp_path, dtype)
    layers = list(range(pipe.config.num_hidden_layers + 1))
    texts = [" ".join(s.tokens) for s in SENTENCES]
    want = pipe.features(texts, layers=layers, combine=None)
    assert len(feats.layers) == 3 and feats.layers[0].dtype == np.dtype(dtype)
    assert feats.has_piece.all()
    for i, (s, item) in enumerate(zip(SENTENCES, want)):
        starts = [len(" ".join(s.tokens[:w])) + (w > 0) for w in range(len(s.tokens))]
        first = [[a for a, _ in item["offsets"]].index(c, 1) for c in starts]  # by char
        if i == 0:  # "Gwendolyn" has several pieces: the next word's first is not piece 2
            assert first[0] == 1 and first[1] > 2
        index, _ = feats.sentence_words([i])
        for k in layers:
            got = np.asarray(feats.layers[k][index], np.float32)
            expected = item["layers"][k][first]
            if dtype == "float32":
                np.testing.assert_allclose(got, expected, atol=1e-5)
            else:
                np.testing.assert_allclose(got, expected.astype(np.float16), rtol=1e-3, atol=1e-3)


def test_token_features_cached_once_and_reused(tmp_path: Path, tiny_model: Path) -> None:
    pipe = Pipeline(tiny_model, precision="fp32")
    a = cache_features(pipe, SENTENCES, tmp_path)
    meta = json.loads(next(tmp_path.glob("*/meta.json")).read_text())
    assert meta == {"words": 27, "sentences": 3, "outputs": 3, "hidden": 128}

    def no_encoder(*args: object, **kwargs: object) -> None:
        raise AssertionError("the encoder ran again")

    pipe.per_token = no_encoder  # type: ignore[method-assign]
    b = cache_features(pipe, SENTENCES, tmp_path)
    assert all(np.array_equal(x, y) for x, y in zip(a.layers, b.layers))
    assert len(list(tmp_path.iterdir())) == 1
    cache_features(Pipeline(tiny_model, precision="fp32"), SENTENCES[:2], tmp_path)
    assert len(list(tmp_path.iterdir())) == 2  # other words: a cache of their own


def test_probe_labels_align_with_words_as_finetuning_does(tiny_model: Path) -> None:
    tok = Tokenizer.from_pretrained(tiny_model)
    # a word the tokenizer drops entirely (a zero-width space): no piece, no label, "O"
    sentences = [*SENTENCES, tagged([("Alice", "B-PER"), ("\u200b", "O"), ("left", "O")])]
    labels = tag_set(sentences)
    y = word_labels(sentences, labels)
    feats = cache_features(
        Pipeline(tiny_model, precision="fp32"), sentences, Path(tempfile.mkdtemp())
    )
    ft = tagging.featurize(sentences, tok, labels, max_seq_length=128)
    assert not feats.has_piece[-2] and feats.has_piece.sum() == len(y) - 1
    for i, (row_labels, first) in enumerate(zip(ft.labels, ft.meta)):
        index, _ = feats.sentence_words([i])
        # fine-tuning's labels sit on each word's first piece, in word order: the probe's
        # labels of the words that have a piece, one for one
        assert list(row_labels[first[first >= 0]]) == list(y[index][feats.has_piece[index]])
        assert list(row_labels[row_labels != IGNORE_INDEX]) == list(
            y[index][feats.has_piece[index]]
        )
        assert [labels[t] for t in y[index]] == sentences[i].tags


def test_token_probe_learns_names_and_cities_end_to_end(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = conll_file(tmp_path / "train.txt", ner_sentences(64, seed=0))
    dev = conll_file(tmp_path / "dev.txt", ner_sentences(32, seed=1))
    out = tmp_path / "probe.json"
    argv = [
        "probe",
        "--task",
        "conll2003",
        "--model",
        str(minilm_dir),
        "--train",
        str(train),
        "--dev",
        str(dev),
        "--layers",
        "-1;mix:all;concat:-1,-2",
        "--classifier",
        "linear",
        "--lr",
        "0.01",
        "--epochs",
        "6",
        "--train-batch-size",
        "8",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["layers"] for r in rows] == ["-1", "mix:all", "concat:-1,-2"]
    assert [r["dim"] for r in rows] == [384, 384, 768]
    # names and cities are easy to read off MiniLM's features: every choice tags them
    assert min(r["f1"] for r in rows) > 0.9, rows
    assert all(1 <= r["best_epoch"] <= 6 and len(r["epochs"]) == 6 for r in rows)
    assert len(rows[1]["mix_weights"]) == 7 and abs(sum(rows[1]["mix_weights"]) - 1) < 1e-6
    text = capsys.readouterr().out
    assert "dev entity F1" in text and "best: " in text


def test_token_probe_bilstm_is_deterministic_given_the_seed(
    tmp_path: Path, tiny_model: Path
) -> None:
    sentences = [tagged(s) for s in ner_sentences(24, seed=0)]
    labels = tag_set(sentences)
    o = TokenProbeOptions(lstm_hidden=8, epochs=2, train_batch_size=4, dropout=0.1, seed=3)
    runs = [
        probe_tags(str(tiny_model), sentences, sentences[:8], labels, ["-2", "mix:all"], o)
        for _ in range(2)
    ]

    def timeless(rows: list[dict]) -> list[dict]:
        return [
            {
                **r,
                "seconds": 0,
                "feature_seconds": 0,
                "epochs": [{**e, "seconds": 0} for e in r["epochs"]],
            }
            for r in rows
        ]

    assert timeless(runs[0]) == timeless(runs[1])
    assert [[e["loss"] for e in r["epochs"]] for r in runs[0]] == [
        [e["loss"] for e in r["epochs"]] for r in runs[1]
    ]
    assert probe_tags(str(tiny_model), sentences, sentences, labels, ["-1"], o, skip=["-1"]) == []


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ("foo:-1", "layer choice 'foo:-1': use N, sum:N,M,..., concat:N,M,..., mix:N,M,..."),
        ("mix:a,b", "layers are integers"),
        ("-1;concat:-1,-4", "layer -4 is not in -3..2 (this model has 2 layers"),
        ("3", "layer 3 is not in -3..2"),
        ("-1,-2", "layer choice '-1,-2': 2 layers; a bare choice is one layer"),
    ],
)
def test_token_probe_bad_layer_choices_are_one_clear_error(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], layers: str, message: str
) -> None:
    train = conll_file(tmp_path / "train.txt", ner_sentences(4, seed=0))
    argv = [
        "probe",
        "--task",
        "conll2003",
        "--model",
        str(tiny_model),
        "--train",
        str(train),
        "--dev",
        str(train),
        "--layers",
        layers,
        "--cache",
        str(tmp_path / "cache"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "cache").exists()  # refused before the encoder ran


def test_token_probe_file_without_tags_is_one_clear_error(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = conll_file(tmp_path / "train.txt", ner_sentences(4, seed=0))
    words = tmp_path / "words.txt"
    words.write_text("Alice\nwent\nhome\n\nBob\nstayed\n")  # tokens only: nothing to learn
    for a, b in ((words, train), (train, words)):
        argv = [
            "probe",
            "--task",
            "conll2003",
            "--model",
            str(tiny_model),
            "--train",
            str(a),
            "--dev",
            str(b),
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{words}: line 1: 1 column" in err[0], err


def test_mix_is_the_token_probes_alone() -> None:
    f = np.zeros((2, 4, 3), np.float32)
    with pytest.raises(ConfigError, match="use N, sum:N,M,..., concat:N,M,..."):
        combine(f, "mix:-1,-2")
    assert parse_choice("mix:all", 4, KINDS) == ("mix", [0, 1, 2, 3])
    assert parse_choice("concat:-1,-2", 4, KINDS) == ("concat", [3, 2])


def test_a_bare_choice_of_several_layers_is_refused() -> None:
    """features' spelling `-1,-2,-3,-4` (or `all`) is not a layer choice: it named a row after
    a list and summed it; the error names the prefixes that combine layers."""
    f = np.zeros((2, 5, 3), np.float32)
    for choice, n in (("-1,-2,-3,-4", 4), ("all", 5)):
        with pytest.raises(ConfigError, match=f"{n} layers; a bare choice is one layer") as e:
            combine(f, choice)
        assert "sum:" in str(e.value) and "concat:" in str(e.value)
        with pytest.raises(ConfigError, match="use sum:, concat: or mix:"):
            parse_choice(choice, 5, KINDS)
    assert parse_choice("-2", 5) == ("one", [3])


def test_token_probe_resumes_a_stopped_row_from_its_last_epoch(
    tmp_path: Path, tiny_model: Path
) -> None:
    sentences = [tagged(s) for s in ner_sentences(24, seed=0)]
    labels = tag_set(sentences)
    y = word_labels(sentences, labels)
    pipe = Pipeline(tiny_model, precision="fp32")
    train = cache_features(pipe, sentences, tmp_path / "cache")
    dev = cache_features(pipe, sentences[:8], tmp_path / "cache")
    gold = [s.tags for s in sentences[:8]]
    o = TokenProbeOptions(lstm_hidden=8, epochs=3, train_batch_size=4, dropout=0.1, seed=1)
    whole = train_probe(train, y, dev, gold, labels, "mix:all", o)

    class Stop(Exception):
        pass

    def stop_in_epoch_3(line: str) -> None:
        if "epoch 3: step" in line:
            raise Stop

    resume = tmp_path / "row.pt"
    with pytest.raises(Stop):
        train_probe(train, y, dev, gold, labels, "mix:all", o, stop_in_epoch_3, resume)
    assert resume.exists()
    lines: list[str] = []
    again = train_probe(train, y, dev, gold, labels, "mix:all", o, lines.append, resume)
    assert lines[0] == "  mix:all: resumed after epoch 2" and not resume.exists()
    assert [e["loss"] for e in again["epochs"]] == [e["loss"] for e in whole["epochs"]]
    assert again["mix_weights"] == whole["mix_weights"] and again["f1"] == whole["f1"]
