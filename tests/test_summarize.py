"""Extractive summarization: the oracle and ROUGE against rouge-score, Wikipedia leads as
summaries, windows of whole sentences, the trained and unsupervised pipelines, the CLI and
/summarize."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

rouge_score = pytest.importorskip("rouge_score")
from rouge_score import rouge_scorer  # noqa: E402

from bertforge import BertConfig, Tokenizer  # noqa: E402
from bertforge.data.tasks.documents import (  # noqa: E402
    WikiCounts,
    document,
    is_heading,
    read_documents,
)
from bertforge.errors import ConfigError, DataError  # noqa: E402
from bertforge.heads import BertForTokenClassification  # noqa: E402
from bertforge.pipelines import Pipeline  # noqa: E402
from bertforge.tasks import TaskOptions, family  # noqa: E402
from bertforge.tasks import document_scorer as ds  # noqa: E402
from bertforge.tasks.summarize import (  # noqa: E402
    SUMMARY_LABELS,
    featurize,
    oracle,
    owners,
    rouge,
    select,
    sentence_windows,
    summary_length,
)

from .conftest import TINY  # noqa: E402

WORDS = [
    "the",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "a",
    "mat",
    "bird",
    "flew",
    "over",
    "house",
    "river",
    "town",
    "old",
    "new",
    "big",
]


def reference_oracle(sentences: list[str], summary: str, size: int) -> list[int]:
    """BertSum's greedy selection with rouge-score's public API: every candidate scored as
    the chosen sentences' text joined, ROUGE-1 F1 + ROUGE-2 F1."""
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)
    chosen: list[int] = []
    best = 0.0
    for _ in range(min(size, len(sentences))):
        pick = -1
        for i in range(len(sentences)):
            if i in chosen:
                continue
            text = "\n".join(sentences[j] for j in sorted([*chosen, i]))
            s = scorer.score(summary, text)
            value = s["rouge1"].fmeasure + s["rouge2"].fmeasure
            if value > best:
                best, pick = value, i
        if pick < 0:
            break
        chosen = sorted([*chosen, pick])
    return chosen


def test_the_oracle_of_a_hand_worked_example() -> None:
    sentences = ["The cat sat on the mat.", "Dogs bark loudly.", "The cat sat.", "A bird flew."]
    # the first sentence covers most of the summary; "A bird flew." adds its last three
    # words; "The cat sat." would only repeat words (precision falls): the oracle stops at two
    assert oracle(sentences, "The cat sat on the mat and a bird flew.", 3) == [0, 3]
    assert oracle(sentences, "The cat sat on the mat and a bird flew.", 1) == [0]
    assert oracle(sentences, "Nothing in common here.", 3) == []
    assert oracle([], "a summary", 3) == []


def test_the_oracle_equals_greedy_selection_by_rouge_score() -> None:
    # our incremental n-gram counts (boundary bigrams included) choose what rouge-score's own
    # scores of the joined text choose, on random documents with many shared words
    rng = random.Random(0)
    for _ in range(25):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + "."
            for _ in range(rng.randint(2, 12))
        ]
        summary = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))
        size = rng.randint(1, 4)
        assert oracle(sentences, summary, size) == reference_oracle(sentences, summary, size)


def test_rouge_is_rouge_scores_mean_f1() -> None:
    refs = ["The cat sat on the mat.\nIt was happy.", "Running dogs ran far away."]
    preds = ["The cats were sitting on a mat.", "A dog runs away.\nFar, far away."]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
    scores = [scorer.score(r, p) for r, p in zip(refs, preds)]
    got = rouge(refs, preds)
    for ours, theirs in (("rouge1", "rouge1"), ("rouge2", "rouge2"), ("rougeL", "rougeLsum")):
        want = 100 * np.mean([s[theirs].fmeasure for s in scores])
        assert got[ours] == pytest.approx(want, abs=1e-9)
    with pytest.raises(ConfigError, match="2 references but 1"):
        rouge(refs, preds[:1])


def test_selection_blocks_trigrams_and_keeps_document_order() -> None:
    sentences = ["the old town hall", "the old town hall again", "a river", "new house"]
    scores = np.array([1.0, 3.0, 0.5, 2.0])
    assert select(scores, sentences, 2) == [1, 3]  # best first, returned in order
    assert select(scores, sentences, 3) == [1, 2, 3]  # 0 shares "the old town" with 1
    assert select(scores, sentences, 3, block_trigrams=False) == [0, 1, 3]
    assert summary_length(10, 3) == 3 and summary_length(2, 3) == 2
    assert summary_length(10, ratio=0.25) == 2 and summary_length(10, ratio=0.01) == 1
    with pytest.raises(ConfigError, match="ratio"):
        summary_length(10, ratio=1.5)
    with pytest.raises(ConfigError, match="sentences"):
        summary_length(10, 0)


def test_sentence_windows_give_each_sentence_one_score() -> None:
    lengths = [7, 30, 12, 12, 40, 5, 5, 5, 22, 18, 9, 64]
    for overlap in (False, True):
        windows = sentence_windows(lengths, 64, overlap)
        assert windows[0].start == 0 and windows[-1].stop == len(lengths)
        assert all(sum(lengths[i] for i in w) <= 64 for w in windows)
        owned = [i for w, own in zip(windows, owners(windows, lengths)) for i in np.asarray(w)[own]]
        assert sorted(owned) == list(range(len(lengths)))  # each sentence once
    assert len(sentence_windows(lengths, 64, True)) > len(sentence_windows(lengths, 64, False))
    # max context: a sentence in two windows is scored where it is nearer the middle
    windows = [range(0, 3), range(1, 4)]
    flags = owners(windows, [10, 10, 10, 10])
    assert flags[0].tolist() == [True, True, False] and flags[1].tolist() == [False, True, True]


