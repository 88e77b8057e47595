"""Pre-training instances: next-sentence pairs and masked-LM masks (Google's
`create_pretraining_data.py` semantics), as pure functions of an explicit numpy Generator.

An instance is planned on sentence lengths alone and stored as token spans into its shard,
`(a_start, a_end, b_start, b_end, is_random_next)`; tokens are read only when a batch is built.

Pairs (`plan_shard`), per document, as Google does:
  * the target length is max_seq_length - 3 (for [CLS] A [SEP] B [SEP]), or, with probability
    short_seq_prob (drawn once per document), a random length in [2, max_seq_length - 3];
  * sentences are packed greedily into a chunk until the target is reached; A is a random
    number of the chunk's leading sentences; with probability 1/2 B is the rest of the chunk
    (IsNext), otherwise text from a random other document (NotNext), and the chunk's unused
    sentences go back to the pool;
  * the longer side is truncated one token at a time, from the front or the back at random.
One deliberate difference: Google forces NotNext whenever a chunk holds a single sentence,
which skews the labels towards NotNext on short documents; here such a chunk is split inside
the sentence so that IsNext stays possible and the labels stay 50/50.
NotNext text always comes from another document of the same shard. Google takes the document's
own text (labelled NotNext) when ten draws miss every other document (1 in 1,024 NotNext pairs
with two documents, every one with one); here the draws go on until another document comes,
the same draws wherever ten found one. A shard of one document (a single book read as
'paragraphs', a small held-out split) therefore gives IsNext pairs only.

Packed rows (`plan_packed`), for masked-LM-only pre-training (RoBERTa's FULL-SENTENCES): the
shard's documents read as one stream with [SEP] between documents, cut into consecutive rows of
max_seq_length - 2 tokens (for [CLS] ... [SEP]) from a random offset, so that row boundaries move
from one epoch to the next; no padding inside a row, sentences and documents cut anywhere.

Masks (`mask_tokens`): 15% of the tokens (at least 1, at most max_predictions_per_seq), never
[CLS]/[SEP]/[PAD]; of those 80% become [MASK], 10% a random token, 10% stay; optionally whole
words (all of a word's pieces together).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100


def plan_shard(
    sentences: np.ndarray,
    documents: np.ndarray,
    rng: np.random.Generator,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
) -> np.ndarray:
    """Instances of a shard, shuffled: (N, 5) int64 rows (a_start, a_end, b_start, b_end, random).

    sentences: (S+1,) token offsets of sentences; documents: (D+1,) sentence offsets of docs.
    """
    max_num_tokens = max_seq_length - 3  # account for [CLS], [SEP], [SEP]
    if max_num_tokens < 2:
        raise ValueError(f"max_seq_length={max_seq_length}: must be at least 5")
    num_docs = len(documents) - 1
    rows: list[tuple[int, int, int, int, int]] = []
    # Plain ints: indexing numpy arrays element by element is what made this slow.
    S, D = sentences.tolist(), documents.tolist()
    for d in rng.permutation(num_docs).tolist():
        _plan_document(d, S, D, rng, max_num_tokens, short_seq_prob, rows)
    plans = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return plans[rng.permutation(len(plans))]


def packed_stream(
    tokens: np.ndarray, sentences: np.ndarray, documents: np.ndarray, sep_id: int
) -> np.ndarray:
    """A shard's tokens as one stream with [SEP] between consecutive documents (int64)."""
    starts = sentences[documents[1:-1]]  # token offsets of the 2nd, 3rd, ... documents
    return np.insert(np.asarray(tokens, np.int64), starts, sep_id)


