"""Model directories with a tokenizer.json and no vocab.txt (what transformers 5 and
sentence-transformers 6 save): read as the same model with its vocab.txt, embedded as
sentence-transformers does; a tokenizer.json that is not BERT's WordPiece is one clear error."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import torch

from bertforge import Tokenizer, VocabError
from bertforge.heads import BertForSequenceClassification
from bertforge.model import BertModel
from tests import test_real_inputs
from tests.hard_cases import HARD_CASES
from tests.test_pipelines import SENTENCES


def _without_vocab_txt(directory: Path) -> bool:
    """Delete vocab.txt (the layout of transformers 5+); whether there was one."""
    had = (directory / "vocab.txt").exists()
    if had:
        (directory / "vocab.txt").unlink()
    return had


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """all-MiniLM-L6-v2 loaded and saved by the installed sentence-transformers."""
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path_factory.mktemp("st")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.SentenceTransformer(str(minilm_dir), device="cpu").save(str(out))
    _without_vocab_txt(out)  # sentence-transformers 6 writes none; older ones did
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A small BertModel and MiniLM's tokenizer saved by the installed transformers."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf")
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir)).save_pretrained(str(out))
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    transformers.BertModel(config).save_pretrained(str(out))
    _without_vocab_txt(out)
    return out


def _assert_same_encodings(ours: Tokenizer, want: Tokenizer, texts: list[str]) -> None:
    for text in texts:
        a, b = ours.encode(text, truncation=False), want.encode(text, truncation=False)
        assert (a.ids, a.tokens, a.offsets, a.word_ids) == (b.ids, b.tokens, b.offsets, b.word_ids)
    a_batch = ours(HARD_CASES[:12], HARD_CASES[12:24], max_length=40)
    b_batch = want(HARD_CASES[:12], HARD_CASES[12:24], max_length=40)
    assert all(torch.equal(a_batch[k], b_batch[k]) for k in b_batch)
    assert [e.offsets for e in a_batch.encodings] == [e.offsets for e in b_batch.encodings]


def test_a_sentence_transformers_save_embeds_as_sentence_transformers(
    st_dir: Path, tmp_path: Path
) -> None:
    assert not (st_dir / "vocab.txt").exists() and (st_dir / "tokenizer.json").is_file()
    assert Tokenizer.exists(st_dir)
    # the check that all-MiniLM-L6-v2 itself passes, on its tokenizer.json-only save
    test_real_inputs.test_embed_with_no_flags_equals_sentence_transformers(
        st_dir, tmp_path, None, True
    )


def test_a_cross_encoder_save_scores_as_transformers(minilm_dir: Path, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        ce = st.CrossEncoder(str(minilm_dir), num_labels=1, device="cpu")
        ce.save(str(tmp_path))
    _without_vocab_txt(tmp_path)
    a, b = SENTENCES[:4], SENTENCES[4:8]
    ref_in = ce.tokenizer(a, b, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = ce.model(**ref_in).logits
    tok = Tokenizer.from_pretrained(tmp_path)
    batch = tok(a, b)
    assert torch.equal(batch["input_ids"], ref_in["input_ids"])
    model = BertForSequenceClassification.from_pretrained(tmp_path)
    with torch.no_grad():
        ours = model(**batch).logits
    assert (ours - ref).abs().max() < 1e-4


def test_a_transformers_save_tokenizes_as_its_vocab_txt(
    hf_dir: Path, minilm_dir: Path, minilm_vocab: Path
) -> None:
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    ours, want = Tokenizer.from_pretrained(hf_dir), Tokenizer.from_pretrained(minilm_dir)
    assert ours.source == str(hf_dir / "tokenizer.json")
    assert ours.tokens == want.tokens
    assert (ours.lowercase, ours.strip_accents, ours.tokenize_chinese_chars) == (True, None, True)
    assert ours.model_max_length == want.model_max_length == 512
    _assert_same_encodings(ours, want, HARD_CASES)
    ref = BertTokenizerLegacy(str(minilm_vocab), do_lower_case=True)
    for text in HARD_CASES:
        assert ours.encode(text).ids == ref.encode(text)
    # the model beside it loads, its vocabulary checked against config.json as vocab.txt is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BertModel.from_pretrained(hf_dir)


def _edited(source: Path, out: Path, edit: Any, drop: tuple[str, ...] = ()) -> Path:
    """A copy of `source` with its tokenizer.json passed through `edit` (changes it in place)."""
    shutil.copytree(source, out)
    for name in drop:
        (out / name).unlink()
    data = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    edit(data)
    (out / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return out


def _cased(data: dict[str, Any]) -> None:
    data["normalizer"]["lowercase"] = False


def test_a_cased_tokenizer_json_keeps_case(
    hf_dir: Path, minilm_vocab: Path, tmp_path: Path
) -> None:
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    cased = _edited(hf_dir, tmp_path / "cased", _cased, drop=("tokenizer_config.json",))
    ours = Tokenizer.from_pretrained(cased)
    assert ours.lowercase is False
    _assert_same_encodings(
        ours, Tokenizer.from_pretrained(minilm_vocab, lowercase=False), HARD_CASES
    )
    ref = BertTokenizerLegacy(str(minilm_vocab), do_lower_case=False)
    for text in HARD_CASES:
        assert ours.tokenize(text) == ref.tokenize(text)
    # tokenizer_config.json's do_lower_case wins over the normalizer, as in transformers
    shutil.copy(hf_dir / "tokenizer_config.json", cased / "tokenizer_config.json")
    assert Tokenizer.from_pretrained(cased).lowercase is True
    assert Tokenizer.from_pretrained(cased, lowercase=False).lowercase is False


def test_a_cased_vocabulary_built_with_tokenizers_keeps_case(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as Engine
    from tokenizers import normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    words = ["Paris", "paris", "is", "Big", "big", "##gest", "."]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    engine = Engine(WordPiece(vocab, unk_token="[UNK]"))
    engine.normalizer = normalizers.BertNormalizer(lowercase=False)
    engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    engine.save(str(tmp_path / "tokenizer.json"))
    for path in (tmp_path, tmp_path / "tokenizer.json"):  # a directory, or the file itself
        tok = Tokenizer.from_pretrained(path)
        assert tok.tokenize("Paris is paris. Biggest big") == [
            "Paris",
            "is",
            "paris",
            ".",
            "Big",
            "##gest",
            "big",
        ]
    tok.save_pretrained(tmp_path / "saved")  # vocab.txt, as ever
    again = Tokenizer.from_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "vocab.txt").is_file() and again.lowercase is False
    assert again.tokens == tok.tokens


def test_save_pretrained_writes_vocab_txt_and_keeps_the_word_limit(
    hf_dir: Path, tmp_path: Path
) -> None:
    def short_words(data: dict[str, Any]) -> None:
        data["model"]["max_input_chars_per_word"] = 10

    source = _edited(hf_dir, tmp_path / "short", short_words)
    tok = Tokenizer.from_pretrained(source)
    pieces = Tokenizer.from_pretrained(hf_dir).tokenize("abcdefghij")
    assert tok.tokenize("abcdefghij abcdefghijk") == [*pieces, "[UNK]"]  # 11 letters: too long
    assert Tokenizer.from_pretrained(hf_dir).tokenize("abcdefghijk") != ["[UNK]"]
    tok.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "vocab.txt").is_file()
    again = Tokenizer.from_pretrained(tmp_path / "saved")
    assert again.max_input_chars_per_word == 10 and again.tokens == tok.tokens
    _assert_same_encodings(again, tok, HARD_CASES)
    # Google's limit (100) is not written, so what transformers reads is unchanged
    Tokenizer.from_pretrained(hf_dir).save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    assert "max_input_chars_per_word" not in config


def _bpe(data: dict[str, Any]) -> None:
    data["model"] = {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [], "unk_token": None}


def _unigram(data: dict[str, Any]) -> None:
    data["model"] = {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}


def _set(where: str, value: Any) -> Any:
    def edit(data: dict[str, Any]) -> None:
        *path, last = where.split(".")
        node = data
        for key in path:
            node = node[key]
        node[last] = value

    return edit


def _no_mask(data: dict[str, Any]) -> None:
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {t: i for i, t in enumerate(t for t in vocab if t != "[MASK]")}
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[MASK]"]


@pytest.mark.parametrize(
    "edit, message",
    [
        (_set("model.unk_token", "<unk>"), r"model.unk_token is '<unk>'; BERT's WordPiece uses"),
        (_set("model.continuing_subword_prefix", "@@"), r"model.continuing_subword_prefix is '@@'"),
        (_set("normalizer", {"type": "NFKC"}), r"normalizer \['NFKC'\] is not BERT's"),
        (_set("normalizer", None), r"normalizer \[None\] is not BERT's"),
        (_set("normalizer.clean_text", False), r"BertNormalizer has clean_text false"),
        (_set("pre_tokenizer", {"type": "Whitespace"}), r"pre_tokenizer \['Whitespace'\]"),
        (
            _set("model.vocab.[PAD]", 5),
            r"model.vocab gives '\[\w+\]' the id 5; each id must be given once",
        ),
        (_set("model.max_input_chars_per_word", 0), r"model.max_input_chars_per_word must be"),
        (_no_mask, r"missing BERT special tokens \[MASK\]"),
    ],
)
def test_a_tokenizer_json_that_is_not_berts_is_one_clear_error(
    hf_dir: Path, tmp_path: Path, edit: Any, message: str
) -> None:
    bad = _edited(hf_dir, tmp_path / "bad", edit)
    with pytest.raises(VocabError, match=rf"^{bad / 'tokenizer.json'}: {message}"):
        Tokenizer.from_pretrained(bad)


@pytest.mark.parametrize("edit, kind", [(_bpe, "BPE"), (_unigram, "Unigram")])
def test_a_tokenizer_json_of_another_kind_is_read_by_its_engine(
    hf_dir: Path, tmp_path: Path, edit: Any, kind: str
) -> None:
    """Not BERT's WordPiece: the file is its own reference (subwords.py), read whole by the
    engine with the specials its directory names; without them it is one clear error."""
    bad = _edited(hf_dir, tmp_path / "other", edit)
    # the edit left the template's [CLS] at 101, where the engine numbers the added tokens 2...
    with pytest.raises(VocabError, match=r"post_processor gives '\[CLS\]' the id 101, the vocab"):
        Tokenizer.from_pretrained(bad)
    data = json.loads((bad / "tokenizer.json").read_text())
    engine = tokenizers.Tokenizer.from_file(str(bad / "tokenizer.json"))
    for t in data["post_processor"]["special_tokens"].values():
        t["ids"] = [engine.token_to_id(t["id"])]  # the ids the engine gives the added tokens
    (bad / "tokenizer.json").write_text(json.dumps(data))
    tok = Tokenizer.from_pretrained(bad)
    assert tok.kind == kind and tok.encode("a").ids[0] == tok.cls_id == tok.vocab["[CLS]"]
    assert tok.specials.pair_extra == 3  # BERT's template, kept
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[CLS]"]
    (bad / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(VocabError, match=r"the cls token '\[CLS\]' is not in the vocabulary"):
        Tokenizer.from_pretrained(bad)


def test_special_tokens_other_than_berts_are_refused(hf_dir: Path, tmp_path: Path) -> None:
    bad = _edited(hf_dir, tmp_path / "bad", lambda data: None)
    (bad / "special_tokens_map.json").write_text(json.dumps({"cls_token": {"content": "<s>"}}))
    with pytest.raises(VocabError, match=r"special_tokens_map.json: cls_token is '<s>'"):
        Tokenizer.from_pretrained(bad)
    (bad / "special_tokens_map.json").unlink()
    config = json.loads((bad / "tokenizer_config.json").read_text())
    (bad / "tokenizer_config.json").write_text(json.dumps({**config, "unk_token": "<unk>"}))
    with pytest.raises(VocabError, match=r"tokenizer_config.json: unk_token is '<unk>'"):
        Tokenizer.from_pretrained(bad)


def test_added_tokens_outside_the_vocabulary_are_found_whole(hf_dir: Path, tmp_path: Path) -> None:
    def add(data: dict[str, Any]) -> None:
        data["added_tokens"].append({"id": 30522, "content": "<new>", "special": True})

    tok = Tokenizer.from_pretrained(_edited(hf_dir, tmp_path / "added", add))
    assert tok.tokenize("a<new>b") == ["a", "<new>", "b"] and tok.vocab["<new>"] == 30522
    assert tok.decode(tok.encode("a <new> b").ids) == "a b" and len(tok) == 30523


def test_a_tokenizer_json_with_unused_ids_reads_as_transformers_does(
    minilm_vocab: Path, tmp_path: Path
) -> None:
    """transformers converts a vocab.txt with a duplicate line into a tokenizer.json whose ids
    skip the earlier line's: read with a placeholder there, as bertforge reads the vocab.txt."""
    import transformers

    lines = minilm_vocab.read_text(encoding="utf-8").splitlines()
    word = next(t for t in lines[2500:] if t.isalpha())
    lines[2000] = word  # the word's later line wins: id 2000 is given to no token
    source = tmp_path / "dup"
    source.mkdir()
    (source / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref = transformers.BertTokenizer.from_pretrained(str(source))
    ref.save_pretrained(str(tmp_path / "hf"))
    _without_vocab_txt(tmp_path / "hf")
    vocab = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["model"]["vocab"]
    assert 2000 not in vocab.values() and max(vocab.values()) == len(vocab) == len(lines) - 1
    with pytest.warns(UserWarning, match=r"model.vocab leaves 1 ids unused \(2000; a vocab.txt"):
        ours = Tokenizer.from_pretrained(tmp_path / "hf")
    assert len(ours) == len(lines) and ours.tokens[2000] == "[unused id 2000]"
    with pytest.warns(UserWarning, match=r"1 duplicate tokens"):
        plain = Tokenizer.from_pretrained(source)
    for text in [f"the {word}, {lines[1999]} and {lines[2001]}", *HARD_CASES]:
        assert ours.encode(text).ids == plain.encode(text).ids, text
        if text.isascii():  # where transformers' Rust tokenizer follows Google's rules too
            assert ours.encode(text).ids == ref(text)["input_ids"], text


def test_a_directory_without_a_vocabulary(tmp_path: Path) -> None:
    assert not Tokenizer.exists(tmp_path)
    with pytest.raises(
        VocabError, match=r"no vocab.txt in this directory \(nor a tokenizer.json\)"
    ):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    assert Tokenizer.exists(tmp_path)
    with pytest.raises(VocabError, match=r"tokenizer.json: line 1, column 2: invalid JSON"):
        Tokenizer.from_pretrained(tmp_path)
