"""Where training numbers go: `metrics.jsonl` and TensorBoard event files.

The event files are written directly (TFRecord framing of `Event` protocol buffers, the
format TensorBoard reads), so no TensorFlow or tensorboard package is needed to produce them.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time
import warnings
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..fileio import json_text, write_text

# ------------------------------------------------------------------------------------------------
# TensorBoard event files

_CRC_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1  # CRC-32C (Castagnoli)
    _CRC_TABLE.append(_c)


def _masked_crc(data: bytes) -> int:
    """The masked CRC-32C of data, as TFRecord frames carry."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _length_delimited(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def _event(
    wall_time: float,
    step: int | None = None,
    file_version: str | None = None,
    scalars: dict[str, float] | None = None,
) -> bytes:
    """Event{1: wall_time double, 2: step int64, 3: file_version string, 5: Summary}."""
    out = _field(1, 1, struct.pack("<d", wall_time))
    if step is not None:
        out += _field(2, 0, _varint(step))
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    if scalars:
        # Summary{1: repeated Value{1: tag string, 2: simple_value float}}
        values = b"".join(
            _length_delimited(
                1, _length_delimited(1, tag.encode()) + _field(2, 5, struct.pack("<f", value))
            )
            for tag, value in scalars.items()
        )
        out += _length_delimited(5, values)
    return out


class EventWriter:
    """Appends scalar summaries to `events.out.tfevents.*` in a directory."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = directory / f"events.out.tfevents.{int(now)}.{socket.gethostname()}"
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for the whole run
        self._write(_event(now, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(
            header
            + struct.pack("<I", _masked_crc(header))
            + data
            + struct.pack("<I", _masked_crc(data))
        )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._write(_event(time.time(), step=step, scalars=values))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# ------------------------------------------------------------------------------------------------
# metrics.jsonl + TensorBoard


class MetricsLog:
    """One JSON object per line in RUN/metrics.jsonl, mirrored to TensorBoard (RUN/tensorboard).

    Every line is strict JSON: a number that is not finite (a diverged loss, the gradient norm
    of an fp16 step the loss scaler skips) is written as null (fileio.json_text); TensorBoard
    gets the float itself."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._events = EventWriter(run_dir / "tensorboard") if enabled else None

    def log(self, step: int, **values: Any) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3), **values}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json_text(record) + "\n")
        assert self._events is not None
        numbers = {
            k: float(v)
            for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if numbers:
            self._events.scalars(step, numbers)

    def truncate_after(self, step: int) -> None:
        """Drop records after `step` (a resumed run repeats those steps), and a torn last line;
        the file is rewritten atomically (a crash here keeps the run's history)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [text for _, text, r in _records(self.path) if r["step"] <= step]
        write_text(self.path, "".join(text + "\n" for text in kept))

    def close(self) -> None:
        if self._events is not None:
            self._events.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl, a null (a number that was not finite) read as NaN."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [r for _, _, r in _records(path)]
    return [{k: math.nan if v is None else v for k, v in r.items()} for r in records]


def _records(path: Path) -> list[tuple[int, str, dict[str, Any]]]:
    """(line number, text, record) of each line of a metrics.jsonl. A last line that has no
    line ending and is not a record is what a run killed (or out of disk) mid-append leaves:
    left out, with a warning; any other bad line is one DataError naming file and line."""
    pieces = path.read_bytes().split(b"\n")  # the last piece: b"" when the file ends in "\n"
    out = []
    for lineno, raw in enumerate(pieces, start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8").rstrip("\r")
            out.append((lineno, text, _record(text)))
        except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
            why = "not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
            if lineno < len(pieces):
                raise DataError(f"{path}: line {lineno}: {why}") from None
            warnings.warn(
                f"{path}: line {lineno}: a torn last record ({why}; the run was stopped while "
                "writing it?): left out",
                stacklevel=3,
            )
    return out


def _record(text: str) -> dict[str, Any]:
    """One metrics record, or a ValueError saying what the line is instead."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object but {type(record).__name__}")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError('no integer "step"')
    return record