def plan_packed(
    stream_length: int, rng: np.random.Generator, max_seq_length: int = 128
) -> np.ndarray:
    """Rows of a packed stream, shuffled: (N, 5) int64 rows (start, end, end, end, 0), the same
    layout as `plan_shard`'s with an empty B segment and IsNext, so the batch code is shared."""
    chunk = max_seq_length - 2  # account for [CLS] and [SEP]
    if chunk < 1:
        raise ValueError(f"max_seq_length={max_seq_length}: must be at least 3")
    offset = int(rng.integers(0, chunk)) if stream_length > chunk else 0
    cuts = np.unique(np.concatenate(([0, stream_length], np.arange(offset, stream_length, chunk))))
    starts, ends = cuts[:-1], cuts[1:]
    plans = np.stack([starts, ends, ends, ends, np.zeros_like(ends)], axis=1).astype(np.int64)
    return plans[rng.permutation(len(plans))]


def _plan_document(
    d: int,
    S: list[int],
    D: list[int],
    rng: np.random.Generator,
    max_num_tokens: int,
    short_seq_prob: float,
    rows: list[tuple[int, int, int, int, int]],
) -> None:
    first, end = D[d], D[d + 1]  # sentence range of the document
    num_docs = len(D) - 1
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    chunk_start, length, i = first, 0, first
    while i < end:
        length += S[i + 1] - S[i]
        if i == end - 1 or length >= target:
            n = i + 1 - chunk_start  # sentences in the chunk
            a_end = chunk_start + (int(rng.integers(1, n)) if n >= 2 else 1)  # sentence index
            a = [S[chunk_start], S[a_end]]
            too_short = n == 1 and S[a_end] - S[chunk_start] < 2  # no split inside it
            # NotNext needs another document: the shard's only one never pairs with itself
            random_next = num_docs >= 2 and (too_short or rng.random() < 0.5)
            if not random_next and too_short:
                b = [a[1], a[1]]  # neither IsNext nor NotNext: no pair (empty, dropped below)
            elif not random_next and n == 1:
                # one sentence: IsNext from a split inside it (Google would force NotNext)
                cut = int(rng.integers(a[0] + 1, a[1]))
                a, b = [a[0], cut], [cut, a[1]]
            elif not random_next:
                b = [S[a_end], S[i + 1]]
            else:
                target_b = target - (a[1] - a[0])
                r = _other_document(d, num_docs, rng)
                r_first, r_end = D[r], D[r + 1]
                j = int(rng.integers(r_first, r_end))
                b = [S[j], S[j]]
                while j < r_end:
                    b[1] = S[j + 1]
                    if b[1] - b[0] >= target_b:
                        break
                    j += 1
                i -= i + 1 - a_end  # the chunk's unused sentences go back
            _truncate_pair(a, b, max_num_tokens, rng)
            if a[1] > a[0] and b[1] > b[0]:
                rows.append((a[0], a[1], b[0], b[1], int(random_next)))
            chunk_start, length = i + 1, 0
        i += 1


def _other_document(d: int, num_docs: int, rng: np.random.Generator) -> int:
    """A random document other than d (num_docs >= 2), drawn until one comes: Google's ten
    tries, without its fallback to d itself when all ten hit d (see the module docstring)."""
    while True:
        r = int(rng.integers(0, num_docs))
        if r != d:
            return r


def _truncate_pair(
    a: list[int], b: list[int], max_num_tokens: int, rng: np.random.Generator
) -> None:
    """Google's truncate_seq_pair on spans: trim the longer side, front or back at random."""
    excess = (a[1] - a[0]) + (b[1] - b[0]) - max_num_tokens
    if excess <= 0:
        return
    # One draw per trimmed token, as Google's loop; drawing them together consumes the
    # generator exactly as `excess` single draws would, so the instances are the same.
    u = rng.random(excess)
    if excess <= 48:
        for x in u.tolist():
            side = a if a[1] - a[0] > b[1] - b[0] else b
            if x < 0.5:
                side[0] += 1
            else:
                side[1] -= 1
        return
    # Long overflows in closed form: the longer side is trimmed until both are equal, then the
    # loop alternates b, a, b, ... (a tie trims b); each trim is at the front when u < 0.5.
    d = (a[1] - a[0]) - (b[1] - b[0])
    k = min(abs(d), excess)
    on_a = np.empty(excess, dtype=bool)
    on_a[:k] = d > 0
    on_a[k:] = np.arange(excess - k) % 2 == 1
    front = u < 0.5
    a_trims, a_front = int(on_a.sum()), int((front & on_a).sum())
    b_trims, b_front = excess - a_trims, int((front & ~on_a).sum())
    a[0], a[1] = a[0] + a_front, a[1] - (a_trims - a_front)
    b[0], b[1] = b[0] + b_front, b[1] - (b_trims - b_front)


