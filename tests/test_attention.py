"""Attention views: the probabilities against transformers', the self-contained HTML (and a
screenshot of it in headless Chromium, where installed), the PNG heatmap."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import Tokenizer
from bertforge.attention import attention_maps
from bertforge.cli import main
from bertforge.errors import ConfigError

TEXT = "The cat sat on the mat."
PAIR = "It was warm there."


def test_attention_matches_transformers(minilm_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tokens, probs = attention_maps(minilm_dir, TEXT, PAIR)
    hf = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(**Tokenizer.from_pretrained(minilm_dir)([TEXT], [PAIR]), output_attentions=True)
    want = torch.stack([a[0] for a in ref.attentions]).numpy()
    assert probs.shape == want.shape == (6, 12, len(tokens), len(tokens))
    assert np.abs(probs - want).max() < 1e-5
    assert np.allclose(probs.sum(-1), 1, atol=1e-5) and tokens[0] == "[CLS]"


def test_html_and_png_views(tmp_path: Path, minilm_dir: Path) -> None:
    page = tmp_path / "view.html"
    assert (
        main(
            [
                "attention",
                str(minilm_dir),
                TEXT,
                "--pair",
                PAIR,
                "--out",
                str(page),
                "--layer",
                "2",
                "--head",
                "5",
            ]
        )
        == 0
    )
    text = page.read_text()
    assert '"tokens": ["[CLS]", "the", "cat"' in text and '"layer": 2, "head": 5' in text
    # self-contained: no scripts, styles or images fetched from anywhere
    assert "src=" not in text and "href=" not in text and "@import" not in text
    png = tmp_path / "view.png"
    assert main(["attention", str(minilm_dir), TEXT, "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="layer 7"):
        from bertforge.attention import render

        render(str(minilm_dir), TEXT, str(tmp_path / "x.html"), layer=7)
    assert main(["attention", str(minilm_dir), TEXT, "--out", str(tmp_path / "v.svg")]) == 2


def test_html_view_renders_in_headless_chromium(tmp_path: Path, minilm_dir: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed (Debian: apt install chromium)")
    import matplotlib.image

    page = tmp_path / "view.html"
    assert main(["attention", str(minilm_dir), TEXT, "--out", str(page), "--layer", "0"]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=600,400",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    img = matplotlib.image.imread(shot)[..., :3]  # (H, W, 3) floats in [0, 1]
    blue = (img[..., 2] > img[..., 0] + 0.15) & (img[..., 2] > 0.5)  # the attention lines
    dark = img.sum(-1) < 0.6  # the token labels
    # the script ran: lines between the two columns (x 146..306 in the page: the SVG is 420
    # wide after a 16 px margin), token labels left of them and right of them
    assert blue[:, 150:300].sum() > 500, "no attention lines rendered"
    assert dark[:, :140].sum() > 100 and dark[:, 310:440].sum() > 100, "no token labels rendered"
