"""Texts of any length in linear memory and time (tasks.windows): max-context flags without a
windows x pieces table, rows stitched and pooled as their batches come, and a 5 MB line through
`embed` and `features` under a stated peak RSS."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from bertforge import embedding
from bertforge.embedding import POOLINGS
from bertforge.pipelines import Pipeline
from bertforge.tasks.windows import max_context_flags, split, stitch, windows_of

LONG = "The committee met on Tuesday to discuss the harbour, its budget and the new bridge. " * 60
PROSE = (
    "It was late in the autumn when the surveyors came back from the hills, their notebooks "
    "full of measurements nobody in the village could read. The mayor, a careful man who kept "
    "the town's accounts in a green ledger, asked them what the numbers meant for the new road. "
    "They told him the river would have to be crossed twice, once near the mill and once below "
    "the old quarry, and that each bridge would cost more than the school had cost in 1908. "
    "He thanked them, wrote the figures down, and said he would put the question to the "
    "council on Thursday; by Friday everyone in the valley had an opinion about it. "
)


def table_flags(spans: list[tuple[int, int]], n: int) -> list[np.ndarray]:
    """The windows x pieces table the flags were computed from before (google-research/bert's
    argmax over every window, the earlier one on a tie): the reference for bit-equality."""
    scores = np.full((len(spans), n), -np.inf)
    for k, (start, length) in enumerate(spans):
        p = np.arange(start, start + length)
        scores[k, p] = np.minimum(p - start, start + length - 1 - p) + 0.01 * length
    best = scores.argmax(0) if n else np.zeros(0, np.int64)
    return [best[start : start + length] == k for k, (start, length) in enumerate(spans)]


def concatenated(windows: list, rows: list[np.ndarray], texts: int) -> list[np.ndarray | None]:
    """Stitching by concatenation, every window's rows at once (the reference for `stitch`)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(texts)]
    last: list[np.ndarray | None] = [None] * texts
    for w, row in zip(windows, rows):
        if not parts[w.text]:
            parts[w.text].append(row[:1])
        parts[w.text].append(row[1:-1][w.best])
        last[w.text] = row[-1:]
    return [None if end is None else np.concatenate([*p, end]) for p, end in zip(parts, last)]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 8, 10, 30, 64, 126])
