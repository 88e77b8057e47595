"""What SentenceTransformer.encode does with a model directory, done by `embed` (bertforge.embedding,
Pipeline.embed, `bertforge embed`) and checked against sentence-transformers itself: prompts
(include_prompt false too), Matryoshka dimensions, pooling_mode lists in their own order, and
quantised embeddings bit for bit equal to its quantize_embeddings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge import embedding
from bertforge.cli import main
from bertforge.embedding import EMBEDDING_PRECISIONS, POOLINGS, quantize
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.pipelines import Pipeline

st = pytest.importorskip("sentence_transformers")

TEXTS = [
    "A man is playing a guitar.",
    "Hi",
    "",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "北京是中国的首都",
    "Résumé of naïve café owners",
]
PROMPTS = {"query": "query: ", "passage": "passage: "}


def copy_of(
    minilm_dir: Path, out: Path, pooling: dict[str, Any] | None = None, **st_config: Any
) -> Path:
    """all-MiniLM-L6-v2 with its files linked, its Pooling config and
    config_sentence_transformers.json replaced where given."""
    out.mkdir()
    for f in minilm_dir.iterdir():
        if f.is_file() and f.name != "config_sentence_transformers.json":
            (out / f.name).symlink_to(f)
    (out / "1_Pooling").mkdir()
    config = json.loads((minilm_dir / "1_Pooling" / "config.json").read_text())
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling or config))
    (out / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return out


def encoder(path: Path, **kwargs: Any) -> Any:
    return st.SentenceTransformer(str(path), device="cpu", **kwargs)


# -- prompts ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompted(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prompted") / "minilm"
    return copy_of(minilm_dir, out, prompts=PROMPTS, default_prompt_name="query")


ASKS = [
    {},  # the default prompt ("query")
    {"prompt_name": "passage"},
    {"prompt_name": "document"},  # sentence-transformers' own name: empty unless given
    {"prompt": "Represent this sentence: "},
    {"prompt": ""},  # no prompt, the default overridden
]


@pytest.mark.parametrize("include_prompt", [True, False])
def test_prompts_give_sentence_transformers_vectors(
    minilm_dir: Path, tmp_path: Path, include_prompt: bool
) -> None:
    """The default prompt, a named one, a literal one and none: our fp32 vectors equal
    encode(prompt_name=..., prompt=...) within 1e-5; with include_prompt false (the prompt's
    tokens, [CLS] among them, left out of the pooling) for mean and for cls pooling, which then
    takes the first token after the prompt."""
    for mode in ("mean", "cls"):
        pooling = {"embedding_dimension": 384, "pooling_mode": mode}
        pooling["include_prompt"] = include_prompt
        model = copy_of(
            minilm_dir, tmp_path / mode, pooling, prompts=PROMPTS, default_prompt_name="query"
        )
        ref, pipe = encoder(model), Pipeline(model, precision="fp32", batch_size=4)
        assert pipe.embedding_settings.include_prompt is include_prompt
        for ask in ASKS:
            want = ref.encode(TEXTS, batch_size=4, **ask)
            got = pipe.embed(TEXTS, **ask)
            assert got.dtype == np.float32 and got.shape == want.shape
            assert np.abs(got - want).max() < 1e-5, (mode, ask)
        # the prompt matters, and so does leaving it out of the pooling
        default, none = pipe.embed(TEXTS), pipe.embed(TEXTS, prompt="")
        assert np.abs(default - none).max() > 0.05
        if not include_prompt:
            pooling["include_prompt"] = True
            (model / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
            counted = Pipeline(model, precision="fp32").embed(TEXTS)
            assert np.abs(counted - default).max() > 0.05, mode


def test_a_prompt_goes_before_piece_ids_too(prompted: Path) -> None:
    pipe = Pipeline(prompted, precision="fp32")
    pieces = [pipe.tok.encode(t).ids[1:-1] for t in TEXTS[:3]]
    assert np.abs(pipe.embed(pieces) - pipe.embed(TEXTS[:3])).max() < 1e-6
    assert np.abs(pipe.embed(pieces, prompt="") - pipe.embed(TEXTS[:3], prompt="")).max() < 1e-6


def test_prompt_errors_name_the_prompts_and_the_file(
    minilm_dir: Path, prompted: Path, tmp_path: Path
) -> None:
    pipe = Pipeline(prompted, precision="fp32")
    with pytest.raises(ConfigError, match=r"prompt_name='qery'.*query, document, passage"):
        pipe.embed(["x"], prompt_name="qery")
    with pytest.raises(ConfigError, match="not both"):
        pipe.embed(["x"], prompt_name="query", prompt="q: ")
    for i, (config, message) in enumerate(
        [
            ({"prompts": {"query": 3}}, "prompt 'query' is not a string"),
            ({"prompts": ["query: "]}, "prompts must be an object"),
            ({"prompts": PROMPTS, "default_prompt_name": "q"}, "default_prompt_name 'q' is not"),
        ]
    ):
        bad = copy_of(minilm_dir, tmp_path / str(i), **config)
        with pytest.raises(CheckpointError, match=rf"config_sentence_transformers.json: {message}"):
            Pipeline(bad).embed(["x"])
    bad = copy_of(minilm_dir, tmp_path / "inc", {"pooling_mode": "mean", "include_prompt": 1})
    with pytest.raises(CheckpointError, match=r"1_Pooling.config.json: include_prompt 1"):
        Pipeline(bad).embed(["x"])


def test_a_null_prompt_is_empty_as_in_sentence_transformers(
    minilm_dir: Path, tmp_path: Path
) -> None:
    model = copy_of(minilm_dir, tmp_path / "m", prompts={"query": None})
    assert embedding.settings(model).prompts == {"query": "", "document": ""}
    want = encoder(model).encode(TEXTS[:2], prompt_name="query")
    got = Pipeline(model, precision="fp32").embed(TEXTS[:2], prompt_name="query")
    assert np.abs(got - want).max() < 1e-5


# -- pooling ------------------------------------------------------------------------------------


def test_a_pooling_mode_list_is_concatenated_in_its_own_order(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """sentence-transformers 6 concatenates pooling_mode's modes in the list's order (the older
    flags: in a fixed order); before, bertforge reordered a list to the flags' order."""
    modes = ["max", "mean", "weightedmean", "lasttoken", "mean_sqrt_len_tokens", "cls"]
    model = copy_of(minilm_dir, tmp_path / "m", {"embedding_dimension": 384, "pooling_mode": modes})
    assert embedding.settings(model).pooling[:2] == ("max", "mean")
    want = encoder(model).encode(TEXTS, batch_size=4)
    got = Pipeline(model, precision="fp32", batch_size=4).embed(TEXTS)
    assert got.shape == (len(TEXTS), 6 * 384) and np.abs(got - want).max() < 1e-5