def test_features_put_a_labelled_cls_before_every_sentence(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    doc = document(" ".join(f"Sentence number {i} is here." for i in range(20)))
    assert len(doc.sentences) == 20
    features = featurize([doc], tok, 40, [[3, 17]], training=False)
    assert len(features) > 1  # longer than a row: windows
    scored = []
    for ids, types, labels, meta in zip(
        features.input_ids, features.token_type_ids, features.labels, features.meta
    ):
        assert len(ids) <= 40 and ids[0] == tok.cls_id
        cls = np.flatnonzero(ids == tok.cls_id)
        # interval segments: 0 and 1 in turn, sentence by sentence
        assert [int(types[c]) for c in cls] == [k % 2 for k in range(len(cls))]
        assert set(meta.positions.tolist()) <= set(cls.tolist())
        labelled = np.flatnonzero(labels != -100)
        assert labelled.tolist() == meta.positions.tolist()
        for s, p in zip(meta.sentences.tolist(), meta.positions.tolist()):
            assert labels[p] == int(s in (3, 17))
            scored.append(s)
    assert sorted(scored) == list(range(20))


def write_wiki(path: Path) -> None:
    body = " ".join(f"Body sentence {i} tells more about the river." for i in range(12))
    articles = [
        ("River", "The River is long. It flows to the sea.", f"History.\n{body}\nSee also."),
        ("Short", "Short has a lead. Of two sentences.", "History.\nOnly one sentence."),
        ("One", "One lead sentence only.", f"History.\n{body}"),
    ]
    text = "".join(
        f'<doc id="{i}" url="u" title="{t}">\n{t}\n\n{lead}\n{rest}\n</doc>\n'
        for i, (t, lead, rest) in enumerate(articles)
    )
    path.write_text(text, encoding="utf-8")


def test_wikipedia_leads_are_the_summaries_of_their_bodies(tmp_path: Path) -> None:
    write_wiki(tmp_path / "wiki_00")
    counts = WikiCounts()
    docs = read_documents(tmp_path, True, counts)
    assert (counts.articles, counts.kept, counts.short_body, counts.one_sentence_lead) == (
        3,
        1,
        1,
        1,
    )
    (doc,) = docs
    assert doc.summary == "The River is long.\nIt flows to the sea."
    assert len(doc.sentences) == 12 and "History." not in doc.text and "See also." not in doc.text
    for s, (a, b) in zip(doc.sentences, doc.spans):
        assert doc.text[a:b] == s
    assert is_heading("Early life and career.") and not is_heading("He was born in 1900 in Rome.")


def test_the_verb_reads_wikiextractor_files_as_finetuning_does(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`bertforge summarize` given WikiExtractor output (a file, or a directory of them) reads
    it as finetune --task summarize does (read_documents): an article's body is a document
    (its lead, the reference, left out; short articles left out and counted on stderr), its
    row naming the article's <doc> line and file:title. It read each line as a document,
    <doc> markup and all."""
    from bertforge.cli import main

    (tmp_path / "wiki").mkdir()
    write_wiki(tmp_path / "wiki" / "wiki_00")
    (doc,) = read_documents(tmp_path / "wiki", labelled=False)
    want = Pipeline(minilm_dir).summarize([doc.text], sentences=2)
    for given in (tmp_path / "wiki" / "wiki_00", tmp_path / "wiki"):
        assert main(["summarize", str(minilm_dir), str(given), "--sentences", "2"]) == 0
        got = capsys.readouterr()
        (row,) = [json.loads(x) for x in got.out.splitlines()]
        lines = (tmp_path / "wiki" / "wiki_00").read_text().splitlines()
        assert lines[row["line"] - 1].startswith("<doc ") and row["id"] == doc.guid
        assert row["summary"] == want[0]["summary"] and "The River is long." not in row["summary"]
        assert "3 Wikipedia articles, 1 kept; left out: 1 with a body under 10" in got.err


def test_documents_spans_and_bad_files(tmp_path: Path) -> None:
    doc = document("First one here. Second one.\n\nA new paragraph, one sentence.")
    assert doc.sentences == ["First one here.", "Second one.", "A new paragraph, one sentence."]
    assert [doc.text[a:b] for a, b in doc.spans] == doc.sentences
    assert document("").sentences == [] and document("  \n ").sentences == []
    bad = tmp_path / "docs.jsonl"
    bad.write_bytes(b'{"text": "fine.", "summary": "ok."}\n{"text": "caf\xe9.", "summary": "x"}\n')
    with pytest.raises(DataError, match=r"docs.jsonl.*line 2"):
        read_documents(bad)
    bad.write_text('{"text": "fine."}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r'line 1: field "summary"'):
        read_documents(bad)
    assert read_documents(bad, labelled=False)[0].summary is None
    (tmp_path / "plain.txt").write_text("just text\n", encoding="utf-8")
    with pytest.raises(DataError, match="expected JSONL"):
        read_documents(tmp_path / "plain.txt")


KEY = "crucially"  # the word that marks each training document's summary sentence


def keyed_documents(rng: random.Random, n: int) -> list[dict[str, str]]:
    rows = []
    for _ in range(n):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8))).capitalize() + "."
            for _ in range(12)
        ]
        k = rng.randrange(12)
        sentences[k] = f"{KEY.capitalize()} {sentences[k].lower()}"
        rows.append({"text": " ".join(sentences), "summary": sentences[k]})
    return rows


@pytest.fixture(scope="module")
def summarizer(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A tiny BERT fine-tuned briefly as a BertSum summarizer of documents whose summary is the sentence
    that starts with KEY (rows of 96 pieces: documents longer than a row)."""
    from bertforge.train.finetune import FinetuneConfig, run

    d = tmp_path_factory.mktemp("summarize")
    rng = random.Random(0)
    for name, n in (("train", 24), ("dev", 6)):
        lines = [json.dumps(r) for r in keyed_documents(rng, n)]
        (d / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="summarize",
            train=str(d / "train.jsonl"),
            dev=str(d / "dev.jsonl"),
            out=str(d / "model"),
            summarizer="bertsum",
            max_seq_length=96,
            summary_sentences=1,
            epochs=1,
            lr=1e-3,
            batch_size=8,
            seed=0,
            progress=False,
        )
    )
    return d / "model"


def test_the_pipeline_summarizes_as_evaluate_predicts(summarizer: Path, tmp_path: Path) -> None:
    from bertforge.train.finetune import evaluate_model

    rows = keyed_documents(random.Random(11), 6)
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    metrics = evaluate_model(str(summarizer), None, str(data), out=str(tmp_path), precision="fp32")
    written = [
        json.loads(line)
        for line in (tmp_path / "predictions_summarize.jsonl").read_text("utf-8").splitlines()
    ]
    # the pipeline reads rows as long as the model was trained on (run.json: 96 pieces) and
    # chooses as many sentences (summary_sentences), so it answers what evaluate predicts
    results = Pipeline(summarizer, precision="fp32").summarize([r["text"] for r in rows], 1)
    assert [[s["index"] for s in r["sentences"]] for r in results] == [
        w["sentences"] for w in written
    ]
    want = rouge([r["summary"] for r in rows], [r["summary"] for r in results])
    assert metrics["rouge2"] == pytest.approx(want["rouge2"], abs=1e-6)
    assert all(r["mode"] == "trained" for r in results)
    r, text = results[0], rows[0]["text"]
    s = r["sentences"][0]
    assert text[s["start"] : s["end"]] == s["text"] == r["summary"]
    config = BertConfig.from_pretrained(summarizer)
    assert tuple(config.labels.values()) == SUMMARY_LABELS


def test_a_long_document_is_scored_sentence_by_sentence(summarizer: Path) -> None:
    rows = keyed_documents(random.Random(3), 4)
    long_text = "\n".join(r["text"] for r in rows)  # about 48 sentences, rows of 96 pieces
    n = len(document(long_text).sentences)
    pipe = Pipeline(summarizer, precision="fp32")
    (whole,) = pipe.summarize([long_text], ratio=1.0, block_trigrams=False)
    assert [s["index"] for s in whole["sentences"]] == list(range(n)) and n > 40
    scores = np.array([s["score"] for s in whole["sentences"]])
    assert np.isfinite(scores).all()
    (best,) = pipe.summarize([long_text], sentences=4, block_trigrams=False)
    assert [s["index"] for s in best["sentences"]] == sorted(np.argsort(-scores, kind="stable")[:4])


def test_empty_and_one_sentence_documents(summarizer: Path, minilm_dir: Path) -> None:
    for model in (summarizer, minilm_dir):
        pipe = Pipeline(model, precision="fp32")
        empty, one = pipe.summarize(["", "Only this sentence."])
        assert empty["summary"] == "" and empty["sentences"] == []
        assert one["summary"] == "Only this sentence." and one["sentences"][0]["start"] == 0
    with pytest.raises(ConfigError, match="mode"):
        pipe.summarize(["x."], mode="magic")
    with pytest.raises(ConfigError, match="not a summarizer"):
        Pipeline(minilm_dir).summarize(["A. B."], mode="trained")


def test_unsupervised_modes_as_bert_extractive_summarizer(minilm_dir: Path) -> None:
    sentences = [
        "Paris is the capital and largest city of France, on the Seine.",
        "Short one.",
        "The city has been a major centre of finance, diplomacy and commerce.",
        "Paris hosts many museums, including the Louvre, the most visited art museum.",
        "The football club Paris Saint-Germain plays at the Parc des Princes stadium.",
        "The Louvre museum received millions of visitors in the last year alone.",
        "Its commerce and finance make the city one of the richest in Europe.",
    ]
    text = " ".join(sentences)
    pipe = Pipeline(minilm_dir, precision="fp32")
    (kmeans,) = pipe.summarize([text], sentences=3)
    chosen = [s["index"] for s in kmeans["sentences"]]
    assert kmeans["mode"] == "kmeans" and chosen[0] == 0 and 1 not in chosen  # first; no short
    assert len(chosen) == 3 and chosen == sorted(chosen)
    (centroid,) = pipe.summarize([text], sentences=2, mode="centroid")
    vectors = pipe.embed(sentences, normalize=True)
    mean = vectors.mean(0) / np.linalg.norm(vectors.mean(0))
    candidates = [i for i, s in enumerate(sentences) if len(s) >= 40]
    want = sorted(sorted(candidates, key=lambda i: -float(vectors[i] @ mean))[:2])
    assert [s["index"] for s in centroid["sentences"]] == want


def test_a_summarizer_head_loads_in_transformers(summarizer: Path) -> None:
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForTokenClassification.from_pretrained(summarizer).eval()
    ours = BertForTokenClassification.from_pretrained(summarizer).eval()
    tok = Tokenizer.from_pretrained(summarizer)
    fam = family(TaskOptions(task="summarize", max_seq_length=96), tok)
    features = fam.featurize([document("A first sentence. And a second one.")])
    ids = torch.from_numpy(features.input_ids[0])[None]
    types = torch.from_numpy(features.token_type_ids[0])[None]
    with torch.no_grad():
        a = ours(ids, types).logits
        b = theirs(input_ids=ids, token_type_ids=types).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_the_cli_summarizes_and_refuses_bad_input(summarizer: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        json.dumps({"text": "One. Two is here.\nThree."}) + "\n" + json.dumps({"text": "x"}) + "\n",
        encoding="utf-8",
    )
    cli = [sys.executable, "-m", "bertforge", "summarize", str(summarizer)]
    done = subprocess.run([*cli, str(docs), "--sentences", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [len(r["sentences"]) for r in rows] == [2, 1] and rows[0]["line"] == 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text.\ncaf\xe9 au lait.\n")
    done = subprocess.run([*cli, str(bad)], capture_output=True, text=True)
    assert done.returncode == 2 and "line 2" in done.stderr, done.stderr
    done = subprocess.run([*cli, str(docs), "--ratio", "2"], capture_output=True, text=True)
    assert done.returncode == 2 and "ratio" in done.stderr


def test_finetune_refuses_a_model_too_short_for_the_default_rows(tmp_path: Path) -> None:
    options = TaskOptions(task="summarize")
    assert options.max_seq_length == 512 and options.summary_sentences == 3
    config = BertConfig(**{**TINY, "max_position_embeddings": 128})
    with pytest.raises(ConfigError, match="max_seq_length=512"):
        options.check_model(config)


# ------------------------------------------------------------------------------------------------
# The document scorer (--summarizer document)


def test_tfidf_and_textrank_equal_their_dense_definitions() -> None:
    """The sparse TF-IDF equals scikit-learn's smooth-idf definition computed densely, and
    TextRank equals networkx's PageRank over the sentences' cosine graph (the damping, the
    dangling sentence's even spread), scaled to mean 1."""
    networkx = pytest.importorskip("networkx")
    sentences = [
        "The cat sat on the mat.",
        "A dog sat on the mat too.",
        "Birds flew over the old river town.",
        "Zebra!",  # shares no word: a dangling sentence
        "The old town had a river and a mat factory.",
        "The cat and the dog ran.",
    ]
    t = ds.tfidf(sentences).toarray()
    words = [re.findall(r"\w+", s.lower()) for s in sentences]
    vocab = sorted({w for ws in words for w in ws})
    counts = np.array([[ws.count(w) for w in vocab] for ws in words], np.float64)
    df = (counts > 0).sum(0)
    dense = counts * (np.log((1 + len(sentences)) / (1 + df)) + 1)
    dense /= np.linalg.norm(dense, axis=1, keepdims=True)
    # the same vectors up to the order of the columns: the same cosines, the same values
    assert np.allclose(t @ t.T, dense @ dense.T)
    assert np.allclose(np.sort(t, 1), np.sort(dense, 1))
    similarity = dense @ dense.T
    np.fill_diagonal(similarity, 0)
    graph = networkx.from_numpy_array(similarity)
    graph.add_nodes_from(range(len(sentences)))
    theirs = networkx.pagerank(graph, alpha=0.85, tol=1e-12, max_iter=1000)
    want = np.array([theirs[i] for i in range(len(sentences))]) * len(sentences)
    got = ds.textrank(ds.tfidf(sentences), iterations=200)
    assert np.allclose(got, want, atol=1e-6)
    assert got[3] < got.min(initial=np.inf, where=np.arange(6) != 3)  # the dangling one least


def test_sentence_features_of_small_and_empty_documents() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 9):
        sentences = [f"Sentence number {i} has words." for i in range(n)]
        f = ds.sentence_features(sentences, ds.unit(rng.normal(size=(n, 8))))
        assert f.shape == (n, len(ds.FEATURES)) and np.isfinite(f).all()
        if n:
            assert f[0, ds.FEATURES.index("first")] == 1 and f[1:, 2].sum() == 0
            assert np.allclose(f[:, 0], np.arange(n) / n)


def test_blocks_score_every_sentence_once() -> None:
    """A document longer than BLOCK sentences is scored in blocks; every sentence gets exactly
    one score, that of its block read alone at its place in the document."""
    torch.manual_seed(0)
    scorer = ds.DocumentScorer(ds.ScorerConfig(dim=4, hidden=8, layers=1, heads=2)).eval()
    rng = np.random.default_rng(1)
    docs = [
        ds.ScoredDocument(
            ds.unit(rng.normal(size=(n, 4))), rng.normal(size=(n, len(ds.FEATURES))).astype("f")
        )
        for n in (ds.BLOCK + 37, 3, 0)
    ]
    long, short, empty = ds.score_documents(scorer, docs, batch_size=2)
    assert long.shape == (ds.BLOCK + 37,) and short.shape == (3,) and empty.shape == (0,)
    rest = docs[0].vectors[ds.BLOCK :], docs[0].features[ds.BLOCK :]
    (tail,) = ds.score_documents(scorer, [ds.ScoredDocument(*rest, start=ds.BLOCK)])
    assert np.allclose(long[ds.BLOCK :], tail, atol=1e-5)


def positional_documents(rng: random.Random, n: int) -> list[dict[str, str]]:
    """Documents of 10-16 random sentences whose summary is their third sentence."""
    rows = []
    for _ in range(n):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8))).capitalize() + "."
            for _ in range(rng.randint(10, 16))
        ]
        rows.append({"text": " ".join(sentences), "summary": sentences[2]})
    return rows


