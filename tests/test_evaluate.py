"""Metrics against their references: scikit-learn (accuracy, F1, MCC), scipy (Pearson,
Spearman), seqeval (entity F1, conlleval semantics) and the official SQuAD scripts
(normalisation, EM/F1, the v2.0 summary and its best-threshold search)."""

from __future__ import annotations

import re
import string
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.data.tasks import GLUE_TASKS, gold_answers, read_conll, read_squad
from bertforge.errors import InputError
from bertforge.evaluate import (
    accuracy,
    average_ranks,
    compute_metrics,
    entity_scores,
    entity_spans,
    f1,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad_question_scores,
    squad_scores,
    squad_v2_scores,
)


@pytest.fixture(scope="module")
def sklearn_metrics() -> Any:
    """scikit-learn's metrics (a test dependency); only the tests that compare with it skip."""
    return pytest.importorskip("sklearn.metrics")


@pytest.fixture(scope="module")
def scipy_stats() -> Any:
    return pytest.importorskip("scipy.stats")


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize("seed", range(5))
def test_classification_against_sklearn(seed: int, sklearn_metrics: Any) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    y = rng.integers(0, 2, n)
    p = np.where(rng.random(n) < 0.7, y, 1 - y)
    assert accuracy(y, p) == pytest.approx(sklearn_metrics.accuracy_score(y, p), abs=1e-12)
    assert f1(y, p) == pytest.approx(sklearn_metrics.f1_score(y, p), abs=1e-12)
    assert f1(y, p, positive_label=0) == pytest.approx(
        sklearn_metrics.f1_score(y, p, pos_label=0), abs=1e-12
    )
    assert matthews_corrcoef(y, p) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(y, p), abs=1e-12
    )
    # Multi-class MCC, string labels (MNLI-like).
    names = np.array(["contradiction", "entailment", "neutral"])
    ys, ps = names[rng.integers(0, 3, n)], names[rng.integers(0, 3, n)]
    ps[: n // 2] = ys[: n // 2]
    assert matthews_corrcoef(list(ys), list(ps)) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(ys, ps), abs=1e-12
    )
    assert f1(list(ys), list(ps), "neutral") == pytest.approx(
        sklearn_metrics.f1_score(ys, ps, labels=["neutral"], average="micro"),
        abs=1e-12,
    )


def test_classification_edge_cases(sklearn_metrics: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on the undefined cases
        for y, p in [
            ([1, 1, 1], [1, 1, 1]),
            ([0, 0], [0, 0]),
            ([0, 1], [1, 0]),
            ([0, 0, 1], [0, 0, 0]),
        ]:
            assert matthews_corrcoef(y, p) == sklearn_metrics.matthews_corrcoef(y, p)
            assert f1(y, p) == sklearn_metrics.f1_score(y, p, zero_division=0.0)
    assert f1(["0", "1", "1"], ["1", "1", "0"], "1") == 0.5
    with pytest.raises(InputError, match="references are strings but predictions are int64"):
        accuracy(["0", "1"], np.array([0, 1]))
    with pytest.raises(InputError, match="positive_label 1 is not of the labels' type"):
        f1(["0", "1"], ["0", "1"], 1)
    with pytest.raises(InputError, match="3 references but 2 predictions"):
        accuracy([1, 2, 3], [1, 2])
    with pytest.raises(InputError, match="no references"):
        matthews_corrcoef([], [])


def test_compute_metrics_for_glue_specs() -> None:
    mrpc = GLUE_TASKS["mrpc"]
    refs, preds = ["1", "0", "1", "1"], ["1", "1", "1", "0"]
    got = compute_metrics(mrpc.metrics, refs, preds, positive_label=mrpc.positive_label)
    assert got == {"f1": pytest.approx(2 / 3), "accuracy": 0.5}
    stsb = compute_metrics(GLUE_TASKS["stsb"].metrics, [0.0, 1.0, 2.5, 5.0], [0.1, 1.5, 2.0, 4.0])
    assert set(stsb) == {"pearson", "spearman"} and stsb["spearman"] == 1.0
    with pytest.raises(InputError, match="metric 'auc'"):
        compute_metrics(["auc"], [1], [1])


# --------------------------------------------------------------------------- correlation


@pytest.mark.parametrize("seed", range(5))
def test_correlations_against_scipy(seed: int, scipy_stats: Any) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 2000))
    x = rng.normal(size=n)
    y = 0.6 * x + rng.normal(size=n)
    # STS-B-like scores with many ties, so average ranks matter.
    xt, yt = np.round(np.clip(x + 2.5, 0, 5), 1), np.round(np.clip(y + 2.5, 0, 5) * 2) / 2
    for a, b in ((x, y), (xt, yt), (xt, y)):
        assert pearson(a, b) == pytest.approx(scipy_stats.pearsonr(a, b)[0], abs=1e-12)
        assert spearman(list(a), list(b)) == pytest.approx(
            scipy_stats.spearmanr(a, b)[0], abs=1e-12
        )
    assert np.array_equal(average_ranks(xt), scipy_stats.rankdata(xt, method="average"))