def test_running_pool_with_skipped_tokens_equals_pool() -> None:
    """A long text's windows pooled as they come leave out the prompt's tokens as `pool` does."""
    h = torch.randn(300, 8)
    for skip in (1, 4, 17):
        want = embedding.pool(h[None], torch.ones(1, 300, dtype=torch.long), POOLINGS, skip)[0]
        running = embedding.RunningPool(POOLINGS, 300, skip)
        for part in torch.randperm(300).split(23):
            running.add(h[part], part)
        assert torch.allclose(running.vector(), want, atol=1e-5, rtol=1e-5), skip
    # the reference semantics: the first `skip` tokens are out, cls is the next one
    pooled = embedding.pool(h[None], torch.ones(1, 300, dtype=torch.long), ("cls", "mean"), 4)
    assert torch.allclose(pooled[0], torch.cat([h[4], h[4:].mean(0)]), atol=1e-6)


# -- Matryoshka dimensions ----------------------------------------------------------------------


def test_dimensions_follow_truncate_dim(minilm_dir: Path, tmp_path: Path) -> None:
    """Normalised vectors (the model's Normalize, or normalize=True): the first D, unit length
    again = encode(normalize_embeddings=True) of SentenceTransformer(truncate_dim=D); a model
    that does not normalise: the first D as they are = normalize_embeddings=False."""
    pipe = Pipeline(minilm_dir, precision="fp32")
    raw = copy_of(minilm_dir, tmp_path / "raw")
    modules = json.loads((minilm_dir / "modules.json").read_text())
    (raw / "modules.json").unlink()
    (raw / "modules.json").write_text(json.dumps(modules[:2]))  # no Normalize
    plain = Pipeline(raw, precision="fp32")
    for d in (1, 64, 384):
        want = encoder(minilm_dir, truncate_dim=d).encode(TEXTS, normalize_embeddings=True)
        got = pipe.embed(TEXTS, dimensions=d)
        assert got.shape == (len(TEXTS), d) and got.flags.c_contiguous
        assert np.abs(got - want).max() < 1e-5
        assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-5
        assert np.abs(plain.embed(TEXTS, normalize=True, dimensions=d) - want).max() < 1e-5
        want = encoder(raw, truncate_dim=d).encode(TEXTS, normalize_embeddings=False)
        assert np.abs(plain.embed(TEXTS, dimensions=d) - want).max() < 1e-5
    for bad in (0, -3, 385):
        with pytest.raises(
            ConfigError, match=rf"dimensions={bad} \(--dimensions\): must be 1..384"
        ):
            pipe.embed(["x"], dimensions=bad)
    two = copy_of(minilm_dir, tmp_path / "two", {"pooling_mode": ["mean", "max"]})
    assert Pipeline(two).embed(["x"], dimensions=768).shape == (1, 768)
    with pytest.raises(ConfigError, match=r"must be 1..768"):
        Pipeline(two).embed(["x"], dimensions=769)


