"""Fine-tuning beyond sentence tasks: CoNLL NER, SQuAD v1.1/v2.0, SWAG; dev splits, `predict`,
prediction files in the tasks' formats, and bad input through the command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import Tokenizer
from bertforge.cli import main
from bertforge.data.tasks import SquadExample, TaggedSentence, read_conll
from bertforge.heads import BertForQuestionAnswering, BertForTokenClassification
from bertforge.pipelines import Pipeline
from bertforge.tasks.base import Features
from bertforge.tasks.squad import Window, postprocess
from bertforge.tasks.squad import featurize as squad_featurize
from bertforge.tasks.tagging import featurize as tag_featurize
from bertforge.tasks.tagging import tag_set
from bertforge.tasks.windows import max_context_flags, windows_of
from bertforge.train.finetune import FinetuneConfig, evaluate_model, predict, run

# ------------------------------------------------------------------------------------------------
# SQuAD features


def google_is_max_context(spans: list[tuple[int, int]], k: int, position: int) -> bool:
    """google-research/bert run_squad.py `_check_is_max_context`, transcribed."""
    best_score, best_index = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, i
    return k == best_index


@pytest.mark.parametrize(
    "n,max_tokens,stride", [(1, 5, 2), (37, 10, 4), (100, 30, 12), (64, 64, 8)]
)
def test_windows_and_max_context_agree_with_google(n: int, max_tokens: int, stride: int) -> None:
    spans = windows_of(n, max_tokens, stride)
    covered = sorted({p for s, ln in spans for p in range(s, s + ln)})
    assert covered == list(range(n)) and spans[-1][0] + spans[-1][1] == n
    flags = max_context_flags(spans, n)
    for k, (start, length) in enumerate(spans):
        want = [google_is_max_context(spans, k, start + j) for j in range(length)]
        assert flags[k].tolist() == want
    # every piece is the max-context piece of exactly one window
    owners = np.zeros(n, int)
    for (start, length), f in zip(spans, flags):
        owners[start : start + length] += f
    assert (owners == 1).all()


def squad_example(qid: str, question: str, context: str, answer: str | None) -> SquadExample:
    answers = [] if answer is None else [(answer, context.index(answer))]
    return SquadExample(qid, question, context, answers, answer is None, "t")


LONG = (
    "The river Élan rises in the hills above the old town. Its water was dammed in 1904 to "
    "supply Birmingham, far to the east, through a long aqueduct that still runs today. "
    "Visitors walk the valley in summer; the reservoirs hold 99,000 megalitres. Rainfall here "
    "is high, and the dams overflow after storms, a sight that draws photographers."
)


def test_squad_window_labels_point_at_the_answer(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    examples = [
        squad_example("a", "When was it dammed?", LONG, "1904"),
        squad_example("b", "How much do they hold?", LONG, "99,000 megalitres"),
        squad_example("c", "What draws photographers?", LONG, "the dams overflow after storms"),
        squad_example("d", "Who owns the moon?", LONG, None),
    ]
    f = squad_featurize(
        examples, tok, max_seq_length=40, doc_stride=10, max_query_length=12, training=True
    )
    assert len(f) > 3 * len(examples)  # the context spans several windows
    found = {e.qid: 0 for e in examples}
    for r, w in enumerate(f.meta):
        e = examples[w.example]
        s, t = f.labels[r]
        assert len(f.input_ids[r]) <= 40
        assert f.token_type_ids[r][w.context_start] == 1 and f.token_type_ids[r][0] == 0
        if (s, t) == (0, 0):
            continue
        text = e.context[w.offsets[s - w.context_start, 0] : w.offsets[t - w.context_start, 1]]
        assert text == e.answers[0][0]
        found[e.qid] += 1
    assert found["a"] >= 1 and found["b"] >= 1 and found["c"] >= 1 and found["d"] == 0
    with pytest.raises(Exception, match="max_seq_length=8 leaves no room"):
        squad_featurize(examples, tok, max_seq_length=8, max_query_length=12)


def test_squad_labels_on_the_real_train_subset(data_dir: Path, minilm_dir: Path) -> None:
    from bertforge.data.tasks import read_squad
    from bertforge.evaluate import normalize_answer

    path = data_dir / "squad" / "train-v1.1-format.subset-first-11-articles.answerable-only.json"
    examples = read_squad(path)[:1500]
    f = squad_featurize(examples, Tokenizer.from_pretrained(minilm_dir), training=True)
    recovered, labelled = set(), 0
    for r, w in enumerate(f.meta):
        s, t = f.labels[r]
        if (s, t) == (0, 0):
            continue
        labelled += 1
        e = examples[w.example]
        text = e.context[w.offsets[s - w.context_start, 0] : w.offsets[t - w.context_start, 1]]
        if normalize_answer(text) == normalize_answer(e.answers[0][0]):
            recovered.add(e.qid)
    assert labelled >= len(examples)
    assert len(recovered) >= 0.99 * len(examples)  # the rest: answers ending inside a word


def one_window(context: str, tok: Tokenizer, question: str = "q?") -> Features:
    return squad_featurize([squad_example("x", question, context, None)], tok, max_seq_length=64)


def test_postprocess_picks_the_best_valid_span_and_applies_the_null_threshold(
    minilm_dir: Path,
) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    context = "alpha beta gamma delta epsilon zeta eta theta"
    f = one_window(context, tok)
    w: Window = f.meta[0]
    T = len(f.input_ids[0])
    c = w.context_start
    start, end = np.zeros(T), np.zeros(T)
    start[c + 2], end[c + 3] = 5.0, 5.0  # "gamma delta"
    start[c + 6], end[c + 1] = 9.0, 9.0  # higher, but end before start: invalid
    ex = [squad_example("x", "q?", context, None)]
    a = postprocess(ex, f, [start], [end], version_2=False)
    assert a.predictions["x"] == "gamma delta"
    assert a.nbest["x"][0]["probability"] == max(c["probability"] for c in a.nbest["x"])
    # at most max_answer_length pieces
    start[:], end[:] = 0.0, 0.0
    start[c], end[c + 7] = 6.0, 6.0
    start[c + 4] = 1.0
    a = postprocess(ex, f, [start], [end], version_2=False, max_answer_length=3)
    assert len(a.predictions["x"].split()) <= 3
    # v2.0: null wins when [CLS] scores above the best span by more than the threshold
    start[:], end[:] = 0.0, 0.0
    start[c + 2], end[c + 2] = 2.0, 2.0  # span score 4
    start[0], end[0] = 3.0, 3.0  # null score 6
    a = postprocess(ex, f, [start], [end], version_2=True)
    assert a.predictions["x"] == "" and a.null_odds["x"] == pytest.approx(2.0)
    a = postprocess(ex, f, [start], [end], version_2=True, null_score_diff_threshold=2.5)
    assert a.predictions["x"] == "gamma"


def test_postprocess_uses_only_max_context_pieces(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    context = " ".join(f"w{i}" for i in range(60))
    ex = [squad_example("x", "q?", context, None)]
    f = squad_featurize(ex, tok, max_seq_length=32, doc_stride=8)
    assert len(f) > 2
    starts, ends = [], []
    for r, w in enumerate(f.meta):
        s, e = np.zeros(len(f.input_ids[r])), np.zeros(len(f.input_ids[r]))
        # every window votes for its own last context piece: for all windows but the final
        # one that piece sits at the window's edge and has more context in the next window
        last = w.context_start + len(w.offsets) - 1
        s[last], e[last] = 10.0, 10.0
        starts.append(s)
        ends.append(e)
    assert [bool(w.max_context[-1]) for w in f.meta] == [False] * (len(f) - 1) + [True]
    a = postprocess(ex, f, starts, ends, version_2=False)
    final = f.meta[-1].offsets[-1]
    assert a.predictions["x"] == context[final[0] : final[1]]
    assert [c["score"] for c in a.nbest["x"]].count(20.0) == 1


# ------------------------------------------------------------------------------------------------
# End to end: files written in the task's format, evaluate and predict agree


def squad_file(path: Path, version_2: bool) -> Path:
    contexts = [
        (
            "The cat sat on the red mat near the door.",
            [("What color was the mat?", "red"), ("Where did the cat sit?", "on the red mat")],
        ),
        ("Paris is the capital of France and lies on the Seine.", [("What river?", "Seine")]),
    ]
    paragraphs = []
    n = 0
    for context, qas in contexts:
        items = []
        for q, a in qas:
            items.append(
                {
                    "id": f"q{n}",
                    "question": q,
                    "answers": [{"text": a, "answer_start": context.index(a)}],
                }
            )
            if version_2:
                items[-1]["is_impossible"] = False
            n += 1
        if version_2:
            items.append(
                {"id": f"q{n}", "question": "Who won?", "answers": [], "is_impossible": True}
            )
            n += 1
        paragraphs.append({"context": context, "qas": items})
    path.write_text(
        json.dumps({"version": "x", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    return path


@pytest.mark.parametrize("task", ["squad", "squad2"])
def test_squad_trains_and_writes_the_official_files(
    task: str, tmp_path: Path, tiny_model: Path
) -> None:
    data = squad_file(tmp_path / "squad.json", task == "squad2")
    out = tmp_path / "run"
    best = run(
        FinetuneConfig(
            model=str(tiny_model),
            task=task,
            train=str(data),
            dev=str(data),
            out=str(out),
            epochs=1,
            batch_size=4,
            max_seq_length=48,
            doc_stride=16,
            progress=False,
        )
    )
    qids = {
        q["id"] for p in json.loads(data.read_text())["data"][0]["paragraphs"] for q in p["qas"]
    }
    predictions = json.loads((out / "predictions.json").read_text())
    assert set(predictions) == qids and all(isinstance(v, str) for v in predictions.values())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert all(abs(sum(c["probability"] for c in v) - 1) < 1e-6 for v in nbest.values())
    assert (out / "null_odds.json").exists() == (task == "squad2")
    model = BertForQuestionAnswering.from_pretrained(out)
    assert model.config.num_labels == 2
    again = evaluate_model(str(out), task, str(data), max_seq_length=48, doc_stride=16)
    assert again["f1"] == pytest.approx(best["f1"], abs=1e-6)
    assert ("HasAns_f1" in again) == (task == "squad2")


def conll_text(sentences: list[list[tuple[str, str]]]) -> str:
    lines = ["-DOCSTART- -X- -X- O", ""]
    for s in sentences:
        lines += [f"{w} NN O {t}" for w, t in s] + [""]
    return "\n".join(lines) + "\n"


NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Esther", "Farouk", "Gwendolyn", "Hiroshi"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Quebec", "Tbilisi", "Adelaide", "Bergen"]


def ner_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        name, city = str(rng.choice(NAMES)), str(rng.choice(CITIES))
        s = [(name, "B-PER")]
        if rng.random() < 0.5:
            s.append(("Smithson", "I-PER"))
        s += [("went", "O"), ("to", "O"), (city, "B-LOC"), ("on", "O"), ("Monday", "O")]
        out.append(s)
    return out


def test_ner_labels_sit_on_first_pieces(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    s = TaggedSentence(["Leicestershire", "beat", "Gwendolyn"], ["B-ORG", "O", "B-PER"], "f:1")
    labels = ["O", "B-ORG", "B-PER"]
    f = tag_featurize([s], tok, labels, 64)
    pieces = tok.encode(s.tokens, split_into_words=True).tokens
    assert len(pieces) > 5  # the names split into several pieces
    first = f.meta[0]
    assert first[0] == 1 and pieces[first[1]] == "beat" and first[2] == first[1] + 1
    assert pieces[first[2] + 1].startswith("##")  # gwendolyn: more than one piece
    y = f.labels[0]
    assert [int(y[j]) for j in first] == [1, 0, 2]
    assert (y >= 0).sum() == 3  # every other piece (and [CLS], [SEP]) is ignored
    assert tag_set([s]) == ["O", "B-ORG", "B-PER"]
    with pytest.warns(UserWarning, match="2 words beyond max_seq_length=3"):
        cut = tag_featurize([s], tok, labels, 3)
    assert (cut.meta[0] < 0).sum() == 2


@pytest.mark.slow
def test_minilm_learns_ner_and_writes_conll_columns(tmp_path: Path, minilm_dir: Path) -> None:
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text(conll_text(ner_sentences(96, 0)))
    dev.write_text(conll_text(ner_sentences(32, 1)))
    out = tmp_path / "ner"
    best = run(
        FinetuneConfig(
            model=str(minilm_dir),
            task="conll2003",
            train=str(train),
            dev=str(dev),
            out=str(out),
            epochs=3,
            batch_size=16,
            lr=2e-4,
            progress=False,
        )
    )
    assert best["f1"] >= 0.9
    model = BertForTokenClassification.from_pretrained(out)
    assert set(model.config.label2id) == {"O", "B-PER", "I-PER", "B-LOC"}
    rows = [x.split() for x in (out / "predictions_conll.txt").read_text().splitlines()]
    words = [r for r in rows if r]
    assert len(words) == sum(len(s.tokens) for s in read_conll(dev)) and all(
        len(r) == 3 for r in words
    )
    # predict on tokens alone (one per line): the same tags as the evaluation's
    tokens_only = tmp_path / "tokens.txt"
    tokens_only.write_text("\n".join(r[0] if r else "" for r in rows) + "\n")
    (path,) = predict(str(out), "conll2003", str(tokens_only), str(tmp_path / "pred"))
    predicted = [x.split() for x in path.read_text().splitlines() if x.strip()]
    assert [p[1] for p in predicted] == [r[2] for r in words]
    # the ner pipeline on raw text: entities merged over pieces, with character offsets
    text = "Farouk Smithson went to Tbilisi on Monday"
    (entities,) = Pipeline(out, precision="fp32").ner([text])
    assert [(e["entity"], e["text"]) for e in entities] == [
        ("PER", "Farouk Smithson"),
        ("LOC", "Tbilisi"),
    ]
    assert all(text[e["start"] : e["end"]] == e["text"] for e in entities)


SWAG_HEADER = (
    "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
)


def test_swag_trains_and_predicts_end_to_end(tmp_path: Path, tiny_model: Path) -> None:
    rows = [SWAG_HEADER]
    for i in range(8):
        rows.append(
            f'v{i},{i},x,"The man picks up a cup {i}.",He,gold,"drinks.","sings loudly.",'
            f'"flies away.","melts.",{i % 4}'
        )
    data = tmp_path / "swag.csv"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "swag"
    best = run(
        FinetuneConfig(
            model=str(tiny_model),
            task="swag",
            train=str(data),
            dev=str(data),
            out=str(out),
            epochs=1,
            batch_size=4,
            progress=False,
        )
    )
    assert 0.0 <= best["accuracy"] <= 1.0 and "loss" in best
    with (out / "predictions_swag.csv").open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == 8 and {r["label"] for r in written} <= {"0", "1", "2", "3"}
    (path,) = predict(str(out), "swag", str(data), str(tmp_path / "p"))
    assert path.read_text() == (out / "predictions_swag.csv").read_text()


def test_swag_shared_format_sample(data_dir: Path, tmp_path: Path, tiny_model: Path) -> None:
    sample = data_dir / "swag" / "swag_train_first11rows.fixture.csv"
    best = run(
        FinetuneConfig(
            model=str(tiny_model),
            task="swag",
            train=str(sample),
            dev=str(sample),
            out=str(tmp_path / "s"),
            epochs=1,
            batch_size=4,
            progress=False,
        )
    )
    assert "accuracy" in best
    (path,) = predict(str(tmp_path / "s"), "swag", str(sample), str(tmp_path / "p"))
    assert len(path.read_text().splitlines()) == 12


def test_dev_split_and_glue_predictions(tmp_path: Path, tiny_model: Path) -> None:
    table = tmp_path / "spam.tsv"
    table.write_text(
        "".join(f"{'spam' if i % 3 == 0 else 'ham'}\tmessage number {i}\n" for i in range(40))
    )
    out = tmp_path / "spam"
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="csv",
            train=str(table),
            out=str(out),
            dev_split=0.25,
            no_header=True,
            text_column="1",
            label_column="0",
            epochs=1,
            batch_size=8,
            progress=False,
        )
    )
    with (out / "predictions_csv.tsv").open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 1 + 10
    assert {r[1] for r in rows[1:]} <= {"ham", "spam"}
    # unlabelled GLUE test file: index<TAB>prediction with the file's own index column
    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence\n7\ta fine film\n9\ta dull one\n")
    sst = tmp_path / "sst"
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\na fine film\t1\na dull one\t0\n")
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="sst2",
            train=str(train),
            out=str(sst),
            epochs=1,
            batch_size=2,
            progress=False,
        )
    )
    (path,) = predict(str(sst), "sst2", str(test), str(tmp_path / "p"))
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction" and [x.split("\t")[0] for x in lines[1:]] == ["7", "9"]


# ------------------------------------------------------------------------------------------------
# Bad input through the command line: one line naming file, line and field; no traceback


def _bad_inputs(tmp: Path) -> list[tuple[str, list[str], str]]:
    missing = tmp / "missing.tsv"
    missing.write_text("sentence\tlabel\ngood film\t1\nno label here\n")
    unknown = tmp / "unknown.tsv"
    unknown.write_text("sentence\tlabel\ngood film\t1\nbad film\tmaybe\n")
    empty = tmp / "empty.tsv"
    empty.write_text("sentence\tlabel\ngood film\t1\n \t0\n")
    squad = tmp / "squad.json"
    squad.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "title": "t",
                        "paragraphs": [
                            {
                                "context": "a b c",
                                "qas": [
                                    {
                                        "id": "q1",
                                        "question": "?",
                                        "answers": [{"text": "b", "answer_start": 0}],
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        )
    )
    conll = tmp / "conll.txt"
    conll.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP\n")
    return [
        ("sst2", [str(missing)], rf"{missing}: line 3: .*(column|field)"),
        ("sst2", [str(unknown)], rf"{unknown}: line 3: .*label.*'maybe'"),
        ("sst2", [str(empty)], rf"{empty}: line 3: .*sentence.*empty"),
        ("squad", [str(squad)], rf"{squad}: .*q1.*answer_start"),
        ("conll2003", [str(conll)], rf"{conll}: line 2: 3 columns, expected 4"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_bad_input_is_one_clear_error(
    case: int, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task, files, pattern = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    rc = main(
        [
            "finetune",
            "--model",
            str(tiny_model),
            "--task",
            task,
            "--train",
            files[0],
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    errors = [x for x in err if x.startswith("bertforge: error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err)
    import re

    assert re.search(pattern, errors[0], re.IGNORECASE), errors[0]
    assert not (out / "model.safetensors").exists()


def test_unknown_tag_in_dev_names_file_line_and_field(tmp_path: Path, tiny_model: Path) -> None:
    from bertforge.errors import DataError

    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text(conll_text(ner_sentences(4, 0)))
    dev.write_text(conll_text([[("Zed", "B-MISC"), ("ran", "O")]]))
    with pytest.raises(DataError, match=rf"{dev}: line 3: field \"tag\".*'B-MISC'"):
        run(
            FinetuneConfig(
                model=str(tiny_model),
                task="conll2003",
                train=str(train),
                dev=str(dev),
                out=str(tmp_path / "o"),
                progress=False,
            )
        )


def test_token_classification_logits_match_transformers(tmp_path: Path, tiny_model: Path) -> None:
    transformers = pytest.importorskip("transformers")
    train = tmp_path / "train.txt"
    train.write_text(conll_text(ner_sentences(8, 0)))
    out = tmp_path / "ner"
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="conll2003",
            train=str(train),
            out=str(out),
            epochs=1,
            batch_size=4,
            progress=False,
        )
    )
    theirs = transformers.BertForTokenClassification.from_pretrained(out).eval()
    ours = BertForTokenClassification.from_pretrained(out).eval()
    assert theirs.config.id2label == ours.config.id2label
    batch = Tokenizer.from_pretrained(out)(["Alice went to Paris", "Bob"])
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, theirs(**batch).logits, atol=1e-5)
