"""Tokenizer: agreement with the reference BERT tokenizer, offsets, pairs, padding, files."""

from __future__ import annotations

import itertools
import json
import random
import shutil
import unicodedata
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from bertforge import BertforgeError, DataError, InputError, Tokenizer, VocabError, train_vocab
from bertforge.textnorm import is_control
from bertforge.tokenizer import truncate_pair_lengths
from tests.hard_cases import HARD_CASES


@pytest.fixture(scope="module", params=["uncased", "cased"])
def pair(request: pytest.FixtureRequest, minilm_vocab: Path):
    """(ours, reference) for the MiniLM vocabulary, uncased and cased."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    lower = request.param == "uncased"
    return (
        Tokenizer.from_pretrained(minilm_vocab, lowercase=lower),
        BertTokenizerLegacy(str(minilm_vocab), do_lower_case=lower),
    )


@pytest.mark.parametrize("text", HARD_CASES)
def test_hard_cases_match_reference(pair, text: str) -> None:
    ours, ref = pair
    enc = ours.encode(text, add_special_tokens=False, truncation=False)
    expected = ref.tokenize(text)
    assert enc.tokens == expected
    assert enc.ids == ref.convert_tokens_to_ids(expected)
    ids = ours.encode(text).ids
    assert ids == ref.encode(text)  # with [CLS] ... [SEP]
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
            ids, skip_special_tokens=skip
        )


def _normalize(span: str, tok: Tokenizer) -> str:
    """What the tokenizer makes of a span of the original text (Google's normalization)."""
    span = "".join(c for c in span if not is_control(c) and c not in "\x00\ufffd")
    if tok.lowercase:
        span = "".join(
            c for c in unicodedata.normalize("NFD", span.lower()) if unicodedata.category(c) != "Mn"
        )
    else:
        span = unicodedata.normalize("NFC", span)
    return span.replace("ς", "σ")  # final sigma depends on context the span lacks


@pytest.mark.parametrize("text", HARD_CASES)
def test_offsets_map_tokens_to_their_characters(pair, text: str) -> None:
    ours, _ = pair
    enc = ours.encode(text, truncation=False)
    previous = (0, 0)
    for token, (start, end), special in zip(enc.tokens, enc.offsets, enc.special_tokens_mask):
        if special:
            assert (start, end) == (0, 0)
            continue
        assert 0 <= start < end <= len(text), (token, start, end)
        # in order; pieces of one character (a decomposed Hangul syllable) share its span
        assert start >= previous[1] or (start, end) == previous, (token, start, end)
        previous = (start, end)
        if token in ("[UNK]", "[CLS]", "[SEP]", "[MASK]"):
            continue
        piece = token[2:] if token.startswith("##") else token
        assert piece.replace("ς", "σ") in _normalize(text[start:end], ours), (
            token,
            text[start:end],
        )


def test_pairs_segments_and_truncation_match_reference(pair) -> None:
    ours, ref = pair
    rng = random.Random(0)
    words = [
        "the",
        "a",
        "of",
        "cat",
        "dog",
        "runs",
        "fast",
        "slowly",
        "and",
        "then",
        "naïve",
        "我",
        "ΑΣ",
    ]
    for _ in range(300):
        a = " ".join(rng.choice(words) for _ in range(rng.randint(0, 14)))
        b = " ".join(rng.choice(words) for _ in range(rng.randint(0, 14)))
        n = rng.randint(3, 24)
        enc = ours.encode(a, b, max_length=n)
        assert enc.ids == ref.encode(a, b, truncation="longest_first", max_length=n)
        first_sep = enc.tokens.index("[SEP]")
        assert enc.token_type_ids == [0] * (first_sep + 1) + [1] * (len(enc) - first_sep - 1)
        assert enc.sequence_ids[0] is None and enc.sequence_ids[-1] is None


def test_truncate_pair_lengths_is_googles_loop() -> None:
    def google(la: int, lb: int, budget: int) -> tuple[int, int]:
        while la + lb > budget:
            if la > lb:
                la -= 1
            else:
                lb -= 1
        return la, lb

    for la in range(12):
        for lb in range(12):
            for budget in range(25):
                assert truncate_pair_lengths(la, lb, budget) == google(la, lb, budget)


def test_batch_tensors_padding_and_masks(minilm_vocab: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_vocab)
    batch = tok(["a short one", "a somewhat longer sentence than the first"], ["pair", "pair two"])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    assert ids.dtype == torch.long and ids.shape == types.shape == mask.shape
    lengths = mask.sum(1).tolist()
    assert lengths == [len(e.ids) - e.ids.count(tok.pad_id) for e in batch.encodings]
    assert max(lengths) == ids.shape[1]
    short = lengths.index(min(lengths))
    assert (ids[short, lengths[short] :] == tok.pad_id).all()
    assert (types[short, lengths[short] :] == 0).all()
    fixed = tok(["x"], padding="max_length", max_length=16)
    assert fixed["input_ids"].shape == (1, 16) and fixed["attention_mask"].sum() == 3
    assert tok(["abc"] * 3, pad_to_multiple_of=8)["input_ids"].shape == (3, 8)
    single = tok("one string is a batch of one")
    assert single["input_ids"].shape[0] == 1


def test_truncation_and_over_long_text(minilm_vocab: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_vocab)
    long_text = "word " * 600
    assert tok([long_text])["input_ids"].shape == (1, 512)  # model_max_length by default
    enc = tok.encode(long_text, max_length=32)
    assert len(enc) == 32 and enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    with pytest.raises(InputError, match=r"text 1 has 602 tokens, more than max_length=512"):
        tok(["fine", long_text], truncation=False)
    with pytest.raises(InputError, match="no room for a text pair"):
        tok.encode("a", "b", max_length=2)


def test_split_into_words_word_ids_and_offsets(minilm_vocab: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_vocab)
    words = ["EU", "rejects", "German", "call", "to", "boycott", "ab\u2e43cd", "lamb", "."]
    enc = tok.encode(words, split_into_words=True)
    firsts = {}
    for j, w in enumerate(enc.word_ids):
        if w is not None:
            firsts.setdefault(w, j)
            start, end = enc.offsets[j]
            assert 0 <= start < end <= len(words[w])
    assert sorted(firsts) == list(range(len(words)))
    assert enc.tokens[firsts[1]] == "rejects"
    batch = tok([words, words[:3]], split_into_words=True)
    assert batch["input_ids"].shape[0] == 2
    assert batch.encodings[1].word_ids[1:4] == [0, 1, 2]


def test_decode(minilm_vocab: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_vocab)
    text = "The unaffable cat, sat on the mat!"
    assert tok.decode(tok.encode(text).ids) == "the unaffable cat, sat on the mat!"
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False).startswith("[CLS] the")
    assert tok.batch_decode(tok([text, "hi"])["input_ids"]) == [text.lower(), "hi"]


