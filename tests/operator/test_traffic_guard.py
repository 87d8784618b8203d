"""A version's traffic guard in its status (operator/traffic_guard.py, status.transitions): a gateway's
trip is kept until the reset annotation changes, and its turn to tripped is a Warning Event."""

from __future__ import annotations

from modelserve.api.status import GuardStatus
from modelserve.contracts.gateway import GuardReport
from modelserve.operator.status import transitions
from modelserve.operator.traffic_guard import guard_condition_parts, guard_status, merge_reports, reset_value

REPORT = GuardReport("4 of its last 10 requests failed (40%; at most 10%)", 10, 0.4, 0.2, 0.1)
NOW = "2026-11-26T20:00:00Z"


def test_a_gateways_trip_under_the_current_reset_value_trips_the_status() -> None:
    tripped = guard_status("", None, ("", REPORT), NOW)
    assert tripped == GuardStatus(tripped=True, reset="", message=REPORT.message, since=NOW)
    assert guard_condition_parts(tripped) == (False, "GuardTripped", f"no new requests: {REPORT.message}")
    # A trip made before the last reset says nothing now.
    assert guard_status("r2", None, ("", REPORT), NOW) == GuardStatus(tripped=False, reset="r2")


def test_a_trip_in_the_status_stays_until_the_reset_value_changes() -> None:
    previous = {"guard": guard_status("", None, ("", REPORT), NOW).model_dump(mode="json", by_alias=True)}
    # The gateways forgot it (restarted, or read nothing this time): the status keeps it.
    assert guard_status("", previous, None, "2026-11-26T20:05:00Z").tripped
    assert guard_status("", previous, None, "2026-11-26T20:05:00Z").since == NOW
    cleared = guard_status("2026-11-26T20:10:00Z", previous, None, NOW)
    assert not cleared.tripped and cleared.reset == "2026-11-26T20:10:00Z"
    assert guard_condition_parts(cleared) == (True, "GuardHolding", "new requests follow the weight")


def test_the_reset_value_is_the_annotation() -> None:
    assert reset_value({"metadata": {"annotations": {"serving.modelserve.dev/guard-reset": "x"}}}) == "x"
    assert reset_value({"metadata": {}}) == ""


def test_the_first_gateways_report_of_each_version_counts() -> None:
    other = GuardReport("other", 10, 0.5, None, None)
    merged = merge_reports([{("ns", "v2"): ("", REPORT)}, {("ns", "v2"): ("", other), ("ns", "v3"): ("", other)}])
    assert merged == {("ns", "v2"): ("", REPORT), ("ns", "v3"): ("", other)}


def test_a_tripped_guard_is_a_warning_event_and_its_reset_a_normal_one() -> None:
    def status(ok: bool, reason: str) -> dict:
        condition = {"type": "TrafficGuard", "status": "True" if ok else "False", "reason": reason, "message": "m"}
        return {"conditions": [condition]}

    (tripped,) = transitions(status(True, "GuardHolding"), status(False, "GuardTripped"))
    assert (tripped.type, tripped.reason) == ("Warning", "GuardTripped")
    (held,) = transitions(status(False, "GuardTripped"), status(True, "GuardHolding"))
    assert (held.type, held.reason) == ("Normal", "GuardHolding")
