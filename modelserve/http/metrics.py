"""What the sidecar's and the gateway's metrics share: histogram buckets, status labels, the format."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from modelserve.contracts import routes

# Both halves of a scrape are in this format; the engine's is requested as text/plain.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The status label of a request whose client went away before its answer ended.
CLIENT_CLOSED = "client_closed"

# vLLM's time-to-first-token buckets, so the sidecar's view lines up with the engine's.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
# vLLM's end-to-end latency buckets, with a few below 0.3 s for the cheap routes (/v1/models).
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


def refusal_counter(prefix: str, registry: CollectorRegistry) -> Counter:
    """Requests outside the consumer routes (routes.py) by why, every class present from the start."""
    counter = Counter(
        f"{prefix}_refused_requests",
        "Requests outside the consumer routes, answered 404 and never forwarded, by route class (method, "
        "spelling, engine_alias, engine_admin, unknown).",
        ["route_class"],
        registry=registry,
    )
    for route_class in routes.REFUSAL_CLASSES:
        counter.labels(route_class)
    return counter
