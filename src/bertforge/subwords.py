"""Tokenizers of the other families: a `tokenizers` tokenizer.json read as its file says.

BERT's WordPiece is rebuilt by tokenizer.py to Google's exact rules. Every other tokenizer.json
(RoBERTa's byte-level BPE, XLM-RoBERTa's SentencePiece Unigram, MPNet's WordPiece with <s> and
</s>) is its own reference: transformers encodes with this very engine and file. So the engine
is loaded from the file whole (normalizer, pre-tokenizer, model, post-processor with the
family's pair template, added tokens) with its truncation and padding turned off (bertforge
cuts and pads itself), and this module says which special token is which:
tokenizer_config.json and special_tokens_map.json name them (cls_token, sep_token, pad_token,
unk_token, mask_token, or bos/eos where cls/sep are absent); a file that names none falls back
on the post-processor's own tokens and the model's unknown token.

    engine, specials, length = read_engine(path, read_json(path, VocabError), directory)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Engine

from .errors import VocabError
from .families import Specials
from .families.roberta import ROBERTA
from .fileio import read_json

ROLES = ("pad", "unk", "cls", "sep", "mask")
_FALLBACK = {"cls": "bos_token", "sep": "eos_token"}  # read where cls_token / sep_token are absent


def is_bert_wordpiece(d: dict[str, Any]) -> bool:
    """Whether a tokenizer.json (parsed) is BERT's own: a WordPiece model with BERT's [CLS] ...
    [SEP] template (or none); tokenizer.py reads those to Google's rules. Everything else is
    read by its engine here."""
    model = d.get("model")
    if not isinstance(model, dict):
        return True  # not a tokenizer.json at all: tokenizer.py's reader names the fault
    kind = model.get("type") or ("WordPiece" if "max_input_chars_per_word" in model else None)
    if kind != "WordPiece":
        return False
    post = json.dumps(d.get("post_processor"))
    return "<s>" not in post and "</s>" not in post


def read_engine(
    path: Path, data: dict[str, Any], directory: Path | None = None
) -> tuple[Engine, Specials, int | None]:
    """The engine of a tokenizer.json (`data`: the file as read, its post-processor and model
    consulted without reading the file again), the special tokens it uses, and the
    model_max_length its tokenizer_config.json gives (None when none); one VocabError naming
    the file otherwise."""
    try:
        engine = Engine.from_file(str(path))
    except Exception as e:  # the engine's parse errors are plain Exceptions
        raise VocabError(f"{path}: not a tokenizers file the engine can read: {e}") from None
    engine.no_truncation()
    engine.no_padding()
    config = _config(directory) if directory is not None else {}
    found = {role: _named(config, role) or _default(role, data) for role in ROLES}
    length = config.get("model_max_length")
    limit = int(length) if isinstance(length, (int, float)) and 0 < length < 10**9 else None
    return engine, checked_specials(engine, found, str(path)), limit


def checked_specials(engine: Engine, found: dict[str, str | None], source: str) -> Specials:
    """The special tokens of an engine, by role (ROLES), checked against its vocabulary and its
    template: one VocabError naming `source` where they contradict each other."""
    vocab = engine.get_vocab(with_added_tokens=True)
    for role in ("cls", "sep", "pad"):
        if found[role] is None or found[role] not in vocab:
            raise VocabError(
                f"{source}: the {role} token {found[role]!r} is not in the vocabulary; name it "
                f"({role}_token) in tokenizer_config.json"
            )
    if engine.post_processor is None:
        raise VocabError(
            f"{source}: has no post_processor: the template that puts the special tokens around a "
            "text (<s> A </s>) is needed; save the tokenizer with transformers to add it"
        )
    probe = engine.encode("", "", add_special_tokens=True)  # the pair template's specials alone
    for i, t in zip(probe.ids, probe.tokens):
        if vocab.get(t) != i:
            raise VocabError(
                f"{source}: post_processor gives {t!r} the id {i}, the vocabulary {vocab.get(t)}: "
                "the file contradicts itself"
            )
    pair = engine.post_processor.num_special_tokens_to_add(True)
    return Specials(
        cls=str(found["cls"]),
        sep=str(found["sep"]),
        pad=str(found["pad"]),
        unk=str(found["unk"]) if found["unk"] in vocab else "",  # byte-level BPE has none
        mask=str(found["mask"]) if found["mask"] in vocab else "",
        pair_extra=pair,
    )


KINDS = ("wordpiece", "bpe", "unigram")  # vocab train --kind


def train_engine(
    texts: Iterable[str],
    kind: str,
    vocab_size: int,
    min_frequency: int = 2,
    show_progress: bool = True,
) -> tuple[Engine, Specials]:
    """A new tokenizer of RoBERTa's kind (bpe: byte-level BPE, every text representable, no
    unknown token) or XLM-RoBERTa's (unigram: SentencePiece Unigram over Metaspace words), with
    <s> <pad> </s> <unk> <mask> at ids 0-4 and the pair template <s> A </s></s> B </s>: what
    `pretrain --arch roberta` needs (WordPiece is tokenizer.train_vocab's). Offsets leave out
    the space before a word, as those families' own tokenizers give them (a QA answer or an
    entity cut from them starts at its word)."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    sp = ROBERTA.specials
    order = [sp.cls, sp.pad, sp.sep, sp.unk, sp.mask]  # ids 0-4, as RoBERTa's
    if kind == "bpe":
        engine = Engine(models.BPE())
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        engine.decoder = decoders.ByteLevel()
        trainer: Any = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=order,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=show_progress,
        )
    elif kind == "unigram":
        engine = Engine(models.Unigram())
        engine.normalizer = normalizers.NFKC()  # SentencePiece's default normalisation
        # XLM-RoBERTa's: words split at whitespace, then each marked "▁", so that the mark takes
        # no character of the text (Metaspace alone makes a piece of the space before a word)
        engine.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]
        )
        engine.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=order,
            unk_token=sp.unk,
            show_progress=show_progress,
        )
    else:
        raise ValueError(f"kind={kind!r}: train_engine makes bpe or unigram tokenizers")
    engine.train_from_iterator(texts, trainer=trainer)
    cls, sep = (sp.cls, engine.token_to_id(sp.cls)), (sp.sep, engine.token_to_id(sp.sep))
    if kind == "bpe":
        # RoBERTa's own post-processor: its trim_offsets takes the "Ġ" space out of the offsets
        engine.post_processor = processors.RobertaProcessing(
            sep, cls, trim_offsets=True, add_prefix_space=False
        )
    else:
        engine.post_processor = processors.TemplateProcessing(
            single=f"{cls[0]} $A {sep[0]}",
            pair=f"{cls[0]} $A {sep[0]} {sep[0]} $B {sep[0]}",
            special_tokens=[cls, sep],
        )
    found = dict(zip(ROLES, sp.tokens))
    return engine, checked_specials(engine, found, f"trained {kind} vocabulary")


