"""`bertforge merge`: weighted averages of checkpoints, checked by hand and against
sentence-transformers; every mismatch one error that leaves nothing behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    Tokenizer,
)
from bertforge.cli import main
from bertforge.merge import merge

from .conftest import TINY


def _tiny(out: Path, tok: Tokenizer, seed: int, cls: type = BertForPreTraining, **sizes) -> Path:
    torch.manual_seed(seed)
    cls(BertConfig(**{**TINY, "vocab_size": tok.vocab_size, **sizes})).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def two(tmp_path: Path, minilm_dir: Path) -> tuple[Path, Path]:
    tok = Tokenizer.from_pretrained(minilm_dir)
    return _tiny(tmp_path / "a", tok, 0), _tiny(tmp_path / "b", tok, 1)


def test_weighted_average_by_hand(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    (a / "run.json").write_text("{}")  # a's training records are not the merged model's
    (a / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "secret.txt").write_text("not the model's")
    (a / "README.md").write_text("model card")
    (a / "notes.md").symlink_to(tmp_path / "secret.txt")  # a link out of a: not copied
    with pytest.warns(UserWarning, match="notes.md: a link out of"):
        assert (
            main(["merge", str(a), str(b), "--weights", "3,1", "--out", str(tmp_path / "m")]) == 0
        )
    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    tm = load_file(tmp_path / "m" / "model.safetensors")
    assert set(tm) == set(ta)
    for name, t in ta.items():
        want = (0.75 * t.double() + 0.25 * tb[name].double()).float()
        assert torch.equal(tm[name], want), name
    assert json.loads((tmp_path / "m" / "merge.json").read_text())["weights"] == [0.75, 0.25]
    assert not (tmp_path / "m" / "run.json").exists()
    assert not (tmp_path / "m" / "metrics.jsonl").exists()
    assert not (tmp_path / "m" / "notes.md").exists()
    assert (tmp_path / "m" / "README.md").read_text() == "model card"
    (a / "notes.md").unlink()
    assert (tmp_path / "m" / "vocab.txt").read_bytes() == (a / "vocab.txt").read_bytes()
    BertForPreTraining.from_pretrained(tmp_path / "m")  # loads without a warning
    # equal weights by default; weight 0 for the second: the first model, bit for bit
    merge([a, b], tmp_path / "eq")
    te = load_file(tmp_path / "eq" / "model.safetensors")
    assert torch.equal(te["bert.pooler.dense.weight"], (ta["bert.pooler.dense.weight"].double() / 2 + tb["bert.pooler.dense.weight"].double() / 2).float())  # fmt: skip
    merge([a, b], tmp_path / "first", [1, 0])
    tf = load_file(tmp_path / "first" / "model.safetensors")
    assert all(torch.equal(tf[n], t) for n, t in ta.items())


def test_wise_ft_of_minilm_loads_in_sentence_transformers(tmp_path: Path, minilm_dir: Path) -> None:
    """A fine-tuned model (here MiniLM with its weights moved, saved under `bert.` names and
    without position_ids) averaged with its base: the first model's sentence-transformers
    layout, and sentence-transformers embeds the merged weights as bertforge does."""
    st = pytest.importorskip("sentence_transformers")
    from bertforge.pipelines import Pipeline

    moved = tmp_path / "moved"
    shutil.copytree(minilm_dir, moved)
    base = load_file(minilm_dir / "model.safetensors")
    torch.manual_seed(1)
    shifted = {
        "bert." + n: t + 0.01 * torch.randn_like(t)
        for n, t in base.items()
        if t.is_floating_point()
    }
    save_file(shifted, str(moved / "model.safetensors"))
    out = tmp_path / "wise"
    assert main(["merge", str(moved), str(minilm_dir), "--weights", "0.9,0.1", "--out", str(out)]) == 0  # fmt: skip
    merged = load_file(out / "model.safetensors")
    w = "bert.encoder.layer.0.attention.self.query.weight"
    want = (0.9 * shifted[w].double() + 0.1 * base[w[5:]].double()).float()
    assert torch.equal(merged[w], want)
    assert (out / "modules.json").is_file() and (out / "1_Pooling" / "config.json").is_file()
    texts = ["A man is playing a guitar.", "The weather is lovely today.", "Merging weights."]
    ours = Pipeline(out, precision="fp32").embed(texts)
    ref = st.SentenceTransformer(str(out), device="cpu").encode(texts)
    assert abs(torch.as_tensor(ours) - torch.as_tensor(ref)).max() < 1e-4
    original = Pipeline(minilm_dir, precision="fp32").embed(texts)
    assert abs(torch.as_tensor(ours) - torch.as_tensor(original)).max() > 1e-3


def test_wise_ft_of_a_classifier_keeps_its_head(
    tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """docs/export.md's `merge runs/sst2 path/to/base --weights 0.9,0.1`: the base (a
    pre-training checkpoint) has no classifier and heads of its own. The merged classifier
    loads without a warning, its encoder is the 0.9/0.1 average, its head the fine-tuned
    one's, and the base's MLM/NSP heads are left out; listed the other way round, the merged
    model is the base's, with a warning that the classifier's head was left out."""
    tok = Tokenizer.from_pretrained(minilm_dir)
    base = _tiny(tmp_path / "base", tok, 0)
    tuned = _tiny(
        tmp_path / "sst2", tok, 1, BertForSequenceClassification, id2label={0: "neg", 1: "pos"}
    )
    out = tmp_path / "wise"
    assert main(["merge", str(tuned), str(base), "--weights", "0.9,0.1", "--out", str(out)]) == 0
    tb, tt = load_file(base / "model.safetensors"), load_file(tuned / "model.safetensors")
    merged = load_file(out / "model.safetensors")
    assert set(merged) == set(tt) and any(n.startswith("classifier.") for n in merged)
    for name, t in tt.items():
        want = t if name.startswith("classifier.") else (0.9 * t.double() + 0.1 * tb[name].double()).float()  # fmt: skip
        assert torch.equal(merged[name], want), name
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fresh tensors, nothing unused
        model = BertForSequenceClassification.from_pretrained(out)
    assert torch.equal(model.classifier.weight, tt["classifier.weight"])
    back = tmp_path / "back"
    with pytest.warns(UserWarning, match="classifier.bias .and 1 more. not in"):
        assert main(["merge", str(base), str(tuned), "--weights", "0.1,0.9", "--out", str(back)]) == 0  # fmt: skip
    merged = load_file(back / "model.safetensors")
    assert set(merged) == set(tb)
    assert torch.equal(merged["cls.seq_relationship.weight"], tb["cls.seq_relationship.weight"])


def _refused(args: list[str], capsys: pytest.CaptureFixture, *words: str) -> str:
    try:
        status = main(args)
    except SystemExit as e:  # argparse's own usage errors
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("bertforge: error:") and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


def test_mismatches_are_one_error_and_leave_nothing(
    two: tuple[Path, Path], tmp_path: Path, minilm_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    a, b = two
    tok = Tokenizer.from_pretrained(minilm_dir)
    out = tmp_path / "out"
    wider = _tiny(tmp_path / "wider", tok, 2, intermediate_size=256)
    _refused(["merge", str(a), str(wider), "--out", str(out)], capsys, "intermediate_size", "256")
    labels = [tmp_path / "ab", tmp_path / "ba"]
    for path, names in zip(labels, (["neg", "pos"], ["pos", "neg"])):
        torch.manual_seed(4)
        config = BertConfig(
            **{**TINY, "vocab_size": tok.vocab_size}, id2label=dict(enumerate(names))
        )
        BertForSequenceClassification(config).save_pretrained(path)
        tok.save_pretrained(path)
    _refused(["merge", *map(str, labels), "--out", str(out)], capsys, "id2label", "'pos'")
    w = "bert.encoder.layer.1.output.dense.weight"
    short, more = tmp_path / "short", tmp_path / "more"  # an encoder tensor too few, one too many
    for path, change in ((short, lambda t: t.pop(w)), (more, lambda t: t.update(x=t[w].clone()))):
        shutil.copytree(b, path)
        tensors = load_file(path / "model.safetensors")
        change(tensors)
        save_file({("bert.encoder.layer.9.x" if n == "x" else n): t for n, t in tensors.items()}, str(path / "model.safetensors"))  # fmt: skip
    _refused(["merge", str(a), str(short), "--out", str(out)], capsys, "has no tensor", w)
    _refused(["merge", str(a), str(more), "--out", str(out)], capsys, "no counterpart", "layer.9.x")
    other = tmp_path / "other_vocab"
    shutil.copytree(b, other)
    lines = (other / "vocab.txt").read_text().splitlines()
    lines[2000] = "zzzz"
    (other / "vocab.txt").write_text("\n".join(lines) + "\n")
    _refused(["merge", str(a), str(other), "--out", str(out)], capsys, "vocab.txt", "piece 2000")
    torn = tmp_path / "torn"
    shutil.copytree(b, torn)
    data = (torn / "model.safetensors").read_bytes()
    (torn / "model.safetensors").write_bytes(data[: len(data) // 2])
    _refused(["merge", str(a), str(torn), "--out", str(out)], capsys, "truncated")
    for weights in ("1", "1,-1", "0,0", "1,nan"):
        _refused(["merge", str(a), str(b), "--weights", weights, "--out", str(out)], capsys, "--weights")  # fmt: skip
    _refused(["merge", str(a), "--weights", "x,y", "--out", str(out)], capsys, "numbers")
    _refused(["merge", str(a), "--out", str(out)], capsys, "two or more")
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dirs
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _refused(["merge", str(a), str(b), "--out", str(out)], capsys, "not empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_killed_merge_leaves_no_half_model(two: tuple[Path, Path], tmp_path: Path) -> None:
    """A merge killed mid-write leaves its hidden folder, never OUT; the next merge to OUT
    removes that folder (its process is gone) and writes OUT whole."""
    import subprocess

    a, b = two
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".m.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    merge([a, b], tmp_path / "m")
    assert not stale.exists()
    assert set(load_file(tmp_path / "m" / "model.safetensors")) == set(load_file(a / "model.safetensors"))  # fmt: skip
