"""`bertforge attention MODEL "text"`: look inside the attention heads.

    --out view.html   a self-contained head view (no network): the tokens on both sides, a line
                      from each token to every token it attends to, as thick and dark as the
                      attention weight; selectors for layer and head (or all heads, averaged);
                      hover a token to see only its lines
    --out view.png    a heatmap of one layer's head (or the heads' mean): rows attend to columns

The probabilities are the model's own (output_attentions=True: softmax(QK^T / sqrt(d)) over
the real tokens), for one text or a text pair, cut where the model stops reading (or at
--max-length) with a warning; an HTML view of more than HTML_NUMBERS weights, and a PNG of
more than PNG_SIDE pixels a side (184 pieces), are refused naming the --max-length that fits.
"""

from __future__ import annotations

import html
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from .errors import ConfigError
from .fileio import write_text
from .model import BertModel
from .modeldir import ModelDir


def attention_maps(
    model_dir: str | os.PathLike[str] | ModelDir,
    text: str,
    pair: str | None = None,
    max_length: int | None = None,
) -> tuple[list[str], np.ndarray]:
    """(tokens, probabilities (layers, heads, T, T)) of one input, cut at what the model reads
    (the tokenizer's model_max_length and the model's positions, or the shorter max_length),
    with a warning saying how many pieces were left out."""
    source = ModelDir.open(model_dir)
    tok = source.tokenizer
    # no pooler: the maps need none, and a masked LM has none to load (a warning of fresh weights)
    with source.reading():
        model = BertModel.from_pretrained(source.path, add_pooling_layer=False).eval()
    limit = min(tok.model_max_length, model.config.max_tokens)
    if max_length is not None and not 3 <= max_length <= limit:
        raise ConfigError(
            f"--max-length {max_length}: "
            + (f"more than this model's {limit} positions" if max_length > limit else "below 3")
        )
    cut = limit if max_length is None else max_length
    whole = len(tok.encode(text, pair, truncation=False).ids)
    if whole > cut:
        warnings.warn(
            f"the input has {whole} pieces: the last {whole - cut} left out (--max-length "
            f"{cut}; the model reads at most {limit})",
            stacklevel=2,
        )
    batch = tok([text], None if pair is None else [pair], max_length=cut)
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    probs = torch.stack([a[0] for a in out.attentions]).float().numpy()  # (L, nh, T, T)
    return tok.encode(text, pair, max_length=cut).tokens, probs


def _select(probs: np.ndarray, layer: int, head: int | None) -> np.ndarray:
    L, H = probs.shape[:2]
    if not -L <= layer < L:
        raise ConfigError(f"layer {layer}: this model has layers 0..{L - 1} (or -{L}..-1)")
    if head is not None and not 0 <= head < H:
        raise ConfigError(f"head {head}: this model has heads 0..{H - 1}")
    return probs[layer].mean(0) if head is None else probs[layer, head]


# A PNG heatmap keeps every piece's label legible: 0.35 inch a piece (8 pt labels) at PNG_DPI,
# so its side grows with the pieces; 512 would be some 21,700 px square, 1.9 GB of pixels for
# matplotlib to draw. PNG_SIDE px (184 pieces) is the most it draws; a longer input is refused
# with the --max-length that fits, as an HTML view of more than HTML_NUMBERS weights is.
PNG_DPI, PNG_INCHES_PER_PIECE, PNG_SIDE = 120, 0.35, 8_000
PNG_PIECES = math.floor((PNG_SIDE / PNG_DPI - 2) / PNG_INCHES_PER_PIECE)  # 184


