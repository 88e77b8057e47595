"""Tokenizer: BERT's WordPiece, with HF `tokenizers` (Rust) as the engine.

Google's rules (BasicTokenizer + WordpieceTokenizer), exactly: uncased models lower-case and
strip accents; punctuation and CJK ideographs become words of their own; control characters are
dropped; words over 100 characters become [UNK]. The engine runs those rules fast;
`textnorm.EngineFix` repairs the few characters where its Unicode tables differ from Python's.

    tok = Tokenizer.from_pretrained("path/to/model")
    batch = tok(["a sentence"], ["optional pair"], max_length=128)  # dict of (B, T) LongTensors
    enc = tok.encode("Hello world!")  # one Encoding: ids, tokens, offsets, word_ids, ...

Inputs are `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment ids 0 for A and 1 for B.

Layouts read: a model directory with vocab.txt (one token a line, id = line number) and an
optional tokenizer_config.json (do_lower_case, strip_accents, tokenize_chinese_chars,
model_max_length); or, when it has no vocab.txt, a `tokenizers` tokenizer.json (what
transformers 5 and sentence-transformers 6 save): its WordPiece vocabulary, normalizer
(BertNormalizer) and pre-tokenizer (BertPreTokenizer), with tokenizer_config.json winning on
casing as it does in transformers, and special tokens from tokenizer_config.json and
special_tokens_map.json, which must be BERT's five; ids a tokenizer.json leaves out (as
transformers converts a vocab.txt with duplicate lines) are placeholders, with a warning. A bare
vocab.txt or tokenizer.json file is read alike. A tokenizer.json of another kind (BPE, Unigram)
is refused. Tokens added to a vocabulary (transformers' add_tokens, listed in
tokenizer_config.json's added_tokens_decoder, tokenizer.json's added_tokens or
added_tokens.json) are found whole in the text before WordPiece runs, at transformers' ids and
with its flags. save_pretrained writes vocab.txt and tokenizer_config.json (added tokens in its
added_tokens_decoder, as transformers does).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Engine
from tokenizers.models import WordPiece

from .errors import InputError, VocabError, check_choice
from .families import Specials
from .fileio import read_bytes, read_json, read_lines, write_json, write_text
from .hub import resolve
from .subwords import KINDS, NoFix, is_bert_wordpiece, read_engine, train_engine
from .textnorm import EngineFix, is_chinese_char, is_punctuation, is_whitespace

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 100  # Google: longer words become [UNK]
PREFIX = "##"  # WordPiece's mark of a piece that continues a word
VOCAB_FILES = ("vocab.txt", "tokenizer.json")  # where a directory's vocabulary is, in that order
# where a directory's added tokens are listed (transformers writes all three), in that order
ADDED_FILES = ("tokenizer_config.json", "tokenizer.json", "added_tokens.json")
GAP = "[unused id {}]"  # the token of an id a tokenizer.json leaves out (no text encodes to it)
BOM = "\ufeff"  # a byte order mark: Google's and transformers' loaders keep it in line 1's token
_UNLIMITED = 10**9
SEGMENT_CHARS = 1 << 16  # encode_long: characters encoded at once
# transformers' clean_up_tokenization, applied by decode (in this order)
_CLEANUP = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
]  # HF writes model_max_length = 1e30 for "no limit"


class Encoding:
    """One encoded input (a text or a text pair); all its lists have the same length.

    ids, tokens, token_type_ids (segment: 0 = text, 1 = pair), attention_mask (0 = padding),
    offsets: (start, end) character span of each token in its own input text (the pair's
      tokens index the pair text); (0, 0) for special and padding tokens,
    word_ids: the word (as the basic tokenizer splits words, or as given with
      split_into_words) each token came from; None for special and padding tokens,
    sequence_ids: 0 for tokens of the text, 1 for the pair, None for special and padding,
    special_tokens_mask: 1 for [CLS], [SEP] and [PAD].

    A view of the engine's encoding: each list is built on first access.
    """

    def __init__(self, engine_encoding: Any, maps: tuple[Any, Any], split_into_words: bool) -> None:
        self._e = engine_encoding
        self._maps = maps
        self._split = split_into_words

    def __len__(self) -> int:
        return len(self._e)

    def __repr__(self) -> str:
        return f"Encoding(tokens={self.tokens!r})"

    ids = property(lambda self: self._e.ids)
    tokens = property(lambda self: self._e.tokens)
    token_type_ids = property(lambda self: self._e.type_ids)
    attention_mask = property(lambda self: self._e.attention_mask)
    word_ids = property(lambda self: self._e.word_ids)
    sequence_ids = property(lambda self: self._e.sequence_ids)
    special_tokens_mask = property(lambda self: self._e.special_tokens_mask)

    @functools.cached_property
    def offsets(self) -> list[tuple[int, int]]:
        """Character spans in the caller's text (EngineFix's rewrites mapped back)."""
        offsets = self._e.offsets
        if self._maps[0] is None and self._maps[1] is None:
            return offsets
        sequence_ids = self._e.sequence_ids
        word_ids = self._e.word_ids
        for j, (start, end) in enumerate(offsets):
            seq = sequence_ids[j]
            if seq is None or end <= start:
                continue
            index = self._maps[seq]
            if index is not None and self._split:
                index = index[word_ids[j]]
            if index is not None:
                offsets[j] = (index[start], index[end - 1] + 1)
        return offsets


@dataclass(frozen=True)
class Pieces:
    """A long text's pieces (Tokenizer.encode_long): ids (n,), offsets (n, 2) character spans
    in the text, words (n,) the word of each piece (non-decreasing)."""

    ids: np.ndarray
    offsets: np.ndarray
    words: np.ndarray

    def span(self, start: int, stop: int) -> tuple[int, int]:
        """The characters of pieces [start, stop), the words cut at either edge given whole."""
        first = int(np.searchsorted(self.words, self.words[start], "left"))
        last = int(np.searchsorted(self.words, self.words[stop - 1], "right")) - 1
        return int(self.offsets[first, 0]), int(self.offsets[last, 1])


@dataclass(frozen=True)
class Added:
    """A token added to the vocabulary (transformers' add_tokens, an AddedToken): found whole in
    the text before WordPiece runs, with transformers' flags. A token outside the vocabulary
    takes an id after it; one inside keeps its own."""

    content: str
    id: int
    special: bool = False  # left out by decode(skip_special_tokens=True)
    normalized: bool = True  # matched in the normalised (e.g. lower-cased) text, else the raw
    lstrip: bool = False  # takes the whitespace on its left (right) with it
    rstrip: bool = False
    single_word: bool = False  # only where it is a whole word
    file: str = dataclasses.field(
        default="", compare=False, repr=False
    )  # where it is listed (errors)


def segment_cuts(text: str, size: int, look: int = 4096) -> list[tuple[int, int]]:
    """(start, end) of segments of about `size` characters covering `text`, each cut just after
    a whitespace character (else after punctuation or a CJK ideograph, which are words of their
    own), looked for in the segment backwards from its end, then up to `look` characters past
    it: no word crosses a cut, so encoding the segments one by one gives the pieces of the
    whole. Only a run of `look` characters without any of those is cut where it is: such a word
    is [UNK] whole (over 100 characters), and cut it gives two."""
    cuts, start = [], 0
    while len(text) - start > size:
        end = start + size
        ahead = range(end + 1, min(len(text), end + look) + 1)
        for good in (is_whitespace, _own_word):
            at = next(
                (i for r in (range(end, start, -1), ahead) for i in r if good(text[i - 1])), 0
            )
            if at:
                break
        if at >= len(text) or (not at and ahead.stop > len(text)):
            break  # the rest is one segment: its end is a word's
        end = at or end
        cuts.append((start, end))
        start = end
    return [*cuts, (start, len(text))]


# punctuation that Unicode's lower-casing looks through (Case_Ignorable: "ΣΟΦΟΣ.Α" keeps a
# medial σ where "ΣΟΦΟΣ." ends in ς): no segment is cut after it
_CASE_IGNORABLE = set(
    "'.:\u00b7\u0387\u05f4\u2018\u2019\u2024\u2027\ufe13\ufe52\ufe55\uff07\uff0e\uff1a"
)


def _own_word(ch: str) -> bool:
    """Punctuation and CJK ideographs: words of their own, whatever is around them."""
    return (is_punctuation(ch) and ch not in _CASE_IGNORABLE) or is_chinese_char(ord(ch))


class BatchEncoding(dict):
    """Model inputs as (B, T) LongTensors: input_ids, token_type_ids, attention_mask.

    A plain dict of exactly those keys (so `model(**batch)` works), with the per-example
    `Encoding`s (offsets, word ids, tokens) in `.encodings`, built on first use.
    """

    _raw: list[Any]
    _maps: list[tuple[Any, Any]]
    _split: bool
    _encodings: list[Encoding] | None = None

    @property
    def encodings(self) -> list[Encoding]:
        if self._encodings is None:
            self._encodings = [Encoding(e, m, self._split) for e, m in zip(self._raw, self._maps)]
        return self._encodings

    def to(self, device: str | torch.device) -> BatchEncoding:
        out = BatchEncoding({k: v.to(device) for k, v in self.items()})
        out._raw, out._maps, out._split = self._raw, self._maps, self._split
        out._encodings = self._encodings
        return out


# ------------------------------------------------------------------------------------------------
# Vocabulary files


def read_vocab(path: str | os.PathLike[str]) -> list[str]:
    """Tokens of a `vocab.txt` (one per line, id = line number), as Google's loader reads it."""
    path = Path(path)
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise VocabError(f"{path}: vocabulary file not found") from None
    except IsADirectoryError:
        raise VocabError(f"{path}: is a directory, expected a vocab.txt file") from None
    tokens = []
    for lineno, line in enumerate(raw.splitlines(keepends=True), start=1):
        try:
            token = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VocabError(
                f"{path}: line {lineno}: not valid UTF-8 (byte {e.start}: "
                f"{line[e.start : e.start + 1]!r})"
            ) from None
        tokens.append(token.rstrip("\n").rstrip("\r"))
    if not tokens:
        raise VocabError(f"{path}: vocabulary file is empty")
    return tokens


def _check_vocab(tokens: Sequence[str], source: str) -> dict[str, int]:
    vocab: dict[str, int] = {}
    duplicates = []
    for i, t in enumerate(tokens):
        if t in vocab:
            duplicates.append((t, vocab[t] + 1, i + 1))
        vocab[t] = i  # Google's loader: the last line wins
    if duplicates:
        shown = ", ".join(f"{t!r} (lines {a} and {b})" for t, a, b in duplicates[:5])
        warnings.warn(f"{source}: {len(duplicates)} duplicate tokens: {shown}", stacklevel=3)
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    bom = (
        f"; line 1 ({tokens[0]!r}) starts with a byte order mark, which is part of its token "
        "as Google's and transformers' loaders read it: save the file as UTF-8 without a BOM"
        if tokens and tokens[0].startswith(BOM)
        else ""
    )
    if missing:
        raise VocabError(
            f"{source}: missing BERT special tokens {', '.join(missing)} "
            f"(a BERT vocabulary needs {', '.join(SPECIAL_TOKENS)}){bom}"
        )
    if bom:
        warnings.warn(f"{source}: {bom[2:]}", stacklevel=3)
    return vocab


def _looks_cased(tokens: Sequence[str]) -> bool:
    """True when a vocabulary has many tokens with capitals (Google's cased vocabs have
    thousands, uncased ones none outside [SPECIAL] tokens): lower-casing would waste them."""
    words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    capitals = sum(1 for t in words if t != t.lower())
    return capitals > max(10, len(words) // 200)


# ------------------------------------------------------------------------------------------------
# The engine


def _build_engine(
    vocab: dict[str, int] | None,
    lowercase: bool,
    strip_accents: bool,
    chinese: bool,
    max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
) -> Engine:
    model = WordPiece(
        vocab if vocab is not None else {},
        unk_token=UNK,
        continuing_subword_prefix=PREFIX,
        max_input_chars_per_word=max_input_chars_per_word,
    )
    engine = Engine(model)
    steps = [
        normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=chinese,
            strip_accents=strip_accents,
            lowercase=lowercase,
        )
    ]
    if not strip_accents:
        # transformers' reference composes (NFC) before splitting; stripping decomposes anyway.
        steps.append(normalizers.NFC())
    engine.normalizer = normalizers.Sequence(steps)
    engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # Special tokens written literally in the text ("Paris is the [MASK] of France.") are used
    # as such, as transformers' tokenizer does.
    engine.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    if vocab is not None:
        engine.post_processor = processors.TemplateProcessing(
            single=f"{CLS}:0 $A:0 {SEP}:0",
            pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
            special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])],
        )
    return engine


