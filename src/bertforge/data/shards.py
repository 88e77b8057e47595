"""`bertforge prepare`: text -> token-id shards, offline, once; and reading them back.

A prepared directory holds
    vocab.txt, tokenizer_config.json   the tokenizer that made the shards
    train-00000.tokens.npy ...          token ids of one shard, flat (uint16 if the vocabulary
                                        fits, else uint32)
    train-00000.index.npz ...           sentences: start offsets into tokens (S+1),
                                        documents: start offsets into sentences (D+1)
    heldout-00000.*                     the same for the held-out share (whole documents)
    meta.json                           settings, tokenizer identity, counts, shard list;
                                        written last: its presence means the job is complete

Memory stays bounded (one shard's tokens at a time); each file is written to a temporary name
and renamed. `progress.json` records how many documents are in finished shards, so an
interrupted run loses at most one shard of work and the same command finishes the job. An error
(a file that is not UTF-8, a JSON line without text) leaves the directory as it was: what the
failed call wrote is removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import time
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..fileio import atomic_path, read_json, write_json
from ..options import MAX_SEED
from ..tokenizer import Tokenizer
from .corpus import FORMAT_HELP, Document, detect_format, expand_inputs, read_corpus

FORMAT_VERSION = 1
SPLITS = ("train", "heldout")


def tokenizer_identity(tok: Tokenizer) -> dict[str, Any]:
    """What must match between shards and the tokenizer that reads or trains on them."""
    vocab = "".join(t + "\n" for t in tok.tokens).encode("utf-8")
    return {
        "vocab_sha256": hashlib.sha256(vocab).hexdigest(),
        "vocab_size": tok.vocab_size,
        "lowercase": tok.lowercase,
        "strip_accents": tok.strip_accents,
        "tokenize_chinese_chars": tok.tokenize_chinese_chars,
    }


def _is_heldout(ordinal: int, seed: int, fraction: float) -> bool:
    """A fixed pseudo-random choice per document (splitmix64 of its ordinal and the seed)."""
    z = (ordinal * 0x9E3779B97F4A7C15 + seed * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z / 2**64 < fraction


@dataclass
class _Buffer:
    """Documents of one split waiting to be written as a shard."""

    tokens: list[np.ndarray]
    sentence_lengths: list[np.ndarray]
    doc_sentences: list[int]

    @classmethod
    def empty(cls) -> _Buffer:
        return cls([], [], [])

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def _write_shard(out: Path, name: str, buf: _Buffer, dtype: np.dtype) -> dict[str, Any]:
    """A buffer of at least one document (flush_shards writes no empty one) as a shard."""
    tokens = np.concatenate(buf.tokens).astype(dtype, copy=False)
    lengths = np.concatenate(buf.sentence_lengths)
    sentences = np.r_[0, np.cumsum(lengths, dtype=np.int64)]  # (S+1,) start offsets
    docs = np.r_[0, np.cumsum(buf.doc_sentences, dtype=np.int64)]  # (D+1,)
    with atomic_path(out / f"{name}.tokens.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, tokens)
    with atomic_path(out / f"{name}.index.npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, sentences=sentences, documents=docs)
    return {
        "name": name,
        "documents": len(buf.doc_sentences),
        "sentences": len(lengths),
        "tokens": len(tokens),
    }


@contextlib.contextmanager
def _undone_on_error(out: Path) -> Iterator[None]:
    """On an error, leave `out` as it was before: remove what was written into it since (or
    `out` itself, if it did not exist) and put back the progress.json of an earlier interrupted
    run. Not on Ctrl-C: from its progress.json, the same command goes on."""
    existed = out.is_dir()
    before = set(os.listdir(out)) if existed else set()
    progress_file = out / "progress.json"
    progress = progress_file.read_bytes() if progress_file.is_file() else None
    try:
        yield
    except Exception:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        elif out.is_dir():
            for name in set(os.listdir(out)) - before:
                path = out / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if progress is not None:
                with atomic_path(progress_file) as tmp:
                    tmp.write_bytes(progress)
        raise


@dataclass
class _ShardWriter:
    """Documents in, shards out: documents wait in `pending` until they hold batch_sentences
    sentences, are tokenized together and go to their split's buffer; the buffers are written
    as shards once the training one holds shard_tokens tokens. `state` (documents done,
    shards written, the next shard number of each split) is what progress.json records."""

    out: Path
    tokenizer: Tokenizer
    dtype: np.dtype
    seed: int
    heldout: float
    batch_sentences: int
    shard_tokens: int
    state: dict[str, Any]
    buffers: dict[str, _Buffer] = field(
        default_factory=lambda: {s: _Buffer.empty() for s in SPLITS}
    )
    pending: list[tuple[int, Document]] = field(default_factory=list)
    pending_sentences: int = 0

    def add(self, ordinal: int, doc: Document) -> bool:
        """Take the corpus's `ordinal`-th document; True when shards were written (then
        progress.json is due)."""
        self.pending.append((ordinal, doc))
        self.pending_sentences += len(doc.sentences)
        if self.pending_sentences >= self.batch_sentences:
            self.tokenize_pending()
            if self.buffers["train"].num_tokens >= self.shard_tokens:
                self.flush_shards()
                return True
        return False

    def finish(self) -> None:
        """Everything taken so far into shards."""
        if self.pending:
            self.tokenize_pending()
        self.flush_shards()

    def flush_shards(self) -> None:
        state = self.state
        for split in SPLITS:
            buf = self.buffers[split]
            if buf.doc_sentences:
                name = f"{split}-{state['next_index'][split]:05d}"
                info = _write_shard(self.out, name, buf, self.dtype)
                info["split"] = split
                state["shards"].append(info)
                state["next_index"][split] += 1
                self.buffers[split] = _Buffer.empty()

    def tokenize_pending(self) -> None:
        sentences = [s for _, doc in self.pending for s in doc.sentences]
        ids = self.tokenizer.encode_ids(sentences)
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, count=int(lengths.sum()))
        starts = np.r_[0, np.cumsum(lengths)]
        s = 0
        for ordinal, doc in self.pending:
            n = len(doc.sentences)
            doc_lengths = lengths[s : s + n]
            keep = doc_lengths > 0  # sentences of nothing but dropped characters
            if keep.any():
                held = _is_heldout(ordinal, self.seed, self.heldout)
                buf = self.buffers["heldout" if held else "train"]
                buf.tokens.append(flat[starts[s] : starts[s + n]])
                buf.sentence_lengths.append(doc_lengths[keep])
                buf.doc_sentences.append(int(keep.sum()))
            s += n
        self.state["documents_done"] = self.pending[-1][0] + 1
        self.pending, self.pending_sentences = [], 0


def prepare(
    inputs: Sequence[str | os.PathLike[str]],
    tokenizer: Tokenizer,
    out: str | os.PathLike[str],
    *,
    fmt: str = "auto",
    heldout: float = 0.01,
    shard_tokens: int = 1 << 22,
    seed: int = 0,
    encoding_errors: str = "strict",
    batch_sentences: int = 16384,
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenize a corpus into shards under `out`; returns meta.json's content.

    Re-running with the same arguments resumes an interrupted run, or reports that the job is
    already complete; other arguments on a non-empty `out` are an error (nothing is deleted).
    An error on the way (a file that is not UTF-8, no text) leaves `out` as it was.
    """
    out = Path(out)
    files, settings = _settings(
        inputs, tokenizer, fmt, heldout, shard_tokens, seed, encoding_errors
    )
    progress_file = out / "progress.json"
    done, state = _earlier_run(out, settings)
    if done is not None:
        if progress:
            print(
                f"{out}: already prepared ({done['counts']['train']['tokens']:,} training tokens)"
            )
        return done
    formats: str | list[str] = fmt
    if fmt == "auto":
        formats = [detect_format(f) for f in files]
        if progress:
            _say_formats(files, formats)
    with _undone_on_error(out):  # a failed call leaves `out` as it found it
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(out)
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32)
        writer = _ShardWriter(
            out, tokenizer, dtype, seed, heldout, batch_sentences, shard_tokens, state
        )
        meta = _write_shards(writer, files, formats, encoding_errors, settings, progress)
        progress_file.unlink(missing_ok=True)
    _say_done(out, meta["counts"], heldout, progress)
    return meta


