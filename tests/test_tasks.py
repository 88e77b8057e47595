"""The task layer (bertforge.tasks): the loss each family trains with equals transformers'
loss on the same batch; `evaluate` and the matching pipeline give the same predictions; the
sentence problems; windows and max-context, SQuAD labels and n-best, NER first pieces; the
package's import directions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge import BertConfig, Tokenizer
from bertforge.data.instances import IGNORE_INDEX
from bertforge.data.tasks import SquadExample, TaggedSentence
from bertforge.evaluate import entity_spans
from bertforge.heads import BertForQuestionAnswering, BertForTokenClassification
from bertforge.pipelines import Pipeline
from bertforge.tasks import TaskOptions, family
from bertforge.tasks.base import Features, collate
from bertforge.tasks.squad import Window, postprocess
from bertforge.tasks.squad import featurize as squad_featurize
from bertforge.tasks.tagging import featurize as tag_featurize
from bertforge.tasks.tagging import tag_set
from bertforge.tasks.windows import max_context_flags, windows_of
from bertforge.train.distributed import Dist
from bertforge.train.finetune import FinetuneConfig, evaluate_model
from bertforge.train.supervised import SupervisedTask
from tests.conftest import TINY
from tests.task_files import (
    BAD,
    GOOD,
    SWAG_HEADER,
    conll_text,
    keyword_table,
    ner_sentences,
    squad_file,
)

transformers = pytest.importorskip("transformers")

HF_CLASSES = {
    "sst2": "BertForSequenceClassification",
    "csv": "BertForSequenceClassification",
    "conll2003": "BertForTokenClassification",
    "squad": "BertForQuestionAnswering",
    "swag": "BertForMultipleChoice",
}


def task_file(task: str, tmp: Path) -> tuple[Path, dict]:
    """A small file of the task's own format, and the TaskOptions it needs."""
    if task == "sst2":
        return keyword_table(tmp / "sst2.tsv", 12, seed=1), {}
    if task == "csv":
        rows = ["text\tlabel"] + [f"sentence number {i} here\t{i * 0.37:.2f}" for i in range(12)]
        (tmp / "reg.tsv").write_text("\n".join(rows) + "\n")
        return tmp / "reg.tsv", {"regression": True}
    if task == "conll2003":
        (tmp / "ner.txt").write_text(conll_text(ner_sentences(8, seed=2)))
        return tmp / "ner.txt", {}
    if task == "squad":
        return squad_file(tmp / "squad.json", version_2=False), {
            "max_seq_length": 24,
            "doc_stride": 8,
        }
    rows = [SWAG_HEADER] + [
        f'v{i},{i},x,"The man picks up a cup {i}.",He,gold,"drinks.","sings '
        f'loudly.","flies away.","melts.",{i % 4}'
        for i in range(6)
    ]
    (tmp / "swag.csv").write_text("\n".join(rows) + "\n")
    return tmp / "swag.csv", {}


@pytest.mark.parametrize("task", list(HF_CLASSES))
@torch.no_grad()
def test_the_training_loss_of_every_family_equals_transformers(
    task: str, tmp_path: Path, minilm_dir: Path
) -> None:
    path, options = task_file(task, tmp_path)
    tok = Tokenizer.from_pretrained(minilm_dir)
    cfg = FinetuneConfig(
        model="-", task=task, train=str(path), out="-", batch_size=64, precision="fp32", **options
    )
    fine = SupervisedTask(family(cfg, tok), cfg, Dist())
    fam = fine.family
    examples = fam.read(str(path))
    fam.set_labels(examples)
    features = fam.featurize(examples, training=True)
    model = fam.head(
        BertConfig(**{**TINY, "vocab_size": tok.vocab_size}).replace(**fam.head_kwargs())
    ).eval()
    model.save_pretrained(tmp_path / "m")
    hf = getattr(transformers, HF_CLASSES[task]).from_pretrained(tmp_path / "m").eval()

    batch = collate(features, np.arange(len(features)), tok.pad_id)
    totals = fine.normalizers([batch])  # the loop's normaliser: the whole global batch
    ours, _ = fine.loss(model, batch, totals)  # the training code path
    inputs = {
        "input_ids": batch.input_ids,
        "token_type_ids": batch.token_type_ids,
        "attention_mask": batch.attention_mask,
    }
    if task == "squad":
        ref = hf(
            **inputs, start_positions=batch.labels[:, 0], end_positions=batch.labels[:, 1]
        ).loss
    else:
        ref = hf(**inputs, labels=batch.labels).loss
    if task == "conll2003":
        assert (batch.labels != IGNORE_INDEX).sum() < batch.attention_mask.sum()  # pieces ignored
    assert abs(float(ours) - float(ref)) <= 1e-5, (task, float(ours), float(ref))