def _add_tokens(
    engine: Engine, vocab: dict[str, int], size: int, added: Sequence[Added], source: str
) -> tuple[Added, ...]:
    """Give the engine the added tokens, at the ids their file gives them, as transformers does:
    one in the vocabulary keeps its id; the others take the ids after it, in order (a file that
    gives other ids is refused: the model's embedding rows would not be theirs). size: the
    vocabulary's ids; source: the file named for an added token without its own."""
    added = sorted(added, key=lambda a: a.id)
    new = [a.content for a in added if a.content not in vocab]
    for a in added:
        want = vocab[a.content] if a.content in vocab else size + new.index(a.content)
        if a.id != want:
            where = "its id in the vocabulary" if a.content in vocab else "the next id after it"
            raise VocabError(
                f"{a.file or source}: added token {a.content!r} has id {a.id}, but {where} is {want} "
                f"(the vocabulary has {size} ids, the added tokens come after it in order)"
            )
        token = AddedToken(
            a.content,
            single_word=a.single_word,
            lstrip=a.lstrip,
            rstrip=a.rstrip,
            normalized=a.normalized,
            special=a.special,
        )
        (engine.add_special_tokens if a.special else engine.add_tokens)([token])
        if engine.token_to_id(a.content) != a.id:  # a vocabulary with duplicate lines
            raise VocabError(
                f"{a.file or source}: added token {a.content!r} cannot take its id {a.id}: the "
                f"vocabulary has {size} lines but only {len(vocab)} distinct tokens (duplicates)"
            )
    return tuple(added)


