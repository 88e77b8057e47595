"""Exhaustive agreement with the reference tokenizer: every Unicode code point, every line of the
Wikipedia sample; and a vocabulary trained on the Gutenberg books."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge import DataError, Tokenizer, train_vocab
from bertforge.textnorm import is_control


def _reference(vocab: Path, lowercase: bool):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    return BertTokenizerLegacy(str(vocab), do_lower_case=lowercase)


def _mismatches(ours: Tokenizer, ref, texts: list[str]) -> list[tuple[str, list[str], list[str]]]:
    encs = ours.encode_batch(texts, add_special_tokens=False, truncation=False)
    bad = []
    for text, enc in zip(texts, encs):
        expected = ref.tokenize(text)
        if enc.tokens != expected or enc.ids != ref.convert_tokens_to_ids(expected):
            bad.append((text[:200], enc.tokens[:40], expected[:40]))
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_every_code_point_matches_reference(minilm_vocab: Path, casing: str) -> None:
    """Each character inside a word and alone: 'ab{c}cd {c}', 32 such probes per text."""
    lower = casing == "uncased"
    ours, ref = (
        Tokenizer.from_pretrained(minilm_vocab, lowercase=lower),
        _reference(minilm_vocab, lower),
    )
    probes = [f"ab{chr(cp)}cd {chr(cp)}" for cp in range(0x110000)]
    texts = [" ".join(probes[i : i + 32]) for i in range(0, len(probes), 32)]
    bad = _mismatches(ours, ref, texts)
    assert not bad, f"{len(bad)} of {len(texts)} texts differ, e.g. {bad[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("casing", ["uncased", "cased"])
def test_every_wikipedia_line_matches_reference(
    data_dir: Path, minilm_vocab: Path, casing: str
) -> None:
    lower = casing == "uncased"
    ours, ref = (
        Tokenizer.from_pretrained(minilm_vocab, lowercase=lower),
        _reference(minilm_vocab, lower),
    )
    files = sorted((data_dir / "wikipedia_en_sample").rglob("wiki_*"))
    assert len(files) == 40
    lines = [ln.rstrip("\n") for f in files for ln in f.read_text(encoding="utf-8").splitlines()]
    assert len(lines) > 130_000
    bad = _mismatches(ours, ref, lines)
    assert not bad, f"{len(bad)} of {len(lines)} lines differ, e.g. {bad[:3]}"


def _books_as_utf8(data_dir: Path, out: Path) -> list[Path]:
    """The 13 Gutenberg books; the two in ISO-8859-1 converted to UTF-8, as a user would."""
    out.mkdir()
    books = []
    for book in sorted((data_dir / "pretraining_books_gutenberg").glob("*.txt")):
        raw = book.read_bytes()
        try:
            raw.decode("utf-8")
            books.append(book)
        except UnicodeDecodeError:
            converted = out / book.name
            converted.write_text(raw.decode("latin-1"), encoding="utf-8")
            books.append(converted)
    assert len(books) == 13
    return books


@pytest.mark.slow
def test_gutenberg_vocabulary_round_trips_text(data_dir: Path, tmp_path: Path) -> None:
    books = _books_as_utf8(data_dir, tmp_path / "books")
    tok = train_vocab(books, 8000, lowercase=False, show_progress=False)
    assert tok.vocab_size == 8000
    tok.save_pretrained(tmp_path / "vocab")
    tok = Tokenizer.from_pretrained(tmp_path / "vocab")
    assert tok.lowercase is False  # written to tokenizer_config.json
    paragraphs = [
        p for b in books for p in b.read_text(encoding="utf-8").split("\n\n") if p.strip()
    ]
    assert len(paragraphs) > 10_000
    encs = tok.encode_batch(paragraphs, add_special_tokens=False, truncation=False)
    for text, enc in zip(paragraphs, encs):
        assert tok.unk_id not in enc.ids, text[:80]
        # decode gives the text back, up to whitespace (and BERT's cleanup of " ." etc.)
        # and the control characters BERT drops (Milton ends in two ^Z)
        expected = "".join(c for c in "".join(text.split()) if not is_control(c))
        assert "".join(tok.decode(enc.ids).split()) == expected, text[:80]
    # the vocabulary learned whole words of the books, not only characters
    assert {"Emma", "whale", "Hamlet"} <= set(tok.vocab)


def test_latin1_book_is_rejected_with_file_and_line(data_dir: Path) -> None:
    book = data_dir / "pretraining_books_gutenberg" / "chesterton-ball.txt"
    with pytest.raises(DataError, match=r"chesterton-ball.txt: line 4631: byte 7 \(b'\\xe8'\)"):
        train_vocab([book], 1000, show_progress=False)
