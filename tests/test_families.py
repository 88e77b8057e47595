"""Encoder families beside BERT (bertforge.families): RoBERTa, XLM-RoBERTa, MPNet and ModernBERT checkpoints and
tokenizers, made here by transformers and tokenizers with random weights and vocabularies
trained in the test (no download), read by bertforge and compared with transformers' and
sentence-transformers' outputs, and saved back for transformers to read."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertModel, Tokenizer
from bertforge.cli import main
from bertforge.data.stdlib_corpus import stdlib_documents
from bertforge.errors import ConfigError
from bertforge.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.pipelines import Pipeline

from .hard_cases import HARD_CASES
from .task_files import keyword_table
from .test_pretrain import hf_mlm_labels, step_both

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

FAMILIES = ["roberta", "xlm-roberta", "mpnet", "modernbert"]
ARCH = {
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "mpnet": "MPNet",
    "modernbert": "ModernBert",
}
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=66,  # 64 tokens past the padding id 1
    type_vocab_size=1,
    layer_norm_eps=1e-5,
)
# ModernBERT's keys: 3 layers (global, local, local), local attention over 16 positions (8 each
# side) so that rows of 64 read only part of the row in its local layers
SMALL_MODERNBERT = dict(
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=64,
    local_attention=16,
    pad_token_id=1,
    cls_token_id=0,
    sep_token_id=2,
    bos_token_id=0,
    eos_token_id=2,
)


def small(kind: str) -> dict[str, object]:
    """transformers' config keys of a tiny model of the family."""
    return SMALL_MODERNBERT if kind == "modernbert" else SMALL


HEADS = [  # theirs, ours, their output, our output
    ("Model", BertModel, "last_hidden_state", "last_hidden_state"),
    ("ForMaskedLM", BertForMaskedLM, "logits", "mlm_logits"),
    ("ForSequenceClassification", BertForSequenceClassification, "logits", "logits"),
    ("ForTokenClassification", BertForTokenClassification, "logits", "logits"),
    ("ForQuestionAnswering", BertForQuestionAnswering, "end_logits", "end_logits"),
    ("ForMultipleChoice", BertForMultipleChoice, "logits", "logits"),
]
# texts the reference tokenizers take (transformers refuses lone surrogates: a TypeError)
TEXTS = [t for t in HARD_CASES if "\ud800" not in t]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return list(itertools.islice((p for d in stdlib_documents() for p in d), 300))


def _reference_tokenizer(kind: str, corpus: list[str]) -> object:
    """transformers' own tokenizer of the family over a vocabulary trained on `corpus`."""
    if kind == "roberta":  # byte-level BPE
        bpe = tokenizers.ByteLevelBPETokenizer()
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        bpe.train_from_iterator(
            corpus, vocab_size=500, special_tokens=specials, show_progress=False
        )
        return transformers.RobertaTokenizerFast(
            tokenizer_object=bpe._tokenizer, model_max_length=64
        )
    if kind == "modernbert":  # byte-level BPE with BERT's special tokens and pair template
        from tokenizers.processors import TemplateProcessing

        bpe = tokenizers.ByteLevelBPETokenizer()
        specials = ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"]
        bpe.train_from_iterator(
            corpus, vocab_size=500, special_tokens=specials, show_progress=False
        )
        bpe._tokenizer.post_processor = TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", 0), ("[SEP]", 2)],
        )
        names = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe._tokenizer, mask_token="[MASK]", model_max_length=64, **names
        )
    if kind == "mpnet":  # WordPiece with RoBERTa's special tokens
        wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
        specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
        wordpiece.train_from_iterator(
            corpus, vocab_size=500, special_tokens=specials, show_progress=False
        )
        vocab = wordpiece.get_vocab()
        return transformers.MPNetTokenizer(vocab=vocab, model_max_length=64)
    unigram = tokenizers.SentencePieceUnigramTokenizer()  # XLM-RoBERTa's SentencePiece Unigram
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    unigram.train_from_iterator(
        corpus, vocab_size=600, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    vocab = [tuple(v) for v in json.loads(unigram._tokenizer.to_str())["model"]["vocab"]]
    return transformers.XLMRobertaTokenizer(vocab=[*vocab, ("<mask>", 0.0)], model_max_length=64)


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, corpus: list[str], tmp_path_factory) -> Path:
    """A masked-LM checkpoint of the family with its tokenizer, as transformers saves them."""
    kind = request.param
    out = tmp_path_factory.mktemp(kind)
    tok = _reference_tokenizer(kind, corpus)
    torch.manual_seed(0)
    config = getattr(transformers, f"{ARCH[kind]}Config")(vocab_size=len(tok), **small(kind))
    getattr(transformers, f"{ARCH[kind]}ForMaskedLM")(config).eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_token_ids_and_offsets_equal_transformers(family_dir: Path, corpus: list[str]) -> None:
    theirs = transformers.AutoTokenizer.from_pretrained(family_dir)
    ours = Tokenizer.from_pretrained(family_dir)
    assert ours.own_engine and ours.specials.pair_extra == (3 if "[CLS]" in ours.vocab else 4)
    long = " ".join(corpus[:40])  # longer than the model: encoded whole, then cut
    masked = f"Paris is the {ours.specials.mask} of France."
    for text in [*TEXTS, *corpus[:30], long, masked]:
        want = theirs(text, truncation=False, return_offsets_mapping=True)
        got = ours.encode(text, truncation=False)
        assert got.ids == want["input_ids"], text
        assert [tuple(o) for o in got.offsets] == [tuple(o) for o in want["offset_mapping"]]
    for a, b in zip([*TEXTS, long], [*corpus[:30], long]):
        want = theirs(a, b, truncation=True, max_length=40, return_offsets_mapping=True)
        got = ours.encode(a, b, max_length=40)
        assert got.ids == want["input_ids"], (a, b)
        # a pair's offsets trimmed once, as a single text's (QA reads a context's this way)
        assert got.offsets == [tuple(o) for o in want["offset_mapping"]], (a, b)
    batch = ours(corpus[:5], max_length=64)
    want = theirs(corpus[:5], truncation=True, max_length=64, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], want["input_ids"])
    assert torch.equal(batch["attention_mask"], want["attention_mask"])
    ids = ours.encode(masked).ids
    assert ids[0] == ours.cls_id and ids[-1] == ours.sep_id and ours.mask_id in ids
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_saved_tokenizer_reads_back_in_transformers(family_dir: Path, tmp_path: Path) -> None:
    ours = Tokenizer.from_pretrained(family_dir)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoTokenizer.from_pretrained(tmp_path)
    again = Tokenizer.from_pretrained(tmp_path)
    for text in [f"Hello {ours.specials.mask} world", *TEXTS[:8]]:
        want = back(text, truncation=False)["input_ids"]
        assert ours.encode(text, truncation=False).ids == want
        assert again.encode(text, truncation=False).ids == want


