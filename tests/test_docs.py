"""Docs that cannot drift from the code: README.md and every page of docs/ are read here.

- every `bertforge ...` command line in a bash block parses with the real command-line parser
  (its verb and every option), and a planted wrong option is caught;
- every python block runs (a fresh namespace, an empty working directory), unless its first line
  says what the reader must have (`# needs ...`);
- every HTTP example (a `curl` line) names a route the server has, with its method, and a body
  its request schema accepts;
- the site builds in MkDocs' strict mode (a broken link, anchor or API reference fails it).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bertforge.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)```\s*([\w-]*)")


def blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, code) of each fenced block of a Markdown file."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        start = FENCE.match(lines[i])
        if not start:
            i += 1
            continue
        indent, language, body, first = len(start.group(1)), start.group(2), [], i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            line = lines[i]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            i += 1
        out.append((language, first, "\n".join(body)))
        i += 1
    return out


def shell_lines(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    out, current = [], ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if not current and line.lstrip().startswith("#"):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                out.append(current.strip())
            current = ""
    return out


def bertforge_argv(command: str) -> list[str] | None:
    """The arguments after `bertforge` (or `-m bertforge`) of one shell command, cut at the
    first pipe, redirection or `&&`; None if the command is not bertforge's."""
    words = shlex.split(command, comments=True)
    for stop in ("|", "||", "&&", ";", ">", ">>", "2>&1", "<"):
        if stop in words:
            words = words[: words.index(stop)]
    for k, word in enumerate(words):
        if word == "bertforge" and (k == 0 or words[k - 1] == "-m"):
            return words[k + 1 :]
    return None


def commands() -> list[tuple[str, str]]:
    """(where, command) of every bertforge command line of the docs."""
    out = []
    for page in PAGES:
        for language, line, code in blocks(page):
            if language in ("bash", "sh", "shell", "console"):
                for command in shell_lines(code):
                    if bertforge_argv(command) is not None:
                        out.append((f"{page.name}:{line}", command))
    return out


def parse_error(argv: list[str]) -> str | None:
    """What the real parser says of argv (None: accepted)."""
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        return f"exit {e.code}"
    return None


def test_the_docs_have_commands_pages_and_blocks() -> None:
    names = {p.name for p in PAGES}
    expected = {"pretraining.md", "finetuning.md", "distillation.md", "pipelines.md"}
    expected |= {"search.md", "serving.md", "export.md", "compatibility.md", "architecture.md"}
    assert expected <= names, expected - names
    assert len(commands()) > 30