@pytest.fixture(scope="module")
def document_summarizer(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A document scorer over all-MiniLM-L6-v2 trained on documents whose summary is their
    third sentence (the encoder's directory has sentence-transformers modules)."""
    from bertforge.train.finetune import FinetuneConfig, run

    d = tmp_path_factory.mktemp("document-summarizer")
    rng = random.Random(0)
    for name, n in (("train", 48), ("dev", 8)):
        lines = [json.dumps(r) for r in positional_documents(rng, n)]
        (d / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = FinetuneConfig(
        model=str(minilm_dir),
        task="summarize",
        train=str(d / "train.jsonl"),
        dev=str(d / "dev.jsonl"),
        out=str(d / "model"),
        summary_sentences=1,
        epochs=6,
        precision="fp32",
        progress=False,
    )
    assert (config.summarizer, config.lr, config.batch_size) == ("document", 1e-3, 8)
    run(config)
    return d / "model"


def test_the_document_scorer_learns_and_the_pipeline_answers_as_evaluate(
    document_summarizer: Path, tmp_path: Path
) -> None:
    from bertforge.train.finetune import evaluate_model

    rows = positional_documents(random.Random(5), 8)
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    metrics = evaluate_model(
        str(document_summarizer), None, str(data), out=str(tmp_path), precision="fp32"
    )
    written = [
        json.loads(line)
        for line in (tmp_path / "predictions_summarize.jsonl").read_text("utf-8").splitlines()
    ]
    # it has learned the place of the summary: the third sentence, nearly always
    right = sum(w["sentences"] == [2] for w in written)
    assert right >= 6, written
    pipe = Pipeline(document_summarizer, precision="fp32")
    results = pipe.summarize([r["text"] for r in rows], sentences=1)
    assert [[s["index"] for s in r["sentences"]] for r in results] == [
        w["sentences"] for w in written
    ]
    assert all(r["mode"] == "trained" for r in results)
    want = rouge([r["summary"] for r in rows], [r["summary"] for r in results])
    assert metrics["rouge2"] == pytest.approx(want["rouge2"], abs=1e-6)


def test_a_document_summarizer_directory_embeds_as_its_encoder(
    document_summarizer: Path, minilm_dir: Path
) -> None:
    texts = ["A sentence to embed.", "Another, somewhat longer, sentence to embed here."]
    ours = Pipeline(document_summarizer, precision="fp32").embed(texts)
    theirs = Pipeline(minilm_dir, precision="fp32").embed(texts)
    assert np.allclose(ours, theirs, atol=1e-6)


def test_a_broken_document_scorer_is_one_clear_error(
    document_summarizer: Path, tmp_path: Path
) -> None:
    import shutil

    from bertforge.errors import CheckpointError

    broken = tmp_path / "broken"
    shutil.copytree(document_summarizer, broken)
    weights = broken / ds.SCORER_FILE
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    with pytest.raises(CheckpointError, match=ds.SCORER_FILE):
        Pipeline(broken).summarize(["One sentence here. And a second one."])
    config = json.loads((broken / ds.SCORER_CONFIG).read_text())
    (broken / ds.SCORER_CONFIG).write_text(json.dumps({**config, "features": ["position"]}))
    with pytest.raises(CheckpointError, match="features"):
        Pipeline(broken).summarize(["One sentence here. And a second one."])
    (broken / ds.SCORER_CONFIG).write_text(json.dumps({**config, "hidden": "big", "extra": 1}))
    with pytest.raises(CheckpointError, match=ds.SCORER_CONFIG):
        Pipeline(broken).summarize(["One sentence here. And a second one."])


def test_document_batches_resume_where_they_stopped(minilm_dir: Path) -> None:
    """The scorer's steps from a saved position are the steps an uninterrupted run takes from
    there: the same blocks in the same order, epoch after epoch."""
    from bertforge.train import distributed
    from bertforge.train.finetune import FinetuneConfig
    from bertforge.train.summarizer import DocumentTask

    cfg = FinetuneConfig(
        model=str(minilm_dir), task="summarize", train="x", out="y", batch_size=3, seed=7
    )
    task = DocumentTask(family(cfg, Tokenizer.from_pretrained(minilm_dir)), cfg, distributed.Dist())
    rng = np.random.default_rng(0)
    task.blocks = [
        ds.ScoredDocument(rng.normal(size=(k + 1, 4)).astype("f"), np.zeros((k + 1, 11), "f"))
        for k in range(8)  # 3 steps an epoch, the last of 2 blocks
    ]

    def steps(position: object, n: int) -> list[tuple[list[int], object]]:
        out, it = [], task.batches(position)
        for _ in range(n):
            (micro,), after = next(it)
            out.append((micro.mask.sum(1).tolist(), after))
        return out

    whole = steps(None, 8)
    assert [len(s) for s, _ in whole[:3]] == [3, 3, 2] and whole[2][1] == (1, 0)
    assert sorted(n for s, _ in whole[:3] for n in s) == list(range(1, 9))  # each block once
    assert whole[:3] != whole[3:6]  # a new order each epoch
    assert steps(whole[3][1], 4) == whole[4:8]


def test_the_document_summarizer_refuses_options_it_has_no_use_for(
    minilm_dir: Path, tmp_path: Path
) -> None:
    from bertforge.train.finetune import FinetuneConfig, run

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"text": "A. B. C.", "summary": "A."}) + "\n", encoding="utf-8")
    cfg = FinetuneConfig(
        model=str(minilm_dir),
        task="summarize",
        train=str(data),
        out=str(tmp_path / "m"),
        micro_batch_size=2,
    )
    with pytest.raises(ConfigError, match="--micro-batch-size: not for --summarizer document"):
        run(cfg)
    assert not (tmp_path / "m" / ds.SCORER_FILE).exists()


