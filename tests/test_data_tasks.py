"""Task file readers (bertforge.data.tasks): GLUE, generic tables, SQuAD, CoNLL, SWAG; counts on
the real files and one clear DataError (file, line, field) for every kind of bad input."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.data.tasks import (
    GLUE_TASKS,
    ChoiceExample,
    Example,
    glue_task,
    gold_answers,
    label_set,
    read_conll,
    read_examples,
    read_glue,
    read_squad,
    read_swag,
    split_train_test,
    to_iob2,
)
from bertforge.data.tasks.table import open_table
from bertforge.errors import DataError, InputError

# --------------------------------------------------------------------------- real data

# Rows of each file, from `wc -l` minus the header line (CoLA has no header; CoLA/dev.tsv has
# no final newline, so wc -l says 1042 for its 1043 rows). Label counts as in SOURCES.md.
GLUE_FILES: list[tuple[str, str, str, int, dict[Any, int] | None]] = [
    ("cola", "CoLA", "train", 8551, {"0": 2528, "1": 6023}),
    ("cola", "CoLA", "dev", 1043, {"0": 322, "1": 721}),
    ("sst2", "SST-2", "train", 67349, {"0": 29780, "1": 37569}),
    ("sst2", "SST-2", "dev", 872, {"0": 428, "1": 444}),
    ("mrpc", "MRPC", "train", 3668, {"0": 1194, "1": 2474}),
    ("mrpc", "MRPC", "dev", 408, {"0": 129, "1": 279}),
    ("stsb", "STS-B", "train", 5749, None),
    ("stsb", "STS-B", "dev", 1500, None),
    ("rte", "RTE", "train", 2490, {"entailment": 1249, "not_entailment": 1241}),
    ("rte", "RTE", "dev", 277, {"entailment": 146, "not_entailment": 131}),
    ("wnli", "WNLI", "train", 635, {"0": 323, "1": 312}),
    ("wnli", "WNLI", "dev", 71, {"0": 40, "1": 31}),
    ("qnli", "QNLI", "dev", 5463, {"entailment": 2702, "not_entailment": 2761}),
]


@pytest.mark.parametrize(("task", "folder", "split", "rows", "label_counts"), GLUE_FILES)
def test_glue_counts(
    data_dir: Path,
    task: str,
    folder: str,
    split: str,
    rows: int,
    label_counts: dict[str, int] | None,
) -> None:
    examples = read_glue(task, data_dir / "glue" / folder / f"{split}.tsv")
    spec = GLUE_TASKS[task]
    assert len(examples) == rows
    assert all((e.text_pair is not None) == spec.is_pair for e in examples)
    assert len({e.guid for e in examples}) == rows
    if label_counts is None:
        assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in examples)
    else:
        assert dict(Counter(e.label for e in examples)) == label_counts


def test_glue_file_details(data_dir: Path) -> None:
    glue = data_dir / "glue"
    # CoLA: no header, columns by position; the first row is data.
    cola = read_glue("CoLA", glue / "CoLA" / "train.tsv")
    assert cola[0].text.startswith("Our friends won't buy this analysis")
    assert cola[0].source.endswith("train.tsv:1") and cola[0].label == "1"
    assert read_glue("cola", glue / "CoLA" / "dev.tsv")[-1].source.endswith("dev.tsv:1043")
    # MRPC: the header starts with a BOM; quotes are text, not CSV quoting.
    mrpc = read_glue("MRPC", glue / "MRPC" / "dev.tsv")
    assert (
        mrpc[0].text_pair
        == '" The foodservice pie business does not fit our long-term growth strategy .'
    )
    # STS-B: the float "score" column, texts by header name among ten columns.
    stsb = read_glue("STS-B", glue / "STS-B" / "dev.tsv")
    assert stsb[0] == Example(
        "A man with a hard hat is dancing.",
        "A man wearing a hard hat is dancing.",
        5.0,
        "dev-0",
        f"{glue / 'STS-B' / 'dev.tsv'}:2",
    )
    # SST-2: sentences keep their apostrophes and trailing space byte for byte.
    assert read_glue("sst2", glue / "SST-2" / "dev.tsv")[0].text == (
        "it 's a charming and often affecting journey . "
    )


def test_task_specs() -> None:
    assert glue_task("SST-2") is GLUE_TASKS["sst2"] and glue_task("sts_b").is_regression
    assert GLUE_TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
    assert GLUE_TASKS["stsb"].num_labels == 1 and GLUE_TASKS["mnli"].num_labels == 3
    assert GLUE_TASKS["cola"].metrics == ("mcc",)
    assert GLUE_TASKS["mrpc"].metrics == ("f1", "accuracy") == GLUE_TASKS["qqp"].metrics
    assert GLUE_TASKS["stsb"].metrics == ("spearman", "pearson")
    assert not GLUE_TASKS["sst2"].is_pair and GLUE_TASKS["qnli"].is_pair
    assert len(GLUE_TASKS) == 9
    with pytest.raises(InputError, match="unknown; one of cola, sst2"):
        glue_task("imdb")


def test_sms_spam_and_fixed_split(data_dir: Path) -> None:
    path = data_dir / "sms_spam" / "SMSSpamCollection"
    examples = read_examples(path, 1, 0, header=False, labels=["ham", "spam"])
    assert len(examples) == 5574
    assert Counter(e.label for e in examples) == {"ham": 4827, "spam": 747}
    assert label_set(examples) == ["ham", "spam"]
    train, test = split_train_test(examples)
    assert (len(train), len(test)) == (4459, 1115)
    assert split_train_test(examples) == (train, test)  # seed 0 by default: the fixed split
    assert split_train_test(examples, rng=np.random.default_rng(0)) == (train, test)
    assert {e.guid for e in train} | {e.guid for e in test} == {e.guid for e in examples}
    assert not {e.guid for e in train} & {e.guid for e in test}
    assert split_train_test(examples, rng=np.random.default_rng(1))[1] != test
    lines = [int(e.source.rsplit(":", 1)[1]) for e in test]
    assert lines == sorted(lines)  # file order kept


def test_squad_real_files(data_dir: Path) -> None:
    squad = data_dir / "squad"
    dev = read_squad(squad / "dev-v1.1.json")
    assert len(dev) == 10570
    assert sum(len(e.answers) for e in dev) == 34726
    assert not any(e.is_impossible for e in dev)
    assert dev[0].title == "Super_Bowl_50"
    assert all(e.context[s : s + len(t)] == t for e in dev for t, s in e.answers)
    v2 = read_squad(squad / "dev-v2.0.subset-16-articles.json")
    assert (len(v2), sum(e.is_impossible for e in v2)) == (6078, 3168)
    assert all((e.answers == []) == e.is_impossible for e in v2)
    train = read_squad(squad / "train-v2.0.subset-first-11-articles.json")
    assert (len(train), sum(e.is_impossible for e in train)) == (5147, 348)
    # Its "version" field says v2.0, but it has no is_impossible keys: read as v1.1.
    derived = read_squad(squad / "train-v1.1-format.subset-first-11-articles.answerable-only.json")
    assert len(derived) == 4799 and not any(e.is_impossible for e in derived)
    answers = gold_answers(v2)
    assert len(answers) == 6078 and sum(1 for a in answers.values() if not a) == 3168


@pytest.mark.parametrize(
    ("split", "sentences", "tokens"),
    [("train", 14041, 203621), ("valid", 3250, 51362), ("test", 3453, 46435)],
)
def test_conll2003_counts(data_dir: Path, split: str, sentences: int, tokens: int) -> None:
    data = read_conll(data_dir / "conll2003" / f"{split}.txt")
    assert len(data) == sentences
    assert sum(len(s.tokens) for s in data) == tokens
    assert all(len(s.tokens) == len(s.tags) for s in data)
    tags = {t for s in data for t in s.tags}
    assert tags == {"O"} | {f"{p}-{t}" for p in "BI" for t in ("PER", "LOC", "ORG", "MISC")}


def test_conll_columns_and_iob(data_dir: Path) -> None:
    test = read_conll(data_dir / "conll2003" / "test.txt")
    assert test[0].tokens[:3] == ["SOCCER", "-", "JAPAN"]
    assert test[0].tags[:3] == ["O", "O", "B-LOC"]
    assert test[0].source.endswith("test.txt:3")  # line 1 is -DOCSTART-, line 2 blank
    pos = read_conll(data_dir / "conll2003" / "test.txt", tag_column=1)
    assert pos[0].tags[:3] == ["NN", ":", "NNP"]
    # The shared copy is IOB2: to_iob2 leaves it alone and undoes an IOB1 conversion.
    for sent in test:
        assert to_iob2(sent.tags) == sent.tags
        assert to_iob2(_to_iob1(sent.tags)) == sent.tags
    assert to_iob2(["I-PER", "I-PER", "I-LOC", "O", "I-ORG", "B-ORG"]) == [
        "B-PER",
        "I-PER",
        "B-LOC",
        "O",
        "B-ORG",
        "B-ORG",
    ]


def _to_iob1(tags: list[str]) -> list[str]:
    """IOB2 -> IOB1: B-X stays B- only right after another X entity's tag."""
    out, prev = [], "O"
    for tag in tags:
        if tag.startswith("B-") and prev[2:] != tag[2:]:
            out.append("I-" + tag[2:])
        else:
            out.append(tag)
        prev = tag
    return out