def test_hidden_states_equal_on_a_padded_batch(family_dir: Path, corpus: list[str]) -> None:
    theirs = transformers.AutoModel.from_pretrained(family_dir).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tensor found, none fresh, none ignored
        ours = BertModel.from_pretrained(family_dir, add_pooling_layer=False)
    tok = Tokenizer.from_pretrained(family_dir)
    batch = tok([corpus[0], "short", corpus[3][:40], TEXTS[4]], max_length=64)
    assert (batch["attention_mask"] == 0).any()  # mixed lengths: padded rows
    with torch.no_grad():
        want = theirs(**batch, output_hidden_states=True).hidden_states
        got = ours(**batch, output_hidden_states=True).hidden_states
    real = batch["attention_mask"].bool()
    for w, g in zip(want, got):
        torch.testing.assert_close(g[real], w[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", FAMILIES)
@pytest.mark.parametrize("theirs, ours, out_theirs, out_ours", HEADS)
def test_heads_equal_in_both_directions_of_saving(
    tmp_path: Path, kind: str, theirs: str, ours: type, out_theirs: str, out_ours: str
) -> None:
    torch.manual_seed(0)
    labels = 2 if "QuestionAnswering" in theirs else 3
    config = getattr(transformers, f"{ARCH[kind]}Config")(
        vocab_size=301, num_labels=labels, **small(kind)
    )
    hf_class = getattr(transformers, ARCH[kind] + theirs)
    hf = hf_class(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    shape = (2, 3, 30) if "MultipleChoice" in theirs else (2, 30)  # past a local window
    ids = torch.randint(3, 301, shape)
    mask = torch.ones_like(ids)
    mask[0, ..., 12:] = 0
    ids = ids.masked_fill(mask == 0, 1)  # padding is <pad> (id 1): positions count past it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = ours.from_pretrained(tmp_path / "hf")
    model.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == [
        ARCH[kind] + theirs
    ]
    back = hf_class.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        want = getattr(hf(input_ids=ids, attention_mask=mask), out_theirs)
        got = getattr(model(input_ids=ids, attention_mask=mask), out_ours)
        again = getattr(back(input_ids=ids, attention_mask=mask), out_theirs)
    # per token: the real tokens (what padding gives is no answer, and differs: a padded row
    # of ModernBERT's local layers attends to itself, transformers' to nothing)
    per_token = any(h in theirs for h in ("Model", "MaskedLM", "Token", "QuestionAnswering"))
    real = mask.bool() if per_token else ...
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(again[real], want[real], atol=1e-5, rtol=0)


def test_sentence_transformers_directory_embeds_equal(family_dir: Path, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    SentenceTransformer = st.SentenceTransformer
    try:  # sentence-transformers 6; earlier: sentence_transformers.models
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    modules = [
        models.Transformer(str(family_dir), max_seq_length=64),
        models.Pooling(64, "mean"),
        models.Normalize(),
    ]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path))
    reference = SentenceTransformer(str(tmp_path), device="cpu")
    texts = [t for t in TEXTS if t.strip()] + ["word " * 100]  # some longer than 64 pieces
    want = reference.encode(texts, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "n texts are longer than 64 pieces"
        got = Pipeline(str(tmp_path), precision="fp32", truncate=True).embed(texts)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_fill_mask_shows_tokens_as_transformers_pipeline(family_dir: Path) -> None:
    """A token's text as transformers' fill-mask pipeline shows it (its decoded text: "it", not
    the byte-level piece "Ġit" nor SentencePiece's "▁it"), with its id and probability."""
    mask = Tokenizer.from_pretrained(family_dir).specials.mask
    texts = [f"Paris is the {mask} of France.", f"Return the {mask} of the list."]
    theirs = transformers.pipeline("fill-mask", model=str(family_dir), device="cpu", top_k=8)
    got = Pipeline(family_dir, precision="fp32").fill_mask(texts, top_k=8)
    for text, [row] in zip(texts, got):
        want = theirs(text)
        assert [t["id"] for t in row] == [w["token"] for w in want]
        assert [t["token"] for t in row] == [w["token_str"] for w in want]
        np.testing.assert_allclose([t["score"] for t in row], [w["score"] for w in want], atol=1e-6)


def test_whole_word_masking_finds_the_words_transformers_collator_finds(
    family_dir: Path, corpus: list[str]
) -> None:
    """--whole-word-mask on a byte-level BPE or Unigram vocabulary: a word starts at a piece
    with the vocabulary's mark of a word's start (Ġ, ▁), as transformers'
    DataCollatorForLanguageModeling(whole_word_mask=True) finds words (no gap between pieces:
    one word), and every piece of a chosen word is masked. (MPNet's WordPiece: Google's "##"
    continuations, test_instances.py.)"""
    from transformers.data.data_collator import DataCollatorForLanguageModeling as Collator

    from bertforge.data.instances import MaskingSpec, mask_tokens

    tok = Tokenizer.from_pretrained(family_dir)
    assert tok.word_start == {"BPE": "Ġ", "Unigram": "▁", "WordPiece": None}[tok.kind]
    specials = frozenset({tok.cls_id, tok.sep_id, tok.pad_id})
    spec = MaskingSpec.from_tokens(
        tok.tokens, tok.mask_id, specials, word_start=tok.word_start, whole_word=True
    )
    if tok.word_start is None:
        assert spec.is_continuation.tolist() == [t.startswith("##") for t in tok.tokens]
        return
    rng = np.random.default_rng(0)
    for text in corpus[:60]:
        enc = tok.encode(text, max_length=64)
        ids, special = np.array(enc.ids), np.isin(enc.ids, list(specials))
        # this ModernBERT fixture's offsets keep the space before a word (untrimmed, where
        # RoBERTa's tokenizer trims it): trimmed here, so the collator sees the gaps
        offsets = [(a + (a < b and text[a].isspace()), b) for a, b in enc.offsets]
        words, _ = Collator._calc_word_ids_and_prob_mask(
            np.array([offsets]), special[None].astype(int)
        )
        words = words[0]
        starts = ~special & ~spec.is_continuation[ids]
        starts[1] = True  # the first piece after <s> starts a word, marked or not
        # a bare "▁" piece gets the next character's offsets, and the collator then splits its
        # word in two where the piece after overlaps it: "▁" "ch" "anges" is one word here
        bare = np.roll(np.array(tok.convert_ids_to_tokens(ids)) == tok.word_start, 1)
        keep = ~special & ~bare
        assert (starts[keep] == (np.diff(words, prepend=-1) > 0)[keep]).all(), text
        _, positions, _ = mask_tokens(ids, spec, rng)
        chosen = set(words[positions].tolist())
        assert set(np.flatnonzero(np.isin(words, list(chosen)))) == set(positions.tolist())


def test_positions_count_past_the_padding_id() -> None:
    config = BertConfig(**{**SMALL, "vocab_size": 50}, model_type="roberta", pad_token_id=1)
    assert config.max_tokens == 64
    model = BertModel(config).eval()
    with pytest.raises(Exception, match="65 is more than the model's 64 positions"):
        model(torch.full((1, 65), 5))


def test_an_unsupported_family_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}))
    with pytest.raises(ConfigError, match="deberta-v2.*bertforge reads bert, distilbert, roberta"):
        BertConfig.from_pretrained(tmp_path)
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_type='deberta-v2' is not supported" in err[0]


