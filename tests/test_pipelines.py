"""Inference pipelines against references: sentence-transformers for embeddings, transformers
for hidden states, masked-LM, NSP, classification and token logits; CLI in and out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertForPreTraining, Tokenizer, pipelines
from bertforge.cli import main
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.evaluate import entity_scores, entity_spans
from bertforge.heads import BertForSequenceClassification, BertForTokenClassification
from bertforge.pipelines import Pipeline
from bertforge.runner import length_batches
from bertforge.tasks.tagging import entities
from tests.conftest import TINY

SENTENCES = [
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Résumé of naïve café owners",
    "Hi",
    "Transformers process sequences in parallel, attending to every position at once; "
    "recurrent networks, by contrast, step through them one token at a time.",
    "北京是中国的首都",
] * 3


def test_embed_matches_sentence_transformers(minilm_dir: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(
        SENTENCES, batch_size=4, convert_to_numpy=True
    )
    ours = Pipeline(minilm_dir, precision="fp32", batch_size=4).embed(
        SENTENCES, pooling="mean", normalize=True
    )
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < 1e-4


def test_poolings_and_features_match_transformers(minilm_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tok = Tokenizer.from_pretrained(minilm_dir)
    pipe = Pipeline(minilm_dir, precision="fp32", batch_size=3)
    with torch.no_grad():
        out = hf(**tok(SENTENCES[:6]), output_hidden_states=True)
    mask = tok(SENTENCES[:6])["attention_mask"].unsqueeze(-1).float()
    h = out.last_hidden_state
    cls = pipe.embed(SENTENCES[:6], pooling="cls", normalize=False)
    mx = pipe.embed(SENTENCES[:6], pooling="max", normalize=False)
    assert np.abs(cls - h[:, 0].numpy()).max() < 1e-4
    assert np.abs(mx - h.masked_fill(mask == 0, -1e9).amax(1).numpy()).max() < 1e-4
    feats = pipe.features(SENTENCES[:6], layers=(-1, -2, 0), combine="concat")
    for i, f in enumerate(feats):
        n = int(mask[i].sum())
        assert f["tokens"] == tok.encode(SENTENCES[i]).tokens
        assert f["values"].shape == (n, 3 * 384)
        for k in (-1, -2, 0):
            assert np.abs(f["layers"][k] - out.hidden_states[k][i, :n].numpy()).max() < 1e-4
    summed = pipe.features(SENTENCES[:2], layers=(-1, -2), combine="sum")
    want = feats[0]["layers"][-1] + feats[0]["layers"][-2]
    assert np.abs(summed[0]["values"] - want).max() < 1e-4
    with pytest.raises(ConfigError, match="layer 9"):
        pipe.features(["x"], layers=(9,))
    with pytest.raises(ConfigError, match="pooling"):
        pipe.embed(["x"], pooling="median")


def test_fill_mask_and_nsp_match_transformers(tiny_model: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertForPreTraining.from_pretrained(tiny_model).eval()
    tok = Tokenizer.from_pretrained(tiny_model)
    pipe = Pipeline(tiny_model, precision="fp32")
    texts = ["the cat sat on the [MASK].", "[MASK] is the capital of [MASK] and a city."]
    got = pipe.fill_mask(texts, top_k=3)
    with torch.no_grad():
        out = hf(**tok(texts))
    for i in range(len(texts)):
        ids = tok(texts)["input_ids"][i]
        positions = (ids == tok.convert_tokens_to_ids(["[MASK]"])[0]).nonzero().flatten()
        assert len(got[i]) == len(positions)
        for m, pos in zip(got[i], positions):
            p, k = out.prediction_logits[i, pos].softmax(-1).topk(3)
            assert [x["id"] for x in m] == k.tolist()
            assert np.allclose([x["score"] for x in m], p.numpy(), atol=1e-5)
    with pytest.raises(InputError, match="no \\[MASK\\]"):
        pipe.fill_mask(["nothing to fill"])
    probs = pipe.nsp(["the cat sat.", "it rained"], ["it purred.", "stocks fell sharply today"])
    with torch.no_grad():
        ref = hf(**tok(["the cat sat.", "it rained"], ["it purred.", "stocks fell sharply today"]))
    assert np.allclose(probs, ref.seq_relationship_logits.softmax(-1)[:, 0].numpy(), atol=1e-5)


NUMBERS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]


@pytest.mark.slow
def test_fill_mask_on_a_model_pre_trained_by_bertforge(tmp_path: Path) -> None:
    """vocab train + prepare + pretrain (the real path, a tiny BERT) on counting text; the
    fill-mask pipeline then fills in the missing number of sequences it never saw whole."""
    from bertforge.data.shards import prepare
    from bertforge.tokenizer import train_vocab
    from bertforge.train.pretrain import PretrainConfig
    from bertforge.train.pretrain import run as pretrain

    rng = np.random.default_rng(0)

    def sentence() -> str:
        start = int(rng.integers(0, 12))
        return " ".join(NUMBERS[start : start + int(rng.integers(5, 9))]) + "."

    corpus = tmp_path / "counting.txt"  # Google's format: a blank line between documents
    corpus.write_text("\n\n".join("\n".join(sentence() for _ in range(4)) for _ in range(400)))
    tok = train_vocab([corpus], 100, show_progress=False)
    prepare([corpus], tok, tmp_path / "shards", heldout=0.05, progress=False)
    out = tmp_path / "run"
    summary = pretrain(
        PretrainConfig(
            data=str(tmp_path / "shards"),
            out=str(out),
            model_size="tiny",
            steps=400,
            batch_size=16,
            max_seq_length=32,
            lr=2e-3,
            warmup_ratio=0.05,
            precision="fp32",
            eval_every=400,
            eval_batches=4,
            save_every=400,
            keep_checkpoints=1,
            progress=False,
        )
    )
    assert summary["eval"]["mlm_acc"] > 0.5  # held-out documents
    probes = {
        "two three [MASK] five six.": "four",
        "nine ten eleven [MASK] thirteen.": "twelve",
        "fourteen fifteen [MASK] seventeen.": "sixteen",
        "[MASK] seven eight nine.": "six",
    }

    def right(model: Path) -> int:
        got = Pipeline(model, precision="fp32").fill_mask(list(probes), top_k=1)
        return sum(g[0][0]["token"] == want for g, want in zip(got, probes.values()))

    # 400 steps of a tiny model: most of the four, not every draw of dropout gets all four
    assert right(out) >= 3
    # the same model before pre-training does not count: the answers above were learned
    untrained = tmp_path / "untrained"
    torch.manual_seed(0)
    BertForPreTraining(BertConfig.from_size("tiny", vocab_size=tok.vocab_size)).save_pretrained(
        untrained
    )
    tok.save_pretrained(untrained)
    assert right(untrained) <= 1


def test_task_pipelines_refuse_a_checkpoint_without_the_head(minilm_dir: Path) -> None:
    pipe = Pipeline(minilm_dir)
    with pytest.raises(CheckpointError, match="no trained masked-LM head"):
        pipe.fill_mask(["a [MASK]"])
    with pytest.raises(CheckpointError, match="no trained classifier"):
        pipe.classify(["a"])
    with pytest.raises(CheckpointError, match="no trained question-answering head"):
        pipe.qa(["q"], ["c"])


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Path]:
    """Tiny classification / tagging / QA checkpoints (random heads, saved by us)."""
    from bertforge.heads import BertForQuestionAnswering

    tok = Tokenizer.from_pretrained(tiny_model)
    out = {}
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size})
    for name, cls, kwargs in (
        ("cls", BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}}),
        (
            "ner",
            BertForTokenClassification,
            {"id2label": dict(enumerate(["O", "B-PER", "I-PER", "B-LOC"]))},
        ),
        ("qa", BertForQuestionAnswering, {}),
    ):
        torch.manual_seed(1)
        d = tmp_path_factory.mktemp(name)
        cls(config.replace(**kwargs)).save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = d
    return out


def test_classify_and_ner_match_transformers(heads_dir: dict[str, Path]) -> None:
    transformers = pytest.importorskip("transformers")
    tok = Tokenizer.from_pretrained(heads_dir["cls"])
    texts = ["a fine film", "Alice Smithson visited Paris in June with Bob."]
    got = Pipeline(heads_dir["cls"], precision="fp32").classify(texts)
    hf = transformers.BertForSequenceClassification.from_pretrained(heads_dir["cls"]).eval()
    with torch.no_grad():
        ref = hf(**tok(texts)).logits.softmax(-1).numpy()
    for g, r in zip(got, ref):
        assert g["label"] == ["neg", "pos"][int(r.argmax())]
        assert np.allclose([g["scores"]["neg"], g["scores"]["pos"]], r, atol=1e-5)
    ents = Pipeline(heads_dir["ner"], precision="fp32").ner(texts)
    hf = transformers.BertForTokenClassification.from_pretrained(heads_dir["ner"]).eval()
    names = ["O", "B-PER", "I-PER", "B-LOC"]
    for text, got_entities in zip(texts, ents):
        enc = tok.encode(text)
        with torch.no_grad():
            tags = hf(**tok([text])).logits[0].argmax(-1).tolist()
        word_tags, starts, seen = [], [], set()
        for j, w in enumerate(enc.word_ids):
            if w is not None and w not in seen:
                seen.add(w)
                word_tags.append(names[tags[j]])
                starts.append(enc.offsets[j][0])
        expected = [(kind, starts[a]) for kind, a, _ in entity_spans(word_tags)]
        assert [(e["entity"], e["start"]) for e in got_entities] == expected
        for e in got_entities:
            assert text[e["start"] : e["end"]] == e["text"] and e["text"].strip() == e["text"]


def test_batches_are_length_sorted_capped_and_cut_before_mostly_padding(minilm_dir: Path) -> None:
    pipe = Pipeline(minilm_dir, batch_size=8, precision="fp32")
    lengths = [30] * 11 + [300] + [12, 5]
    batches = [list(map(int, b)) for b in length_batches(lengths, 8)]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 8 for b in batches)
    assert batches[-1] == [11]  # the long text alone: the short ones are not padded to 300
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths)
    # embeddings do not depend on which texts share a batch
    texts = ["a short one.", "another short sentence here.", " ".join(["long"] * 200)]
    together = pipe.embed(texts)
    alone = np.stack([pipe.embed([t])[0] for t in texts])
    assert np.abs(together - alone).max() < 1e-4


def test_a_token_budget_cuts_batches_by_their_padded_size() -> None:
    """max_tokens: short rows make large batches and long ones small, a batch padded to its
    longest row never over the budget (one longer row alone); the defaults by device."""
    from bertforge.runner import BATCH_DEFAULTS, Runner

    rng = np.random.default_rng(0)
    lengths = [*rng.integers(3, 40, 300).tolist(), 500, 90, 91, 95]
    batches = [[int(i) for i in b] for b in length_batches(lengths, 64, max_tokens=1000)]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) <= 64 and (len(b) * longest <= 1000 or len(b) == 1)
    assert [len(b) for b in batches if max(lengths[i] for i in b) >= 90] == [3, 1]
    assert [len(b) for b in length_batches([100] * 25, 64, max_tokens=1000)] == [10, 10, 5]
    # the budget holds once collate rounds the width up (bf16: to 16): 129 pieces are 144
    rounded = length_batches([129] * 600, 1024, max_tokens=65_536, multiple=16)
    assert [len(b) for b in rounded] == [455, 145]
    assert max(len(b) for b in batches) == 64  # short rows: the row cap binds
    assert [list(b) for b in length_batches(lengths, 64)] == [
        list(b) for b in length_batches(lengths, 64, max_tokens=None)
    ]
    cpu = Runner.create("cpu", "fp32", None)
    assert (cpu.batch_size, cpu.max_tokens) == BATCH_DEFAULTS["cpu"] == (32, None)
    assert Runner.create("cpu", "fp32", 8, 100).max_tokens == 100
    with pytest.raises(ConfigError, match="max_tokens=0"):
        Runner.create("cpu", "fp32", 8, 0)


# (tags of the words "w0 w1 ...", the entities as (type, first word, last word + 1))
NER_TABLE = [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),  # IOB2
    (["I-PER", "I-PER", "O", "I-LOC", "I-LOC"], [("PER", 0, 2), ("LOC", 3, 5)]),  # IOB1
    (["I-PER", "B-PER", "O"], [("PER", 0, 1), ("PER", 1, 2)]),  # IOB1: B- splits one type
    (
        ["B-PER", "E-PER", "S-LOC", "B-ORG", "I-ORG", "E-ORG"],
        [("PER", 0, 2), ("LOC", 2, 3), ("ORG", 3, 6)],
    ),  # IOBES
    (["B-PER", "E-PER"], [("PER", 0, 2)]),  # B-X E-X: one entity (the pipeline once said two)
    (["O", "I-MISC", "O"], [("MISC", 1, 2)]),  # a stray I- starts an entity
    (["B-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)]),  # a type change ends one
    (["B-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 3)]),  # adjacent, one type
    (["S-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
    (["E-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 2)]),  # after E- a new chunk
]


@pytest.mark.parametrize(("tags", "spans"), NER_TABLE)
def test_ner_pipeline_and_entity_metric_decode_tags_alike(tags: list[str], spans: list) -> None:
    text = " ".join(f"w{i}" for i in range(len(tags)))
    words = [(text.index(f"w{i}"), text.index(f"w{i}") + len(f"w{i}")) for i in range(len(tags))]
    got = entities(text, tags, [0.5] * len(tags), words)  # what Pipeline.ner returns
    assert [(e["entity"], e["text"]) for e in got] == [
        (kind, " ".join(f"w{i}" for i in range(a, b))) for kind, a, b in spans
    ]
    # the metric counts the same entities: as predictions against IOB2 tags of the expected
    # spans, every one is found and nothing else
    gold = ["O"] * len(tags)
    for kind, a, b in spans:
        gold[a:b] = [f"B-{kind}"] + [f"I-{kind}"] * (b - a - 1)
    scores = entity_scores([gold], [tags])
    assert (scores["n_gold"], scores["n_pred"], scores["f1"]) == (len(spans), len(spans), 1.0)


def test_ner_on_a_tagger_of_other_labels_names_its_config_and_id2label(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token classifier whose labels are not entity tags (a part-of-speech tagger, HF's
    unnamed LABEL_i) failed in the decoder on its first tag, naming no file: refused before any
    work, naming the model's config.json, its id2label and what ner needs."""
    tok = Tokenizer.from_pretrained(tiny_model)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size})
    for name, labels in (("pos", ["O", "NOUN", "VERB"]), ("unnamed", None)):
        d = tmp_path / name
        given = {"num_labels": 2} if labels is None else {"id2label": dict(enumerate(labels))}
        BertForTokenClassification(config.replace(**given)).save_pretrained(d)
        tok.save_pretrained(d)
        with pytest.raises(CheckpointError) as e:
            Pipeline(d, precision="fp32").ner(["Alice lives in Paris."])
        said = str(e.value)
        assert said.startswith(f"{d / 'config.json'}: id2label ")
        wrong = "'NOUN'" if labels else "'LABEL_0'"
        assert wrong in said and "O or B-/I-/E-/S- followed by a type" in said
    texts = tmp_path / "in.txt"
    texts.write_text("Alice lives in Paris.\n")
    assert main(["ner", str(tmp_path / "pos"), str(texts)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertforge: error: {tmp_path / 'pos' / 'config.json'}: id2label")


def test_qa_spans_and_long_contexts(heads_dir: dict[str, Path]) -> None:
    pipe = Pipeline(heads_dir["qa"], precision="fp32")
    long = " ".join(f"sentence {i} says the value is {i * 7}." for i in range(120))
    contexts = ["The cat sat on the red mat.", long]
    assert len(Tokenizer.from_pretrained(heads_dir["qa"]).encode(long, truncation=False)) > 384
    got = pipe.qa(["Where did the cat sit?", "What is the value?"], contexts)
    for g, c in zip(got, contexts):
        assert g["answer"] and c[g["start"] : g["end"]] == g["answer"]
        assert 0.0 < g["score"] <= 1.0
    with pytest.raises(InputError, match="2 questions but 1 contexts"):
        pipe.qa(["a", "b"], ["c"])


def test_cli_pipelines(
    tmp_path: Path, minilm_dir: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a man plays guitar\n\nthe fox jumps\n")
    assert (
        main(
            [
                *("embed", str(minilm_dir), str(texts), "--out", str(tmp_path / "e.npy")),
                *("--normalize", "--skip-blank"),  # its line 2 is blank
            ]
        )
        == 0
    )
    e = np.load(tmp_path / "e.npy")
    assert e.shape == (2, 384) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    assert (
        main(
            [
                "features",
                str(minilm_dir),
                str(texts),
                "--layers",
                "-1,-2",
                "--out",
                str(tmp_path / "f.jsonl"),
                "--skip-blank",
            ]
        )
        == 0
    )
    first = json.loads((tmp_path / "f.jsonl").read_text().splitlines()[0])
    assert first["linex_index"] == 0 and first["features"][0]["token"] == "[CLS]"
    assert [x["index"] for x in first["features"][0]["layers"]] == [-1, -2]
    features = ["features", str(minilm_dir), str(texts), "--out", str(tmp_path / "f.npz")]
    assert main([*features, "--skip-blank"]) == 0
    z = np.load(tmp_path / "f.npz")
    assert z["values_1"].shape == (len(z["tokens_1"]), 384)
    capsys.readouterr()
    masks = tmp_path / "m.txt"
    masks.write_text("the [MASK] sat\n")
    assert main(["fill-mask", str(tiny_model), str(masks), "--top-k", "2"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["text"] == "the [MASK] sat" and len(line["masks"][0]) == 2
    bad = tmp_path / "bad.txt"
    bad.write_text("only one field\n")
    assert main(["nsp", str(tiny_model), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: line 1: 1 tab-separated fields, expected 2" in err


def test_int8_embeddings_stay_close_to_fp32(minilm_dir: Path) -> None:
    fp32 = Pipeline(minilm_dir, precision="fp32").embed(SENTENCES[:6], normalize=True)
    int8 = Pipeline(minilm_dir, quantize="int8").embed(SENTENCES[:6], normalize=True)
    cos = (fp32 * int8).sum(-1)
    assert cos.min() > 0.95 and not np.allclose(fp32, int8, atol=1e-4)  # quantised, and close
    with pytest.raises(ConfigError, match="quantize"):
        Pipeline(minilm_dir, quantize="int4")


# ------------------------------------------------------------------------------------------------
# The task pipelines on models fine-tuned by bertforge (MiniLM, small synthetic tasks it learns)

PEOPLE = ["Alice", "Bob", "Carol", "Dmitri", "Esther", "Farouk", "Gwendolyn", "Hiroshi"]
PLACES = ["Paris", "Lagos", "Osaka", "Lima", "Quebec", "Tbilisi", "Adelaide", "Bergen"]
JOBS = ["baker", "pilot", "nurse", "lawyer", "farmer", "painter", "teacher", "chemist"]


@pytest.mark.slow
def test_qa_pipeline_on_a_model_fine_tuned_by_bertforge(tmp_path: Path, minilm_dir: Path) -> None:
    from bertforge.train.finetune import FinetuneConfig, run

    rng = np.random.default_rng(0)
    paragraphs = []
    for i in range(120):
        who, where, job = (str(rng.choice(x)) for x in (PEOPLE, PLACES, JOBS))
        context = f"{who} lives in {where} and works as a {job}."
        question, answer = (
            (f"Where does {who} live?", where) if i % 2 else (f"What does {who} work as?", job)
        )
        paragraphs.append(
            {
                "context": context,
                "qas": [
                    {
                        "id": str(i),
                        "question": question,
                        "answers": [{"text": answer, "answer_start": context.index(answer)}],
                    }
                ],
            }
        )
    data = tmp_path / "train.json"
    data.write_text(
        json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    out = tmp_path / "qa"
    best = run(
        FinetuneConfig(
            model=str(minilm_dir),
            task="squad",
            train=str(data),
            dev=str(data),
            out=str(out),
            epochs=5,
            batch_size=16,
            lr=2e-4,
            max_seq_length=64,
            progress=False,
        )
    )
    assert best["exact_match"] >= 90
    # new people, places and jobs in new sentences; the answer's characters in the context
    contexts = [
        "Ingrid lives in Nairobi and works as a dentist.",
        "Last spring Ingrid moved; she lives in Nairobi and works as a dentist.",
    ]
    got = Pipeline(out, precision="fp32").qa(
        ["Where does Ingrid live?", "What does Ingrid work as?"], contexts
    )
    assert [g["answer"] for g in got] == ["Nairobi", "dentist"]
    for g, c in zip(got, contexts):
        assert c[g["start"] : g["end"]] == g["answer"] and 0.5 < g["score"] <= 1.0


@pytest.mark.slow
def test_classify_pipeline_on_a_model_fine_tuned_by_bertforge(
    tmp_path: Path, minilm_dir: Path
) -> None:
    from bertforge.train.finetune import FinetuneConfig, run

    rng = np.random.default_rng(0)
    good = ["loved", "enjoyed", "adored", "admired"]
    bad = ["hated", "loathed", "detested", "despised"]
    rows = ["text\tlabel"]
    for i in range(160):
        label = "pos" if i % 2 else "neg"
        verb = str(rng.choice(good if label == "pos" else bad))
        rows.append(
            f"{rng.choice(PEOPLE)} {verb} the {rng.choice(JOBS)} from "
            f"{rng.choice(PLACES)}.\t{label}"
        )
    table = tmp_path / "train.tsv"
    table.write_text("\n".join(rows) + "\n")
    out = tmp_path / "cls"
    best = run(
        FinetuneConfig(
            model=str(minilm_dir),
            task="csv",
            train=str(table),
            dev=str(table),
            out=str(out),
            epochs=3,
            batch_size=16,
            lr=2e-4,
            max_seq_length=32,
            progress=False,
        )
    )
    assert best["accuracy"] >= 0.95
    got = Pipeline(out, precision="fp32").classify(
        ["Ingrid adored the dentist from Nairobi.", "Ingrid despised the dentist from Nairobi."]
    )
    assert [g["label"] for g in got] == ["pos", "neg"]
    for g in got:
        assert set(g["scores"]) == {"neg", "pos"} and g["score"] == max(g["scores"].values()) > 0.5


def test_output_rows_answer_input_lines(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Output rows match input lines one to one: a blank line is an error naming it, or with
    --skip-blank every JSONL row says its line; a JSONL input's id comes back; a tab in a
    single-text input is an error unless --keep-tabs; stdin is checked for UTF-8; files are
    written with the umask's mode."""
    import os
    import sys

    texts = tmp_path / "texts.txt"
    texts.write_text("first line\n\nthird line\n")
    assert main(["embed", str(minilm_dir), str(texts)]) == 2
    assert "texts.txt: line 2: blank line" in capsys.readouterr().err
    old = os.umask(0o022)
    try:
        out = tmp_path / "rows.jsonl"
        assert main(["embed", str(minilm_dir), str(texts), "--skip-blank", "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    want = Pipeline(minilm_dir).embed(["first line", "third line"])
    assert [r["line"] for r in rows] == [1, 3]
    assert np.allclose([r["embedding"] for r in rows], want, atol=1e-5)
    capsys.readouterr()
    given = tmp_path / "given.jsonl"
    given.write_text('{"id": "a7", "text": "hello"}\n{"text": "world"}\n[1, 2]\n')
    assert main(["embed", str(minilm_dir), str(given)]) == 2
    assert "given.jsonl: line 3: expected a JSON object" in capsys.readouterr().err
    given.write_text('{"id": "a7", "text": "hello"}\n{"text": "world"}\n')
    assert main(["embed", str(minilm_dir), str(given)]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["line"], r.get("id")) for r in rows] == [(1, "a7"), (2, None)]
    tabbed = tmp_path / "tabbed.txt"
    tabbed.write_text("a text\tits label\n")
    assert main(["embed", str(minilm_dir), str(tabbed)]) == 2
    assert "--keep-tabs" in capsys.readouterr().err
    assert main(["embed", str(minilm_dir), str(tabbed), "--keep-tabs"]) == 0
    capsys.readouterr()

    class Stdin:
        buffer = __import__("io").BytesIO(b"caf\xe9\n")

    real, sys.stdin = sys.stdin, Stdin()  # type: ignore[assignment]
    try:
        assert main(["embed", str(minilm_dir), "-"]) == 2
    finally:
        sys.stdin = real
    assert "<stdin>: line 1: byte 3" in capsys.readouterr().err


def test_low_precision_batches_are_padded_to_a_multiple(minilm_dir: Path) -> None:
    """bf16 batches are padded to PAD_MULTIPLE pieces (a few shapes: the CPU's bf16 kernels
    are kept per shape), fp32 ones to their longest row; the padding changes no vector."""
    from bertforge.runner import PAD_MULTIPLE
    from bertforge.tasks.base import Features, collate

    features = Features([np.arange(1, 6), np.arange(1, 10)], [np.zeros(5), np.zeros(9)], [])
    features.labels = [np.arange(5), np.arange(9)]  # token labels: padding ignored
    batch = collate(features, [0, 1], 0, 16)
    assert batch.input_ids.shape == (2, 16) and batch.attention_mask.sum() == 14
    assert (batch.input_ids[0, 5:] == 0).all() and (batch.labels[1, 9:] == -100).all()
    texts = ["a short one", "a somewhat longer sentence than the first one, with commas, too, and"]
    out = {}
    for precision in ("fp32", "bf16"):
        pipe = Pipeline(minilm_dir, precision=precision)
        shapes: list[int] = []
        model = pipe.model_for("embed")
        hook = model.register_forward_pre_hook(
            lambda m, a, shapes=shapes: shapes.append(a[0].shape[-1])
        )
        out[precision] = pipe.embed(texts)
        hook.remove()
        longest = max(len(pipe.tok.encode(t).ids) for t in texts)
        assert longest % PAD_MULTIPLE
        if precision == "fp32":
            assert shapes == [longest]
        else:
            assert shapes == [-(-longest // PAD_MULTIPLE) * PAD_MULTIPLE] and shapes[0] > longest
    cos = (out["fp32"] * out["bf16"]).sum(-1)
    assert cos.min() > 0.999


def test_every_pipeline_answers_the_same_when_the_host_works_ahead(
    heads_dir: dict[str, Path], tiny_model: Path, tmp_path: Path
) -> None:
    """Runner.overlap (a GPU's default, run here on the CPU): batches checked and packed on the
    host, results read after the next batch is queued; every pipeline's answers are the ones
    it gives without, on texts of mixed lengths (a long one in windows)."""
    torch.manual_seed(2)
    config = BertConfig.from_pretrained(heads_dir["cls"]).replace(num_labels=1)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "cross")
    Tokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "cross")
    long = " ".join(f"line {i} tells of Paris and Alice." for i in range(90))
    texts = ["a fine film", "Alice Smithson visited Paris in June with Bob.", long, "x"]
    masked = ["the [MASK] sat on the mat.", "paris is the [MASK] of france, said alice."]
    calls = {
        heads_dir["cls"]: lambda p: p.classify(texts),
        heads_dir["ner"]: lambda p: p.ner(texts),
        heads_dir["qa"]: lambda p: p.qa(["Who visited?", "Where?"], texts[1:3]),
        tiny_model: lambda p: (
            p.fill_mask(masked),
            p.nsp(texts[:2], texts[2:]),
            [f["layers"][-1].tolist() for f in p.features(texts)],
        ),
        tmp_path / "cross": lambda p: p.score(["paris?"] * 4, texts),
    }
    for path, call in calls.items():
        pipe = Pipeline(path, precision="fp32", batch_size=2, max_length=64)
        want = json.dumps(call(pipe), sort_keys=True, default=str)
        pipe.runner.overlap = True
        got = json.dumps(call(pipe), sort_keys=True, default=str)
        assert got == want, path.name


def test_results_read_later_land_in_their_rows_after_the_next_batch_is_given() -> None:
    """Runner.later: with overlap, a batch's results are read only once the next batch has been
    given to fn (a GPU's copy back runs behind that work), and every row still gets its own."""
    from bertforge.runner import Runner

    events: list[str] = []
    runner = Runner(torch.device("cpu"), "fp32", batch_size=2, overlap=True)

    def fn(rows: np.ndarray) -> object:
        events.append(f"run {rows.tolist()}")

        def finish(values: np.ndarray) -> list[float]:
            events.append(f"read {rows.tolist()}")
            return values.tolist()

        return runner.later(torch.from_numpy(rows * 10.0), finish)

    lengths = [5, 1, 3, 2, 4]
    assert runner(lengths, lambda rows: rows, fn) == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert events == [
        "run [1, 3]", "run [2, 4]", "read [1, 3]", "run [0]", "read [2, 4]", "read [0]"
    ]  # fmt: skip
    runner.overlap = False
    events.clear()
    assert runner(lengths, lambda rows: rows, fn) == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert events[:2] == ["run [1, 3]", "read [1, 3]"]


def test_a_bar_in_the_callers_units_moves_with_the_rows_and_ends_on_them() -> None:
    """Runner.showing(bar, units): a caller's documents (or lines) whose rows are sentences or
    windows it cannot count ahead: each batch moves the bar by its share of the units, a
    second call has nothing left to add (the bar never passes the units), a part that ran no
    rows still counts, and an outer bar goes on through showing(None)."""
    from bertforge.runner import Runner

    class Bar:
        n = 0
        closed = False

        def update(self, k: int) -> None:
            self.n += k
            seen.append(self.n)

        def close(self) -> None:
            self.closed = True

    seen: list[int] = []
    runner = Runner(torch.device("cpu"), "fp32", batch_size=2)
    one = [1] * 8  # four batches of two rows

    def run() -> None:
        runner(one, lambda rows: rows, lambda rows: [0] * len(rows))

    bar = Bar()
    with runner.showing(bar):
        with runner.showing(None, units=10):
            run()
            assert seen[-4:] == [2, 5, 7, 10]
            run()
            assert bar.n == 10
        with runner.showing(None, units=3):  # no rows run: empty documents
            pass
        assert bar.n == 13 and not bar.closed
        with runner.showing(None):
            run()  # no units: a row each
        assert bar.n == 21
    assert bar.closed and runner.progress is None and runner.progress_end is None


def test_an_id_past_the_vocabulary_is_one_clear_error_when_the_host_checks(
    minilm_dir: Path,
) -> None:
    """With overlap (a GPU's default) a batch's ids are checked on the host as it is made, not
    read back on the device: an id past the model's vocabulary (rows made by hand; loading
    already refuses a vocab.txt larger than the model's) is still one InputError naming it."""
    from bertforge.tasks.base import Features

    pipe = Pipeline(minilm_dir, precision="fp32")
    pipe.runner.overlap = True
    model = pipe.model_for("embed")
    bad = np.array([101, pipe.config.vocab_size, 102])
    rows = Features([bad], [np.zeros(3, np.int64)], np.zeros(1, np.int64))
    with pytest.raises(InputError, match="outside the vocabulary"):
        pipe.run(rows, lambda b: model(*b["inputs"], rows=b["packing"]).last_hidden_state)


def test_batches_made_ahead_give_the_same_batches_and_embeddings(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's prefetching (the next batch collated by a worker thread while this one runs):
    the same batches in the same order, and the same embeddings, a long text's windows too."""
    from bertforge.runner import prepared

    lengths = [5, 40, 3, 17, 17, 2, 90, 8]
    made = list(prepared(length_batches(lengths, 3), lambda rows: rows.sum(), ahead=True))
    plain = list(prepared(length_batches(lengths, 3), lambda rows: rows.sum(), ahead=False))
    assert [(list(r), b) for r, b in made] == [(list(r), b) for r, b in plain] and len(made) > 2
    texts = ["a short one.", "another short sentence here.", " ".join(["long"] * 600), "x"]
    texts += [f"sentence number {i} of a few more." * (i % 4 + 1) for i in range(9)]
    texts += [" ".join(["longer"] * 700)]
    pipe = Pipeline(minilm_dir, batch_size=2, precision="fp32")
    expected = pipe.embed(texts)
    pipe.runner.overlap = True
    assert np.array_equal(pipe.embed(texts), expected)
    # read in parts of 3 texts (sorted by characters), the next tokenised while this one runs
    monkeypatch.setattr(pipelines, "PART", 3)
    assert len(pipe._parts(texts)) == 5
    assert np.allclose(pipe.embed(texts), expected, atol=1e-6)
    truncating = Pipeline(minilm_dir, batch_size=2, precision="fp32", truncate=True)
    truncating.runner.overlap = True
    with pytest.warns(UserWarning, match="^2 of 14 texts are longer") as said:
        truncating.embed(texts)
    assert len(said) == 1  # said once, not once per part
    assert np.allclose(pipe.embed([range(2023, 2026)]), pipe.embed([[2023, 2024, 2025]]))
    bad_inputs = (("a string", "list of texts"), ([1.5], "input 0"), (["a", None], "input 1"))
    for bad, why in (*bad_inputs, ([{"x": 1}], "input 0"), ([b"bytes"], "input 0")):
        with pytest.raises(InputError, match=why):  # read in parts or not
            pipe.embed(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# Rows no longer than the model reads, options that are used or refused, outputs that keep inputs


@pytest.fixture(scope="module")
def short_model(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A tiny BERT of 40 positions (its MLM/NSP heads) saved with a tokenizer that says
    model_max_length 512, as a model pre-trained at 128 pieces is; and a QA head of its size."""
    from bertforge.heads import BertForQuestionAnswering
    from tests.conftest import save_tiny

    out = save_tiny(tmp_path_factory.mktemp("short"), minilm_dir, max_position_embeddings=40)
    torch.manual_seed(1)
    BertForQuestionAnswering(BertConfig.from_pretrained(out)).save_pretrained(out / "qa")
    Tokenizer.from_pretrained(out).save_pretrained(out / "qa")
    return out


def test_rows_read_whole_are_cut_to_the_models_positions(short_model: Path) -> None:
    """nsp and fill-mask rows (Pipeline.encode) and qa's default windows stop at the model's
    positions, not the tokenizer's model_max_length: the answers of max_length 40; a [MASK] the
    cut leaves out is said to be cut off, not missing."""
    pipe = Pipeline(short_model, precision="fp32")
    assert pipe.tok.model_max_length == 512
    at40 = Pipeline(short_model, precision="fp32", max_length=40)
    long = " ".join(["word"] * 60)  # 60 pieces
    assert np.allclose(pipe.nsp([long, "a"], ["b", long]), at40.nsp([long, "a"], ["b", long]))
    masked = ["the [MASK] sat on " + long]
    assert pipe.fill_mask(masked) == at40.fill_mask(masked)
    with pytest.raises(InputError) as e:
        pipe.fill_mask(["a [MASK].", long + " [MASK]"])
    assert str(e.value).startswith("text 1: its [MASK] is piece 61 of 63, cut off by the length")
    assert "limit of 40 pieces" in str(e.value)
    qa = Pipeline(short_model / "qa", precision="fp32")
    (answer,) = qa.qa(["which word?"], [long])
    assert answer["answer"] and long[answer["start"] : answer["end"]] == answer["answer"]
    with pytest.raises(
        ConfigError, match=r"max_seq_length=64 .* 40 positions \(max_position_embeddings=40\)"
    ):
        qa.qa(["which word?"], [long], max_seq_length=64)


def test_masks_past_the_length_limit_are_an_error_naming_the_text_and_how_many(
    short_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A text whose first [MASK] is read but whose later ones fall past the limit was answered
    for the first one only, without a word: now one error naming the text and the masks cut."""
    pipe = Pipeline(short_model, precision="fp32")
    long = " ".join(["word"] * 60)
    text = f"the [MASK] sat {long} [MASK] and [MASK]"  # [MASK]s at pieces 2, 64 and 66 of 68
    with pytest.raises(InputError) as e:
        pipe.fill_mask(["a [MASK].", text])
    said = str(e.value)
    assert said.startswith("text 1: 2 of its 3 [MASK] tokens are past the length limit of 40")
    assert "(pieces 64, 66 of 68" in said and repr(text[:40]) in said
    short = "the [MASK] sat " + " ".join(["word"] * 30) + " [MASK]"  # 36 pieces: all read
    assert [len(masks) for masks in pipe.fill_mask([short])] == [2]
    lines = tmp_path / "in.txt"
    lines.write_text(f"a [MASK].\n{text}\n")
    assert main(["fill-mask", str(short_model), str(lines)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertforge: error: ") and "2 of its 3 [MASK] tokens" in err


def test_bf16_padding_stops_at_the_models_positions(short_model: Path) -> None:
    """bf16 rounds a batch's length up to a multiple of 16, but not past the position table:
    a 37-piece row of a 40-position model is padded to 40, not 48."""
    from bertforge.tasks.base import Features, collate

    features = Features([np.arange(1, 38), np.arange(1, 30)], [np.zeros(37), np.zeros(29)], [])
    features.labels = np.zeros(2, np.int64)
    assert collate(features, [0], 0, 16, positions=40).input_ids.shape == (1, 40)
    assert collate(features, [1], 0, 16, positions=40).input_ids.shape == (1, 32)
    text = " ".join(["word"] * 35)  # 37 pieces
    fp32, bf16 = (Pipeline(short_model, precision=p).embed([text])[0] for p in ("fp32", "bf16"))
    assert fp32 @ bf16 / np.linalg.norm(fp32) / np.linalg.norm(bf16) > 0.99
    is_next = Pipeline(short_model, precision="fp32").nsp([text], [text])
    assert np.allclose(
        Pipeline(short_model, precision="bf16").nsp([text], [text]), is_next, atol=0.05
    )


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, heads_dir: dict[str, Path]) -> Path:
    """A random one-label BertForSequenceClassification: a cross-encoder."""
    torch.manual_seed(2)
    out = tmp_path_factory.mktemp("cross")
    config = BertConfig.from_pretrained(heads_dir["cls"]).replace(num_labels=1)
    BertForSequenceClassification(config).save_pretrained(out)
    Tokenizer.from_pretrained(heads_dir["cls"]).save_pretrained(out)
    return out


def test_score_truncate_overrides_the_pipelines_and_short_rows_are_refused(
    cross_encoder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """score(truncate=False) reads every window of a pipeline built with truncate=True (and
    truncate=True the first only of one built without); a max_length too short for a pair's
    row is one ConfigError naming it, a CLI error with status 2."""
    long = " ".join(f"line {i} tells of Paris." for i in range(40))
    truncating = Pipeline(cross_encoder, precision="fp32", max_length=64, truncate=True)
    whole = Pipeline(cross_encoder, precision="fp32", max_length=64)
    assert len(truncating.pair_rows(["paris?"], [long])[0]) == 1
    assert len(truncating.pair_rows(["paris?"], [long], truncate=False)[0]) > 1
    assert truncating.score(["paris?"], [long], truncate=False) == whole.score(["paris?"], [long])
    assert whole.score(["paris?"], [long], truncate=True) == truncating.score(["paris?"], [long])
    with pytest.raises(ConfigError, match="max_length=4: a .query, document. row needs at least"):
        Pipeline(cross_encoder, max_length=4).score(["q"], ["d"])
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("paris?\tParis is a city.\n")
    assert main(["rerank", str(cross_encoder), str(pairs), "--max-length", "4"]) == 2
    assert "bertforge: error: max_length=4" in capsys.readouterr().err


def test_out_is_never_an_input_and_options_are_used_or_refused(
    tmp_path: Path, heads_dir: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--out naming the input file (or embed's --calibration file) is refused before any work
    (the model is not even read), and the file is left as it was; --quantize int8 with a
    precision other than fp32 is refused; classify reads --stride without --pairs."""
    texts = tmp_path / "in.txt"
    texts.write_text("a [MASK] here\n")
    calibration = tmp_path / "c.npy"
    np.save(calibration, np.eye(4, dtype=np.float32))
    before = calibration.read_bytes()
    missing = str(tmp_path / "no-model")
    assert main(["fill-mask", missing, str(texts), "--out", str(tmp_path / "." / "in.txt")]) == 2
    assert f"--out {tmp_path / '.' / 'in.txt'} is the input file" in capsys.readouterr().err
    int8 = ("--embedding-precision", "int8", "--calibration", str(calibration))
    assert main(["embed", missing, str(texts), *int8, "--out", str(calibration)]) == 2
    assert f"--out {calibration} is the calibration file" in capsys.readouterr().err
    assert texts.read_text() == "a [MASK] here\n" and calibration.read_bytes() == before
    with pytest.raises(ConfigError, match="quantize=int8 with precision=bf16"):
        Pipeline(heads_dir["cls"], quantize="int8", precision="bf16")
    assert Pipeline(heads_dir["cls"], quantize="int8", precision="fp32").precision == "fp32"
    assert main(["classify", str(heads_dir["cls"]), str(texts), "--stride", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("neg", "pos")