def _write_shards(
    writer: _ShardWriter,
    files: list[Path],
    formats: str | list[str],
    encoding_errors: str,
    settings: dict[str, Any],
    progress: bool,
) -> dict[str, Any]:
    """Read the corpus into shards (the documents an earlier, interrupted run wrote skipped),
    progress.json after each batch of shards, meta.json last; returns meta.json's content."""
    state = writer.state
    total_bytes = sum(f.stat().st_size for f in files)
    bar = _progress_bar(total_bytes, progress, state["documents_done"])
    started = time.time()
    try:
        for ordinal, doc in enumerate(read_corpus(files, formats, encoding_errors, bar.update)):
            if ordinal < state["documents_done"]:
                continue  # in a shard written by an earlier, interrupted run
            if writer.add(ordinal, doc):
                write_json(writer.out / "progress.json", {"settings": settings, "state": state})
        writer.finish()
    finally:
        bar.close()  # before any error message, so that message is the last line

    counts = _counts(state["shards"])
    if counts["train"]["tokens"] == 0:
        raise DataError(f"no training text in {', '.join(str(f) for f in files[:3])}")
    meta = {
        "settings": settings,
        "state": state,
        "dtype": writer.dtype.name,
        "counts": counts,
        "shards": state["shards"],
        "seconds": round(time.time() - started, 2),
    }
    write_json(writer.out / "meta.json", meta)
    return meta


