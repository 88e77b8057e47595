"""The input lines of the pipeline verbs and `search`, read and answered as library calls: one
input per line (text, TSV or JSONL), each answering row carrying its line (and JSONL id)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.catalogue import ENTRIES, PAIRS, TEXTS
from bertforge.errors import DataError
from bertforge.inputs import InputLine, columns, read_inputs, write_jsonl, write_results


def test_text_pairs_and_jsonl_lines_keep_their_line_numbers_and_ids(tmp_path: Path) -> None:
    tsv = tmp_path / "pairs.txt"
    tsv.write_text("a question\tits passage\n\nb\tc\n")
    rows = read_inputs(str(tsv), PAIRS, skip_blank=True)
    assert rows == [
        InputLine(1, None, ("a question", "its passage")),
        InputLine(3, None, ("b", "c")),
    ]
    assert columns(rows, PAIRS) == {"texts": ["a question", "b"], "pairs": ["its passage", "c"]}
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text('{"text": "x", "id": 7}\n{"text": "y"}\n')
    assert read_inputs(str(jsonl), TEXTS) == [InputLine(1, 7, ("x",)), InputLine(2, None, ("y",))]


@pytest.mark.parametrize(
    ("name", "text", "options", "message"),
    [
        ("t.txt", "a\n\nb\n", {}, "t.txt: line 2: blank line: remove it, or pass --skip-blank"),
        ("t.txt", "a\tb\n", {}, "expected 1 (text) (TEXT<TAB>PAIR: --pairs; a tab inside"),
        ("t.jsonl", "{nope\n", {}, "t.jsonl: line 1: invalid JSON: Expecting property name"),
        ("t.jsonl", "[1]\n", {}, "t.jsonl: line 1: expected a JSON object, got list"),
        ("t.jsonl", '{"text": 3}\n', {}, 't.jsonl: line 1: field "text": missing or not text'),
    ],
)
def test_a_line_that_is_not_one_input_is_one_error_naming_it(
    tmp_path: Path, name: str, text: str, options: dict, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError) as e:
        read_inputs(str(path), TEXTS, unasked=ENTRIES["classify"].inputs[1:], **options)
    assert message in str(e.value)


def test_blank_lines_skipped_and_tabs_kept_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("a\tb\n\nc\n")
    rows = read_inputs(str(path), TEXTS, skip_blank=True, keep_tabs=True)
    assert rows == [InputLine(1, None, ("a\tb",)), InputLine(3, None, ("c",))]


def test_rows_answer_lines_in_jsonl_or_the_entrys_array_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    rows = [InputLine(1, "q1", ("a",)), InputLine(3, None, ("b",))]
    out = tmp_path / "rows.jsonl"
    write_jsonl(str(out), rows, [{"x": 1}, {"x": 2}])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"line": 1, "id": "q1", "x": 1}, {"line": 3, "x": 2}]
    assert f"wrote 2 lines to {out}" in capsys.readouterr().err
    write_jsonl(None, rows[:1], [{"x": 1}])
    assert json.loads(capsys.readouterr().out) == {"line": 1, "id": "q1", "x": 1}
    vectors = np.eye(2, dtype=np.float32)
    npy = tmp_path / "v.npy"
    write_results(ENTRIES["embed"], str(npy), rows, columns(rows, TEXTS), vectors)
    np.testing.assert_array_equal(np.load(npy), vectors)
    assert "its rows are input lines 1, 3 (blank lines skipped)" in capsys.readouterr().err


def test_a_jsonl_pair_without_its_flag_is_refused_and_the_suffix_is_read_in_any_case(
    tmp_path: Path,
) -> None:
    """A JSONL line with the field of an input not asked for (classify's text_pair without
    --pairs) is an error naming the line and the flag, as a tab in a text line is: read as one
    text it would be classified without its pair. `.JSONL` is JSONL too."""
    text, pair = ENTRIES["classify"].inputs
    path = tmp_path / "t.JSONL"
    path.write_text('{"text": "a", "id": 4}\n{"text": "b", "text_pair": "c"}\n')
    with pytest.raises(DataError) as e:
        read_inputs(str(path), (text,), unasked=(pair,))
    assert f'{path}: line 2: field "text_pair" is read with --pairs' in str(e.value)
    path.write_text('{"text": "a", "id": 4}\n')
    assert read_inputs(str(path), (text,), unasked=(pair,)) == [InputLine(1, 4, ("a",))]


def test_jsonl_rows_are_written_as_they_come_and_atomically(tmp_path: Path) -> None:
    """Rows go to the file one by one (a features file can be gigabytes: the whole text is never
    held), through a temporary file renamed at the end: a failure midway leaves the previous
    file whole and no temporary file behind."""
    import tracemalloc

    rows = [InputLine(i + 1, None, ("x",)) for i in range(2000)]
    out = tmp_path / "big.jsonl"
    tracemalloc.start()
    try:
        write_jsonl(str(out), rows, ({"text": "y" * 1000} for _ in rows))  # 2 MB written
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    lines = out.read_text().splitlines()
    assert len(lines) == 2000 and json.loads(lines[-1]) == {"line": 2000, "text": "y" * 1000}
    assert out.stat().st_size > 2_000_000 and peak < 500_000, peak

    def failing() -> Any:
        yield {"x": 1}
        raise RuntimeError("the pipeline failed")

    before = out.read_bytes()
    with pytest.raises(RuntimeError):
        write_jsonl(str(out), rows, failing())
    assert out.read_bytes() == before and sorted(tmp_path.iterdir()) == [out]


def test_pipeline_rows_are_written_part_by_part_with_progress_on_stderr(
    tmp_path: Path,
    tiny_model: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A verb's JSONL rows come a part of the input lines at a time, each part's rows on stdout
    (flushed) before the next part is run; stderr shows how far it is (off a terminal, a line
    every LINE_SECONDS: here always) and nothing of it reaches stdout. The rows are those of one
    call over every line; int8 rows, whose buckets come from every vector, are written whole."""
    from bertforge import inputs, runner
    from bertforge.cli import main
    from bertforge.pipelines import Pipeline

    monkeypatch.setattr(runner, "LINE_SECONDS", 0.0)
    monkeypatch.setattr(inputs, "LINES_AT_ONCE", 2)
    texts = [f"text number {i} " * (i + 1) for i in range(5)]
    path = tmp_path / "t.txt"
    path.write_text("\n".join(texts) + "\n")
    written: list[int] = []  # stdout's rows so far, at each call of the pipeline
    out: list[str] = []
    embed = Pipeline.embed

    def counting(self: Pipeline, *args: Any, **kwargs: Any) -> Any:
        out.extend(capsys.readouterr().out.splitlines())
        written.append(len(out))
        return embed(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "embed", counting)
    base = ["embed", str(tiny_model), str(path), "--precision", "fp32"]
    assert main(base) == 0
    got = capsys.readouterr()
    out.extend(got.out.splitlines())
    assert written == [0, 2, 4] and [json.loads(r)["line"] for r in out] == [1, 2, 3, 4, 5]
    whole = embed(Pipeline(tiny_model, precision="fp32"), texts)
    np.testing.assert_allclose([json.loads(r)["embedding"] for r in out], whole, atol=1e-5)
    lines = got.err.splitlines()
    assert lines and all(line.startswith("embed: ") for line in lines), lines
    chars = sum(map(len, texts))
    assert lines[-1].startswith(f"embed: {chars}/{chars} characters (100%)"), lines

    written.clear()
    out.clear()
    int8 = [*base, "--embedding-precision", "int8", "--no-progress"]
    assert main(int8) == 0
    got = capsys.readouterr()
    assert written == [0, 0, 0] and got.err == ""  # no row before the last part: buckets
    assert main([*int8, "--out", str(tmp_path / "e.npy")]) == 0  # from every vector
    rows = [json.loads(r)["embedding"] for r in got.out.splitlines()]
    np.testing.assert_array_equal(rows, np.load(tmp_path / "e.npy"))
    # no lines: still one (empty) part, so a bad option is refused as for any input
    monkeypatch.setattr(Pipeline, "embed", embed)  # its options are read from its signature
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["embed", str(tiny_model), str(empty), "--dimensions", "1000"]) == 2
    assert "dimensions" in capsys.readouterr().err
    # and its array file: no rows of the vectors' width, not a shapeless (0,) (np.load(...) @ q
    # fails on it), at any --dimensions or precision
    width = Pipeline(tiny_model, precision="fp32").embed(["x"]).shape[1]
    for extra, shape, dtype in (
        ([], (0, width), np.float32),
        (["--dimensions", "8"], (0, 8), np.float32),
        (["--embedding-precision", "int8"], (0, width), np.int8),
    ):
        assert (
            main(["embed", str(tiny_model), str(empty), "--out", str(tmp_path / "0.npy"), *extra])
            == 0
        )
        got = np.load(tmp_path / "0.npy")
        assert (got.shape, got.dtype) == (shape, dtype), extra