def test_rouge_words_are_rouge_scores_on_english_and_keep_other_scripts() -> None:
    from bertforge.tasks.summarize import RougeWords

    theirs = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)._tokenizer
    ours = RougeWords()
    english = [
        "The cats were running quickly, weren't they? 3,000 runners ran_fast in 2024.",
        "Foo-bar BAZ qux... e.g. U.S.A. isn't (really) here; #hashtags & emails a@b.com",
        "",
    ]
    for text in english:
        assert ours.tokenize(text) == theirs.tokenize(text)
    # rouge-score drops every letter outside [a-z0-9]: no words, ROUGE 0, an empty oracle
    assert theirs.tokenize("Москва — столица России.") == []
    assert ours.tokenize("Москва — столица России. Église") == [
        "москва",
        "столица",
        "россии",
        "église",
    ]
    assert ours.tokenize("東京は日本の首都") == list("東京は日本の首都")
    assert rouge(["Москва — столица России."], ["Москва — столица"])["rouge1"] > 70
    doc = ["Это город.", "Москва — столица России.", "Здесь живут люди."]
    assert oracle(doc, "Москва — столица России.", 1) == [1]


def test_jsonl_summaries_are_read_a_sentence_a_line(tmp_path: Path) -> None:
    """ROUGE-Lsum's LCS is per sentence: a JSONL summary is split as Wikipedia's leads are."""
    path = tmp_path / "docs.jsonl"
    summary = "The cat sat down. The dog ran off."
    row = {"text": "First one here. Second one there.", "summary": summary}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    [example] = read_documents(path)
    assert example.summary == "The cat sat down.\nThe dog ran off."
    # a chosen sentence with both, in the other order: the LCS of each reference sentence
    # finds all its words, one LCS of the whole reference half of them
    prediction = "The dog ran off, and the cat sat down."
    split = rouge([example.summary], [prediction])["rougeL"]
    whole = rouge([summary], [prediction])["rougeL"]
    assert split > 90 and whole < 70


