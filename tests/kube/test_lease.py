"""The Lease's pure rules: who may take it, and what a holder writes."""

from __future__ import annotations

from datetime import UTC, datetime

from modelserve.kube.lease import Timing, claimed, held_by_another

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _lease(holder: str | None, transitions: int = 0) -> dict:
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": transitions}
    return {"metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"}, "spec": spec}


def test_a_renewed_lease_of_another_is_held_an_unrenewed_or_empty_one_is_not() -> None:
    assert held_by_another(_lease("b"), "a", unchanged_for=14.9)
    assert not held_by_another(_lease("b"), "a", unchanged_for=15.0)  # silent a whole lease: gone
    assert not held_by_another(_lease(None), "a", unchanged_for=0.0)  # released on shutdown
    assert not held_by_another(_lease("a"), "a", unchanged_for=0.0)  # ours
    assert not held_by_another(None, "a", unchanged_for=0.0)


def test_taking_over_counts_a_transition_renewing_does_not() -> None:
    taken = claimed(_lease("b", transitions=3), "ns", "l", "a", 15, NOW)
    assert taken["spec"]["holderIdentity"] == "a" and taken["spec"]["leaseTransitions"] == 4
    assert taken["spec"]["acquireTime"] == taken["spec"]["renewTime"] == "2026-01-01T00:00:00.000000Z"
    assert taken["metadata"]["resourceVersion"] == "7"  # written only over the version read
    renewed = claimed(taken | {"metadata": {**taken["metadata"]}}, "ns", "l", "a", 15, NOW.replace(second=2))
    assert renewed["spec"]["leaseTransitions"] == 4 and renewed["spec"]["acquireTime"] == taken["spec"]["acquireTime"]
    first = claimed(None, "ns", "l", "a", 15, NOW)
    assert first["spec"]["leaseTransitions"] == 0 and "resourceVersion" not in first["metadata"]


def test_timing_keeps_client_gos_proportions() -> None:
    assert Timing.for_lease(15) == Timing(15, 10, 2)
