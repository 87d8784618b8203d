"""The operator's own Prometheus metrics: what the autoscaler sees and decides, and the work queue.

Served on MODELSERVE_METRICS_PORT (the chart's `operator.metricsPort`) when set.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

if TYPE_CHECKING:
    from .starts import Start

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
# A replica's start, by phase (operator/starts.py), from a second to a GPU cold start of an hour.
START_PHASE = Histogram(
    f"{PREFIX}_start_phase_seconds",
    "Seconds of each replica start, by phase (schedule, image, weights, engine; total: created -> Ready).",
    ["phase", "engine"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
    registry=REGISTRY,
)
START_BYTES = Counter(
    f"{PREFIX}_start_bytes",
    "Bytes of model files replica starts read, by where from (hub, node: the node's cache, local: the pod's volume).",
    ["source"],
    registry=REGISTRY,
)
NODE_CACHE_MISSED = Counter(
    f"{PREFIX}_node_cache_unavailable",
    "Replica starts whose fetch could not use the node's cache (down, full, or a failed file) and read the hub.",
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(f"{PREFIX}_work_queue_depth", "ModelServers waiting for a reconcile.", registry=REGISTRY)


def serve(port: int) -> None:
    """Serve /metrics on `port` in a daemon thread."""
    start_http_server(port, registry=REGISTRY)


def observe_start(start: Start, engine: str) -> None:
    for phase, seconds in start.phases.items():
        START_PHASE.labels(phase, engine).observe(seconds)
    START_PHASE.labels("total", engine).observe(start.seconds)
    if start.fetch is not None:
        for source, count in (
            ("hub", start.fetch.hub_bytes),
            ("node", start.fetch.node_bytes),
            ("local", start.fetch.local_bytes),
        ):
            START_BYTES.labels(source).inc(count)
        if start.fetch.node_cache:
            NODE_CACHE_MISSED.inc()


def forget(namespace: str, name: str) -> None:
    for gauge in (DESIRED_REPLICAS, DEMAND, HELD):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
