"""Training that fails loudly and leaves nothing wrong behind (issue 24): a diverged run stops
with one line and saves no model of NaN, JSON files stay strict JSON, a fine-tuned model that
answers one class is warned about and reported class by class, --metric picks the epoch, a
finished run keeps the model and not the optimizer, and a killed save or a failed `prepare`
leaves no debris."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from bertforge import Tokenizer
from bertforge.cli import main
from bertforge.data.shards import prepare
from bertforge.errors import DataError, TrainingError
from bertforge.fileio import write_json
from bertforge.train.distributed import Dist
from bertforge.train.finetune import FinetuneConfig, run
from bertforge.train.logs import MetricsLog, read_metrics
from bertforge.train.loop import MIN_LOSS_SCALE, _Divergence
from bertforge.train.supervised import SupervisedTask
from tests.task_files import keyword_table
from tests.test_shards import write_corpus


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, which are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("failures")
    files = write_corpus(root / "corpus", docs=40)
    prepare(files, Tokenizer.from_pretrained(minilm_dir), root / "shards", progress=False)
    return root / "shards"


# ------------------------------------------------------------------------------------------------
# Divergence


def test_a_diverging_pretraining_stops_with_one_line_and_saves_no_model(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["pretrain", "--data", str(shards), "--out", str(out), "--model-size", "tiny"]
    args += ["--batch-size", "4", "--max-seq-length", "32", "--precision", "fp32"]
    # lr 1e30 breaks the model at step 1 (saved: it was fine before), its loss is NaN at step 2
    args += ["--lr", "1e30", "--steps", "6", "--log-every", "2", "--save-every", "1"]
    assert main([*args, "--eval-every", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    # the lr of step 2: the linear decay from 1e30 at step 1 to 0 after step 6
    assert err[0].startswith("bertforge: error: step 2: the loss is nan (lr 8.33e+29): training ")
    assert "diverged; nothing was saved as the model; lower --lr" in err[0]
    assert not (out / "model.safetensors").exists()  # no final model
    # nothing saved after the divergence: the checkpoint of step 1 alone
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000001"]
    assert strict_json((out / "run.json").read_text())["finished"] is False
    # strict JSON: the diverged loss is logged as null before the check stops the run
    (record,) = [strict_json(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 2 and record["loss"] is None


def test_divergence_is_found_on_the_device_and_read_when_asked() -> None:
    lr = {1: 1.0, 2: 2.0, 3: 3.0}.__getitem__
    watch = _Divergence(torch.device("cpu"), None)
    watch.update(1, torch.tensor(0.5), torch.tensor(1.0))
    watch.check(1, Dist(), lr)
    watch.update(2, torch.tensor(0.5), torch.tensor(math.inf))  # the first bad step
    watch.update(3, torch.tensor(math.nan), torch.tensor(math.nan))
    with pytest.raises(TrainingError, match=r"^step 2: the gradient norm is inf \(lr 2\): "):
        watch.check(3, Dist(), lr)

    class Scaler:  # fp16: the scaler skips steps of overflowing gradients, and lowers its scale
        scale = 1.0

        def get_scale(self) -> float:
            return self.scale

    scaler = Scaler()
    fp16 = _Divergence(torch.device("cpu"), scaler)
    fp16.update(1, torch.tensor(0.5), torch.tensor(math.inf))  # a skipped step is no divergence
    fp16.check(1, Dist(), lr)
    scaler.scale = MIN_LOSS_SCALE / 2  # but a scale that never stops falling is
    with pytest.raises(TrainingError, match=r"^step 2: the fp16 loss scale fell to 5e-05"):
        fp16.check(2, Dist(), lr)
    scaler.scale = 1.0
    fp16.update(3, torch.tensor(math.inf), torch.tensor(1.0))  # and so is a loss of inf
    with pytest.raises(TrainingError, match=r"^step 3: the loss is inf \(lr 3\)"):
        fp16.check(3, Dist(), lr)


# ------------------------------------------------------------------------------------------------
# JSON


def test_json_files_hold_null_for_numbers_that_are_not_finite(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json", {"f1": math.nan, "x": [1.5, -math.inf], "n": {"y": math.inf}})
    assert strict_json((tmp_path / "a.json").read_text()) == {
        "f1": None,
        "x": [1.5, None],
        "n": {"y": None},
    }
    log = MetricsLog(tmp_path)
    log.log(1, loss=math.nan, grad_norm=math.inf, lr=1e-4)
    log.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    record = strict_json(line)
    assert record["loss"] is None and record["grad_norm"] is None and record["lr"] == 1e-4
    (back,) = read_metrics(tmp_path)  # read back as numbers
    assert math.isnan(back["loss"]) and back["lr"] == 1e-4


GOOD = '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0, "lr": null}\n'


def test_a_torn_last_line_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run killed (or out of disk) mid-append leaves half a line at the end: plot draws the
    records before it, with a warning; a resumed run drops it with the records after its
    checkpoint, the file rewritten atomically (a crash there keeps the old one)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(GOOD + '{"step": 3, "lo')
    with pytest.warns(UserWarning, match=r"metrics.jsonl: line 3: .* left out"):
        records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2] and math.isnan(records[1]["lr"])
    with pytest.warns(UserWarning, match="line 3"):
        assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    torn = path.read_text()

    def crash(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    log = MetricsLog(tmp_path)
    with pytest.MonkeyPatch.context() as m, pytest.raises(OSError), pytest.warns(UserWarning):
        m.setattr("os.replace", crash)
        log.truncate_after(1)
    assert path.read_text() == torn  # the history is still there
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.warns(UserWarning, match="line 3"):
        log.truncate_after(1)
    log.close()
    assert path.read_text() == '{"step": 1, "loss": 2.5}\n'


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n', "line 2: not JSON"),
        ('{"step": 1}\n[1, 2]\n', "line 2: not a JSON object"),
        ('{"step": 1}\n{"loss": 2.0}\n', 'line 2: no integer "step"'),
        ('{"step": "x"}\n', 'line 1: no integer "step"'),
        ('{"step": 1}\n\xff{"step": 2}\n', "line 2: not UTF-8"),
    ],
)
def test_a_bad_metrics_line_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, lines: str, message: str
) -> None:
    """Any other bad line (not only a torn last one) is one DataError naming file and line, for
    plot (exit status 2) and for a resumed run."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(lines.encode().replace("\xff".encode(), b"\xff"))  # a byte, not UTF-8
    before = path.read_bytes()
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert f"metrics.jsonl: {message}" in err and len(err.strip().splitlines()) == 1, err
    log = MetricsLog(tmp_path)
    with pytest.raises(DataError, match=message):
        log.truncate_after(1)
    log.close()
    assert path.read_bytes() == before


