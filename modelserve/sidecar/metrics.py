"""The sidecar's Prometheus series, and the scrape that appends the engine's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest

from modelserve.contracts import routes
from modelserve.http.metrics import (
    RequestSeries,
    TLSSeries,
    connections_cut,
    flush_on_collect,
    lifecycle_series,
    off_loop_counter,
    refusal_counter,
    status_class,
)
from modelserve.http.pipeline import Ledger

PREFIX = "modelserve_sidecar"

# Route labels are the consumer routes (plus "other"), so arbitrary paths cannot blow up cardinality.
KNOWN_ROUTES = routes.ALLOWED_PATHS


def route_label(path: str) -> str:
    return path if path in KNOWN_ROUTES else "other"


class SidecarMetrics:
    def __init__(self) -> None:
        # An own registry: nothing else in the process can add series, and the process series
        # get the prefix so they never collide with the engine's unprefixed process_* series.
        self.registry = CollectorRegistry()
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        r = self.registry
        flush_on_collect(r, self.flush_tokens)  # first: a scrape finds the counters it adds to up to date
        # Tokens counted per request in plain numbers, added to their counters when scraped (each
        # inc() takes a lock and several calls).
        self._tokens = [0, 0]  # prompt, completion
        self.series = RequestSeries(
            PREFIX,
            ["route"],
            (
                "Proxied requests by route and status class (client_closed: the client went away first).",
                "Time from request to last byte.",
                "Time from request to the first body byte sent back (for streams: time to first token).",
            ),
            r,
        )
        self.in_flight = Gauge(f"{PREFIX}_in_flight_requests", "Proxied requests being served now.", registry=r)
        self.drain_waiting = Gauge(
            f"{PREFIX}_drain_waiting_requests",
            "Requests waiting on /drained: the engine's preStop, while a deleted pod's sidecar drains.",
            registry=r,
        )
        self.auth_failures = Counter(
            f"{PREFIX}_auth_failures",
            "Refused requests by reason (missing, malformed, invalid).",
            ["reason"],
            registry=r,
        )
        self.refused = refusal_counter(PREFIX, r)
        self.read_off_loop = off_loop_counter(PREFIX, r)
        connections_cut(PREFIX, r)
        self.tls = TLSSeries(PREFIX, r)
        self.upstream_errors = Counter(
            f"{PREFIX}_upstream_errors",
            "Failures talking to the engine by kind (connect, disconnected, timeout, status_5xx, metrics).",
            ["kind"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens reported in responses' usage.", registry=r
        )
        self.completion_tokens = Counter(
            f"{PREFIX}_completion_tokens", "Completion tokens reported in responses' usage.", registry=r
        )
        self.warmups = Counter(
            f"{PREFIX}_warmup_requests",
            "Warm-up requests sent after the engine first became ready (not in requests_total).",
            ["outcome"],
            registry=r,
        )
        self.warmup_duration = Gauge(f"{PREFIX}_warmup_duration_seconds", "Latency of the warm-up request.", registry=r)
        # Only for a ModelServer with adapters, labelled by the served name or an adapter's name.
        self.model_requests = Counter(
            f"{PREFIX}_model_requests",
            "With spec.adapters only: proxied requests by model (the base's served name or an adapter's name) "
            "and status class.",
            ["model", "status_class"],
            registry=r,
        )
        self.model_tokens = Counter(
            f"{PREFIX}_model_tokens",
            "With spec.adapters only: tokens reported in responses' usage, by model (base or adapter) and kind "
            "(prompt, completion).",
            ["model", "kind"],
            registry=r,
        )
        # Label lookups take a lock and hash a tuple; the hot path reuses resolved children.
        self._model_children: dict[tuple[str, str], Counter] = {}
        self._token_children: dict[str, tuple[Counter, Counter]] = {}

    def observe(self, route: str, status_label: str, duration: float, ttfb: float | None) -> None:
        self.series.observe((route,), status_label, duration, ttfb)

    def count_usage(self, counts: tuple[int, int] | None) -> None:
        if counts is not None:
            tokens = self._tokens
            tokens[0] += counts[0]
            tokens[1] += counts[1]

    def lifecycle(self, ledger: Ledger) -> None:
        """The request pipeline's own counts (http/metrics.lifecycle_series)."""
        lifecycle_series(PREFIX, self.registry, ledger)

    def flush_tokens(self) -> None:
        prompt, completion = self._tokens
        if prompt:
            self.prompt_tokens.inc(prompt)
        if completion:
            self.completion_tokens.inc(completion)
        self._tokens[:] = [0, 0]

    def count_model(self, model: str, status: int, counts: tuple[int, int] | None) -> None:
        label = status_class(status)
        requests = self._model_children.get((model, label))
        if requests is None:
            requests = self._model_children[(model, label)] = self.model_requests.labels(model, label)
        requests.inc()
        if counts is not None:
            tokens = self._token_children.get(model)
            if tokens is None:
                tokens = self._token_children[model] = (
                    self.model_tokens.labels(model, "prompt"),
                    self.model_tokens.labels(model, "completion"),
                )
            tokens[0].inc(counts[0])
            tokens[1].inc(counts[1])

    def render(self, engine_text: bytes | None) -> bytes:
        own = generate_latest(self.registry)
        if not engine_text:
            return own
        return own + engine_text + (b"" if engine_text.endswith(b"\n") else b"\n")