def test_swag_fixture(data_dir: Path) -> None:
    path = data_dir / "swag" / "swag_train_first11rows.fixture.csv"
    examples = read_swag(path)
    assert len(examples) == 11
    assert examples[0] == ChoiceExample(
        context="Students lower their eyes nervously.",
        start="She",
        endings=[
            "pats her shoulder, then saunters toward someone.",
            "turns with two students.",
            "walks slowly towards someone.",
            "wheels around as her dog thunders out.",
        ],
        label=2,
        guid="swag_train_first11rows.fixture-0",
        source=f"{path}:2",
    )
    assert all(len(e.endings) == 4 and e.label in range(4) for e in examples)


# --------------------------------------------------------------------------- own fixtures


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"


def test_glue_test_files_unlabelled(tmp_path: Path) -> None:
    d = tmp_path / "RTE"
    d.mkdir()
    test = _write(d / "test.tsv", "index\tsentence1\tsentence2\n0\tA man.\tA person.\n")
    [e] = read_glue("rte", test)
    assert e == Example("A man.", "A person.", None, "test-0", f"{test}:2")
    with pytest.raises(
        DataError, match=r'test\.tsv: line 1: column "label" \(rte label column\) missing'
    ):
        read_glue("rte", test, labelled=True)
    # A labelled file read unlabelled just ignores the label.
    dev = _write(d / "dev.tsv", RTE_HEADER + "7\tA.\tB.\tentailment\n")
    assert read_glue("rte", dev, labelled=False)[0].label is None
    # CoLA's test file has a header (index, sentence), unlike its train and dev files.
    cola_test = _write(tmp_path / "test.tsv", "index\tsentence\n0\tHe left.\n")
    assert read_glue("cola", cola_test)[0].text == "He left."
    # MNLI and QQP by header name, with columns we do not read.
    mnli = _write(
        tmp_path / "dev_matched.tsv",
        "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t1\t1e\tfiction\tA cat sat.\tA cat.\tneutral\tentailment\n",
    )
    assert read_glue("mnli", mnli)[0].label == "entailment"
    qqp = _write(
        tmp_path / "train.tsv",
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n5\t1\t2\tWhy?\tHow?\t0\n",
    )
    assert read_glue("qqp", qqp)[0] == Example("Why?", "How?", "0", "train-5", f"{qqp}:2")


