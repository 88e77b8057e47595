"""ONNX export: onnxruntime matches PyTorch on a batch of another shape than the traced one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import Tokenizer
from bertforge.cli import main

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.slow
def test_export_a_classifier_and_run_it(tmp_path: Path, tiny_model: Path) -> None:
    from bertforge import BertConfig
    from bertforge.heads import BertForSequenceClassification
    from tests.conftest import TINY

    tok = Tokenizer.from_pretrained(tiny_model)
    model_dir = tmp_path / "cls"
    torch.manual_seed(0)
    config = BertConfig(
        **{**TINY, "vocab_size": tok.vocab_size, "id2label": {0: "a", 1: "b", 2: "c"}}
    )
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "cls.onnx"
    assert main(["export", str(model_dir), "--onnx", str(out)]) == 0
    session = ort.InferenceSession(str(out))
    batch = tok(["one", "two words", "a third and longer input, with punctuation!", "4", "five"])
    (logits,) = session.run(["logits"], {k: batch[k].numpy() for k in batch})
    with torch.no_grad():
        want = model(**batch).logits.numpy()
    assert logits.shape == (5, 3) and np.abs(logits - want).max() < 1e-4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def _sentence_embeddings(path: Path, tok: Tokenizer, texts: list[str]) -> np.ndarray:
    session = ort.InferenceSession(str(path))
    batch = tok(texts)
    (vectors,) = session.run(["sentence_embedding"], {k: batch[k].numpy() for k in batch})
    return vectors


@pytest.mark.slow
def test_a_sentence_transformers_directory_exports_its_sentence_embedding(
    tmp_path: Path, minilm_dir: Path
) -> None:
    """all-MiniLM-L6-v2 (modules.json: mean pooling, Normalize): the graph's sentence_embedding
    equals SentenceTransformer.encode within 1e-4 on texts of different lengths, padded in one
    batch or each alone; the encoder's outputs stay."""
    st = pytest.importorskip("sentence_transformers")
    texts = [
        "Hi",
        "A man is playing a guitar.",
        "The quick brown fox jumps over the lazy dog near the riverbank at dawn, again and again.",
        "北京是中国的首都",
    ]
    out = tmp_path / "minilm.onnx"
    assert main(["export", str(minilm_dir), "--onnx", str(out)]) == 0
    session = ort.InferenceSession(str(out))
    names = [o.name for o in session.get_outputs()]
    assert names == ["last_hidden_state", "pooler_output", "sentence_embedding"]
    tok = Tokenizer.from_pretrained(minilm_dir)
    together = _sentence_embeddings(out, tok, texts)
    alone = np.concatenate([_sentence_embeddings(out, tok, [t]) for t in texts])
    want = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    assert together.shape == (4, 384)
    assert np.abs(together - want).max() < 1e-4 and np.abs(alone - want).max() < 1e-4


@pytest.mark.slow
def test_every_pooling_mode_goes_into_the_graph(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture
) -> None:
    """A directory pooling with all six modes (in its own order) and normalising: onnxruntime's
    sentence_embedding equals Pipeline.embed's, whatever the padding; a plain BERT directory
    gets it when asked (mean, not normalised, as embed) and not otherwise; a Pooling that
    leaves prompts out gets none (asked for: an error)."""
    from bertforge.pipelines import Pipeline

    every = tmp_path / "every"
    every.mkdir()
    for f in tiny_model.iterdir():
        (every / f.name).symlink_to(f)
    kinds = ("Transformer", "Pooling", "Normalize")
    modules = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{k}"}
        for i, (k, p) in enumerate(zip(kinds, ("", "1_Pooling", "2_Normalize")))
    ]
    (every / "modules.json").write_text(json.dumps(modules))
    (every / "1_Pooling").mkdir()
    modes = ["weightedmean", "lasttoken", "cls", "max", "mean_sqrt_len_tokens", "mean"]
    (every / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": modes}))
    texts = ["one", "two words here", "a third and longer input, with punctuation!", "4"]
    tok = Tokenizer.from_pretrained(tiny_model)
    for model, flags, width in ((every, [], 6 * 128), (tiny_model, ["--sentence-embedding"], 128)):
        out = tmp_path / f"{model.name}.onnx"
        assert main(["export", str(model), "--onnx", str(out), *flags]) == 0
        want = Pipeline(model, precision="fp32").embed(texts)
        together = _sentence_embeddings(out, tok, texts)
        alone = np.concatenate([_sentence_embeddings(out, tok, [t]) for t in texts])
        assert together.shape == (4, width)
        assert np.abs(together - want).max() < 1e-4 and np.abs(alone - want).max() < 1e-4
    plain = tmp_path / "plain.onnx"
    assert main(["export", str(every), "--onnx", str(plain), "--no-sentence-embedding"]) == 0
    outputs = [o.name for o in ort.InferenceSession(str(plain)).get_outputs()]
    assert outputs == ["last_hidden_state", "pooler_output"]
    config = {"pooling_mode": "mean", "include_prompt": False}
    (every / "1_Pooling" / "config.json").write_text(json.dumps(config))
    refused = tmp_path / "refused.onnx"
    assert main(["export", str(every), "--onnx", str(refused), "--sentence-embedding"]) == 2
    assert "include_prompt: false" in capsys.readouterr().err and not refused.exists()
    with pytest.warns(UserWarning, match="no sentence_embedding output"):
        assert main(["export", str(every), "--onnx", str(refused)]) == 0
    outputs = [o.name for o in ort.InferenceSession(str(refused)).get_outputs()]
    assert outputs == ["last_hidden_state", "pooler_output"]


@pytest.mark.slow
def test_a_hub_name_exports_its_sentence_transformers_pooling(
    tmp_path: Path, minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bertforge export sentence-transformers/all-MiniLM-L6-v2` (a hub name; here a fake
    snapshot_download serving the local copy): the graph carries the directory's pooling and
    Normalize by default, as for the local directory: vectors of norm 1 equal to embed's."""
    import huggingface_hub

    from bertforge.pipelines import Pipeline

    def snapshot_download(repo_id: str, allow_patterns: list[str]) -> str:
        assert repo_id == "sentence-transformers/all-MiniLM-L6-v2"
        return str(minilm_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    out = tmp_path / "hub.onnx"
    assert main(["export", "sentence-transformers/all-MiniLM-L6-v2", "--onnx", str(out)]) == 0
    outputs = [o.name for o in ort.InferenceSession(str(out)).get_outputs()]
    assert outputs == ["last_hidden_state", "pooler_output", "sentence_embedding"]
    texts = ["Hi", "A man is playing a guitar.", "北京是中国的首都"]
    vectors = _sentence_embeddings(out, Tokenizer.from_pretrained(minilm_dir), texts)
    want = Pipeline(minilm_dir, precision="fp32").embed(texts)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.abs(vectors - want).max() < 1e-4
