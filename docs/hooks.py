"""MkDocs hook: the benchmark results (benchmarks/results/*.md and their pictures) become
pages of the site under results/, read from where they live: written once, in the results
files, and shown here (docs/benchmarks.md indexes them). A page links a results file by its
path in the repository (../benchmarks/results/x.md, which GitHub follows), made the site's
(results/x.md) here."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files


REPOSITORY_LINK = "](../benchmarks/results/"  # a page's link (or picture) of a results file


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links to the results files as the site's; docs/benchmarks.md ends with the index of the
    results pages: each file's title, made here from the files themselves (a new results file
    is listed without an edit)."""
    markdown = markdown.replace(REPOSITORY_LINK, "](results/")
    if page.file.src_uri != "benchmarks.md":
        return markdown
    rows = ["| results | what |", "|---|---|"]
    for path in sorted(RESULTS.glob("*.md")):
        title = next(
            (ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")),
            path.stem,
        )
        rows.append(f"| [{path.name}](results/{path.name}) | {title} |")
    return markdown.rstrip() + "\n\n## Results files\n\n" + "\n".join(rows) + "\n"