def test_glue_bom_and_quotes(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "train.tsv",
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t1\t2\t" He said .\tShe said " no .\n',
    )
    assert read_glue("mrpc", f)[0].text == '" He said .'
    assert read_glue("mrpc", f)[0].text_pair == 'She said " no .'


def _error(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the DataError fn raises; anything else (KeyError, ...) fails the test."""
    with pytest.raises(DataError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_glue_errors(tmp_path: Path) -> None:
    missing = _write(tmp_path / "dev.tsv", "index\tsentence1\tlabel\n0\tA.\tentailment\n")
    msg = _error(read_glue, "rte", missing)
    assert f"{missing}: line 1" in msg and '"sentence2"' in msg and "'sentence1'" in msg

    unknown = _write(tmp_path / "dev.tsv", RTE_HEADER + "0\tA.\tB.\tentailment\n1\tA.\tB.\tmaybe\n")
    msg = _error(read_glue, "rte", unknown)
    assert f"{unknown}: line 3" in msg and 'field "label"' in msg
    assert "'maybe'" in msg and "entailment, not_entailment" in msg

    empty = _write(tmp_path / "dev.tsv", RTE_HEADER + "0\t \tB.\tentailment\n")
    msg = _error(read_glue, "rte", empty)
    assert f"{empty}: line 2" in msg and 'field "sentence1": empty text' in msg
    with pytest.warns(UserWarning, match="skipped 1 rows with an empty text"):
        assert read_glue("rte", empty, skip_empty=True) == []

    short = _write(tmp_path / "dev.tsv", RTE_HEADER + "0\tA.\tentailment\n")
    msg = _error(read_glue, "rte", short)
    assert f"{short}: line 2: 3 fields, expected 4" in msg

    score = _write(tmp_path / "dev.tsv", "index\tsentence1\tsentence2\tscore\n0\tA.\tB.\tfive\n")
    msg = _error(read_glue, "stsb", score)
    assert "line 2" in msg and 'field "score"' in msg and "not a number" in msg

    cola = _write(tmp_path / "train.tsv", "gj04\t1\t\tFine.\ngj04\t1\tOops.\n")
    msg = _error(read_glue, "cola", cola)
    assert "line 2: 3 fields, expected 4" in msg

    assert "empty file" in _error(read_glue, "rte", _write(tmp_path / "dev.tsv", ""))
    assert "file not found" in _error(read_glue, "rte", tmp_path / "nope.tsv")
    bad_utf8 = _write(tmp_path / "dev.tsv", RTE_HEADER.encode() + b"0\tA\xff.\tB.\tentailment\n")
    msg = _error(read_glue, "rte", bad_utf8)
    assert "line 2: byte 3" in msg and "not UTF-8" in msg


def test_generic_tsv_csv_jsonl(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "data.tsv", "id\ttext\tlabel\n7\tgood film\tpos\n8\tbad\tneg\n")
    assert read_examples(tsv, "text", "label", id_column="id") == [
        Example("good film", None, "pos", "7", f"{tsv}:2"),
        Example("bad", None, "neg", "8", f"{tsv}:3"),
    ]
    assert read_examples(tsv, 1, 2)[0].label == "pos"  # indices work with a header too
    # CSV: quoted fields with delimiters, quotes and a newline; the line is where a row starts.
    csv_file = _write(
        tmp_path / "data.csv",
        'premise,hypothesis,score\n"A, b","He said ""hi""",1.5\n"two\nlines",x,2\nlast,y,0\n',
    )
    rows = read_examples(csv_file, "premise", "score", "hypothesis", regression=True)
    assert [(e.text, e.text_pair, e.label) for e in rows] == [
        ("A, b", 'He said "hi"', 1.5),
        ("two\nlines", "x", 2.0),
        ("last", "y", 0.0),
    ]
    assert [e.source.rsplit(":", 1)[1] for e in rows] == ["2", "3", "5"]
    # Semicolons, no header.
    semi = _write(tmp_path / "data.txt", "a;1\nb;0\n")
    assert [e.label for e in read_examples(semi, 0, 1, header=False, delimiter=";")] == ["1", "0"]
    # JSONL: integer labels become the strings a TSV would hold.
    jsonl = _write(
        tmp_path / "data.jsonl",
        json.dumps({"q": "Is it?", "p": "It is.", "y": 1})
        + "\n\n"
        + json.dumps({"q": "No", "p": "x", "y": 0}),
    )
    got = read_examples(jsonl, "q", "y", "p", labels=["0", "1"])
    assert got[0] == Example("Is it?", "It is.", "1", "data-0", f"{jsonl}:1")
    assert got[1].source.endswith(":3")


