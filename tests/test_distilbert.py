"""DistilBERT checkpoints (model_type "distilbert"): loaded into the encoder and its heads,
saved back in DistilBERT's layout, and used by the pipelines, fine-tuning and the probe."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertModel
from bertforge.cli import main
from bertforge.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.pipelines import Pipeline

transformers = pytest.importorskip("transformers")

ODD = dict(
    vocab_size=1003, dim=96, n_layers=3, n_heads=6, hidden_dim=200, max_position_embeddings=64
)
CLASSES = [  # theirs, ours, their output, our output
    ("DistilBertModel", BertModel, "last_hidden_state", "last_hidden_state"),
    ("DistilBertForMaskedLM", BertForMaskedLM, "logits", "mlm_logits"),
    ("DistilBertForSequenceClassification", BertForSequenceClassification, "logits", "logits"),
    ("DistilBertForTokenClassification", BertForTokenClassification, "logits", "logits"),
    ("DistilBertForQuestionAnswering", BertForQuestionAnswering, "end_logits", "end_logits"),
    ("DistilBertForMultipleChoice", BertForMultipleChoice, "logits", "logits"),
]


@pytest.mark.parametrize("sinusoidal", [False, True])
@pytest.mark.parametrize("theirs, ours, out_theirs, out_ours", CLASSES)
def test_distilbert_outputs_in_both_directions_of_saving(
    tmp_path: Path, sinusoidal: bool, theirs: str, ours: type, out_theirs: str, out_ours: str
) -> None:
    torch.manual_seed(0)
    labels = 2 if "QuestionAnswering" in theirs else 3
    config = transformers.DistilBertConfig(
        **ODD, sinusoidal_pos_embds=sinusoidal, num_labels=labels
    )
    hf = getattr(transformers, theirs)(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    shape = (2, 3, 9) if "MultipleChoice" in theirs else (2, 9)
    ids = torch.randint(0, ODD["vocab_size"], shape)
    mask = torch.ones_like(ids)
    mask[..., 6:] = 0
    mask[0, ..., :] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every tensor found, none fresh, none ignored
        model = ours.from_pretrained(tmp_path / "hf")
    assert model.config.model_type == "distilbert" and model.config.type_vocab_size == 0
    with torch.no_grad():
        want = getattr(hf(input_ids=ids, attention_mask=mask), out_theirs)
        got = getattr(model(ids, None, mask), out_ours)
    assert torch.allclose(got, want, atol=1e-5)
    model.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "distilbert" and saved["architectures"] == [theirs]
    assert saved["dim"] == 96 and "hidden_size" not in saved and "type_vocab_size" not in saved
    back, info = getattr(transformers, theirs).from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        again = getattr(back.eval()(input_ids=ids, attention_mask=mask), out_theirs)
    assert torch.allclose(again, want, atol=1e-5)
    if sinusoidal:  # fixed positions, as HF: not trained
        fresh = ours(BertConfig.from_pretrained(tmp_path / "ours"))
        body = getattr(fresh, "bert", fresh)
        assert not body.embeddings.position.weight.requires_grad
        assert torch.allclose(
            body.embeddings.position.weight,
            getattr(hf, hf.base_model_prefix, hf).embeddings.position_embeddings.weight,
            atol=1e-5,  # HF computes the angles in float32
        )


@pytest.fixture(scope="module")
def distil_dir(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A random small DistilBERT with the MiniLM vocabulary (masked-LM head)."""
    out = tmp_path_factory.mktemp("distil")
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(
        vocab_size=30522, dim=64, n_layers=2, n_heads=2, hidden_dim=128, sinusoidal_pos_embds=True
    )
    transformers.DistilBertForMaskedLM(config).save_pretrained(out)
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, out / name)
    return out


def test_pipelines_finetuning_and_probe_on_a_distilbert(
    distil_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from bertforge.probe import probe
    from bertforge.train.finetune import FinetuneConfig, run
    from tests.task_files import keyword_table

    hf = transformers.DistilBertModel.from_pretrained(distil_dir).eval()
    texts = ["a fine film about music", "the story was dull", "hi"]
    tok = transformers.AutoTokenizer.from_pretrained(distil_dir)
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = hf(**batch).last_hidden_state
    pipe = Pipeline(distil_dir, precision="fp32")
    feats = pipe.features(texts)
    for i, f in enumerate(feats):
        n = int(batch["attention_mask"][i].sum())
        assert np.abs(f["values"] - h[i, :n].numpy()).max() < 1e-5
    cls = pipe.embed(texts, pooling="cls", normalize=False)
    assert np.abs(cls - h[:, 0].numpy()).max() < 1e-5
    assert pipe.fill_mask(["the [MASK] was dull"])[0][0][0]["token"]  # the MLM head loads
    assert main(["info", str(distil_dir)]) == 0
    assert "distilbert" in capsys.readouterr().out.lower()
    # fine-tuning keeps the layout: transformers loads the classifier, same logits
    train = keyword_table(tmp_path / "train.tsv", 48, seed=0)
    run(
        FinetuneConfig(
            model=str(distil_dir),
            task="sst2",
            train=str(train),
            dev=str(train),
            out=str(tmp_path / "clf"),
            epochs=1,
            batch_size=16,
            progress=False,
        )
    )
    clf = transformers.DistilBertForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    with torch.no_grad():
        want = clf(**batch).logits.softmax(-1)
    got = Pipeline(tmp_path / "clf", precision="fp32").classify(texts)
    assert (
        np.abs(np.array([[g["scores"]["0"], g["scores"]["1"]] for g in got]) - want.numpy()).max()
        < 1e-5
    )
    assert (
        main(["attention", str(tmp_path / "clf"), "a fine film", "--out", str(tmp_path / "a.png")])
        == 0
    )
    if __import__("importlib").util.find_spec("onnxruntime"):  # the export checks itself
        assert main(["export", str(tmp_path / "clf"), "--onnx", str(tmp_path / "m.onnx")]) == 0
        assert "BertForSequenceClassification: logits" in capsys.readouterr().out
    # seed 004's recipe: [CLS] of the last layer + logistic regression
    labels = [int(line.rsplit("\t", 1)[1]) for line in train.read_text().splitlines()[1:]]
    sentences = [line.rsplit("\t", 1)[0] for line in train.read_text().splitlines()[1:]]
    rows = probe(
        str(distil_dir),
        (sentences, labels),
        (sentences, labels),
        ["-1"],
        pooling="cls",
        precision="fp32",
    )
    assert rows[0]["dim"] == 64 and 0.0 <= rows[0]["dev_accuracy"] <= 1.0
