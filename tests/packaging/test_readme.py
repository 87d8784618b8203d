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


def test_the_readme_links_land() -> None:
    # The site's strict build checks the pages' links; the README is outside it, so its links are here.
    from markdown.extensions.toc import slugify  # the docs extra's Markdown: the site's anchors

    def anchors(text: str) -> set[str]:
        return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in re.findall(r"^#+ (.+)$", text, re.M)}

    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert len(links) > 30
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = (REPO / path) if path else REPO / "README.md"
        assert target.is_file(), link
        if anchor:
            assert anchor in anchors(target.read_text()), link
