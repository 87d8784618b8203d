"""The README is the front page: short, with the two set-up commands, and a quickstart that is the
tested one's (docs/getting-started/quickstart.md, which tests/realnode/test_quickstart.py runs)."""

from __future__ import annotations

import re
import textwrap

from tests.helpers.chart import REPO

README = (REPO / "README.md").read_text()
QUICKSTART = (REPO / "docs" / "getting-started" / "quickstart.md").read_text()
MAX_LINES = 250


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _code_blocks(text: str) -> list[str]:
    """Every fenced block's body, dedented (a list item's blocks are indented)."""
    return [textwrap.dedent(body) for body in re.findall(r"^ *```\w*\n(.*?)^ *```$", text, re.S | re.M)]


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= MAX_LINES, "README.md grew past a front page: move the text into docs/"


def test_the_two_set_up_commands() -> None:
    set_up = _section("Set up")
    assert "| `make dev` |" in set_up and "| `make test` |" in set_up
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^dev:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_the_readme_quickstart_is_the_tested_one() -> None:
    # Each command of the front page's five steps is the full quickstart's, which the real-node test runs.
    steps = _code_blocks(_section("Quickstart"))
    assert len(steps) == 5
    tested = "\n".join(_code_blocks(QUICKSTART))
    for step in steps:
        assert step in tested, step


def test_the_readme_says_how_to_serve_the_docs() -> None:
    assert "`make docs`" in README
    assert re.search(r"^docs:", (REPO / "Makefile").read_text(), re.M)
