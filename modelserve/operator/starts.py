"""Where each replica's start spent its time, read from the pod itself once it is Ready: no request
beyond the watch the operator has anyway.

    schedule  created -> PodScheduled
    image     scheduled -> the fetch started, and the fetch done -> the engine started (image pulls and
              container creation; without the fetch: scheduled -> the engine started)
    weights   the fetch's own seconds (its termination message: bytes from the hub, from the node)
    engine    the engine started -> the pod Ready (loading the model, the first answer, the sidecar's
              warm-up, and the readiness probe's period)

The kubelet's times have whole seconds; the fetch's are its own (milliseconds). A pure function of
the pod (`pod_start`), so that the rules are tested on recorded pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelserve.api.status import LastStart, StartPhases
from modelserve.contracts.nodecache import FETCH_CONTAINER, FetchResult
from modelserve.engines.base import CONTAINER_NAME

PHASES = ("schedule", "image", "weights", "engine")


@dataclass(frozen=True)
class Start:
    pod: str
    uid: str
    node: str
    ready_at: str  # RFC 3339, as the pod's Ready condition says
    seconds: float  # created -> Ready
    phases: dict[str, float]  # PHASES, those known, in order
    fetch: FetchResult | None = None

    def status(self) -> LastStart:
        fetch = self.fetch
        return LastStart(
            pod=self.pod,
            node=self.node,
            ready_at=self.ready_at,
            seconds=round(self.seconds, 3),
            phases=StartPhases(**self.phases),
            source=fetch.source.value if fetch else None,
            hub_bytes=fetch.hub_bytes if fetch else None,
            node_bytes=fetch.node_bytes if fetch else None,
            node_cache=(fetch.node_cache or None) if fetch else None,
            hub_unreachable=True if fetch and fetch.hub_unreachable else None,
        )

    def describe(self) -> str:
        """One line for an Event: the phases, and where the weights came from."""
        parts = []
        for phase, seconds in self.phases.items():
            part = f"{phase} {seconds:.1f} s"
            fetch = self.fetch
            if phase == "weights" and fetch is not None:
                read = [
                    f"{human_bytes(fetch.hub_bytes)} from the hub",
                    f"{human_bytes(fetch.node_bytes)} from the node",
                ]
                if fetch.local_bytes:
                    read.append(f"{human_bytes(fetch.local_bytes)} already in the volume")
                part += f" ({', '.join(read)})"
            parts.append(part)
        return f"Started pod {self.pod} on {self.node} in {self.seconds:.1f} s: {', '.join(parts)}"


def human_bytes(count: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def _terminated(statuses: list[dict[str, Any]], name: str) -> dict[str, Any]:
    status = next((s for s in statuses if s.get("name") == name), {})
    return (status.get("state") or {}).get("terminated") or {}


def _started(statuses: list[dict[str, Any]], name: str) -> datetime | None:
    status = next((s for s in statuses if s.get("name") == name), {})
    running = (status.get("state") or {}).get("running") or {}
    return _time(running.get("startedAt"))


def fetch_result(pod: dict[str, Any]) -> FetchResult | None:
    """The fetch init container's result, from its termination message (None without one)."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return FetchResult.parse(_terminated(statuses, FETCH_CONTAINER).get("message"))


def pod_start(pod: dict[str, Any]) -> Start | None:
    """The phases of a Ready pod's start (None while it is not Ready, or its times are missing)."""
    ready = _condition(pod, "Ready")
    if ready.get("status") != "True":
        return None
    metadata, status = pod["metadata"], pod.get("status") or {}
    created, ready_at = _time(metadata.get("creationTimestamp")), _time(ready.get("lastTransitionTime"))
    scheduled = _time(_condition(pod, "PodScheduled").get("lastTransitionTime"))
    engine = _started(status.get("containerStatuses") or [], CONTAINER_NAME)
    if created is None or ready_at is None or scheduled is None or engine is None:
        return None
    phases = {"schedule": (scheduled - created).total_seconds()}
    fetched = _terminated(status.get("initContainerStatuses") or [], FETCH_CONTAINER)
    fetch_began, fetch_ended = _time(fetched.get("startedAt")), _time(fetched.get("finishedAt"))
    result = FetchResult.parse(fetched.get("message"))
    if fetch_began is not None and fetch_ended is not None:
        phases["image"] = (fetch_began - scheduled).total_seconds() + (engine - fetch_ended).total_seconds()
        phases["weights"] = result.seconds if result else (fetch_ended - fetch_began).total_seconds()
    else:
        phases["image"] = (engine - scheduled).total_seconds()
    phases["engine"] = (ready_at - engine).total_seconds()
    return Start(
        pod=metadata["name"],
        uid=metadata.get("uid", ""),
        node=(pod.get("spec") or {}).get("nodeName", ""),
        ready_at=ready.get("lastTransitionTime", ""),
        seconds=max(0.0, (ready_at - created).total_seconds()),
        phases={phase: max(0.0, round(phases[phase], 3)) for phase in PHASES if phase in phases},
        fetch=result,
    )


def new_starts(pods: list[dict[str, Any]], seen: set[str], reported_at: str | None) -> list[Start]:
    """The starts not reported yet, oldest first: pods Ready whose start this process has not seen,
    and Ready after the last start the status reports (`reported_at`), so that a restarted operator
    does not report again the starts its predecessor did."""
    after = _time(reported_at)
    starts = []
    for pod in pods:
        if pod["metadata"].get("uid") in seen or pod["metadata"].get("deletionTimestamp"):
            continue
        start = pod_start(pod)
        if start is None:
            continue
        ready_at = _time(start.ready_at)
        if after is not None and ready_at is not None and ready_at <= after:
            seen.add(start.uid)
            continue
        starts.append(start)
    return sorted(starts, key=lambda start: start.ready_at)
