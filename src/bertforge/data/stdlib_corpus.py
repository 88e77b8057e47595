"""A small English corpus that exists on every machine with Python: the stdlib's docstrings.

Used by `bertforge demo` and by tests that need real prose without a download. Docstrings are
read by parsing source files (`ast`), never by importing modules. Each docstring becomes one
document: its paragraphs, with code examples, doctest lines and reST markup dropped.
"""

from __future__ import annotations

import ast
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

_MARKUP = re.compile(r":\w+:`([^`]*)`|``([^`]*)``|`([^`]*)`")
_WORDS = re.compile(r"[A-Za-z]")


def _clean(paragraph: str) -> str | None:
    lines = [ln.strip() for ln in paragraph.strip().splitlines()]
    if not lines or any(ln.startswith((">>>", "...", "$", "#")) for ln in lines):
        return None
    text = " ".join(lines)
    text = _MARKUP.sub(lambda m: next(g for g in m.groups() if g is not None), text)
    words = text.split()
    # Prose, not signatures or tables: enough words, mostly alphabetic, ends like a sentence.
    if len(words) < 6 or not text.endswith((".", "!", "?")):
        return None
    if sum(1 for w in words if _WORDS.search(w)) < 0.8 * len(words):
        return None
    return text


def stdlib_documents(limit_files: int | None = None) -> Iterator[list[str]]:
    """Documents (lists of prose paragraphs) from the docstrings of the stdlib's .py files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
    )
    for path in files[:limit_files]:
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                paragraphs = [p for p in (_clean(x) for x in doc.split("\n\n")) if p]
                if paragraphs:
                    yield paragraphs
