"""Pre-training instances: NSP pairs and masks, by statistics and invariants."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from bertforge.data.instances import MaskingSpec, mask_tokens, plan_shard

MAX_LEN = 128
PLANS_SHA256 = "0ae058e49e3549dbcc94557ee906a89a5701ca95fe37491d5e48904cf689c517"


def synthetic_shard(seed: int = 0, docs: int = 6000) -> tuple[np.ndarray, np.ndarray]:
    """Sentence and document offsets of a corpus of `docs` documents (1-60 sentences of
    1-45 tokens each); planning needs nothing else."""
    rng = np.random.default_rng(seed)
    per_doc = rng.integers(1, 61, docs)
    lengths = rng.integers(1, 46, per_doc.sum())
    sentences = np.concatenate(([0], np.cumsum(lengths)))
    documents = np.concatenate(([0], np.cumsum(per_doc)))
    return sentences, documents


@pytest.fixture(scope="module")
def plans() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sentences, documents = synthetic_shard()
    return (
        plan_shard(sentences, documents, np.random.default_rng(1), MAX_LEN, 0.1),
        sentences,
        documents,
    )


def _doc_of(token: np.ndarray, sentences: np.ndarray, documents: np.ndarray) -> np.ndarray:
    sentence = np.searchsorted(sentences, token, side="right") - 1
    return np.searchsorted(documents, sentence, side="right") - 1


def test_pairs_fit_and_are_non_empty(plans) -> None:
    p, _, _ = plans
    assert len(p) > 40_000
    a_len, b_len = p[:, 1] - p[:, 0], p[:, 3] - p[:, 2]
    assert (a_len >= 1).all() and (b_len >= 1).all()
    assert (a_len + b_len <= MAX_LEN - 3).all()  # room for [CLS], [SEP], [SEP]
    # most instances fill the window; short_seq_prob=0.1 makes a minority of short ones
    full = (a_len + b_len >= MAX_LEN - 3 - 10).mean()
    assert 0.6 < full < 0.95


def test_next_sentence_labels_are_balanced(plans) -> None:
    p, _, _ = plans
    random_next = p[:, 4].mean()
    assert abs(random_next - 0.5) < 0.01, random_next


def test_is_next_continues_the_same_document_and_not_next_comes_from_another(plans) -> None:
    p, sentences, documents = plans
    doc_a = _doc_of(p[:, 0], sentences, documents)
    doc_b = _doc_of(p[:, 2], sentences, documents)
    is_next = p[:, 4] == 0
    assert (doc_a[is_next] == doc_b[is_next]).all()
    assert (p[is_next, 2] >= p[is_next, 1]).all()  # B after A (only truncation in between)
    assert (p[is_next, 2] - p[is_next, 1]).max() < MAX_LEN
    assert (doc_a[~is_next] != doc_b[~is_next]).mean() > 0.999


def test_same_seed_same_instances() -> None:
    sentences, documents = synthetic_shard(docs=200)
    a = plan_shard(sentences, documents, np.random.default_rng(7))
    b = plan_shard(sentences, documents, np.random.default_rng(7))
    c = plan_shard(sentences, documents, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_single_sentence_documents_still_give_is_next() -> None:
    # Google's algorithm would make every pair NotNext here; ours splits inside the sentence.
    lengths = np.full(2000, 30)
    sentences = np.concatenate(([0], np.cumsum(lengths)))
    documents = np.arange(2001)
    p = plan_shard(sentences, documents, np.random.default_rng(0), MAX_LEN, 0.0)
    assert abs(p[:, 4].mean() - 0.5) < 0.03
    is_next = p[:, 4] == 0
    assert (p[is_next, 1] == p[is_next, 2]).all()  # A and B are the two halves of one sentence


def test_not_next_text_always_comes_from_another_document() -> None:
    """Google's ten draws at another document fail on one in 1,024 NotNext pairs of a two-document
    shard, and on every one of a one-document shard; then it pairs a document with itself."""
    lengths = np.full(40_000, 20)
    sentences = np.concatenate(([0], np.cumsum(lengths)))
    two = plan_shard(sentences, np.array([0, 20_000, 40_000]), np.random.default_rng(0), MAX_LEN)
    not_next = two[:, 4] == 1
    assert not_next.sum() > 2000
    doc_a, doc_b = (_doc_of(two[:, c], sentences, np.array([0, 20_000, 40_000])) for c in (0, 2))
    assert (doc_a[not_next] != doc_b[not_next]).all()
    # one document: no NotNext pair at all, IsNext ones as usual
    one = plan_shard(sentences, np.array([0, 40_000]), np.random.default_rng(0), MAX_LEN)
    assert len(one) > 5000 and (one[:, 4] == 0).all()
    assert (one[:, 2] >= one[:, 1]).all()  # B follows A
    # one document of one sentence of one token: no pair can be made, none is
    tiny = plan_shard(np.array([0, 1]), np.array([0, 1]), np.random.default_rng(0), MAX_LEN)
    assert tiny.shape == (0, 5)


def test_instances_of_shards_with_other_documents_did_not_change() -> None:
    """Drawing until another document comes makes the same draws as ten tries wherever those
    found one: the instances of a many-document shard are the ones planned before (sha256 of
    the plans made by the ten-try version)."""
    sentences, documents = synthetic_shard(docs=200)
    plans = plan_shard(sentences, documents, np.random.default_rng(7))
    assert hashlib.sha256(plans.tobytes()).hexdigest() == PLANS_SHA256


VOCAB = 30522
SPECIAL = frozenset({0, 101, 102})


def spec(**kw) -> MaskingSpec:
    cont = np.zeros(VOCAB, dtype=bool)
    cont[20000:] = True  # pretend ids >= 20000 are "##" pieces
    return MaskingSpec(VOCAB, 103, SPECIAL, cont, **kw)


def test_masking_statistics_80_10_10() -> None:
    rng = np.random.default_rng(0)
    s = spec(max_predictions_per_seq=20)
    counts = {"mask": 0, "random": 0, "kept": 0}
    total = 0
    while total < 100_000:
        body = rng.integers(1000, 20000, 126)
        ids = np.concatenate(([101], body, [102]))
        out, positions, labels = mask_tokens(ids, s, rng)
        assert len(positions) == 19  # round(128 * 0.15)
        assert (np.diff(positions) > 0).all()
        assert np.array_equal(labels, ids[positions])
        assert out[0] == 101 and out[-1] == 102  # special tokens are never chosen
        untouched = np.setdiff1d(np.arange(len(ids)), positions)
        assert np.array_equal(out[untouched], ids[untouched])
        chosen = out[positions]
        counts["mask"] += int((chosen == 103).sum())
        counts["kept"] += int((chosen == labels).sum())
        counts["random"] += int(((chosen != 103) & (chosen != labels)).sum())
        total += len(positions)
    shares = {k: v / total for k, v in counts.items()}
    assert (
        abs(shares["mask"] - 0.8) < 0.01
        and abs(shares["kept"] - 0.1) < 0.01
        and abs(shares["random"] - 0.1) < 0.01
    ), shares


def test_masking_counts_padding_and_limits() -> None:
    rng = np.random.default_rng(1)
    s = spec(max_predictions_per_seq=5)
    ids = np.concatenate(([101], np.arange(1000, 1100), [102], [0] * 20))
    _, positions, _ = mask_tokens(ids, s, rng)
    assert len(positions) == 5  # capped at max_predictions_per_seq
    assert not np.isin(ids[positions], list(SPECIAL)).any()  # never [PAD]
    _, positions, _ = mask_tokens(np.array([101, 1500, 102]), spec(), rng)
    assert list(positions) == [1]  # at least one prediction, even in a tiny sequence


def test_whole_word_masking_masks_all_pieces_of_a_word() -> None:
    rng = np.random.default_rng(2)
    s = spec(whole_word=True, max_predictions_per_seq=20)
    for _ in range(500):
        # words of 1-4 pieces: a start (< 20000) followed by "##" pieces (>= 20000)
        pieces = []
        while len(pieces) < 100:
            pieces.append(rng.integers(1000, 20000))
            pieces.extend(rng.integers(20000, VOCAB, rng.integers(0, 4)))
        ids = np.array([101, *pieces[:100], 102])
        _, positions, _ = mask_tokens(ids, s, rng)
        chosen = set(positions.tolist())
        assert 0 < len(chosen) <= 20
        for pos in chosen:  # every chosen piece has its whole word chosen
            start = pos
            while start > 1 and ids[start] >= 20000:
                start -= 1
            end = start + 1
            while end < len(ids) - 1 and ids[end] >= 20000:
                end += 1
            assert set(range(start, end)) <= chosen
