"""`bertforge finetune` / `evaluate` / `predict` (bertforge.train.finetune) for every family:
sentence(-pair) classification and regression, CoNLL NER, SQuAD v1.1/v2.0, SWAG; dev splits,
the tasks' prediction files, bad input through the command line, torchrun, accumulation."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertForPreTraining, BertForSequenceClassification, Tokenizer
from bertforge.cli import main
from bertforge.data.tasks import glue_task, read_conll
from bertforge.errors import DataError, FreshWeightsWarning
from bertforge.heads import BertForQuestionAnswering, BertForTokenClassification
from bertforge.pipelines import Pipeline
from bertforge.tasks.sentence import featurize
from bertforge.train.finetune import FinetuneConfig, evaluate_model, predict, run
from bertforge.train.supervised import epoch_batches
from tests.conftest import TINY
from tests.task_files import SWAG_HEADER, conll_text, keyword_table, ner_sentences, squad_file


@pytest.mark.slow
def test_pretrained_encoder_learns_a_sentence_task_and_evaluate_agrees(
    tmp_path: Path,
    minilm_dir: Path,
    capsys: pytest.CaptureFixture[str],
    recwarn: pytest.WarningsRecorder,
) -> None:
    train = keyword_table(tmp_path / "train.tsv", 256, seed=0)
    dev = keyword_table(tmp_path / "dev.tsv", 128, seed=1)
    out = tmp_path / "run"
    cfg = FinetuneConfig(
        model=str(minilm_dir),
        task="sst2",
        train=str(train),
        dev=str(dev),
        out=str(out),
        epochs=2,
        batch_size=16,
        lr=1e-4,
        progress=False,
    )
    best = run(cfg)
    assert best["accuracy"] >= 0.95
    # the new classifier is expected when fine-tuning: said once, not warned about
    said = capsys.readouterr().out
    assert (
        "new task head, initialised here and trained now: classifier.weight, classifier.bias"
        in said
    )
    assert not [w for w in recwarn if issubclass(w.category, FreshWeightsWarning)]
    saved = json.loads((out / "eval_results.json").read_text())
    assert saved["accuracy"] == best["accuracy"] and saved["task"] == "sst2"
    # the kept model is the best one: evaluating it again gives its numbers
    again = evaluate_model(str(out), "sst2", str(dev))
    assert again["accuracy"] == pytest.approx(best["accuracy"], abs=1e-9)
    model = BertForSequenceClassification.from_pretrained(out)
    assert model.config.id2label == {0: "0", 1: "1"}
    # metrics.jsonl has an evaluation per epoch
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_accuracy" in r] == [16, 32]
    # a finished run says so
    assert run(cfg) == {k: v for k, v in best.items()}


def test_finetuned_model_loads_in_transformers_with_the_same_logits(
    tmp_path: Path, tiny_model: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    train = tmp_path / "train.tsv"
    train.write_text(
        "sentence1\tsentence2\tlabel\n"
        + "".join(f"a man {i} walks\tsomeone is walking {i}\tentailment\n" for i in range(20))
        + "".join(f"a cat {i} sleeps\tthe dog barks {i}\tnot_entailment\n" for i in range(20))
    )
    out = tmp_path / "rte"
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="rte",
            train=str(train),
            out=str(out),
            epochs=1,
            batch_size=8,
            progress=False,
        )
    )
    ours = BertForSequenceClassification.from_pretrained(out).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    assert theirs.config.id2label == {0: "entailment", 1: "not_entailment"}
    tok = Tokenizer.from_pretrained(out)
    batch = tok(["a man walks", "a cat sleeps here"], ["someone walks", "the dog"])
    with torch.no_grad():
        a = ours(**batch).logits
        b = theirs(**batch).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_regression_and_a_table_of_your_own(tmp_path: Path, tiny_model: Path) -> None:
    rows = ["id,first,second,score"]
    rows += [f"{i},one thing {i},another thing,{(i % 5) * 1.25}" for i in range(30)]
    table = tmp_path / "scores.csv"
    table.write_text("\n".join(rows) + "\n")
    out = tmp_path / "reg"
    cfg = FinetuneConfig(
        model=str(tiny_model),
        task="csv",
        train=str(table),
        dev=str(table),
        out=str(out),
        text_column="first",
        text_pair_column="second",
        label_column="score",
        regression=True,
        epochs=1,
        batch_size=8,
        progress=False,
    )
    best = run(cfg)
    assert set(best) >= {"pearson", "spearman", "loss", "step", "epoch"}
    model = BertForSequenceClassification.from_pretrained(out)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"


def test_labels_not_in_the_label_set_name_file_line_and_field(
    tmp_path: Path, tiny_model: Path
) -> None:
    train = keyword_table(tmp_path / "train.tsv", 10, seed=0, header="text\tlabel")
    dev = tmp_path / "dev.tsv"
    dev.write_text("text\tlabel\na fine film\t1\na bad one\tmaybe\n")
    cfg = FinetuneConfig(
        model=str(tiny_model),
        task="csv",
        train=str(train),
        dev=str(dev),
        out=str(tmp_path / "o"),
        progress=False,
    )
    with pytest.raises(DataError, match=rf"{dev}: line 3: .*label.*'maybe'"):
        run(cfg)
    assert not (tmp_path / "o" / "model.safetensors").exists()


@pytest.mark.slow
def test_cli_finetune_and_evaluate(tmp_path: Path, tiny_model: Path) -> None:
    train = keyword_table(tmp_path / "train.tsv", 24, seed=0)
    out = tmp_path / "cli"
    base = [sys.executable, "-m", "bertforge"]
    done = subprocess.run(
        [
            *base,
            "finetune",
            "--model",
            str(tiny_model),
            "--task",
            "sst2",
            "--train",
            str(train),
            "--dev",
            str(train),
            "--out",
            str(out),
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "best dev accuracy" in done.stdout
    ev = subprocess.run(
        [*base, "evaluate", "--model", str(out), "--task", "sst2", "--data", str(train), "--json"],
        capture_output=True,
        text=True,
    )
    assert ev.returncode == 0, ev.stderr[-2000:]
    metrics = json.loads(ev.stdout)
    saved = json.loads((out / "eval_results.json").read_text())
    assert metrics["accuracy"] == pytest.approx(saved["accuracy"], abs=1e-9)
    bad = subprocess.run(
        [*base, "evaluate", "--model", str(out), "--task", "sst2", "--data", str(tmp_path / "no")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and str(tmp_path / "no") in bad.stderr


@pytest.mark.slow
def test_two_processes_follow_one_process(tmp_path: Path, tiny_model_nodrop: Path) -> None:
    """`torchrun --nproc_per_node 2 bertforge finetune` (gloo, CPU) with the same global batch
    takes the same steps as one process: the same losses and, within float noise, the same
    model. Dropout is off: its masks are drawn per process and could not match."""
    base = tiny_model_nodrop
    train = keyword_table(tmp_path / "train.tsv", 64, seed=0)
    dev = keyword_table(tmp_path / "dev.tsv", 32, seed=1)

    def finetune(out: Path, *launcher: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                *launcher,
                "bertforge",
                "finetune",
                "--model",
                str(base),
                "--task",
                "sst2",
                "--train",
                str(train),
                "--dev",
                str(dev),
                "--out",
                str(out),
                "--epochs",
                "2",
                "--batch-size",
                "8",
                "--precision",
                "fp32",
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )

    one = finetune(tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = finetune(
        tmp_path / "two", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "over 2 processes" in two.stdout and two.stdout.count("fine-tuning ") == 1

    def curve(out: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return (
            [(r["step"], r["loss"]) for r in rows if "loss" in r],
            [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r],
        )

    (loss1, eval1), (loss2, eval2) = curve(tmp_path / "one"), curve(tmp_path / "two")
    assert [s for s, _ in loss1] == [s for s, _ in loss2] and loss1
    assert max(abs(a - b) for (_, a), (_, b) in zip(loss1, loss2)) < 1e-5, (loss1, loss2)
    assert eval1 == eval2 and [s for s, _ in eval1] == [8, 16]
    a = BertForSequenceClassification.from_pretrained(tmp_path / "one").state_dict()
    b = BertForSequenceClassification.from_pretrained(tmp_path / "two").state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


def test_epoch_batches_cover_every_example_once_grouped_by_length() -> None:
    lengths = np.random.default_rng(0).integers(5, 120, 1000)
    batches = epoch_batches(lengths, 32, seed=3, epoch=1)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(1000))
    assert all(len(b) <= 32 for b in batches)
    # grouped: a batch's lengths spread much less than random batches' would
    spread = np.mean([np.ptp(lengths[b]) for b in batches if len(b) == 32])
    assert spread < 20
    assert [b.tolist() for b in epoch_batches(lengths, 32, 3, 1)] == [b.tolist() for b in batches]
    assert [b.tolist() for b in epoch_batches(lengths, 32, 3, 2)] != [b.tolist() for b in batches]


def test_every_process_has_rows_in_every_step(tmp_path: Path, minilm_dir: Path) -> None:
    """Two processes, 17 rows in batches of 8: the batch of one row would leave a process
    without rows (it went on to the next batch while the other trained on this one, out of
    step); it is left out of the epoch, and every step gives both processes rows of one batch.
    Fewer rows than processes: an error naming the file."""
    from bertforge.tasks import family
    from bertforge.train.distributed import Dist
    from bertforge.train.supervised import SupervisedTask, load_data

    tok = Tokenizer.from_pretrained(minilm_dir)
    train = keyword_table(tmp_path / "train.tsv", 17, seed=0)
    cfg = FinetuneConfig(
        model=str(minilm_dir), task="sst2", train=str(train), out=str(tmp_path / "x"), batch_size=8
    )
    tasks = [
        SupervisedTask(family(cfg, tok), cfg, Dist(r, 2, r, torch.device("cpu"))) for r in (0, 1)
    ]
    for task in tasks:
        load_data(task, cfg)
    assert [task.steps_per_epoch for task in tasks] == [2, 2]
    streams = [task.batches(None) for task in tasks]
    for step in range(6):  # three epochs
        (micro0, at0), (micro1, at1) = (next(s) for s in streams)
        epoch, second = divmod(step, 2)
        assert (
            at0
            == at1
            == ({"epoch": epoch + 1, "batch": 0} if second else {"epoch": epoch, "batch": 1})
        )
        assert [len(m.input_ids) for m in micro0 + micro1] == [4, 4]
    one = keyword_table(tmp_path / "one.tsv", 1, seed=0)
    small = FinetuneConfig(
        model=str(minilm_dir), task="sst2", train=str(one), out=str(tmp_path / "y"), batch_size=8
    )
    task = SupervisedTask(family(small, tok), small, Dist(0, 2, 0, torch.device("cpu")))
    with pytest.raises(DataError, match=r"one.tsv: 1 training rows for 2 processes"):
        load_data(task, small)


def test_pairs_are_truncated_longest_first(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    from bertforge.data.tasks import Example

    long = " ".join(["word"] * 100)
    ex = [Example("short text", long, "entailment", "g", "f:2")]
    f = featurize(ex, tok, glue_task("rte"), 32)
    assert len(f.input_ids[0]) == 32
    types = f.token_type_ids[0]
    assert (types == 0).sum() == 4  # [CLS] short text [SEP] kept whole


def test_micro_batches_accumulate_to_the_same_steps(tmp_path: Path, minilm_dir: Path) -> None:
    """--micro-batch-size 3 of a batch of 8 (micro-batches of 3, 3, 2): the loss of each step is
    the mean over the whole batch, so the losses and the model are those of whole batches
    (dropout off: its masks follow the micro-batches' shapes)."""
    tok = Tokenizer.from_pretrained(minilm_dir)
    config = BertConfig(
        **{**TINY, "vocab_size": tok.vocab_size},
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    base = tmp_path / "base"
    BertForPreTraining(config).save_pretrained(base)
    tok.save_pretrained(base)
    train = keyword_table(tmp_path / "train.tsv", 40, seed=0)

    def losses(out: Path, micro: int | None) -> list[float]:
        run(
            FinetuneConfig(
                model=str(base),
                task="sst2",
                train=str(train),
                out=str(out),
                epochs=1,
                batch_size=8,
                micro_batch_size=micro,
                precision="fp32",
                log_every=1,
                progress=False,
            )
        )
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    from bertforge.tasks import family
    from bertforge.train.distributed import Dist
    from bertforge.train.supervised import SupervisedTask, load_data

    cfg = FinetuneConfig(
        model=str(base),
        task="sst2",
        train=str(train),
        out=str(tmp_path / "x"),
        batch_size=8,
        micro_batch_size=3,
    )
    task = SupervisedTask(family(cfg, tok), cfg, Dist(0, 1, 0, torch.device("cpu")))
    load_data(task, cfg)
    step, _ = next(task.batches(None))
    assert [len(m.input_ids) for m in step] == [3, 3, 2]
    whole, micro = losses(tmp_path / "whole", None), losses(tmp_path / "micro", 3)
    assert len(whole) == 5 and max(abs(a - b) for a, b in zip(whole, micro)) < 1e-5
    a = BertForSequenceClassification.from_pretrained(tmp_path / "whole").state_dict()
    b = BertForSequenceClassification.from_pretrained(tmp_path / "micro").state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_bf16_training_batches_are_padded_to_a_multiple(tmp_path: Path, minilm_dir: Path) -> None:
    """In bf16 each training micro-batch is padded to runner.PAD_MULTIPLE pieces (the CPU keeps
    its bf16 kernels per shape, so every new length costs memory and time); fp32 stays unpadded
    (its numbers are compared bit for bit with the reference)."""
    from bertforge.runner import PAD_MULTIPLE
    from bertforge.tasks import family
    from bertforge.train.distributed import Dist
    from bertforge.train.supervised import SupervisedTask, load_data

    tok = Tokenizer.from_pretrained(minilm_dir)
    train = keyword_table(tmp_path / "train.tsv", 40, seed=0)
    shapes = {}
    for precision in ("bf16", "fp32"):
        cfg = FinetuneConfig(
            model=str(minilm_dir),
            task="sst2",
            train=str(train),
            out=str(tmp_path / precision),
            batch_size=8,
            micro_batch_size=3,
            precision=precision,
        )
        task = SupervisedTask(family(cfg, tok), cfg, Dist(0, 1, 0, torch.device("cpu")))
        load_data(task, cfg)
        steps = iter(task.batches(None))
        shapes[precision] = [
            (m.input_ids.shape[1], int(m.attention_mask.sum(1).max()), m.num_tokens)
            for _ in range(5)
            for m in next(steps)[0]
        ]
    for (t16, longest16, n16), (t32, longest32, n32) in zip(shapes["bf16"], shapes["fp32"]):
        assert (longest16, n16) == (longest32, n32) and t32 == longest32  # the same rows
        assert t16 == -(-t32 // PAD_MULTIPLE) * PAD_MULTIPLE
    assert any(t % PAD_MULTIPLE for t, _, _ in shapes["fp32"])  # padding did something


@pytest.mark.parametrize(
    ("task", "option", "per_row"),
    [("rerank", {"micro_batch_size": 2}, 4), ("retrieval", {"cache_chunk": 3}, 1)],
)
def test_the_dev_pass_reads_as_few_rows_at_once_as_training(
    tmp_path: Path,
    tiny_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    task: str,
    option: dict,
    per_row: int,
) -> None:
    """What bounds a step's memory (--micro-batch-size groups, --cache-chunk texts a pass)
    bounds the dev pass's too: it reads at most twice a training pass's rows at once, not twice
    --batch-size (64 rerank groups of 8 pairs a dev pass: 3.1 GB where training took 2.1)."""
    from bertforge.model import BertModel

    def rows(n: int, start: int) -> str:
        """n groups: a query, its passage and three of the others' as negatives."""
        texts = [f"passage {i} tells of topic {i} at some length" for i in range(start, start + n)]
        others = [[texts[(i + k) % n] for k in (1, 2, 3)] for i in range(n)]
        lines = [
            {"query": f"what of topic {start + i}", "positive": t, "negatives": others[i]}
            for i, t in enumerate(texts)
        ]
        return "".join(json.dumps(x) + "\n" for x in lines)

    (tmp_path / "train.jsonl").write_text(rows(16, 0))
    (tmp_path / "dev.jsonl").write_text(rows(10, 100))
    seen: list[tuple[bool, int]] = []  # (training, rows) of every pass through the encoder
    forward = BertModel.forward

    def counted(self: BertModel, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append((self.training, len(input_ids)))
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(BertModel, "forward", counted)
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task=task,
            train=str(tmp_path / "train.jsonl"),
            dev=str(tmp_path / "dev.jsonl"),
            out=str(tmp_path / "out"),
            epochs=1,
            batch_size=8,
            precision="fp32",
            progress=False,
            **option,
        )
    )
    limit = next(iter(option.values())) * per_row  # encoder rows of one training pass
    training = [n for t, n in seen if t]
    dev = [n for t, n in seen if not t]
    assert max(training) == limit
    # every dev row was read (rerank: 10 groups of 4 pairs; retrieval: 10 queries, 10 passages)
    assert sum(dev) == {"rerank": 40, "retrieval": 20}[task]
    assert max(dev) <= 2 * limit


# ------------------------------------------------------------------------------------------------
# Beyond sentence tasks: CoNLL NER, SQuAD v1.1/v2.0, SWAG; dev splits, `predict`, the tasks'
# prediction files, bad input through the command line


# ------------------------------------------------------------------------------------------------
# SQuAD features


# ------------------------------------------------------------------------------------------------
# End to end: files written in the task's format, evaluate and predict agree


@pytest.mark.parametrize("task", ["squad", "squad2"])
def test_squad_trains_and_writes_the_official_files(
    task: str, tmp_path: Path, tiny_model: Path
) -> None:
    data = squad_file(tmp_path / "squad.json", task == "squad2")
    out = tmp_path / "run"
    best = run(
        FinetuneConfig(
            model=str(tiny_model),
            task=task,
            train=str(data),
            dev=str(data),
            out=str(out),
            epochs=1,
            batch_size=4,
            max_seq_length=48,
            doc_stride=16,
            progress=False,
        )
    )
    qids = {
        q["id"] for p in json.loads(data.read_text())["data"][0]["paragraphs"] for q in p["qas"]
    }
    predictions = json.loads((out / "predictions.json").read_text())
    assert set(predictions) == qids and all(isinstance(v, str) for v in predictions.values())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert all(abs(sum(c["probability"] for c in v) - 1) < 1e-6 for v in nbest.values())
    assert (out / "null_odds.json").exists() == (task == "squad2")
    model = BertForQuestionAnswering.from_pretrained(out)
    assert model.config.num_labels == 2
    again = evaluate_model(str(out), task, str(data), max_seq_length=48, doc_stride=16)
    assert again["f1"] == pytest.approx(best["f1"], abs=1e-6)
    assert ("HasAns_f1" in again) == (task == "squad2")


@pytest.mark.slow
def test_minilm_learns_ner_and_writes_conll_columns(tmp_path: Path, minilm_dir: Path) -> None:
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text(conll_text(ner_sentences(96, 0)))
    dev.write_text(conll_text(ner_sentences(32, 1)))
    out = tmp_path / "ner"
    best = run(
        FinetuneConfig(
            model=str(minilm_dir),
            task="conll2003",
            train=str(train),
            dev=str(dev),
            out=str(out),
            epochs=3,
            batch_size=16,
            lr=2e-4,
            progress=False,
        )
    )
    assert best["f1"] >= 0.9
    model = BertForTokenClassification.from_pretrained(out)
    assert set(model.config.label2id) == {"O", "B-PER", "I-PER", "B-LOC"}
    rows = [x.split() for x in (out / "predictions_conll.txt").read_text().splitlines()]
    words = [r for r in rows if r]
    assert len(words) == sum(len(s.tokens) for s in read_conll(dev)) and all(
        len(r) == 3 for r in words
    )
    # predict on tokens alone (one per line): the same tags as the evaluation's
    tokens_only = tmp_path / "tokens.txt"
    tokens_only.write_text("\n".join(r[0] if r else "" for r in rows) + "\n")
    (path,) = predict(str(out), "conll2003", str(tokens_only), str(tmp_path / "pred"))
    predicted = [x.split() for x in path.read_text().splitlines() if x.strip()]
    assert [p[1] for p in predicted] == [r[2] for r in words]
    # the ner pipeline on raw text: entities merged over pieces, with character offsets
    text = "Farouk Smithson went to Tbilisi on Monday"
    (entities,) = Pipeline(out, precision="fp32").ner([text])
    assert [(e["entity"], e["text"]) for e in entities] == [
        ("PER", "Farouk Smithson"),
        ("LOC", "Tbilisi"),
    ]
    assert all(text[e["start"] : e["end"]] == e["text"] for e in entities)


def test_swag_trains_and_predicts_end_to_end(tmp_path: Path, tiny_model: Path) -> None:
    rows = [SWAG_HEADER]
    for i in range(8):
        rows.append(
            f'v{i},{i},x,"The man picks up a cup {i}.",He,gold,"drinks.","sings loudly.",'
            f'"flies away.","melts.",{i % 4}'
        )
    data = tmp_path / "swag.csv"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "swag"
    best = run(
        FinetuneConfig(
            model=str(tiny_model),
            task="swag",
            train=str(data),
            dev=str(data),
            out=str(out),
            epochs=1,
            batch_size=4,
            progress=False,
        )
    )
    assert 0.0 <= best["accuracy"] <= 1.0 and "loss" in best
    with (out / "predictions_swag.csv").open() as f:
        written = list(csv.DictReader(f))
    assert len(written) == 8 and {r["label"] for r in written} <= {"0", "1", "2", "3"}
    (path,) = predict(str(out), "swag", str(data), str(tmp_path / "p"))
    assert path.read_text() == (out / "predictions_swag.csv").read_text()


def test_swag_shared_format_sample(data_dir: Path, tmp_path: Path, tiny_model: Path) -> None:
    sample = data_dir / "swag" / "swag_train_first11rows.fixture.csv"
    best = run(
        FinetuneConfig(
            model=str(tiny_model),
            task="swag",
            train=str(sample),
            dev=str(sample),
            out=str(tmp_path / "s"),
            epochs=1,
            batch_size=4,
            progress=False,
        )
    )
    assert "accuracy" in best
    (path,) = predict(str(tmp_path / "s"), "swag", str(sample), str(tmp_path / "p"))
    assert len(path.read_text().splitlines()) == 12


def test_dev_split_and_glue_predictions(tmp_path: Path, tiny_model: Path) -> None:
    table = tmp_path / "spam.tsv"
    table.write_text(
        "".join(f"{'spam' if i % 3 == 0 else 'ham'}\tmessage number {i}\n" for i in range(40))
    )
    out = tmp_path / "spam"
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="csv",
            train=str(table),
            out=str(out),
            dev_split=0.25,
            no_header=True,
            text_column="1",
            label_column="0",
            epochs=1,
            batch_size=8,
            progress=False,
        )
    )
    with (out / "predictions_csv.tsv").open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 1 + 10
    assert {r[1] for r in rows[1:]} <= {"ham", "spam"}
    # unlabelled GLUE test file: index<TAB>prediction with the file's own index column
    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence\n7\ta fine film\n9\ta dull one\n")
    sst = tmp_path / "sst"
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\na fine film\t1\na dull one\t0\n")
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="sst2",
            train=str(train),
            out=str(sst),
            epochs=1,
            batch_size=2,
            progress=False,
        )
    )
    (path,) = predict(str(sst), "sst2", str(test), str(tmp_path / "p"))
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction" and [x.split("\t")[0] for x in lines[1:]] == ["7", "9"]


