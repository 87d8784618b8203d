"""The gateway's Prometheus series, per ModelServer (namespace, model)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from modelserve.contracts.names import Key
from modelserve.http.metrics import (
    RequestSeries,
    TLSSeries,
    connections_cut,
    flush_on_collect,
    lifecycle_series,
    off_loop_counter,
    refusal_counter,
)
from modelserve.http.pipeline import Ledger

from .catalog import ANSWERS

PREFIX = "modelserve_gateway"
# From an instant to a GPU cold start of many minutes.
HOLD_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
MODEL = ["namespace", "model"]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        r = self.registry
        flush_on_collect(r, self.flush_routed)  # first: a scrape finds the counters it adds to up to date
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
        self.wake = Histogram(
            f"{PREFIX}_wake_seconds",
            "How long the ModelServer took to wake, as this gateway saw it: from the first request held "
            "while it had no ready replica to its first ready replica (Retry-After is told from the last "
            "MODELSERVE_GATEWAY_WAKE_HISTORY of them).",
            MODEL,
            buckets=HOLD_BUCKETS,
            registry=r,
        )
        self.read_off_loop = off_loop_counter(PREFIX, r)
        self.keepalives = Counter(
            f"{PREFIX}_hold_keepalives",
            "SSE comments sent to held OpenAI streams while their model woke (one per stream every "
            "MODELSERVE_GATEWAY_HOLD_KEEPALIVE_SECONDS).",
            MODEL,
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
            "Failures talking to a replica's sidecar by kind (connect; tls: its certificate refused; disconnected; "
            "timeout; status_503: its engine unreachable, so the request went to another replica).",
            [*MODEL, "kind"],
            registry=r,
        )
        self.refused = refusal_counter(PREFIX, r)
        connections_cut(PREFIX, r)
        self.tls = TLSSeries(PREFIX, r)
        self.model_list_asks = Counter(
            f"{PREFIX}_model_list_asks",
            "Sidecars asked whether a caller's key opens their model, for the model lists, by answer (opened, "
            "refused, no_answer); at most MODELSERVE_GATEWAY_MODEL_LIST_ASKS per list.",
            ["answer"],
            registry=r,
        )
        for answer in ANSWERS:
            self.model_list_asks.labels(answer)
        self.replicas = Gauge(f"{PREFIX}_ready_replicas", "Replicas the gateway routes to.", MODEL, registry=r)
        self.guard_trips = Counter(
            f"{PREFIX}_traffic_guard_trips",
            "Times a version's rollback guard (spec.traffic.guard) tripped at this gateway, stopping its new requests.",
            MODEL,
            registry=r,
        )
        self.picker = Counter(
            f"{PREFIX}_picker_streams",
            "Requests the endpoint picker (MODELSERVE_GATEWAY_PICKER_PORT) saw, by outcome: picked (a replica "
            "named to the data plane), the error code it answered instead (missing_model, model_not_found, "
            "model_starting, hold_queue_full, no_endpoint_in_subset, ...), client_gone (the request went "
            "before a replica was picked) or protocol_error (a stream out of the protocol's order, ended).",
            ["outcome"],
            registry=r,
        )
        # The hot path only counts in plain numbers: requests in flight per ModelServer, read when
        # scraped, and routing decisions, added to their counter then (prometheus_client's inc() and
        # dec() take a lock and several calls each).
        self._in_flight: dict[Key, int] = {}
        self._routed: dict[tuple[Key, str], list[int]] = {}  # -> [decisions not yet added]

    def observe(self, key: Key, status_label: str, duration: float, ttfb: float | None) -> None:
        """One finished request: its count by status class, its duration and time to first byte."""
        self.series.observe(key, status_label, duration, ttfb)

    def enter(self, key: Key) -> None:
        """A request sent to one of the ModelServer's replicas."""
        count = self._in_flight.get(key)
        if count is None:
            self.in_flight.labels(*key).set_function(lambda: self._in_flight.get(key, 0))
            count = 0
        self._in_flight[key] = count + 1

    def lifecycle(self, ledger: Ledger) -> None:
        """The request pipeline's own counts (http/metrics.lifecycle_series)."""
        lifecycle_series(PREFIX, self.registry, ledger)

    def leave(self, key: Key) -> None:
        count = self._in_flight.get(key)
        if count is not None:  # else forgotten (deleted) while the request was in flight
            self._in_flight[key] = count - 1

    def routed(self, key: Key, decision: str) -> None:
        pending = self._routed.get((key, decision))
        if pending is None:
            self.routing.labels(*key, decision)  # the series shows from the first decision
            pending = self._routed[(key, decision)] = [0]
        pending[0] += 1

    def flush_routed(self) -> None:
        for (key, decision), pending in self._routed.items():
            if pending[0]:
                self.routing.labels(*key, decision).inc(pending[0])
                pending[0] = 0

    def forget(self, key: Key) -> None:
        """Drop a deleted ModelServer's series (the labelled children of every metric)."""
        self.series.forget(key)
        for metric in (
            self.in_flight,
            self.held,
            self.hold,
            self.wake,
            self.keepalives,
            self.routing,
            self.upstream_errors,
            self.replicas,
            self.guard_trips,
        ):
            for labels in list(metric._metrics):
                if labels[:2] == key:
                    metric.remove(*labels)
        self._in_flight.pop(key, None)
        for cached in [cached for cached in self._routed if cached[0] == key]:
            del self._routed[cached]

    def render(self) -> bytes:
        return generate_latest(self.registry)
