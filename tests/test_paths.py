"""A checkpoint's files stay inside its directory: shard names in a weights index and module
paths in modules.json that lead outside (`../`, absolute, or a link) are refused with one
CheckpointError naming the file and the entry, and nothing outside is read or written; sharded
checkpoints saved by transformers, and the hub cache's links into blobs/, still load."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from bertforge import BertModel
from bertforge.catalogue import inspect
from bertforge.cli import main
from bertforge.embedding import settings, write_layout
from bertforge.errors import CheckpointError
from bertforge.fileio import inside
from bertforge.pipelines import Pipeline
from tests.conftest import TINY
from tests.test_distill import corpus


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` (not following links) with its bytes and mtime."""
    return {
        str(f.relative_to(root)): (f.read_bytes(), f.stat().st_mtime_ns)
        for f in sorted(root.rglob("*"))
        if f.is_file() and not f.is_symlink()
    }


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertModel saved by transformers in shards of at most 100KB."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("sharded")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**TINY))
    model.save_pretrained(out, max_shard_size="100KB")
    return out


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_sharded_transformers_checkpoint_loads(sharded: Path, tmp_path: Path) -> None:
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (sharded / "model.safetensors").exists()
    model = BertModel.from_pretrained(sharded)
    # The same weights as one file give the same model.
    single = tmp_path / "single"
    model.save_pretrained(single)
    _assert_same_weights(model, BertModel.from_pretrained(single))
    assert len(inspect(sharded).weights_files) == len(set(index["weight_map"].values()))


def _crafted(sharded: Path, tmp_path: Path, name_of_outside: str | None) -> tuple[Path, Path]:
    """A copy of `sharded` whose index sends its first shard to `tmp/outside/x.safetensors`, a
    valid shard (so reading it would load without complaint) named as `name_of_outside`."""
    checkpoint, outside = tmp_path / "model", tmp_path / "outside"
    shutil.copytree(sharded, checkpoint)
    outside.mkdir()
    index_file = checkpoint / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    shutil.move(checkpoint / first, outside / "x.safetensors")
    name = name_of_outside or str(outside / "x.safetensors")
    index["weight_map"] = {k: name if v == first else v for k, v in index["weight_map"].items()}
    index_file.write_text(json.dumps(index))
    return checkpoint, outside


@pytest.mark.parametrize(
    "name", ["../outside/x.safetensors", "sub/../../outside/x.safetensors", None]
)
def test_an_index_naming_a_shard_outside_is_refused(
    sharded: Path, tmp_path: Path, name: str | None
) -> None:
    checkpoint, outside = _crafted(sharded, tmp_path, name)
    before = _snapshot(outside)
    shown = name or str(outside / "x.safetensors")
    for load in (BertModel.from_pretrained, inspect):
        with pytest.raises(CheckpointError) as e:
            load(checkpoint)
        message = str(e.value)
        assert message.startswith(str(checkpoint / "model.safetensors.index.json"))
        assert f"shard {shown!r}" in message and "inside its directory" in message
    assert _snapshot(outside) == before


def test_a_shard_linked_outside_is_refused(sharded: Path, tmp_path: Path) -> None:
    checkpoint, outside = _crafted(sharded, tmp_path, "model-linked.safetensors")
    (checkpoint / "model-linked.safetensors").symlink_to(outside / "x.safetensors")
    with pytest.raises(CheckpointError, match=r"shard 'model-linked.safetensors' leads outside"):
        BertModel.from_pretrained(checkpoint)
    # a link that stays inside the directory is fine
    (checkpoint / "model-linked.safetensors").unlink()
    shutil.move(outside / "x.safetensors", checkpoint / "real.safetensors")
    (checkpoint / "model-linked.safetensors").symlink_to("real.safetensors")
    _assert_same_weights(BertModel.from_pretrained(checkpoint), BertModel.from_pretrained(sharded))


def test_the_hub_caches_links_into_blobs_still_load(sharded: Path, tmp_path: Path) -> None:
    """huggingface_hub's cache: snapshots/<rev>/<file> are links to ../../blobs/<hash>."""
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(sharded.iterdir())):
        (blobs / f"blob{i}").write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    _assert_same_weights(BertModel.from_pretrained(snapshot), BertModel.from_pretrained(sharded))
    # ...but a name in the index still may not climb out of the snapshot into blobs/
    with pytest.raises(CheckpointError, match=r"'../../blobs/blob0' is outside"):
        inside(snapshot, "../../blobs/blob0", snapshot / "model.safetensors.index.json", "shard")


