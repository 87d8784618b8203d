"""A pod's containers read for a person: each one's state in a word, and its restart count. Pure
functions of a pod as the API server returns it, shared by the real-node tests and the cold-start
benchmark."""

from __future__ import annotations

from typing import Any


def container_states(pod: dict[str, Any]) -> str:
    """Each container's state in a word (init containers first), for a timeline: 'fetch:done(0) llama:running,ready'."""
    status = pod.get("status", {})
    words = []
    for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        state = c.get("state", {})
        if "terminated" in state:
            word = f"done({state['terminated'].get('exitCode')})"
        elif "waiting" in state:
            word = state["waiting"].get("reason", "waiting")
        else:
            word = "running,ready" if c.get("ready") else "running"
        words.append(f"{c['name']}:{word}")
    return " ".join(words) or status.get("phase", "?")


def restart_counts(pod: dict[str, Any]) -> dict[str, int]:
    """Each container's restart count, by container name."""
    return {c["name"]: c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", [])}