def test_generic_errors(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "data.tsv", "text\tlabel\nok\tpos\nfine\tmeh\n")
    msg = _error(read_examples, tsv, "sentence", "label")
    assert 'column "sentence" (text_column) missing' in msg and "'text', 'label'" in msg
    msg = _error(read_examples, tsv, "text", "label", labels=["pos", "neg"])
    assert f"{tsv}: line 3" in msg and "'meh'" in msg and "pos, neg" in msg
    msg = _error(read_examples, tsv, "text", "label", header=False)
    assert "give a 0-based column index" in msg
    msg = _error(read_examples, tsv, 5, header=False)
    assert "index 5 is out of range (line 1 has 2 fields)" in msg
    assert "no data rows" in _error(read_examples, _write(tmp_path / "h.tsv", "text\n"), "text")

    empty = _write(tmp_path / "e.tsv", "text\tlabel\n\tpos\n")
    assert 'line 2: field "text": empty text' in _error(read_examples, empty, "text", "label")

    # a quote left open swallows the rest of the file: named where its record starts
    bad_csv = _write(tmp_path / "bad.csv", 'text,label\nok,1\n"unclosed,1\nmore,0\nrows,1\n')
    msg = _error(read_examples, bad_csv, "text", "label")
    assert f"{bad_csv}: line 3: a quoted field never closed" in msg
    stray = _write(tmp_path / "stray.csv", 'text,label\nok,1\n"two\nlines"x,0\n')
    msg = _error(read_examples, stray, "text", "label")
    assert f"{stray}: line 4: malformed CSV (in the record from line 3)" in msg
    ragged = _write(tmp_path / "ragged.csv", "text,label\nok,1\ntoo,many,fields\n")
    assert "line 3: 3 fields, expected 2" in _error(read_examples, ragged, "text", "label")

    jsonl = _write(tmp_path / "d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": \n')
    msg = _error(read_examples, jsonl, "text", "label")
    assert f"{jsonl}: line 2: invalid JSON" in msg
    not_object = _write(tmp_path / "d.jsonl", '["text"]\n')
    assert "line 1: expected a JSON object, got list" in _error(read_examples, not_object, "text")
    no_key = _write(tmp_path / "d.jsonl", '{"txt": "a"}\n')
    msg = _error(read_examples, no_key, "text")
    assert 'line 1: field "text" (text_column) missing' in msg and "'txt'" in msg
    not_text = _write(tmp_path / "d.jsonl", '{"text": 3}\n')
    assert 'field "text": expected a string, got int' in _error(read_examples, not_text, "text")
    float_label = _write(tmp_path / "d.jsonl", '{"text": "a", "label": "n/a"}\n')
    msg = _error(read_examples, float_label, "text", "label", regression=True)
    assert "'n/a' is not a number" in msg
    with pytest.raises(InputError, match="JSONL columns are key names"):
        read_examples(float_label, 0)
    with pytest.raises(InputError, match="test_fraction"):
        split_train_test([1, 2], test_fraction=1.0)


def _squad(
    tmp_path: Path, qas: list[dict[str, Any]], context: str = "The cat sat on the mat."
) -> Path:
    data = {
        "version": "1.1",
        "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}],
    }
    return _write(tmp_path / "squad.json", json.dumps(data))


def test_squad_errors(tmp_path: Path) -> None:
    good = {"id": "q1", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]}
    [e] = read_squad(_squad(tmp_path, [good]))
    assert (e.qid, e.answers, e.is_impossible, e.title) == ("q1", [("The cat", 0)], False, "T")

    off = {"id": "q2", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 16}]}
    path = _squad(tmp_path, [good, off])
    msg = _error(read_squad, path)
    assert str(path) in msg and "(id q2)" in msg and 'field "answer_start"' in msg
    assert "occurs at 15" in msg
    # strict=False drops the bad answer (and so the question), with one counting warning.
    with pytest.warns(UserWarning, match=r"skipped 1 answers .* 1 questions .*q2"):
        assert [e.qid for e in read_squad(path, strict=False)] == ["q1"]

    msg = _error(read_squad, _squad(tmp_path, [{"id": "q3", "answers": []}]))
    assert "qas[0] (id q3)" in msg and 'field "question" missing' in msg
    msg = _error(read_squad, _squad(tmp_path, [good, good]))
    assert "(id q1)" in msg and "duplicate" in msg
    start_str = {**good, "answers": [{"text": "The cat", "answer_start": "0"}]}
    msg = _error(read_squad, _squad(tmp_path, [start_str]))
    assert 'field "answer_start": expected an integer, got str' in msg
    impossible = {**good, "is_impossible": True}
    assert "is_impossible is true" in _error(read_squad, _squad(tmp_path, [impossible]))
    no_answers = {**good, "answers": []}
    assert 'field "answers": empty' in _error(read_squad, _squad(tmp_path, [no_answers]))

    v2 = _squad(
        tmp_path,
        [
            {**good, "is_impossible": False},
            {"id": "n", "question": "Why?", "answers": [], "is_impossible": True},
        ],
    )
    assert [e.is_impossible for e in read_squad(v2)] == [False, True]
    assert gold_answers(read_squad(v2)) == {"q1": ["The cat"], "n": []}

    broken = _write(tmp_path / "broken.json", '{"data": [\n{"title": "x",}\n]}')
    msg = _error(read_squad, broken)
    assert f"{broken}: line 2, column" in msg and "invalid JSON" in msg
    assert 'top level: field "data" missing' in _error(
        read_squad, _write(tmp_path / "x.json", "{}")
    )


