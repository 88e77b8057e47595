"""Options of the commands' config dataclasses (PretrainConfig, TaskOptions, FinetuneConfig,
Limits, ...): each field's default, help text and allowed values written once, in the field
(`option`); `check_options` validates them, and the command line derives its options from them.

Their argparse translation lives here too: `add_options` makes the options of a config
dataclass or of a function's keyword parameters, `options_of` reads their values back by name,
and the small types and the parser of the command line's usage errors go with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import operator
import re
from collections.abc import Sequence
from functools import partial
from typing import Any, NoReturn

from .errors import ConfigError, redacted

# Seeds: numpy's default_rng and torch.manual_seed both take any value in [0, 2**32 - 1]; a
# negative or larger one is an error naming the option rather than one from deep inside them.
MAX_SEED = 2**32 - 1


# the help of the inference options every verb that runs a model shares
INFERENCE_HELP = {
    "device": "cpu, cuda, cuda:1 (default: a GPU if there is one)",
    "precision": "auto: bf16 where the device has bf16 arithmetic, else fp32",
}


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
    metavar: str | None = None,
    const: Any = None,
) -> Any:
    """A config field: default, help, allowed values (choices, or a range: min/max inclusive,
    above/below exclusive), its CLI flag when not --field-name, the name --help shows for its
    value (metavar), the value of the flag given alone (const: its value optional). Fields made
    otherwise have no metadata: they are neither checked nor on the command line."""
    meta = dict(help=help, choices=choices, min=min, max=max, above=above, below=below, flag=flag)
    meta |= dict(metavar=metavar, const=const)
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


# ------------------------------------------------------------------------------------------------
# the options on the command line: argparse's translation


def options_of(args: argparse.Namespace, target: Any) -> dict[str, Any]:
    """The values of the options add_options made for `target`, read from args by name (a
    renamed parameter renames its option; nothing is filtered away silently)."""
    return {name: getattr(args, name) for name in getattr(args, _key(target))}


def changed_options(args: argparse.Namespace, target: Any) -> dict[str, Any]:
    """The options of a config dataclass set to other values than its defaults (those left
    alone may come from elsewhere: a fine-tuned model's run.json)."""
    defaults = {f.name: f.default for f in dataclasses.fields(target)}
    return {k: v for k, v in options_of(args, target).items() if v != defaults[k]}


def add_no_progress(p: argparse.ArgumentParser) -> None:
    """--no-progress (args.progress False) on a verb whose progress bar is the command line's,
    not an option of the library function it calls (which is quiet unless asked)."""
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def values_of(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The values of options added by hand (add_argument: their dest is the parameter's name)."""
    return {name: getattr(args, name) for name in names}


_REQUIRED = inspect.Parameter.empty  # a parameter without a default: a required option
_BOOL_ACTIONS = {None: argparse.BooleanOptionalAction, True: "store_false", False: "store_true"}


def parameters(target: Any) -> list[tuple[str, Any, Any, dict[str, Any]]]:
    """(name, default or inspect.Parameter.empty, annotation, field metadata) of each parameter
    of a config dataclass (its fields that are options) or a function (those with a default)."""
    meta = (
        {f.name: dict(f.metadata) for f in dataclasses.fields(target)}
        if dataclasses.is_dataclass(target)
        else {}
    )
    out = []
    for name, param in inspect.signature(target).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name == "self":
            continue
        m = meta.get(name, {})  # empty for a field not made by option
        if (meta and not m) or (not meta and param.default is param.empty):
            continue
        out.append((name, param.default, param.annotation, m))
    return out


def add_options(
    p: argparse._ActionsContainer,
    target: Any,
    *,
    skip: Sequence[str] = (),
    flags: dict[str, str] | None = None,
    help: dict[str, str] | None = None,
    choices: dict[str, Sequence[Any]] | None = None,
) -> None:
    """Options for the parameters of `target`, a config dataclass (its fields: default, type,
    help and choices from options.option) or a function (keyword parameters: default and type
    from its signature; help, and choices from their source lists, given here). The names go
    to args._options_<target>, which options_of reads back."""
    names = []
    params = parameters(target)  # the required ones first: they lead the usage line
    for name, default, annotation, m in sorted(params, key=lambda x: x[1] is not _REQUIRED):
        if name in skip:
            continue
        kind, _ = annotation_kind(annotation)
        required = default is _REQUIRED
        # a flag on by default is turned off: --no-x
        off = "no-" if kind is bool and default is True else ""
        flag = m.get("flag") or (flags or {}).get(name) or f"--{off}{name.replace('_', '-')}"
        text = m.get("help") or (help or {}).get(name)
        if kind is bool:  # a flag; with default None (the model's own): --x / --no-x
            action = _BOOL_ACTIONS[default]
            p.add_argument(flag, dest=name, action=action, default=default, help=text)
        elif "Sequence[int]" in str(annotation):  # "-1,-2,-3" -> (-1, -2, -3)
            p.add_argument(flag, dest=name, type=_int_list, default=default, help=text)
        else:
            allowed = m.get("choices") or (choices or {}).get(name)
            given = {"metavar": m.get("metavar")} if m.get("metavar") else {}
            if m.get("const") is not None:  # --flag alone: const
                given |= {"nargs": "?", "const": m["const"]}
            p.add_argument(
                flag,
                dest=name,
                type=kind,
                default=None if required else default,
                required=required,
                choices=allowed,
                help=text,
                **given,
            )
        names.append(name)
    p.set_defaults(**{_key(target): [*getattr(p, "_defaults", {}).get(_key(target), []), *names]})


def port(text: str) -> int:
    """A TCP port (1-65535), else argparse's usage error."""
    number = int(text) if text.strip().isdigit() else -1
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a TCP port is an integer in 1-65535")
    return number


def _numbers(kind: type, text: str) -> tuple[Any, ...]:
    """ "1,2,3" (or "1;2;3") as a tuple of `kind` (int or float), else argparse's usage error."""
    try:
        values = tuple(kind(x) for x in text.replace(";", ",").split(",") if x.strip())
        if not values:
            raise ValueError
        return values
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise argparse.ArgumentTypeError(f"{text!r}: expected {what} separated by commas") from None


_int_list, float_list = partial(_numbers, int), partial(_numbers, float)


def _key(target: Any) -> str:
    return "_options_" + target.__qualname__.replace(".", "_")


class Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit status 2 (as every error a user can cause),
    redacted: argparse quotes the arguments it refused, a DSN or a key among them."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("bertforge ")
        self.exit(2, f"bertforge: error: {where}: {redacted(message)} (see --help)\n")


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's --help says its default, unless its help text already does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                show_defaults(child)
            continue
        if (
            not action.option_strings
            or any(action.default is v for v in (None, False, argparse.SUPPRESS))
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            or "default" in (action.help or "")
        ):
            continue
        action.help = (
            f"{action.help} (default: %(default)s)" if action.help else "default: %(default)s"
        )


def join_layer_lists(argv: list[str]) -> list[str]:
    """`--layers -1,-2` (or `-1;-2`) as `--layers=-1,-2`: argparse reads "-1,-2" as an option
    (only a plain "-1" looks like a negative number to it)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--layers" and re.match(r"-\d", arg):
            out[-1] = f"--layers={arg}"
        else:
            out.append(arg)
    return out
