"""Pod predicates the operator and the gateway share: which pods are ready, which can be read."""

from __future__ import annotations

from typing import Any

from modelserve.contracts.names import SIDECAR_NAME


def pod_ready(pod: dict[str, Any]) -> bool:
    """Ready and not terminating: a pod the Deployment counts as ready."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def readable(pod: dict[str, Any], container: str = SIDECAR_NAME) -> bool:
    """A pod whose `container` a container runtime started and that has an address: one that can answer.
    (Simulated nodes such as KWOK's report running containers with no container ID and an
    address nothing listens on: such pods are never read.)"""
    if pod["metadata"].get("deletionTimestamp") or not (pod.get("status") or {}).get("podIP"):
        return False
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(
        s.get("name") == container and s.get("containerID") and "running" in (s.get("state") or {}) for s in statuses
    )
