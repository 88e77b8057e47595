"""modeldir.ModelDir: a model directory read once, whichever verb reads it."""

from __future__ import annotations

import collections
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, Tokenizer
from bertforge.errors import CheckpointError, ConfigError
from bertforge.heads import BertForSequenceClassification
from bertforge.modeldir import ModelDir
from bertforge.pipelines import Pipeline

from .conftest import TINY, read_more_than_once


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("classifier")
    tok = Tokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size, "id2label": {0: "no", 1: "yes"}})
    BertForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_pipeline_reads_each_file_of_its_model_once(
    reads: Callable[[Path], collections.Counter[str]], minilm_dir: Path, classifier: Path
) -> None:
    """Embedding read tokenizer.json and tokenizer_config.json three times each and vocab.txt
    and config.json twice (the tokenizer, the checkpoint's vocabulary check, the config, the
    loader each went back to the files); now the Pipeline's ModelDir reads each once."""
    counts = reads(minilm_dir)
    pipe = Pipeline(minilm_dir, precision="fp32")
    assert pipe.embed(["a first text", "and a second"]).shape == (2, 384)
    assert {"config.json", "modules.json", "tokenizer_config.json"} <= set(counts)
    assert read_more_than_once(counts) == {}
    counts = reads(classifier)
    pipe = Pipeline(classifier, precision="fp32")
    assert len(pipe.classify(["one", "two"])) == 2
    assert pipe.embed(["one"]).shape == (1, TINY["hidden_size"])  # a second task: no re-read
    assert "config.json" in counts and read_more_than_once(counts) == {}


def test_the_embed_and_classify_commands_read_each_file_once(
    reads: Callable[[Path], collections.Counter[str]],
    minilm_dir: Path,
    classifier: Path,
    tmp_path: Path,
) -> None:
    from bertforge.cli import main

    texts = tmp_path / "texts.txt"
    texts.write_text("a first text\nand a second\n")
    counts = reads(minilm_dir)
    assert main(["embed", str(minilm_dir), str(texts), "--out", str(tmp_path / "e.npy")]) == 0
    assert counts and read_more_than_once(counts) == {}
    counts = reads(classifier)
    assert main(["classify", str(classifier), str(texts)]) == 0
    assert counts and read_more_than_once(counts) == {}


def test_open_returns_a_modeldir_unchanged_and_reads_lazily(
    reads: Callable[[Path], collections.Counter[str]], minilm_dir: Path
) -> None:
    counts = reads(minilm_dir)
    md = ModelDir.open(minilm_dir)
    assert ModelDir.open(md) is md and Path(md) == minilm_dir and md / "x" == minilm_dir / "x"
    assert not counts  # nothing read until asked for
    assert md.config.hidden_size == 384 and md.config is md.config
    assert md.tokenizer is md.tokenizer and md.embedding.pooling == ("mean",)
    assert md.is_sentence_transformers and md.run is None
    assert read_more_than_once(counts) == {}
    assert Pipeline(md).source is md  # handed on, not opened again


def test_open_refuses_what_is_not_a_model_directory(tmp_path: Path, classifier: Path) -> None:
    with pytest.raises(CheckpointError, match="nowhere: no such file or directory"):
        ModelDir.open(tmp_path / "nowhere")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="file.txt: not a model directory"):
        ModelDir.open(tmp_path / "file.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="empty: no config.json or bert_config.json"):
        _ = ModelDir.open(empty).config
    broken = tmp_path / "broken"
    shutil.copytree(classifier, broken)
    (broken / "config.json").write_text('{"model_type": "bert",')
    with pytest.raises(ConfigError, match=r"broken/config.json: line 1, column \d+: invalid JSON"):
        _ = ModelDir.open(broken).config
    config = json.loads((classifier / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "deberta-v2"}))
    with pytest.raises(ConfigError, match="deberta-v2.*bert.*roberta.*modernbert"):
        _ = ModelDir.open(broken).config


def test_serve_reads_each_file_of_its_model_once_at_start(
    reads: Callable[[Path], collections.Counter[str]], classifier: Path, minilm_dir: Path
) -> None:
    """`serve` checked the endpoints' heads (architectures, labels) apart from its pipeline's
    reading: config.json read three times. One ModelDir now serves both."""
    from bertforge.serve import Limits, create_app

    counts = reads(classifier)
    create_app(classifier, Limits(), precision="fp32")
    assert "config.json" in counts and read_more_than_once(counts) == {}
    counts = reads(minilm_dir)
    create_app(minilm_dir, Limits(), precision="fp32")
    assert "modules.json" in counts and read_more_than_once(counts) == {}


def test_evaluate_reads_each_file_of_its_model_once(
    reads: Callable[[Path], collections.Counter[str]], tmp_path: Path, minilm_dir: Path
) -> None:
    """`bertforge evaluate` on a model `finetune` wrote (run.json, config, tokenizer, weights):
    the issue counted 15 trips back up the layers along its path; each file is read once."""
    from bertforge.cli import main

    train = tmp_path / "train.tsv"
    rows = [f"text number {i} {'good' if i % 2 else 'bad'}\t{i % 2}" for i in range(16)]
    train.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    tiny = tmp_path / "tiny"
    from .conftest import save_tiny

    save_tiny(tiny, minilm_dir)
    out = tmp_path / "run"
    argv = ["finetune", "--task", "sst2", "--model", str(tiny), "--train", str(train)]
    argv += ["--out", str(out), "--epochs", "1", "--batch-size", "8", "--no-progress"]
    assert main(argv) == 0
    counts = reads(out)
    assert main(["evaluate", "--model", str(out), "--data", str(train), "--no-progress"]) == 0
    assert "run.json" in counts and "config.json" in counts
    assert read_more_than_once(counts) == {}


