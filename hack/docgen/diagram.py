"""The picture of how a ModelServer and a request flow: its Mermaid source, docs/diagrams/flow.mmd, copied
between markers into README.md (GitHub renders it) and docs/index.md (the site renders it with mermaid.js)."""

from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "docs" / "diagrams" / "flow.mmd"
START = "<!-- diagram:start (docs/diagrams/flow.mmd, copied by `make generate`; do not edit) -->"
END = "<!-- diagram:end -->"


def updated(text: str) -> str:
    """`text` with the diagram between its markers as the source has it now."""
    before, found_start, rest = text.partition(START)
    _, found_end, after = rest.partition(END)
    if not (found_start and found_end):
        raise ValueError(f"no markers {START!r} ... {END!r}")
    return f"{before}{START}\n\n```mermaid\n{SOURCE.read_text().strip()}\n```\n\n{END}{after}"