def test_correlation_edge_cases() -> None:
    assert average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert spearman([1, 2, 3], [1, 4, 9]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(pearson([1, 1, 1], [1, 2, 3]))
    with pytest.raises(InputError, match="at least 2"):
        pearson([1.0], [2.0])
    with pytest.raises(InputError, match="NaN"):
        spearman([1.0, float("nan")], [1.0, 2.0])


# --------------------------------------------------------------------------- SQuAD


def _official_normalize(s: str) -> str:
    """The four steps of the official scripts' normalize_answer, in their order."""

    def lower(text: str) -> str:
        return text.lower()

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def test_normalisation_on_real_answers(data_dir: Path) -> None:
    dev = read_squad(data_dir / "squad" / "dev-v1.1.json")
    texts = [t for e in dev[::200] for t, _ in e.answers]  # ~150 real gold answers
    texts += [e.question for e in dev[::500]]
    texts += ["The  Theatre", "an ant", "A.B.C.", "théâtre — “the” end", "a\u00a0b", "THE", "."]
    assert len(texts) > 150
    for text in texts:
        assert normalize_answer(text) == _official_normalize(text), text


def test_squad_hand_computed() -> None:
    # Articles and punctuation vanish: exact match.
    assert squad_question_scores("the Denver Broncos!", ["Denver Broncos"]) == (1.0, 1.0)
    # Tokens "denver broncos won" vs "denver broncos": P 2/3, R 1, F1 0.8.
    assert squad_question_scores("Denver Broncos won", ["Denver Broncos"])[1] == pytest.approx(0.8)
    # Best over golds; repeated tokens count once each (Counter intersection): P 1/3 R 1/2.
    exact, f = squad_question_scores("cat cat dog", ["cat bird", "fish"])
    assert exact == 0.0 and f == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # v2.0 no-answer: only "" is right; v1.1 has no such rule.
    assert squad_question_scores("", []) == (1.0, 1.0)
    assert squad_question_scores("something", []) == (0.0, 0.0)
    assert squad_question_scores("", ["."], "2.0") == (1.0, 1.0)  # "." normalises to nothing
    assert squad_question_scores("", [".", "x"], "1.1") == (1.0, 0.0)
    with pytest.raises(InputError):
        squad_question_scores("x", [], "1.1")

    refs = {"a": ["Denver Broncos", "Broncos"], "b": ["Santa Clara"], "c": ["1990"]}
    preds = {"a": "Broncos", "b": "Santa Clara, California", "c": "in 1991", "extra": "x"}
    got = squad_scores(refs, preds)
    # a: EM 1 F1 1; b: EM 0, F1 = 2*(2/3)*1/(2/3+1) = 0.8; c: 0, 0.
    assert got == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(60.0), "total": 3}
    with pytest.raises(InputError, match="1 of 3 questions have no prediction"):
        squad_scores(refs, {"a": "x", "b": "y"})


def test_squad_v1_dev_with_gold_predictions(data_dir: Path) -> None:
    dev = read_squad(data_dir / "squad" / "dev-v1.1.json")
    refs = gold_answers(dev)
    perfect = squad_scores(refs, {e.qid: e.answers[0][0] for e in dev})
    assert perfect == {"exact_match": 100.0, "f1": 100.0, "total": 10570}
    # Three dev golds are just "." (normalised: nothing). Under the v1.1 script "." as the
    # prediction matches them exactly but scores F1 0: it has no tokens in common with any
    # gold. 57340d124776f419006617bf's last gold is ".": one question of 10,570 loses F1.
    dotted = squad_scores(refs, {e.qid: e.answers[-1][0] for e in dev})
    assert dotted["exact_match"] == 100.0 and dotted["f1"] == pytest.approx(100 * 10569 / 10570)
    lazy = squad_scores(refs, {e.qid: e.context.split()[0] for e in dev})
    assert 0.0 < lazy["exact_match"] < lazy["f1"] < 10.0