def write_png(
    path: Path, tokens: list[str], probs: np.ndarray, layer: int, head: int | None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .fileio import atomic_path

    m = _select(probs, layer, head)
    n = len(tokens)
    width = max(4, PNG_INCHES_PER_PIECE * n + 2)  # inches: the pieces and the colour bar
    if round(width * PNG_DPI) > PNG_SIDE:
        raise ConfigError(
            f"--out {path}: a PNG of {n} pieces is {round(width * PNG_DPI):,} pixels a side, "
            f"more than {PNG_SIDE:,}: too big to draw or view; pass --max-length {PNG_PIECES} "
            "(or less)"
        )
    fig, ax = plt.subplots(figsize=(width, max(4, PNG_INCHES_PER_PIECE * n + 1.5)))
    im = ax.imshow(m, cmap="Blues", vmin=0, vmax=max(float(m.max()), 1e-6))
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(n), tokens, fontsize=8)
    ax.set_xlabel("attended to")
    ax.set_ylabel("attending token")
    ax.set_title(
        f"layer {layer % probs.shape[0]}, " + ("mean of heads" if head is None else f"head {head}")
    )
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=PNG_DPI)
    plt.close(fig)


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>attention: __TITLE__</title>
<style>
body { font-family: sans-serif; margin: 16px; }
#controls { margin-bottom: 8px; }
text { font-size: 13px; cursor: default; }
text.dim { fill: #bbb; }
</style></head>
<body>
<div id="controls">layer <select id="layer"></select> head <select id="head"></select>
<span id="hint">(hover a token)</span></div>
<svg id="view"></svg>
<script>
const DATA = __DATA__;
const tokens = DATA.tokens, att = DATA.attention;  // att[layer][head][from][to]
const L = att.length, H = att[0].length, n = tokens.length, rowH = 20, width = 420;
const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
for (let l = 0; l < L; l++) layerSel.add(new Option(String(l), String(l)));
headSel.add(new Option("all (mean)", "all"));
for (let h = 0; h < H; h++) headSel.add(new Option(String(h), String(h)));
layerSel.value = String(DATA.layer); headSel.value = DATA.head === null ? "all" : String(DATA.head);
const svg = document.getElementById("view");
svg.setAttribute("width", width); svg.setAttribute("height", n * rowH + 20);
const NS = "http://www.w3.org/2000/svg";
function matrix() {
  const l = +layerSel.value, hs = headSel.value === "all" ? [...Array(H).keys()] : [+headSel.value];
  const m = [];
  for (let i = 0; i < n; i++) { m.push(new Array(n).fill(0));
    for (const h of hs) for (let j = 0; j < n; j++) m[i][j] += att[l][h][i][j] / hs.length; }
  return m;
}
function draw(focus) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const m = matrix();
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    if (focus !== null && focus !== i) continue;
    const w = m[i][j]; if (w < 0.01) continue;
    const line = document.createElementNS(NS, "line");
    line.setAttribute("x1", 130); line.setAttribute("y1", 14 + i * rowH);
    line.setAttribute("x2", width - 130); line.setAttribute("y2", 14 + j * rowH);
    line.setAttribute("stroke", "rgb(31,119,180)"); line.setAttribute("stroke-opacity", w);
    line.setAttribute("stroke-width", 1 + 3 * w); svg.appendChild(line);
  }
  for (const [side, x, anchor] of [["left", 125, "end"], ["right", width - 125, "start"]])
    tokens.forEach((t, i) => {
      const el = document.createElementNS(NS, "text");
      el.setAttribute("x", x); el.setAttribute("y", 18 + i * rowH);
      el.setAttribute("text-anchor", anchor); el.textContent = t;
      if (focus !== null && focus !== i && side === "left") el.setAttribute("class", "dim");
      if (side === "left") { el.addEventListener("mouseenter", () => draw(i));
                             el.addEventListener("mouseleave", () => draw(null)); }
      svg.appendChild(el);
    });
}
layerSel.onchange = headSel.onchange = () => draw(null);
draw(null);
</script></body></html>
"""


# The most attention weights an HTML view holds: 2 million numbers make a page of some 16 MB
# (BERT-base: 117 pieces, MiniLM-L6: 166) that a browser still opens and redraws; BERT-base at
# 512 pieces would be 38 million.
HTML_NUMBERS = 2_000_000


def write_html(
    path: Path, tokens: list[str], probs: np.ndarray, layer: int, head: int | None, title: str
) -> None:
    _select(probs, layer, head)  # validates layer and head
    L, H, T = probs.shape[:3]
    if probs.size > HTML_NUMBERS:
        fits = math.isqrt(HTML_NUMBERS // (L * H))
        raise ConfigError(
            f"--out {path}: an HTML view of {T} pieces holds {probs.size:,} numbers ({L} layers "
            f"x {H} heads x {T} x {T}), more than {HTML_NUMBERS:,}: a page too big to use; pass "
            f"--max-length {fits} (or less), or write a .png of one layer"
        )
    data = {
        "tokens": tokens,
        # rounded in float64: float32's 0.0123 is 0.012299999594688416 in JSON, 2.5 times longer
        "attention": np.round(probs.astype(np.float64), 4).tolist(),
        "layer": layer % probs.shape[0],
        "head": head,
    }
    payload = json.dumps(data).replace("</", "<\\/")  # nothing in the data can close the script
    page = PAGE.replace("__TITLE__", html.escape(title[:80])).replace("__DATA__", payload)
    write_text(path, page)


def render(
    model_dir: str,
    text: str,
    out: str,
    *,
    pair: str | None = None,
    layer: int = -1,
    head: int | None = None,
    max_length: int | None = None,
) -> Path:
    """Write the view (.html or .png by the suffix of `out`) of the input's first `max_length`
    pieces (None: as many as the model reads)."""
    path = Path(out)
    if path.suffix.lower() not in (".html", ".png"):
        raise ConfigError(f"{out}: the output must end in .html or .png")
    tokens, probs = attention_maps(model_dir, text, pair, max_length)
    if path.suffix.lower() == ".png":
        write_png(path, tokens, probs, layer, head)
    else:
        write_html(path, tokens, probs, layer, head, text)
    return path
