"""SQuAD v1.1 and v2.0 question answering files: one `SquadExample` per question.

Why check offsets here: span QA trains on character offsets into the context. An answer
whose `answer_start` does not point at its own text (a file edited by hand, a context
re-normalised after annotation) silently teaches the model a wrong span, so the reader
verifies context[start:start+len(text)] == text for every answer.

Policy (chosen): a mismatch is an error by default (strict=True), naming the file, the
question id and the field "answer_start". strict=False follows google-research/bert's
run_squad.py instead, which skips training questions whose answer it cannot find: bad
answers are dropped, a question left with no answer is skipped, and one warning counts them.

Version: a file is read as v2.0 when any question has an "is_impossible" key (the file's own
"version" field is not trusted: the derived v1.1-format train subset in shared/data says
"v2.0"). v2.0 no-answer questions have is_impossible=True and answers [].

Errors name the JSON path (data[i].paragraphs[j].qas[k]) and the question id, since a
SQuAD file is often a single line.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ...errors import DataError
from ...fileio import read_json
from .table import text_field

T = TypeVar("T")
# how _get's errors name the kinds of value it reads
_KINDS = {str: "a string", int: "an integer", list: "a list", bool: "true/false"}


@dataclass(frozen=True)
class SquadExample:
    """One question about one context; answers are (text, character offset in context)."""

    qid: str
    question: str
    context: str
    answers: list[tuple[str, int]]
    is_impossible: bool
    title: str


def _get(obj: object, key: str, kind: type[T], where: str) -> T:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f'{where}: field "{key}" missing')
    value = obj[key]
    # bool is an int in Python; no SQuAD field is meant to accept both.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise DataError(
            f'{where}: field "{key}": expected {_KINDS[kind]}, got {type(value).__name__}'
        )
    return value


def read_squad(path: str | os.PathLike[str], *, strict: bool = True) -> list[SquadExample]:
    """Questions of a SQuAD JSON file, in file order.

    Read as v2.0 iff a question has "is_impossible". See the module docstring for strict.
    Question ids must be unique (they key predictions).
    """
    path = Path(path)
    root = read_json(path, obj=False)
    articles = _get(root, "data", list, f"{path}: top level")
    v2 = _is_v2(articles)
    out: list[SquadExample] = []
    seen: dict[str, str] = {}
    bad_answers = 0
    dropped: list[str] = []
    for i, article in enumerate(articles):
        where_a = f"{path}: data[{i}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        paragraphs = _get(article, "paragraphs", list, where_a)
        for j, para in enumerate(paragraphs):
            where_p = f"{where_a}.paragraphs[{j}]"
            context = text_field(where_p, "context", _get(para, "context", str, where_p))
            qas = _get(para, "qas", list, where_p)
            for k, qa in enumerate(qas):
                where_q = f"{where_p}.qas[{k}]"
                example, bad = _read_question(qa, where_q, context, str(title), v2, strict, seen)
                bad_answers += bad
                if not example.is_impossible and not example.answers:
                    dropped.append(example.qid)
                    continue
                out.append(example)
    if bad_answers:
        warnings.warn(
            f"{path}: skipped {bad_answers} answers whose answer_start does not point at their "
            f"text, and {len(dropped)} questions left without an answer"
            + (f" (e.g. {', '.join(dropped[:3])})" if dropped else ""),
            stacklevel=2,
        )
    return out


def _is_v2(articles: list[object]) -> bool:
    """Whether any question has "is_impossible" (what makes a file v2.0; see the module
    docstring). Looks past malformed entries: the read that follows names them."""
    return any(
        isinstance(qa, dict) and "is_impossible" in qa
        for a in articles
        if isinstance(a, dict)
        for p in a.get("paragraphs", ()) or ()
        if isinstance(p, dict)
        for qa in p.get("qas", ()) or ()
    )


def _read_question(
    qa: object,
    where_q: str,
    context: str,
    title: str,
    v2: bool,
    strict: bool,
    seen: dict[str, str],
) -> tuple[SquadExample, int]:
    """One question checked, with the answers that point at their text, and how many answers
    strict=False skipped. `seen` (question id -> where it was first read) gains its id."""
    qid = _get(qa, "id", str, where_q)
    where_q = f"{where_q} (id {qid})"
    if qid in seen:
        raise DataError(f'{where_q}: field "id": duplicate, first at {seen[qid]}')
    seen[qid] = where_q
    question = text_field(where_q, "question", _get(qa, "question", str, where_q))
    impossible = False
    if v2:
        impossible = _get(qa, "is_impossible", bool, where_q)
    raw_answers = _get(qa, "answers", list, where_q)
    if impossible and raw_answers:
        raise DataError(
            f'{where_q}: field "answers": is_impossible is true but there are '
            f"{len(raw_answers)} answers (v2.0 keeps them in plausible_answers)"
        )
    if not impossible and not raw_answers:
        raise DataError(
            f'{where_q}: field "answers": empty'
            + (" and is_impossible is false" if v2 else " (a v1.1 file)")
        )
    answers, bad = _checked_answers(raw_answers, where_q, context, strict)
    return SquadExample(qid, question, context, answers, impossible, title), bad


def _checked_answers(
    raw_answers: list[object], where_q: str, context: str, strict: bool
) -> tuple[list[tuple[str, int]], int]:
    """The answers whose answer_start points at their text, and how many did not (an error
    when strict; see the module docstring)."""
    answers: list[tuple[str, int]] = []
    bad = 0
    for n, ans in enumerate(raw_answers):
        where_n = f"{where_q}: answers[{n}]"
        text = _get(ans, "text", str, where_n)
        start = _get(ans, "answer_start", int, where_n)
        if not text.strip():
            raise DataError(f'{where_n}: field "text": empty answer text')
        if start >= 0 and context[start : start + len(text)] == text:
            answers.append((text, start))
            continue
        if strict:
            found = context[start : start + len(text)] if start >= 0 else ""
            hint = "" if text not in context else f"; the text occurs at {context.find(text)}"
            raise DataError(
                f'{where_n}: field "answer_start": {start} does not point at the '
                f"answer {text!r} (the context there reads {found!r}{hint}); "
                "strict=False skips such answers"
            )
        bad += 1
    return answers, bad


def gold_answers(examples: Iterable[SquadExample]) -> dict[str, list[str]]:
    """qid -> gold answer texts ([] for a v2.0 no-answer question), for evaluate.squad_*."""
    return {e.qid: [text for text, _ in e.answers] for e in examples}
