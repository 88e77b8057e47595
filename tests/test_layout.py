"""The house rules, executable: imports run one way through the layers of DESIGN.md, the import
graph has no circle, no module reaches into another's private (`_`) names, nothing in src/
imports the reference implementations, and no function runs over 80 lines. Each rule is also
shown to fail on a violation planted in a copy of the tree."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"

# Lowest first: a module may import its own layer's modules and the layers below, never above.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundations",
        frozenset(
            {"errors", "textnorm", "fileio", "hub", "config", "options", "evaluate", "runner"}
            | {"families", "subwords", "tokenizer", "embedding"}
        ),
    ),
    ("data", frozenset({"data"})),
    ("checkpoint", frozenset({"checkpoint", "modeldir"})),
    ("model", frozenset({"model", "heads"})),
    ("tasks", frozenset({"tasks"})),
    ("training and the catalogue", frozenset({"train", "catalogue"})),
    ("pipelines", frozenset({"pipelines", "inputs"})),
    (
        "applications",
        frozenset({"search", "probe", "probe_tokens", "export", "merge", "attention"})
        | {"distributed"},
    ),
    ("servers", frozenset({"serve", "demo"})),
    ("command line", frozenset({"cli", "cli_search", "__main__", "__init__"})),
)
# Neither side imports the other: inference knows no training, training no inference front door.
APART = (
    frozenset({"train"}),
    frozenset({"catalogue", "pipelines", "search", "serve", "probe", "export", "distributed"}),
)
MAX_FUNCTION_LINES = 80


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `src`."""
    found = {}
    for path in src.rglob("*.py"):
        name = ".".join(("bertforge", *path.relative_to(src).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports(src: Path) -> dict[str, dict[str, set[str]]]:
    """module -> {imported bertforge module -> the names taken from it}, from every import
    statement, function-level ones included (an import inside a function closes a circle too)."""
    known = modules(src)

    def owner(name: str) -> str:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in known.items():
        edges: dict[str, set[str]] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "bertforge":
                        edges.setdefault(owner(a.name), set())
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = _package(name, path).split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if base.split(".")[0] != "bertforge":
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in known:  # a submodule: `from . import embedding`
                        edges.setdefault(full, set())
                    else:
                        edges.setdefault(owner(base), set()).add(a.name)
        edges.pop(name, None)
        graph[name] = edges
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(src: Path) -> list[str]:
    level = {part: i for i, (_, parts) in enumerate(LAYERS) for part in parts}
    found = []
    for module, edges in imports(src).items():
        mine = _top(module)
        if mine not in level:
            found.append(f"{module}: in no layer (add it to LAYERS)")
            continue
        for other in edges:
            theirs = _top(other)
            if level.get(theirs, -1) > level[mine]:
                found.append(f"{module} imports {other}, a layer above it")
            if any((mine in a and theirs in b) or (mine in b and theirs in a) for a, b in [APART]):
                found.append(f"{module} imports {other}: training and inference stay apart")
    return found


def circles(src: Path) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    graph = {m: set(e) for m, e in imports(src).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def private_reaches(src: Path) -> list[str]:
    """Imports of another module's `_name`, and `module._name` read through an imported module."""
    found = []
    graph = imports(src)
    known = modules(src)
    for module, edges in graph.items():
        for other, names in edges.items():
            found += [
                f"{module} imports {other}.{n}"
                for n in names
                if n.startswith("_") and not n.startswith("__")
            ]
        aliases = {
            a.asname or a.name
            for node in ast.walk(ast.parse(known[module].read_text()))
            if isinstance(node, ast.ImportFrom)
            for a in node.names
            if a.name in {m.rsplit(".", 1)[-1] for m in edges}
        }
        for node in ast.walk(ast.parse(known[module].read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{module} reads {node.value.id}.{node.attr}")
    return found


def long_functions(src: Path) -> list[str]:
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(src)}:{node.lineno} {node.name}: {lines}")
    return found


def test_imports_run_down_the_layers() -> None:
    assert not layer_violations(SRC)


def test_the_import_graph_has_no_circle() -> None:
    assert not circles(SRC)


def script_imports(folder: Path) -> dict[str, set[str]]:
    """script -> the folder's other scripts it imports (benchmarks/ imports its siblings by
    their bare names), function-level imports included."""
    names = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module in names and not node.level:
                found.add(node.module)
        graph[path.stem] = found - {path.stem}
    return graph


def test_the_benchmarks_import_no_circle() -> None:
    """benchmarks/serve_load.py and serve_peers.py once imported each other; what both need
    is in a third script (servers.py)."""
    graph = script_imports(SRC.parents[1] / "benchmarks")
    assert graph["serve_peers"] and "serve_peers" in graph["serve_load"]  # the graph is read
    # any circle is a path back to its start: a depth-first walk from every script
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            v = todo.pop()
            assert v != start, f"benchmarks: {start} imports itself through {sorted(seen)}"
            if v not in seen:
                seen.add(v)
                todo.extend(graph.get(v, ()))


def test_no_module_reaches_into_another_s_private_names() -> None:
    assert not private_reaches(SRC)


def test_src_never_imports_the_references() -> None:
    references = ("transformers", "sentence_transformers")
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.split(".")[0] in references], path


def test_starting_the_cli_loads_no_compiler() -> None:
    """Every command imports bertforge.cli; torch's compiler (torch._dynamo, pulled in by the
    variable-length attention and by torch.compile) is loaded only where it is used: it was 2 s
    of every command's start on a CPU."""
    import subprocess
    import sys

    probe = "import sys, bertforge.cli; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_no_function_over_80_lines() -> None:
    assert not long_functions(SRC)


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    copy = tmp_path / "bertforge"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _plant(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code + "\n")


def test_each_rule_fails_on_a_planted_violation(planted: Path) -> None:
    # checkpoint asking the catalogue, inside a function: a layer above it, and a circle
    _plant(planted / "checkpoint.py", "def heads():\n    from .catalogue import available\n")
    assert "bertforge.checkpoint imports bertforge.catalogue, a layer above it" in (
        layer_violations(planted)
    )
    assert any({"bertforge.checkpoint", "bertforge.catalogue"} <= set(c) for c in circles(planted))
    # the pipelines importing training
    _plant(planted / "pipelines.py", "from .train import loop")
    assert any("training and inference stay apart" in v for v in layer_violations(planted))
    # a private name, imported or read through its module
    _plant(planted / "merge.py", "from .fileio import _private\nfrom . import hub\nhub._cache")
    assert sorted(private_reaches(planted)) == [
        "bertforge.merge imports bertforge.fileio._private",
        "bertforge.merge reads hub._cache",
    ]
    # a module in no layer; a long function
    (planted / "newcomer.py").write_text("def f():\n" + "    x = 1\n" * 80)
    assert "bertforge.newcomer: in no layer (add it to LAYERS)" in layer_violations(planted)
    assert "newcomer.py:1 f: 81" in long_functions(planted)
