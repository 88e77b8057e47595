"""`prepare`: shards that hold exactly the tokenized documents; resumable; clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertforge import DataError, Tokenizer
from bertforge.data import shards as shards_module
from bertforge.data.corpus import read_corpus
from bertforge.data.shards import ShardSet, _is_heldout, prepare


def write_corpus(root: Path, docs: int = 60) -> list[Path]:
    """Google-format, WikiExtractor and JSONL files of plain English sentences."""
    rng = np.random.default_rng(0)
    words = (
        "the quick brown fox jumps over a lazy dog while seven wizards quietly box and judge my vow"
    )
    words = words.split()

    def sentence() -> str:
        return " ".join(rng.choice(words, rng.integers(3, 14))).capitalize() + "."

    root.mkdir(parents=True, exist_ok=True)
    google = root / "google.txt"
    google.write_text(
        "\n\n".join("\n".join(sentence() for _ in range(rng.integers(1, 12))) for _ in range(docs))
        + "\n"
    )
    wiki = root / "wiki_00"
    wiki.write_text(
        "".join(
            f'<doc id="{i}" url="u" title="T{i}">\nT{i}\n\n'
            + " ".join(sentence() for _ in range(5))
            + "\n</doc>\n"
            for i in range(docs // 3)
        )
    )
    jsonl = root / "docs.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps({"text": " ".join(sentence() for _ in range(4))}) + "\n"
            for _ in range(docs // 3)
        )
    )
    return [google, wiki, jsonl]


@pytest.fixture(scope="module")
def tok(minilm_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(minilm_dir)


def test_shards_hold_every_document_exactly(tmp_path: Path, tok: Tokenizer) -> None:
    files = write_corpus(tmp_path / "corpus")
    meta = prepare(
        files,
        tok,
        tmp_path / "out",
        shard_tokens=800,
        heldout=0.2,
        batch_sentences=30,
        progress=False,
    )
    s = ShardSet(tmp_path / "out")
    assert s.meta == meta and meta["dtype"] == "uint16"
    assert s.count("train", "shards") > 3 and s.count("heldout", "documents") > 5
    expected = {"train": [], "heldout": []}
    for ordinal, doc in enumerate(read_corpus(files)):
        split = "heldout" if _is_heldout(ordinal, 0, 0.2) else "train"
        expected[split].append([tok.encode_ids([x])[0] for x in doc.sentences])
    for split in ("train", "heldout"):
        got = []
        for name in s.names(split):
            shard = s.load(name)
            assert shard.tokens.dtype == np.uint16
            for d in range(shard.num_documents):
                first, last = shard.documents[d], shard.documents[d + 1]
                got.append(
                    [
                        shard.tokens[shard.sentences[i] : shard.sentences[i + 1]].tolist()
                        for i in range(first, last)
                    ]
                )
        assert got == expected[split]
        assert s.count(split) == sum(len(t) for doc in got for t in doc)
    assert (
        Tokenizer.from_pretrained(tmp_path / "out").tokens == tok.tokens
    )  # the tokenizer travels along


def test_interrupted_prepare_resumes_to_identical_shards(
    tmp_path: Path, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_corpus(tmp_path / "corpus")
    kwargs = {"shard_tokens": 1500, "heldout": 0.2, "batch_sentences": 100, "progress": False}
    prepare(files, tok, tmp_path / "clean", **kwargs)

    real = shards_module._write_shard
    calls = {"n": 0}

    def crash_on_fifth(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-run
        return real(*args, **kw)

    monkeypatch.setattr(shards_module, "_write_shard", crash_on_fifth)
    with pytest.raises(KeyboardInterrupt):
        prepare(files, tok, tmp_path / "resumed", **kwargs)
    monkeypatch.setattr(shards_module, "_write_shard", real)
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert (
        progress["state"]["documents_done"] > 0
        and not (tmp_path / "resumed" / "meta.json").exists()
    )
    with pytest.raises(DataError, match="interrupted prepare: run it again"):
        ShardSet(tmp_path / "resumed")

    meta = prepare(files, tok, tmp_path / "resumed", **kwargs)
    clean = json.loads((tmp_path / "clean" / "meta.json").read_text())
    assert meta["counts"] == clean["counts"]
    for info in clean["shards"]:
        for suffix in (".tokens.npy", ".index.npz"):
            a = (tmp_path / "clean" / (info["name"] + suffix)).read_bytes()
            assert a == (tmp_path / "resumed" / (info["name"] + suffix)).read_bytes(), info["name"]
    assert not (tmp_path / "resumed" / "progress.json").exists()
    assert not list((tmp_path / "resumed").glob(".*tmp"))


def test_prepare_again_and_with_other_settings(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "out", progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    prepare(files, tok, tmp_path / "out", progress=True)
    assert "already prepared" in capsys.readouterr().out
    assert before == {
        p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()
    }  # nothing rewritten
    with pytest.raises(DataError, match="already holds shards prepared with other settings"):
        prepare(files, tok, tmp_path / "out", heldout=0.5, progress=False)


def test_prepare_notices_an_input_edited_to_the_same_size(tmp_path: Path, tok: Tokenizer) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "out", progress=False)
    text = files[0].read_text()
    files[0].write_text(text.replace("fox", "cat"))  # the same size, other text
    assert files[0].stat().st_size == len(text)
    with pytest.raises(
        DataError, match=rf"already holds shards .*\(meta.json: {files[0].resolve()} changed\)"
    ):
        prepare(files, tok, tmp_path / "out", progress=False)
    with pytest.raises(DataError, match=r"shard_tokens=0 \(--shard-tokens\): must be at least 1"):
        prepare(files, tok, tmp_path / "other", shard_tokens=0, progress=False)
    assert not (tmp_path / "other").exists()


def test_special_token_strings_in_the_corpus_are_text(tmp_path: Path, tok: Tokenizer) -> None:
    """Google's FullTokenizer reads "[SEP]" in a corpus as "[", "sep", "]": the shards hold no
    control token the text wrote; encode keeps them special for inference (fill-mask)."""
    corpus = tmp_path / "specials.txt"
    corpus.write_text(
        "Use [SEP] between the two parts.\nA [MASK] or a [CLS] here, [PAD] and [UNK] there.\n"
    )
    prepare([corpus], tok, tmp_path / "out", fmt="lines", heldout=0.0, progress=False)
    s = ShardSet(tmp_path / "out")
    tokens = s.load(s.names("train")[0]).tokens
    specials = {tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id}
    assert not specials & set(tokens.tolist())
    assert tok.convert_ids_to_tokens(tokens[:5].tolist()) == ["use", "[", "sep", "]", "between"]
    # inference still reads them as the special tokens they are
    assert tok.mask_id in tok.encode("Paris is the [MASK] of France.").ids
    # and text without them is encoded as before
    plain = ["The quick brown fox jumps over the lazy dog.", "Ünïcödé, 東京, naïve cafés!"]
    assert tok.encode_ids(plain) == [tok.encode(t, add_special_tokens=False).ids for t in plain]


def test_prepare_says_how_it_reads_each_file_and_warns_when_nothing_is_held_out(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    # one sentence per line without full stops: detected as hard-wrapped prose, one document
    bare = tmp_path / "bare.txt"
    bare.write_text("\n\n".join("\n".join(["the cat sat on the mat"] * 3) for _ in range(30)))
    with pytest.warns(UserWarning, match="no document held out"):
        meta = prepare([bare], tok, tmp_path / "a", heldout=0.1, progress=True)
    assert f"reading {bare} as 'paragraphs'" in capsys.readouterr().out
    assert meta["counts"]["train"]["documents"] == 1
    # --format lines: a blank line ends a document, and a tenth of them can be held out
    meta = prepare([bare], tok, tmp_path / "b", fmt="lines", heldout=0.1, progress=True)
    assert "reading" not in capsys.readouterr().out
    assert meta["counts"]["train"]["documents"] + meta["counts"]["heldout"]["documents"] == 30
    assert meta["counts"]["heldout"]["documents"] > 0


def test_shards_refuse_a_different_tokenizer(tmp_path: Path, tok: Tokenizer) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "out", progress=False)
    s = ShardSet(tmp_path / "out")
    s.check_tokenizer(tok, "the model's tokenizer")  # the same one passes
    cased = Tokenizer(tok.tokens, lowercase=False)
    with pytest.raises(
        DataError, match=r"does not match the tokenizer of .*meta.json \(differs in lowercase\)"
    ):
        s.check_tokenizer(cased, "the model's tokenizer")
    other = Tokenizer([*tok.tokens[:-1], "zzzz"])
    with pytest.raises(DataError, match="differs in vocab_sha256"):
        s.check_tokenizer(other, "the model's tokenizer")


def test_damaged_shard_is_reported(tmp_path: Path, tok: Tokenizer) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "out", progress=False)
    s = ShardSet(tmp_path / "out")
    name = s.names("train")[0]
    path = tmp_path / "out" / f"{name}.tokens.npy"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(DataError, match=rf"{name}"):
        s.load(name)


@pytest.mark.parametrize(
    ("suffix", "damage"),
    [
        (".tokens.npy", lambda b: b""),  # numpy: EOFError
        (".index.npz", lambda b: b""),  # numpy: EOFError
        (".index.npz", lambda b: b[: len(b) // 2]),  # zipfile.BadZipFile
        (".tokens.npy", lambda b: b[:60]),  # the header alone
    ],
)
def test_empty_or_truncated_shard_files_are_one_data_error(
    tmp_path: Path, tok: Tokenizer, suffix: str, damage
) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "out", progress=False)
    s = ShardSet(tmp_path / "out")
    name = s.names("train")[0]
    path = tmp_path / "out" / f"{name}{suffix}"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=rf"{tmp_path / 'out' / name}"):
        s.load(name)


def test_the_fingerprint_of_prepared_data_follows_its_content(
    tmp_path: Path, tok: Tokenizer
) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "a", progress=False)
    prepare(files, tok, tmp_path / "b", progress=False)
    prepare(files, tok, tmp_path / "c", heldout=0.5, progress=False)
    a, b, c = (ShardSet(tmp_path / x).fingerprint() for x in "abc")
    assert a == b != c  # the same inputs and settings: the same data, wherever it lies


@pytest.mark.slow
def test_prepare_cli_errors_keep_earlier_work(tmp_path: Path, minilm_dir: Path) -> None:
    files = write_corpus(tmp_path / "corpus", docs=12)
    bad = tmp_path / "corpus" / "zz_bad.jsonl"
    bad.write_text('{"text": "fine."}\n{"title": "no text"}\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertforge",
            "prepare",
            str(tmp_path / "corpus"),
            "--tokenizer",
            str(minilm_dir),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert (
        out.stderr.strip().splitlines()[-1]
        == f'bertforge: error: {bad}: line 2: field "text" missing (expected {{"text": "..."}})'
    )
    assert not (tmp_path / "out" / "meta.json").exists()
    bad.unlink()
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertforge",
            "prepare",
            *map(str, files),
            "--tokenizer",
            str(minilm_dir),
            "--out",
            str(tmp_path / "out2"),
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "documents" in ok.stdout


def test_a_directory_prepared_before_inputs_kept_their_time_is_still_prepared(
    tmp_path: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    """meta.json written before mtime_ns was recorded: compared on path and size, as then."""
    files = write_corpus(tmp_path / "corpus", docs=12)
    prepare(files, tok, tmp_path / "out", progress=False)
    meta_file = tmp_path / "out" / "meta.json"
    meta = json.loads(meta_file.read_text())
    for record in meta["settings"]["inputs"]:
        del record["mtime_ns"]
    meta_file.write_text(json.dumps(meta))
    prepare(files, tok, tmp_path / "out", progress=True)
    assert "already prepared" in capsys.readouterr().out
    files[0].write_text(files[0].read_text() + "One more sentence here.\n")
    with pytest.raises(DataError, match="changed"):
        prepare(files, tok, tmp_path / "out", progress=False)
