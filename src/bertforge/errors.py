"""Errors a user can cause, each carrying one clear message.

Everything here derives from `BertforgeError`; the CLI prints such an error as one line and
exits with status 2 instead of showing a stack trace. Messages name the file, line and field
(or tensor) at fault, so the user can fix the input without reading our code.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any


class BertforgeError(Exception):
    """Base class for errors caused by user input (files, arguments, checkpoints)."""


class ConfigError(BertforgeError, ValueError):
    """A configuration value is out of range or of the wrong type."""


class CheckpointError(BertforgeError):
    """A checkpoint directory or file is missing, corrupt, or does not fit the model."""


class VocabError(BertforgeError):
    """A vocabulary file is missing, malformed, or does not fit the model."""


class InputError(BertforgeError, ValueError):
    """Text or arguments given to a function do not fit (e.g. too long with truncation off)."""


class ItemError(InputError):
    """One input of a list does not fit, named by its place in the list ("text 4: no [MASK]
    token ..."). A caller that passed a part of its own list (the server runs a request in
    slices, each its own model call) names the input by its place in the whole: `shifted`."""

    def __init__(self, noun: str, index: int, reason: str) -> None:
        super().__init__(noun, index, reason)  # the args pickling makes it again from
        self.noun, self.index, self.reason = noun, index, reason

    def __str__(self) -> str:
        return f"{self.noun} {self.index}: {self.reason}"

    def shifted(self, offset: int) -> ItemError:
        """The same error, the input `offset` places further on."""
        return type(self)(self.noun, self.index + offset, self.reason)


class DataError(BertforgeError):
    """A data file is malformed: the message names the file, line and field."""


class UnavailableError(BertforgeError):
    """A service a command needs (a database) cannot be reached, or failed or timed out: the
    message names it (never its password) and what it said; retrying may succeed."""


class TrainingError(BertforgeError):
    """Training cannot go on: its loss or gradient norm stopped being finite (it diverged)."""


def check_choice(name: str, value: Any, choices: Sequence[str], flag: str = "") -> None:
    """A ConfigError unless value is one of choices: "name='value' (flag): must be one of ..."."""
    if value not in choices:
        where = f"{name}={value!r}" + (f" ({flag})" if flag else "")
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}")


def need_extra(module: str, message: str, error: type[Exception] = ConfigError) -> Any:
    """`module` of an optional extra, imported; without it, `error(message)`: what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise error(message) from None


class CheckpointWarning(UserWarning):
    """Something in a checkpoint was ignored or freshly initialised."""


class FreshWeightsWarning(CheckpointWarning):
    """Tensors the model has but the checkpoint lacks (a new task head): `names` lists them."""

    def __init__(self, message: str, names: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.names = list(names)
