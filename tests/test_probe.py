"""`bertforge probe`: frozen features per layer choice + logistic regression."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.probe import combine
from tests.task_files import keyword_table

pytest.importorskip("sklearn")


def test_combine_layer_choices() -> None:
    f = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)  # N=2, 3 layers + embeddings
    assert np.array_equal(combine(f, "-1"), f[:, 3])
    assert np.array_equal(combine(f, "0"), f[:, 0])
    assert np.array_equal(combine(f, "sum:-1,-2"), f[:, 3] + f[:, 2])
    assert combine(f, "concat:-1,-2").shape == (2, 6)
    assert np.array_equal(combine(f, "sum:all"), f.sum(1))
    with pytest.raises(ConfigError, match="layer 4"):
        combine(f, "4")
    with pytest.raises(ConfigError, match="integers"):
        combine(f, "sum:x")


def test_probe_on_frozen_minilm(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = keyword_table(tmp_path / "train.tsv", 96, seed=0)
    dev = keyword_table(tmp_path / "dev.tsv", 48, seed=1)
    out = tmp_path / "probe.json"
    rc = main(
        [
            "probe",
            "--model",
            str(minilm_dir),
            "--train",
            str(train),
            "--dev",
            str(dev),
            "--layers",
            "-1;0;concat:-1,-2",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["layers"] for r in rows] == ["-1", "0", "concat:-1,-2"]
    assert [r["dim"] for r in rows] == [384, 384, 768]
    # the tone words are easy to read off MiniLM's top layer; all choices beat chance
    assert rows[0]["dev_accuracy"] >= 0.9 and min(r["dev_accuracy"] for r in rows) > 0.6
    assert "best: " in capsys.readouterr().out