def test_squad_no_answer_questions_and_unlabelled_reads(tmp_path: Path) -> None:
    good = {"id": "q1", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]}
    none = {"id": "n", "question": "Why?", "answers": [], "is_impossible": True}
    v2 = _squad(tmp_path, [{**good, "is_impossible": False}, none])
    # a v1.1 task (no_answer=False) refuses a v2.0 question without an answer, naming it
    msg = _error(read_squad, v2, no_answer=False)
    assert f"{v2}: data[0].paragraphs[0].qas[1] (id n)" in msg and "--task squad2" in msg
    assert [e.qid for e in read_squad(v2)] == ["q1", "n"]  # v2.0 reads it
    # unlabelled (predict): no answers read or checked, every question kept, no warning
    off = {"id": "q2", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 16}]}
    bare = {"id": "q3", "question": "What?"}
    path = _squad(tmp_path, [good, off, bare, none])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = read_squad(path, labelled=False, no_answer=False)
    assert [(e.qid, e.answers, e.is_impossible) for e in got] == [
        (q, [], False) for q in ("q1", "q2", "q3", "n")
    ]
    assert "duplicate" in _error(read_squad, _squad(tmp_path, [bare, bare]), labelled=False)


def test_conll_errors(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "ner.txt",
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP B-PER\n",
    )
    data = read_conll(f)
    assert [(s.tokens, s.tags, s.source) for s in data] == [
        (["EU", "rejects"], ["B-ORG", "O"], f"{f}:3"),
        (["Peter"], ["B-PER"], f"{f}:7"),
    ]
    bad = _write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects VBZ O\n")
    msg = _error(read_conll, bad)
    assert f"{bad}: line 2: 3 columns, expected 4 (as on line 1)" in msg and "tag" in msg
    msg = _error(read_conll, f, labels=["O", "B-PER"])
    assert f"{f}: line 3" in msg and 'field "tag"' in msg and "'B-ORG'" in msg
    assert "no sentences" in _error(read_conll, _write(tmp_path / "e.txt", "-DOCSTART- O\n\n"))
    with pytest.raises(InputError, match="tag_column 4"):
        read_conll(f, tag_column=4)
    assert "expected 2 (n_columns)" in _error(read_conll, f, n_columns=2)