def test_save_and_load_round_trip(minilm_vocab: Path, tmp_path: Path) -> None:
    cased = Tokenizer.from_pretrained(minilm_vocab, lowercase=False, model_max_length=128)
    cased.save_pretrained(tmp_path)
    again = Tokenizer.from_pretrained(tmp_path)
    assert again.lowercase is False and again.model_max_length == 128
    assert again.tokens == cased.tokens
    text = "Ünïcode Words, CJK 我, and [MASK]."
    assert again.encode(text).ids == cased.encode(text).ids
    # transformers reads what we wrote, with the same casing
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    ref = BertTokenizerLegacy.from_pretrained(str(tmp_path))
    assert ref.tokenize(text) == again.tokenize(text)


def test_casing_inferred_from_a_bare_vocab(tmp_path: Path, minilm_vocab: Path) -> None:
    assert Tokenizer.from_pretrained(minilm_vocab).lowercase is True
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [w for w in ("The", "Paris", "London", "Apple") for _ in range(1)]
    tokens += [f"Word{i}" for i in range(40)] + [f"w{i}" for i in range(40)]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    tok = Tokenizer.from_pretrained(tmp_path / "vocab.txt")
    assert tok.lowercase is False
    assert tok.tokenize("Paris") == ["Paris"]


def test_vocab_errors_name_the_file_and_line(tmp_path: Path) -> None:
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(VocabError, match="empty: no vocab.txt in this directory"):
        Tokenizer.from_pretrained(empty_dir)
    with pytest.raises(BertforgeError, match="nope.txt: no such file or directory"):
        Tokenizer.from_pretrained(tmp_path / "nope.txt")
    bad = tmp_path / "vocab.txt"
    bad.write_bytes(b"[PAD]\n[UNK]\n[CLS]\ncaf\xe9\n[SEP]\n[MASK]\n")
    with pytest.raises(VocabError, match=r"vocab.txt: line 4: not valid UTF-8"):
        Tokenizer.from_pretrained(bad)
    bad.write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(
        VocabError, match=r"vocab.txt: missing BERT special tokens \[CLS\], \[SEP\], \[MASK\]"
    ):
        Tokenizer.from_pretrained(bad)
    bad.write_text("")
    with pytest.raises(VocabError, match="vocabulary file is empty"):
        Tokenizer.from_pretrained(bad)
    bad.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nhello\n")
    with pytest.warns(UserWarning, match=r"1 duplicate tokens: 'hello' \(lines 6 and 7\)"):
        Tokenizer.from_pretrained(bad, lowercase=True)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(
        VocabError, match=r"tokenizer_config.json: field 'do_lower_case' must be true"
    ):
        Tokenizer.from_pretrained(tmp_path)


