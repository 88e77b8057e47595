"""Checkpoint I/O: the layouts users have, and clear errors for the ones that are broken."""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from bertforge import (
    BertConfig,
    BertForPreTraining,
    BertModel,
    CheckpointError,
    CheckpointWarning,
    ConfigError,
    VocabError,
)
from bertforge.catalogue import inspect
from bertforge.checkpoint import hf_names, hf_state_dict
from bertforge.families import BERT
from tests.conftest import TINY


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    model = BertForPreTraining(BertConfig(**TINY))
    model.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def _ids() -> torch.Tensor:
    return torch.tensor([[2, 17, 300, 41, 3, 0], [2, 99, 5, 3, 0, 0]])


def _same_params(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_key_table_covers_every_parameter_and_round_trips() -> None:
    model = BertForPreTraining(BertConfig(**TINY))
    names = [n for ours in model.state_dict() for n in hf_names(ours)]
    assert len(names) == len(set(names))  # one HF name per tensor
    assert "bert.encoder.layer.1.attention.self.value.weight" in names
    assert "cls.predictions.bias" in names and "cls.seq_relationship.weight" in names
    assert len(BERT.table) == 17  # 15 for the encoder and pre-training heads, 2 task heads
    hf = hf_state_dict(model)
    q = hf["bert.encoder.layer.0.attention.self.query.weight"]
    assert torch.equal(q, model.bert.layers[0].attn["qkv"].weight[:128])


def test_save_load_round_trip(tiny_dir: Path) -> None:
    assert sorted(p.name for p in tiny_dir.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["model_type"] == "bert"
    a = BertForPreTraining.from_pretrained(tiny_dir)
    b = BertForPreTraining.from_pretrained(tiny_dir)
    assert _same_params(a, b) and not a.training
    body = BertModel.from_pretrained(tiny_dir)  # the heads in the file are simply not used
    assert torch.equal(body(_ids()).last_hidden_state, a.bert(_ids()).last_hidden_state)


def test_encoder_only_checkpoint_into_pretraining_model_warns_and_lists_heads(
    minilm_dir: Path,
) -> None:
    with pytest.warns(CheckpointWarning) as caught:
        model = BertForPreTraining.from_pretrained(minilm_dir)
    message = " ".join(str(w.message) for w in caught)
    for head in (
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions",
        "cls.seq_relationship",
    ):
        assert head in message
    encoder = BertModel.from_pretrained(minilm_dir)
    assert _same_params(encoder, model.bert)


def test_prefixed_checkpoint_from_a_task_model_loads_into_the_encoder(tmp_path: Path) -> None:
    import transformers

    hf = transformers.BertForSequenceClassification(
        transformers.BertConfig(**BertConfig(**TINY).to_dict(google=True))
    ).eval()
    hf.save_pretrained(str(tmp_path))
    keys = json.loads((tmp_path / "config.json").read_text())
    assert keys["architectures"] == ["BertForSequenceClassification"]
    ours = BertModel.from_pretrained(tmp_path)
    with torch.no_grad():
        expected = hf.bert(_ids()).last_hidden_state
        assert (ours(_ids()).last_hidden_state - expected).abs().max() < 1e-5


def test_pickle_checkpoint_loads_with_weights_only(tiny_dir: Path, tmp_path: Path) -> None:
    ref = BertForPreTraining.from_pretrained(tiny_dir)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(tiny_dir / "config.json", pickled)
    torch.save(hf_state_dict(ref), pickled / "pytorch_model.bin")
    assert _same_params(BertForPreTraining.from_pretrained(pickled), ref)


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_never_run(tiny_dir: Path, tmp_path: Path) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(tiny_dir / "config.json", evil)
    marker = tmp_path / "pwned"
    torch.save({"weight": _Exploit(marker)}, evil / "pytorch_model.bin")
    with pytest.raises(
        CheckpointError,
        match=r"pytorch_model.bin: cannot read as a PyTorch state dict \(weights_only=True\)",
    ):
        BertModel.from_pretrained(evil)
    assert not marker.exists()


def test_old_tf_names_ddp_prefix_and_bf16_weights(tiny_dir: Path, tmp_path: Path) -> None:
    ref = BertForPreTraining.from_pretrained(tiny_dir)
    renamed = {}
    for name, t in hf_state_dict(ref).items():
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
        renamed["module." + name] = t.to(torch.bfloat16)
    renamed["module.bert.embeddings.position_ids"] = torch.arange(512)[None]  # old HF buffer
    other = tmp_path / "old"
    other.mkdir()
    shutil.copy(tiny_dir / "config.json", other)
    save_file(renamed, str(other / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing ignored, nothing missing: no warning at all
        model = BertForPreTraining.from_pretrained(other)
    assert next(model.parameters()).dtype == torch.float32
    for (n, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), n


def test_sharded_safetensors_with_index(tiny_dir: Path, tmp_path: Path) -> None:
    ref = BertForPreTraining.from_pretrained(tiny_dir)
    state = hf_state_dict(ref)
    names = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(tiny_dir / "config.json", sharded)
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(sharded / file))
    index = {"weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _same_params(BertForPreTraining.from_pretrained(sharded), ref)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError,
        match="names shard files that are missing: model-00002-of-00002.safetensors",
    ):
        BertForPreTraining.from_pretrained(sharded)


def test_missing_files_are_named(tmp_path: Path, tiny_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="no_such_dir: no such file or directory"):
        BertModel.from_pretrained(tmp_path / "no_such_dir")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="empty: no config.json or bert_config.json"):
        BertModel.from_pretrained(empty)
    (tiny_dir / "model.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match=r"tiny: no weights found \(looked for model.safetensors"
    ):
        BertModel.from_pretrained(tiny_dir)


@pytest.mark.parametrize("damage", ["half", "last_bytes", "garbage", "empty"])
def test_truncated_or_corrupt_safetensors(tiny_dir: Path, damage: str) -> None:
    path = tiny_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(
        {
            "half": data[: len(data) // 2],
            "last_bytes": data[:-100],
            "garbage": os.urandom(5000),
            "empty": b"",
        }[damage]
    )
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: corrupt or truncated safetensors file"
    ):
        BertForPreTraining.from_pretrained(tiny_dir)


def test_shape_mismatch_names_tensor_and_both_shapes(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    config["intermediate_size"] = 256
    (tiny_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: tensor 'bert.encoder.layer.0.intermediate.dense.weight' "
        r"has shape \(512, 128\) but the config needs \(256, 128\)",
    ):
        BertForPreTraining.from_pretrained(tiny_dir)


def test_missing_encoder_tensor_is_an_error(tiny_dir: Path) -> None:
    model = BertForPreTraining.from_pretrained(tiny_dir)
    state = hf_state_dict(model)
    del state["bert.encoder.layer.1.output.dense.weight"]
    save_file(state, str(tiny_dir / "model.safetensors"))
    with pytest.raises(
        CheckpointError,
        match=r"missing 1 encoder tensors, e.g. 'bert.encoder.layer.1.output.dense.weight'",
    ):
        BertForPreTraining.from_pretrained(tiny_dir)


def test_vocab_size_mismatch(tiny_dir: Path) -> None:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(600)]
    (tiny_dir / "vocab.txt").write_text("\n".join(tokens) + "\n")
    with pytest.raises(
        VocabError, match=r"vocab.txt has 605 tokens but .*config.json says vocab_size=512"
    ):
        BertModel.from_pretrained(tiny_dir)
    (tiny_dir / "vocab.txt").write_text("\n".join(tokens[:500]) + "\n")
    with pytest.warns(CheckpointWarning, match="500 tokens, fewer than vocab_size=512"):
        BertModel.from_pretrained(tiny_dir)


def test_failed_save_leaves_previous_checkpoint_intact(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = (tiny_dir / "model.safetensors").read_bytes()

    def crash(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr("bertforge.checkpoint.save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        BertForPreTraining(BertConfig(**TINY)).save_pretrained(tiny_dir)
    assert (tiny_dir / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tiny_dir.iterdir()) == ["config.json", "model.safetensors"]


def test_inspect_reads_headers_only(tiny_dir: Path, minilm_dir: Path) -> None:
    info = inspect(tiny_dir)
    assert info.num_parameters == BertForPreTraining(BertConfig(**TINY)).num_parameters()
    assert info.heads == ["pooler", "masked LM (mlm)", "next sentence (nsp)"]
    mini = inspect(minilm_dir)
    assert (
        mini.heads == ["pooler"]
        and mini.num_parameters == BertModel.from_pretrained(minilm_dir).num_parameters()
    )


@pytest.mark.parametrize("text", ['{"hidden_size": 3', "[1, 2]", "\ufffe\xff"])
def test_corrupt_json_files_are_one_error_naming_the_file(
    tiny_dir: Path, tmp_path: Path, text: str
) -> None:
    """Every JSON file bertforge reads (fileio.read_json): truncated, not an object, not UTF-8."""
    from bertforge.data.shards import ShardSet
    from bertforge.errors import BertforgeError
    from bertforge.train.checkpoints import check_run

    (tiny_dir / "model.safetensors").rename(tmp_path / "moved.safetensors")
    cases = [  # in this order: the index is read after a valid config.json
        (
            tiny_dir / "model.safetensors.index.json",
            lambda: BertForPreTraining.from_pretrained(tiny_dir),
        ),
        (tiny_dir / "config.json", lambda: BertForPreTraining.from_pretrained(tiny_dir)),
        (tmp_path / "run" / "run.json", lambda: check_run(tmp_path / "run", None, set())),
        (tmp_path / "shards" / "meta.json", lambda: ShardSet(tmp_path / "shards")),
    ]
    for path, load in cases:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("latin-1", errors="replace"))
        with pytest.raises(BertforgeError) as e:
            load()
        message = str(e.value)
        assert message.startswith(str(path)), message
        assert any(w in message for w in ("invalid JSON", "expected a JSON object", "not UTF-8"))


def _without_pooler(model: torch.nn.Module, out: Path) -> Path:
    """`model` saved with its pooler's tensors left out."""
    model.save_pretrained(out)
    state = {k: v for k, v in hf_state_dict(model).items() if ".pooler." not in k}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_a_head_that_reads_the_pooler_needs_the_trained_pooler(tmp_path: Path) -> None:
    """A classifier (or NSP head) on a freshly initialised pooler gives made-up outputs: for
    inference that is an error naming the file and the tensors; heads that read no pooler
    (token classification, QA, the masked LM) and a bare encoder load as they are."""
    from bertforge.checkpoint import load_trained
    from bertforge.heads import BertForSequenceClassification, BertForTokenClassification

    config = BertConfig(**TINY, id2label={0: "no", 1: "yes"})
    classifier = _without_pooler(BertForSequenceClassification(config), tmp_path / "cls")
    weights = classifier / "model.safetensors"
    pooler = r"bert\.pooler\.dense\.weight, bert\.pooler\.dense\.bias"
    with pytest.raises(CheckpointError, match=rf"^{weights}: has no pooler \({pooler}\)"):
        load_trained(BertForSequenceClassification, classifier, "classifier")
    pretrained = BertForPreTraining(config)
    nsp = _without_pooler(pretrained, tmp_path / "nsp")
    with pytest.raises(CheckpointError, match=r"has no pooler .* which the next-sentence head"):
        load_trained(BertForPreTraining, nsp, "next-sentence head")
    tagger = BertForTokenClassification(config)
    tagger.save_pretrained(tmp_path / "tagger")
    assert _same_params(
        load_trained(BertForTokenClassification, tmp_path / "tagger", "token classifier"), tagger
    )
    encoder = load_trained(BertModel, nsp, "")  # an encoder's pooler is read by no head
    assert _same_params(encoder.layers, pretrained.bert.layers)


@pytest.mark.parametrize(
    ("layout", "value"), [("model.safetensors", math.nan), ("pytorch_model.bin", -math.inf)]
)
def test_non_finite_weights_are_one_error_naming_the_file_and_the_tensor(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture, layout: str, value: float
) -> None:
    """A damaged checkpoint (one number NaN or infinite) loaded the usual way (`embed`, the
    pipelines) is refused, not run: every output would be NaN, or a choice made among NaNs."""
    from safetensors.torch import load_file

    from bertforge.cli import main
    from bertforge.pipelines import Pipeline

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_model, damaged)
    state = load_file(damaged / "model.safetensors")
    name = "bert.encoder.layer.1.output.dense.weight"
    state[name][3, 5] = value
    (damaged / "model.safetensors").unlink()
    if layout == "model.safetensors":
        save_file(state, str(damaged / layout), metadata={"format": "pt"})
    else:
        torch.save(state, damaged / layout)
    message = rf"^{damaged / layout}: tensor '{name}' has 1 number that is not finite \({value}\)"
    with pytest.raises(CheckpointError, match=message):
        Pipeline(damaged).embed(["a sentence"])
    texts = tmp_path / "texts.txt"
    texts.write_text("a sentence\n", encoding="utf-8")
    out = tmp_path / "vectors.jsonl"
    assert main(["embed", str(damaged), str(texts), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{layout}: tensor '{name}'" in err, err
    assert not out.exists()