def test_short_documents_are_kept_whole_and_bad_lengths_refused() -> None:
    sentences = ["The cat sat on the mat.", "The cat sat on the mat again."]
    assert select(np.array([1.0, 2.0]), sentences, 3) == [0, 1]  # blocking would drop one
    assert select(np.array([1.0, 2.0]), sentences, 2) == [0, 1]
    assert select(np.array([1.0, 2.0]), sentences, 1) == [1]
    for bad in (2.5, True, "3", 0):
        with pytest.raises(ConfigError, match="sentences"):
            summary_length(5, bad)
    with pytest.raises(ConfigError, match="ratio"):
        summary_length(5, 3, float("nan"))


def test_kmeans_distances_and_its_choices_block_trigrams(monkeypatch: pytest.MonkeyPatch) -> None:
    from bertforge.tasks import summarize

    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(50, 8)), rng.normal(size=(7, 8))
    brute = ((x[:, None, :] - c[None]) ** 2).sum(-1)
    assert np.allclose(summarize.squared_distances(x, c), brute, atol=1e-9)
    # two centres on a sentence written twice: without blocking both copies are chosen
    text = "This sentence is repeated word for word in the document."
    other = "Other words entirely, in a sentence long enough to count."
    sentences = ["The first sentence of the document, always kept.", text, text, other]
    vectors = np.array([[0.0, 5.0], [1.0, 0.0], [1.0, 0.0], [0.0, -3.0]])
    monkeypatch.setattr(summarize, "kmeans", lambda v, k: np.array([[1.0, 0.0], [1.0, 0.0]]))
    assert summarize.unsupervised(vectors, sentences, 3, block_trigrams=False)[0] == [0, 1, 2]
    assert summarize.unsupervised(vectors, sentences, 3, block_trigrams=True)[0] == [0, 1, 3]


