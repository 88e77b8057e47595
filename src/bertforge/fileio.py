"""Files in and out: checked UTF-8 line reading, atomic writes, and `inside`: a file name read
from a model directory's own files (a shard, a module's folder) kept inside that directory.

Reading: the text readers of corpora, task tables and CoNLL files go through
`text_lines`, so a file that is not UTF-8 or not text fails the same way everywhere, naming
the file, line and byte. Writing: write to a temporary file beside the target, then rename over
it; a crash (or Ctrl-C) mid-write leaves the previous file intact and never a half-written one,
because `os.replace` within one directory is atomic on POSIX and Windows. Written files get the
mode a plain open() would give them under the process's umask (0644 under 022).
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import errno
import hashlib
import io
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import CheckpointError, ConfigError, DataError, check_choice, redacted

try:
    import fcntl  # sole_writer's lock; not on Windows, where there is none
except ImportError:
    fcntl = None  # type: ignore[assignment]

ENCODING_ERRORS = ("strict", "replace", "ignore")  # what to do with bytes that are not UTF-8
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read (there is no other way) and put back at once
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file: 0644 under umask 022


Span = tuple[int, int, int]  # a piece of a text file: (byte offset, first line number, lines)


def line_spans(
    path: str | os.PathLike[str], every: int, sha256s: list[str] | None = None
) -> list[Span]:
    """The pieces of `every` lines of a text file, found without decoding it: readers in other
    processes take one each (text_lines(span=...)) and read the file in parallel. `sha256s`
    (a list) gets the sha256 of each piece's bytes, in the same pass: a job that went on after
    its input changed redoes only the pieces that differ."""
    spans: list[list[int]] = []
    pieces: list[Any] = []  # each span's sha256, fed as it is read
    offset = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f):
            if n % every == 0:
                spans.append([offset, n + 1, 0])
                pieces.append(hashlib.sha256())
            spans[-1][2] += 1
            offset += len(raw)
            if sha256s is not None:
                pieces[-1].update(raw)
    if sha256s is not None:
        sha256s.extend(piece.hexdigest() for piece in pieces)
    return [(a, b, c) for a, b, c in spans]


def span_sha256(path: str | os.PathLike[str], span: Span) -> str:
    """The sha256 of a piece's bytes (line_spans' `sha256s`, read again): a reader finds the
    piece it was handed changed since it was cut."""
    piece = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(span[0])
        for raw in itertools.islice(f, span[2]):
            piece.update(raw)
    return piece.hexdigest()


def text_lines(
    path: str | os.PathLike[str],
    encoding_errors: str = "strict",
    on_bytes: Callable[[int], object] | None = None,
    hint: str = "",
    span: Span | None = None,
) -> Iterator[tuple[int, str]]:
    """(1-based line number, line with its ending) of a UTF-8 file ("-": stdin, checked alike);
    a leading BOM is dropped. span: only that piece of the file (line_spans), its line numbers
    the file's own.

    Lines are split on "\\n" only: a stray "\\r", "\\x0b" or U+2028 inside a text stays in
    the text (str.splitlines would split there). A byte that is not UTF-8 is an error naming
    file, line and byte (`hint` is added to it), unless encoding_errors="replace" or "ignore";
    a NUL byte is an error (a binary file). on_bytes(n) gets the size of each line read.
    """
    path = Path(path)
    check_choice("encoding_errors", encoding_errors, ENCODING_ERRORS)
    stdin = str(path) == "-"
    if stdin:
        path = Path("<stdin>")
    elif not path.is_file():
        what = "a directory, not a file" if path.is_dir() else "file not found"
        raise DataError(f"{path}: {what}")
    # stdin ("-") is read whole: it cannot be rewound after the look for NUL bytes
    with io.BytesIO(sys.stdin.buffer.read()) if stdin else open(path, "rb") as f:
        if b"\x00" in f.read(8192):
            raise DataError(f"{path}: looks like a binary file (NUL bytes), expected UTF-8 text")
        offset, first, count = span or (0, 1, None)
        f.seek(offset)
        for lineno, raw in enumerate(itertools.islice(f, count), start=first):
            if on_bytes is not None:
                on_bytes(len(raw))
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                line = raw.decode("utf-8", errors=encoding_errors)
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}: line {lineno}: byte {e.start} ({raw[e.start : e.start + 1]!r}) is "
                    f"not UTF-8; convert the file to UTF-8{hint}"
                ) from None
            if "\x00" in line:
                raise DataError(f"{path}: line {lineno}: NUL byte (a binary file?), expected text")
            yield lineno, line


@contextlib.contextmanager
def sole_writer(directory: str | os.PathLike[str], what: str) -> Iterator[Path]:
    """The directory (made if missing) held by this job alone while the block runs: another
    process's job holding it is refused, one line (an advisory flock on the directory, released
    when the block ends or the process dies; local to a machine, so two nodes writing one
    shared directory are not kept apart). Directories made here (the parents too) and left
    empty by a failed block are removed. A path that is a file is left to the caller to refuse."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        yield directory
        return
    made = [d for d in [directory, *directory.parents] if not d.exists()]  # leaf first
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        if fcntl is not None:  # not on Windows: there, no lock
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(
                    f"{directory}: another {what} is writing it now: wait for it to end, or "
                    "give another directory"
                ) from None
        try:
            yield directory
        except BaseException:
            for d in made:  # what this made, while nothing was written in it
                if any(d.iterdir()):
                    break
                d.rmdir()
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is renamed to `path`, on error removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except FileExistsError:  # a file where a directory of the path should be
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path.parent)) from None
    except OSError as e:  # named by the file asked for, not by the temporary one
        raise OSError(e.errno, e.strerror, str(path)) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, FILE_MODE)  # mkstemp's 0600 would keep other users from reading it
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def refuse_overwrite(
    out: str | os.PathLike[str] | None,
    inputs: Mapping[str, str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None],
    option: str,
) -> None:
    """One ConfigError, before any work, when the output `out` (given as `option`) is one of the
    command's inputs ({what: path or paths}: a file, or a directory such as a model's or an
    index's) or lies inside one, every link followed: writing it would damage what the command
    reads. Inputs that are not there ("-", a DSN, a hub name) have nothing to lose; an input
    inside an output directory is allowed (`predict --data test.tsv --out .`)."""
    if out is None or str(out) == "-":
        return
    if redacted(str(out)) != str(out):  # user:PASSWORD@: a database's address, not a file
        raise ConfigError(
            f"{option} {redacted(str(out))}: holds a password, as a database address does, not "
            "a file path; bertforge writes no file named after a password"
        )
    target = Path(out).resolve()
    for what, given in inputs.items():
        paths = [given] if given is None or isinstance(given, (str, os.PathLike)) else given
        for source in map(Path, (p for p in paths if p is not None and str(p) != "-")):
            if not source.exists():
                continue
            real = source.resolve()
            same = target == real
            with contextlib.suppress(OSError):
                same = same or os.path.samefile(target, real)  # a hard link
            if same and not real.is_dir():
                raise ConfigError(
                    f"{option} {out} is the {what} file: writing it would lose the input; give "
                    "another path"
                )
            if same or (real.is_dir() and target.is_relative_to(real)):
                where = "is" if same else "is inside"
                raise ConfigError(
                    f"{option} {out} {where} the {what} directory {source}: writing there would "
                    f"damage the {what}; give a path outside it"
                )


