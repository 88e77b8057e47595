"""Reading pre-training text: formats, sentence splitting, and errors that name file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge import DataError
from bertforge.data.corpus import (
    detect_format,
    expand_inputs,
    read_corpus,
    read_documents,
    split_sentences,
)


def test_sentence_splitting_keeps_abbreviations() -> None:
    text = (
        "Dr. Smith went to Washington, D.C. on Monday. He met e.g. Sen. Jones at 3 p.m. and left. "
        "It rained!"
    )
    assert split_sentences(text) == [
        "Dr. Smith went to Washington, D.C. on Monday.",
        "He met e.g. Sen. Jones at 3 p.m. and left.",
        "It rained!",
    ]


def test_google_format_one_sentence_per_line(tmp_path: Path) -> None:
    f = tmp_path / "google.txt"
    f.write_text(
        "First doc, first sentence.\nFirst doc, second sentence.\n\n\nSecond doc. Two sentences "
        "on one line.\n"
    )
    assert detect_format(f) == "lines"
    docs = list(read_documents(f))
    assert [d.sentences for d in docs] == [
        ["First doc, first sentence.", "First doc, second sentence."],
        ["Second doc.", "Two sentences on one line."],
    ]
    assert [d.line for d in docs] == [1, 5]


def test_google_sample_text(data_dir: Path) -> None:
    docs = list(read_documents(data_dir / "bert_sample_text" / "sample_text.txt"))
    assert len(docs) == 3
    assert (
        docs[0].sentences[1]
        == "Text should be one-sentence-per-line, with empty lines between documents."
    )


def test_wikiextractor_format(tmp_path: Path) -> None:
    f = tmp_path / "wiki_00"
    f.write_text(
        '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is a letter. It comes first.\n'
        "History.\n</doc>\n"
        '<doc id="2" url="u" title="Beta">\nBeta\n\nBeta is second.\n</doc>\n'
    )
    assert detect_format(f) == "wiki"
    docs = list(read_documents(f))
    assert [d.sentences for d in docs] == [
        ["Alpha is a letter.", "It comes first.", "History."],
        ["Beta is second."],
    ]
    assert [d.line for d in docs] == [1, 7]


def test_a_wikiextractor_file_with_a_bom_is_read_as_wiki(tmp_path: Path) -> None:
    f = tmp_path / "wiki_bom"
    text = '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is a letter.\n</doc>\n'
    f.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert detect_format(f) == "wiki"
    assert [d.sentences for d in read_documents(f)] == [["Alpha is a letter."]]


def test_vocab_train_reads_jsonl_and_wikiextractor_as_prepare_does(tmp_path: Path) -> None:
    """`bertforge vocab train` learns the text, not JSONL's field names or WikiExtractor's
    markup (read line by line, "text", "doc", "url" and "title" became whole words)."""
    from bertforge.cli import main
    from bertforge.tokenizer import Tokenizer

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
    words += ["kappa", "lambda"]
    sentences = [" ".join(words[i % 11 :] + words[: i % 11]) + "." for i in range(60)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in sentences[:30]))
    wiki = tmp_path / "wiki_00"
    wiki.write_text(
        "".join(
            f'<doc id="{i}" url="https://x.org/?curid={i}" title="Kappa">\nKappa\n\n{t}\n</doc>\n'
            for i, t in enumerate(sentences[30:])
        )
    )
    out = tmp_path / "vocab"
    assert main(["vocab", "train", str(jsonl), str(wiki), "--size", "200", "--out", str(out)]) == 0
    vocab = set(Tokenizer.from_pretrained(out).tokens)
    assert set(words) <= vocab
    assert not {"text", "doc", "url", "title", "id", "https", "curid"} & vocab


def test_hard_wrapped_paragraphs_are_joined(tmp_path: Path) -> None:
    f = tmp_path / "book.txt"
    para = (
        "It is a truth universally acknowledged, that a single man in\n"
        "possession of a good fortune, must be in want of a wife.  However\n"
        "little known the feelings or views of such a man may be on his\n"
        "first entering a neighbourhood, this truth is so well fixed in\n"
    )
    f.write_text("\n".join([para] * 8))
    assert detect_format(f) == "paragraphs"
    (doc,) = read_documents(f)
    assert doc.sentences[0] == (
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife."
    )


def test_read_corpus_takes_one_format_per_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("One line. Two.\n\nNext doc.\n")
    b.write_text('<doc id="1" url="u" title="T">\nT\n\nWiki text.\n</doc>\n')
    docs = list(read_corpus([a, b], ["lines", "wiki"]))
    assert [d.sentences for d in docs] == [["One line.", "Two."], ["Next doc."], ["Wiki text."]]
    # b read as 'lines' keeps the markup as text: the per-file format is what is used
    assert "<doc" in " ".join(s for d in read_corpus([a, b], "lines") for s in d.sentences)
    with pytest.raises(ValueError, match="1 formats for 2 files"):
        list(read_corpus([a, b], ["lines"]))


def test_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "docs.jsonl"
    f.write_text(
        json.dumps({"text": "One. Two.\nThree.", "id": 1})
        + "\n\n"
        + json.dumps({"text": "Four."})
        + "\n"
    )
    assert [d.sentences for d in read_documents(f)] == [["One.", "Two.", "Three."], ["Four."]]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", b"", r"empty.txt: empty file"),
        ("blank.txt", b"\n\n  \n", r"blank.txt: no text found"),
        (
            "binary.bin",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            r"binary.bin: looks like a binary file",
        ),
        (
            "latin1.txt",
            b"ok line\nna\xefve caf\xe9\n",
            r"latin1.txt: line 2: byte 2 \(b'\\xef'\) is not UTF-8",
        ),
        (
            "notext.jsonl",
            b'{"text": "fine."}\n{"body": "no text"}\n',
            r'notext.jsonl: line 2: field "text" missing',
        ),
        (
            "badjson.jsonl",
            b'{"text": "fine."}\n{"text": \n',
            r"badjson.jsonl: line 2: invalid JSON",
        ),
        ("number.jsonl", b'{"text": 42}\n', r'number.jsonl: line 1: field "text" must be a string'),
        ("open.wiki", b'<doc id="1">\nT\n\nText.\n', r"open.wiki: end of file inside a <doc>"),
    ],
)
def test_bad_input_names_file_and_line(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    f = tmp_path / name
    f.write_bytes(content)
    fmt = "wiki" if name.endswith(".wiki") else "auto"
    with pytest.raises(DataError, match=message):
        list(read_documents(f, fmt))


def test_expand_inputs(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for name in ("a/1.txt", "a/2.txt", "b.txt", "a/.hidden"):
        (tmp_path / name).write_text("x")
    assert [p.name for p in expand_inputs([tmp_path / "a", tmp_path / "b.txt"])] == [
        "1.txt",
        "2.txt",
        "b.txt",
    ]
    assert [p.name for p in expand_inputs([str(tmp_path / "a" / "*.txt")])] == ["1.txt", "2.txt"]
    with pytest.raises(DataError, match="nothing-here: no such file"):
        expand_inputs([tmp_path / "nothing-here"])
