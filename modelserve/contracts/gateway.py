"""What the operator and the chart know of the gateway: its pods' label, its port, and the route
that publishes the requests it holds for ModelServers with no ready replica (standard library only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .names import Key

# On the gateway's pods (value: the release); the operator finds them by it to read HELD_ROUTE.
GATEWAY_LABEL = "serving.modelserve.dev/gateway"
GATEWAY_CONTAINER = "gateway"
LISTEN_PORT = 8080
HEALTH_ROUTE = "/healthz"
READY_ROUTE = "/readyz"
METRICS_ROUTE = "/metrics"
# Requests waiting for a replica, per ModelServer: the autoscaler counts them as demand. No key
# needed, like the sidecar's /load (counts only, no request content).
HELD_ROUTE = "/held"
OWN_ROUTES = frozenset({HEALTH_ROUTE, READY_ROUTE, METRICS_ROUTE, HELD_ROUTE})


def held_to_json(held: Mapping[Key, int]) -> dict[str, Any]:
    return {"held": [{"namespace": ns, "name": name, "requests": count} for (ns, name), count in sorted(held.items())]}


def held_from_json(body: Mapping[str, Any]) -> dict[Key, int]:
    entries: Iterable[Mapping[str, Any]] = body["held"]
    return {(str(e["namespace"]), str(e["name"])): int(e["requests"]) for e in entries}