@pytest.mark.parametrize("nsp", [True, False])
@torch.no_grad()
def test_the_pretraining_loss_equals_transformers(
    nsp: bool, tmp_path: Path, minilm_dir: Path
) -> None:
    from bertforge.data.instances import MaskingSpec
    from bertforge.data.pretraining import PretrainingStream
    from bertforge.data.shards import ShardSet, prepare
    from bertforge.heads import BertForMaskedLM, BertForPreTraining
    from bertforge.train.pretrain import PretrainConfig, PretrainingTask

    tok = Tokenizer.from_pretrained(minilm_dir)
    corpus = tmp_path / "corpus.txt"
    docs = [
        " ".join(f"Sentence {d} {i} talks about the number {i * d}." for i in range(12))
        for d in range(6)
    ]
    corpus.write_text("\n\n".join(d.replace(". ", ".\n") for d in docs) + "\n")
    prepare([corpus], tok, tmp_path / "shards", fmt="lines", progress=False, heldout=0.0)
    shards = ShardSet(tmp_path / "shards")
    spec = MaskingSpec.from_tokens(
        tok.tokens,
        tok.mask_id,
        frozenset({tok.cls_id, tok.sep_id, tok.pad_id}),
        max_predictions_per_seq=10,
    )
    stream = PretrainingStream(
        shards, spec, tok.cls_id, tok.sep_id, tok.pad_id, max_seq_length=48, packed=not nsp
    )
    batch, _ = next(stream.batches(8))
    cls = BertForPreTraining if nsp else BertForMaskedLM
    model = cls(BertConfig(**{**TINY, "vocab_size": tok.vocab_size})).eval()
    model.save_pretrained(tmp_path / "m")
    hf = getattr(transformers, cls.hf_architecture).from_pretrained(tmp_path / "m").eval()

    cfg = PretrainConfig(data="-", out="-", batch_size=8, nsp=nsp)
    task = PretrainingTask(stream, {}, cfg, Dist())
    ours, _ = task.loss(model, batch, task.normalizers([batch]))
    labels = torch.full_like(batch.input_ids, IGNORE_INDEX)
    rows = torch.arange(len(labels))[:, None].expand_as(batch.mlm_positions)
    real = batch.mlm_labels != IGNORE_INDEX
    labels[rows[real], batch.mlm_positions[real]] = batch.mlm_labels[real]
    extra = {"next_sentence_label": batch.nsp_labels} if nsp else {}
    ref = hf(
        input_ids=batch.input_ids,
        token_type_ids=batch.token_type_ids,
        attention_mask=batch.attention_mask,
        labels=labels,
        **extra,
    ).loss
    assert abs(float(ours) - float(ref)) <= 1e-5


# ------------------------------------------------------------------------------------------------
# evaluate and the pipelines: one decoder each


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Path]:
    """Random tiny classification / tagging / QA checkpoints."""
    from bertforge.heads import (
        BertForSequenceClassification,
    )

    tok = Tokenizer.from_pretrained(tiny_model)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size})
    tags = ["O", "B-LOC", "B-PER", "I-PER"]
    out = {}
    for name, cls, kwargs in (
        ("sst2", BertForSequenceClassification, {"id2label": {0: "0", 1: "1"}}),
        ("conll2003", BertForTokenClassification, {"id2label": dict(enumerate(tags))}),
        ("squad", BertForQuestionAnswering, {}),
    ):
        torch.manual_seed(3)
        d = tmp_path_factory.mktemp(name)
        model = cls(config.replace(**kwargs))
        head = model.qa_outputs if name == "squad" else model.classifier
        head.weight.data *= 50  # a random head that does not say one thing for every input
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = d
    return out


