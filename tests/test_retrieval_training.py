"""Bi-encoder training (`finetune --task retrieval`, tasks/retrieval.py, data/tasks/retrieval.py):
the loss is sentence-transformers' MultipleNegativesRankingLoss, duplicates are not negatives,
the result loads in SentenceTransformer with the vectors `bertforge embed` gives."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.data.tasks import read_retrieval
from bertforge.errors import DataError, InputError
from bertforge.pipelines import Pipeline
from bertforge.tasks.retrieval import ranking_loss

TOPICS = ["cats", "dogs", "paris", "rome", "python", "tea", "piano", "chess"]


def toy(path: Path, negatives: bool = False) -> Path:
    rows = []
    for i, t in enumerate(TOPICS):
        for k in range(2):
            row = {"query": f"tell me about {t} {k}", "positive": f"All about {t}: fact {k}."}
            if negatives:
                row["negatives"] = [f"All about {TOPICS[(i + 1) % len(TOPICS)]}: fact {k}."]
            rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_loss_is_multiple_negatives_ranking_loss() -> None:
    pytest.importorskip("sentence_transformers")
    try:  # sentence-transformers 6; before: sentence_transformers.losses
        from sentence_transformers.sentence_transformer import losses
    except ImportError:
        from sentence_transformers import losses

    torch.manual_seed(0)
    q, p, n = torch.randn(6, 16), torch.randn(6, 16), torch.randn(6, 16)
    mnrl = losses.MultipleNegativesRankingLoss(model=None)  # type: ignore[arg-type]
    want = mnrl.compute_loss_from_embeddings([q, p, n], None)
    passages = torch.stack([p, n], 1).reshape(12, 16)
    same = torch.zeros(6, 12, dtype=torch.bool)
    got = ranking_loss(q, passages, torch.arange(6) * 2, same) / 6
    assert float(got) == pytest.approx(float(want), rel=1e-5)


def test_symmetric_is_multiple_negatives_ranking_loss_both_ways() -> None:
    """--symmetric: sentence-transformers' MultipleNegativesRankingLoss with directions
    query_to_doc and doc_to_query (per_direction); with a shared positive, the other query of
    that positive is not taught as the positive's negative."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer import losses

    torch.manual_seed(0)
    q, p, n = torch.randn(6, 16), torch.randn(6, 16), torch.randn(6, 16)
    both = ("query_to_doc", "doc_to_query")
    mnsrl = losses.MultipleNegativesRankingLoss(
        model=None,  # type: ignore[arg-type]
        directions=both,  # type: ignore[arg-type]
        partition_mode="per_direction",
    )
    want = mnsrl.compute_loss_from_embeddings([q, p, n], None)
    passages = torch.stack([p, n], 1).reshape(12, 16)
    same = torch.zeros(6, 12, dtype=torch.bool)
    got = ranking_loss(q, passages, torch.arange(6) * 2, same, symmetric=True) / 6
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert float(got) != pytest.approx(
        float(ranking_loss(q, passages, torch.arange(6) * 2, same) / 6)
    )

    q, p = q[:3], p[:3].clone()
    p[1] = p[0]
    same = torch.zeros(3, 3, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True
    s = 20 * torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(p, dim=-1).T
    keep = [[0, 2], [1, 2], [0, 1, 2]]  # of each query's passages / each positive's queries
    forward = sum(-torch.log_softmax(s[i, k], 0)[k.index(i)] for i, k in enumerate(keep))
    backward = sum(-torch.log_softmax(s[k, j], 0)[k.index(j)] for j, k in enumerate(keep))
    got = ranking_loss(q, p, torch.arange(3), same, symmetric=True)
    assert float(got) == pytest.approx(float(forward + backward) / 2, rel=1e-5)


@pytest.mark.parametrize("mode", ["all_negatives", "in_batch_negatives", "hard_negatives"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_hardness_is_sentence_transformers_hardness(mode: str, symmetric: bool) -> None:
    """--hardness-mode M --hardness-strength A: sentence-transformers' MultipleNegativesRankingLoss
    with hardness_mode M and hardness_strength A (two hard negatives per query; our passages are
    query by query, theirs negative by negative), alone and with the doc_to_query direction."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer import losses

    torch.manual_seed(0)
    q, p, n1, n2 = (torch.randn(5, 16) for _ in range(4))
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    reference = losses.MultipleNegativesRankingLoss(
        model=None,  # type: ignore[arg-type]
        directions=directions,  # type: ignore[arg-type]
        partition_mode="per_direction",
        hardness_mode=mode,  # type: ignore[arg-type]
        hardness_strength=5.0,
    )
    want = reference.compute_loss_from_embeddings([q, p, n1, n2], None)
    passages = torch.stack([p, n1, n2], 1).reshape(15, 16)
    same = torch.zeros(5, 15, dtype=torch.bool)
    targets = torch.arange(5) * 3
    got = ranking_loss(q, passages, targets, same, symmetric, (mode, 5.0)) / 5
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    plain = ranking_loss(q, passages, targets, same, symmetric) / 5
    assert float(got) > float(plain)  # harder negatives weigh more


def test_the_same_passage_twice_is_not_a_negative() -> None:
    """Queries 0 and 1 share their positive: neither learns it as the other's negative."""
    torch.manual_seed(0)
    q, p = torch.randn(3, 8), torch.randn(3, 8)
    p[1] = p[0]
    same = torch.zeros(3, 3, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True
    got = ranking_loss(q, p, torch.arange(3), same)
    s = 20 * torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(p, dim=-1).T
    want = sum(
        -torch.log_softmax(s[i, keep], 0)[keep.index(i)]
        for i, keep in enumerate([[0, 2], [1, 2], [0, 1, 2]])
    )
    assert float(got) == pytest.approx(float(want), rel=1e-5)


def test_training_writes_a_sentence_transformers_model(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    st = pytest.importorskip("sentence_transformers")
    train, out = toy(tmp_path / "train.jsonl", negatives=True), tmp_path / "out"
    args = ["finetune", "--task", "retrieval", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--dev", str(train), "--out", str(out), "--epochs", "1", "--batch-size", "8"]
    assert main([*args, "--precision", "fp32", "--no-progress"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "retrieval" and 0 < results["mrr@10"] <= 1
    assert (out / "modules.json").is_file() and (out / "predictions_retrieval.jsonl").is_file()
    texts = ["tell me about cats", "All about rome: fact 1.", "an unrelated sentence"]
    ours = Pipeline(out, precision="fp32").embed(texts)
    np.testing.assert_allclose(st.SentenceTransformer(str(out)).encode(texts), ours, atol=1e-5)
    before = Pipeline(minilm_dir, precision="fp32").embed(texts)
    assert np.abs(before - ours).max() > 1e-3  # it trained
    # evaluate reads the same pooling from the trained directory
    assert main(["evaluate", "--model", str(out), "--data", str(train), "--precision", "fp32"]) == 0
    assert f"{results['mrr@10']:.4f}" in capsys.readouterr().out


def test_a_plain_bert_gets_mean_pooling_and_normalisation(tiny_model: Path, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    train, out = toy(tmp_path / "train.jsonl"), tmp_path / "out"
    args = ["finetune", "--task", "retrieval", "--model", str(tiny_model), "--train", str(train)]
    assert main([*args, "--out", str(out), "--epochs", "1", "--no-progress"]) == 0
    texts = ["tell me about cats", "All about rome: fact 1."]
    ours = Pipeline(out, precision="fp32").embed(texts)
    assert np.allclose(np.linalg.norm(ours, axis=-1), 1, atol=1e-5)
    np.testing.assert_allclose(st.SentenceTransformer(str(out)).encode(texts), ours, atol=1e-5)


def test_reader_errors(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_text(
        '{"query": "q", "positive": "p", "negatives": ["n"]}\n{"query": "q", "positive": "p"}\n'
    )
    with pytest.raises(DataError, match=r"a.jsonl:2: 0 negatives, but .*a.jsonl:1 has 1"):
        read_retrieval(f)
    f.write_text('{"query": "q"}\n')
    with pytest.raises(DataError, match=r'line 1: field "positive"'):
        read_retrieval(f)
    t = tmp_path / "a.tsv"
    t.write_text("question\tanswer\nq\tp\n")
    with pytest.raises(DataError, match='needs "query" and "positive" columns'):
        read_retrieval(t)
    t.write_text("query\tpositive\tnegative_1\tnegative_2\nq\tp\tn1\tn2\n")
    (e,) = read_retrieval(t)
    assert (e.query, e.positive, e.negatives) == ("q", "p", ("n1", "n2"))


def with_teacher(path: Path) -> Path:
    """The rows of `path` with a teacher's "scores" of their positive and negatives."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, r in enumerate(rows):
        r["scores"] = [3.0 - i % 3, -1.0 + 0.5 * i, *([0.25] * (len(r["negatives"]) - 1))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def gradcache_case(
    tiny_model: Path,
    chunk: int | None,
    train_mode: bool,
    teacher: float | None = None,
    symmetric: bool = False,
    hardness: str | None = None,
) -> tuple:
    from bertforge import Tokenizer
    from bertforge.model import BertModel
    from bertforge.tasks import TaskOptions
    from bertforge.tasks.base import collate
    from bertforge.tasks.retrieval import RetrievalTask

    tok = Tokenizer.from_pretrained(tiny_model)
    examples = read_retrieval(
        with_teacher(toy(Path(tiny_model).parent / "gc.jsonl", negatives=True))
    )
    options = TaskOptions(
        task="retrieval",
        cache_chunk=chunk,
        teacher_weight=teacher,
        symmetric=symmetric,
        hardness_mode=hardness,
        hardness_strength=5.0 if hardness else 0.0,
    )
    fam = RetrievalTask(options, tok)
    fam.set_model(str(tiny_model))
    batch = collate(fam.featurize(examples, training=True), np.arange(len(examples)), tok.pad_id)
    model = BertModel.from_pretrained(tiny_model).train(train_mode)
    torch.manual_seed(1)
    loss, _ = fam.loss_sum(model, batch)
    (loss / len(examples)).backward()
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return float(loss.detach()), torch.cat(grads)


@pytest.mark.parametrize(
    ("teacher", "symmetric", "hardness"),
    [(None, False, None), (2.0, False, None), (None, True, None), (None, False, "all_negatives")],
)
def test_gradcache_gives_the_whole_batch_gradients(
    tiny_model: Path, teacher: float | None, symmetric: bool, hardness: str | None
) -> None:
    """--cache-chunk: the parameters' gradients of the whole batch's loss, chunk by chunk (with
    --teacher-weight, --symmetric or --hardness-mode too: their terms are part of that loss)."""
    (loss, grad), (cached_loss, cached_grad) = (
        gradcache_case(tiny_model, chunk, False, teacher, symmetric, hardness)
        for chunk in (None, 5)
    )
    assert cached_loss == pytest.approx(loss, rel=1e-5)
    assert torch.allclose(cached_grad, grad, atol=1e-6, rtol=1e-4) and grad.abs().sum() > 0
    if teacher or symmetric or hardness:  # the term changes the loss
        assert loss != pytest.approx(gradcache_case(tiny_model, None, False)[0], rel=1e-3)


def test_teacher_weight_adds_listnet_over_each_querys_own_passages(tiny_model: Path) -> None:
    """--teacher-weight W: the in-batch loss plus W x KL(softmax(teacher) || softmax(20 cos))
    over each query's own positive and negatives, computed here by hand."""
    from bertforge import Tokenizer
    from bertforge.tasks import TaskOptions
    from bertforge.tasks.retrieval import RetrievalTask

    torch.manual_seed(0)
    vectors = torch.randn(6, 3, 16)  # query, positive, negative
    digests = torch.arange(12).reshape(6, 2)
    teacher = torch.randn(6, 2, dtype=torch.float64) * 3
    tok = Tokenizer.from_pretrained(tiny_model)
    plain = RetrievalTask(TaskOptions(task="retrieval"), tok)
    fam = RetrievalTask(TaskOptions(task="retrieval", teacher_weight=0.5), tok)
    got, correct = fam._loss(vectors, torch.cat([digests, teacher.view(torch.int64)], 1))
    base, base_correct = plain._loss(vectors, digests)
    student = 20 * torch.nn.functional.cosine_similarity(vectors[:, :1], vectors[:, 1:], dim=-1)
    p = torch.softmax(teacher, -1)
    kl = (p * (torch.log_softmax(teacher, -1) - torch.log_softmax(student.double(), -1))).sum()
    assert float(got) == pytest.approx(float(base) + 0.5 * float(kl), rel=1e-5)
    assert float(kl) > 0.1 and int(correct) == int(base_correct)


def test_teacher_weight_needs_teacher_scores(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = toy(tmp_path / "t.jsonl", negatives=True)
    args = ["finetune", "--task", "retrieval", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--out", str(tmp_path / "o"), "--teacher-weight", "1", "--no-progress"]
    assert main(args) == 2
    assert (
        't.jsonl:1: --teacher-weight learns a teacher\'s scores, and the rows have no "scores"'
        in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()
    sst = ["finetune", "--task", "sst2", "--model", str(minilm_dir), "--train", str(train)]
    assert main([*sst, "--out", str(tmp_path / "p"), "--teacher-weight", "1"]) == 2
    assert "teacher_weight (--teacher-weight) is for --task retrieval" in capsys.readouterr().err
    assert main([*args[:-3], "--teacher-weight", "-1"]) == 2
    assert "--teacher-weight" in capsys.readouterr().err
    scored = tmp_path / "scored.jsonl"
    scored.write_text(json.dumps({"text": "a", "text_pair": "b", "score": 0.5}) + "\n")
    assert main([*args[:6], str(scored), *args[7:]]) == 2
    assert "--teacher-weight: scored pairs (CoSENT) have no teacher" in capsys.readouterr().err
    sym = [*args[:6], str(scored), *args[7:-3], "--symmetric", "--no-progress"]
    assert main(sym) == 2
    assert "--symmetric: scored pairs train by CoSENT" in capsys.readouterr().err
    assert main([*sst, "--out", str(tmp_path / "p"), "--symmetric"]) == 2
    assert "symmetric (--symmetric) is for --task retrieval" in capsys.readouterr().err
    assert main([*sst, "--out", str(tmp_path / "p"), "--hardness-mode", "all_negatives"]) == 2
    assert "hardness_mode (--hardness-mode) is for --task retrieval" in capsys.readouterr().err
    assert main([*args[:-3], "--hardness-strength", "5", "--no-progress"]) == 2
    assert "--hardness-strength 5.0: needs --hardness-mode" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's own error for a choice
        main([*args[:-3], "--hardness-mode", "some", "--no-progress"])
    assert exit_.value.code == 2 and "--hardness-mode: invalid choice" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with_teacher(train)
    assert main([*args, "--epochs", "1", "--batch-size", "8"]) == 0
    assert (tmp_path / "o" / "model.safetensors").is_file()


def test_gradcache_replays_dropout(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In training mode each chunk's second pass sees the dropout of its first."""
    from bertforge.tasks.retrieval import Pooled

    seen: list[torch.Tensor] = []
    forward = Pooled.forward

    def recording(self: Pooled, *args: torch.Tensor) -> torch.Tensor:
        out = forward(self, *args)
        seen.append(out.detach().clone())
        return out

    monkeypatch.setattr(Pooled, "forward", recording)
    gradcache_case(tiny_model, 5, train_mode=True)
    half = len(seen) // 2
    assert half > 1 and all(torch.equal(a, b) for a, b in zip(seen[:half], seen[half:]))


def test_gradcache_refuses_accumulation(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train = toy(tmp_path / "t.jsonl")
    args = ["finetune", "--task", "retrieval", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--out", str(tmp_path / "o"), "--cache-chunk", "4", "--micro-batch-size", "8"]
    assert main(args) == 2
    assert "--cache-chunk replaces accumulation" in capsys.readouterr().err
    assert (
        main(
            [
                "finetune",
                "--task",
                "sst2",
                "--model",
                str(minilm_dir),
                "--train",
                str(train),
                "--out",
                str(tmp_path / "p"),
                "--cache-chunk",
                "4",
            ]
        )
        == 2
    )
    assert "--cache-chunk) is for --task retrieval" in capsys.readouterr().err


def test_matryoshka_sums_the_loss_over_leading_dimensions(tiny_model: Path) -> None:
    """sentence-transformers' MatryoshkaLoss: the inner loss on each truncation, summed."""
    try:
        from sentence_transformers.sentence_transformer import losses
    except ImportError:
        from sentence_transformers import losses
    from bertforge import Tokenizer
    from bertforge.errors import ConfigError
    from bertforge.tasks import TaskOptions
    from bertforge.tasks.retrieval import RetrievalTask

    torch.manual_seed(0)
    vectors = torch.randn(6, 3, 16)  # query, positive, negative
    digests = torch.arange(12).reshape(6, 2)
    fam = RetrievalTask(
        TaskOptions(task="retrieval", matryoshka="16,8,4"), Tokenizer.from_pretrained(tiny_model)
    )
    got, _ = fam._loss(vectors, digests)
    mnrl = losses.MultipleNegativesRankingLoss(model=None)  # type: ignore[arg-type]
    want = sum(
        mnrl.compute_loss_from_embeddings([vectors[:, k, :d] for k in range(3)], None)
        for d in (16, 8, 4)
    )
    assert float(got) / 6 == pytest.approx(float(want), rel=1e-5)
    fam.options.matryoshka = "32"
    with pytest.raises(ConfigError, match="--matryoshka 32: the vectors have 16"):
        fam._loss(vectors, digests)
    with pytest.raises(ConfigError, match="is for --task retrieval"):
        TaskOptions(task="sst2", matryoshka="8")


def test_cosent_is_sentence_transformers_cosent_loss() -> None:
    try:
        from sentence_transformers.sentence_transformer import losses
    except ImportError:
        from sentence_transformers import losses
    from bertforge.tasks.retrieval import cosent_loss

    torch.manual_seed(0)
    a, b, scores = torch.randn(8, 16), torch.randn(8, 16), torch.rand(8)
    scores[3] = scores[5]  # a tie: neither pair counts against the other
    ref = losses.CoSENTLoss(model=None)  # type: ignore[arg-type]
    want = ref.compute_loss_from_embeddings([a, b], scores)
    assert float(cosent_loss(a, b, scores)) == pytest.approx(float(want), rel=1e-5)


def scored_pairs(path: Path) -> Path:
    """STS-style rows: each of 4 topics' fact against each topic, scored 1 for its own."""
    rows = [
        {"text": f"a {t} fact", "text_pair": f"about {u}", "score": float(t == u)}
        for t in TOPICS[:4]
        for u in TOPICS[:4]
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_scored_pairs_train_by_cosent(minilm_dir: Path, tmp_path: Path) -> None:
    train = scored_pairs(tmp_path / "sts.jsonl")
    out = tmp_path / "out"
    args = ["finetune", "--task", "retrieval", "--model", str(minilm_dir), "--train", str(train)]
    args += ["--dev", str(train), "--out", str(out), "--epochs", "2", "--batch-size", "8"]
    assert main([*args, "--precision", "fp32", "--no-progress", "--lr", "1e-4"]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["spearman"] > 0.5 and "pearson" in results and "mrr@10" not in results
    (first,) = [
        json.loads(x) for x in (out / "predictions_retrieval.jsonl").read_text().splitlines()[:1]
    ]
    assert set(first) == {"text", "text_pair", "cosine"}
    train.write_text(json.dumps({"text": "a", "text_pair": "b", "score": "high"}) + "\n")
    with pytest.raises(DataError, match="line 1: field \"score\": 'high' is not a number"):
        read_retrieval(train)


def test_training_vectors_are_the_pipelines(minilm_dir: Path, tmp_path: Path) -> None:
    """Pooled reads a (B, C, T) batch column by column, each cut to its own longest row: the
    vectors are still what `embed` gives each text."""
    from bertforge import Tokenizer
    from bertforge.model import BertModel
    from bertforge.tasks import TaskOptions
    from bertforge.tasks.base import collate
    from bertforge.tasks.retrieval import Pooled, RetrievalTask

    examples = read_retrieval(toy(tmp_path / "t.jsonl", negatives=True))[:5]
    tok = Tokenizer.from_pretrained(minilm_dir)
    fam = RetrievalTask(TaskOptions(task="retrieval"), tok)
    fam.set_model(str(minilm_dir))
    batch = collate(fam.featurize(examples, training=True), np.arange(5), tok.pad_id)
    with torch.no_grad():
        got = Pooled(BertModel.from_pretrained(minilm_dir), fam.settings.pooling)(*batch.inputs())
    texts = [t for e in examples for t in (e.query, e.positive, *e.negatives)]
    want = Pipeline(minilm_dir, precision="fp32").embed(texts, normalize=False)
    np.testing.assert_allclose(got.reshape(15, -1).numpy(), want, atol=1e-5)


def test_batches_kept_apart_stay_grouped_by_length() -> None:
    """The questions of one paragraph are as long as each other: a row put off by its key joins
    a batch of about its length, not a random one. Measured here: 1.16x the pieces padded (1.68x
    when rows were parted after the shuffle; 1.02x without keys; random batches 1.7x), and
    still no batch holds a key twice."""
    from bertforge.train.supervised import epoch_batches

    rng = np.random.default_rng(0)
    keys = rng.integers(0, 600, 3000)  # 5 rows a key, as SQuAD's paragraphs have questions
    lengths = rng.integers(20, 256, 600)[keys]  # a row as long as its passage

    def padding(batches: list[np.ndarray]) -> float:
        return sum(len(b) * lengths[b].max() for b in batches) / lengths.sum()

    batches = epoch_batches(lengths, 32, seed=0, epoch=0, keys=keys)
    assert all(len(set(keys[b].tolist())) == len(b) for b in batches)
    assert sorted(np.concatenate(batches).tolist()) == list(range(3000))
    assert padding(epoch_batches(lengths, 32, seed=0, epoch=0)) < 1.05
    shuffled = [rng.permutation(3000)[i : i + 32] for i in range(0, 3000, 32)]
    assert padding(batches) < 1.25 < 1.5 < padding(shuffled)


def test_batches_keep_the_same_positive_apart() -> None:
    from bertforge.train.supervised import apart_by_key, epoch_batches

    rng = np.random.default_rng(0)
    keys = rng.integers(0, 300, 1000)  # about 3 queries per passage, as SQuAD has 5
    lengths = rng.integers(5, 200, 1000)
    batches = epoch_batches(lengths, 32, seed=0, epoch=0, keys=keys)
    plain = epoch_batches(lengths, 32, seed=0, epoch=0)
    assert [len(b) for b in batches] == [len(b) for b in plain]
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    assert all(len(set(keys[b].tolist())) == len(b) for b in batches)
    assert any(len(set(keys[b].tolist())) < len(b) for b in plain)  # the plain ones do repeat
    # one key everywhere cannot be helped: the rows still all come, in batches of the sizes
    same = apart_by_key([np.arange(4), np.arange(4, 8)], np.zeros(8, np.int64), 4)
    assert sorted(np.concatenate(same).tolist()) == list(range(8)) and [len(b) for b in same] == [
        4,
        4,
    ]


def test_group_batches_are_cut_from_one_group() -> None:
    """--group-batches: rows in group order (groups and rows shuffled per epoch) cut into the
    same number of batches as without; a batch spans one group or the seam of two; with keys
    (the positive passage), no batch holds a key twice and the rows put off stay near their
    group (SQuAD-like: 24 articles of about 240 questions on 43 paragraphs)."""
    from bertforge.train.supervised import epoch_batches

    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(10), 40)  # 10 groups of 40 rows
    lengths = rng.integers(5, 200, 400)
    batches = epoch_batches(lengths, 16, seed=0, epoch=0, groups=groups)
    assert len(batches) == len(epoch_batches(lengths, 16, seed=0, epoch=0)) == 25
    assert sorted(np.concatenate(batches).tolist()) == list(range(400))
    assert all(len(set(groups[b].tolist())) <= 2 for b in batches)
    assert sum(len(set(groups[b].tolist())) == 1 for b in batches) >= 15
    again = epoch_batches(lengths, 16, seed=0, epoch=0, groups=groups)
    assert [b.tolist() for b in again] == [b.tolist() for b in batches]  # resumable
    other = epoch_batches(lengths, 16, seed=0, epoch=1, groups=groups)
    assert [b.tolist() for b in other] != [b.tolist() for b in batches]

    articles = np.repeat(np.arange(24), 240)
    keys = articles * 100 + rng.integers(0, 43, len(articles))  # a paragraph of the article
    lengths = rng.integers(5, 200, len(articles))
    batches = epoch_batches(lengths, 64, seed=0, epoch=0, keys=keys, groups=articles)
    plain = epoch_batches(lengths, 64, seed=0, epoch=0, keys=keys)
    assert [len(b) for b in batches] == [len(b) for b in plain]
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(articles)))
    assert all(len(set(keys[b].tolist())) == len(b) for b in batches)

    def most(b: np.ndarray) -> float:  # the share of a batch's rows from its largest group
        return np.bincount(articles[b]).max() / len(b)

    # at most 43 of a batch's 64 rows can come from one article (its paragraphs): 0.57 on average
    assert np.mean([most(b) for b in batches]) > 0.5 > 0.2 > np.mean([most(b) for b in plain])


def test_group_batches_read_the_rows_group(
    minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rows = [json.loads(line) for line in toy(tmp_path / "t.jsonl").read_text().splitlines()]
    grouped = tmp_path / "g.jsonl"
    grouped.write_text(
        "".join(json.dumps(r | {"group": i // 4}) + "\n" for i, r in enumerate(rows))
    )
    assert [e.group for e in read_retrieval(grouped)][:5] == ["0", "0", "0", "0", "1"]
    table = tmp_path / "g.csv"
    table.write_text("query,positive,group\nq1,p1,a\nq2,p2,b\n")
    assert [e.group for e in read_retrieval(table)] == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0] | {"group": [1]}) + "\n")
    with pytest.raises(DataError, match='bad.jsonl: line 1: field "group": expected a string'):
        read_retrieval(bad)

    args = ["finetune", "--task", "retrieval", "--model", str(minilm_dir), "--train"]
    tail = ["--group-batches", "--epochs", "1", "--batch-size", "4", "--no-progress"]
    assert main([*args, str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "o"), *tail]) == 2
    assert 't.jsonl:1: --group-batches fills each batch from one "group"' in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    sst = ["finetune", "--task", "sst2", "--model", str(minilm_dir), "--train", str(grouped)]
    assert main([*sst, "--out", str(tmp_path / "p"), "--group-batches"]) == 2
    assert "group_batches (--group-batches) is for --task retrieval" in capsys.readouterr().err
    assert main([*args, str(grouped), "--out", str(tmp_path / "o"), *tail]) == 0
    assert (tmp_path / "o" / "model.safetensors").is_file()


def test_the_training_file_decides_how_retrieval_trains(tiny_model: Path, tmp_path: Path) -> None:
    """Read in either order (finetune reads --dev before it featurizes train), the training
    file's kind is how the task trains and the dev file's how it is scored."""
    from bertforge import Tokenizer
    from bertforge.tasks import TaskOptions
    from bertforge.tasks.retrieval import RetrievalTask

    fam = RetrievalTask(TaskOptions(task="retrieval"), Tokenizer.from_pretrained(tiny_model))
    pairs = fam.read(str(toy(tmp_path / "pairs.jsonl")))
    scored = fam.read(str(scored_pairs(tmp_path / "sts.jsonl")))
    train = fam.featurize(pairs, training=True)  # in-batch negatives: passage digests
    fam.featurize(scored)
    assert not fam.scored and fam.reports_accuracy and fam.metric == "spearman"
    assert train.labels.dtype == np.int64 and fam.batch_keys(train) is not None
    fam.read(str(tmp_path / "pairs.jsonl"))
    train = fam.featurize(scored, training=True)  # CoSENT: the pairs' scores
    fam.featurize(pairs)
    assert fam.scored and not fam.reports_accuracy and fam.metric == "mrr@10"
    assert train.labels.tolist() == [e.score for e in scored]


def test_a_dev_file_of_the_other_kind_is_scored_by_its_own_metric(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Pairs trained on (in-batch negatives, --symmetric), scored dev pairs: Spearman, as
    sentence-transformers' NLI-then-STS-B recipe; scored pairs trained on (CoSENT), a pairs dev
    file: MRR@10. The training log shows accuracy for in-batch negatives only."""
    pairs, scored = toy(tmp_path / "pairs.jsonl"), scored_pairs(tmp_path / "sts.jsonl")
    for train, dev, metric, extra in [
        (pairs, scored, "spearman", ["--symmetric"]),
        (scored, pairs, "mrr@10", []),
    ]:
        out = tmp_path / f"out-{metric}"
        args = ["finetune", "--task", "retrieval", "--model", str(tiny_model), "--train"]
        args += [str(train), "--dev", str(dev), "--out", str(out), "--epochs", "1"]
        args += ["--batch-size", "8", "--log-every", "1", "--no-progress", *extra]
        assert main(args) == 0
        results = json.loads((out / "eval_results.json").read_text())
        assert np.isfinite(results[metric]) and {"spearman", "mrr@10"} - {metric} - set(results)
        logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in logged if "loss" in r]
        assert steps and all(np.isfinite(r["loss"]) for r in steps)
        assert all(("acc" in r) == (train == pairs) for r in steps)


def test_retrieval_refuses_accumulation(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--micro-batch-size would give each micro-batch its own, smaller set of negatives."""
    train, out = toy(tmp_path / "t.jsonl"), tmp_path / "o"
    args = ["finetune", "--task", "retrieval", "--model", str(tiny_model), "--train", str(train)]
    assert main([*args, "--out", str(out), "--micro-batch-size", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--micro-batch-size 4: retrieval's loss is over the whole batch" in err
    assert "--cache-chunk" in err and not out.exists()


@pytest.mark.slow
def test_two_processes_train_retrieval_as_one(tmp_path: Path, tiny_model_nodrop: Path) -> None:
    """torchrun --nproc_per_node 2 (gloo, CPU): every process's vectors join the loss, so the
    steps are one process's (the same losses, the same model), with batches split unevenly
    (17 rows in batches of 6: the last one 3 + 2) and the pooler, which no loss reads, frozen
    (DDP stops at the second step over a parameter without a gradient)."""
    import subprocess
    import sys

    train = toy(tmp_path / "train.jsonl", negatives=True)
    rows = train.read_text().splitlines()
    train.write_text("\n".join([*rows, json.dumps({**json.loads(rows[0]), "query": "x"})]) + "\n")
    dev = toy(tmp_path / "dev.jsonl", negatives=True)

    def finetune(out: Path, *launcher: str) -> subprocess.CompletedProcess[str]:
        args = ["finetune", "--task", "retrieval", "--model", str(tiny_model_nodrop)]
        args += ["--train", str(train), "--dev", str(dev), "--out", str(out), "--epochs", "2"]
        args += ["--batch-size", "6", "--lr", "1e-4", "--precision", "fp32", "--symmetric"]
        args += ["--log-every", "1"]
        command = [sys.executable, "-m", *launcher, "bertforge", *args, "--no-progress"]
        return subprocess.run(command, capture_output=True, text=True, timeout=600)

    one = finetune(tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = finetune(
        tmp_path / "two", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "over 2 processes" in two.stdout

    def curve(out: Path) -> tuple[list[tuple[int, float, float]], list[float]]:
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [(r["step"], r["loss"], r["acc"]) for r in rows if "loss" in r]
        return steps, [r["eval_mrr@10"] for r in rows if "eval_mrr@10" in r]

    (loss1, eval1), (loss2, eval2) = curve(tmp_path / "one"), curve(tmp_path / "two")
    assert [s for s, *_ in loss1] == [s for s, *_ in loss2] == [1, 2, 3, 4, 5, 6]
    assert len(eval1) == 2
    assert max(abs(a[1] - b[1]) for a, b in zip(loss1, loss2)) < 1e-5, (loss1, loss2)
    assert [a[2] for a in loss1] == [b[2] for b in loss2]
    assert eval2 == pytest.approx(eval1, abs=1e-6)
    from safetensors.torch import load_file

    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("one", "two"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    start = load_file(tiny_model_nodrop / "model.safetensors")
    pooler = [k for k in b if "pooler" in k]
    assert pooler and all(torch.equal(b[k], start[f"bert.{k}"]) for k in pooler)


def several_positives(path: Path) -> Path:
    """Dev rows of 4 queries, each with two positives (two rows, one negative each)."""
    rows = [
        {
            "query": f"tell me about {t}",
            "positive": f"All about {t}: fact {k}.",
            "negatives": [f"All about {TOPICS[(i + 1) % 4]}: fact {k}."],
        }
        for i, t in enumerate(TOPICS[:4])
        for k in range(2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def retrieval_task(model_dir: Path) -> Any:
    from bertforge import Tokenizer
    from bertforge.tasks import TaskOptions
    from bertforge.tasks.retrieval import RetrievalTask

    fam = RetrievalTask(TaskOptions(task="retrieval"), Tokenizer.from_pretrained(model_dir))
    fam.set_model(str(model_dir))
    return fam


def test_a_query_of_several_rows_is_one_query_with_every_rows_positive(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each dev row was a query of its own with one relevant passage: the same query's other
    positives counted as misses, and it was averaged once per row. A model that ranks both of
    a query's positives first scored MRR 0.75 (the second row finds its positive second); it
    is a perfect ranking: MRR, nDCG and MAP 1, recall@1 1/2 (one of two relevant in the top
    1), as sentence-transformers' InformationRetrievalEvaluator and trec_eval say."""
    fam = retrieval_task(minilm_dir)
    examples = read_retrieval(several_positives(tmp_path / "dev.jsonl"))
    topic = {t: i for i, t in enumerate(TOPICS[:4])}

    def perfect(runner: Any, model: Any, texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), 5), np.float32)
        for i, text in enumerate(texts):  # a topic's axis; the second fact a little off it
            t = text.split()[-1] if text.startswith("tell") else text.split()[2].rstrip(":")
            vectors[i, topic[t]], vectors[i, 4] = 1.0, 0.1 * text.endswith("fact 1.")
        return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)

    monkeypatch.setattr(fam, "embed", perfect)
    metrics, run = fam.evaluate(None, None, examples, fam.featurize(examples))
    assert metrics["mrr@10"] == 1 and metrics["ndcg@10"] == pytest.approx(1)
    assert metrics["map@100"] == 1 and metrics["recall@1"] == 0.5 and metrics["recall@5"] == 1
    assert list(run) == [f"tell me about {t}" for t in TOPICS[:4]]  # one ranking per query

    def broken(runner: Any, model: Any, texts: Sequence[str]) -> np.ndarray:
        vectors = perfect(runner, model, texts)
        return np.where(np.array(texts)[:, None] == "All about dogs: fact 1.", np.nan, vectors)

    monkeypatch.setattr(fam, "embed", broken)  # a NaN passage sorted last would hide
    with pytest.raises(InputError, match=r"dev.jsonl:1: query 'tell me about cats', passage 'Al"):
        fam.evaluate(None, None, examples, fam.featurize(examples))


def test_dev_retrieval_scores_are_information_retrieval_evaluators(
    minilm_dir: Path, tmp_path: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    ir = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
    from bertforge.model import BertModel
    from bertforge.runner import Runner

    fam = retrieval_task(minilm_dir)
    examples = read_retrieval(several_positives(tmp_path / "dev.jsonl"))
    model = BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        ours, _ = fam.evaluate(Runner.create("cpu", "fp32"), model, examples, None)
    queries = {e.query: e.query for e in examples}
    corpus = {t: t for e in examples for t in (e.positive, *e.negatives)}
    relevant: dict[str, set[str]] = {}
    for e in examples:
        relevant.setdefault(e.query, set()).add(e.positive)
    evaluator = ir.InformationRetrievalEvaluator(
        queries, corpus, relevant, precision_recall_at_k=[1, 5], write_csv=False
    )
    ref = evaluator(st.SentenceTransformer(str(minilm_dir), device="cpu"))
    for name, key in [("mrr@10", "mrr@10"), ("ndcg@10", "ndcg@10"), ("map@100", "map@100")]:
        assert ours[name] == pytest.approx(ref[f"cosine_{key}"], abs=1e-6), name
    for k in (1, 5):
        assert ours[f"recall@{k}"] == pytest.approx(ref[f"cosine_recall@{k}"], abs=1e-6)
    assert ours["recall@1"] < 1  # two relevant passages: the top 1 holds half of them


def test_finetune_reads_a_beir_set(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--train DIR (its train split) and --dev DIR:test: a BEIR split's relevant pairs; a
    cross-encoder needs negatives, which a split has none of: mine them."""
    from tests.task_files import beir_files

    root, out = beir_files(tmp_path / "set"), tmp_path / "out"
    args = ["finetune", "--task", "retrieval", "--model", str(tiny_model), "--train", str(root)]
    dev = ["--dev", f"{root}:test", "--epochs", "1", "--no-progress", "--batch-size", "2"]
    assert main([*args, "--out", str(out), *dev]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "retrieval" and 0 < results["mrr@10"] <= 1
    rows = [json.loads(x) for x in (out / "predictions_retrieval.jsonl").read_text().splitlines()]
    assert len(rows) == 3  # the test split's three judged queries, each once
    args[2] = "rerank"
    assert main([*args, "--out", str(tmp_path / "ce"), "--epochs", "1"]) == 2
    assert "rerank training needs negatives beside each positive" in capsys.readouterr().err