def test_train_vocab_from_text_files(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "Pack my box with five dozen liquor jugs!",
        "How vexingly quick daft zebras jump; the five boxing wizards jump quickly.",
        "Über café naïve — déjà vu, ΑΒΓ and 東京.",
    ]
    text.write_text("\n".join(sentences * 50) + "\n", encoding="utf-8")
    tok = train_vocab([text], 300, lowercase=False, show_progress=False)
    assert tok.tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 100 < tok.vocab_size <= 300
    for s in sentences:
        ids = tok.encode(s).ids
        assert tok.unk_id not in ids
        assert "".join(tok.decode(ids).split()) == "".join(s.split())
    tok.save_pretrained(tmp_path / "vocab")
    assert Tokenizer.from_pretrained(tmp_path / "vocab").tokens == tok.tokens


def test_train_vocab_rejects_non_utf8_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"plain line\nanother\ncaf\xe9 au lait\n")
    with pytest.raises(DataError, match=r"latin1.txt: line 3: byte 3 \(b'\\xe9'\) is not UTF-8"):
        train_vocab([bad], 100, show_progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = train_vocab([bad], 100, encoding_errors="replace", show_progress=False)
    assert "caf" in tok.decode(tok.encode("café").ids)


def test_a_long_text_encoded_in_segments_is_the_whole(minilm_vocab: Path) -> None:
    """encode_long cuts a text where no word crosses (after whitespace, else after punctuation
    or a CJK ideograph, never after the punctuation lower-casing looks through: "ΣΟΦΟΣ.Α" keeps
    its medial σ) and gives the pieces, offsets and word boundaries of encoding it whole, at
    any segment size; a run longer than the look-ahead with none of those is cut anyway."""
    from bertforge.tokenizer import segment_cuts

    tok = Tokenizer.from_pretrained(minilm_vocab)
    parts = [*HARD_CASES, "ΣΟΦΟΣ.Α", "x" * 150, "日本語テキスト", "a.b,c", "\u00a0", "\u200b", "😀"]
    rng = random.Random(0)
    texts = [
        "".join(rng.choice(parts) + rng.choice(["", " ", "  ", "\n", "\t"]) for _ in range(40))
        for _ in range(60)
    ]
    wholes = tok.encode_batch(texts, add_special_tokens=False, truncation=False)
    for size in (1, 5, 33, 10**6):
        for whole, long in zip(wholes, tok.encode_long(texts, size)):
            assert long.ids.tolist() == whole.ids
            assert [tuple(o) for o in long.offsets.tolist()] == [tuple(o) for o in whole.offsets]
            w = whole.word_ids
            assert [w[i] == w[i + 1] for i in range(len(w) - 1)] == [
                bool(long.words[i] == long.words[i + 1]) for i in range(len(w) - 1)
            ]
        cuts = segment_cuts(texts[0], size)
        assert cuts[0][0] == 0 and cuts[-1][1] == len(texts[0])
        assert all(a[1] == b[0] for a, b in itertools.pairwise(cuts))
    # no place to cut within the look-ahead: cut where it is, until the end is within reach
    assert segment_cuts("y" * 50, 10, look=20) == [(0, 10), (10, 20), (20, 50)]
    with pytest.raises(InputError, match="list of texts"):
        tok.encode_long("one string")


def test_a_byte_order_mark_is_named_and_kept_as_transformers_keeps_it(tmp_path: Path) -> None:
    from transformers.models.bert.tokenization_bert import load_vocab

    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"\xef\xbb\xbf[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    assert "\ufeff[PAD]" in load_vocab(str(vocab))  # part of line 1's token
    with pytest.raises(
        VocabError,
        match=r"vocab.txt: missing BERT special tokens \[PAD\] \(.*\); line 1 \('\\ufeff\[PAD\]'\) "
        "starts with a byte order mark",
    ):
        Tokenizer.from_pretrained(vocab)
    vocab.write_bytes(b"\xef\xbb\xbfhi\n[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    with pytest.warns(UserWarning, match=r"line 1 \('\\ufeffhi'\) starts with a byte order mark"):
        tok = Tokenizer.from_pretrained(vocab, lowercase=True)
    assert tok.tokens[0] == "\ufeffhi" and tok.tokenize("hello hi") == ["hello", "[UNK]"]


# tokens added with transformers' add_tokens (and a special one), in the texts around them
ADDED = ["<ent>", "</ent>", "new_word", "hello"]  # hello: a vocabulary token, kept whole
ADDED_SPECIAL = "[MARK]"
ADDED_TEXTS = [
    "An <ent>Paris</ent> visit, with NEW_WORD and new_words.",
    "no<ent>space [MARK] here  [MARK]s and helloworld, Hello!",
    "plain text without any of them",
]


@pytest.fixture(scope="module")
def added_dir(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> tuple[Path, Any]:
    """MiniLM's tokenizer with tokens added by transformers, saved as transformers 4 saves it
    (the installed transformers 5 writes tokenizer.json and tokenizer_config.json; 4 also
    wrote vocab.txt, added_tokens.json, special_tokens_map.json, and the added tokens in
    tokenizer_config.json's added_tokens_decoder); and the transformers tokenizer itself."""
    import transformers

    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    ref.add_tokens(ADDED)
    ref.add_special_tokens({"additional_special_tokens": [ADDED_SPECIAL]})
    out = tmp_path_factory.mktemp("added")
    ref.save_pretrained(str(out))
    (out / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    new = {t: i for t, i in ref.get_added_vocab().items() if i >= 30522}
    (out / "added_tokens.json").write_text(json.dumps(new))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"additional_special_tokens": [ADDED_SPECIAL]})
    )
    listed = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(t.pop("id")): t for t in listed}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out, ref