def test_dev_split_keeps_the_whole_files_label_set(tmp_path: Path, tiny_model: Path) -> None:
    """A class whose every row --dev-split holds out is still one of the model's."""
    from bertforge.data.tasks import split_train_test
    from bertforge.tasks import family
    from bertforge.train.distributed import Dist
    from bertforge.train.supervised import SupervisedTask, load_data

    n = 20
    _, held_out = split_train_test(list(range(n)), 0.25)
    labels = ["rare" if i == held_out[0] else "ab"[i % 2] for i in range(n)]
    table = tmp_path / "train.tsv"
    table.write_text("".join(f"{y}\tmessage number {i}\n" for i, y in enumerate(labels)))
    cfg = FinetuneConfig(
        model=str(tiny_model),
        task="csv",
        train=str(table),
        out=str(tmp_path / "o"),
        dev_split=0.25,
        no_header=True,
        text_column="1",
        label_column="0",
        progress=False,
    )
    task = SupervisedTask(family(cfg, Tokenizer.from_pretrained(tiny_model)), cfg, Dist())
    train, dev = load_data(task, cfg)
    assert "rare" not in {e.label for e in train} and "rare" in {e.label for e in dev or []}
    assert task.family.spec.labels == ("a", "b", "rare")  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------
# Bad input through the command line: one line naming file, line and field; no traceback


