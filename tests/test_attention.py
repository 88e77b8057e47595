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


def test_long_texts_are_cut_at_the_models_positions_and_big_views_refused(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """A text longer than the model reads is cut at its positions (40 here, fewer than the
    tokenizer's 512), with a warning saying how many pieces were left out (--max-length cuts
    shorter); an HTML view of more than 2 million numbers is refused, naming --max-length."""
    from tests.conftest import save_tiny

    short = save_tiny(tmp_path / "short", minilm_dir, max_position_embeddings=40)
    text = " ".join(["word"] * 100)  # [CLS] + 100 pieces + [SEP]
    with pytest.warns(UserWarning, match="102 pieces: the last 62 left out"):
        tokens, probs = attention_maps(short, text)
    assert len(tokens) == 40 and tokens[-1] == "[SEP]" and probs.shape == (2, 2, 40, 40)
    with pytest.warns(UserWarning, match="the last 92 left out .--max-length 10."):
        tokens, probs = attention_maps(short, text, max_length=10)
    assert len(tokens) == 10 and probs.shape == (2, 2, 10, 10)
    out = tmp_path / "v.html"
    assert main(["attention", str(short), text, "--max-length", "41", "--out", str(out)]) == 2
    assert "--max-length 41: more than this model's 40 positions" in capsys.readouterr().err
    # 2 layers x 32 heads x 300^2 = 5.8M numbers: refused; at 250 pieces 4.0M, at 176 1.98M
    wide = save_tiny(tmp_path / "wide", minilm_dir, num_attention_heads=32)
    text = " ".join(["word"] * 298)
    assert main(["attention", str(wide), text, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "5,760,000 numbers" in err and "--max-length 176" in err and not out.exists()
    with pytest.warns(UserWarning, match="the last 124 left out"):
        assert main(["attention", str(wide), text, "--max-length", "176", "--out", str(out)]) == 0
    assert out.stat().st_size < 20e6


def test_a_png_too_big_to_draw_is_refused_naming_the_max_length_that_fits(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """A PNG is 0.35 inch a piece at 120 dpi: 300 pieces would be 12,840 px a side (512 some
    21,700, 1.9 GB of pixels to draw); refused above 8,000 px, naming --max-length 184, which
    draws a PNG of at most 8,000 px a side."""
    from tests.conftest import save_tiny

    model = save_tiny(tmp_path / "tiny", minilm_dir)
    text = " ".join(["word"] * 298)  # [CLS] + 298 pieces + [SEP]
    out = tmp_path / "v.png"
    assert main(["attention", str(model), text, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a PNG of 300 pieces is 12,840 pixels a side, more than 8,000" in err
    assert "--max-length 184" in err and not out.exists()
    with pytest.warns(UserWarning, match="the last 116 left out"):
        assert main(["attention", str(model), text, "--max-length", "184", "--out", str(out)]) == 0
    header = out.read_bytes()[:24]  # PNG signature, IHDR: width and height, big-endian
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert 7_000 < width <= 8_000 and 7_000 < height <= 8_000
