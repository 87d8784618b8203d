"""Why a ModelServer is invalid, in the API server's words: field path first, then the rule.

Shared by `modelserve render` and the reconciler (for stored objects the model refuses). Messages
come from the rules and pydantic's error texts, never from the input values, which may be secrets.
"""

from __future__ import annotations

from pydantic import ValidationError

from . import spec
from .rules import Rule


class InvalidManifest(ValueError):
    """A manifest the API server would refuse; the message names the field like the API server."""


def rules_by_message() -> dict[str, Rule]:
    """Every cross-field rule of the spec model, by its message (messages are unique)."""
    found: dict[str, Rule] = {}
    pending = [spec.WireModel]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        found.update({rule.message: rule for rule in cls.rules})
    return found


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def field_errors(error: ValidationError, prefix: str = "spec") -> list[str]:
    """`<field path>: <message>` lines, the field path spelt as in the API server's refusal.

    Schema errors carry their location; a broken cross-field rule is reported at the location of
    the object it sits on, and its `field` finishes the path (the CEL rule's fieldPath).
    """
    rules = rules_by_message()
    lines = []
    for item in error.errors():
        path = _path(prefix, item["loc"])
        broken = [rule for message, rule in rules.items() if item["type"] == "value_error" and message in item["msg"]]
        if broken:
            lines += [f"{path}.{rule.field}: {rule.message}" for rule in broken]
        else:
            lines.append(f"{path}: {item['msg'].removeprefix('Value error, ')}")
    return lines


def explain(error: ValueError) -> str:
    """Field-named lines for a refusal of `spec.ModelServer.from_manifest`."""
    if isinstance(error, ValidationError):
        return "\n".join(field_errors(error))
    message = str(error)
    if message == spec.NAME_RULE.message:
        return f"{spec.NAME_RULE.field}: {message}"
    return message