@pytest.mark.parametrize("where,command", commands(), ids=lambda v: v if ":" in v else "")
def test_every_command_line_parses(
    where: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = bertforge_argv(command)
    assert argv is not None
    if argv and argv[0] in ("-h", "--help", "--version"):
        return
    error = parse_error(argv)
    assert error is None, f"{where}: {command}\n{capsys.readouterr().err}"


def test_a_planted_wrong_option_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """The check above can fail: a documented command with one option misspelt is refused."""
    where, argv = next(
        (w, a)
        for w, c in commands()
        if " --" in c and parse_error(a := bertforge_argv(c) or []) is None
    )
    first = next(i for i, a in enumerate(argv) if a.startswith("--"))
    planted = [*argv[:first], argv[first] + "-typo", *argv[first + 1 :]]
    assert parse_error(planted) is not None, where  # a misspelt option
    capsys.readouterr()
    assert parse_error([*argv, "--no-such-option"]) is not None  # one the verb does not have
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    assert parse_error(["no-such-verb"]) is not None


def python_blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for language, line, code in blocks(page):
            if language in ("python", "py") and not code.lstrip().startswith("# needs "):
                out.append((f"{page.name}:{line}", code))
    return out


@pytest.mark.parametrize("where,code", python_blocks(), ids=lambda v: v if ":" in v else "")
def test_python_examples_run(
    where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


@functools.cache
def routes() -> dict[tuple[str, str], Any]:
    """(method, path) -> the request body's model (None: no body) of every route the server
    can have: the pipelines of the catalogue, the embedding and rerank APIs, search, status."""
    from bertforge.catalogue import ENTRIES
    from bertforge.serve import schemas
    from bertforge.serve.routes import RERANK_PATHS

    table: dict[tuple[str, str], Any] = {
        ("POST", f"/{e.name}"): schemas.request_model(e) for e in ENTRIES.values()
    }
    table[("POST", "/embed")] = schemas.EmbedRequest
    table[("POST", "/v1/embeddings")] = schemas.OpenAIEmbeddingRequest
    tei, v1, v2 = RERANK_PATHS
    table[("POST", tei)] = schemas.RerankRequest
    table[("POST", v1)] = schemas.CohereRerankRequest
    table[("POST", v2)] = schemas.CohereV2RerankRequest
    table[("POST", "/search")] = schemas.SearchRequest
    for path in ("/health", "/ready", "/metadata", "/metrics", "/openapi.json"):
        table[("GET", path)] = None
    return table


def http_examples() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for language, line, code in blocks(page):
            if language in ("bash", "sh", "shell"):
                out += [
                    (f"{page.name}:{line}", c) for c in shell_lines(code) if c.startswith("curl ")
                ]
    return out


def request_of(command: str) -> tuple[str, str, Any]:
    """(method, path, JSON body or None) of a curl command line."""
    words = shlex.split(command, comments=True)
    url = next(w for w in words if re.match(r"(https?://)?[\w.-]+:\d+/", w))
    path = "/" + url.split("://")[-1].split("/", 1)[1].split("?")[0]
    body = None
    for flag in ("-d", "--data", "--data-raw"):
        if flag in words:
            body = json.loads(words[words.index(flag) + 1])
    method = words[words.index("-X") + 1] if "-X" in words else ("POST" if body else "GET")
    return method, path, body


@pytest.mark.parametrize("where,command", http_examples(), ids=lambda v: v if ":" in v else "")
def test_http_examples_name_real_routes_and_bodies(where: str, command: str) -> None:
    method, path, body = request_of(command)
    table = routes()
    assert (method, path) in table, f"{where}: {method} {path} is not a route of the server"
    model = table[(method, path)]
    if model is not None:
        assert body is not None, f"{where}: {method} {path} needs a JSON body"
        model.model_validate(body)


def test_the_route_table_covers_a_real_server(minilm_dir: Path) -> None:
    """The table the examples are checked against holds every route of a served model."""
    from bertforge.serve import create_app

    app = create_app(minilm_dir)
    table = routes()
    served = {(m, r.path) for r in app.routes for m in getattr(r, "methods", ()) if m != "HEAD"}
    assert served and served <= set(table), served - set(table)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs build --strict: every page, link, anchor and API reference resolves."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_readme_links_lead_somewhere_and_it_stays_a_front_page() -> None:
    """Every relative link of README.md names a file of the repository; README stays under
    300 lines (the rest lives in docs/ and benchmarks/results/)."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local and all((ROOT / link).exists() for link in local), [
        link for link in local if not (ROOT / link).exists()
    ]
    assert len(text.splitlines()) < 300


def test_links_into_the_results_work_on_github_and_on_the_site() -> None:
    """A page's link to a results file (benchmarks/results/, a page of the site under results/
    by docs/hooks.py) is written as the repository's path, which GitHub follows; the hook
    makes it the site's. A link written as results/... worked on the built site alone."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    site_only, linked = [], []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if target.startswith("results/"):
                site_only.append(f"{page.name}: {target}")
            elif "benchmarks/results/" in target:
                linked.append(target)
                assert (page.parent / target).resolve().is_file(), f"{page.name}: {target}"
    assert not site_only, site_only
    assert linked  # the pages do link their measurements
    page = type("Page", (), {"file": type("File", (), {"src_uri": "search.md"})()})()
    shown = hooks.on_page_markdown("[r](../benchmarks/results/retrieval.md)", page, None, None)
    assert shown == "[r](results/retrieval.md)"


def test_the_install_line_names_every_extra() -> None:
    """docs/index.md's install line lists the extras pyproject.toml defines (postgres and
    summarize were left out)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    line = next(x for x in (ROOT / "docs" / "index.md").read_text().splitlines() if "extras:" in x)
    named = re.findall(r"[\w-]+", line.split("extras:", 1)[1])
    assert sorted(named) == sorted(extras["optional-dependencies"]), line