def _bad_inputs(tmp: Path) -> list[tuple[str, list[str], str]]:
    missing = tmp / "missing.tsv"
    missing.write_text("sentence\tlabel\ngood film\t1\nno label here\n")
    unknown = tmp / "unknown.tsv"
    unknown.write_text("sentence\tlabel\ngood film\t1\nbad film\tmaybe\n")
    empty = tmp / "empty.tsv"
    empty.write_text("sentence\tlabel\ngood film\t1\n \t0\n")
    squad = tmp / "squad.json"
    squad.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "title": "t",
                        "paragraphs": [
                            {
                                "context": "a b c",
                                "qas": [
                                    {
                                        "id": "q1",
                                        "question": "?",
                                        "answers": [{"text": "b", "answer_start": 0}],
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        )
    )
    conll = tmp / "conll.txt"
    conll.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP\n")
    pos = tmp / "pos.txt"  # POS tags: no entities to decode (the dev metric, `ner`)
    pos.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
    v2 = squad_file(tmp / "v2.json", version_2=True)
    spam = tmp / "spam.tsv"
    spam.write_text("ham\tsee you\nspam\twin now\n")
    unclosed = tmp / "open.csv"
    unclosed.write_text('text,label\ngood film,1\n"bad film,0\nfine film,1\n')
    return [
        ("sst2", [str(missing)], rf"{missing}: line 3: .*(column|field)"),
        ("sst2", [str(unknown)], rf"{unknown}: line 3: .*label.*'maybe'"),
        ("sst2", [str(empty)], rf"{empty}: line 3: .*sentence.*empty"),
        ("squad", [str(squad)], rf"{squad}: .*q1.*answer_start"),
        ("conll2003", [str(conll)], rf"{conll}: line 2: 3 columns, expected 4"),
        ("conll2003", [str(pos), "--tag-column", "1"], rf"{pos}: line 1: .*'NNP' is not O or"),
        ("squad", [str(v2)], rf"{v2}: .*\(id q2\).*--task squad2"),
        ("csv", [str(spam), "--no-header", "--text-column", "1"], r"\(--label-column\)"),
        ("csv", [str(unclosed)], rf"{unclosed}: line 3: a quoted field never closed"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_bad_input_is_one_clear_error(
    case: int, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task, files, pattern = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    rc = main(
        [
            "finetune",
            "--model",
            str(tiny_model),
            "--task",
            task,
            "--train",
            *files,  # the file, and any options it needs
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    errors = [x for x in err if x.startswith("bertforge: error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err)
    import re

    assert re.search(pattern, errors[0], re.IGNORECASE), errors[0]
    assert not (out / "model.safetensors").exists()


def test_unknown_tag_in_dev_names_file_line_and_field(tmp_path: Path, tiny_model: Path) -> None:
    from bertforge.errors import DataError

    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text(conll_text(ner_sentences(4, 0)))
    dev.write_text(conll_text([[("Zed", "B-MISC"), ("ran", "O")]]))
    with pytest.raises(DataError, match=rf"{dev}: line 3: field \"tag\".*'B-MISC'"):
        run(
            FinetuneConfig(
                model=str(tiny_model),
                task="conll2003",
                train=str(train),
                dev=str(dev),
                out=str(tmp_path / "o"),
                progress=False,
            )
        )


def test_token_classification_logits_match_transformers(tmp_path: Path, tiny_model: Path) -> None:
    transformers = pytest.importorskip("transformers")
    train = tmp_path / "train.txt"
    train.write_text(conll_text(ner_sentences(8, 0)))
    out = tmp_path / "ner"
    run(
        FinetuneConfig(
            model=str(tiny_model),
            task="conll2003",
            train=str(train),
            out=str(out),
            epochs=1,
            batch_size=4,
            progress=False,
        )
    )
    theirs = transformers.BertForTokenClassification.from_pretrained(out).eval()
    ours = BertForTokenClassification.from_pretrained(out).eval()
    assert theirs.config.id2label == ours.config.id2label
    batch = Tokenizer.from_pretrained(out)(["Alice went to Paris", "Bob"])
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, theirs(**batch).logits, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Row limits; evaluate and predict take the task from the run they evaluate


def _tree_hashes(root: Path) -> dict[str, str]:
    import hashlib

    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        for p in sorted(root.rglob("*"))
    }


def test_row_limits_and_evaluate_predict_from_the_run(
    tmp_path: Path,
    tiny_model: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    header = "words\ttone"  # not the csv task's default columns: they must come from run.json
    train = keyword_table(tmp_path / "train.tsv", 20, seed=0, header=header)
    dev = keyword_table(tmp_path / "dev.tsv", 12, seed=1, header=header)
    out = tmp_path / "run"
    columns = ["--text-column", "words", "--label-column", "tone"]
    common = ["--model", str(tiny_model), "--task", "csv", *columns, "--train", str(train)]
    limits = ["--max-train-rows", "5", "--max-dev-rows", "3"]
    steps = ["--epochs", "1", "--batch-size", "2", "--log-every", "1", "--no-progress"]
    argv = ["finetune", *common, "--dev", str(dev), "--out", str(out), *limits, *steps]
    assert main(argv) == 0
    assert "5 training examples, 3 dev" in capsys.readouterr().out
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 3  # ceil(5 / 2): five examples trained on
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["max_train_rows"] == 5 and settings["max_dev_rows"] == 3
    with (out / "predictions_csv.tsv").open() as f:  # the dev file's first three rows
        assert [r[0] for r in csv.reader(f, delimiter="\t")] == ["index", "0", "1", "2"]
    # the row limits make another run: not resumed with other ones
    assert main([*argv, "--max-train-rows", "6"]) == 2
    assert "max_train_rows: 5 -> 6" in capsys.readouterr().err

    before = _tree_hashes(out)
    # no --task: the run's task and columns; no --out: nothing written anywhere
    assert main(["evaluate", "--model", str(out), "--data", str(dev), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    given = evaluate_model(str(out), "csv", str(dev), text_column="words", label_column="tone")
    assert metrics == given and capsys.readouterr().err == ""  # no line for a short run
    # the command line shows how far it is on stderr (off a terminal, a line every
    # LINE_SECONDS: here always), stdout the metrics alone
    from bertforge import runner

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)
    assert main(["evaluate", "--model", str(out), "--data", str(dev), "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out) == given
    assert got.err.splitlines()[-1].startswith("evaluate: 12/12 examples (100%)"), got.err
    ev = tmp_path / "ev"
    limit = ["--max-rows", "4", "--out", str(ev), "--no-progress"]
    assert main(["evaluate", "--model", str(out), "--data", str(dev), *limit]) == 0
    assert capsys.readouterr().err == ""
    assert len((ev / "predictions_csv.tsv").read_text().splitlines()) == 1 + 4  # four rows scored
    assert main(["predict", "--model", str(out), "--data", str(dev), "--out", str(ev / "p")]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("predict: 12/12 examples (100%)")
    assert len((ev / "p" / "predictions_csv.tsv").read_text().splitlines()) == 1 + 12
    assert _tree_hashes(out) == before  # the training run's files are left as they were
    capsys.readouterr()
    # what the command line gives wins: --task (its own columns: sentence, label) ...
    assert main(["evaluate", "--model", str(out), "--data", str(dev), "--task", "sst2"]) == 2
    assert "sentence" in capsys.readouterr().err
    # ... and a column
    other = keyword_table(tmp_path / "other.tsv", 6, seed=2, header="review\ttone")
    assert main(["evaluate", "--model", str(out), "--data", str(other)]) == 2
    assert "words" in capsys.readouterr().err
    argv = ["evaluate", "--model", str(out), "--data", str(other), "--text-column", "review"]
    assert main([*argv, "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) >= {"accuracy"}
    assert main(["evaluate", "--model", str(out), "--data", str(dev), "--max-rows", "0"]) == 2
    assert "max_rows=0 (--max-rows): must be >= 1" in capsys.readouterr().err


def test_training_batches_are_not_padded_past_the_models_positions() -> None:
    """bf16 rounds a batch's length up to 16 pieces, but not past max_position_embeddings: a
    model of 40 positions reads 37-piece rows padded to 40, not 48."""
    from types import SimpleNamespace

    import numpy as np

    from bertforge.tasks.base import Features
    from bertforge.train.supervised import LengthGroupedBatches

    rows = [np.arange(1, 38, dtype=np.int64)] * 4
    features = Features(rows, [np.zeros(37, np.int64)] * 4, np.zeros(4, np.int64))
    cfg = SimpleNamespace(batch_size=4, micro_batch_size=None, seed=0)
    d = SimpleNamespace(rank=0, world_size=1)
    for positions, width in ((None, 48), (40, 40)):
        grouped = LengthGroupedBatches(cfg, d, 0, multiple=16, positions=positions)  # type: ignore[arg-type]
        [batch], _ = next(grouped.batches(features, None))
        assert batch.input_ids.shape == (4, width)
