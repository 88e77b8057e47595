"""Google's BasicTokenizer rules, and the repairs that make the Rust engine follow them exactly.

BERT's reference tokenizer (google-research/bert `tokenization.py`, and transformers' slow
`BertTokenizer`, which adds an NFC step) classifies characters with *this Python's*
`unicodedata`. HF `tokenizers` does the same work in Rust, fast, but with Unicode tables of its
own (older ones) and a context-free lower-casing. On ordinary text they agree; they disagree on:

* characters unassigned in the engine's tables (it keeps them; Python calls them control
  characters and drops them), and punctuation, combining marks and CJK ideographs added to
  Unicode after the engine's tables were made;
* Greek capital sigma at the end of a word (Python lower-cases it to final `ς`, the engine to
  `σ`).

Rather than re-tokenize in Python, we keep the engine and hand it text in which the few
disagreeing characters have been replaced: `EngineFix.prepare` rewrites only those characters
(a substitution of one character for one, or spaces around a character that must stand alone)
and returns an index map so that offsets still point into the caller's original text. Which
characters disagree is not hard-coded: the first time a character is seen, the engine is probed
with it and compared with `basic_tokenize` below, and the decision is cached. ASCII text never
needs a repair and skips all of this.
"""

from __future__ import annotations

import threading
import unicodedata
from typing import Any

# ------------------------------------------------------------------------------------------------
# Google's character classes (tokenization.py), on this Python's Unicode database.


def is_whitespace(ch: str) -> bool:
    """Google's `_is_whitespace`: space, tab, newline, return, or category Zs."""
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def is_control(ch: str) -> bool:
    """Google's `_is_control`: categories C* except tab, newline and return."""
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def is_punctuation(ch: str) -> bool:
    """Google's `_is_punctuation`: all non-letter/number ASCII, or Unicode category P*."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_chinese_char(cp: int) -> bool:
    """Google's `_is_chinese_char`: the CJK Unified Ideographs blocks (not kana or hangul)."""
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _removed(ch: str) -> bool:
    """Dropped by Google's `_clean_text` (NUL, U+FFFD, control characters)."""
    return ch == "\x00" or ch == "\ufffd" or is_control(ch)


def basic_tokenize(
    text: str, lowercase: bool, strip_accents: bool, tokenize_chinese_chars: bool = True
) -> list[str]:
    """Google's BasicTokenizer (with transformers' NFC step): the words WordPiece will see.

    This is the arbiter used to probe the engine character by character; the engine does the
    real work. `strip_accents` is the resolved flag (Google: strip when lower-casing).
    """
    out = []
    for ch in text:
        if _removed(ch):
            continue
        if is_whitespace(ch):
            out.append(" ")
        elif tokenize_chinese_chars and is_chinese_char(ord(ch)):
            out.append(f" {ch} ")
        else:
            out.append(ch)
    words = []
    for token in unicodedata.normalize("NFC", "".join(out)).split():
        if lowercase:
            token = token.lower()
        if strip_accents:
            nfd = unicodedata.normalize("NFD", token)
            token = "".join(c for c in nfd if unicodedata.category(c) != "Mn")
        current: list[str] = []
        for ch in token:
            if is_punctuation(ch):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
    # Google re-splits on whitespace at the end (lower() can create new spaces in theory).
    return " ".join(words).split()


# ------------------------------------------------------------------------------------------------
# Repairs for the engine.

# What to do with a character the engine would treat differently from the reference.
KEEP = ""  # nothing: the engine already agrees
NULL = "\x00"  # the reference drops it: NUL is dropped by the engine's clean-up too
SPACE = " "  # the reference splits words at it
ISOLATE = "isolate"  # the reference makes it a word of its own: surround it with spaces
# The reference keeps it inside a word but the engine splits or strips it: stand in a
# character the engine keeps verbatim and no vocabulary contains (unassigned in every Unicode
# version so far), so the word still becomes [UNK], as the reference makes it whenever the
# vocabulary lacks the character.
OPAQUE = "\U000e0080"