def _only(directory: Path, out: Path, source: str) -> Path:
    """A copy of `directory` whose added tokens are listed in `source` alone ("transformers 5":
    tokenizer.json and tokenizer_config.json, no vocab.txt, as transformers 5 saves)."""
    shutil.copytree(directory, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    if source == "transformers 5":
        for name in ("vocab.txt", "added_tokens.json", "special_tokens_map.json"):
            (out / name).unlink()
        return out
    if source != "tokenizer_config.json":
        config.pop("added_tokens_decoder")
    if source != "tokenizer.json":
        kept = [t for t in tokenizer["added_tokens"] if t["content"] not in (*ADDED, "[MARK]")]
        tokenizer["added_tokens"] = kept
    if source != "added_tokens.json":
        (out / "added_tokens.json").unlink()
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return out


@pytest.mark.parametrize(
    "source", ["tokenizer_config.json", "tokenizer.json", "added_tokens.json", "transformers 5"]
)
def test_added_tokens_are_read_and_written_as_transformers_does(
    added_dir: tuple[Path, Any], tmp_path: Path, source: str
) -> None:
    from transformers import BertTokenizer

    from bertforge import BertConfig, BertModel
    from tests.conftest import TINY

    directory, ref = added_dir
    d = _only(directory, tmp_path / "model", source)
    tok, want = Tokenizer.from_pretrained(d), BertTokenizer.from_pretrained(str(d))
    assert len(tok) == len(want) == len(ref) == 30522 + 4 and tok.vocab[ADDED_SPECIAL] == 30525
    # (ASCII: where transformers' Rust tokenizer and Google's rules, bertforge's, agree)
    for text in [*ADDED_TEXTS, *(t for t in HARD_CASES if t.isascii())]:
        assert tok.tokenize(text) == want.tokenize(text), text
        assert tok.encode(text).ids == want(text)["input_ids"], text
    # added_tokens.json lists only the tokens outside the vocabulary: "hello" is not kept whole
    assert (tok.tokenize("helloworld") == ["hello", "world"]) is (source != "added_tokens.json")
    ids = ref(ADDED_TEXTS[1])["input_ids"]
    assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    # a model whose embeddings were resized for them: no warning about unused rows
    BertModel(BertConfig(**{**TINY, "vocab_size": len(ref)})).save_pretrained(d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BertModel.from_pretrained(d)
    # written back as transformers writes them: both read the save alike
    tok.save_pretrained(tmp_path / "saved")
    again, theirs = (
        Tokenizer.from_pretrained(tmp_path / "saved"),
        BertTokenizer.from_pretrained(str(tmp_path / "saved")),
    )
    assert again.tokens == tok.tokens and again.added == tok.added
    for text in ADDED_TEXTS:
        assert again.encode(text).ids == theirs(text)["input_ids"] == want(text)["input_ids"]


def test_added_tokens_at_other_ids_are_refused(added_dir: tuple[Path, Any], tmp_path: Path) -> None:
    d = _only(added_dir[0], tmp_path / "model", "added_tokens.json")
    (d / "added_tokens.json").write_text(json.dumps({"<ent>": 30530}))
    with pytest.raises(
        VocabError,
        match=r"added_tokens.json: added token '<ent>' has id 30530, but the next id after it "
        r"is 30522",
    ):
        Tokenizer.from_pretrained(d)