def test_swag_errors(tmp_path: Path) -> None:
    header = (
        ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,"
        "label\n"
    )
    row = '0,v,1,"A b","A, said ""x"".",She,gold,e0,e1,e2,e3,{label}\n'
    f = _write(tmp_path / "val.csv", header + row.format(label=3))
    assert read_swag(f)[0].context == 'A, said "x".' and read_swag(f)[0].label == 3
    bad = _write(tmp_path / "val.csv", header + row.format(label=4))
    msg = _error(read_swag, bad)
    assert "line 2" in msg and 'field "label"' in msg and "0, 1, 2, 3" in msg
    test = _write(
        tmp_path / "test.csv",
        header.replace(",label", "") + row.format(label="").rstrip(",\n") + "\n",
    )
    assert read_swag(test)[0].label is None
    no_endings = _write(tmp_path / "val.csv", "sent1,sent2,label\na,b,0\n")
    assert "expected columns ending0, ending1" in _error(read_swag, no_endings)
    empty_ending = _write(tmp_path / "val.csv", header + row.format(label=0).replace("e2", ""))
    assert 'field "ending2": empty text' in _error(read_swag, empty_ending)


def test_no_raw_errors_escape(tmp_path: Path) -> None:
    """Garbage of every shape ends in DataError, never KeyError / IndexError / TypeError."""
    garbage = [
        "\n",
        "a\n",
        "a\tb\tc\n\n\t\t\n",
        '{"data": 3}',
        '{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": 1}]}]}]}',
        '{"data": [{"paragraphs": "no"}]}',
        "[1, 2]",
        ",,,\n,,,\n",
        "\x00\x01\x02",
    ]
    readers = [
        lambda p: read_glue("rte", p),
        lambda p: read_glue("cola", p),
        lambda p: read_examples(p, "text", "label"),
        lambda p: read_examples(p, 0, 3, header=False),
        read_squad,
        read_conll,
        read_swag,
    ]
    for n, text in enumerate(garbage):
        path = _write(tmp_path / f"g{n}.csv", text)
        for reader in readers:
            with warnings.catch_warnings(), contextlib.suppress(DataError):
                warnings.simplefilter("ignore")
                reader(path)