def test_max_context_flags_are_bit_identical_to_the_table(max_tokens: int) -> None:
    for n in [*range(0, 40), max_tokens - 1, max_tokens, max_tokens + 1, 2 * max_tokens, 257, 1000]:
        for stride in {1, 2, 3, 5, 8, max(1, max_tokens // 2), max_tokens - 1, max_tokens, 200}:
            if n < 0 or stride < 1:
                continue
            spans = windows_of(n, max_tokens, stride)
            for kept in (spans, spans[:1]):  # all windows; truncate: the first only
                got, want = max_context_flags(kept, n), table_flags(kept, n)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert g.dtype == w.dtype and g.shape == w.shape and (g == w).all()


def test_windows_that_would_never_end_are_refused() -> None:
    from bertforge.errors import ConfigError

    for max_tokens, stride in ((10, 0), (10, -2), (0, 5)):
        with pytest.raises(ConfigError, match="both must be >= 1"):
            windows_of(100, max_tokens, stride)


def _peak_bytes(fn: object, *args: object) -> int:
    tracemalloc.start()
    try:
        fn(*args)  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_flags_and_stitching_grow_linearly() -> None:
    """Twice the pieces: twice the memory (not four times), and far below a windows x pieces
    table (the old flags: 8 bytes x 16,000 windows x a million pieces for a 5 MB line)."""
    peaks = []
    for n in (20_000, 40_000):
        spans = windows_of(n, 126, 63)
        flags_peak = _peak_bytes(max_context_flags, spans, n)
        assert flags_peak < 60 * n  # the table: 8 * len(spans) * n, 2,500 * n bytes here
        features, windows = split([SimpleNamespace(ids=list(range(n + 2)))], 128, 63)
        rows = [np.zeros(len(ids), np.float32) for ids in features.input_ids]
        stitch_peak = _peak_bytes(stitch, windows, rows, 1)
        assert stitch_peak < 20 * n  # the answer (4 bytes a piece) and the layout
        peaks.append((flags_peak, stitch_peak))
    for small, large in zip(*peaks):
        assert 1.5 * small < large < 2.5 * small


def test_stitching_rows_in_any_order_equals_concatenation() -> None:
    """Rows come back from the runner in length order; each lands in its place all the same,
    for texts that fit, long texts, truncated ones and a subset of texts."""
    rng = np.random.default_rng(0)

    for _ in range(200):
        encodings = [
            SimpleNamespace(ids=list(range(int(rng.integers(0, 80)) + 2)))
            for _ in range(int(rng.integers(1, 5)))
        ]
        max_length, stride = int(rng.integers(3, 20)), int(rng.integers(1, 20))
        _, windows = split(encodings, max_length, stride, truncate=bool(rng.random() < 0.2))
        listed = list(windows)  # the arrays read as TextWindows, from either end
        assert [w.text for w in listed] == windows.text.tolist() and len(listed) == len(windows)
        assert (windows[-1].best == listed[-1].best).all() and windows[-1].text == listed[-1].text
        rows = [rng.normal(size=(len(w.best) + 2, 3)).astype(np.float32) for w in windows]
        some = [k for k in range(len(windows)) if rng.random() < 0.7]
        for keep in (list(range(len(windows))), some, [k for k in some if windows[k].text % 2]):
            want = concatenated([windows[k] for k in keep], [rows[k] for k in keep], len(encodings))
            got = stitch([windows[k] for k in keep], [rows[k] for k in keep], len(encodings))
            for g, w in zip(got, want):
                assert (g is None) == (w is None)
                assert g is None or (g.dtype == w.dtype and g.shape == w.shape and (g == w).all())


def test_running_pool_equals_pool_of_the_whole_sequence() -> None:
    """Every mode at once, the sequence given in shuffled parts (as windows come)."""
    torch.manual_seed(0)
    h = torch.randn(3000, 16)
    want = embedding.pool(h[None], torch.ones(1, 3000, dtype=torch.long), POOLINGS)[0]
    running = embedding.RunningPool(POOLINGS, 3000)
    order = torch.randperm(3000)
    for part in order.split(97):
        running.add(h[part], part)
    running.add(h[:0], torch.zeros(0, dtype=torch.long))  # a window that owns no piece
    assert torch.allclose(running.vector(), want, atol=1e-5, rtol=1e-5)


def _stitched_states(pipe: Pipeline, texts: list[str]) -> list[Any]:
    """Each text's last hidden states the way embed made them before: every window's states
    at once, stitched by concatenation (a text that fits: its own row)."""
    model = pipe.model_for("embed")
    _, features, windows = pipe.windows(texts, pipe.embedding_settings.max_length)
    with torch.no_grad():
        rows = [
            model(torch.from_numpy(ids)[None]).last_hidden_state[0] for ids in features.input_ids
        ]
    return concatenated(windows, [r.numpy() for r in rows], len(texts))


def _pooled(states: list[np.ndarray], modes: tuple[str, ...]) -> np.ndarray:
    ones = [torch.ones(1, len(s), dtype=torch.long) for s in states]
    return np.stack(
        [
            embedding.pool(torch.from_numpy(s)[None], m, modes)[0].numpy()
            for s, m in zip(states, ones)
        ]
    )


@pytest.mark.filterwarnings("ignore:.*truncate keeps their first window")
@pytest.mark.parametrize("stride, truncate", [(None, False), (24, False), (None, True)])
def test_embed_of_a_long_text_equals_stitching_then_pooling(
    tiny_model: Path, tmp_path: Path, stride: int | None, truncate: bool
) -> None:
    """Every pooling mode, one at a time and all six concatenated (a model directory whose
    Pooling names them all), equals the windows' states stitched and pooled explicitly."""
    texts = [LONG + " Finally, the end.", "a short one", LONG[:700]]
    options = {"precision": "fp32", "max_length": 64, "stride": stride, "truncate": truncate}
    pipe = Pipeline(tiny_model, batch_size=8, **options)
    states = _stitched_states(pipe, texts)
    assert [len(s) for s in states][:2] == ([64] if truncate else [1027]) + [5]
    for mode in POOLINGS:
        got = pipe.embed(texts, pooling=mode, normalize=False)
        assert np.abs(got - _pooled(states, (mode,))).max() < 1e-5, mode

    every = tmp_path / "every"
    every.mkdir()
    for f in tiny_model.iterdir():
        (every / f.name).symlink_to(f)
    (every / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.Transformer"},
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.Pooling",
                },
            ]
        )
    )
    (every / "1_Pooling").mkdir()
    modes = ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
    (every / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": modes}))
    pipe = Pipeline(every, batch_size=8, **options)
    assert len(pipe.embedding_settings.pooling) == 6
    got = pipe.embed(texts)
    want = _pooled(states, pipe.embedding_settings.pooling)
    assert got.shape == (3, 6 * 128) and np.abs(got - want).max() < 1e-5


FIVE_MB = """
import json, sys, time
import numpy as np
from bertforge.pipelines import Pipeline

prose = sys.stdin.read()
text = (prose * (5_000_000 // len(prose) + 1))[:5_000_000]
pipe = Pipeline(sys.argv[1], precision="fp32", max_length=128, batch_size=32)
t = time.perf_counter()
vector = pipe.embed([text])
embed_s = time.perf_counter() - t
t = time.perf_counter()
[item] = pipe.features([text], layers=(-1,))
features_s = time.perf_counter() - t
print(json.dumps({
    "chars": len(text),
    "embed": list(vector.shape),
    "values": list(item["values"].shape),
    "tokens": len(item["tokens"]),
    "finite": bool(np.isfinite(vector).all() and np.isfinite(item["values"]).all()),
    "embed_s": embed_s,
    "features_s": features_s,
    # this process's own peak (VmHWM, kB): not ru_maxrss, which after a fork and exec starts
    # at the parent's peak (pytest's, over 2 GB late in the suite)
    "peak_mb": next(
        int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")
    ) / 1024,
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status: Linux")
def test_a_5_mb_line_through_embed_and_features_in_bounded_memory(tiny_model: Path) -> None:
    """One 5 MB line (1.07 million pieces, 17,000 windows of 128) through embed, then
    features (one layer): peak RSS under 2 GB for both (features' answer alone is 0.55 GB, a
    million pieces x 128 floats; the tokenizer's encoding of the line peaks near 0.75 GB).
    Before, the flags' windows x pieces table alone asked for 136 GiB. Measured on 2 CPU
    cores: embed and features 50 s each when the cores are free (150 s each under load; the
    model's work, linear in the text), peak 1.67 GB (VmHWM, this process's alone; ru_maxrss
    read over 2 GB late in the suite, as it counts pytest's own peak)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIVE_MB), str(tiny_model)],
        input=PROSE,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["chars"] == 5_000_000 and got["embed"] == [1, 128] and got["finite"]
    assert got["values"] == [got["tokens"], 128] and got["tokens"] > 900_000
    assert got["peak_mb"] < 2048, got