def test_evaluate_and_classify_predict_alike(heads: dict[str, Path], tmp_path: Path) -> None:
    from bertforge.heads import BertForSequenceClassification

    data = keyword_table(tmp_path / "dev.tsv", 40, seed=5)
    texts = [ln.split("\t")[0] for ln in data.read_text().splitlines()[1:]]
    # a random head centred on these texts, so that both labels occur and the comparison bites
    model = BertForSequenceClassification.from_pretrained(heads["sst2"])
    with torch.no_grad():
        logits = model(**Tokenizer.from_pretrained(heads["sst2"])(texts)).logits
        model.classifier.bias[1] -= float((logits[:, 1] - logits[:, 0]).median())
    model.save_pretrained(tmp_path / "m")
    Tokenizer.from_pretrained(heads["sst2"]).save_pretrained(tmp_path / "m")
    evaluate_model(str(tmp_path / "m"), "sst2", str(data), out=str(tmp_path), precision="fp32")
    written = [
        ln.split("\t")[1] for ln in (tmp_path / "predictions_sst2.tsv").read_text().splitlines()[1:]
    ]
    got = Pipeline(tmp_path / "m", precision="fp32").classify(texts)
    assert [g["label"] for g in got] == written
    assert 10 < written.count("1") < 30


def test_evaluate_and_ner_find_the_same_entities(heads: dict[str, Path], tmp_path: Path) -> None:
    sentences = ner_sentences(30, seed=4)
    (tmp_path / "dev.txt").write_text(conll_text(sentences))
    evaluate_model(
        str(heads["conll2003"]),
        "conll2003",
        str(tmp_path / "dev.txt"),
        out=str(tmp_path),
        precision="fp32",
    )
    blocks = (tmp_path / "predictions_conll.txt").read_text().strip().split("\n\n")
    predicted = [[ln.split()[2] for ln in b.splitlines()] for b in blocks]
    texts = [" ".join(w for w, _ in s) for s in sentences]
    found = Pipeline(heads["conll2003"], precision="fp32").ner(texts)
    n = 0
    for text, s, tags, ents in zip(texts, sentences, predicted, found):
        starts = [text.index(w, sum(len(x) + 1 for x, _ in s[:i])) for i, (w, _) in enumerate(s)]
        assert [(e["entity"], e["start"]) for e in ents] == [
            (k, starts[a]) for k, a, _ in entity_spans(tags)
        ]
        n += len(ents)
    assert n > 0


def test_evaluate_and_qa_answer_alike(heads: dict[str, Path], tmp_path: Path) -> None:
    data = squad_file(tmp_path / "dev.json", version_2=False)
    evaluate_model(
        str(heads["squad"]),
        "squad",
        str(data),
        out=str(tmp_path),
        precision="fp32",
        max_seq_length=32,
        doc_stride=8,
    )
    answers = json.loads((tmp_path / "predictions.json").read_text())
    qas = [
        (q["id"], q["question"], p["context"])
        for p in json.loads(data.read_text())["data"][0]["paragraphs"]
        for q in p["qas"]
    ]
    got = Pipeline(heads["squad"], precision="fp32").qa(
        [q for _, q, _ in qas], [c for _, _, c in qas], max_seq_length=32, doc_stride=8
    )
    assert [g["answer"] for g in got] == [answers[i] for i, _, _ in qas]


def test_task_options_are_validated_where_they_live() -> None:
    from bertforge.errors import ConfigError

    with pytest.raises(ConfigError, match=r"task='nope' \(--task\): must be one of"):
        TaskOptions(task="nope")
    with pytest.raises(ConfigError, match=r"doc_stride=0 \(--doc-stride\): must be >= 1"):
        TaskOptions(task="squad", doc_stride=0)
    assert (
        TaskOptions(task="squad").max_seq_length == 384
        and TaskOptions(task="rte").max_seq_length == 128
    )
    with pytest.raises(ConfigError, match="max_position_embeddings=512"):
        TaskOptions(task="rte", max_seq_length=100_000).check_model(BertConfig())