# ------------------------------------------------------------------------------------------------
# Fine-tuning: one class for every row, classes, --metric, checkpoints


def one_text_table(path: Path, ham: int, spam: int) -> Path:
    """The same text on every row: a model can only answer one class for all of them."""
    rows = ["text\tlabel"] + ["a message like any other\tham"] * ham
    rows += ["a message like any other\tspam"] * spam
    path.write_text("\n".join(rows) + "\n")
    return path


def csv_config(tmp_path: Path, model: Path, table: Path, **kw: Any) -> FinetuneConfig:
    return FinetuneConfig(
        model=str(model),
        task="csv",
        train=str(table),
        dev=str(table),
        out=str(tmp_path / "run"),
        epochs=kw.pop("epochs", 1),
        batch_size=8,
        progress=False,
        **kw,
    )


def test_a_model_that_answers_one_class_is_warned_about_and_scored_by_class(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = one_text_table(tmp_path / "spam.tsv", 26, 4)
    with pytest.warns(UserWarning, match=r"predicts '(ham|spam)' for every dev row: its accuracy"):
        best = run(csv_config(tmp_path, tiny_model, table))
    out = capsys.readouterr().out
    assert "best dev accuracy" in out and "macro_f1" in out
    assert "class" in out and "precision" in out and "spam" in out  # the table of classes
    saved = strict_json((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ham_precision", "ham_recall", "ham_f1", "ham_n_gold", "spam_n_pred"} <= saved.keys()
    assert saved["ham_n_gold"] == 26 and saved["spam_n_gold"] == 4
    assert sorted([saved["ham_n_pred"], saved["spam_n_pred"]]) == [0, 30]
    assert saved["macro_f1"] == pytest.approx((saved["ham_f1"] + saved["spam_f1"]) / 2)
    assert best["macro_f1"] == saved["macro_f1"]


@pytest.mark.filterwarnings("ignore:the model predicts")  # one class: not the point
def test_metric_picks_the_best_epoch(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripted dev scores: accuracy is best after epoch 1, macro_f1 after epoch 2."""
    table = keyword_table(tmp_path / "t.tsv", 16, seed=0, header="text\tlabel")
    real = SupervisedTask.evaluate
    script = iter([(0.9, 0.1), (0.5, 0.8), (0.7, 0.3)] * 2)

    def scripted(self: SupervisedTask, model: torch.nn.Module) -> dict[str, float]:
        metrics = real(self, model)
        metrics["accuracy"], metrics["macro_f1"] = next(script)
        return metrics

    monkeypatch.setattr(SupervisedTask, "evaluate", scripted)
    by_accuracy = run(csv_config(tmp_path / "a", tiny_model, table, epochs=3))
    by_macro = run(csv_config(tmp_path / "b", tiny_model, table, epochs=3, metric="macro_f1"))
    assert (by_accuracy["epoch"], by_accuracy["accuracy"]) == (1, 0.9)
    assert (by_macro["epoch"], by_macro["macro_f1"]) == (2, 0.8)
    saved = strict_json((tmp_path / "b" / "run" / "eval_results.json").read_text())
    assert saved["epoch"] == 2 and saved["step"] == 4


def test_an_unknown_metric_is_one_error_naming_the_tasks_metrics(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = keyword_table(tmp_path / "t.tsv", 16, seed=0, header="text\tlabel")
    args = ["finetune", "--model", str(tiny_model), "--task", "csv", "--train", str(table)]
    args += ["--dev", str(table), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main([*args, "--metric", "f2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "bertforge: error: --metric f2: csv reports accuracy, macro_f1, 0_precision, 0_recall, "
        "0_f1, 1_precision, 1_recall, 1_f1"
    ]
    assert not (tmp_path / "run" / "run.json").exists()  # said before anything is written
    assert main([*args[:-5], "--out", str(tmp_path / "x"), "--metric", "accuracy"]) == 2
    assert "picks the best epoch on dev; give --dev or --dev-split" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:the model predicts")  # one class: not the point
def test_a_finished_finetuning_keeps_the_model_not_the_checkpoints(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = keyword_table(tmp_path / "t.tsv", 16, seed=0, header="text\tlabel")
    cfg = csv_config(tmp_path, tiny_model, table)
    best = run(cfg)
    out = Path(cfg.out)
    assert (out / "model.safetensors").is_file() and not (out / "checkpoints").exists()
    capsys.readouterr()
    assert run(cfg) == best  # run.json says it finished, without checkpoints/
    assert "already finished" in capsys.readouterr().out
    kept = csv_config(tmp_path / "k", tiny_model, table, keep_checkpoints=1)
    run(kept)
    assert [p.name for p in (Path(kept.out) / "checkpoints").iterdir()] == ["step-00000002"]


@pytest.mark.filterwarnings("ignore:the model predicts")  # one class: not the point
def test_the_temporary_directory_of_a_killed_save_is_removed_by_the_next_run(
    tmp_path: Path, tiny_model: Path
) -> None:
    table = keyword_table(tmp_path / "t.tsv", 16, seed=0, header="text\tlabel")
    cfg = csv_config(tmp_path, tiny_model, table, keep_checkpoints=1)
    stale = Path(cfg.out) / "checkpoints" / ".tmp-step-00000001-4242"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    run(cfg)
    assert [p.name for p in (Path(cfg.out) / "checkpoints").iterdir()] == ["step-00000002"]


# ------------------------------------------------------------------------------------------------
# prepare


def test_a_prepare_that_fails_midway_leaves_out_as_it_was(tmp_path: Path, minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    google, wiki, _ = write_corpus(tmp_path / "corpus", docs=60)
    bad = tmp_path / "corpus" / "bad.txt"
    bad.write_bytes(wiki.read_bytes() + b"caf\xe9 au lait.\n")  # not UTF-8, after many documents
    # small shards and batches: the first file's shards and progress.json are written before
    kwargs: dict[str, Any] = {"shard_tokens": 200, "batch_sentences": 20, "progress": False}

    def fails(out: Path) -> None:
        with pytest.raises(DataError, match=rf"{bad}: line \d+: byte 3 \(b'\\xe9'\) is not UTF-8"):
            prepare([google, bad], tok, out, **kwargs)

    new = tmp_path / "new"
    fails(new)
    assert not new.exists()

    mine = tmp_path / "mine"  # a directory that exists: what it held stays, alone
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    fails(mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "mine\n"


def test_a_resumed_prepare_that_fails_keeps_the_earlier_progress(
    tmp_path: Path, minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted prepare (Ctrl-C: its shards and progress.json stay, to go on from), run
    again and failing: back to what the interrupted run left."""
    from bertforge.data import shards as shards_module

    tok = Tokenizer.from_pretrained(minilm_dir)
    files = write_corpus(tmp_path / "corpus", docs=60)
    kwargs: dict[str, Any] = {"shard_tokens": 200, "batch_sentences": 20, "progress": False}
    real = shards_module._write_shard
    calls = {"n": 0}

    def stop_at(n: int, error: BaseException) -> Any:
        def write(*args: Any, **kw: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == n:
                raise error
            return real(*args, **kw)

        return write

    out = tmp_path / "out"
    monkeypatch.setattr(shards_module, "_write_shard", stop_at(3, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prepare(files, tok, out, **kwargs)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "progress.json" in before
    calls["n"] = 0
    monkeypatch.setattr(shards_module, "_write_shard", stop_at(3, OSError(28, "disk full")))
    with pytest.raises(OSError, match="disk full"):
        prepare(files, tok, out, **kwargs)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
