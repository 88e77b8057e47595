"""Task files the tests write themselves: a sentence table a pre-trained encoder learns at once,
CoNLL columns of names and cities, a small SQuAD file, SWAG's header."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GOOD = ["good", "great", "fine", "lovely", "superb", "nice"]


BAD = ["bad", "awful", "poor", "dull", "terrible", "nasty"]


FILLER = [
    "the",
    "film",
    "was",
    "a",
    "story",
    "of",
    "people",
    "and",
    "places",
    "with",
    "music",
    "in",
    "it",
]


def keyword_table(path: Path, n: int, seed: int, header: str = "sentence\tlabel") -> Path:
    """A sentence task that a pre-trained encoder learns at once: the label is the word's tone."""
    rng = np.random.default_rng(seed)
    rows = [header]
    for _ in range(n):
        label = int(rng.integers(0, 2))
        words = list(rng.choice(FILLER, int(rng.integers(3, 12))))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(GOOD if label else BAD)))
        rows.append(f"{' '.join(words)}\t{label}")
    path.write_text("\n".join(rows) + "\n")
    return path


def conll_text(sentences: list[list[tuple[str, str]]]) -> str:
    lines = ["-DOCSTART- -X- -X- O", ""]
    for s in sentences:
        lines += [f"{w} NN O {t}" for w, t in s] + [""]
    return "\n".join(lines) + "\n"


NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Esther", "Farouk", "Gwendolyn", "Hiroshi"]


CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Quebec", "Tbilisi", "Adelaide", "Bergen"]


def ner_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        name, city = str(rng.choice(NAMES)), str(rng.choice(CITIES))
        s = [(name, "B-PER")]
        if rng.random() < 0.5:
            s.append(("Smithson", "I-PER"))
        s += [("went", "O"), ("to", "O"), (city, "B-LOC"), ("on", "O"), ("Monday", "O")]
        out.append(s)
    return out


def squad_file(path: Path, version_2: bool) -> Path:
    contexts = [
        (
            "The cat sat on the red mat near the door.",
            [("What color was the mat?", "red"), ("Where did the cat sit?", "on the red mat")],
        ),
        ("Paris is the capital of France and lies on the Seine.", [("What river?", "Seine")]),
    ]
    paragraphs = []
    n = 0
    for context, qas in contexts:
        items = []
        for q, a in qas:
            items.append(
                {
                    "id": f"q{n}",
                    "question": q,
                    "answers": [{"text": a, "answer_start": context.index(a)}],
                }
            )
            if version_2:
                items[-1]["is_impossible"] = False
            n += 1
        if version_2:
            items.append(
                {"id": f"q{n}", "question": "Who won?", "answers": [], "is_impossible": True}
            )
            n += 1
        paragraphs.append({"context": context, "qas": items})
    path.write_text(
        json.dumps({"version": "x", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    return path


SWAG_HEADER = (
    "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
)