def test_one_precision_rule_for_training_and_inference(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    from bertforge import runner
    from bertforge.errors import ConfigError

    cpu = torch.device("cpu")
    for has_bf16, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(runner, "cpu_supports_bf16", lambda has=has_bf16: has)
        assert runner.resolve_precision("auto", cpu) == expected
        assert Pipeline(tiny_model).precision == expected  # inference: the same rule as training
    with pytest.raises(ConfigError, match="fp16 .* is for CUDA"):
        Pipeline(tiny_model, precision="fp16")
    assert Pipeline(tiny_model, precision="fp32").precision == "fp32"


# ------------------------------------------------------------------------------------------------
# The sentence problems (tasks.sentence): one object each for training, evaluate and classify


def test_each_sentence_problem_decides_and_answers() -> None:
    from bertforge.tasks.sentence import MultiLabel, Regression, SingleLabel, problem_of_model

    logits = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.5]], np.float32)
    e = np.exp(logits)
    softmax, sigmoid = e / e.sum(-1, keepdims=True), e / (1 + e)

    single = SingleLabel(("neg", "pos", "mid"))
    p = single.probabilities(logits)
    np.testing.assert_allclose(p, softmax, rtol=1e-6)
    assert single.predictions(p).tolist() == [0, 1]
    answers = single.answers(p)
    assert [a["label"] for a in answers] == ["neg", "pos"]
    assert answers[1]["score"] == pytest.approx(softmax[1, 1], rel=1e-6)
    assert answers[1]["scores"] == pytest.approx(dict(zip(("neg", "pos", "mid"), softmax[1])))
    assert [single.cell(k) for k in single.predictions(p)] == ["neg", "pos"]
    assert int(single.correct(torch.from_numpy(logits), torch.tensor([0, 2]))) == 1

    # sigmoids [.88 .5 .27] and [.5 .95 .62]: a label is on when it reaches its threshold
    multi = MultiLabel(("a", "b", "c"), thresholds=np.array([0.5, 0.9, 0.1]))
    p = multi.probabilities(logits)
    np.testing.assert_allclose(p, sigmoid, rtol=1e-6)
    assert multi.predictions(p).tolist() == [[True, False, True], [True, True, True]]
    answers = multi.answers(p)
    assert [a["labels"] for a in answers] == [["a", "c"], ["a", "b", "c"]]
    assert answers[0]["scores"] == pytest.approx(dict(zip("abc", sigmoid[0])))
    assert [multi.cell(on) for on in multi.predictions(p)] == ["a|c", "a|b|c"]
    labels = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    assert int(multi.correct(torch.from_numpy(logits), labels)) == 4  # decisions at logit 0

    scores = np.array([[0.25], [-1.5]], np.float32)
    regression = Regression()
    p = regression.probabilities(scores)
    assert p.tolist() == [0.25, -1.5] and regression.predictions(p).tolist() == [0.25, -1.5]
    assert regression.answers(p) == [{"score": 0.25}, {"score": -1.5}]
    assert [regression.cell(s) for s in p] == ["0.25", "-1.5"]

    # a trained head's problem: one output is regression; else its problem_type and thresholds
    names = {0: "a", 1: "b", 2: "c"}
    config = BertConfig(**TINY, id2label=names, problem_type="multi_label_classification")
    config.extras["multi_label_thresholds"] = {"b": 0.9}
    picked = problem_of_model(config)
    assert isinstance(picked, MultiLabel) and list(picked.names) == ["a", "b", "c"]
    assert np.asarray(picked.thresholds).tolist() == [0.5, 0.9, 0.5]
    assert isinstance(problem_of_model(BertConfig(**TINY, id2label=names)), SingleLabel)
    one = BertConfig(**TINY, id2label={0: "LABEL_0"}, problem_type="regression")
    assert isinstance(problem_of_model(one), Regression)


