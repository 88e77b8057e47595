"""The heads (bertforge.heads) against transformers: checkpoints both ways, labels, losses,
errors."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from bertforge import (
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    CheckpointError,
    CheckpointWarning,
    ConfigError,
    InputError,
)
from bertforge.data.instances import IGNORE_INDEX
from bertforge.heads import classifier_dropout
from bertforge.tasks.base import classification_loss
from bertforge.tasks.choice import multiple_choice_loss
from bertforge.tasks.sentence import multi_label_loss, regression_loss, sequence_classification_loss
from bertforge.tasks.squad import span_loss
from bertforge.tasks.tagging import token_classification_loss
from tests.conftest import ODD

transformers = pytest.importorskip("transformers")

# The odd sizes of conftest.ODD (vocab 1,003, hidden 96, 3 layers, 6 heads, FFN 200), with a
# short position table to keep the models small.
SMALL = dict(ODD, max_position_embeddings=64)
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


@dataclass(frozen=True)
class Head:
    ours: type
    hf_name: str
    fresh: tuple[str, ...]  # tensors a head adds to an encoder-only checkpoint
    labels: dict[int, str] | None = None
    choices: bool = False

    @property
    def hf(self) -> Any:
        return getattr(transformers, self.hf_name)


HEADS = {
    "sequence": Head(
        BertForSequenceClassification,
        "BertForSequenceClassification",
        ("classifier.weight", "classifier.bias"),
        SENTIMENT,
    ),
    "regression": Head(
        BertForSequenceClassification,
        "BertForSequenceClassification",
        ("classifier.weight", "classifier.bias"),
        {0: "similarity"},
    ),
    "token": Head(
        BertForTokenClassification,
        "BertForTokenClassification",
        ("classifier.weight", "classifier.bias"),
        TAGS,
    ),
    "qa": Head(
        BertForQuestionAnswering,
        "BertForQuestionAnswering",
        ("qa_outputs.weight", "qa_outputs.bias"),
    ),
    "choice": Head(
        BertForMultipleChoice,
        "BertForMultipleChoice",
        ("classifier.weight", "classifier.bias"),
        choices=True,
    ),
}


def _batch(choices: bool = False) -> dict[str, torch.Tensor]:
    """A padded batch of pairs: (3, 11), or (2, 3, 9) for multiple choice."""
    g = torch.Generator().manual_seed(1)
    B, T = (6, 9) if choices else (3, 11)
    lengths = torch.tensor([T, T - 3, T - 6] * (B // 3))  # (B,)
    real = torch.arange(T)[None] < lengths[:, None]  # (B, T)
    ids = torch.randint(5, 1000, (B, T), generator=g) * real
    ids[:, 0] = 2
    segment_b = (torch.arange(T)[None] >= lengths[:, None] // 2) & real
    batch = {
        "input_ids": ids,
        "token_type_ids": segment_b.long(),
        "attention_mask": real.long(),
    }
    if choices:
        batch = {k: v.view(2, 3, T) for k, v in batch.items()}  # (B, C, T)
    return batch


def _logits(out: Any) -> tuple[torch.Tensor, ...]:
    if hasattr(out, "start_logits"):
        return out.start_logits, out.end_logits
    return (out.logits,)


def _assert_same_logits(ours: Any, hf: Any, head: Head) -> None:
    batch = _batch(head.choices)
    with torch.no_grad():
        a, b = _logits(ours.eval()(**batch)), _logits(hf.eval()(**batch))
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape and x.abs().max() > 0.5  # logits of a useful size
        assert (x - y).abs().max().item() <= 1e-5


@torch.no_grad()
def _amplify(model: Any, head: Head) -> Any:
    """Head weights of N(0, 1) instead of N(0, 0.02): logits of order 1-10, so that a 1e-5
    tolerance is a strict test of everything beneath the head."""
    params = dict(model.named_parameters())
    for name in head.fresh:  # HF's parameter names and ours are the same for the heads
        params[name].normal_(0.0, 1.0)
    return model


def _config(head: Head) -> BertConfig:
    return BertConfig(**SMALL, id2label=head.labels)


def _hf_config(head: Head) -> Any:
    extra = {"id2label": head.labels} if head.labels else {}
    return transformers.BertConfig(**SMALL, **extra)


def _hf_labels(config: Any, head: Head) -> dict[int, str]:
    return dict(config.id2label) if head.labels else {0: "LABEL_0", 1: "LABEL_1"}


# ------------------------------------------------------------------------------------------------
# Checkpoints both ways, logits identical


@pytest.mark.parametrize("name", list(HEADS))
def test_random_init_round_trips_through_transformers(name: str, tmp_path: Path) -> None:
    head = HEADS[name]
    ours = _amplify(head.ours(_config(head)), head)
    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["architectures"] == [head.hf_name]
    hf = head.hf.from_pretrained(tmp_path / "ours")
    assert hf.config.id2label == (head.labels or {0: "LABEL_0", 1: "LABEL_1"})
    if head.labels:
        assert hf.config.label2id == {v: k for k, v in head.labels.items()}
        assert written["id2label"] == {str(k): v for k, v in head.labels.items()}
    _assert_same_logits(ours, hf, head)

    theirs = _amplify(head.hf(_hf_config(head)).eval(), head)  # transformers' initialisation
    theirs.save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tensor used, nothing fresh
        back = head.ours.from_pretrained(tmp_path / "theirs")
    assert back.config.labels == _hf_labels(theirs.config, head)
    _assert_same_logits(back, theirs, head)


@pytest.mark.parametrize("name", ["sequence", "token", "qa", "choice"])
def test_minilm_with_fresh_head_round_trips_through_transformers(
    name: str, minilm_dir: Path, tmp_path: Path
) -> None:
    head = HEADS[name]
    labels = {"id2label": head.labels} if head.labels else {}
    with pytest.warns(CheckpointWarning) as caught:
        ours = head.ours.from_pretrained(minilm_dir, **labels)
    assert len(caught) == 1  # the pooler (unused by token/QA heads) is ignored quietly
    message = str(caught[0].message)
    assert "freshly initialised" in message
    assert all(t in message for t in head.fresh) and "pooler" not in message
    params = ours.state_dict()
    assert 0.015 < params[head.fresh[0]].std().item() < 0.025  # N(0, initializer_range = 0.02)
    assert not params[head.fresh[1]].any()  # zero bias
    _amplify(ours, head).save_pretrained(tmp_path / "ours")
    hf = head.hf.from_pretrained(tmp_path / "ours")
    _assert_same_logits(ours, hf, head)

    theirs = head.hf.from_pretrained(minilm_dir, **labels).eval()  # transformers' fresh head
    _amplify(theirs, head).save_pretrained(tmp_path / "theirs")
    back = head.ours.from_pretrained(tmp_path / "theirs")
    assert back.config.labels == _hf_labels(theirs.config, head)
    _assert_same_logits(back, theirs, head)


# ------------------------------------------------------------------------------------------------
# Labels in config.json


def test_labels_survive_both_directions(tmp_path: Path) -> None:
    ours = BertForSequenceClassification(BertConfig(**SMALL, id2label=SENTIMENT))
    ours.save_pretrained(tmp_path / "ours")
    hf_config = transformers.BertConfig.from_pretrained(tmp_path / "ours")
    assert hf_config.id2label == SENTIMENT and hf_config.num_labels == 3
    assert hf_config.label2id == {"negative": 0, "neutral": 1, "positive": 2}

    # transformers may write label2id as null when only id2label was given; ids as strings
    theirs = transformers.BertConfig(**SMALL, id2label={0: "ham", 1: "spam"})
    theirs.save_pretrained(tmp_path / "theirs")
    raw = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert raw["id2label"] == {"0": "ham", "1": "spam"}
    config = BertConfig.from_pretrained(tmp_path / "theirs")
    assert config.id2label == {0: "ham", 1: "spam"} and config.label2id == {"ham": 0, "spam": 1}
    assert config.num_labels == 2

    # num_labels alone, as HF: LABEL_i names
    transformers.BertConfig(**SMALL, num_labels=4, problem_type="regression").save_pretrained(
        tmp_path / "four"
    )
    config = BertConfig.from_pretrained(tmp_path / "four")
    assert config.id2label == {i: f"LABEL_{i}" for i in range(4)}
    assert config.problem_type == "regression"


def test_config_without_head_fields_round_trips(tmp_path: Path) -> None:
    config = BertConfig(**SMALL)
    assert config.num_labels == 2 and config.id2label is None  # HF's default: two labels
    assert classifier_dropout(config) == config.hidden_dropout_prob
    config.save(tmp_path / "config.json")
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("id2label", "label2id", "problem_type", "classifier_dropout", "num_labels"):
        assert key not in raw
    assert BertConfig.from_pretrained(tmp_path) == config
    assert transformers.BertConfig.from_pretrained(tmp_path).num_labels == 2

    with_head = config.replace(num_labels=3, classifier_dropout=0.3, problem_type="regression")
    assert with_head.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    assert classifier_dropout(with_head) == 0.3
    with_head.save(tmp_path / "config.json")
    assert BertConfig.from_pretrained(tmp_path) == with_head
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert (hf.num_labels, hf.classifier_dropout, hf.problem_type) == (3, 0.3, "regression")
    # same count keeps the names; another count renames
    named = with_head.replace(id2label=SENTIMENT)
    assert named.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    assert named.replace(num_labels=3).id2label == SENTIMENT
    assert named.replace(num_labels=2).id2label == {0: "LABEL_0", 1: "LABEL_1"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"id2label": {0: "a", 1: "b"}, "label2id": {"a": 1, "b": 0}},
            r"label2id=.* does not invert id2label",
        ),
        ({"id2label": {"x": "a"}}, r"id2label=.*keys must be integers"),
        ({"id2label": {0: "a", 1: "a"}}, r"id2label=.*label names must be unique"),
        ({"id2label": {}}, r"id2label=\{\}: must name at least one label"),
        ({"problem_type": "ranking"}, r"problem_type='ranking': must be None or one of"),
        ({"classifier_dropout": 1.0}, r"classifier_dropout=1.0: must be None or a number"),
        (
            {"id2label": {0: "x"}, "problem_type": "single_label_classification"},
            r"single_label_classification' needs num_labels >= 2",
        ),
    ],
)
def test_label_validation_names_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BertConfig(**changes)


def test_num_labels_validation() -> None:
    config = BertConfig(**SMALL)
    with pytest.raises(ConfigError, match=r"num_labels=0: must be an integer >= 1"):
        config.replace(num_labels=0)
    with pytest.raises(ConfigError, match=r"num_labels=2 does not match id2label, which names 3"):
        config.replace(num_labels=2, id2label=SENTIMENT)
    assert config.replace(label2id={"a": 1, "b": 0}).id2label == {0: "b", 1: "a"}
    with pytest.raises(ConfigError, match="BertForQuestionAnswering .* num_labels must be 2"):
        BertForQuestionAnswering(config.replace(num_labels=3))


# ------------------------------------------------------------------------------------------------
# Checkpoint errors and warnings


def test_num_labels_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    BertForSequenceClassification(BertConfig(**SMALL, id2label=SENTIMENT)).save_pretrained(tmp_path)
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: tensor 'classifier.weight' has shape \(3, 96\) but the config "
        r"needs \(5, 96\): the checkpoint's classifier has 3 labels but the model was built with "
        r"num_labels=5",
    ):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    same = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert same.config.id2label == SENTIMENT  # same count: the checkpoint's names stay


def test_pretraining_checkpoint_into_classifier_ignores_mlm_quietly(tmp_path: Path) -> None:
    BertForPreTraining(BertConfig(**SMALL)).save_pretrained(tmp_path)
    with pytest.warns(CheckpointWarning) as caught:
        model = BertForSequenceClassification.from_pretrained(tmp_path, id2label=TAGS)
    assert [str(w.message) for w in caught] == [
        "2 tensors not in the checkpoint, freshly initialised (train before use): "
        "classifier.weight, classifier.bias"
    ]
    assert model.classifier.weight.shape == (5, 96) and model.config.id2label == TAGS


# ------------------------------------------------------------------------------------------------
# Losses equal transformers' `loss`, given the same logits and labels


def _hf_model(name: str, **config: Any) -> Any:
    torch.manual_seed(0)
    return getattr(transformers, name)(transformers.BertConfig(**SMALL, **config)).eval()


@torch.no_grad()
def test_sequence_losses_match_transformers() -> None:
    batch = _batch()
    hf = _hf_model("BertForSequenceClassification", num_labels=3)
    labels = torch.tensor([2, 0, 1])
    out = hf(**batch, labels=labels)
    assert abs(classification_loss(out.logits, labels) - out.loss) <= 1e-6
    assert abs(sequence_classification_loss(out.logits, labels) - out.loss) <= 1e-6

    hf = _hf_model("BertForSequenceClassification", num_labels=1)  # STS-B regression
    scores = torch.tensor([4.2, 0.5, 2.75])
    out = hf(**batch, labels=scores)
    assert out.logits.shape == (3, 1)
    assert abs(regression_loss(out.logits, scores) - out.loss) <= 1e-6
    assert abs(sequence_classification_loss(out.logits, scores) - out.loss) <= 1e-6
    assert regression_loss(out.logits.bfloat16(), scores).dtype == torch.float32

    hf = _hf_model("BertForSequenceClassification", num_labels=3)
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = hf(**batch, labels=targets)  # float labels: multi-label, as HF picks it
    assert abs(multi_label_loss(out.logits, targets) - out.loss) <= 1e-6
    assert abs(sequence_classification_loss(out.logits, targets) - out.loss) <= 1e-6


@torch.no_grad()
def test_token_loss_matches_transformers_with_ignored_pieces() -> None:
    batch = _batch()
    hf = _hf_model("BertForTokenClassification", num_labels=5)
    labels = torch.randint(
        0, 5, batch["input_ids"].shape, generator=torch.Generator().manual_seed(3)
    )
    labels[batch["attention_mask"] == 0] = IGNORE_INDEX  # padding
    labels[:, 0] = IGNORE_INDEX  # [CLS]
    labels[:, 3::2] = IGNORE_INDEX  # continuation pieces: only first pieces are labelled
    out = hf(**batch, labels=labels)
    assert abs(token_classification_loss(out.logits, labels) - out.loss) <= 1e-6
    everything_ignored = torch.full_like(labels, IGNORE_INDEX)
    assert token_classification_loss(out.logits, everything_ignored) == 0  # HF: NaN


@torch.no_grad()
def test_span_loss_matches_transformers_outside_the_window() -> None:
    batch = _batch()  # T = 11
    hf = _hf_model("BertForQuestionAnswering")
    cases = [
        (torch.tensor([3, 0, 5]), torch.tensor([4, 0, 7])),  # inside; [CLS] = no answer
        (torch.tensor([3, 11, 40]), torch.tensor([4, 12, 2])),  # past the window: ignored
        (torch.tensor([-3, 11, 2]), torch.tensor([5, 11, 2])),  # negative: clamped to 0
        (torch.tensor([[3], [1], [9]]), torch.tensor([[4], [2], [10]])),  # (B, 1)
    ]
    for start, end in cases:
        out = hf(**batch, start_positions=start, end_positions=end)
        ours = span_loss(out.start_logits, out.end_logits, start, end)
        assert abs(ours - out.loss) <= 1e-6, (start, end)
    outside = torch.tensor([11, 20, 99])
    assert span_loss(out.start_logits, out.end_logits, outside, outside) == 0  # HF: NaN


@torch.no_grad()
def test_multiple_choice_loss_matches_transformers() -> None:
    batch = _batch(choices=True)
    hf = _hf_model("BertForMultipleChoice")
    labels = torch.tensor([2, 0])
    out = hf(**batch, labels=labels)
    assert out.logits.shape == (2, 3)
    assert abs(multiple_choice_loss(out.logits, labels) - out.loss) <= 1e-6


# ------------------------------------------------------------------------------------------------
# Shapes, training, errors


def test_heads_train_and_give_clear_errors() -> None:
    config = BertConfig(**SMALL, id2label=TAGS, classifier_dropout=0.2)
    model = BertForTokenClassification(config).train()
    batch = _batch()
    labels = torch.zeros_like(batch["input_ids"])
    loss = token_classification_loss(model(**batch).logits, labels)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.p == 0.2
    with torch.no_grad():  # dropout on the classifier input only in training
        assert not torch.equal(model(**batch).logits, model(**batch).logits)
        model.eval()
        assert torch.equal(model(**batch).logits, model(**batch).logits)

    with pytest.raises(InputError, match=r"labels contains 7: must be in \[0, 5\) or -100"):
        token_classification_loss(model(**batch).logits, labels + 7)
    with pytest.raises(InputError, match=r"labels have shape \(3,\), expected \(3, 11\)"):
        token_classification_loss(model(**batch).logits, labels[:, 0])
    with pytest.raises(InputError, match="must be integer class ids"):
        classification_loss(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(InputError, match=r"start_positions must be integer token indices"):
        span_loss(torch.zeros(3, 11), torch.zeros(3, 11), torch.zeros(2, dtype=torch.long), labels)

    choice = BertForMultipleChoice(BertConfig(**SMALL))
    with pytest.raises(InputError, match=r"input_ids must be \(batch, num_choices, seq_len\)"):
        choice(**batch)
    mc = _batch(choices=True)
    with pytest.raises(InputError, match=r"attention_mask has shape \(6, 9\)"):
        choice(mc["input_ids"], attention_mask=mc["attention_mask"].view(6, 9))
    assert choice(**mc).logits.shape == (2, 3)
    assert choice(**mc).encoder.last_hidden_state.shape == (6, 9, 96)  # (B*C, T, H)
