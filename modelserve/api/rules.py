"""A cross-field rule of the spec, written once and enforced twice: as a CEL
`x-kubernetes-validations` rule in the API server and by the spec model's own validator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """One cross-field rule: CEL for the API server, `holds` for Python; `field` names the culprit."""

    cel: str
    message: str
    field: str  # relative to the object the rule sits on, e.g. "gpus" -> fieldPath ".gpus"
    holds: Callable[[Any], bool]

    def to_validation(self) -> dict[str, str]:
        return {
            "rule": self.cel,
            "message": self.message,
            "fieldPath": f".{self.field}",
            "reason": "FieldValueInvalid",
        }
