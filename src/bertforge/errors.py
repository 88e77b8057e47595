"""Errors a user can cause, each carrying one clear message.

Everything here derives from `BertforgeError`; the CLI prints such an error as one line and
exits with status 2 instead of showing a stack trace. Messages name the file, line and field
(or tensor) at fault, so the user can fix the input without reading our code.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote


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


# -- secrets: what no message, log line or answer shows -----------------------------------------

# scheme://user:PASSWORD@host: any scheme's case (POSTGRESQL, postgresql+psycopg), the // a path
# makes / of (a DSN given where a file was expected), a password with spaces or @ in it (libpq
# reads up to the last @ before the host), at most 200 characters
_URI_PASSWORD = re.compile(
    r"([A-Za-z][\w+.-]*:/+[^:/?#@\s]*:)([^/?#]{0,200}?)@(?=[^@/?#\s]*(?:[/?#\s'\"),]|$))"
)
# password=VALUE, VALUE quoted or with backslash-escaped spaces (libpq's key=value words)
_KEY_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:\\.|[^\s&\\])+)", re.IGNORECASE)
_HIDDEN: set[str] = set()  # hide()'s values: process-wide, as the secrets they stand for


def hide(*values: str | None) -> None:
    """Values that no message may show from now on (a password from the environment, the
    server's API key): redacted() puts *** in their place. Kept for the process: a secret
    seen once can turn up in any later message (a driver's, a usage error's)."""
    _HIDDEN.update(v for v in values if v)


def hide_passwords(dsn: str) -> None:
    """hide() the passwords of a DSN (URI user:PASSWORD@, key=value password=...), as written
    and percent-decoded: the forms a server or a driver may quote back."""
    found = [m.group(2) for m in _URI_PASSWORD.finditer(dsn)]
    found += [m.group(2).removeprefix("'").removesuffix("'") for m in _KEY_PASSWORD.finditer(dsn)]
    found += [f.replace("\\ ", " ") for f in found]  # libpq's reading of an escaped space
    # a driver may quote a part of one with an @ ("Zq9@w0rd": host "w0rd@127.0.0.1"): its
    # pieces too, if long enough not to hide common words from every later message
    pieces = [p for f in found if "@" in f for p in f.split("@") if len(p) >= 4]
    hide(*found, *(unquote(f) for f in found), *pieces)


def redacted(text: str) -> str:
    """`text` as a message, log line or answer may show it: every value hide() was given, and
    any DSN's password (URI or key=value, a DSN's form even where nothing hid it), as ***.
    The one redaction: the CLI applies it to every error, warning and usage message, the
    server to every error answer and log line, the PostgreSQL backend to what it quotes."""
    for secret in sorted(_HIDDEN, key=len, reverse=True):  # longest first: none left in part
        text = text.replace(secret, "***")
    shown = _URI_PASSWORD.sub(lambda m: m.group(1) + ("***" if m.group(2) else "") + "@", text)
    return _KEY_PASSWORD.sub(_key_password, shown)


def _key_password(m: re.Match[str]) -> str:
    """password=VALUE as password=***; a VALUE redacted already keeps what follows its ***
    (a message redacted twice: "password=***: the database..." keeps its colon)."""
    value = m.group(2)
    return m.group(1) + "***" + (value[3:] if value.startswith("***") else "")


class CheckpointWarning(UserWarning):
    """Something in a checkpoint was ignored or freshly initialised."""


class FreshWeightsWarning(CheckpointWarning):
    """Tensors the model has but the checkpoint lacks (a new task head): `names` lists them."""

    def __init__(self, message: str, names: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.names = list(names)