# what a directory holds, told by the files each kind always has (the first kind found wins)
KINDS_OF_DIRECTORY = {
    "model": ("config.json", "bert_config.json", "model.safetensors", "pytorch_model.bin"),
    "index": ("index.json", "build.json"),
    "pre-training data": ("meta.json",),
    "run": ("run.json",),
}


def refuse_other_kind(out: str | os.PathLike[str], option: str, writes: str) -> None:
    """One ConfigError, before any work, when the directory `out` (given as `option`) holds
    another kind of thing than the command writes (`writes`, one of KINDS_OF_DIRECTORY, or
    "vocabulary"): `vocab train --out MODEL` replaced a model's vocab.txt, `prepare --out
    INDEX` wrote shards among an index's files. The command's own kind is re-written as
    before (a re-run, a resume)."""
    folder = Path(out)
    if not folder.is_dir():
        return
    for kind, names in KINDS_OF_DIRECTORY.items():
        found = [n for n in names if (folder / n).exists()]
        if found and kind != writes:
            article = "an" if kind[0] in "aeiou" else "a"
            raise ConfigError(
                f"{option} {out} holds {article} {kind} ({found[0]}): the {writes} would be "
                "written among its files and replace some; give another directory"
            )


def files_sha256(files: Sequence[str | os.PathLike[str]], names: bool = False) -> str:
    """sha256 over the files' bytes, read 1 MB at a time; with `names`, each file's name and a
    NUL byte before its bytes (what an index records of its model and its own files)."""
    h = hashlib.sha256()
    kept = _READ_ONCE.get()
    for f in map(Path, files):
        if names:
            h.update(f.name.encode() + b"\0")
        # a small file of a reads_once block (a config) is kept for its readers; weights are not
        if (
            kept is not None
            and os.path.abspath(f).startswith(kept[0])
            and f.stat().st_size <= 1 << 20
        ):
            h.update(read_bytes(f))
            continue
        with open(f, "rb") as stream:
            while block := stream.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_text(obj: Any, indent: int | None = None) -> str:
    """JSON text (UTF-8 characters kept) that every JSON reader takes: a NaN or infinity (a
    metric of a constant input, a diverged loss) is written as null, since Python's bare `NaN`
    is not JSON; the one rule for every JSON file bertforge writes (write_json, metrics.jsonl)."""

    def finite(x: Any) -> Any:
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [finite(v) for v in x]
        return x

    return json.dumps(finite(obj), indent=indent, ensure_ascii=False, allow_nan=False)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON (indented, sorted as given, UTF-8, trailing newline, non-finite numbers as
    null: json_text) atomically."""
    write_text(path, json_text(obj, indent=2) + "\n")


# the files read inside a `reads_once` block: (its directory, absolute path -> bytes)
_READ_ONCE: contextvars.ContextVar[tuple[str, dict[str, bytes]] | None] = contextvars.ContextVar(
    "bertforge_read_once", default=None
)


@contextlib.contextmanager
def reads_once(directory: str | os.PathLike[str], read: dict[str, bytes]) -> Iterator[None]:
    """Inside the block (this thread), `read_bytes` and the readers built on it (read_json, the
    vocabulary readers) take each file of `directory` from `read` once it has been read: an
    object that holds `read` (modeldir.ModelDir) reads each of its files once, whichever
    readers ask. Other files are read as ever (a data file is not kept)."""
    token = _READ_ONCE.set((os.path.join(os.path.abspath(directory), ""), read))
    try:
        yield
    finally:
        _READ_ONCE.reset(token)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A file's bytes (Path.read_bytes' errors), from the reads_once block's files if any."""
    block = _READ_ONCE.get()
    key = os.path.abspath(path)
    if block is None or not key.startswith(block[0]):
        return Path(path).read_bytes()
    if key not in block[1]:
        block[1][key] = Path(path).read_bytes()
    return block[1][key]


