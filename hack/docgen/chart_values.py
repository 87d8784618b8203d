"""docs/reference/helm-values.md: every value of the chart, from its schema (charts/modelserve/values.schema.json,
which refuses any other key) with the default and the `# --` comment of values.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from .markdown import code, generated_by, table

CHART = Path(__file__).resolve().parents[2] / "charts" / "modelserve"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):")


def comments(text: str) -> dict[str, str]:
    """Each key's `# --` comment in values.yaml (helm-docs' convention), by its dotted path."""
    out: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
        elif stripped.startswith("#") and pending:
            pending.append(stripped.lstrip("#").strip())
        elif match := KEY.match(line):
            indent = len(match["indent"])
            path = [(i, key) for i, key in path if i < indent] + [(indent, match["key"])]
            if pending:
                out[".".join(key for _, key in path)] = " ".join(pending)
            pending = []
        else:
            pending = []
    return out


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    return kind


def _allowed(node: dict[str, Any]) -> str:
    if "enum" in node:
        return ", ".join(code(json.dumps(value)) for value in node["enum"])
    bounds = [f">= {node['minimum']}"] if "minimum" in node else []
    bounds += [f"<= {node['maximum']}"] if "maximum" in node else []
    if "pattern" in node:
        bounds.append(f"matches {code(node['pattern'])}")
    return ", ".join(bounds)


def rows(schema: dict[str, Any], values: Any, notes: dict[str, str], path: str = "") -> list[tuple[str, ...]]:
    out = []
    for name, node in schema.get("properties", {}).items():
        key = f"{path}.{name}" if path else name
        value = values.get(name) if isinstance(values, dict) else None
        nested = node.get("type") == "object" and "properties" in node
        default = "" if nested or value is None else code(json.dumps(value))
        out.append((code(key), _type(node), default, _allowed(node), notes.get(key) or node.get("description", "")))
        if nested:
            out += rows(node, value, notes, key)
    return out


def page() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    text = (CHART / "values.yaml").read_text()
    lines = ["# Chart values", ""]
    lines += generated_by("hack/docgen/chart_values.py", "charts/modelserve/values.schema.json and values.yaml")
    lines += [
        "Every value of `charts/modelserve`. The schema refuses any other key, so a typo fails",
        "`helm install` instead of being ignored. The ones most set, with more on each:",
        "[Installing with Helm](../getting-started/helm.md).",
        "",
        *table(("value", "type", "default", "allowed", "meaning"), rows(schema, yaml.safe_load(text), comments(text))),
        "",
    ]
    return "\n".join(lines)
