"""A version's traffic guard in its status (pure): tripped once any gateway reports a trip, and so
until its reset annotation changes; the gateways read the verdict back, so they all agree."""

from __future__ import annotations

from typing import Any

from modelserve.api.status import GuardStatus
from modelserve.contracts.gateway import GUARD_RESET_ANNOTATION, GuardReport

GUARD_HOLDING, GUARD_TRIPPED = "GuardHolding", "GuardTripped"


def reset_value(body: dict[str, Any]) -> str:
    """The ModelServer's guard-reset annotation ("" when unset)."""
    return ((body.get("metadata") or {}).get("annotations") or {}).get(GUARD_RESET_ANNOTATION) or ""


def guard_status(
    reset: str, previous: dict[str, Any] | None, reported: tuple[str, GuardReport] | None, now: str
) -> GuardStatus:
    """The verdict to write: the previous trip while the reset value stands, else a gateway's trip
    made under the current reset value, else holding."""
    before = (previous or {}).get("guard") or {}
    if before.get("tripped") is True and (before.get("reset") or "") == reset:
        return GuardStatus.model_validate(before)
    if reported is not None and reported[0] == reset:
        return GuardStatus(tripped=True, reset=reset, message=reported[1].message, since=now)
    return GuardStatus(tripped=False, reset=reset)


def guard_condition_parts(guard: GuardStatus) -> tuple[bool, str, str]:
    """(holding, reason, message) of the TrafficGuard condition."""
    if guard.tripped:
        return False, GUARD_TRIPPED, f"no new requests: {guard.message}"
    return True, GUARD_HOLDING, "new requests follow the weight"


def merge_reports(
    per_gateway: list[dict[tuple[str, str], tuple[str, GuardReport]]],
) -> dict[tuple[str, str], tuple[str, GuardReport]]:
    """The trips of every gateway, per ModelServer (the first gateway's report of each)."""
    merged: dict[tuple[str, str], tuple[str, GuardReport]] = {}
    for reports in per_gateway:
        for key, entry in reports.items():
            merged.setdefault(key, entry)
    return merged
