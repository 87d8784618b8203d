"""spec.adapters in the status: what each ready replica's sidecar reports on its /adapters route,
summed up per adapter (the sidecars load them; the operator only reads)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from modelserve.api.manifests import ADAPTERS_HASH_ANNOTATION
from modelserve.api.spec import ModelServer
from modelserve.api.status import AdapterStatus
from modelserve.contracts.adapters import ADAPTERS_ROUTE, AdapterState, Phase
from modelserve.contracts.pod_urls import url_of

from .autoscaling import read_json


def read_pod_adapters(base: str) -> list[AdapterState] | None:
    """One sidecar's adapters (at `base`: contracts.sidecar.base_of), or None when it cannot be read now."""
    body = read_json(url_of(base, ADAPTERS_ROUTE))
    try:
        return None if body is None else [AdapterState.from_json(item) for item in body["adapters"]]
    except (KeyError, TypeError, ValueError):
        return None


def adapter_statuses(ms: ModelServer, reports: Iterable[list[AdapterState] | None]) -> list[AdapterStatus] | None:
    """Per adapter of the spec: Failed when a replica's engine refused it (its message), Loaded when
    every reporting replica serves it, else Pending (pure)."""
    if ms.spec.adapters is None:
        return None
    known = [report for report in reports if report is not None]
    out = []
    for adapter in ms.spec.adapters:
        states = [
            state
            for report in known
            for state in report
            if state.name == adapter.name and state.source == adapter.source
        ]
        loaded = [state for state in states if state.phase == Phase.LOADED]
        failed = [state for state in states if state.phase == Phase.FAILED]
        seconds = [state.load_seconds for state in loaded if state.load_seconds is not None]
        if failed:
            phase, message = "Failed", failed[0].message
        elif known and len(loaded) == len(known):
            phase, message = "Loaded", f"loaded in {len(loaded)} ready replica(s)"
        else:
            phase = "Pending"
            message = f"loaded in {len(loaded)} of {len(known)} ready replica(s)" if known else "no ready replica"
        out.append(
            AdapterStatus(
                name=adapter.name,
                source=adapter.source,
                phase=phase,
                loaded_replicas=len(loaded),
                message=message,
                load_seconds=max(seconds) if seconds else None,
            )
        )
    return out


def pods_to_nudge(digest: str, pods: Iterable[dict[str, Any]]) -> list[str]:
    """The pods whose annotation does not yet carry the adapters list's `digest` (pure): patching it
    makes the kubelet sync the pod, which refreshes the mounted list now rather than on its
    periodic sync a minute or more later."""
    return [
        pod["metadata"]["name"]
        for pod in pods
        if not pod["metadata"].get("deletionTimestamp")
        and (pod["metadata"].get("annotations") or {}).get(ADAPTERS_HASH_ANNOTATION) != digest
    ]