@pytest.mark.parametrize("kind", ["single", "multi", "regression"])
def test_classify_averages_a_long_texts_windows_in_probability_space(
    kind: str, tiny_model: Path, tmp_path: Path
) -> None:
    """A long text's answer is the mean of its windows' probabilities (scores), weighted by
    the pieces each window answers for; a short text's is its own."""
    from bertforge.heads import BertForSequenceClassification
    from bertforge.tasks.windows import contributions, split

    names = ["no", "yes", "maybe"]
    kwargs: dict = {
        "single": {"id2label": dict(enumerate(names))},
        "multi": {"id2label": dict(enumerate(names)), "problem_type": "multi_label_classification"},
        "regression": {"num_labels": 1, "problem_type": "regression"},
    }[kind]
    config = BertConfig.from_pretrained(tiny_model).replace(**kwargs)
    thresholds = np.array([0.5, 0.4, 0.6])
    if kind == "multi":
        config.extras["multi_label_thresholds"] = dict(zip(names, thresholds.tolist()))
    torch.manual_seed(5)
    model = BertForSequenceClassification(config).eval()
    model.classifier.weight.data *= 30  # windows that disagree
    model.save_pretrained(tmp_path / "clf")
    tok = Tokenizer.from_pretrained(tiny_model)
    tok.save_pretrained(tmp_path / "clf")

    text = " ".join(f"line {i} is {('good', 'bad', 'music')[i % 3]} news." for i in range(40))
    features, windows = split(tok.encode_batch([text], truncation=False), 32, 10)

    def probabilities(x: torch.Tensor) -> np.ndarray:
        p = x.softmax(-1) if kind == "single" else x.sigmoid() if kind == "multi" else x[:, 0]
        return p.double().numpy()

    with torch.no_grad():
        rows = [model(torch.from_numpy(ids)[None]).logits for ids in features.input_ids]
        short = probabilities(model(**tok(["short news"])).logits)[0]
    want = np.average(probabilities(torch.cat(rows)), axis=0, weights=contributions(windows))
    got = Pipeline(tmp_path / "clf", precision="fp32", max_length=32, stride=10).classify(
        [text, "short news"]
    )
    assert len(windows) > 3
    if kind == "regression":
        assert got[0]["score"] == pytest.approx(float(want), abs=1e-5)
        assert got[1]["score"] == pytest.approx(float(short), abs=1e-5)
        return
    assert np.abs(np.array([got[0]["scores"][n] for n in names]) - want).max() < 1e-5
    assert np.abs(np.array([got[1]["scores"][n] for n in names]) - short).max() < 1e-5
    if kind == "single":
        assert got[0]["label"] == names[int(want.argmax())]
    else:
        assert got[0]["labels"] == [n for n, p, t in zip(names, want, thresholds) if p >= t]


# ------------------------------------------------------------------------------------------------
# Families' features: windows and max-context, SQuAD labels and n-best, NER first pieces


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


# ------------------------------------------------------------------------------------------------
# What the families refuse as they read, before any training: a tag set entities cannot be
# decoded from, a v2.0 question for a v1.1 task, columns --no-header cannot find


def test_conll2003_reads_entity_tags_only(minilm_dir: Path, tmp_path: Path) -> None:
    from bertforge.errors import ConfigError, DataError

    tok = Tokenizer.from_pretrained(minilm_dir)
    path = tmp_path / "ner.txt"
    path.write_text("Alice NNP B-PER\nran VBD O\n\nBob NNP B-PER\nsat VBD X-Y\n")
    ner = family(TaskOptions(task="conll2003"), tok)
    # the word's own line, though its sentence starts on line 4
    with pytest.raises(DataError, match=rf"{path}: line 5: field \"tag\" .*'X-Y' is not O or B-"):
        ner.read(str(path))
    pos = family(TaskOptions(task="conll2003", tag_column=1), tok)
    with pytest.raises(DataError, match=rf"{path}: line 1: .*\(--tag-column 1\): 'NNP'"):
        pos.read(str(path))
    # predict reads no tags: nothing to refuse
    assert [s.tokens for s in pos.read(str(path), labelled=False)] == [
        ["Alice", "ran"],
        ["Bob", "sat"],
    ]
    with pytest.raises(ConfigError, match=r"labels='O,NNP' \(--labels\): 'NNP' is not O or B-"):
        family(TaskOptions(task="conll2003", labels="O,NNP"), tok)
    ok = tmp_path / "ok.txt"
    ok.write_text("EU B-ORG\nrejects O\nit S-MISC\n")  # IOB2 and IOBES tags are entity tags
    assert [s.tags for s in ner.read(str(ok))] == [["B-ORG", "O", "S-MISC"]]


def test_squad_task_reads_its_version_and_predict_answers_every_question(
    heads: dict[str, Path], tmp_path: Path
) -> None:
    from bertforge.errors import DataError
    from bertforge.train.finetune import predict

    v2 = squad_file(tmp_path / "v2.json", version_2=True)
    # --task squad on a v2.0 file: refused as read, naming the file and the question
    with pytest.raises(DataError, match=rf"{v2}: .*\(id q2\).*--task squad2"):
        evaluate_model(str(heads["squad"]), "squad", str(v2), max_seq_length=32, doc_stride=8)
    # predict needs no answers: a question without any, or with a wrong offset, is answered
    data = json.loads(v2.read_text())
    qas = data["data"][0]["paragraphs"][0]["qas"]
    del qas[0]["answers"]
    qas[1]["answers"][0]["answer_start"] += 1
    unlabelled = tmp_path / "questions.json"
    unlabelled.write_text(json.dumps(data))
    predict(
        str(heads["squad"]),
        "squad",
        str(unlabelled),
        str(tmp_path / "p"),
        max_seq_length=32,
        doc_stride=8,
    )
    answers = json.loads((tmp_path / "p" / "predictions.json").read_text())
    assert set(answers) == {f"q{i}" for i in range(5)}