def test_a_scorer_config_is_checked_and_positions_start_small(tmp_path: Path) -> None:
    from bertforge.errors import CheckpointError

    scorer = ds.DocumentScorer(ds.ScorerConfig(dim=8))
    assert float(scorer.position.weight.detach().std()) < 0.05  # untrained positions stay near zero
    scorer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / ds.SCORER_CONFIG).read_text())
    assert ds.DocumentScorer.from_pretrained(tmp_path).config == scorer.config
    for bad, word in (
        ({"heads": 3}, "multiple of heads"),
        ({"hidden": "big"}, "hidden"),
        ({"layers": 0}, "layers"),
        ({"dropout": 1.5}, "dropout"),
    ):
        (tmp_path / ds.SCORER_CONFIG).write_text(json.dumps({**config, **bad}))
        with pytest.raises(CheckpointError, match=word):
            ds.DocumentScorer.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="pooling gives 16"):
        ds.check_width(scorer, 16, tmp_path)


def test_summarize_refuses_texts_that_are_not_strings(minilm_dir: Path) -> None:
    from bertforge.errors import InputError

    with pytest.raises(InputError, match="text 1: expected a string, got NoneType"):
        Pipeline(minilm_dir).summarize(["A sentence here.", None])  # type: ignore[list-item]