class EngineFix:
    """Rewrites text so that a `tokenizers` engine splits it exactly as Google's rules do.

    `engine` is a `tokenizers.Tokenizer` configured with BERT's normalizer and pre-tokenizer;
    only those two stages are probed (WordPiece itself agrees with Google's greedy
    longest-match-first). Thread-safe: the cache only ever gains entries.
    """

    def __init__(
        self, engine: Any, lowercase: bool, strip_accents: bool, tokenize_chinese_chars: bool
    ) -> None:
        self._normalizer = engine.normalizer
        self._pre_tokenizer = engine.pre_tokenizer
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self._actions: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- probing ---------------------------------------------------------------------------------

    def _reference(self, text: str) -> list[str]:
        return basic_tokenize(text, self.lowercase, self.strip_accents, self.tokenize_chinese_chars)

    def _engine_words(self, s: str) -> list[str]:
        """The engine's words of the probe "ab?cd ?" with `s` at both places."""
        normalized = self._normalizer.normalize_str(f"ab{s}cd {s}")
        return [w for w, _ in self._pre_tokenizer.pre_tokenize_str(normalized)]

    def _decide(self, ch: str) -> str:
        if _removed(ch):
            return NULL  # always right, and the engine cannot even take lone surrogates
        want = self._reference(f"ab{ch}cd {ch}")
        if self._engine_words(ch) == want:
            return KEEP
        if is_whitespace(ch) or ch.isspace():
            return SPACE
        for action in (NULL, ISOLATE):
            if self._engine_words(f" {ch} " if action == ISOLATE else action) == want:
                return action
        # The reference keeps `ch` inside its word: the stand-in must stay there verbatim.
        if len(want) == 2 and self._engine_words(OPAQUE) == [f"ab{OPAQUE}cd", OPAQUE]:
            return OPAQUE
        return KEEP  # no repair found: leave the character to the engine

    def action(self, ch: str) -> str:
        a = self._actions.get(ch)
        if a is None:
            a = self._decide(ch)
            with self._lock:
                self._actions[ch] = a
        return a

    # -- rewriting -------------------------------------------------------------------------------

    def prepare(self, text: str) -> tuple[str, list[int] | None]:
        """Text for the engine, and a map from its character positions to `text`'s (or None
        when positions are unchanged)."""
        if text.isascii():
            return text, None
        actions = {}
        for ch in set(text):
            if ch >= "\x80":
                a = self.action(ch)
                if a != KEEP:
                    actions[ch] = a
        sigma = self.lowercase and "Σ" in text
        if not actions and not sigma:
            return text, None
        text_for_sigma = _final_sigmas(text) if sigma else text
        if ISOLATE not in actions.values():
            # One character for one: offsets are unchanged.
            return text_for_sigma.translate({ord(c): a for c, a in actions.items()}), None
        pieces: list[str] = []
        index: list[int] = []
        for i, ch in enumerate(text_for_sigma):
            a = actions.get(ch, KEEP)
            if a == ISOLATE:
                pieces.append(f" {ch} ")
                index.extend((i, i, i))
            else:
                pieces.append(a or ch)
                index.append(i)
        index.append(len(text))
        return "".join(pieces), index


def _final_sigmas(text: str) -> str:
    """Replace each capital sigma that Python's `str.lower` would make final (`ς`) by `ς`.

    The reference lower-cases words with `str.lower`, which applies Unicode's Final_Sigma
    context; the engine lower-cases character by character. Characters the reference drops
    before lower-casing are skipped, as they are for it. Whitespace ends a word either way.
    """
    kept = [i for i, ch in enumerate(text) if not _removed(ch)]
    cleaned = "".join(text[i] for i in kept)
    lowered = cleaned.lower()
    chars = list(text)
    pos = 0  # position in `lowered`: lower() is context-free except for sigma, so lengths add up
    for i in kept:
        ch = text[i]
        if ch == "Σ":
            if lowered[pos] == "ς":
                chars[i] = "ς"
            pos += 1
        else:
            pos += len(ch.lower())
    return "".join(chars)
