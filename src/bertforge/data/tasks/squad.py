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
"v2.0"). v2.0 no-answer questions have is_impossible=True and answers []. A v1.1 task can
refuse them (no_answer=False): trained on, they teach the [CLS] "no answer" that its decoding
never reads, and its metric cannot score an empty gold answer.

Unlabelled (labelled=False, what `predict` reads): ids, questions and contexts only; the
answers are neither read nor checked, so every question is kept and answered.

Errors name the JSON path (data[i].paragraphs[j].qas[k]) and the question id, since a
SQuAD file is often a single line.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
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


def read_squad(
    path: str | os.PathLike[str],
    *,
    strict: bool = True,
    labelled: bool = True,
    no_answer: bool = True,
) -> list[SquadExample]:
    """Questions of a SQuAD JSON file, in file order.

    Read as v2.0 iff a question has "is_impossible". See the module docstring for strict.
    Question ids must be unique (they key predictions). labelled=False reads no answers (nor
    "is_impossible"): every question is kept, with answers [] (the input of `predict`).
    no_answer=False refuses a v2.0 no-answer question, naming it (a v1.1 task can neither
    learn nor score "no answer").
    """
    path = Path(path)
    root = read_json(path, obj=False)
    articles = _get(root, "data", list, f"{path}: top level")
    reader = _Questions(labelled and _is_v2(articles), strict, labelled, no_answer)
    out: list[SquadExample] = []
    for i, article in enumerate(articles):
        where_a = f"{path}: data[{i}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        paragraphs = _get(article, "paragraphs", list, where_a)
        for j, para in enumerate(paragraphs):
            where_p = f"{where_a}.paragraphs[{j}]"
            context = text_field(where_p, "context", _get(para, "context", str, where_p))
            qas = _get(para, "qas", list, where_p)
            for k, qa in enumerate(qas):
                example = reader.question(qa, f"{where_p}.qas[{k}]", context, str(title))
                if example is not None:
                    out.append(example)
    if reader.bad_answers:
        dropped = reader.dropped
        warnings.warn(
            f"{path}: skipped {reader.bad_answers} answers whose answer_start does not point at "
            f"their text, and {len(dropped)} questions left without an answer"
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


@dataclass
class _Questions:
    """How read_squad reads each question (see its arguments), what strict=False skipped, and
    the question ids seen so far (id -> where it was first read)."""

    v2: bool
    strict: bool
    labelled: bool
    no_answer: bool
    seen: dict[str, str] = field(default_factory=dict)
    bad_answers: int = 0
    dropped: list[str] = field(default_factory=list)  # ids strict=False left without an answer

    def question(self, qa: object, where_q: str, context: str, title: str) -> SquadExample | None:
        """One question checked, with the answers that point at their text; None when
        strict=False skipped all its answers."""
        qid = _get(qa, "id", str, where_q)
        where_q = f"{where_q} (id {qid})"
        if qid in self.seen:
            raise DataError(f'{where_q}: field "id": duplicate, first at {self.seen[qid]}')
        self.seen[qid] = where_q
        question = text_field(where_q, "question", _get(qa, "question", str, where_q))
        if not self.labelled:
            return SquadExample(qid, question, context, [], False, title)
        impossible = self.v2 and _get(qa, "is_impossible", bool, where_q)
        if impossible and not self.no_answer:
            raise DataError(
                f'{where_q}: field "is_impossible": a SQuAD v2.0 question without an answer, '
                "which a v1.1 task can neither learn nor score: read the file as v2.0 "
                "(--task squad2)"
            )
        raw_answers = _get(qa, "answers", list, where_q)
        if impossible and raw_answers:
            raise DataError(
                f'{where_q}: field "answers": is_impossible is true but there are '
                f"{len(raw_answers)} answers (v2.0 keeps them in plausible_answers)"
            )
        if not impossible and not raw_answers:
            raise DataError(
                f'{where_q}: field "answers": empty'
                + (" and is_impossible is false" if self.v2 else " (a v1.1 file)")
            )
        answers, bad = _checked_answers(raw_answers, where_q, context, self.strict)
        self.bad_answers += bad
        if not impossible and not answers:
            self.dropped.append(qid)
            return None
        return SquadExample(qid, question, context, answers, impossible, title)


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