def test_index_and_search_read_each_file_of_their_model_once(
    reads: Callable[[Path], collections.Counter[str]], minilm_dir: Path, tmp_path: Path
) -> None:
    """The index's record of its model (config.json and weights' sha256) read config.json
    apart from the pipeline that embedded: twice per command; one ModelDir now reads both."""
    from bertforge.cli import main

    docs, queries = tmp_path / "docs.txt", tmp_path / "q.txt"
    docs.write_text("the cat sat\na dog ran\nrain fell all day\n")
    queries.write_text("a cat\n")
    out = tmp_path / "idx"
    hashed = {"model.safetensors": 2}  # its sha256 (the identity), then its tensors loaded
    counts = reads(minilm_dir)
    assert (
        main(["index", str(minilm_dir), str(docs), "--out", str(out), "--precision", "fp32"]) == 0
    )
    assert "config.json" in counts and read_more_than_once(counts) == hashed
    counts = reads(minilm_dir)
    assert main(["search", str(out), str(queries), "--top-k", "1"]) == 0
    assert "config.json" in counts and read_more_than_once(counts) == hashed


def test_finetune_reads_each_file_of_its_model_once(
    reads: Callable[[Path], collections.Counter[str]], tmp_path: Path, minilm_dir: Path
) -> None:
    """`finetune --task retrieval` from a sentence-transformers directory read it piecemeal:
    the tokenizer, the task's pooling (embedding.settings), the loader and the saved layout
    each went back to its files; one ModelDir now reads each once."""
    from bertforge.cli import main
    from bertforge.embedding import write_layout

    from .conftest import save_tiny

    tiny = save_tiny(tmp_path / "tiny", minilm_dir)
    write_layout(minilm_dir, tiny, TINY["hidden_size"])
    rows = [{"query": f"what of topic {i}", "positive": f"topic {i} is told"} for i in range(8)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = reads(tiny)
    argv = ["finetune", "--task", "retrieval", "--model", str(tiny), "--train", str(train)]
    argv += ["--out", str(tmp_path / "out"), "--epochs", "1", "--batch-size", "8"]
    assert main([*argv, "--no-progress", "--precision", "fp32"]) == 0
    assert {"config.json", "modules.json"} <= set(counts)
    assert read_more_than_once(counts) == {}


def test_distill_reads_each_file_of_its_teacher_once(
    reads: Callable[[Path], collections.Counter[str]], tmp_path: Path, minilm_dir: Path
) -> None:
    """`distill` read its sentence-transformers teacher piecemeal (the tokenizer, its pooling,
    the loader, the student's layout each went back to the files); one ModelDir now."""
    from bertforge.cli import main
    from bertforge.embedding import write_layout

    from .conftest import save_tiny

    teacher = save_tiny(tmp_path / "teacher", minilm_dir)
    write_layout(minilm_dir, teacher, TINY["hidden_size"])
    text = tmp_path / "text.txt"
    text.write_text("".join(f"sentence number {i} says a few words more\n" for i in range(16)))
    counts = reads(teacher)
    argv = ["distill", "--teacher", str(teacher), "--out", str(tmp_path / "student")]
    argv += ["--data", str(text), "--student-layers", "0", "--steps", "2", "--batch-size", "8"]
    assert main([*argv, "--no-progress", "--precision", "fp32"]) == 0
    assert {"config.json", "modules.json"} <= set(counts)
    assert read_more_than_once(counts) == {}


def test_merge_reads_each_file_of_its_models_once(
    reads: Callable[[Path], collections.Counter[str]], tmp_path: Path, minilm_dir: Path
) -> None:
    """`merge` checked each model's config and tokenizer, then averaged and copied the first's
    files and sentence-transformers modules: config.json, vocab.txt and the modules' files of
    the first model were read two or three times; each file of either model once now."""
    from bertforge.cli import main
    from bertforge.embedding import write_layout

    from .conftest import save_tiny

    a, b = save_tiny(tmp_path / "a", minilm_dir), save_tiny(tmp_path / "b", minilm_dir)
    write_layout(minilm_dir, a, TINY["hidden_size"])
    counts = reads(tmp_path)
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "merged")]) == 0
    assert {"a/config.json", "a/modules.json", "b/config.json", "b/vocab.txt"} <= set(counts)
    assert {"a/model.safetensors", "b/model.safetensors"} <= set(counts)
    assert read_more_than_once(counts) == {}
    assert (tmp_path / "merged" / "1_Pooling" / "config.json").is_file()


def test_distill_reads_each_file_of_its_student_once(
    reads: Callable[[Path], collections.Counter[str]], tmp_path: Path, tiny_model: Path
) -> None:
    """`distill --student DIR` opens that directory as a ModelDir too: teacher and student
    (copies of one model here, counted apart) each read once."""
    from bertforge.cli import main

    models = tmp_path / "models"
    shutil.copytree(tiny_model, models / "teacher")
    shutil.copytree(tiny_model, models / "student")
    text = tmp_path / "text.txt"
    text.write_text("".join(f"sentence number {i} says a few words more\n" for i in range(16)))
    counts = reads(models)
    argv = ["distill", "--teacher", str(models / "teacher"), "--out", str(tmp_path / "out")]
    argv += ["--student", str(models / "student"), "--data", str(text), "--steps", "1"]
    assert main([*argv, "--batch-size", "8", "--no-progress", "--precision", "fp32"]) == 0
    assert {"teacher/config.json", "student/config.json", "student/vocab.txt"} <= set(counts)
    assert {"teacher/model.safetensors", "student/model.safetensors"} <= set(counts)
    assert read_more_than_once(counts) == {}
