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


# A small retrieval set in BEIR's layout: graded judgements (2 and 1, a tie of two 2s), a
# judgement of 0 (not relevant), a title to prepend and one left empty, a query not judged.
BEIR_DOCS = [
    ("d0", "Eiffel Tower", "The Eiffel Tower stands in Paris, the capital of France."),
    ("d1", None, "Cats are carnivores and eat meat such as fish and mice."),
    ("d2", "Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    ("d3", "", "The stock market fell sharply on Monday."),
    ("d4", None, "Paris lies on the Seine and is the capital of France."),
    ("d5", None, "The Great Wall of China stretches for thousands of kilometres."),
]
BEIR_QUERIES = [
    ("q1", "who wrote hamlet"),
    ("q2", "where is the eiffel tower"),
    ("q3", "what do cats eat"),
    ("q4", "great wall length"),
    ("q5", "an unjudged question"),
]
BEIR_QRELS = {
    "test": [
        ("q1", "d2", 2),
        ("q1", "d1", 1),
        ("q2", "d0", 2),
        ("q2", "d4", 2),
        ("q2", "d1", 0),
        ("q4", "d0", 1),
        ("q4", "d5", 0),
    ],
    "train": [("q3", "d1", 1), ("q2", "d0", 0), ("q1", "d2", 1)],
}


def beir_files(root: Path) -> Path:
    """BEIR_DOCS, BEIR_QUERIES and BEIR_QRELS written in BEIR's layout in `root`."""
    (root / "qrels").mkdir(parents=True)
    docs = [{"_id": i, **({} if t is None else {"title": t}), "text": x} for i, t, x in BEIR_DOCS]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [{"_id": i, "text": t} for i, t in BEIR_QUERIES]
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in BEIR_QRELS.items():
        body = "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + body)
    return root