def test_csv_columns_by_index_are_checked_as_options(minilm_dir: Path, tmp_path: Path) -> None:
    from bertforge.errors import ConfigError

    tok = Tokenizer.from_pretrained(minilm_dir)
    table = tmp_path / "spam.tsv"
    table.write_text("ham\tsee you soon\nspam\twin a prize\n")
    fam = family(TaskOptions(task="csv", no_header=True, text_column="1"), tok)
    with pytest.raises(ConfigError, match=r"label_column='label' \(--label-column\): with --no-h"):
        fam.read(str(table))
    assert [e.text for e in fam.read(str(table), labelled=False)] == ["see you soon", "win a prize"]
    with pytest.raises(ConfigError, match=r"label_column='0,1' \(--label-column\) with --no-head"):
        TaskOptions(task="csv", multi_label=True, no_header=True, label_column="0,1")


def test_evaluate_fits_the_model_head_to_the_glue_task(tiny_model: Path, tmp_path: Path) -> None:
    """A GLUE task's head must be the task's: its size, and its label names in the task's order
    or mapped to it (an HF MNLI checkpoint says entailment, neutral, contradiction)."""
    from bertforge.errors import ConfigError
    from bertforge.heads import BertForSequenceClassification
    from bertforge.train.finetune import predict

    tok = Tokenizer.from_pretrained(tiny_model)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size})

    def head(name: str, pairs: list[tuple[str, str]] | None = None, **kwargs: Any) -> str:
        torch.manual_seed(3)
        model = BertForSequenceClassification(config.replace(**kwargs)).eval()
        model.classifier.weight.data *= 50  # a random head that does not say one thing for all
        if pairs:  # centred on these pairs, so that every label wins some
            with torch.no_grad():
                logits = model(**tok([a for a, _ in pairs], [b for _, b in pairs])).logits
                model.classifier.bias -= logits.mean(0)
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        return str(tmp_path / name)

    sst2 = keyword_table(tmp_path / "sst2.tsv", 12, seed=1)
    three = head("three", id2label={0: "a", 1: "b", 2: "c"})
    with pytest.raises(ConfigError, match=r"--task sst2: 2 labels \(0, 1\); .* 3 labels: a, b, c"):
        evaluate_model(three, "sst2", str(sst2))
    with pytest.raises(ConfigError, match=r"--task sst2: .*one output \(a regression head\)"):
        predict(head("score", num_labels=1), "sst2", str(sst2), str(tmp_path / "p"))
    with pytest.raises(ConfigError, match=r"--task stsb: regression, one output; .* a, b, c"):
        evaluate_model(three, "stsb", str(sst2))
    with pytest.raises(ConfigError, match=r"labels in order 0, 1; .* names NEGATIVE, POSITIVE"):
        evaluate_model(head("named", id2label={0: "NEGATIVE", 1: "POSITIVE"}), "sst2", str(sst2))
    assert "accuracy" in evaluate_model(head("generic", num_labels=2), "sst2", str(sst2))

    # an HF MNLI head: evaluate maps its order to the task's, so it agrees with classify (which
    # answers in the model's own names); gold = classify's answers scores 1
    pairs = [(f"the {w} film was shown", f"people saw {v} things") for w in GOOD for v in BAD]
    names = {0: "ENTAILMENT", 1: "neutral", 2: "contradiction"}
    mnli = head("mnli", pairs, id2label=names)
    got = Pipeline(mnli, precision="fp32").classify([a for a, _ in pairs], [b for _, b in pairs])
    labels = [g["label"].lower() for g in got]
    assert len(set(labels)) > 1  # a comparison that can fail
    dev = tmp_path / "dev_matched.tsv"
    rows = [f"{i}\t{a}\t{b}\t{y}" for i, ((a, b), y) in enumerate(zip(pairs, labels))]
    dev.write_text("index\tsentence1\tsentence2\tgold_label\n" + "\n".join(rows) + "\n")
    metrics = evaluate_model(mnli, "mnli", str(dev), out=str(tmp_path / "ev"), precision="fp32")
    assert metrics["accuracy"] == 1.0
    written = (tmp_path / "ev" / "predictions_mnli.tsv").read_text().splitlines()[1:]
    assert [x.split("\t")[1] for x in written] == labels