def test_pieces_of_a_file_read_apart_are_the_file_read_whole(tmp_path: Path) -> None:
    """embed --ray's workers each read one piece (fileio.line_spans): together the rows of the
    whole file, with its line numbers (a BOM, multi-byte text, no final newline); an error in
    a piece names the file's own line."""
    import hashlib

    from bertforge.fileio import line_spans

    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffé one\nzwei ü\n\ndrei\nvier €\nfünf".encode())
    shas: list[str] = []
    spans = line_spans(path, 2, shas)
    raw = path.read_bytes()
    ends = [s[0] for s in spans[1:]] + [len(raw)]
    assert shas == [hashlib.sha256(raw[s[0] : e]).hexdigest() for s, e in zip(spans, ends)]
    assert [s[1:] for s in spans] == [(1, 2), (3, 2), (5, 2)]
    pieces = [read_inputs(str(path), TEXTS, skip_blank=True, span=s) for s in spans]
    assert [r for p in pieces for r in p] == read_inputs(str(path), TEXTS, skip_blank=True)
    assert pieces[0][0] == InputLine(1, None, ("é one",)) and pieces[2][1].texts == ("fünf",)
    with pytest.raises(DataError, match=r"t.txt: line 3: blank line"):
        read_inputs(str(path), TEXTS, span=spans[1])
