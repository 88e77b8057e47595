"""The precision rule and the inference runner: one of each, below training, evaluation, the
pipelines and the server.

Precision. "auto" is bf16 wherever the device has bf16 arithmetic (a CUDA GPU that has it, a
CPU with AVX-512 BF16 or AMX), for training and inference alike; on a CUDA GPU without bf16 it
is fp16 (with loss scaling when training); fp32 elsewhere. fp16 is for CUDA only. bf16 and fp16
run as autocast: weights stay fp32, matmuls run in the low precision.

Runner. Rows of any lengths are run in batches of similar length: sorted by length, cut at
`batch_size` rows, and cut earlier where the next row would make the batch more than half
padding (a few long texts among many short ones: a server's micro-batch, a long table row),
so short rows do not pay for the long ones' length. No gradients; results come back in the
rows' own order. In bf16 and fp16 a batch is padded to a multiple of PAD_MULTIPLE pieces: the
CPU's bf16 kernels are compiled and kept per input shape, so a long run over texts of every
length grew by about 16 MB per 500 texts (benchmarks/results/retrieval.md, index memory); a few
shapes keep it flat, and GPUs' tensor cores want such multiples anyway. Training batches follow
the same rule (pad_multiple). fp32 keeps the exact lengths (the reference comparisons are
bitwise there).

Progress. A long run can show how far it is (Runner.showing): each batch advances a
progress_bar by its rows, drawn in place on a terminal and written as whole lines off one; or,
counted in the caller's units (documents, examples, input lines, whose rows are windows or
sentences the caller cannot count ahead), by its share of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ConfigError, check_choice

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PAD_MULTIPLE = 16  # bf16/fp16 batches: their length rounded up to a multiple of this
LINE_SECONDS = 30.0  # off a terminal: a progress line at most this often, none for a shorter run


def cpu_supports_bf16() -> bool:
    """AVX-512 BF16 or AMX: where bf16 matmuls are fast on the CPU (Linux flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_precision(precision: str, device: torch.device) -> str:
    """fp32, bf16 or fp16 for `precision` (one of PRECISIONS) on `device` (see above)."""
    check_choice("precision", precision, PRECISIONS)
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(
            "precision=fp16 (with loss scaling) is for CUDA GPUs; use bf16 or fp32 on the CPU"
        )
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_supports_bf16() else "fp32"


def pad_multiple(precision: str) -> int:
    """The multiple a batch's length is rounded up to in `precision` (resolved): PAD_MULTIPLE in
    bf16/fp16, whose CPU kernels are kept per shape; none in fp32."""
    return 1 if precision == "fp32" else PAD_MULTIPLE


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def release_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc's malloc_trim; nothing
    elsewhere): tensors of many sizes freed in a long run otherwise stay resident."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def device_of(name: str | None) -> torch.device:
    """The device named (cpu, cuda, cuda:1), else a GPU if there is one."""
    try:
        device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise ConfigError(f"device={name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r}: no CUDA GPU here (torch {torch.__version__}); use cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r}: bertforge runs on cpu or cuda")
    return device