# -- quantisation -------------------------------------------------------------------------------


def test_quantize_equals_quantize_embeddings_bit_for_bit(minilm_dir: Path) -> None:
    """MiniLM vectors at every precision: the same dtype, shape and bytes as
    sentence_transformers' quantize_embeddings, with buckets from the vectors themselves, from
    calibration embeddings, and from given ranges (values outside them clipped)."""
    from sentence_transformers.util.quantization import quantize_embeddings

    pipe = Pipeline(minilm_dir, precision="fp32")
    vectors = pipe.embed(TEXTS)
    calibration = pipe.embed(
        [f"calibration sentence number {i}, about {t}" for i, t in enumerate(TEXTS * 3)]
    )
    ranges = np.stack([calibration.min(0), calibration.max(0)]) * 0.5  # some values fall outside
    for precision in EMBEDDING_PRECISIONS:
        for ours, theirs in (
            ({}, {}),
            ({"calibration": calibration}, {"calibration_embeddings": calibration}),
            ({"ranges": ranges}, {"ranges": ranges}),
        ):
            got = quantize(vectors, precision, **ours)
            want = quantize_embeddings(vectors, precision=precision, **theirs)
            assert got.dtype == want.dtype and got.shape == want.shape, precision
            assert got.tobytes() == want.tobytes(), (precision, ours.keys())
        assert (
            quantize(vectors[:0], precision).shape
            == quantize_embeddings(vectors[:0], precision).shape
        )
    assert quantize(vectors, "binary").shape == (len(TEXTS), 48)
    assert len(np.unique(quantize(vectors, "int8", ranges=ranges))) > 100  # not all clipped
    with pytest.raises(InputError, match="several embeddings"):
        quantize(vectors[:1], "uint8")
    with pytest.raises(InputError, match=r"ranges of shape \(2, 3\)"):
        quantize(vectors, "int8", ranges=ranges[:, :3])
    with pytest.raises(ConfigError, match="precision='int4'"):
        quantize(vectors, "int4")
    with pytest.raises(InputError, match="must be floats"):
        quantize(quantize(vectors, "int8"), "int8")


# -- bertforge embed ----------------------------------------------------------------------------


