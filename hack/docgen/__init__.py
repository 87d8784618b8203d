"""The documentation pages derived from the code, written by `make generate` (hack/generate.py) and
checked by tests/packaging/test_docs.py, so a page cannot drift from what it documents.

Each module renders one page from what the programs themselves hold: the settings dataclasses and
their comments, the Prometheus registries, the status code, the chart's schema and values, the CLI's
parser. They live outside modelserve/ because they read every program, which no program may import.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import chart_values, cli, conditions, diagram, metrics, settings

REPO = Path(__file__).resolve().parents[2]

# Every generated page, by its path in the repository.
PAGES: dict[str, Callable[[], str]] = {
    "docs/reference/settings.md": settings.page,
    "docs/reference/metrics.md": metrics.page,
    "docs/reference/conditions.md": conditions.page,
    "docs/reference/helm-values.md": chart_values.page,
    "docs/reference/cli.md": cli.page,
}

# Files holding a generated part between markers: the path and a function of its current text.
EMBEDDED: dict[str, Callable[[str], str]] = {
    "README.md": diagram.updated,
    "docs/index.md": diagram.updated,
}


def rendered() -> dict[Path, str]:
    """Every derived file's text as it should be, by its path."""
    out = {REPO / path: render() for path, render in PAGES.items()}
    for path, update in EMBEDDED.items():
        out[REPO / path] = update((REPO / path).read_text())
    return out
