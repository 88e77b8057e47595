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
        want = theirs(a, b, truncation=True, max_length=40)["input_ids"]
        assert ours.encode(a, b, max_length=40).ids == want, (a, b)
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


def test_onnx_export_equals_pytorch(family_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    onnx = tmp_path / "model.onnx"
    assert main(["export", str(family_dir), "--onnx", str(onnx), "--atol", "1e-5"]) == 0
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_pretrained(family_dir)
    # traced on two short rows; a row of 64 reads past ModernBERT's local window of 8 each side
    long = "Return the length of the list, or raise an error. " * 8
    batch = tok(["a short one", long], max_length=64)
    feed = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    with torch.no_grad():
        want = BertModel.from_pretrained(family_dir, add_pooling_layer=False)(**batch)
    got = session.run(["last_hidden_state"], feed)[0]
    real = batch["attention_mask"].bool().numpy()
    np.testing.assert_allclose(got[real], want.last_hidden_state.numpy()[real], atol=1e-5)


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
    args += ["--model-size", "tiny", "--steps", "4", "--batch-size", "4", "--max-seq-length"]
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
