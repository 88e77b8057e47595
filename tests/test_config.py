from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge import BertConfig, ConfigError
from bertforge.config import GOOGLE_KEYS, SIZES


def test_named_sizes_match_the_paper() -> None:
    expected = {
        "tiny": (2, 128, 2),
        "mini": (4, 256, 4),
        "small": (4, 512, 8),
        "medium": (8, 512, 8),
        "base": (12, 768, 12),
        "large": (24, 1024, 16),
    }
    assert expected == SIZES
    for name, (layers, hidden, heads) in expected.items():
        c = BertConfig.from_size(name)
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (
            layers,
            hidden,
            heads,
        )
        assert c.intermediate_size == 4 * hidden


def test_from_size_overrides_and_unknown_name() -> None:
    assert BertConfig.from_size("mini", vocab_size=8000).vocab_size == 8000
    with pytest.raises(ConfigError, match="model size 'huge'.*tiny, mini"):
        BertConfig.from_size("huge")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"hidden_size": 100, "num_attention_heads": 3},
            r"hidden_size=100 is not divisible by num_attention_heads=3",
        ),
        ({"num_hidden_layers": 0}, r"num_hidden_layers=0: must be >= 1"),
        ({"hidden_dropout_prob": 1.5}, r"hidden_dropout_prob=1.5: must be in \[0, 1\)"),
        ({"hidden_act": "tanh"}, r"hidden_act='tanh': must be one of gelu"),
        ({"hidden_size": "768"}, r"hidden_size='768': must be an integer"),
        ({"vocab_size": True}, r"vocab_size=True: must be an integer"),
        ({"pad_token_id": 40000}, r"pad_token_id=40000: must be in \[0, vocab_size=30522\)"),
        ({"position_embedding_type": "relative_key"}, r"position_embedding_type='relative_key'"),
        ({"layer_norm_eps": 0}, r"layer_norm_eps=0.0: must be in \(0, 1\)"),
        ({"id2label": {0: "a", 2: "b"}}, r"id2label=.*keys must be 0..1"),
    ],
)
def test_validation_names_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BertConfig(**changes)


def test_hf_config_json_round_trip(minilm_dir: Path, tmp_path: Path) -> None:
    import transformers

    c = BertConfig.from_pretrained(minilm_dir)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (6, 384, 12)
    assert c.extras["gradient_checkpointing"] is False  # unknown keys survive
    c.save(tmp_path / "config.json")
    again = BertConfig.from_pretrained(tmp_path)
    assert again == c
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    for key in (*GOOGLE_KEYS, "layer_norm_eps", "pad_token_id"):
        assert getattr(hf, key) == getattr(c, key), key


def test_google_bert_config_json(tmp_path: Path) -> None:
    google = {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": 1024,
        "max_position_embeddings": 512,
        "num_attention_heads": 4,
        "num_hidden_layers": 4,
        "type_vocab_size": 2,
        "vocab_size": 30522,
    }
    (tmp_path / "bert_config.json").write_text(json.dumps(google))
    c = BertConfig.from_pretrained(tmp_path)  # found without a config.json
    assert c == BertConfig.from_size("mini")
    c.save(tmp_path / "out.json", google=True)
    assert json.loads((tmp_path / "out.json").read_text()) == google


def test_labels_round_trip(tmp_path: Path) -> None:
    c = BertConfig.from_size("tiny", id2label={0: "negative", 1: "positive"})
    assert c.label2id == {"negative": 0, "positive": 1} and c.num_labels == 2
    c.save(tmp_path / "config.json")
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["id2label"] == {"0": "negative", "1": "positive"}  # HF's string keys
    assert BertConfig.from_pretrained(tmp_path).id2label == {0: "negative", 1: "positive"}


def test_bad_files_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 128,\n "num_attention_heads": }')
    with pytest.raises(ConfigError, match=r"config.json: line 2, column 25: invalid JSON"):
        BertConfig.from_pretrained(tmp_path)
    bad.write_text('{"hidden_size": 100, "num_attention_heads": 3}')
    with pytest.raises(ConfigError, match=r"config.json: hidden_size=100 is not divisible"):
        BertConfig.from_pretrained(tmp_path)
    bad.write_text('{"model_type": "deberta-v2"}')
    with pytest.raises(ConfigError, match="config.json: model_type='deberta-v2' is not supported"):
        BertConfig.from_pretrained(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="empty: no config.json or bert_config.json"):
        BertConfig.from_pretrained(empty)


@pytest.mark.parametrize("key", ["is_decoder", "add_cross_attention"])
def test_a_decoder_config_is_refused_naming_the_file(tmp_path: Path, key: str) -> None:
    """transformers' BertModel attends causally (is_decoder) or to an encoder's states
    (add_cross_attention): bertforge's encoder would attend both ways, so the file is refused
    rather than its key kept as an unused extra."""
    config = BertConfig.from_size("tiny").to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**config, key: True}))
    with pytest.raises(ConfigError, match=rf"config.json: {key}=True: a BERT decoder"):
        BertConfig.from_pretrained(tmp_path)
    # older transformers write both keys, false: an encoder
    (tmp_path / "config.json").write_text(json.dumps({**config, key: False}))
    assert BertConfig.from_pretrained(tmp_path).hidden_size == 128