def length_batches(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    max_tokens: int | None = None,
    multiple: int = 1,
) -> Iterator[np.ndarray]:
    """Row indices in length order, cut into batches (see the module docstring); with
    max_tokens, also before the batch, padded to its longest row rounded up to `multiple`
    (collate's), would exceed that many pieces (a row longer than that alone is a batch)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    start, tokens = 0, 0
    budget = max_tokens or np.inf
    for k, r in enumerate(order):
        n, length = k - start, int(lengths[r])
        if n and (
            n == batch_size
            or (n + 1) * length > 2 * (tokens + length)
            or (n + 1) * (-(-length // multiple) * multiple) > budget
        ):
            yield order[start:k]
            start, tokens = k, 0
        tokens += length
    if start < len(order):
        yield order[start:]


# Rows per batch and the pieces a batch may hold (None: no cap) where the caller leaves them to
# the device: a GPU is left idle by small batches (per batch, the host's work is the same), and
# a cap on pieces keeps a batch of long texts within its memory. The GPU's are chosen, not yet
# measured against others: sentence-transformers' best batch was 512 rows for MiniLM and 256 for
# BERT-base on an H200 (benchmarks/results/gpu.md).
BATCH_DEFAULTS = {"cpu": (32, None), "cuda": (512, 65_536)}


@dataclass
class Runner:
    """Where and how inference runs: device, resolved precision, rows per batch and the pieces
    a batch may hold (None: no cap); overlap (None: on a GPU) says whether the host works ahead
    of the device (see `overlaps`)."""

    device: torch.device
    precision: str  # fp32, bf16 or fp16 (resolved)
    batch_size: int = 64
    overlap: bool | None = None
    max_tokens: int | None = None
    progress: Any = None  # a progress_bar each batch advances by its rows (showing); None: none
    progress_end: int | None = None  # set: where a call's batches take the bar in all (showing)

    @property
    def pad_multiple(self) -> int:
        return pad_multiple(self.precision)

    @classmethod
    def create(
        cls,
        device: str | None,
        precision: str,
        batch_size: int | None = 64,
        max_tokens: int | None = None,
    ) -> Runner:
        """batch_size, max_tokens None: the device's defaults (BATCH_DEFAULTS)."""
        d = device_of(device)
        rows, tokens = BATCH_DEFAULTS.get(d.type, BATCH_DEFAULTS["cpu"])
        batch_size = rows if batch_size is None else batch_size
        max_tokens = tokens if max_tokens is None else max_tokens
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value}: must be at least 1")
        return cls(d, resolve_precision(precision, d), batch_size, max_tokens=max_tokens)

    def __call__(
        self,
        lengths: Sequence[int] | np.ndarray,
        make_batch: Callable[[np.ndarray], Any],
        fn: Callable[[Any], Any],
    ) -> list[Any]:
        """fn(make_batch(rows)) for each batch of rows; fn returns one item per row of its
        batch, in the batch's order (the items come back in the rows' order), or None where it
        keeps its results itself, or a `Later` (see `later`) giving either; a Later is read
        once the next batch has been given to the device."""
        out: list[Any] = [None] * len(lengths)

        def place(rows: np.ndarray, items: Any) -> None:
            if isinstance(items, Later):
                items = items.finish()
            if items is not None:
                for r, item in zip(rows, items):
                    out[r] = item

        pending = None
        advance = self._advancing(len(lengths))
        # The next batch is made on this thread while the device runs this one (a Later is read
        # only after): a worker thread made it before, which cost more in handing the GIL to
        # and fro (+0.3 s per 50,000 sentences on the CPU) than it saved.
        cut = length_batches(lengths, self.batch_size, self.max_tokens, self.pad_multiple)
        with torch.inference_mode(), autocast(self.precision, self.device):
            for rows in cut:
                result = fn(make_batch(rows))
                if pending is not None:
                    place(*pending)
                pending = rows, result
                advance(len(rows))
            if pending is not None:
                place(*pending)
        return out

    def _advancing(self, rows: int) -> Callable[[int], None]:
        """How a call over `rows` rows advances the bar per batch: by the batch's rows, or with
        progress_end, by its share of what is left up to there (whole units; the call's last
        batch ends there)."""
        bar, end = self.progress, self.progress_end
        if bar is None:
            return lambda n: None
        if end is None:
            return bar.update
        units, start = max(end - bar.n, 0), bar.n
        done = [0]  # rows run

        def advance(n: int) -> None:
            done[0] += n
            bar.update(start + units * done[0] // max(rows, 1) - bar.n)

        return advance

    @contextlib.contextmanager
    def showing(self, bar: Any, units: int | None = None) -> Iterator[Any]:
        """`bar` (a progress_bar) advanced by the rows of every batch run meanwhile, closed at
        the end; None: the bar already shown, if any, goes on. With `units`, the calls run
        meanwhile advance it by that many in all instead, spread over their batches by their
        rows (a caller's documents or lines, whose rows are their sentences or windows): the
        first call takes it all the way (a later one has nothing left to add), and at the end
        it stands `units` further on (a call that ran no rows: empty documents)."""
        if bar is None and units is None:
            yield self.progress
            return
        before = self.progress, self.progress_end
        if bar is not None:
            self.progress = bar
        end = None if units is None or self.progress is None else self.progress.n + units
        self.progress_end = end
        try:
            yield self.progress
            if end is not None:
                self.progress.update(end - self.progress.n)
        finally:
            self.progress, self.progress_end = before
            if bar is not None:
                bar.close()

    @property
    def overlaps(self) -> bool:
        """Whether the host works ahead of the device (default: on a GPU, which would otherwise
        wait for it; on the CPU the host is the device): batches' rows known on the host so the
        device reads nothing back (tasks.base.on_device), results copied back behind the next
        batch's work (`later`), so the host makes the next batch while the device runs this
        one; and Pipeline.embed tokenises its next part in a thread (pipelines.PART)."""
        return self.device.type == "cuda" if self.overlap is None else self.overlap

    def later(self, result: torch.Tensor, finish: Callable[[np.ndarray], Any]) -> Any:
        """finish(result as a float32 array), for fn to return: called now when the runner does
        not overlap; else a Later, whose copy to the host (on a GPU: pinned, non-blocking) the
        runner waits for only once the next batch is queued behind it."""
        if not self.overlaps:
            return finish(result.float().cpu().numpy())
        host = result.float().to("cpu", non_blocking=True)
        copied = None
        if result.is_cuda:  # CUDA only: the copy's end, on the stream of result's own device
            # (the current device's may be another GPU's); blocking: the host sleeps, not spins
            copied = torch.cuda.Event(blocking=True)
            copied.record(torch.cuda.current_stream(result.device))

        def wait() -> Any:
            if copied is None:
                return finish(host.numpy())
            copied.synchronize()
            # out of the pinned buffer, which goes back to torch's cache for the next batches:
            # rows a caller keeps would otherwise hold page-locked memory (a long NER run's
            # per-token rows, gigabytes)
            return finish(host.numpy().copy())

        return Later(wait)


def progress_bar(desc: str, total: int | None, unit: str, scale: bool = False) -> Any:
    """A tqdm bar on stderr: on a terminal drawn in place; off one (a log file, a pipe, where
    tqdm's carriage returns pile up on one line) a line `desc: n/total unit (p%), rate, time
    left` at most every LINE_SECONDS, the last one at the end, and none for a shorter run.
    scale: counts shown as 1.2M (characters, say)."""
    from tqdm.auto import tqdm

    shown = {"unit": f" {unit}", "unit_scale": scale, "file": sys.stderr}
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, dynamic_ncols=True, **shown)

    class Lines(tqdm):  # type: ignore[misc, valid-type]
        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if msg is None:  # a refresh (msg "" is a clear: nothing to clear in a log)
                self.fp.write(f"{self}\n")
                self.fp.flush()
            return msg is None

        def close(self) -> None:
            shown = getattr(self, "last_print_t", -1.0) >= self.start_t + self.delay
            if not self.disable and shown and self.last_print_n < self.n:
                self.display()  # where it ended
            super().close()

    counted = "{n_fmt}/{total_fmt}{unit} ({percentage:.0f}%), {rate_fmt}, {remaining} left"
    return Lines(
        total=total,
        desc=desc,
        **shown,
        bar_format="{desc}: " + (counted if total else "{n_fmt}{unit}, {rate_fmt}"),
        mininterval=LINE_SECONDS,
        delay=LINE_SECONDS,
        miniters=1,  # no dynamic miniters: tqdm's monitor thread would print between lines
        leave=False,  # close's final line is ours (a kept bar would end in a blank line)
    )


@dataclass
class Later:
    """A batch's results still on their way from the device: `finish()` waits and gives them."""

    finish: Callable[[], Any]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: to a GPU from pinned memory, without blocking the host (the
    copy from pageable memory would wait for the device's queue)."""
    if device.type == "cuda" and t.device.type == "cpu":  # CUDA only
        return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
    return t.to(device)


def prepared(
    batches: Iterator[np.ndarray], make_batch: Callable[[np.ndarray], Any], ahead: bool
) -> Iterator[tuple[np.ndarray, Any]]:
    """(rows, make_batch(rows)) for each batch of rows; with `ahead`, each next batch made by a
    worker thread while the caller uses this one (make_batch must touch no autograd state)."""
    if not ahead:
        yield from ((rows, make_batch(rows)) for rows in batches)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="bertforge-batches") as pool:
        rows = next(batches, None)
        pending = pool.submit(make_batch, rows) if rows is not None else None
        while rows is not None and pending is not None:
            batch = pending.result()
            following = next(batches, None)
            if following is not None:
                pending = pool.submit(make_batch, following)
            yield rows, batch
            rows = following
