"""docs/reference/settings.md: every program's environment variables, from its settings dataclass.

The name, parser and default are the `env_setting`'s (modelserve/contracts/env.py); the meaning is the
comment written above the field in the source. A comment that opens a block (a blank line above it)
also speaks for the fields below it that have none, up to the next blank line: the sidecar's client
limits share one comment. A field with no comment at all fails the docs test.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import textwrap
from typing import Any

from modelserve.contracts import env, nodecache, operator_settings, sidecar
from modelserve.gateway import settings as gateway_settings
from modelserve.nodecache import settings as nodecache_settings

from .markdown import code, generated_by, table

PROGRAMS: tuple[tuple[str, str, type], ...] = (
    (
        "The operator",
        "`modelserve-operator`, and `modelserve render`, which renders what the operator would. The chart "
        "sets them from its values ([chart values](helm-values.md)).",
        operator_settings.Settings,
    ),
    (
        "The sidecar",
        "`modelserve-sidecar`, in every model pod. The operator sets them from the ModelServer's spec and "
        "its own settings; only the ones that differ from their defaults since release 0.1 are in the pod.",
        sidecar.Settings,
    ),
    (
        "The gateway",
        "`modelserve-gateway`. The chart sets them from its `gateway.*` values.",
        gateway_settings.GatewaySettings,
    ),
    (
        "The node cache's agent",
        "`modelserve-nodecache`, on every node. The chart sets them from its `nodeCache.*` values "
        "([Cold start and caches](../how-to/cold-start.md)).",
        nodecache_settings.Settings,
    ),
    (
        "The node cache's fetch",
        "`modelserve-fetch`, each model pod's init container (and each prefetch Job's). The operator sets "
        "them from the ModelServer and its own settings; the hub token comes as `HF_TOKEN`, as the engine's.",
        nodecache.FetchSettings,
    ),
)

# What a value must look like, by the parser the setting is declared with.
PARSERS = {
    env.non_empty: "string",
    env.base_url: "http(s) URL",
    env.route: "path (`/...`)",
    env.port: "port (1-65535)",
    env.port_or_off: "port (1-65535), or 0: off",
    env.boolean: "`true` or `false`",
    env.positive_int: "integer > 0",
    env.non_negative_int: "integer >= 0",
    env.positive_float: "number > 0",
    env.non_negative_float: "number >= 0",
    env.path: "path",
    env.comma_list: "comma-separated list",
    env.byte_quantity: "bytes (`50Gi`, `500M`)",
    nodecache._layout: "`gguf`, `safetensors` or `all`",
}
# Otherwise by the field's type.
TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "`true` or `false`",
    "Path": "path",
    "tuple[str, ...]": "comma-separated list",
    "Mapping[str, Any]": "JSON object",
    "Mapping[str, str]": "JSON object",
}


def comments(cls: type) -> dict[str, str]:
    """Each field's meaning: the comment above it, or the block comment it falls under."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    body = ast.parse("\n".join(lines)).body[0]
    assert isinstance(body, ast.ClassDef)
    out: dict[str, str] = {}
    block: str | None = None
    for statement in body.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        above = statement.lineno - 2  # the line above the field, 0-based
        start = above
        while start >= 0 and lines[start].strip().startswith("#"):
            start -= 1
        own = " ".join(line.strip().lstrip("#").strip() for line in lines[start + 1 : above + 1])
        if own:
            # A comment after a blank line opens a block for the uncommented fields below it.
            block = own if start >= 0 and not lines[start].strip() else None
            out[statement.target.id] = own
        else:
            if above >= 0 and not lines[above].strip():
                block = None
            if block:
                out[statement.target.id] = block
    return out


def _kind(setting: dataclasses.Field) -> str:
    parse = setting.metadata["parse"]
    if setting.metadata.get("prefix"):
        return f"{PARSERS.get(parse, 'string')}, one variable per name"
    if isinstance(parse, type) and issubclass(parse, enum.Enum):
        return ", ".join(code(member.value) for member in parse)
    if parse in PARSERS:
        return PARSERS[parse]
    if str(setting.type) == "bool":  # a parser of its own: the two words it reads
        render = setting.metadata["render"]
        return f"{code(render(True))} or {code(render(False))}"
    return TYPES.get(str(setting.type), str(setting.type))


def _default(setting: dataclasses.Field) -> str:
    if setting.default is dataclasses.MISSING and setting.default_factory is dataclasses.MISSING:
        return "required"
    value: Any = env.default_of(setting)
    if (
        setting.metadata.get("prefix")
        or value is None
        or value in ("", (), {})
        or (hasattr(value, "__len__") and not len(value))
    ):
        return "empty"
    return code(setting.metadata["render"](value))


def rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(variable, type, default, meaning) of every setting of `cls`, in declaration order."""
    meanings = comments(cls)
    return [
        (code(setting.metadata["env"]), _kind(setting), _default(setting), meanings.get(setting.name, ""))
        for setting in dataclasses.fields(cls)
    ]


def page() -> str:
    lines = ["# Settings", "", *generated_by("hack/docgen/settings.py", "each program's settings dataclass")]
    lines += [
        "Every program reads its settings from `MODELSERVE_*` environment variables when it starts; a bad",
        "value stops it with status 2, naming the variable. Empty and unset are the same: the default.",
        "",
    ]
    for title, intro, cls in PROGRAMS:
        source = inspect.getsourcefile(cls) or ""
        lines += [f"## {title}", "", f"{intro} Declared in `{source[source.index('modelserve/') :]}`.", ""]
        lines += [*table(("variable", "type", "default", "meaning"), rows(cls)), ""]
    return "\n".join(lines)