def copy_file(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Copy `source` to `target`: from the reads_once block's bytes when it has read the file
    already (a model's config copied into a new model is not read twice), else from disk."""
    block = _READ_ONCE.get()
    kept = block[1].get(os.path.abspath(source)) if block is not None else None
    if kept is None:
        shutil.copyfile(source, target)
    else:
        Path(target).write_bytes(kept)


def read_json(
    path: str | os.PathLike[str], error: type[Exception] = DataError, obj: bool = True
) -> Any:
    """A UTF-8 (BOM tolerated) JSON file, a JSON object unless obj=False; a missing file, bad
    bytes or bad syntax raise `error` naming the file and the spot."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: file not found")
    raw = read_bytes(path)
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise error(f"{path}: line {line}: byte offset {e.start} is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: line {e.lineno}, column {e.colno}: invalid JSON: {e.msg}") from None
    if obj and not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_lines(
    path: Path,
    encoding_errors: str = "strict",
    on_bytes: Callable[[int], object] | None = None,
    hint: str = ", or pass encoding_errors='replace' (CLI: --encoding-errors replace)",
    span: Span | None = None,
) -> Iterator[tuple[int, str]]:
    """(line number, text without the line ending) of a UTF-8 file (fileio.text_lines).

    A byte that is not UTF-8 is an error naming file, line and byte, unless
    encoding_errors="replace" (U+FFFD, which the tokenizer drops) or "ignore".
    on_bytes(n) is called with the size of each line read (for progress bars).
    """
    for lineno, line in text_lines(path, encoding_errors, on_bytes, hint, span):
        yield lineno, line.rstrip("\r\n")


def inside(
    directory: str | os.PathLike[str],
    name: object,
    source: str | os.PathLike[str],
    what: str = "entry",
) -> Path:
    """`directory / name` for a `name` read from one of the directory's own files (`source`:
    a shard in model.safetensors.index.json, a module's folder in modules.json), when it stays
    inside `directory` with every symlink followed; else a CheckpointError naming source and name.

    A crafted file could otherwise make a load read, or a copy of the layout write, anywhere
    ("../../x", "/etc/x", or a link inside the directory that leads out). The one exception is
    the Hugging Face hub's cache, whose snapshot files are links into the repository's blobs/.
    Fixed names (config.json, vocab.txt) do not come through here: a folder of links to a
    model kept elsewhere is a layout people use on purpose.
    """
    if not isinstance(name, str) or "\x00" in name:
        raise CheckpointError(f"{source}: {what} {name!r} is not a file name")
    relative = os.path.normpath(name)
    if os.path.isabs(name) or relative == ".." or relative.startswith(".." + os.sep):
        raise CheckpointError(
            f"{source}: {what} {name!r} is outside {directory}: a model's files must lie "
            "inside its directory"
        )
    root = Path(directory).resolve()
    target = (root / relative).resolve()
    allowed = [root]
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        allowed.append(root.parent.parent / "blobs")  # the hub's cache: links into blobs/
    if not any(target.is_relative_to(a) for a in allowed):
        raise CheckpointError(
            f"{source}: {what} {name!r} leads outside {directory} (a link to {target}): a "
            "model's files must lie inside its directory"
        )
    return Path(directory) / name