def test_table_readers_share_their_checks(tmp_path: Path) -> None:
    """GLUE and read_examples open, check and read a table through the same pieces
    (table.open_table, Table, Record), so one fault gives one message whichever reader meets it."""
    labels = ["entailment", "not_entailment"]
    for n, rows in enumerate(["0\tA.\tentailment\n", "0\t \tB.\tentailment\n", "0\tA.\tB.\tx\n"]):
        f = _write(tmp_path / f"dev{n}.tsv", RTE_HEADER + rows)
        generic = _error(read_examples, f, "sentence1", "label", "sentence2", labels=labels)
        assert _error(read_glue, "rte", f) == generic
    # A header found by a test of the first record (CoLA's files come with and without one).
    cola = _write(tmp_path / "train.tsv", "\n  \ngj04\t1\t\tFine.\n")
    table = open_table(cola, header=lambda first: "sentence" in first, names=("s", "l", "m", "t"))
    [row] = table.records()
    assert (table.column("t", "text"), row.text(3), row.source) == (3, "Fine.", f"{cola}:3")
    with pytest.raises(DataError, match=r"line 1: column \"x\" \(text\) missing from the header"):
        table.column("x", "text")


# --------------------------------------------------------------------------- BEIR's layout


def test_a_beir_set_reads_as_documents_queries_and_judgements(tmp_path: Path) -> None:
    """A title is prepended to the text with a space (BEIR's and sentence-transformers' way),
    an empty or missing one is not; the title stays in the metadata; grades are kept."""
    from bertforge.data.tasks.beir import beir_documents, judgements, read_qrels, read_queries
    from tests.task_files import BEIR_DOCS, beir_files

    root = beir_files(tmp_path / "set")
    docs = list(beir_documents(root))
    assert [d[1] for d in docs] == [d[0] for d in BEIR_DOCS]
    assert docs[0][2] == "Eiffel Tower The Eiffel Tower stands in Paris, the capital of France."
    assert docs[2][2] == "Hamlet Hamlet is a tragedy written by William Shakespeare."
    assert docs[1][2] == BEIR_DOCS[1][2] and docs[3][2] == BEIR_DOCS[3][2]  # none, and ""
    assert docs[0][3] == {"title": "Eiffel Tower"} and docs[1][3] == {}
    qrels = judgements(read_qrels(root / "qrels" / "test.tsv"))
    assert qrels["q2"] == {"d0": 2, "d4": 2, "d1": 0} and set(qrels) == {"q1", "q2", "q4"}
    assert read_queries(root / "queries.jsonl")["q5"] == ("an unjudged question", 5)


def test_a_beir_split_is_retrieval_pairs(tmp_path: Path) -> None:
    """DIR:SPLIT (DIR alone: train) gives a pair per judgement above 0, the positive's id its
    corpus-id, its source the qrels line: what mine and finetune --task retrieval read."""
    from bertforge.data.tasks import read_retrieval
    from tests.task_files import BEIR_DOCS, beir_files

    root = beir_files(tmp_path / "set")
    pairs = read_retrieval(f"{root}:train")
    assert [(e.query, e.positive, e.positive_id) for e in pairs] == [
        ("what do cats eat", BEIR_DOCS[1][2], "d1"),
        ("who wrote hamlet", "Hamlet " + BEIR_DOCS[2][2], "d2"),
    ]
    assert [e.source for e in pairs] == [f"{root / 'qrels' / 'train.tsv'}:{n}" for n in (2, 4)]
    assert read_retrieval(root) == pairs
    assert len(read_retrieval(f"{root}:test")) == 5