def test_squad_v2_summary_hand_computed() -> None:
    refs = {"h1": ["Paris"], "h2": ["blue whale"], "n1": [], "n2": []}
    preds = {"h1": "Paris", "h2": "whale", "n1": "", "n2": "London"}
    # raw: h1 (1, 1); h2 (0, 2/3); n1 (1, 1); n2 (0, 0).
    got = squad_v2_scores(refs, preds)
    assert got == {
        "exact": 50.0,
        "f1": pytest.approx(100 * (1 + 2 / 3 + 1) / 4),
        "total": 4,
        "HasAns_exact": 50.0,
        "HasAns_f1": pytest.approx(100 * (1 + 2 / 3) / 2),
        "HasAns_total": 2,
        "NoAns_exact": 100 * 1 / 2,
        "NoAns_f1": 50.0,
        "NoAns_total": 2,
    }
    # na_probs: sweeping the threshold up: start 2 (both no-answers right); h1 (0.1) +1 -> 3,
    # n2 (0.3) -1 -> 2, h2 (0.6) +0 exact / +2/3 f1, n1 (0.9) +0. Best exact 3/4 at 0.1; best
    # f1 is 3 at 0.1 too (2 + 2/3 at 0.6 is lower).
    na = {"h1": 0.1, "n2": 0.3, "h2": 0.6, "n1": 0.9}
    got = squad_v2_scores(refs, preds, na, na_prob_thresh=0.5)
    assert got["best_exact"] == 75.0 and got["best_exact_thresh"] == 0.1
    assert got["best_f1"] == 75.0 and got["best_f1_thresh"] == 0.1
    # Thresholded at 0.5: h2 and n1 count as "no answer": h2 wrong, n1 right.
    assert got["exact"] == 50.0 and got["f1"] == 50.0
    assert "HasAns_exact" not in squad_v2_scores({"n": []}, {"n": ""})
    with pytest.raises(InputError, match="have no na_prob"):
        squad_v2_scores(refs, preds, {"h1": 0.5})


def test_squad_v2_best_threshold_brute_force() -> None:
    """best_exact/best_f1 equal the best score over every threshold, each computed directly
    (distinct na_probs, predictions either "" or words: where the official sweep is exact)."""
    rng = np.random.default_rng(0)
    words = ["red", "blue", "green", "the cat", "a dog"]
    for _ in range(20):
        n = int(rng.integers(1, 30))
        refs = {f"q{i}": [] if rng.random() < 0.4 else [str(rng.choice(words))] for i in range(n)}
        preds = {q: "" if rng.random() < 0.3 else str(rng.choice(words)) for q in refs}
        na = {q: float(v) for q, v in zip(refs, rng.permutation(n) / n + 0.01)}
        got = squad_v2_scores(refs, preds, na)
        for key in ("exact", "f1"):
            candidates = [-1.0, *na.values()]
            scores = {
                t: squad_v2_scores(refs, preds, na, na_prob_thresh=t)[key] for t in candidates
            }
            assert got[f"best_{key}"] == pytest.approx(max(scores.values()))
            if got[f"best_{key}_thresh"] != 0.0:
                assert scores[got[f"best_{key}_thresh"]] == pytest.approx(got[f"best_{key}"])


def test_squad_v2_subset_with_gold_predictions(data_dir: Path) -> None:
    dev = read_squad(data_dir / "squad" / "dev-v2.0.subset-16-articles.json")
    refs = gold_answers(dev)
    got = squad_v2_scores(refs, {q: (a[0] if a else "") for q, a in refs.items()})
    assert got["exact"] == got["f1"] == 100.0
    assert (got["HasAns_total"], got["NoAns_total"]) == (2910, 3168)
    # Answer everything with a gold span's text: no-answer questions all wrong.
    first = next(a[0] for a in refs.values() if a)
    always = squad_v2_scores(refs, {q: (a[0] if a else first) for q, a in refs.items()})
    assert always["NoAns_exact"] == 0.0 and always["exact"] == pytest.approx(100 * 2910 / 6078)