def test_embed_command_prompts_dimensions_and_quantised_output(
    prompted: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--prompt-name, --dimensions and --embedding-precision reach the output: .npy in the
    quantised dtype, JSONL as integer lists; --calibration sets int8's buckets."""
    lines = tmp_path / "texts.txt"
    lines.write_text("".join(f"{t}\n" for t in TEXTS if t))
    texts = [t for t in TEXTS if t]
    pipe = Pipeline(prompted, precision="fp32")
    vectors = pipe.embed(texts, prompt_name="passage", dimensions=64)
    base = ["embed", str(prompted), str(lines), "--precision", "fp32"]
    ask = ["--prompt-name", "passage", "--dimensions", "64"]
    for precision in EMBEDDING_PRECISIONS:
        out = tmp_path / f"{precision}.npy"
        assert main([*base, *ask, "--embedding-precision", precision, "--out", str(out)]) == 0
        got, want = np.load(out), quantize(vectors, precision)
        assert got.dtype == want.dtype and np.array_equal(got, want), precision
    assert main([*base, *ask, "--embedding-precision", "ubinary"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["embedding"] for r in rows] == quantize(vectors, "ubinary").tolist()
    assert all(isinstance(x, int) for x in rows[0]["embedding"]) and len(rows[0]["embedding"]) == 8

    calibration = tmp_path / "corpus.npy"
    assert main([*base, *ask, "--out", str(calibration)]) == 0
    corpus = np.load(calibration)
    assert corpus.dtype == np.float32 and np.abs(corpus - vectors).max() < 1e-6
    one = tmp_path / "one.txt"
    one.write_text("Hi\n")
    query = ["--prompt-name", "query", "--dimensions", "64", "--embedding-precision", "int8"]
    query += ["--precision", "fp32"]
    assert main(["embed", str(prompted), str(one), *query, "--calibration", str(calibration)]) == 0
    got = json.loads(capsys.readouterr().out)["embedding"]
    want = quantize(pipe.embed(["Hi"], dimensions=64), "int8", calibration=corpus)
    assert got == want[0].tolist()
    # one embedding gives no buckets: the message says how to give some
    assert main(["embed", str(prompted), str(one), *query]) == 2
    assert "--calibration FILE.npy" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dimensions", "0"], "dimensions=0 (--dimensions): must be 1..384"),
        (["--dimensions", "400"], "dimensions=400 (--dimensions): must be 1..384"),
        (["--prompt-name", "nope"], "prompt_name='nope' (--prompt-name): this model's prompts"),
        (["--embedding-precision", "int4"], "invalid choice: 'int4'"),
        (["--calibration", "c.npy"], "--calibration is for --embedding-precision int8 or uint8"),
        (["--embedding-precision", "int8", "--calibration", "{missing}"], "not a readable .npy"),
        (["--embedding-precision", "int8", "--calibration", "{narrow}"], "shape (N >= 2, 384)"),
    ],
)
def test_embed_command_errors(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    lines = tmp_path / "texts.txt"
    lines.write_text("one\ntwo\n")
    np.save(tmp_path / "narrow.npy", np.zeros((5, 32), np.float32))
    paths = {"missing": str(tmp_path / "missing.npy"), "narrow": str(tmp_path / "narrow.npy")}
    args = [a.format(**paths) for a in args]
    out = tmp_path / "e.npy"
    try:
        status = main(["embed", str(minilm_dir), str(lines), *args, "--out", str(out)])
    except SystemExit as e:  # argparse's usage error
        status = e.code
    assert status == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_hub_download_fetches_the_sentence_transformers_files(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bertforge embed sentence-transformers/all-MiniLM-L6-v2` from the hub (here a fake
    snapshot_download serving the local copy, matching patterns as huggingface_hub does)
    embeds as the local directory: its modules, Pooling config and settings are fetched."""
    import fnmatch
    import shutil

    import huggingface_hub

    asked: list[list[str]] = []

    def snapshot_download(repo_id: str, allow_patterns: list[str]) -> str:
        asked.append(list(allow_patterns))
        out = tmp_path / "hub" / repo_id.replace("/", "--")
        for f in minilm_dir.rglob("*"):
            name = f.relative_to(minilm_dir).as_posix()
            if f.is_file() and any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, out / name)
        return str(out)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    name = "sentence-transformers/all-MiniLM-L6-v2"
    pipe, local = Pipeline(name, precision="fp32"), Pipeline(minilm_dir, precision="fp32")
    fetched = {f.relative_to(pipe.path).as_posix() for f in pipe.path.rglob("*") if f.is_file()}
    wanted = {
        "modules.json",
        "1_Pooling/config.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    }
    assert wanted <= fetched and "README.md" not in fetched and len(asked) == 2
    theirs, ours = local.embedding_settings, pipe.embedding_settings
    assert (ours.pooling, ours.normalize, ours.max_length) == (("mean",), True, 256)
    assert ours == dataclasses.replace(theirs, source=ours.source)
    assert np.array_equal(pipe.embed(TEXTS), local.embed(TEXTS))