def test_wikipedia_counts_go_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture, minilm_dir: Path
) -> None:
    """`evaluate --json` prints JSON alone on stdout."""
    write_wiki(tmp_path / "wiki_00")
    fam = family(TaskOptions(task="summarize"), Tokenizer.from_pretrained(minilm_dir))
    fam.read(str(tmp_path / "wiki_00"))
    out = capsys.readouterr()
    assert out.out == "" and "Wikipedia articles" in out.err


def test_a_scorer_over_two_pooling_modes_trains_and_checks_its_width(
    tmp_path: Path, minilm_dir: Path
) -> None:
    """Pooling of [CLS] and mean gives vectors twice the encoder's width."""
    import shutil

    from bertforge.errors import CheckpointError
    from bertforge.train.finetune import FinetuneConfig, run

    model = tmp_path / "minilm-cls-mean"
    shutil.copytree(minilm_dir, model)
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    (model / "1_Pooling" / "config.json").write_text(
        json.dumps({**pooling, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True})
    )
    rows = positional_documents(random.Random(1), 6)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "summarizer"
    config = FinetuneConfig(
        model=str(model),
        task="summarize",
        train=str(tmp_path / "train.jsonl"),
        out=str(out),
        summary_sentences=1,
        epochs=1,
        precision="fp32",
        progress=False,
    )
    run(config)
    assert json.loads((out / ds.SCORER_CONFIG).read_text())["dim"] == 2 * 384
    [result] = Pipeline(out).summarize([rows[0]["text"]], sentences=1)
    assert len(result["sentences"]) == 1
    pooling_file = out / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_file.read_text())
    pooling_file.write_text(json.dumps({**pooling, "pooling_mode_cls_token": False}))
    with pytest.raises(CheckpointError, match="pooling gives 384"):
        Pipeline(out).summarize([rows[0]["text"]], sentences=1)


