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
from pathlib import Path
from typing import Any

from ..fileio import json_text

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
        """Drop records after `step` (a resumed run repeats those steps)."""
        if not self.enabled or not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= step]
        self.path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")

    def close(self) -> None:
        if self._events is not None:
            self._events.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl, a null (a number that was not finite) read as NaN."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return [{k: math.nan if v is None else v for k, v in r.items()} for r in records]