def truncate_pair_lengths(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths after Google's `_truncate_seq_pair`: drop one token at a time from the end of
    the longer sequence (the second one on ties) until the pair fits in `budget`."""
    excess = la + lb - budget
    if excess <= 0:
        return la, lb
    cut = min(excess, abs(la - lb))
    if la > lb:
        la -= cut
    else:
        lb -= cut
    excess -= cut
    # Equal lengths now: the ties go to the second sequence, so it loses the odd token.
    return la - excess // 2, lb - (excess + 1) // 2


def engine_pair_lengths(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths after the tokenizers library's longest-first truncation, which transformers
    applies for every family but BERT's: the shorter side kept whole where the longer can
    take the cut; else half the budget each, the odd token to the longer side (the second
    on ties)."""
    if la + lb <= budget:
        return la, lb
    short = min(la, lb)
    keep_short = short
    keep_long = short if short > budget else max(short, budget - short)
    if keep_short + keep_long > budget:
        keep_short = budget // 2
        keep_long = keep_short + budget % 2
    return (keep_long, keep_short) if la > lb else (keep_short, keep_long)


class Tokenizer:
    """BERT WordPiece tokenizer. See the module docstring for the API in brief."""

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = 512,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
        source: str = "vocabulary",
        added: Sequence[Added] = (),
    ) -> None:
        """vocab: the WordPiece tokens by id; added: tokens added to it (read_added_tokens)."""
        self.tokens = list(vocab)
        self.vocab = _check_vocab(self.tokens, source)
        self.base_size = len(self.tokens)  # WordPiece's own; the added tokens come after
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.max_input_chars_per_word = max_input_chars_per_word
        self.source = source
        strip = lowercase if strip_accents is None else strip_accents
        self._engine = _build_engine(
            self.vocab, lowercase, strip, tokenize_chinese_chars, max_input_chars_per_word
        )
        self.added = _add_tokens(self._engine, self.vocab, self.base_size, added, source)
        self.tokens += [a.content for a in self.added if a.id >= self.base_size]
        self.vocab = {**self.vocab, **{a.content: a.id for a in self.added}}
        self._fix: EngineFix | NoFix = EngineFix(
            self._engine, lowercase, strip, tokenize_chinese_chars
        )
        self._truncating: dict[int, Engine] = {}
        self.specials = Specials()  # BERT's [PAD] [UNK] [CLS] [SEP] [MASK]
        self.kind = "WordPiece"
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.vocab[t] for t in SPECIAL_TOKENS
        )

    @classmethod
    def from_engine(
        cls,
        path: Path,
        data: dict[str, Any],
        directory: Path | None = None,
        model_max_length: int | None = None,
    ) -> Tokenizer:
        """Another family's tokenizer.json (subwords.py: byte-level BPE, Unigram, WordPiece with
        <s> and </s>; `data`: the file as read), its engine used as the file configures it, its
        special tokens as its directory's files name them."""
        engine, specials, limit = read_engine(path, data, directory)
        return cls.of_engine(engine, specials, model_max_length or limit or 512, str(path))

    @classmethod
    def of_engine(
        cls, engine: Engine, specials: Specials, model_max_length: int, source: str
    ) -> Tokenizer:
        """A tokenizer over an engine that is its own reference (from_engine, train_vocab's bpe
        and unigram kinds), its special tokens `specials`."""
        self = cls.__new__(cls)
        vocab = engine.get_vocab(with_added_tokens=True)
        tokens = [GAP.format(i) for i in range(max(vocab.values()) + 1)]
        for t, i in vocab.items():
            tokens[i] = t
        self.tokens, self.vocab = tokens, vocab
        self.base_size = engine.get_vocab_size(with_added_tokens=False)
        self.lowercase, self.strip_accents, self.tokenize_chinese_chars = False, None, False
        self.model_max_length = model_max_length
        self.max_input_chars_per_word = MAX_INPUT_CHARS_PER_WORD
        self.source, self._engine, self.added = source, engine, ()
        self._fix, self._truncating = NoFix(), {}
        self.specials = specials
        self.kind = type(engine.model).__name__  # BPE, Unigram, WordPiece
        ids = [vocab.get(t) for t in specials.tokens]  # unk, mask: None where it has none
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids  # type: ignore
        return self

    # -- loading and saving ------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], *, lowercase: bool | None = None, **kwargs: Any
    ) -> Tokenizer:
        """From a model directory (vocab.txt, else tokenizer.json; optional
        tokenizer_config.json; added tokens where transformers lists them, read_added_tokens),
        or a vocab.txt or tokenizer.json file (the module docstring).

        Casing comes from `lowercase` if given, else tokenizer_config.json's do_lower_case,
        else tokenizer.json's normalizer, else is inferred from the vocabulary (a vocabulary
        full of capitals is cased).
        """
        path = resolve(path)
        engine_file = path / "tokenizer.json" if path.is_dir() else path
        data = None
        if engine_file.suffix == ".json" and engine_file.is_file():
            data = read_json(engine_file, VocabError)  # read once, whichever reader takes it
            if not is_bert_wordpiece(data):
                directory = path if path.is_dir() else None
                length = kwargs.get("model_max_length")
                return cls.from_engine(engine_file, data, directory, length)
        vocab_file, settings = path, {}
        if path.is_dir():
            vocab_file = next((path / n for n in VOCAB_FILES if (path / n).is_file()), path)
            if vocab_file == path:
                raise VocabError(f"{path}: no vocab.txt in this directory (nor a tokenizer.json)")
            settings = _read_tokenizer_config(path / "tokenizer_config.json")
        if vocab_file.suffix == ".json":
            tokens, found = read_tokenizer_json(vocab_file, data)
            if path.is_dir():
                _check_special_tokens(path)
            settings = {**found, **settings}  # tokenizer_config.json wins, as in transformers
        else:
            tokens = read_vocab(vocab_file)
        if lowercase is not None:
            settings["lowercase"] = lowercase
        elif "lowercase" not in settings:
            settings["lowercase"] = not _looks_cased(tokens)
        settings.update(kwargs)
        return cls(tokens, source=str(vocab_file), added=read_added_tokens(path), **settings)

    @staticmethod
    def exists(directory: str | os.PathLike[str]) -> bool:
        """Whether a model directory holds a vocabulary (vocab.txt or tokenizer.json)."""
        return any((Path(directory) / name).is_file() for name in VOCAB_FILES)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write vocab.txt and tokenizer_config.json (readable by transformers' BertTokenizer),
        the added tokens in its added_tokens_decoder, with BERT's special tokens, as
        transformers writes them."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.own_engine:
            self._save_engine(directory)
            return
        vocab = self.tokens[: self.base_size]
        write_text(directory / "vocab.txt", "".join(t + "\n" for t in vocab))
        specials = [Added(t, self.vocab[t], special=True, normalized=False) for t in SPECIAL_TOKENS]
        flags = ("lstrip", "normalized", "rstrip", "single_word", "special")
        decoder = {
            str(a.id): {"content": a.content, **{f: getattr(a, f) for f in flags}}
            for a in sorted((*specials, *self.added), key=lambda a: a.id)
        }
        # Only a word limit other than Google's is written: what transformers reads stays as is.
        limit = self.max_input_chars_per_word
        extra = {} if limit == MAX_INPUT_CHARS_PER_WORD else {"max_input_chars_per_word": limit}
        write_json(
            directory / "tokenizer_config.json",
            {
                "tokenizer_class": "BertTokenizer",
                "do_lower_case": self.lowercase,
                "strip_accents": self.strip_accents,
                "tokenize_chinese_chars": self.tokenize_chinese_chars,
                "model_max_length": self.model_max_length,
                "unk_token": UNK,
                "sep_token": SEP,
                "pad_token": PAD,
                "cls_token": CLS,
                "mask_token": MASK,
                "clean_up_tokenization_spaces": True,
                "added_tokens_decoder": decoder,
                **extra,
            },
        )

    def _save_engine(self, directory: Path) -> None:
        """Another family's tokenizer: its tokenizer.json as the engine has it, and a
        tokenizer_config.json naming the special tokens (what transformers' AutoTokenizer and
        from_engine read back)."""
        write_text(directory / "tokenizer.json", self._engine.to_str())
        sp = self.specials
        roles = {"cls": sp.cls, "sep": sp.sep, "pad": sp.pad, "unk": sp.unk, "mask": sp.mask}
        write_json(
            directory / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": self.model_max_length,
                "bos_token": sp.cls,
                "eos_token": sp.sep,
                **{f"{role}_token": t for role, t in roles.items() if t},
            },
        )

    @property
    def own_engine(self) -> bool:
        """Whether the engine is its own reference (another family's tokenizer.json, subwords.py)
        rather than BERT's WordPiece rebuilt to Google's rules."""
        return self.kind != "WordPiece" or self.specials != Specials()

    @property
    def word_start(self) -> str | None:
        """The mark of a word's first piece where the vocabulary marks starts rather than
        continuations: byte-level BPE's "Ġ", SentencePiece's "▁"; None for WordPiece (its "##"
        marks continuations) and for an engine that marks neither ("")."""
        if self.kind == "WordPiece":
            return None
        pre = json.loads(self._engine.to_str())["pre_tokenizer"] or {}
        for step in pre.get("pretokenizers", [pre]):
            if step.get("type") == "ByteLevel":
                return "\u0120"  # Ġ: the byte-level alphabet's space
            if step.get("type") == "Metaspace":
                return str(step.get("replacement", "\u2581"))
        return ""

    def definition(self) -> str:
        """What decides the pieces besides the vocabulary and BERT's rules: an engine of its own
        in full (normalizer, pre-tokenizer, model, template); "" for BERT's WordPiece."""
        return self._engine.to_str() if self.own_engine else ""

    # -- vocabulary --------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        casing = "uncased" if self.lowercase else "cased"
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, {casing})"

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    # -- encoding ----------------------------------------------------------------------------

    def _engine_for(self, max_length: int | None) -> Engine:
        """The shared engine, or (for truncation) a copy configured for one max_length.

        Copies rather than re-configuring one engine keep concurrent callers independent.
        """
        if max_length is None:
            return self._engine
        engine = self._truncating.get(max_length)
        if engine is None:
            engine = Engine.from_str(self._engine.to_str())
            engine.enable_truncation(max_length, strategy="longest_first")
            self._truncating[max_length] = engine
        return engine

    def _prepare(self, text: Any, what: str) -> tuple[Any, list[int] | None]:
        if isinstance(text, str):
            return self._fix.prepare(text)
        if isinstance(text, (list, tuple)) and all(isinstance(w, str) for w in text):
            fixed = [self._fix.prepare(w) for w in text]
            if all(m is None for _, m in fixed):
                return [w for w, _ in fixed], None
            # Per-word maps are applied through word ids (offsets are per word for word lists).
            return [w for w, _ in fixed], [m for _, m in fixed]  # type: ignore[misc]
        raise InputError(f"{what}: expected a string, got {type(text).__name__}")

    def _encode_raw(
        self,
        texts: Sequence[Any],
        pairs: Sequence[Any] | None,
        add_special_tokens: bool,
        max_length: int | None,
        truncation: bool,
        split_into_words: bool,
        check_length: bool = True,
    ) -> tuple[list[Any], list[tuple[Any, Any]]]:
        """Engine encodings, and the offset maps of any texts EngineFix had to rewrite."""
        if isinstance(texts, str) or (split_into_words and texts and isinstance(texts[0], str)):
            raise InputError("encode_batch takes a list of inputs; use encode() for one")
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"got {len(texts)} texts but {len(pairs)} pairs")
        limit = self.model_max_length if max_length is None else max_length
        prepared = [self._prepare(t, f"text {i}") for i, t in enumerate(texts)]
        inputs: list[Any] = [p for p, _ in prepared]
        maps: list[tuple[Any, Any]] = [(m, None) for _, m in prepared]
        if pairs is not None:
            prepared_pairs = [self._prepare(t, f"pair {i}") for i, t in enumerate(pairs)]
            inputs = [(a, b) for a, (b, _) in zip(inputs, prepared_pairs)]
            maps = [(m, mp) for (m, _), (_, mp) in zip(maps, prepared_pairs)]
        try:
            if pairs is None:
                engine = self._engine_for(limit if truncation else None)
                raw = engine.encode_batch(
                    inputs, add_special_tokens=add_special_tokens, is_pretokenized=split_into_words
                )
            else:
                raw = self._encode_pairs(
                    inputs, add_special_tokens, limit if truncation else None, split_into_words
                )
        except InputError:
            raise
        except Exception as e:  # the engine's errors are plain Exceptions with a message
            raise InputError(f"cannot encode with max_length={limit}: {e}") from None
        if not truncation and check_length:
            for i, e in enumerate(raw):
                if len(e.ids) > limit:
                    raise InputError(
                        f"text {i} has {len(e.ids)} tokens, more than max_length={limit}; "
                        "pass truncation=True (or a larger max_length, at most the model's "
                        "max_position_embeddings)"
                    )
        return raw, maps

    def _encode_pairs(
        self,
        inputs: list[tuple[Any, Any]],
        add_special_tokens: bool,
        limit: int | None,
        split: bool,
    ) -> list[Any]:
        """Pairs, truncated as Google's `_truncate_seq_pair` does for BERT's WordPiece (the
        engine's longest-first breaks ties the other way), as the engine does for the other
        families (transformers' reference for them): encode both sides, cut, then add the
        specials."""
        engine = self._side_engine
        firsts = engine.encode_batch(
            [a for a, _ in inputs], add_special_tokens=False, is_pretokenized=split
        )
        seconds = engine.encode_batch(
            [b for _, b in inputs], add_special_tokens=False, is_pretokenized=split
        )
        budget = None
        if limit is not None:
            # account for [CLS], [SEP], [SEP] (RoBERTa's <s> A </s></s> B </s>: 4)
            extra = self.specials.pair_extra if add_special_tokens else 0
            budget = limit - extra
            if budget < 0:
                raise InputError(
                    f"max_length={limit} leaves no room for a text pair and its {extra} special "
                    "tokens"
                )
        out = []
        lengths = engine_pair_lengths if self.own_engine else truncate_pair_lengths
        for a, b in zip(firsts, seconds):
            if budget is not None:
                la, lb = lengths(len(a), len(b), budget)
                if la < len(a):
                    a.truncate(la)
                if lb < len(b):
                    b.truncate(lb)
            out.append(self._engine.post_process(a, b, add_special_tokens=add_special_tokens))
        return out

    def encode_batch(
        self,
        texts: Sequence[str] | Sequence[Sequence[str]],
        pairs: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: bool = True,
        split_into_words: bool = False,
    ) -> list[Encoding]:
        """Encode texts (or text pairs) without padding.

        max_length defaults to model_max_length; with truncation the longer of a pair loses
        tokens first. With truncation=False and a max_length, a longer input is an error;
        with truncation=False and no max_length, texts of any length are encoded whole.
        split_into_words: each text is a list of words (e.g. CoNLL tokens); word_ids index them.
        """
        raw, maps = self._encode_raw(
            texts,
            pairs,
            add_special_tokens,
            max_length,
            truncation,
            split_into_words,
            check_length=truncation or max_length is not None,
        )
        return [Encoding(e, m, split_into_words) for e, m in zip(raw, maps)]

    def ids_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids, [CLS] pieces [SEP], whole (no truncation), as int64 arrays: what
        encode_batch(texts, truncation=False) gives as `ids`, without its Encoding views (a
        pipeline's rows need only the ids; the views were a twentieth of a run's host time)."""
        raw, _ = self._encode_raw(texts, None, True, None, False, False, check_length=False)
        return [np.asarray(e.ids, np.int64) for e in raw]

    def encode(
        self,
        text: str | Sequence[str],
        pair: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> Encoding:
        """Encode one text (or one text pair). Keyword arguments as `encode_batch`."""
        pairs = None if pair is None else [pair]
        return self.encode_batch([text], pairs, **kwargs)[0]  # type: ignore[arg-type]

    def __call__(
        self,
        texts: str | Sequence[str] | Sequence[Sequence[str]],
        pairs: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        max_length: int | None = None,
        truncation: bool = True,
        padding: bool | str = "longest",
        pad_to_multiple_of: int | None = None,
        split_into_words: bool = False,
    ) -> BatchEncoding:
        """Model inputs for a batch: input_ids, token_type_ids, attention_mask as (B, T) tensors.

        padding: "longest" (default, to the longest in the batch) or "max_length".
        A single string is a batch of one.
        """
        if isinstance(texts, str):
            texts = [texts]
            if isinstance(pairs, str):
                pairs = [pairs]
        raw, maps = self._encode_raw(texts, pairs, True, max_length, truncation, split_into_words)
        if padding == "max_length":
            length = self.model_max_length if max_length is None else max_length
        elif padding in ("longest", True):
            length = max((len(e.ids) for e in raw), default=0)
        elif padding is False:
            length = None
            if len({len(e.ids) for e in raw}) > 1:
                raise InputError("inputs have different lengths; padding=False needs equal lengths")
        else:
            raise InputError(f"padding={padding!r}: must be 'longest', 'max_length' or False")
        if length is not None and pad_to_multiple_of:
            length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
        if length is not None:
            for e in raw:  # the engine's encodings are ours alone: pad them in place
                e.pad(length, pad_id=self.pad_id, pad_type_id=0, pad_token=self.specials.pad)
        batch = BatchEncoding(
            input_ids=torch.tensor([e.ids for e in raw], dtype=torch.long),
            token_type_ids=torch.tensor([e.type_ids for e in raw], dtype=torch.long),
            attention_mask=torch.tensor([e.attention_mask for e in raw], dtype=torch.long),
        )
        batch._raw, batch._maps, batch._split = raw, maps, split_into_words
        return batch

    def row(
        self, a: Sequence[int], b: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids, segments) of a row of piece ids in the family's layout: [CLS] a [SEP], or
        [CLS] a [SEP] b [SEP] (RoBERTa's <s> a </s></s> b </s>); b and its closing token are
        segment 1 (a one-segment model reads them as 0)."""
        middle = 1 if b is None else self.specials.pair_extra - 2  # [SEP] (RoBERTa's </s></s>)
        head = [self.cls_id, *a, *[self.sep_id] * middle]
        ids = np.asarray([*head, *(b or ()), self.sep_id] if b is not None else head, np.int64)
        types = np.zeros(len(ids), np.int64)
        types[len(head) :] = 1
        return ids, types

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without [CLS]/[SEP]."""
        return self.encode(text, add_special_tokens=False, truncation=False).tokens

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, no special tokens, no truncation: the lean path for corpora.

        A special token's string in the text ("use [SEP] between") is text here, as Google's
        FullTokenizer reads a corpus ("[", "sep", "]"): pre-training data holds no control
        token it did not place itself. (encode and __call__ keep them special: "[MASK]" for
        fill-mask.)"""
        prepared = [self._fix.prepare(t)[0] for t in texts]
        engine = self._text_engine
        return [e.ids for e in engine.encode_batch(prepared, add_special_tokens=False)]

    @functools.cached_property
    def _text_engine(self) -> Engine:
        """A copy of the engine that reads special tokens' strings as text (encode_ids)."""
        engine = Engine.from_str(self._engine.to_str())
        engine.encode_special_tokens = True
        return engine

    @functools.cached_property
    def _side_engine(self) -> Engine:
        """A copy of the engine without its post-processor: a pair's two sides (_encode_pairs),
        whose post_process then runs once over both (RoBERTa's trim_offsets, run on a side and
        again on the pair, would cut a character off the start of each word)."""
        engine = Engine.from_str(self._engine.to_str())
        engine.post_processor = None
        return engine

    def encode_long(self, texts: Sequence[str], segment: int | None = None) -> list[Pieces]:
        """The pieces of texts of any length (no special tokens, no truncation) as arrays, in
        the memory of those arrays and of the engine's encodings of about `segment` characters
        (default SEGMENT_CHARS): a long text is encoded in segments cut where no word crosses
        (segment_cuts), short ones together, so each text's pieces, offsets and words are
        those of encoding it whole (a 5 MB text's whole encoding would take about a GB)."""
        if isinstance(texts, str):
            raise InputError("encode_long takes a list of texts")
        segment = segment or SEGMENT_CHARS
        jobs = [(i, a, b) for i, t in enumerate(texts) for a, b in segment_cuts(t, segment)]
        parts: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in texts]
        words = [0] * len(texts)  # each text's words so far
        start = size = 0
        for end, (_, a, b) in enumerate(jobs, 1):
            size += b - a
            if size < segment and end < len(jobs):
                continue
            batch = jobs[start:end]
            encoded = self.encode_batch(
                [texts[i][a:b] for i, a, b in batch], add_special_tokens=False, truncation=False
            )
            for (i, a, _), enc in zip(batch, encoded):
                w = np.asarray(enc.word_ids, np.int64) + words[i]
                words[i] = int(w[-1]) + 1 if len(w) else words[i]
                offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2) + a
                parts[i].append((np.asarray(enc.ids, np.int64), offsets, w))
            start, size = end, 0
        return [Pieces(*(np.concatenate(x) for x in zip(*p))) for p in parts]

    # -- decoding ----------------------------------------------------------------------------

    def decode(self, ids: Iterable[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        """Text of token ids: pieces joined ("un ##aff" -> "unaff"), then transformers' clean-up
        of spaces before punctuation and contractions ("it ' s ." -> "it's.")."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if self.own_engine:
            return self._engine.decode(list(ids), skip_special_tokens=skip_special_tokens)
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            special = {*SPECIAL_TOKENS, *(a.content for a in self.added if a.special)}
            tokens = [t for t in tokens if t not in special]
        text = " ".join(tokens).replace(" ##", "").strip()
        for dirty, clean in _CLEANUP:
            text = text.replace(dirty, clean)
        return text

    def batch_decode(
        self, batch: Iterable[Iterable[int]] | torch.Tensor, **kwargs: Any
    ) -> list[str]:
        if isinstance(batch, torch.Tensor):
            batch = batch.tolist()
        return [self.decode(ids, **kwargs) for ids in batch]


def _read_tokenizer_config(path: Path) -> dict[str, Any]:
    """Our settings from an HF tokenizer_config.json (absent file: no settings)."""
    if not path.is_file():
        return {}
    d = read_json(path, VocabError)
    settings: dict[str, Any] = {}
    for ours, theirs in (
        ("lowercase", "do_lower_case"),
        ("strip_accents", "strip_accents"),
        ("tokenize_chinese_chars", "tokenize_chinese_chars"),
    ):
        if theirs in d:
            value = d[theirs]
            if value is not None and not isinstance(value, bool):
                raise VocabError(
                    f"{path}: field {theirs!r} must be true, false or null, got {value!r}"
                )
            if value is not None or ours == "strip_accents":
                settings[ours] = value
    length = d.get("model_max_length")
    if isinstance(length, (int, float)) and 0 < length < _UNLIMITED:
        settings["model_max_length"] = int(length)
    limit = d.get("max_input_chars_per_word")
    if limit is not None:  # written by save_pretrained for a tokenizer.json's own limit
        settings["max_input_chars_per_word"] = _positive_int(
            limit, path, "max_input_chars_per_word"
        )
    return settings


def read_added_tokens(path: str | os.PathLike[str]) -> list[Added]:
    """The tokens added to a directory's vocabulary (transformers' add_tokens), as transformers
    gathers them: those of every file of ADDED_FILES (tokenizer_config.json's
    added_tokens_decoder, tokenizer.json's added_tokens, added_tokens.json: transformers 4
    writes all three), a token listed twice as the first file lists it; a tokenizer.json
    file: its own. BERT's special tokens are left out (every Tokenizer has them)."""
    path = Path(path)
    files = [path / n for n in ADDED_FILES] if path.is_dir() else [path]
    found: dict[str, Added] = {}
    for f in files:
        if f.suffix == ".json" and f.is_file():
            for a in _added_entries(read_json(f, VocabError), f):
                found.setdefault(a.content, a)
    return [a for a in found.values() if a.content not in SPECIAL_TOKENS]


def _added_entries(d: dict[str, Any], f: Path) -> list[Added]:
    """The added tokens a file lists, each of ADDED_FILES its own way."""
    if f.name == "added_tokens.json":  # {content: id}, flags as transformers gives them
        specials = _additional_special_tokens(f.parent / "special_tokens_map.json")
        return [
            _added({"content": t, "special": t in specials, "normalized": t not in specials}, i, f)
            for t, i in d.items()
        ]
    if f.name == "tokenizer.json":
        given = d.get("added_tokens") or []
        if not isinstance(given, list):
            raise VocabError(f"{f}: added_tokens must be a list of tokens")
        return [_added(t, t.get("id") if isinstance(t, dict) else None, f) for t in given]
    given = d.get("added_tokens_decoder") or {}
    if not isinstance(given, dict):
        raise VocabError(f"{f}: added_tokens_decoder must be an object of id: token")
    return [_added(t, _integer(i), f) for i, t in given.items()]


def _integer(text: str) -> int | str:
    """added_tokens_decoder's key (a JSON key: a string) as an id, else as it is (refused)."""
    return int(text) if text.isdigit() else text


def _added(entry: Any, i: Any, f: Path) -> Added:
    """One added token from its file's entry (content and flags) and id, checked."""
    content = entry.get("content") if isinstance(entry, dict) else None
    if not isinstance(content, str) or not content:
        raise VocabError(f"{f}: added token {entry!r} has no content (a non-empty string)")
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise VocabError(f"{f}: added token {content!r} has id {i!r}, not an integer >= 0")
    flags = {}
    for name in ("special", "normalized", "lstrip", "rstrip", "single_word"):
        value = entry.get(name, not entry.get("special") if name == "normalized" else False)
        if not isinstance(value, bool):
            raise VocabError(f"{f}: added token {content!r}: {name} must be true or false")
        flags[name] = value
    return Added(content, i, **flags, file=str(f))


def _additional_special_tokens(path: Path) -> set[str]:
    """special_tokens_map.json's additional_special_tokens (strings or AddedToken objects)."""
    given = read_json(path, VocabError).get("additional_special_tokens") if path.is_file() else []
    tokens = [t.get("content") if isinstance(t, dict) else t for t in given or []]
    return {t for t in tokens if isinstance(t, str)}


def id_count(vocab_file: Path) -> int | None:
    """The ids a directory's tokenizer uses (its vocab.txt's lines or tokenizer.json's highest
    id + 1, and the added tokens after them): the embedding rows it needs. None when the files
    cannot be read: the tokenizer names the fault when it is loaded."""
    try:
        if vocab_file.suffix == ".json":
            model = read_json(vocab_file, VocabError).get("model")
            n = 1 + max(i for i in model["vocab"].values() if isinstance(i, int))
        else:
            raw = read_bytes(vocab_file)  # its lines as a binary file iterates them (at \n)
            n = raw.count(b"\n") + (not raw.endswith(b"\n") and bool(raw))
        added = read_added_tokens(vocab_file.parent)
    except (VocabError, OSError, AttributeError, KeyError, TypeError, ValueError):
        return None
    return max([n, *(a.id + 1 for a in added)])


def _positive_int(value: Any, path: Path, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise VocabError(f"{path}: {field} must be a positive integer, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------------
# tokenizer.json (the `tokenizers` library's file)


def read_tokenizer_json(
    path: str | os.PathLike[str], data: dict[str, Any] | None = None
) -> tuple[list[str], dict[str, Any]]:
    """Tokens (by id) and our settings (lowercase, strip_accents, tokenize_chinese_chars,
    max_input_chars_per_word) of a BERT tokenizer.json; anything the rules of BERT's WordPiece
    cannot reproduce (BPE, Unigram, another normalizer or unknown-token) is a VocabError.
    `data`: the file already read (Tokenizer.from_pretrained reads it once)."""
    path = Path(path)
    d = read_json(path, VocabError) if data is None else data
    model = d.get("model")
    if not isinstance(model, dict):
        raise VocabError(f"{path}: no 'model' object: not a tokenizer.json")
    # Older files (DistilBERT's among them) leave out model.type; WordPiece's own fields tell.
    kind = model.get("type") or ("WordPiece" if "max_input_chars_per_word" in model else None)
    if kind != "WordPiece":
        raise VocabError(
            f"{path}: model type {kind!r} is not WordPiece: bertforge reads BERT's WordPiece "
            "tokenizers only (BPE and Unigram ones belong to other models)"
        )
    for field, want in (("unk_token", UNK), ("continuing_subword_prefix", PREFIX)):
        if model.get(field, want) != want:
            raise VocabError(
                f"{path}: model.{field} is {model[field]!r}; BERT's WordPiece uses {want!r}"
            )
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise VocabError(f"{path}: model.vocab must be a non-empty table of token -> id")
    tokens = _tokens_by_id(vocab, path)
    settings = _normalizer_settings(d.get("normalizer"), path)
    _check_pre_tokenizer(d.get("pre_tokenizer"), path)
    limit = model.get("max_input_chars_per_word", MAX_INPUT_CHARS_PER_WORD)
    settings["max_input_chars_per_word"] = _positive_int(
        limit, path, "model.max_input_chars_per_word"
    )
    return tokens, settings


def _tokens_by_id(vocab: dict[str, Any], path: Path) -> list[str]:
    """model.vocab's tokens by id: each id once. An id left out (transformers converts a
    vocab.txt with duplicate lines so: the last line's id wins, the earlier one is unused) gets
    a placeholder no text encodes to (it holds a space), with a warning, as such a vocab.txt
    has the duplicate there."""
    by_id: dict[int, str] = {}
    for token, i in vocab.items():
        valid = isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2 * len(vocab)
        if not valid or i in by_id:
            raise VocabError(
                f"{path}: model.vocab gives {token!r} the id {i!r}; each id must be given once, "
                f"an integer from 0 (and fewer ids left out than given: below {2 * len(vocab)})"
            )
        by_id[i] = token
    gaps = [i for i in range(max(by_id) + 1) if i not in by_id]
    if gaps:
        warnings.warn(
            f"{path}: model.vocab leaves {len(gaps)} ids unused ({', '.join(map(str, gaps[:5]))}"
            f"{', ...' if len(gaps) > 5 else ''}; a vocab.txt with duplicate lines converts so): "
            f"read as placeholder tokens {GAP.format(gaps[0])!r}...",
            stacklevel=4,
        )
    return [by_id.get(i, GAP.format(i)) for i in range(max(by_id) + 1)]


def _steps(node: Any) -> list[Any]:
    """The members of a normalizer or pre-tokenizer (a Sequence's, or itself alone)."""
    if isinstance(node, dict) and node.get("type") == "Sequence":
        key = "normalizers" if "normalizers" in node else "pretokenizers"
        return list(node.get(key) or [])
    return [node]


def _type(step: Any) -> Any:
    return step.get("type") if isinstance(step, dict) else step


def _normalizer_settings(node: Any, path: Path) -> dict[str, Any]:
    """Casing and CJK settings of BERT's normalizer: a BertNormalizer, alone or in a Sequence
    (with the NFC bertforge itself adds when accents are kept)."""
    steps = _steps(node)
    bert = [s for s in steps if _type(s) == "BertNormalizer"]
    others = [_type(s) for s in steps if _type(s) not in ("BertNormalizer", "NFC")]
    if len(bert) != 1 or others:
        raise VocabError(
            f"{path}: normalizer {[_type(s) for s in steps]} is not BERT's: bertforge needs "
            "one BertNormalizer (alone or in a Sequence)"
        )
    b = bert[0]
    for field in ("clean_text", "handle_chinese_chars", "lowercase"):
        if not isinstance(b.get(field, True), bool):
            raise VocabError(f"{path}: normalizer field {field!r} must be true or false")
    if b.get("strip_accents") not in (None, True, False):
        raise VocabError(f"{path}: normalizer field 'strip_accents' must be true, false or null")
    if b.get("clean_text", True) is False:
        raise VocabError(
            f"{path}: BertNormalizer has clean_text false; BERT always drops control characters"
        )
    lowercase = b.get("lowercase", True)
    strip = lowercase if b.get("strip_accents") is None else b["strip_accents"]
    if strip and len(steps) > 1:
        # NFC after stripping would re-compose what BERT leaves decomposed (Hangul jamo).
        raise VocabError(f"{path}: normalizer composes (NFC) after stripping accents; not BERT's")
    return {
        "lowercase": lowercase,
        "strip_accents": b.get("strip_accents"),
        "tokenize_chinese_chars": b.get("handle_chinese_chars", True),
    }


def _check_pre_tokenizer(node: Any, path: Path) -> None:
    steps = [_type(s) for s in _steps(node)]
    if steps != ["BertPreTokenizer"]:
        raise VocabError(
            f"{path}: pre_tokenizer {steps} is not BERT's: bertforge needs BertPreTokenizer"
        )


def _check_special_tokens(directory: Path) -> None:
    """BERT's five special tokens are the ones bertforge (and every task in it) uses; a
    tokenizer_config.json or special_tokens_map.json naming others is refused, not ignored."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = directory / name
        if not f.is_file():
            continue
        d = read_json(f, VocabError)
        for field, want in zip(
            ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS
        ):
            value = d.get(field)
            if isinstance(value, dict):  # an AddedToken written out: {"content": ..}
                value = value.get("content")
            if value is not None and value != want:
                raise VocabError(
                    f"{f}: {field} is {value!r}; bertforge's BERT tokenizer uses {want}"
                )


# ------------------------------------------------------------------------------------------------
# Training a vocabulary


def train_vocab(
    files: Sequence[str | os.PathLike[str]],
    vocab_size: int = 30522,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    encoding_errors: str = "strict",
    show_progress: bool = True,
    kind: str = "wordpiece",
) -> Tokenizer:
    """Train a WordPiece vocabulary on plain text files (each line a text), with BERT's special
    tokens first (kind: bpe or unigram for RoBERTa's or XLM-RoBERTa's, train_vocab_from_texts). JSONL or WikiExtractor files would put their markup into the vocabulary: read
    them with bertforge.data.corpus.corpus_sentences into train_vocab_from_texts, as
    `bertforge vocab train` does.
    """
    if not files:
        raise InputError("no training files given")
    lines = (line for f in files for _, line in read_lines(Path(f), encoding_errors))
    return train_vocab_from_texts(
        lines,
        vocab_size,
        lowercase=lowercase,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        show_progress=show_progress,
        kind=kind,
    )


def train_vocab_from_texts(
    texts: Iterable[str],
    vocab_size: int = 30522,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = True,
    kind: str = "wordpiece",
) -> Tokenizer:
    """Train a WordPiece vocabulary on texts, with BERT's special tokens first; kind "bpe" or
    "unigram": RoBERTa's byte-level BPE or XLM-RoBERTa's Unigram (subwords.train_engine; cased,
    as those models are: `lowercase` and `limit_alphabet` are WordPiece's).

    The text goes through exactly the normalization the returned tokenizer applies, so every
    piece the trainer learns can be produced at encoding time.
    """
    check_choice("kind", kind, KINDS)
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise InputError(f"vocab_size={vocab_size}: must be more than {len(SPECIAL_TOKENS)}")
    if kind != "wordpiece":
        engine, specials = train_engine(texts, kind, vocab_size, min_frequency, show_progress)
        return Tokenizer.of_engine(engine, specials, 512, f"trained {kind} vocabulary")
    engine = _build_engine(None, lowercase, lowercase, True)
    fix = EngineFix(engine, lowercase, lowercase, True)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )
    engine.train_from_iterator((fix.prepare(t)[0] for t in texts), trainer=trainer)
    vocab = engine.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    return Tokenizer(tokens, lowercase=lowercase, source="trained vocabulary")