BAD_BEIR = [
    ("corpus.jsonl", 2, '{"text": "no id"}', r'corpus.jsonl: line 2: field "_id": missing'),
    ("corpus.jsonl", 3, '{"_id": "d2", "text": ""}', r'corpus.jsonl: line 3: field "text"'),
    ("corpus.jsonl", 1, "{not json", r"corpus.jsonl: line 1: invalid JSON"),
    ("queries.jsonl", 2, '{"_id": "q1", "text": "again"}', r"queries.jsonl: line 2: query id 'q1' repeats line 1"),
    ("queries.jsonl", 2, '{"_id": "q2"}', r'queries.jsonl: line 2: field "text"'),
    ("qrels/train.tsv", 1, "qid\tdocid\tscore", r"train.tsv: line 1: expected the header"),
    ("qrels/train.tsv", 2, "q3\td1\thigh", r'train.tsv: line 2: field "score": \'high\' is not an integer'),
    ("qrels/train.tsv", 3, "q2\td1", r"train.tsv: line 3: 2 fields, expected 3"),
    ("qrels/train.tsv", 4, "q1\td9\t1", r'train.tsv: line 4: field "corpus-id": \'d9\' is not in .*corpus.jsonl'),
    ("qrels/train.tsv", 2, "q9\td1\t1", r'train.tsv: line 2: field "query-id": \'q9\' is not in .*queries.jsonl'),
    ("qrels/train.tsv", 4, "q3\td1\t2", r"train.tsv: line 4: query 'q3', document 'd1' judged again \(line 2\)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "lineno", "line", "message"), BAD_BEIR)
def test_a_bad_beir_file_is_one_error_naming_its_line(
    tmp_path: Path, name: str, lineno: int, line: str, message: str
) -> None:
    from bertforge.data.tasks import read_retrieval
    from tests.task_files import beir_files

    root = beir_files(tmp_path / "set")
    lines = (root / name).read_text().splitlines()
    lines[lineno - 1] = line
    (root / name).write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        read_retrieval(f"{root}:train")


def test_a_missing_split_or_file_of_a_beir_set_is_named(tmp_path: Path) -> None:
    from bertforge.data.tasks import read_retrieval
    from tests.task_files import beir_files

    root = beir_files(tmp_path / "set")
    with pytest.raises(DataError, match=r"dev.tsv: no such split \(the set has: test, train"):
        read_retrieval(f"{root}:dev")
    (root / "queries.jsonl").unlink()
    with pytest.raises(DataError, match=r"queries.jsonl: missing"):
        read_retrieval(root)
    (root / "corpus.jsonl").unlink()
    with pytest.raises(DataError, match=r"a directory without corpus.jsonl: not a BEIR set"):
        read_retrieval(root)


def test_squad_written_as_a_beir_set(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`bertforge beir`: each paragraph a document, each question a query judged relevant to
    its paragraph, the first half of the articles the split train; read back by the readers."""
    from bertforge.cli import main
    from bertforge.data.tasks import read_retrieval
    from bertforge.data.tasks.beir import beir_documents, judgements, read_qrels

    articles = [
        ("Cats", [("Cats eat fish.", ["What do cats eat?", "Do cats eat fish?"]),
                  ("Cats sleep a lot.", ["How much do cats sleep?"])]),
        ("Paris", [("Paris is in France.", ["Where is Paris?"])]),
    ]  # fmt: skip
    data = [
        {"title": t, "paragraphs": [
            {"context": c, "qas": [{"id": q, "question": q, "answers": []}
                                    for q in qs]} for c, qs in ps]}
        for t, ps in articles
    ]  # fmt: skip
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": data}))
    out = tmp_path / "set"
    assert main(["beir", str(squad), "--out", str(out)]) == 0
    assert "wrote 3 documents and 4 queries" in capsys.readouterr().out
    docs = [(i, t, m) for _, i, t, m in beir_documents(out)]
    assert docs == [
        ("p0", "Cats eat fish.", {"article": "Cats"}),
        ("p1", "Cats sleep a lot.", {"article": "Cats"}),
        ("p2", "Paris is in France.", {"article": "Paris"}),
    ]
    assert judgements(read_qrels(out / "qrels" / "test.tsv")) == {"Where is Paris?": {"p2": 1}}
    pairs = read_retrieval(out)  # the train split
    assert [(e.query, e.positive_id) for e in pairs] == [
        ("What do cats eat?", "p0"),
        ("Do cats eat fish?", "p0"),
        ("How much do cats sleep?", "p1"),
    ]
    assert main(["beir", str(squad), "--out", str(out)]) == 2  # never over a directory's files
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert main(["beir", str(squad), "--out", str(tmp_path / "x"), "--train-articles", "3"]) == 2
    assert "between 0 and the file's 2 articles" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
