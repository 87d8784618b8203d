"""What the operator and the chart know of the gateway: its pods' label, its port, and the route
that publishes the requests it holds for ModelServers with no ready replica (standard library only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import pod_urls
from .names import Key

# On the gateway's pods (value: the release); the operator finds them by it to read HELD_ROUTE.
GATEWAY_LABEL = "serving.modelserve.dev/gateway"
GATEWAY_CONTAINER = "gateway"
LISTEN_PORT = 8080
# The gateway container's port is named so when it serves HTTPS (the chart's gateway.tls): the operator
# then reads HELD_ROUTE and GUARDS_ROUTE over TLS.
TLS_PORT_NAME = pod_urls.TLS_PORT_NAME
HEALTH_ROUTE = "/healthz"
READY_ROUTE = "/readyz"
METRICS_ROUTE = "/metrics"
# Requests waiting for a replica, per ModelServer: the autoscaler counts them as demand. No key
# needed, like the sidecar's /load (counts only, no request content).
HELD_ROUTE = "/held"
# The versions whose rollback guard (spec.traffic.guard) tripped at this gateway, with the figures:
# the operator writes them into their status (condition TrafficGuard), which every gateway obeys.
GUARDS_ROUTE = "/guards"
OWN_ROUTES = frozenset({HEALTH_ROUTE, READY_ROUTE, METRICS_ROUTE, HELD_ROUTE, GUARDS_ROUTE})


def serves_tls(pod: Mapping[str, Any]) -> bool:
    """Whether a gateway pod serves HTTPS: its gateway container's port is named TLS_PORT_NAME."""
    return pod_urls.serves_tls(pod, GATEWAY_CONTAINER)


def base_of(pod: Mapping[str, Any]) -> str:
    """A gateway pod: `https://IP:PORT` when it serves HTTPS, else `IP:PORT`."""
    return pod_urls.pod_base(pod, GATEWAY_CONTAINER, LISTEN_PORT)


# Set to a new value (`kubectl annotate --overwrite`), it clears a version's tripped guard.
GUARD_RESET_ANNOTATION = "serving.modelserve.dev/guard-reset"
TRAFFIC_GUARD_CONDITION = "TrafficGuard"


@dataclass(frozen=True)
class GuardReport:
    """Why a version's guard tripped: the message and the figures it judged on."""

    message: str
    requests: int
    error_rate: float
    p95_seconds: float | None
    stable_p95_seconds: float | None


def held_to_json(held: Mapping[Key, int]) -> dict[str, Any]:
    return {"held": [{"namespace": ns, "name": name, "requests": count} for (ns, name), count in sorted(held.items())]}


def held_from_json(body: Mapping[str, Any]) -> dict[Key, int]:
    entries: Iterable[Mapping[str, Any]] = body["held"]
    return {(str(e["namespace"]), str(e["name"])): int(e["requests"]) for e in entries}


def guards_to_json(trips: Mapping[Key, tuple[str, GuardReport]]) -> dict[str, Any]:
    """The trips of one gateway: (the reset annotation's value they were made under, the report)."""
    return {
        "guards": [
            {
                "namespace": ns,
                "name": name,
                "reset": reset,
                "message": report.message,
                "requests": report.requests,
                "errorRate": report.error_rate,
                "p95Seconds": report.p95_seconds,
                "stableP95Seconds": report.stable_p95_seconds,
            }
            for (ns, name), (reset, report) in sorted(trips.items())
        ]
    }


def guards_from_json(body: Mapping[str, Any]) -> dict[Key, tuple[str, GuardReport]]:
    entries: Iterable[Mapping[str, Any]] = body["guards"]
    return {
        (str(e["namespace"]), str(e["name"])): (
            str(e["reset"]),
            GuardReport(
                message=str(e["message"]),
                requests=int(e["requests"]),
                error_rate=float(e["errorRate"]),
                p95_seconds=None if e.get("p95Seconds") is None else float(e["p95Seconds"]),
                stable_p95_seconds=None if e.get("stableP95Seconds") is None else float(e["stableP95Seconds"]),
            ),
        )
        for e in entries
    }
