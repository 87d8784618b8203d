"""A core/v1 Event's manifest, one shape for every program that posts one (the operator about a
ModelServer, the gateway about its own pod): what `kubectl describe` and `kubectl get events` list."""

from __future__ import annotations

from typing import Any

# The API server refuses longer messages.
MESSAGE_LIMIT = 1024


def event_manifest(
    involved: dict[str, Any], type_: str, reason: str, message: str, component: str, instance: str, now: str
) -> dict[str, Any]:
    """An Event about `involved` (its apiVersion, kind, name and namespace at least), from `component`
    (`instance` of it), first and last seen `now`."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
