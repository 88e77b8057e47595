"""ONNX export: onnxruntime matches PyTorch on a batch of another shape than the traced one."""

from __future__ import annotations

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