def _config(directory: Path) -> dict[str, Any]:
    """tokenizer_config.json's fields over special_tokens_map.json's (transformers' order)."""
    merged: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        f = directory / name
        if f.is_file():
            merged.update(read_json(f, VocabError))
    return merged


def _named(config: dict[str, Any], role: str) -> str | None:
    for key in (f"{role}_token", _FALLBACK.get(role)):
        value = config.get(key) if key else None
        if isinstance(value, dict):  # an AddedToken written out: {"content": ...}
            value = value.get("content")
        if isinstance(value, str) and value:
            return value
    return None


def _default(role: str, data: dict[str, Any]) -> str | None:
    """A role's token where the configs name none: the post-processor's cls/sep, the model's
    unknown token, and the common spellings of padding and mask (`data`: the tokenizer.json)."""
    post = data.get("post_processor") or {}
    if role in ("cls", "sep"):
        given = post.get(role)  # RobertaProcessing / BertProcessing: [token, id]
        if isinstance(given, list) and given:
            return str(given[0])
        single = post.get("single") or []  # TemplateProcessing: the first and last specials
        ids = [s["SpecialToken"]["id"] for s in single if "SpecialToken" in s]
        if ids:
            return ids[0] if role == "cls" else ids[-1]
        return None
    if role == "unk":
        return (data.get("model") or {}).get("unk_token")
    return {"pad": "<pad>", "mask": "<mask>"}[role]


class NoFix:
    """EngineFix's place for an engine that is its own reference: texts go in as they are."""

    @staticmethod
    def prepare(text: str) -> tuple[str, None]:
        return text, None