@pytest.fixture
def scorer_dir(tmp_path: Path, minilm_dir: Path) -> Path:
    """all-MiniLM-L6-v2 (its weights linked) with an untrained document scorer beside it: a
    summarizer's directory as the pipeline reads it, made in a moment."""
    import shutil

    d = tmp_path / "scorer-dir"
    shutil.copytree(minilm_dir, d, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    (d / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    torch.manual_seed(0)
    ds.DocumentScorer(ds.ScorerConfig(dim=384)).save_pretrained(d)
    return d


THREE = ["The river runs through the old town. Its bridges are old. Boats carry goods on it."]


@pytest.mark.parametrize("missing", [ds.SCORER_CONFIG, ds.SCORER_FILE])
def test_a_summarizer_with_a_file_missing_is_one_error_naming_it(
    scorer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, missing: str
) -> None:
    """Half a summarizer is refused, not read as k-means over its encoder with "mode":
    "kmeans" the only sign; k-means asked for by name still reads the encoder."""
    from bertforge.cli import main
    from bertforge.errors import CheckpointError
    from bertforge.train.finetune import evaluate_model

    (scorer_dir / missing).unlink()
    message = rf"^{scorer_dir}: has .* but not {missing}: the summarizer is incomplete"
    with pytest.raises(CheckpointError, match=message):
        Pipeline(scorer_dir).summarize(THREE)
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": THREE[0], "summary": "Its bridges are old."}) + "\n")
    with pytest.raises(CheckpointError, match=message):
        evaluate_model(str(scorer_dir), "summarize", str(data))
    assert main(["summarize", str(scorer_dir), str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"but not {missing}" in err, err
    assert not (tmp_path / "o").exists()
    (kmeans,) = Pipeline(scorer_dir).summarize(THREE, sentences=1, mode="kmeans")
    assert kmeans["mode"] == "kmeans" and len(kmeans["sentences"]) == 1


def test_non_finite_scorer_weights_are_one_error_naming_the_file_and_the_tensor(
    scorer_dir: Path,
) -> None:
    """A NaN in the scorer gave every sentence a NaN score ("score": null) and an arbitrary
    choice with "mode": "trained"."""
    from safetensors.torch import load_file, save_file

    from bertforge.errors import CheckpointError

    weights = scorer_dir / ds.SCORER_FILE
    state = load_file(weights)
    name = "layers.layers.1.linear1.weight"
    state[name][0, 7] = float("nan")
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=rf"^{weights}: tensor '{name}' has 1 number"):
        Pipeline(scorer_dir).summarize(THREE)


def test_an_edited_scorer_config_is_one_line_naming_the_file_and_the_field(
    scorer_dir: Path,
) -> None:
    """A size edited in summarizer.json is one line naming the file and the field (not
    PyTorch's multi-line size mismatch, nor a silent change of heads); an unknown or missing
    field is named too (not a Python TypeError's text)."""
    from bertforge.errors import CheckpointError

    path = scorer_dir / ds.SCORER_CONFIG
    config = json.loads(path.read_text())
    for edit, want in (
        ({"hidden": 64}, "hidden=64, but"),
        ({"layers": 3}, "layers=3, but"),
        ({"dim": 768}, "dim=768, but"),
        ({"heads": 2}, "heads=2, but"),
        ({"extra": 1}, "unknown field 'extra'"),
        ({"dim": None}, "missing field 'dim'"),
    ):
        edited = {k: v for k, v in {**config, **edit}.items() if v is not None}
        path.write_text(json.dumps(edited))
        with pytest.raises(CheckpointError) as e:
            ds.DocumentScorer.from_pretrained(scorer_dir)
        message = str(e.value)
        assert message.startswith(f"{path}: {want}") and "\n" not in message, message
    path.write_text(json.dumps(config))
    assert ds.DocumentScorer.from_pretrained(scorer_dir).config.heads == 4


def test_sentences_and_ratio_together_are_refused(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The ratio won silently over --sentences; either alone is as before."""
    from bertforge.cli import main

    with pytest.raises(ConfigError, match=r"sentences \(--sentences\) or ratio \(--ratio\)"):
        summary_length(10, 2, 0.5)
    assert summary_length(10, None, 0.5) == 5 and summary_length(10) == 3
    pipe = Pipeline(minilm_dir)
    with pytest.raises(ConfigError, match="not both"):
        pipe.summarize(THREE, sentences=1, ratio=0.5)
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": THREE[0]}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["summarize", str(minilm_dir), str(data), "--sentences", "1", "--ratio", "1"]) == 2
    err = capsys.readouterr().err
    assert "--sentences" in err and "--ratio" in err and err.count("\n") == 1, err
    assert main(["summarize", str(minilm_dir), str(data), "--ratio", "1", "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["sentences"]) == 3


def test_positions_past_a_block_do_not_start_again_at_the_lead() -> None:
    """A document of more than BLOCK sentences is read in blocks; the second block's first
    sentence read the position slot of the document's first (what the scorer learns as "the
    lead"). With that slot and the last made to dominate every other input, sentence BLOCK
    scores as sentence BLOCK - 1 does, not as sentence 0."""
    torch.manual_seed(0)
    scorer = ds.DocumentScorer(ds.ScorerConfig(dim=4, hidden=8, layers=1, heads=2)).eval()
    direction = torch.randn(8)
    direction -= direction.mean()  # LayerNorm removes a vector's mean: keep none to remove
    with torch.no_grad():
        scorer.position.weight[0] = 1e4 * direction
        scorer.position.weight[ds.BLOCK - 1] = -1e4 * direction
    rng = np.random.default_rng(0)
    n = ds.BLOCK + 20
    doc = ds.ScoredDocument(
        ds.unit(rng.normal(size=(n, 4))), rng.normal(size=(n, len(ds.FEATURES))).astype("f")
    )
    (scores,) = ds.score_documents(scorer, [doc])
    assert abs(scores[0] - scores[ds.BLOCK - 1]) > 0.1  # the two slots score apart
    assert np.allclose(scores[ds.BLOCK :], scores[ds.BLOCK - 1], atol=1e-3), scores[-20:]


def test_summarize_shows_its_progress_in_lines_off_a_terminal(
    minilm_dir: Path,
    scorer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long document took minutes with no sign of life: the library shows how many of the
    sentences are read, the CLI how many of the input's characters (as every pipeline verb),
    one document's advancing as its sentences are read (a bar on a terminal; off one, a line
    every so often: here always)."""
    from bertforge import runner
    from bertforge.cli import main

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)
    text = " ".join(f"Sentence number {i} of a long document is here." for i in range(40))
    Pipeline(minilm_dir).summarize([text, THREE[0]])
    assert capsys.readouterr().err == ""  # the library is quiet unless asked
    for model, mode in ((minilm_dir, "kmeans"), (scorer_dir, "trained")):
        (result, _) = Pipeline(model).summarize([text, THREE[0]], progress=True)
        lines = capsys.readouterr().err.splitlines()
        assert result["mode"] == mode and lines, lines
        assert all(line.startswith("summarize: ") for line in lines), lines
        assert lines[-1].startswith("summarize: 43/43 sentences (100%)"), lines
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": text}) + "\n")
    assert main(["summarize", str(minilm_dir), str(data), "--out", str(tmp_path / "o")]) == 0
    lines = capsys.readouterr().err.splitlines()
    chars = f"{len(text) / 1000:.2f}k"
    assert lines[-2].startswith(f"summarize: {chars}/{chars} characters (100%)"), lines
    assert any(f"/{chars} characters (" in x and "(0%)" not in x for x in lines[:-2]), lines