@dataclass(frozen=True)
class MaskingSpec:
    """What masking needs to know about the vocabulary."""

    vocab_size: int
    mask_id: int
    special_ids: frozenset[int]  # never masked: [CLS], [SEP], [PAD]
    is_continuation: np.ndarray  # (V,) bool: piece continues a word (for whole-word masking)
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word: bool = False

    @classmethod
    def from_tokens(
        cls,
        tokens: list[str],
        mask_id: int,
        special_ids: frozenset[int],
        word_start: str | None = None,
        **kw: object,
    ) -> MaskingSpec:
        """word_start: the mark of a word's first piece (Tokenizer.word_start: "Ġ", "▁"), where
        a piece without it continues the word before, as transformers' whole-word collator
        finds words (pieces with no space between); None: WordPiece, "##" continues a word."""
        if word_start is None:
            cont = (t.startswith("##") for t in tokens)
        else:
            cont = (not t.startswith(word_start) for t in tokens)
        is_continuation = np.fromiter(cont, dtype=bool, count=len(tokens))
        return cls(len(tokens), mask_id, special_ids, is_continuation, **kw)  # type: ignore[arg-type]


def mask_tokens(
    ids: np.ndarray, spec: MaskingSpec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Google's create_masked_lm_predictions on one sequence of token ids.

    Returns (input ids with masks applied, sorted masked positions (P,), original ids (P,)).
    """
    special = np.isin(ids, list(spec.special_ids))
    candidates = np.flatnonzero(~special)
    # Google counts the special tokens too: round(len(tokens) * prob), Python's rounding.
    num_to_predict = min(
        spec.max_predictions_per_seq, max(1, round(len(ids) * spec.masked_lm_prob))
    )
    if spec.whole_word:
        positions = _whole_word_positions(ids, candidates, spec, num_to_predict, rng)
    else:
        positions = rng.permutation(candidates)[:num_to_predict]
    positions = np.sort(positions)
    labels = ids[positions].copy()
    out = ids.copy()
    n = len(positions)
    u, v = rng.random(n), rng.random(n)
    replace = rng.integers(0, spec.vocab_size, n)
    masked = u < 0.8
    randomized = ~masked & (v >= 0.5)  # the other half of the 20% keep the original
    out[positions[masked]] = spec.mask_id
    out[positions[randomized]] = replace[randomized]
    return out, positions, labels


def _whole_word_positions(
    ids: np.ndarray,
    candidates: np.ndarray,
    spec: MaskingSpec,
    num_to_predict: int,
    rng: np.random.Generator,
) -> np.ndarray:
    # A candidate continues the previous word when it is a "##" piece right after another candidate.
    cont = spec.is_continuation[ids[candidates]]
    cont[0] = False
    adjacent = np.ones(len(candidates), dtype=bool)
    adjacent[1:] = candidates[1:] == candidates[:-1] + 1
    starts = np.flatnonzero(~(cont & adjacent))
    ends = np.append(starts[1:], len(candidates))
    chosen: list[np.ndarray] = []
    count = 0
    for w in rng.permutation(len(starts)):
        size = ends[w] - starts[w]
        if count >= num_to_predict:
            break
        if count + size > num_to_predict:
            continue  # Google skips words that do not fit and keeps looking
        chosen.append(candidates[starts[w] : ends[w]])
        count += size
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