def _teacher(minilm_dir: Path, out: Path, pooling_path: str) -> Path:
    """all-MiniLM-L6-v2 (files linked) whose modules.json puts its Pooling at `pooling_path`."""
    out.mkdir()
    for f in minilm_dir.iterdir():
        if f.is_file() and f.name != "modules.json":
            (out / f.name).symlink_to(f)
    modules = json.loads((minilm_dir / "modules.json").read_text())
    modules[1]["path"] = pooling_path
    (out / "modules.json").write_text(json.dumps(modules))
    return out


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Another model's folder beside the teacher, with a Pooling config a crafted teacher
    would read and a careless copy would overwrite."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "config.json").write_text('{"pooling_mode": "cls", "embedding_dimension": 7}\n')
    return folder


@pytest.mark.parametrize("how", ["relative", "absolute", "link"])
def test_modules_json_pointing_outside_is_refused(
    minilm_dir: Path, tmp_path: Path, victim: Path, how: str
) -> None:
    path = {"relative": "../victim", "absolute": str(victim), "link": "1_Pooling"}[how]
    teacher = _teacher(minilm_dir, tmp_path / "teacher", path)
    if how == "link":
        (teacher / "1_Pooling").symlink_to(victim, target_is_directory=True)
    student = tmp_path / "student"
    student.mkdir()
    before = _snapshot(tmp_path)
    expected = rf"{teacher / 'modules.json'}: module path '{path}' (is|leads) outside"
    with pytest.raises(CheckpointError, match=expected):
        settings(teacher)
    with pytest.raises(CheckpointError, match=expected):
        write_layout(teacher, student, 384)
    with pytest.raises(CheckpointError, match=expected):
        Pipeline(teacher, precision="fp32").embed(["a sentence"])
    assert _snapshot(tmp_path) == before  # nothing outside (or anywhere) written


def test_distill_from_a_crafted_teacher_writes_nothing_outside(
    minilm_dir: Path, tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture
) -> None:
    teacher = _teacher(minilm_dir, tmp_path / "teacher", "../victim")
    text = corpus(tmp_path / "text.txt")
    before = _snapshot(tmp_path)
    args = ["distill", "--teacher", str(teacher), "--out", str(tmp_path / "student")]
    args += ["--data", str(text), "--student-layers", "0,5", "--steps", "2", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "modules.json: module path '../victim' is outside" in err
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("student")} == before


def test_a_module_folder_linked_inside_the_directory_is_fine(
    minilm_dir: Path, tmp_path: Path
) -> None:
    teacher = _teacher(minilm_dir, tmp_path / "teacher", "pooling_link")
    shutil.copytree(minilm_dir / "1_Pooling", teacher / "1_Pooling")
    (teacher / "pooling_link").symlink_to("1_Pooling", target_is_directory=True)
    want = dataclasses.replace(settings(minilm_dir), source=str(teacher / "modules.json"))
    assert settings(teacher) == want
    write_layout(teacher, tmp_path / "student", 384)
    assert (tmp_path / "student" / "pooling_link" / "config.json").is_file()


def test_inside_refuses_names_that_are_not_file_names(tmp_path: Path) -> None:
    for name in (3, None, "a\x00b"):
        with pytest.raises(CheckpointError, match=r"index.json: shard .* is not a file name"):
            inside(tmp_path, name, tmp_path / "index.json", "shard")
    assert inside(tmp_path, "a/./b.safetensors", "x", "shard") == tmp_path / "a/./b.safetensors"


def test_pickle_shards_load_and_stay_inside(sharded: Path, tmp_path: Path) -> None:
    """pytorch_model.bin.index.json (older transformers' sharded pickles): read with
    weights_only=True, shards kept inside the directory like safetensors ones."""
    from safetensors.torch import load_file

    checkpoint = tmp_path / "pickled"
    checkpoint.mkdir()
    shutil.copy(sharded / "config.json", checkpoint / "config.json")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    names = {}
    for i, shard in enumerate(sorted(set(index["weight_map"].values()))):
        names[shard] = f"pytorch_model-{i + 1:05d}.bin"
        torch.save(load_file(sharded / shard), checkpoint / names[shard])
    index["weight_map"] = {k: names[v] for k, v in index["weight_map"].items()}
    (checkpoint / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    _assert_same_weights(BertModel.from_pretrained(checkpoint), BertModel.from_pretrained(sharded))
    index["weight_map"] = {k: "../" + v for k, v in index["weight_map"].items()}
    (checkpoint / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"bin.index.json: shard '\.\./pytorch_model-"):
        BertModel.from_pretrained(checkpoint)