def multi_label_case(tmp_path: Path, tiny_model: Path, **options: Any) -> tuple[Any, ...]:
    """A csv multi-label family on a table of 24 rows and a random 3-label head that scales its
    logits up (so thresholds away from 0.5 change decisions)."""
    from bertforge.heads import BertForSequenceClassification

    rng = np.random.default_rng(0)
    names = ["good", "bad", "music"]
    lines = ["text\tlabels"]
    for i in range(24):
        have = [n for n in names if rng.random() < 0.5] or ["good"]
        lines.append(f"row {i} is {' and '.join(have)} news\t{'|'.join(have)}")
    (table := tmp_path / "ml.tsv").write_text("\n".join(lines) + "\n")
    tok = Tokenizer.from_pretrained(tiny_model)
    opts = TaskOptions(task="csv", label_column="labels", multi_label=True, **options)
    fam = family(opts, tok)
    examples = fam.read(str(table))
    fam.set_labels(examples)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size}).replace(
        id2label=dict(enumerate(fam.spec.labels)), problem_type="multi_label_classification"
    )
    torch.manual_seed(1)
    model = BertForSequenceClassification(config).eval()
    model.classifier.weight.data *= 20
    return fam, model, examples, fam.featurize(examples)


def test_tune_threshold_reports_the_untuned_scores_first_and_the_tuned_beside(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Thresholds tuned on the dev set scored on that same set are optimistic, and picked the best
    epoch: the scores at the thresholds before tuning (0.5) keep their names, those at the tuned
    thresholds are tuned_*, said in the printed summary; the tuned ones go to config.json."""
    from bertforge.evaluate import metrics_text, multi_label_scores
    from bertforge.runner import Runner
    from bertforge.tasks.sentence import sigmoid, tune_thresholds

    fam, model, examples, features = multi_label_case(tmp_path, tiny_model, tune_threshold=True)
    refs = np.asarray(features.labels) > 0.5
    with torch.no_grad():
        probs = sigmoid(model(**fam.tok([e.text for e in examples])).logits.numpy())
    tuned = tune_thresholds(probs, refs)
    assert (tuned != 0.5).any()
    want, want_tuned = (
        multi_label_scores(refs, probs >= 0.5),
        multi_label_scores(refs, probs >= tuned),
    )
    assert want_tuned["micro_f1"] > want["micro_f1"]
    runner = Runner.create("cpu", "fp32")
    for _ in range(2):  # the second epoch's scores are again at 0.5, not the first's tuning
        with torch.no_grad():
            metrics, preds = fam.evaluate(runner, model, examples, features)
        for name in ("micro_f1", "macro_f1", "exact_match"):
            assert metrics[name] == pytest.approx(want[name]), name
            assert metrics[f"tuned_{name}"] == pytest.approx(want_tuned[name]), name
        assert np.array_equal(preds, probs >= tuned)  # what the saved thresholds decide
    saved = model.config.extras["multi_label_thresholds"]
    assert [saved[n] for n in fam.spec.labels] == pytest.approx(tuned.tolist())
    assert "tuned_*: at thresholds tuned on these same examples" in metrics_text(metrics)
    assert "tuned_micro_f1" in fam.metrics  # --metric can pick by it


@pytest.mark.parametrize(("multi", "label"), [(False, "macro"), (True, "micro"), (True, "macro")])
def test_a_label_whose_scores_would_overwrite_the_overall_ones_is_refused(
    minilm_dir: Path, multi: bool, label: str
) -> None:
    from bertforge.errors import ConfigError

    opts = TaskOptions(task="csv", labels=f"a,{label}", multi_label=multi)
    with pytest.raises(ConfigError, match=f"label '{label}': its score {label}_f1 would overwrite"):
        family(opts, Tokenizer.from_pretrained(minilm_dir))