def test_a_finetuned_model_loads_in_transformers_with_the_same_logits(
    family_dir: Path, tmp_path: Path
) -> None:
    train = keyword_table(tmp_path / "train.tsv", 48, seed=0)
    out = tmp_path / "run"
    args = ["finetune", "--model", str(family_dir), "--task", "sst2", "--train", str(train)]
    args += ["--dev", str(train), "--out", str(out), "--epochs", "1", "--max-seq-length", "32"]
    assert main(args) == 0
    config = json.loads((out / "config.json").read_text())
    family = json.loads((family_dir / "config.json").read_text())["model_type"]
    assert config["model_type"] == family
    assert config["architectures"] == [f"{ARCH[family]}ForSequenceClassification"]
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    texts = ["the film was good", "a dull story of people and places with music"]
    batch = tok(texts, padding=True, return_tensors="pt")
    ours = BertForSequenceClassification.from_pretrained(out)
    with torch.no_grad():
        want = theirs(**batch).logits
        got = ours(**Tokenizer.from_pretrained(out)(texts)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_onnx_export_equals_pytorch(family_heads: dict[str, Path], tmp_path: Path) -> None:
    """A sentence-transformers directory of the family: its hidden states and its pooled,
    normalised sentence embedding in the graph, equal to PyTorch's and to `embed`'s."""
    pytest.importorskip("onnxruntime")
    st_dir = family_heads["st"]
    onnx = tmp_path / "model.onnx"
    assert main(["export", str(st_dir), "--onnx", str(onnx), "--atol", "1e-5"]) == 0
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    # traced on two short rows; a row past ModernBERT's local window (8 each side) read too
    texts = ["a short one", "Return the length of the list, or raise an error. " * 2]
    batch = Tokenizer.from_pretrained(st_dir)(texts)
    feed = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    with torch.no_grad():
        want = BertModel.from_pretrained(st_dir, add_pooling_layer=False)(**batch)
    got, sentences = session.run(["last_hidden_state", "sentence_embedding"], feed)
    real = batch["attention_mask"].bool().numpy()
    np.testing.assert_allclose(got[real], want.last_hidden_state.numpy()[real], atol=1e-5)
    embedded = Pipeline(st_dir, precision="fp32").embed(texts)
    np.testing.assert_allclose(sentences, embedded, atol=1e-5)


def test_pair_rows_use_the_familys_template(family_dir: Path) -> None:
    """A cross-encoder's and a QA window's rows are laid out as the tokenizer lays out a pair
    (<s> A </s></s> B </s>), so a pair scores alike however it was made."""
    from bertforge.tasks import ranking

    tok = Tokenizer.from_pretrained(family_dir)
    q, d = "where is the list", "Return the length of the list."
    pieces = tok.encode_batch([q, d], add_special_tokens=False)
    [(row, _)] = ranking.pair_rows(pieces[0].ids, pieces[1].ids, tok, 64)
    assert row.tolist() == tok.encode(q, d).ids
    seps = tok.specials.pair_extra - 2  # </s></s> between RoBERTa's texts, [SEP] between BERT's
    after = len(pieces[0].ids) + 1
    assert row.tolist()[after : after + seps + 1] == [tok.sep_id] * seps + [pieces[1].ids[0]]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_vocab_train_of_another_kind_encodes_as_transformers_reads_it(
    kind: str, corpus: list[str], tmp_path: Path
) -> None:
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
    out = tmp_path / "vocab"
    args = ["vocab", "train", str(tmp_path / "corpus.txt"), "--out", str(out), "--kind", kind]
    assert main([*args, "--size", "400"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    ours = Tokenizer.from_pretrained(out)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert ours.tokens[:5] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert ours.vocab_size == len(theirs) == 400
    for text in [*TEXTS, *corpus[:20], "the <mask> of it"]:
        assert ours.encode(text, truncation=False).ids == theirs(text)["input_ids"], text
    assert ours.encode("a", "b").ids == theirs("a", "b")["input_ids"]  # <s> a </s></s> b </s>


def _familys_own_tokenizer(kind: str, trained: Path) -> object:
    """transformers' RoBERTa (bpe) or XLM-RoBERTa (unigram) tokenizer class over the
    vocabulary `vocab train` wrote: what those families' own files do with the same pieces."""
    model = json.loads((trained / "tokenizer.json").read_text())["model"]
    if kind == "bpe":
        merges = [tuple(m) for m in model["merges"]]
        return transformers.RobertaTokenizer(vocab=model["vocab"], merges=merges)
    theirs = transformers.XLMRobertaTokenizer(vocab=[tuple(v) for v in model["vocab"]])
    # XLM-RoBERTa's own file normalises by SentencePiece's NFKC table; the class built from
    # a vocabulary has no normaliser, so it is given NFKC's
    theirs._tokenizer.normalizer = tokenizers.normalizers.NFKC()
    return theirs


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_vocab_train_offsets_equal_the_familys_own_tokenizer(
    kind: str, corpus: list[str], tmp_path: Path
) -> None:
    """A trained vocabulary's pieces span the words without the space before them, as RoBERTa's
    (trim_offsets) and XLM-RoBERTa's tokenizers give them: a QA answer or an entity built from
    the offsets does not begin with a space."""
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
    out = tmp_path / "vocab"
    args = ["vocab", "train", str(tmp_path / "corpus.txt"), "--out", str(out), "--kind", kind]
    assert main([*args, "--size", "400"]) == 0
    ours = Tokenizer.from_pretrained(out)
    theirs = _familys_own_tokenizer(kind, out)
    spaced = ["  two  spaces  before and after  ", "tabs\tand\n\nlines", "a  b   c"]
    for text in [*TEXTS, *corpus[:20], *spaced]:
        want = theirs(text, return_offsets_mapping=True)
        got = ours.encode(text, truncation=False)
        assert got.ids == want["input_ids"], text
        assert got.offsets == [tuple(o) for o in want["offset_mapping"]], text
    for a, b in zip(spaced, corpus):
        want = theirs(a, b, return_offsets_mapping=True)
        assert ours.encode(a, b).offsets == [tuple(o) for o in want["offset_mapping"]], (a, b)
    text = "Paris is the capital of France."
    spans = [text[s:e] for s, e in ours.encode(text).offsets]
    assert not any(piece[:1].isspace() for piece in spans), spans


def test_qa_answers_and_entities_on_a_bpe_vocabulary_start_at_their_word(
    corpus: list[str], tmp_path: Path
) -> None:
    """On a vocabulary `vocab train --kind bpe` made, a QA answer (the SQuAD decoding of given
    logits) and NER entities (a tagger that tags every word B-PER) are the words themselves,
    not the words with the space before them."""
    from bertforge.data.tasks import SquadExample
    from bertforge.tasks.squad import featurize, postprocess
    from bertforge.tokenizer import train_vocab_from_texts

    tok = train_vocab_from_texts(corpus, 400, kind="bpe", show_progress=False)
    context = "Paris is the capital of France."
    example = SquadExample("x", "What is Paris?", context, [], True, "t")
    features = featurize([example], tok, max_seq_length=64)
    window = features.meta[0]
    at, end = context.index("capital"), context.index("capital") + len("capital")
    inside = [i for i, (a, b) in enumerate(window.offsets) if b > at and a < end]
    start_logits, end_logits = np.zeros((2, len(features.input_ids[0])))
    start_logits[window.context_start + inside[0]] = 5.0
    end_logits[window.context_start + inside[-1]] = 5.0
    answers = postprocess([example], features, [start_logits], [end_logits], version_2=False)
    assert answers.predictions["x"] == "capital"

    tok.save_pretrained(tmp_path)
    tags = dict(id2label=dict(enumerate(NER_TAGS)), label2id={t: i for i, t in enumerate(NER_TAGS)})
    config = transformers.RobertaConfig(vocab_size=len(tok), **SMALL, **tags)
    tagger = transformers.RobertaForTokenClassification(config)
    with torch.no_grad():  # every piece B-PER: each word an entity of its own
        tagger.classifier.weight.zero_()
        tagger.classifier.bias.copy_(torch.tensor([0.0, 5.0, 0.0]))
    tagger.save_pretrained(tmp_path)
    [entities] = Pipeline(tmp_path, precision="fp32").ner([context])
    words = ["Paris", "is", "the", "capital", "of", "France", "."]
    assert [e["text"] for e in entities] == words
    assert all(context[e["start"] : e["end"]] == e["text"] for e in entities)


@pytest.fixture(scope="module")
def bpe_shards(corpus: list[str], tmp_path_factory) -> Path:
    """Pre-training shards of the stdlib's docstrings, tokenized by a byte-level BPE."""
    from bertforge.data.shards import prepare
    from bertforge.tokenizer import train_vocab_from_texts

    root = tmp_path_factory.mktemp("roberta_data")
    tok = train_vocab_from_texts(corpus, 400, kind="bpe", show_progress=False)
    (root / "corpus.txt").write_text("\n\n".join(corpus) + "\n")
    prepare([root / "corpus.txt"], tok, root / "shards", shard_tokens=4000, progress=False)
    return root / "shards"


@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_pretrain_losses_equal_transformers_step_for_step(
    arch: str, bpe_shards: Path, tmp_path: Path
) -> None:
    """`pretrain --arch roberta|modernbert`'s model and loss against transformers'. The
    ModernBERT has 3 layers with local attention over 16 positions, so that its rows of 64
    attend locally in two of them."""
    config = None
    if arch == "modernbert":
        config = BertConfig.from_dict({"model_type": "modernbert", **SMALL_MODERNBERT})
    diffs = _losses_beside_transformers(arch, bpe_shards, tmp_path, 64, config)
    assert max(diffs) < 1e-4, diffs


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_pretrain_losses_equal_transformers_on_the_wikipedia_sample(
    arch: str, data_dir: Path, tmp_path: Path
) -> None:
    """The same on a Wikipedia file of the shared sample, a byte-level BPE trained on it, and
    --arch's own model (ModernBERT: 2 layers, a global and a local one) at 128 pieces a row."""
    from bertforge.data.shards import prepare
    from bertforge.tokenizer import train_vocab_from_texts

    wiki = sorted((data_dir / "wikipedia_en_sample").rglob("wiki_*"))[0]
    lines = [ln for ln in wiki.read_text(encoding="utf-8").splitlines() if not ln.startswith("<")]
    tok = train_vocab_from_texts(lines, 2000, kind="bpe", show_progress=False)
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    prepare([tmp_path / "corpus.txt"], tok, tmp_path / "shards", progress=False)
    diffs = _losses_beside_transformers(arch, tmp_path / "shards", tmp_path, 128, None)
    assert max(diffs) < 1e-4, diffs


def _losses_beside_transformers(
    arch: str, shards_dir: Path, tmp_path: Path, length: int, config: BertConfig | None
) -> list[float]:
    """`pretrain --arch`'s model and loss (PretrainingTask.loss on bertforge's packed,
    dynamically masked rows; AdamW with BERT's parameter groups) against transformers'
    RobertaForMaskedLM / ModernBertForMaskedLM on the same weights and batches: |difference|
    of the loss at each of 10 optimizer steps, fp32, no dropout. `config`: the model's
    config.json instead of --arch's tiny one."""
    from bertforge.data.shards import ShardSet
    from bertforge.train.distributed import Dist
    from bertforge.train.optim import build_optimizer
    from bertforge.train.pretrain import PretrainConfig, build_model, make_task

    cfg = PretrainConfig(data=str(shards_dir), out="-", arch=arch, model_size="tiny", dropout=0.0)
    cfg.batch_size, cfg.max_seq_length, cfg.lr = 8, length, 1e-3
    assert not cfg.nsp  # masked LM alone
    assert cfg.masked_lm_prob == (0.30 if arch == "modernbert" else 0.15)
    shards = ShardSet(shards_dir)
    torch.manual_seed(0)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
        cfg.config, cfg.arch = str(tmp_path / "config.json"), None
    ours = build_model(cfg, shards.tokenizer())
    assert ours.config.model_type == arch
    ours.save_pretrained(tmp_path / "init")
    theirs = getattr(transformers, f"{ARCH[arch]}ForMaskedLM").from_pretrained(tmp_path / "init")
    for module in theirs.modules():  # --dropout 0 for both
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    theirs.train()
    task = make_task(cfg, shards, Dist())
    opt_a = build_optimizer(ours, "adamw", 1e-3, 0.01)
    opt_b = build_optimizer(theirs, "adamw", 1e-3, 0.01)
    diffs = []
    for (micro, _), _ in zip(task.batches(None), range(10)):
        (batch,) = micro
        assert (batch.input_ids[:, 0] == shards.tokenizer().cls_id).all()
        loss_a, _ = task.loss(ours, batch, task.normalizers([batch]))
        labels = hf_mlm_labels(batch)
        loss_b = theirs(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels
        ).loss
        diffs.append(abs(loss_a.item() - loss_b.item()))
        step_both((ours, loss_a, opt_a), (theirs, loss_b, opt_b))
    return diffs


@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_pretrain_arch_writes_what_transformers_loads(
    arch: str, bpe_shards: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    args = ["pretrain", "--data", str(bpe_shards), "--out", str(out), "--arch", arch]
    args += ["--model-size", "tiny", "--steps", "4", "--batch-size", "4", "--whole-word-mask"]
    args += ["--max-seq-length"]
    assert main([*args, "64", "--precision", "fp32", "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [f"{ARCH[arch]}ForMaskedLM"]
    run = json.loads((out / "run.json").read_text())["settings"]
    if arch == "roberta":
        assert config["type_vocab_size"] == 1 and run["masked_lm_prob"] == 0.15
    else:  # ModernBERT's blocks written out; its recipe's 30% masking
        assert "type_vocab_size" not in config and config["intermediate_size"] == 192
        assert config["layer_types"] == ["full_attention", "sliding_attention"]
        assert run["masked_lm_prob"] == 0.30
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(theirs).__name__ == f"{ARCH[arch]}ForMaskedLM"
    batch = Tokenizer.from_pretrained(out)(["Return the <mask> of the list.", "short"])
    with torch.no_grad():
        want = theirs(**batch).logits
        got = BertForMaskedLM.from_pretrained(out)(**batch).mlm_logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # BERT's recipe on RoBERTa's data, or NSP on a family without it: one line each
    capsys.readouterr()
    bert = ["pretrain", "--data", str(bpe_shards), "--out", str(tmp_path / "b"), "--steps", "1"]
    assert main([*bert, "--no-nsp"]) == 2
    assert "prepare the data with `bertforge vocab train --kind bpe`" in capsys.readouterr().err
    (tmp_path / "r.json").write_text((out / "config.json").read_text())
    assert main([*bert, "--config", str(tmp_path / "r.json")]) == 2
    display = {"roberta": "RoBERTa", "modernbert": "ModernBERT"}[arch]
    assert f"a {display} model has no next-sentence head: pass --no-nsp" in capsys.readouterr().err


def test_index_search_and_serve_a_roberta_bi_encoder(
    family_dir: Path, corpus: list[str], tmp_path: Path, capsys
) -> None:
    """The verbs over a family's sentence-transformers directory: index and search agree with
    its embeddings; the server's embeddings are the pipeline's and fill-mask counts <mask>."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import Limits, create_app

    docs = [d[:90] for d in corpus[:12]]  # within one window: scored as the pipeline embeds
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    )
    (tmp_path / "q.txt").write_text(docs[3][:60] + "\n")
    index = tmp_path / "idx"
    args = ["index", str(family_dir), str(tmp_path / "docs.jsonl"), "--out", str(index)]
    assert main([*args, "--precision", "fp32"]) == 0
    capsys.readouterr()
    assert main(["search", str(index), str(tmp_path / "q.txt"), "--top-k", "3"]) == 0
    [row] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    pipe = Pipeline(str(family_dir), precision="fp32")
    vectors = pipe.embed([docs[3][:60], *docs])
    scores = vectors[1:] @ vectors[0]
    assert [h["id"] for h in row["results"]] == [f"d{i}" for i in np.argsort(-scores)[:3]]
    app = create_app(family_dir, Limits(max_wait_ms=5), precision="fp32")
    with TestClient(app) as client:
        got = client.post("/v1/embeddings", json={"input": docs[:2], "model": "m"}).json()
        served = np.array([d["embedding"] for d in got["data"]])
        np.testing.assert_allclose(served, pipe.embed(docs[:2]), atol=1e-5)
        masked = f"the {pipe.tok.specials.mask} of it"
        answer = client.post("/fill-mask", json={"texts": [masked], "top_k": 2})
        assert answer.status_code == 200
        [[top]] = answer.json()["results"]  # per text, per <mask>: the top_k tokens
        assert len(top) == 2 and all(t["id"] < len(pipe.tok) for t in top)


def test_mpnet_relative_positions_beyond_their_last_bucket(tmp_path: Path) -> None:
    """MPNet's relative position buckets over rows of 200 pieces (distances past 128 share a
    bucket), padded, in fp32 and under bf16 autocast (the scores added to SDPA's in its dtype)."""
    torch.manual_seed(0)
    config = transformers.MPNetConfig(
        vocab_size=301, max_position_embeddings=260, **{k: SMALL[k] for k in list(SMALL)[:4]}
    )
    transformers.MPNetModel(config).eval().save_pretrained(tmp_path)
    theirs = transformers.MPNetModel.from_pretrained(tmp_path).eval()
    ours = BertModel.from_pretrained(tmp_path)
    ids = torch.randint(3, 301, (2, 200))
    mask = torch.ones_like(ids)
    mask[1, 150:] = 0
    ids = ids.masked_fill(mask == 0, 1)
    real = mask.bool()
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = ours(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(low[real], want[real], dim=-1)
    assert cosine.min() > 0.999


def test_modernbert_long_rows_attend_locally_as_transformers(tmp_path: Path) -> None:
    """ModernBERT's default layout (global in one layer of three, local attention over 128
    positions in the others) over rows of 600 pieces, padded: hidden states and attention maps
    equal transformers', in fp32, packed (unpadded rows, the GPU's path run on the CPU) and
    under bf16 autocast; past its 8,192 positions, one error."""
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=301, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=96, pad_token_id=1, cls_token_id=0, sep_token_id=2, bos_token_id=0,
        eos_token_id=2,
    )  # fmt: skip
    transformers.ModernBertModel(config).eval().save_pretrained(tmp_path)
    theirs = transformers.ModernBertModel.from_pretrained(tmp_path, attn_implementation="eager")
    ours = BertModel.from_pretrained(tmp_path)
    assert ours.config.max_tokens == 8192 and [layer.window for layer in ours.layers] == [
        None,
        64,
        64,
    ]
    ids = torch.randint(3, 301, (2, 600))
    mask = torch.ones_like(ids)
    mask[1, 450:] = 0
    ids = ids.masked_fill(mask == 0, 1)
    real = mask.bool()
    with torch.no_grad():
        want = theirs.eval()(input_ids=ids, attention_mask=mask, output_attentions=True)
        got = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
        packed = ours(input_ids=ids, attention_mask=mask, unpad=True).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = ours(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    w = want.last_hidden_state
    torch.testing.assert_close(got.last_hidden_state[real], w[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[real], w[real], atol=1e-5, rtol=0)
    for a, b in zip(got.attentions, want.attentions):  # real queries' maps: local ones banded
        torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=0)
    band = got.attentions[1][0, 0]
    assert band[300, 236].item() > 0 and band[300, 235].item() == 0
    cosine = torch.nn.functional.cosine_similarity(low[real], w[real], dim=-1)
    assert cosine.min() > 0.999
    with pytest.raises(Exception, match="8193 is more than the model's 8192 positions"):
        ours(torch.full((1, 8193), 5))


@pytest.mark.parametrize("family_dir", ["modernbert"], indirect=True)
def test_a_distilled_modernbert_student_keeps_its_layers_kinds(
    family_dir: Path, corpus: list[str], tmp_path: Path
) -> None:
    """A student of teacher layers 1 and 2 (both local) is a ModernBERT of two local layers,
    its first without a norm of its own (the teacher's layer 1's is left behind), and
    transformers reads it as bertforge does."""
    (tmp_path / "text.txt").write_text("\n".join(corpus[:200]) + "\n")
    out = tmp_path / "student"
    args = ["distill", "--teacher", str(family_dir), "--out", str(out), "--data"]
    args += [str(tmp_path / "text.txt"), "--student-layers", "1,2", "--steps", "2"]
    assert main([*args, "--batch-size", "4", "--no-progress", "--precision", "fp32"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["num_hidden_layers"] == 2
    assert config["layer_types"] == ["sliding_attention", "sliding_attention"]
    theirs = transformers.AutoModel.from_pretrained(out).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = BertModel.from_pretrained(out)
    batch = Tokenizer.from_pretrained(out)([corpus[0], "short"], max_length=64)
    with torch.no_grad():
        want = theirs(**batch).last_hidden_state
        got = ours(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family_dir", ["modernbert"], indirect=True)
def test_onnx_export_keeps_local_attention_past_its_traced_length(
    family_dir: Path, tmp_path: Path
) -> None:
    """Exported from rows shorter than its local window (32 each side here), a ModernBERT's ONNX
    graph still attends locally on rows longer than it."""
    pytest.importorskip("onnxruntime")
    import onnxruntime

    config = json.loads((family_dir / "config.json").read_text())
    config.update(local_attention=64, max_position_embeddings=128)
    torch.manual_seed(0)
    model = tmp_path / "model"
    transformers.ModernBertModel(transformers.ModernBertConfig(**config)).save_pretrained(model)
    transformers.AutoTokenizer.from_pretrained(family_dir).save_pretrained(model)
    onnx = tmp_path / "model.onnx"
    assert main(["export", str(model), "--onnx", str(onnx), "--atol", "1e-5"]) == 0
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_pretrained(model)
    batch = tok(["a short one", "Return the length of the list. " * 20], max_length=128)
    assert batch["input_ids"].shape[1] == 128
    feed = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    with torch.no_grad():
        want = BertModel.from_pretrained(model)(**batch).last_hidden_state.numpy()
    got = session.run(["last_hidden_state"], feed)[0]
    real = batch["attention_mask"].bool().numpy()
    np.testing.assert_allclose(got[real], want[real], atol=1e-5)


# -- every verb and endpoint on every family (issue 57, item 4) ---------------------------------

NER_TAGS = ["O", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def family_heads(family_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """The family's heads as transformers saves them, random weights, family_dir's tokenizer:
    a classifier (two of them, for merge), a tagger, a QA head, a cross-encoder (one label)
    and a sentence-transformers bi-encoder (mean pooling, normalised)."""
    out = tmp_path_factory.mktemp("heads")
    tok = transformers.AutoTokenizer.from_pretrained(family_dir)
    arch = ARCH[json.loads((family_dir / "config.json").read_text())["model_type"]]
    tags = dict(id2label=dict(enumerate(NER_TAGS)), label2id={t: i for i, t in enumerate(NER_TAGS)})
    made = {}
    for name, head, seed, extra in [
        ("cls", "ForSequenceClassification", 0, {"num_labels": 2}),
        ("cls2", "ForSequenceClassification", 1, {"num_labels": 2}),
        ("ner", "ForTokenClassification", 0, tags),
        ("qa", "ForQuestionAnswering", 0, {}),
        ("ce", "ForSequenceClassification", 2, {"num_labels": 1}),
    ]:
        torch.manual_seed(seed)
        kind = json.loads((family_dir / "config.json").read_text())["model_type"]
        config = getattr(transformers, f"{arch}Config")(vocab_size=len(tok), **small(kind), **extra)
        getattr(transformers, arch + head)(config).eval().save_pretrained(out / name)
        tok.save_pretrained(out / name)
        made[name] = out / name
    st = pytest.importorskip("sentence_transformers")
    try:  # sentence-transformers 6; earlier: sentence_transformers.models
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models
    modules = [
        models.Transformer(str(family_dir), max_seq_length=64),
        models.Pooling(64, "mean"),
        models.Normalize(),
    ]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(out / "st"))
    return {**made, "st": out / "st"}


def test_pipelines_equal_transformers_on_every_head(
    family_dir: Path, family_heads: dict[str, Path], capsys
) -> None:
    """info, features of every layer, classify, ner (words as the tokenizer's word_ids), qa's
    span scores, attention maps (MPNet's: with its relative position buckets) and summarize,
    each against transformers on the same checkpoint."""
    from bertforge.attention import attention_maps
    from bertforge.evaluate import entity_spans

    family = json.loads((family_dir / "config.json").read_text())["model_type"]
    assert main(["info", str(family_heads["ner"]), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "ner" in info["pipelines"] and info["model_type"] == family, info
    texts = ["Paris is the capital of France.", "Dr. O'Neil's café, 3.5 km away!"]
    tok = Tokenizer.from_pretrained(family_dir)
    batch = tok(texts)
    real = batch["attention_mask"].bool()
    base = transformers.AutoModel.from_pretrained(family_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = base(**batch, output_hidden_states=True, output_attentions=True)
    layers = list(range(small(family)["num_hidden_layers"] + 1))
    got = Pipeline(family_dir, precision="fp32").features(texts, layers=layers, combine=None)
    for i, item in enumerate(got):
        for layer in layers:
            want = ref.hidden_states[layer][i][real[i]].numpy()
            np.testing.assert_allclose(item["layers"][layer], want, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a masked LM has no pooler, and the maps need none
        tokens, maps = attention_maps(family_dir, texts[0])
    want_maps = torch.stack([a[0] for a in ref.attentions]).numpy()[:, :, : len(tokens)][
        ..., : len(tokens)
    ]
    np.testing.assert_allclose(maps, want_maps, atol=1e-5)

    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(
        family_heads["cls"]
    )
    with torch.no_grad():
        probs = classifier.eval()(**batch).logits.softmax(-1).numpy()
    got_c = Pipeline(family_heads["cls"], precision="fp32").classify(texts)
    np.testing.assert_allclose([list(g["scores"].values()) for g in got_c], probs, atol=1e-5)

    tagger = transformers.AutoModelForTokenClassification.from_pretrained(family_heads["ner"])
    with torch.no_grad():
        tags = tagger.eval()(**batch).logits.argmax(-1).tolist()
    for i, (text, entities) in enumerate(
        zip(texts, Pipeline(family_heads["ner"], precision="fp32").ner(texts))
    ):
        enc = tok.encode(text)
        firsts = [
            j for j, w in enumerate(enc.word_ids) if w is not None and w != enc.word_ids[j - 1]
        ]
        word_tags = [NER_TAGS[tags[i][j]] for j in firsts]
        want = [(kind, enc.offsets[firsts[a]][0]) for kind, a, _ in entity_spans(word_tags)]
        assert [(e["entity"], e["start"]) for e in entities] == want
        assert all(text[e["start"] : e["end"]] == e["text"] for e in entities)

    question, context = "What is the capital?", "Paris is the capital of France."
    [answer] = Pipeline(family_heads["qa"], precision="fp32").qa([question], [context])
    reader = transformers.AutoModelForQuestionAnswering.from_pretrained(family_heads["qa"]).eval()
    pair = tok([question], [context])
    with torch.no_grad():
        out = reader(**pair)
    enc = tok.encode(question, context)
    starts = [j for j, s in enumerate(enc.sequence_ids) if s == 1]
    best = max(
        (out.start_logits[0, a] + out.end_logits[0, b], a, b)
        for a in starts
        for b in starts
        if a <= b < a + 30
    )
    assert (answer["start"], answer["end"]) == (enc.offsets[best[1]][0], enc.offsets[best[2]][1])

    [summary] = Pipeline(family_heads["st"], precision="fp32").summarize(
        ["One thing is here. Two things are there. Three things are elsewhere."], sentences=2
    )
    assert len(summary["sentences"]) == 2


def test_serve_answers_every_api_as_the_pipelines(
    family_dir: Path, family_heads: dict[str, Path], tmp_path: Path
) -> None:
    """Each endpoint once, on the head that serves it: its answer is the pipeline's."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve import Limits, create_app

    mask = Tokenizer.from_pretrained(family_dir).specials.mask
    texts = [f"Paris is the {mask} of France.", "Return the length of the list."]
    qa = {"questions": ["What is the capital?"], "contexts": ["Paris is the capital of France."]}
    requests = {  # head: [(path, body, the pipeline's answer)]
        "mlm": [
            ("/fill-mask", {"texts": texts[:1], "top_k": 2}, lambda p: p.fill_mask(texts[:1], 2))
        ],
        "cls": [("/classify", {"texts": texts}, lambda p: p.classify(texts))],
        "ner": [("/ner", {"texts": texts}, lambda p: p.ner(texts))],
        "qa": [("/qa", qa, lambda p: p.qa(qa["questions"], qa["contexts"]))],
        "ce": [
            ("/rerank", {"query": "list", "texts": texts}, lambda p: p.rerank("list", texts)),
            (
                "/v1/rerank",
                {"query": "list", "documents": texts},
                lambda p: p.rerank("list", texts),
            ),
            (
                "/v2/rerank",
                {"query": "list", "documents": texts, "model": "m"},
                lambda p: p.rerank("list", texts),
            ),
        ],
        "st": [
            ("/embed", {"texts": texts}, lambda p: p.embed(texts)),
            ("/v1/embeddings", {"input": texts, "model": "m"}, lambda p: p.embed(texts)),
            ("/summarize", {"texts": ["One thing. Two things. Three things."]}, None),
            ("/search", {"queries": ["the list"], "top_k": 2}, None),
        ],
    }
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    index = tmp_path / "idx"
    assert (
        main(
            [
                "index",
                str(family_heads["st"]),
                str(tmp_path / "docs.jsonl"),
                "--out",
                str(index),
                "--precision",
                "fp32",
                "--no-progress",
            ]
        )
        == 0
    )
    for head, calls in requests.items():
        model = family_dir if head == "mlm" else family_heads[head]
        pipe = Pipeline(model, precision="fp32")
        app = create_app(
            model, Limits(max_wait_ms=5), index=index if head == "st" else None, precision="fp32"
        )
        with TestClient(app) as client:
            for path in ("/health", "/ready", "/metadata", "/metrics"):
                assert client.get(path).status_code == 200, path
            for path, body, answer in calls:
                r = client.post(path, json=body)
                assert r.status_code == 200, (path, r.text)
                got = r.json()
                if answer is None:
                    continue
                want = json.loads(json.dumps(answer(pipe), default=np.ndarray.tolist))
                if path == "/v1/embeddings":
                    got = [d["embedding"] for d in got["data"]]
                elif path == "/embed":
                    got = got["embeddings"]
                elif path != "/rerank":
                    got = got["results"]
                if path in ("/v1/rerank", "/v2/rerank"):
                    got = [{"index": g["index"], "score": g["relevance_score"]} for g in got]
                    want = [{"index": w["index"], "score": w["score"]} for w in want]
                np.testing.assert_allclose(_numbers(got), _numbers(want), atol=1e-5, err_msg=path)
                assert _strings(got) == _strings(want), path


def _numbers(x: object) -> list[float]:
    if isinstance(x, dict):
        return [n for k in sorted(x) for n in _numbers(x[k])]
    if isinstance(x, list):
        return [n for v in x for n in _numbers(v)]
    return [float(x)] if isinstance(x, (int, float)) and not isinstance(x, bool) else []


def _strings(x: object) -> list[str]:
    if isinstance(x, dict):
        return [s for k in sorted(x) for s in _strings(x[k])]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return [x] if isinstance(x, str) else []


@pytest.mark.parametrize("task", ["conll2003", "squad2", "swag", "retrieval", "rerank"])
def test_finetune_of_every_task_family_loads_in_its_library(
    family_dir: Path, task: str, tmp_path: Path
) -> None:
    """`finetune` on each task family (sequence classification: the test above): the result
    loads in transformers' head class of the family (SentenceTransformer for retrieval,
    CrossEncoder for rerank) with the same outputs as bertforge's."""
    from bertforge import heads
    from bertforge.checkpoint import architectures
    from bertforge.train.finetune import FinetuneConfig
    from bertforge.train.finetune import run as finetune

    from .test_distill import _family_files
    from .test_rerank import groups
    from .test_retrieval_training import toy

    if task == "retrieval":
        data, options = toy(tmp_path / "r.jsonl"), {}
    elif task == "rerank":
        data, options = tmp_path / "g.jsonl", {}
        data.write_text("".join(json.dumps(r) + "\n" for r in groups()))
    else:
        data, options = _family_files(task, tmp_path)
    out = tmp_path / "out"
    options = {"max_seq_length": 64, **options}
    finetune(
        FinetuneConfig(
            model=str(family_dir),
            task=task,
            train=str(data),
            dev=str(data),
            out=str(out),
            epochs=1,
            batch_size=4,
            progress=False,
            precision="fp32",
            **options,
        )
    )  # type: ignore[arg-type]
    family = json.loads((family_dir / "config.json").read_text())["model_type"]
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    texts = ["a fine film", "the cat sat on the mat"]
    if task in ("retrieval", "rerank"):
        st = pytest.importorskip("sentence_transformers")
        if task == "retrieval":
            want = st.SentenceTransformer(str(out), device="cpu").encode(texts)
            got = Pipeline(out, precision="fp32").embed(texts)
        else:
            want = st.CrossEncoder(str(out), device="cpu").predict([tuple(texts)])
            got = Pipeline(out, precision="fp32").score(texts[:1], texts[1:])
        np.testing.assert_allclose(got, want, atol=1e-5)
        return
    [arch] = json.loads((out / "config.json").read_text())["architectures"]
    assert arch.startswith(ARCH[family])
    theirs = getattr(transformers, arch).from_pretrained(out).eval()
    ours = getattr(heads, architectures(out)[0]).from_pretrained(out).eval()
    enc = Tokenizer.from_pretrained(out)(texts)
    if task == "swag":
        enc = {k: v.unsqueeze(0) for k, v in enc.items()}
    with torch.no_grad():
        a, b = ours(**enc), theirs(**enc)
    # per token: the real tokens (padding's logits are no answer: ModernBERT's padded rows
    # attend to themselves in its local layers, transformers' to nothing)
    real = enc["attention_mask"].bool() if task in ("conll2003", "squad2") else ...
    for field in ("start_logits", "end_logits") if task == "squad2" else ("logits",):
        torch.testing.assert_close(
            getattr(a, field)[real], getattr(b, field)[real], atol=1e-5, rtol=0
        )


def test_distill_merge_probe_search_and_mine_on_the_family(
    family_dir: Path, family_heads: dict[str, Path], corpus: list[str], tmp_path: Path, capsys
) -> None:
    """distill: a fresh narrower student of the teacher's family (MPNet's buckets kept) that
    transformers reads with bertforge's hidden states; merge of two classifiers of the family;
    probe on its frozen features; search reranked by, and mine taught by, its cross-encoder."""
    (tmp_path / "text.txt").write_text("\n".join(corpus[:80]) + "\n")
    shape = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 4}
    (tmp_path / "shape.json").write_text(json.dumps({**shape, "intermediate_size": 64}))
    student = tmp_path / "student"
    args = ["distill", "--teacher", str(family_heads["st"]), "--out", str(student), "--data"]
    args += [str(tmp_path / "text.txt"), "--student-size", str(tmp_path / "shape.json")]
    args += ["--steps", "2", "--batch-size", "4", "--max-seq-length", "64", "--no-progress"]
    assert main([*args, "--precision", "fp32"]) == 0
    teacher = json.loads((family_dir / "config.json").read_text())
    config = json.loads((student / "config.json").read_text())
    assert config["model_type"] == teacher["model_type"] and config["hidden_size"] == 32
    assert config.get("relative_attention_num_buckets") == teacher.get(
        "relative_attention_num_buckets"
    )
    batch = Tokenizer.from_pretrained(student)(corpus[:3])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        want = transformers.AutoModel.from_pretrained(student).eval()(**batch).last_hidden_state
        got = BertModel.from_pretrained(student, add_pooling_layer=False)(**batch)
    torch.testing.assert_close(got.last_hidden_state[real], want[real], atol=1e-5, rtol=0)

    merged = tmp_path / "merged"
    two = [str(family_heads["cls"]), str(family_heads["cls2"])]
    assert main(["merge", *two, "--out", str(merged)]) == 0
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(merged).eval()
    a, b = (
        transformers.AutoModelForSequenceClassification.from_pretrained(p).state_dict() for p in two
    )
    for name, tensor in theirs.state_dict().items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, atol=1e-6, rtol=0)

    train = keyword_table(tmp_path / "train.tsv", 40, seed=0)
    probe = ["probe", "--model", str(family_dir), "--task", "sst2", "--train", str(train)]
    assert main([*probe, "--dev", str(train), "--layers=-1", "--precision", "fp32"]) == 0
    assert "best: -1" in capsys.readouterr().out

    docs = corpus[:10]
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    )
    (tmp_path / "q.txt").write_text(docs[3][:50] + "\n")
    index = tmp_path / "idx"
    args = ["index", str(family_heads["st"]), str(tmp_path / "docs.jsonl"), "--out", str(index)]
    assert main([*args, "--precision", "fp32", "--no-progress"]) == 0
    capsys.readouterr()
    ce = str(family_heads["ce"])
    search = ["search", str(index), str(tmp_path / "q.txt"), "--rerank", ce, "--top-k", "3"]
    assert main([*search, "--rerank-depth", "10"]) == 0
    [row] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    # a random cross-encoder's scores are close: each hit's score is the pipeline's (at the
    # precision search runs it), in order, rather than the order compared
    want = {f"d{s['index']}": s["score"] for s in Pipeline(ce).rerank(docs[3][:50], docs)}
    got = [h["score"] for h in row["results"]]
    assert got == sorted(got, reverse=True) and len(got) == 3
    np.testing.assert_allclose(got, [want[h["id"]] for h in row["results"]], atol=1e-3)
    (tmp_path / "train.jsonl").write_text(json.dumps({"query": docs[1][:30], "positive": docs[1]}))
    mined = tmp_path / "mined.jsonl"
    mine = ["mine", str(index), str(tmp_path / "train.jsonl"), "--out", str(mined)]
    assert main([*mine, "--teacher", ce, "--negatives", "2"]) == 0
    [row] = [json.loads(x) for x in mined.read_text().splitlines()]
    assert len(row["negatives"]) == 2 and docs[1] not in row["negatives"]
    assert len(row["scores"]) == 3  # the teacher's score of the positive and of each negative
