"""The gateway's Prometheus series, per ModelServer (namespace, model)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from modelserve.contracts.names import Key
from modelserve.http.metrics import RequestSeries, refusal_counter

PREFIX = "modelserve_gateway"
# From an instant to a GPU cold start of many minutes.
HOLD_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
MODEL = ["namespace", "model"]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        r = self.registry
        self.series = RequestSeries(
            PREFIX,
            MODEL,
            (
                "Requests by ModelServer and status class (client_closed: the client went away first). "
                'Requests for no known model count under namespace and model "".',
                "Time from request to last byte, holding included.",
                "Time from request to the first body byte sent back, holding included.",
            ),
            r,
        )
        self.in_flight = Gauge(f"{PREFIX}_in_flight_requests", "Requests sent to replicas now.", MODEL, registry=r)
        self.held = Gauge(
            f"{PREFIX}_held_requests", "Requests waiting for a ready replica now (demand at zero).", MODEL, registry=r
        )
        self.hold = Histogram(
            f"{PREFIX}_hold_seconds",
            "How long requests waited for a ready replica, by outcome (ready, timeout, full, client_gone).",
            [*MODEL, "outcome"],
            buckets=HOLD_BUCKETS,
            registry=r,
        )
        self.routing = Counter(
            f"{PREFIX}_routing_decisions",
            "Replica choices by policy outcome: least_in_flight; affinity (the conversation's own replica); "
            "affinity_spill (the next one on the ring, its own being over the load bound); retry (another "
            "replica after a connection failure).",
            [*MODEL, "decision"],
            registry=r,
        )
        self.upstream_errors = Counter(
            f"{PREFIX}_upstream_errors",
            "Failures talking to a replica's sidecar by kind (connect, disconnected, timeout; status_503: its "
            "engine unreachable, so the request went to another replica).",
            [*MODEL, "kind"],
            registry=r,
        )
        self.refused = refusal_counter(PREFIX, r)
        self.replicas = Gauge(f"{PREFIX}_ready_replicas", "Replicas the gateway routes to.", MODEL, registry=r)
        # Label lookups take a lock and hash a tuple; the hot path reuses resolved children (forget()
        # drops a deleted ModelServer's along with its series).
        self._in_flight: dict[Key, Gauge] = {}
        self._routed: dict[tuple[Key, str], Counter] = {}

    def observe(self, key: Key, status_label: str, duration: float, ttfb: float | None) -> None:
        """One finished request: its count by status class, its duration and time to first byte."""
        self.series.observe(key, status_label, duration, ttfb)

    def in_flight_of(self, key: Key) -> Gauge:
        child = self._in_flight.get(key)
        if child is None:
            child = self._in_flight[key] = self.in_flight.labels(*key)
        return child

    def routed(self, key: Key, decision: str) -> None:
        child = self._routed.get((key, decision))
        if child is None:
            child = self._routed[(key, decision)] = self.routing.labels(*key, decision)
        child.inc()

    def forget(self, key: Key) -> None:
        """Drop a deleted ModelServer's series (the labelled children of every metric)."""
        self.series.forget(key)
        for metric in (
            self.in_flight,
            self.held,
            self.hold,
            self.routing,
            self.upstream_errors,
            self.replicas,
        ):
            for labels in list(metric._metrics):
                if labels[:2] == key:
                    metric.remove(*labels)
        self._in_flight.pop(key, None)
        for cached in [cached for cached in self._routed if cached[0] == key]:
            del self._routed[cached]

    def render(self) -> bytes:
        return generate_latest(self.registry)
