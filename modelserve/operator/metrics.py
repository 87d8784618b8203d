"""The operator's own Prometheus metrics: what the autoscaler sees and decides, and the work queue.

Served on MODELSERVE_METRICS_PORT (the chart's `operator.metricsPort`) when set.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

PREFIX = "modelserve_operator"
REGISTRY = CollectorRegistry()
MODELSERVER = ["namespace", "modelserver"]
DESIRED_REPLICAS = Gauge(
    f"{PREFIX}_desired_replicas", "Replicas the autoscaler asks for.", MODELSERVER, registry=REGISTRY
)
DEMAND = Gauge(
    f"{PREFIX}_demand_in_flight", "Requests in flight across the pods, as last read.", MODELSERVER, registry=REGISTRY
)
HELD = Gauge(
    f"{PREFIX}_demand_held",
    "Requests the gateway holds for a ready replica (a ModelServer at zero), as last read.",
    MODELSERVER,
    registry=REGISTRY,
)
SCALE_DECISIONS = Counter(
    f"{PREFIX}_scale_decisions", "Replica count changes, by reason (ScaleUp, ScaleDown).", ["reason"], registry=REGISTRY
)
QUEUE_DEPTH = Gauge(f"{PREFIX}_work_queue_depth", "ModelServers waiting for a reconcile.", registry=REGISTRY)


def serve(port: int) -> None:
    """Serve /metrics on `port` in a daemon thread."""
    start_http_server(port, registry=REGISTRY)


def forget(namespace: str, name: str) -> None:
    for gauge in (DESIRED_REPLICAS, DEMAND, HELD):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