def _settings(
    inputs: Sequence[str | os.PathLike[str]],
    tokenizer: Tokenizer,
    fmt: str,
    heldout: float,
    shard_tokens: int,
    seed: int,
    encoding_errors: str,
) -> tuple[list[Path], dict[str, Any]]:
    """The input files and the settings a run records (and a resumed run must match), after
    checking the options."""
    if not 0.0 <= heldout < 1.0:
        raise DataError(f"heldout={heldout}: must be in [0, 1)")
    if not 0 <= seed <= MAX_SEED:
        raise DataError(f"seed={seed} (--seed): must be >= 0 and <= {MAX_SEED}")
    if shard_tokens < 1:
        raise DataError(f"shard_tokens={shard_tokens} (--shard-tokens): must be at least 1")
    files = expand_inputs(inputs)
    if not files:
        raise DataError("no input files")
    settings = {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_identity(tokenizer),
        "inputs": [_input_identity(f) for f in files],
        "format": fmt,
        "heldout": heldout,
        "shard_tokens": shard_tokens,
        "seed": seed,
        "encoding_errors": encoding_errors,
    }
    return files, settings


def _input_identity(path: Path) -> dict[str, Any]:
    """What says an input file is the one an earlier run read: its path, size and modification
    time (an edit that keeps the size changes the time)."""
    st = path.stat()
    return {"path": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _earlier_run(
    out: Path, settings: dict[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """What an earlier run left in `out`: its meta.json if it finished (else None), and the
    state to go on from (an interrupted run's progress.json, or a fresh start). An earlier
    run with other settings is an error."""
    state = {"documents_done": 0, "shards": [], "next_index": {s: 0 for s in SPLITS}}
    for existing in (out / "meta.json", out / "progress.json"):
        if existing.is_file():
            saved = read_json(existing)
            mine = _as_recorded(settings, saved.get("settings"))
            if saved.get("settings") != mine:
                raise DataError(
                    f"{out} already holds shards prepared with other settings or inputs "
                    f"({existing.name}: {_differences(saved.get('settings') or {}, mine)}); "
                    "choose a new --out or remove that directory"
                )
            if existing.name == "meta.json":
                return saved, state
            state = saved["state"]
    return None, state


def _as_recorded(settings: dict[str, Any], saved: Any) -> dict[str, Any]:
    """Our settings as an earlier run recorded them: a run from before inputs kept their
    modification time (mtime_ns) is compared on path and size, as it was then."""
    inputs = saved.get("inputs") if isinstance(saved, dict) else None
    if not isinstance(inputs, list) or any("mtime_ns" in i for i in inputs if isinstance(i, dict)):
        return settings
    old = [{k: v for k, v in i.items() if k != "mtime_ns"} for i in settings["inputs"]]
    return {**settings, "inputs": old}


def _differences(saved: dict[str, Any], mine: dict[str, Any]) -> str:
    """The settings that differ, and the first input file that is not the one read before."""
    shown = []
    for key in sorted(k for k in mine.keys() | saved.keys() if saved.get(k) != mine.get(k)):
        theirs = saved.get(key)
        if key == "inputs" and isinstance(theirs, list) and len(theirs) == len(mine[key]):
            changed = [m["path"] for t, m in zip(theirs, mine[key]) if t != m]
            more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
            key = f"{changed[0]}{more} changed"
        shown.append(key)
    return ", ".join(shown)


def _counts(shards: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Documents, sentences, tokens and shards of each split."""
    summed = ("documents", "sentences", "tokens")
    counts = {split: dict.fromkeys((*summed, "shards"), 0) for split in SPLITS}
    for shard in shards:
        c = counts[shard["split"]]
        for key in summed:
            c[key] += shard[key]
        c["shards"] += 1
    return counts


def _say_done(out: Path, counts: dict[str, dict[str, int]], heldout: float, progress: bool) -> None:
    """A warning when nothing was held out although heldout asked for some; the counts."""
    if heldout > 0 and counts["heldout"]["documents"] == 0:
        warnings.warn(
            f"no document held out (heldout={heldout} of {counts['train']['documents']:,} "
            "documents): pre-training will have no held-out evaluation. Held-out text is chosen "
            "by document; a file read as 'paragraphs' is one document (--format lines reads a "
            "blank line as the end of a document)",
            stacklevel=3,  # prepare's caller
        )
    if progress:
        c = counts["train"]
        print(
            f"{out}: {c['documents']:,} documents, {c['sentences']:,} sentences, "
            f"{c['tokens']:,} tokens in {c['shards']} training shards; "
            f"held out {counts['heldout']['documents']:,} documents "
            f"({counts['heldout']['tokens']:,} tokens)"
        )


def _say_formats(files: list[Path], formats: list[str]) -> None:
    """How each file will be read, so a surprise (one-sentence lines without full stops read
    as hard-wrapped 'paragraphs', i.e. one document per file) is visible before the work."""
    by_format: dict[str, list[Path]] = {}
    for f, name in zip(files, formats):
        by_format.setdefault(name, []).append(f)
    for name, group in by_format.items():
        more = f" and {len(group) - 1:,} more" if len(group) > 1 else ""
        print(f"reading {group[0]}{more} as {name!r} ({FORMAT_HELP[name]})")


def _progress_bar(total: int, enabled: bool, skipping: int) -> Any:
    from tqdm.auto import tqdm

    desc = "prepare" if not skipping else f"prepare (resuming after {skipping:,} documents)"
    return tqdm(
        total=total, unit="B", unit_scale=True, desc=desc, disable=not enabled, smoothing=0.1
    )


# ------------------------------------------------------------------------------------------------
# Reading shards


@dataclass
class Shard:
    """One shard: flat token ids (memory-mapped) and its sentence and document offsets."""

    name: str
    tokens: np.ndarray  # (N,) token ids
    sentences: np.ndarray  # (S+1,) start of each sentence in tokens
    documents: np.ndarray  # (D+1,) start of each document in sentences

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1


class ShardSet:
    """A prepared directory: its metadata and shards, checked against a tokenizer."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        meta_file = self.directory / "meta.json"
        if not meta_file.is_file():
            hint = (
                " (an interrupted prepare: run it again)"
                if (self.directory / "progress.json").exists()
                else ""
            )
            raise DataError(f"{self.directory}: no meta.json, not a prepared data directory{hint}")
        try:
            self.meta = read_json(meta_file)
            self.identity = self.meta["settings"]["tokenizer"]
        except (ValueError, KeyError) as e:
            raise DataError(f"{meta_file}: not a valid meta.json ({e})") from None

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_pretrained(self.directory)

    def fingerprint(self) -> str:
        """sha256 of what identifies the prepared data: meta.json's settings (the tokenizer's
        identity; the inputs with their sizes and modification times) and its list of shards
        with their counts. A training run keeps it, so that resuming on other data is refused."""
        what = {"settings": self.meta["settings"], "shards": self.meta.get("shards")}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8")).hexdigest()

    def check_tokenizer(self, tok: Tokenizer, what: str) -> None:
        """The model's tokenizer must be the one the shards were made with."""
        theirs = tokenizer_identity(tok)
        diff = [k for k in self.identity if self.identity[k] != theirs.get(k)]
        if diff:
            raise DataError(
                f"{what} does not match the tokenizer of {self.directory / 'meta.json'} "
                f"(differs in {', '.join(diff)}): prepare the data again with this tokenizer"
            )

    def names(self, split: str) -> list[str]:
        return [s["name"] for s in self.meta["shards"] if s["split"] == split]

    def count(self, split: str, key: str = "tokens") -> int:
        return int(self.meta["counts"][split][key])

    def load(self, name: str) -> Shard:
        tokens_file = self.directory / f"{name}.tokens.npy"
        index_file = self.directory / f"{name}.index.npz"
        try:
            tokens = np.load(tokens_file, mmap_mode="r")
            with np.load(index_file) as index:
                sentences, documents = index["sentences"], index["documents"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            # EOFError: an empty .npy or .npz; BadZipFile: a truncated .npz
            raise DataError(
                f"{tokens_file.parent / name}: unreadable shard ({type(e).__name__}: {e})"
            ) from None
        if (
            len(sentences) == 0
            or len(documents) == 0
            or sentences[-1] != len(tokens)
            or documents[-1] != len(sentences) - 1
        ):
            raise DataError(f"{tokens_file}: shard is inconsistent with its index (truncated?)")
        return Shard(name, tokens, sentences, documents)