# --------------------------------------------------------------------------- entities


def test_entity_spans_conlleval_rules() -> None:
    spans = entity_spans
    assert spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]
    # IOB1: I- starts an entity; B- splits two adjacent entities of one type.
    assert spans(["I-PER", "I-PER", "B-PER", "O"]) == [("PER", 0, 2), ("PER", 2, 3)]
    # A type change inside I- tags starts a new entity.
    assert spans(["I-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 3)]
    assert spans(["B-PER", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 2)]
    # IOBES.
    assert spans(["S-X", "B-Y", "E-Y", "E-Y", "I-Y"]) == [
        ("X", 0, 1),
        ("Y", 1, 3),
        ("Y", 3, 4),
        ("Y", 4, 5),
    ]
    assert spans(["O", "O"]) == []
    with pytest.raises(InputError, match="position 1: tag 'PER' is not O or B-"):
        spans(["O", "PER"])


def _seqeval_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    from seqeval.metrics.sequence_labeling import get_entities

    return [(t, s, e + 1) for t, s, e in get_entities(tags)]


def test_entity_spans_fuzz_against_seqeval() -> None:
    pytest.importorskip("seqeval")
    rng = np.random.default_rng(0)
    alphabet = ["O", "B-X", "I-X", "E-X", "S-X", "B-Y", "I-Y", "E-Y", "S-Y"]
    for _ in range(2000):
        tags = [str(t) for t in rng.choice(alphabet, size=int(rng.integers(0, 12)))]
        assert entity_spans(tags) == _seqeval_spans(tags), tags


def _perturb(tags: list[str], rng: np.random.Generator, rate: float) -> list[str]:
    choices = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    return [str(rng.choice(choices)) if rng.random() < rate else t for t in tags]


def test_entity_scores_against_seqeval_on_conll(data_dir: Path) -> None:
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    gold = [s.tags for s in read_conll(data_dir / "conll2003" / "test.txt")]
    rng = np.random.default_rng(0)
    iob1 = [_to_iob1(t) for t in gold]
    cases = [
        (gold, gold),
        (gold, iob1),  # same entities, other scheme
        (iob1, [_perturb(t, rng, 0.05) for t in iob1]),
        (gold, [_perturb(t, rng, 0.2) for t in gold]),
    ]
    for refs, preds in cases:
        ours = entity_scores(refs, preds)
        report = seqeval_metrics.classification_report(
            refs, preds, output_dict=True, zero_division=0
        )
        assert ours["precision"] == pytest.approx(
            seqeval_metrics.precision_score(refs, preds), abs=1e-12
        )
        assert ours["recall"] == pytest.approx(seqeval_metrics.recall_score(refs, preds), abs=1e-12)
        assert ours["f1"] == pytest.approx(seqeval_metrics.f1_score(refs, preds), abs=1e-12)
        for type_ in ("PER", "LOC", "ORG", "MISC"):
            assert ours[f"{type_}_f1"] == pytest.approx(report[type_]["f1-score"], abs=1e-12)
            assert ours[f"{type_}_n_gold"] == report[type_]["support"]
    assert entity_scores(gold, iob1)["f1"] == 1.0
    assert entity_scores(gold, gold)["n_gold"] == 5648  # CoNLL-2003 test's entity count


def _to_iob1(tags: list[str]) -> list[str]:
    out, prev = [], "O"
    for tag in tags:
        out.append("I-" + tag[2:] if tag.startswith("B-") and prev[2:] != tag[2:] else tag)
        prev = tag
    return out


def test_entity_scores_edge_cases() -> None:
    # Entities never cross sentences: I-PER at the start of sentence 2 is a new entity.
    refs = [["B-PER", "I-PER"], ["I-PER", "O"]]
    preds = [["B-PER", "I-PER"], ["O", "O"]]
    got = entity_scores(refs, preds)
    assert (got["n_gold"], got["n_pred"], got["n_correct"]) == (2, 1, 1)
    assert got["precision"] == 1.0 and got["recall"] == 0.5 and got["f1"] == pytest.approx(2 / 3)
    # A boundary error is a miss on both sides.
    got = entity_scores(["B-ORG", "I-ORG", "I-ORG"], ["B-ORG", "I-ORG", "O"])
    assert got["f1"] == 0.0 and got["ORG_n_gold"] == 1
    assert entity_scores(["O"], ["O"])["f1"] == 0.0  # nothing to find: 0, as seqeval
    with pytest.raises(InputError, match="sentence 0: 2 reference tags but 1 predicted"):
        entity_scores([["O", "O"]], [["O"]])
    with pytest.raises(InputError, match="predictions, sentence 0, position 0: tag 'X'"):
        entity_scores([["O"]], [["X"]])


# --------------------------------------------------------------------------- class by class


@pytest.mark.parametrize("seed", range(5))
def test_class_scores_against_sklearn(seed: int, sklearn_metrics: Any) -> None:
    """Per-class precision, recall, F1 and support, and their macro F1, as scikit-learn's
    precision_recall_fscore_support with the task's label set (one class never predicted, one
    never seen: zero_division=0)."""
    from bertforge.evaluate import class_scores, label_scores

    rng = np.random.default_rng(seed)
    names = ["ham", "spam", "eggs", "never"]
    n = int(rng.integers(5, 300))
    y = rng.choice(names[:3], n, p=[0.7, 0.2, 0.1])
    p = np.where(rng.random(n) < 0.6, y, rng.choice(names[:2], n))  # never "eggs" unless right
    ours = class_scores(y, p, names)
    prf = sklearn_metrics.precision_recall_fscore_support(y, p, labels=names, zero_division=0)
    for k, c in enumerate(names):
        got = [ours[f"{c}_{s}"] for s in ("precision", "recall", "f1", "n_gold")]
        assert got == pytest.approx([prf[0][k], prf[1][k], prf[2][k], prf[3][k]], abs=1e-12), c
        assert ours[f"{c}_n_pred"] == int(np.sum(p == c))
    macro = sklearn_metrics.f1_score(y, p, labels=names, average="macro", zero_division=0)
    assert ours["macro_f1"] == pytest.approx(macro, abs=1e-12)
    # without labels: the classes seen, as sklearn's default; on integer classes too
    codes = {c: i for i, c in enumerate(names)}
    yi, pi = np.array([codes[c] for c in y]), np.array([codes[c] for c in p])
    plain = class_scores(yi, pi)
    assert plain["macro_f1"] == pytest.approx(
        sklearn_metrics.f1_score(yi, pi, average="macro", zero_division=0), abs=1e-12
    )
    assert compute_metrics(["macro_f1"], yi, pi)["macro_f1"] == plain["macro_f1"]
    # multi-label, label by label
    Y = rng.random((n, 3)) < 0.3
    P = np.where(rng.random((n, 3)) < 0.7, Y, ~Y)
    per = label_scores(Y, P, ["a", "b", "c"])
    prf = sklearn_metrics.precision_recall_fscore_support(Y, P, zero_division=0)
    for k, c in enumerate("abc"):
        got = [per[f"{c}_{s}"] for s in ("precision", "recall", "f1", "n_gold")]
        assert got == pytest.approx([prf[0][k], prf[1][k], prf[2][k], prf[3][k]], abs=1e-12), c


def test_one_class_for_every_row_and_the_table() -> None:
    from bertforge.evaluate import class_scores, class_table, single_class, split_classes

    y = ["ham"] * 85 + ["spam"] * 15
    collapsed = class_scores(y, ["ham"] * 100, ["ham", "spam"])
    assert single_class(collapsed) == "ham"
    assert collapsed["macro_f1"] == pytest.approx(0.85 / 0.925 / 2)
    assert single_class(class_scores(y, ["ham"] * 99 + ["spam"], ["ham", "spam"])) is None
    assert single_class(class_scores(["ham"] * 3, ["ham"] * 3, ["ham", "spam"])) is None
    rest, per = split_classes({"accuracy": 0.85, **collapsed, "loss": 0.4})
    assert rest == {"accuracy": 0.85, "macro_f1": collapsed["macro_f1"], "loss": 0.4}
    assert per["spam"] == {"precision": 0, "recall": 0, "f1": 0, "n_gold": 15, "n_pred": 0}
    assert class_table(collapsed).splitlines() == [
        "  class  precision     recall         f1     n_gold     n_pred",
        "  ham       0.8500     1.0000     0.9189         85        100",
        "  spam      0.0000     0.0000     0.0000         15          0",
    ]
    with pytest.raises(InputError, match="labels are strings but the references are int64"):
        class_scores([0, 1], [1, 1], ["a", "b"])
    with pytest.raises(InputError, match="a class named 'macro'"):
        class_scores(["macro", "a"], ["a", "a"])


def test_retrieval_scores_match_trec_eval() -> None:
    import pytrec_eval  # trec_eval itself, the test extra's pytrec-eval-terrier

    from bertforge.evaluate import ranking, retrieval_scores

    rng = np.random.default_rng(0)
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for q in range(60):
        docs = [f"d{i}" for i in rng.choice(400, 150, replace=False)]
        judged = rng.choice(docs + [f"x{q}{i}" for i in range(3)], 6, replace=False)
        qrels[f"q{q}"] = {d: int(rng.integers(0, 3)) for d in judged}
        qrels[f"q{q}"][str(judged[0])] = 2  # at least one relevant
        # scores rounded to one decimal: many ties, broken as trec_eval breaks them
        run[f"q{q}"] = {d: float(np.round(rng.random(), 1)) for d in docs}
    ours = retrieval_scores(qrels, run)
    measures = {"ndcg_cut_10", "recall_1", "recall_5", "recall_20", "recall_100", "map_cut_100"}
    ref = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    top10 = {q: {d: run[q][d] for d in ranking(run[q])[:10]} for q in run}
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    mean = {m: np.mean([r[m] for r in ref.values()]) for m in measures}
    assert ours["mrr@10"] == pytest.approx(np.mean([r["recip_rank"] for r in mrr.values()]))
    assert ours["ndcg@10"] == pytest.approx(mean["ndcg_cut_10"])
    for k in (1, 5, 20, 100):
        assert ours[f"recall@{k}"] == pytest.approx(mean[f"recall_{k}"])
    assert ours["map@100"] == pytest.approx(mean["map_cut_100"])
    assert 0 < ours["mrr@10"] < 1 and 0 < ours["recall@100"] < 1


def test_retrieval_scores_count_a_missing_query_as_zero_and_refuse_unjudged_ones() -> None:
    from bertforge.evaluate import retrieval_scores

    qrels = {"a": {"d1": 1}, "b": {"d2": 1}, "c": {"d3": 0}}  # c: nothing relevant, not scored
    run = {"a": {"d1": 0.9, "d2": 0.1}}
    scores = retrieval_scores(qrels, run)
    assert scores["mrr@10"] == 0.5 and scores["recall@1"] == 0.5 and scores["ndcg@10"] == 0.5
    with pytest.raises(InputError, match="no judgements"):
        retrieval_scores(qrels, {"z": {"d1": 1.0}})
    with pytest.raises(InputError, match="at least one query"):
        retrieval_scores({"c": {"d3": 0}}, run)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_retrieval_scores_refuse_a_score_that_is_not_finite(bad: float) -> None:
    """NaN compares false both ways, so sorting left it where it was: a positive listed first
    that scored NaN (an fp16 overflow) ranked first, MRR 1.0 for a broken model."""
    from bertforge.evaluate import retrieval_scores

    run = {"q": {"0": bad, "1": 0.3, "2": 0.9}}
    with pytest.raises(InputError, match=r"query 'q', document '0': score (nan|-?inf)"):
        retrieval_scores({"q": {"0": 1}}, run, recall_at=(1,))


def test_multi_label_scores_refuse_no_rows() -> None:
    from bertforge.evaluate import multi_label_scores

    with pytest.raises(InputError, match="no references and predictions to score"):
        multi_label_scores(np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(InputError, match="no labels"):
        multi_label_scores(np.zeros((2, 0)), np.zeros((2, 0)))


def test_the_printed_scores_say_their_scale() -> None:
    """`f1 88.1234` (SQuAD, percent) and `f1 0.9123` (GLUE, a fraction) printed alike."""
    from bertforge.evaluate import metrics_text

    squad = metrics_text(squad_scores({"q": ["a cat"]}, {"q": "a cat"}))
    assert squad.splitlines()[-1] == (
        "scale: exact match and F1 in percent (0-100, as SQuAD's official scripts)"
    )
    assert "in percent (F1 x 100" in metrics_text({"rouge1": 41.0, "rouge2": 18.0})
    glue = metrics_text(compute_metrics(["accuracy", "f1"], [1, 0, 1], [1, 1, 1]))
    assert glue.splitlines()[-1] == "scale: fractions, not percent (an F1 of 0.88 is 88%)"
