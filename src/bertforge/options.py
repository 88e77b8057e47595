"""Options of the commands' config dataclasses (PretrainConfig, TaskOptions, FinetuneConfig,
Limits, ...): each field's default, help text and allowed values written once, in the field
(`option`); `check_options` validates them, and the command line derives its options from them.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

from .errors import ConfigError

# Seeds: numpy's default_rng and torch.manual_seed both take any value in [0, 2**32 - 1]; a
# negative or larger one is an error naming the option rather than one from deep inside them.
MAX_SEED = 2**32 - 1


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices: Any = None,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    flag: str | None = None,
) -> Any:
    """A config field: default, help, allowed values (choices, or a range: min/max inclusive,
    above/below exclusive), its CLI flag when not --field-name. Fields made otherwise have no
    metadata: they are neither checked nor on the command line."""
    meta = dict(help=help, choices=choices, min=min, max=max, above=above, below=below, flag=flag)
    return dataclasses.field(default=default, metadata=meta)


def annotation_kind(annotation: Any) -> tuple[type, bool]:
    """(int, float, bool or str; whether None is allowed) of a type annotation (a string here)."""
    names = [t.strip() for t in str(annotation).replace("'", "").split("|")]
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    return next((kinds[n] for n in names if n in kinds), str), "None" in names


def check_options(obj: Any) -> None:
    """Type, range and choices of every field of a config dataclass that has them; the message
    names the field, its CLI flag and the rule."""
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        if not meta:
            continue
        kind, optional = annotation_kind(f.type)
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        where = f"{f.name}={value!r} ({flag})"
        if value is None:
            if not optional:
                raise ConfigError(f"{where}: a value is required")
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            setattr(obj, f.name, value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: must be {kind.__name__}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{where}: must be a finite number")
        if meta["choices"] is not None and value not in meta["choices"]:
            raise ConfigError(f"{where}: must be one of {', '.join(map(str, meta['choices']))}")
        bounds = [(meta[k], op, fn) for k, op, fn in _BOUNDS if meta[k] is not None]
        if not all(fn(value, b) for b, _, fn in bounds):
            raise ConfigError(
                f"{where}: must be "
                + " and ".join(
                    f"{op} {b:g}" if isinstance(b, float) else f"{op} {b}" for b, op, _ in bounds
                )
            )


_BOUNDS = (
    ("min", ">=", operator.ge),
    ("max", "<=", operator.le),
    ("above", ">", operator.gt),
    ("below", "<", operator.lt),
)
