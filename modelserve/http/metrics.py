"""What the sidecar's and the gateway's metrics share: histogram buckets, status labels, the format."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from modelserve.contracts import routes

from . import limits, tls

if TYPE_CHECKING:
    from .pipeline import Ledger

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


class _Tally:
    """What one label set counted since the last scrape: requests, and each histogram's observations
    by bucket (the last one +Inf) and their sum."""

    __slots__ = ("children", "duration_buckets", "duration_sum", "requests", "ttfb_buckets", "ttfb_sum")

    def __init__(self, children: tuple[Counter, Histogram, Histogram]) -> None:
        self.children = children
        self.requests = 0
        self.duration_buckets = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.ttfb_buckets = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttfb_sum = 0.0

    def flush(self) -> None:
        requests, duration, ttfb = self.children
        if self.requests:
            requests.inc(self.requests)
            self.requests = 0
        _add(duration, self.duration_buckets, self.duration_sum)
        self.duration_sum = 0.0
        _add(ttfb, self.ttfb_buckets, self.ttfb_sum)
        self.ttfb_sum = 0.0


def _add(histogram: Histogram, buckets: list[int], total: float) -> None:
    """Add tallied observations to a histogram child (prometheus_client's own bucket and sum values:
    its observe() takes one observation at a time), and empty the tally."""
    for i, count in enumerate(buckets):
        if count:
            histogram._buckets[i].inc(count)
            buckets[i] = 0
    if total:
        histogram._sum.inc(total)


class _FlushOnCollect:
    """A collector of no series that calls `flush` whenever its registry is collected."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self.flush = flush

    def collect(self) -> list[object]:
        self.flush()
        return []


class _ConnectionsCut:
    """The connections the bounds cut (limits.CUT), as a counter family read when collected."""

    def __init__(self, prefix: str) -> None:
        self.name = f"{prefix}_connections_cut"

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            self.name,
            "Client connections cut by a bound before any check, by reason (head_too_large, "
            "too_many_fields, head_timeout, body_timeout, no_request, body_budget, too_many_connections, "
            "evicted: closed to make room for a new one; too_many_pipelined: more requests sent ahead of "
            "their answers than a connection may park; send_timeout: an answer its client did not read).",
            labels=["reason"],
        )
        for reason, count in limits.CUT.items():
            family.add_metric([reason], count)
        yield family


def connections_cut(prefix: str, registry: CollectorRegistry) -> None:
    """`<prefix>_connections_cut_total{reason}` in `registry`: what the connection bounds cut."""
    registry.register(_ConnectionsCut(prefix))  # type: ignore[arg-type]  # a collector without describe()


class _Lifecycle:
    """The request pipeline's own counts (pipeline.Ledger), read when collected: what its lifecycle
    rules say must be zero when the proxy is idle, and the rules it saw broken."""

    def __init__(self, prefix: str, ledger: Ledger) -> None:
        self.prefix = prefix
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        ledger, prefix = self.ledger, self.prefix
        yield GaugeMetricFamily(
            f"{prefix}_pipeline_requests_open", "Requests begun and not ended yet.", value=ledger.in_flight
        )
        yield GaugeMetricFamily(
            f"{prefix}_pipeline_upstreams_held", "Upstreams picked for a try and not released yet.", value=ledger.held
        )
        broken = CounterMetricFamily(
            f"{prefix}_pipeline_rules_broken",
            "Request lifecycle rules seen broken, by rule (a defect of the proxy, never the client's).",
            labels=["rule"],
        )
        for rule, count in ledger.broken.items():
            broken.add_metric([rule], count)
        yield broken


def lifecycle_series(prefix: str, registry: CollectorRegistry, ledger: Ledger) -> None:
    """`<prefix>_pipeline_requests_open`, `_upstreams_held` and `_rules_broken_total{rule}` in
    `registry`, read from `ledger`."""
    registry.register(_Lifecycle(prefix, ledger))  # type: ignore[arg-type]  # a collector without describe()


def flush_on_collect(registry: CollectorRegistry, flush: Callable[[], None]) -> None:
    """Have every collect (a scrape) call `flush` first: registered before the metrics that `flush`
    adds tallies to, the scrape finds them up to date."""
    registry.register(_FlushOnCollect(flush))  # type: ignore[arg-type]  # a collector without describe()


class RequestSeries:
    """What both proxies count of every request under their own labels: requests by status class,
    the time to the last byte and to the first. Each request is tallied in plain numbers (a bucket
    found by bisection, no lock: the proxies count from one thread) and the tallies go into the
    prometheus metrics when they are collected: prometheus_client's inc() and observe() took a lock
    and several calls each, a tenth of a proxy's CPU per request in profiles."""

    def __init__(
        self,
        prefix: str,
        labels: Sequence[str],
        helps: tuple[str, str, str],
        registry: CollectorRegistry,
    ) -> None:
        requests_help, duration_help, ttfb_help = helps
        flush_on_collect(registry, self.flush)
        self.requests = Counter(f"{prefix}_requests", requests_help, [*labels, "status_class"], registry=registry)
        self.duration = Histogram(
            f"{prefix}_request_duration_seconds", duration_help, labels, buckets=DURATION_BUCKETS, registry=registry
        )
        self.ttfb = Histogram(
            f"{prefix}_time_to_first_byte_seconds", ttfb_help, labels, buckets=TTFT_BUCKETS, registry=registry
        )
        self._tallies: dict[tuple[tuple[str, ...], str], _Tally] = {}

    def observe(self, labels: tuple[str, ...], status_label: str, duration: float, ttfb: float | None) -> None:
        """One finished request: its count by status class, its duration and time to first byte."""
        tally = self._tallies.get((labels, status_label))
        if tally is None:
            children = (
                self.requests.labels(*labels, status_label),
                self.duration.labels(*labels),
                self.ttfb.labels(*labels),
            )
            tally = self._tallies[(labels, status_label)] = _Tally(children)
        tally.requests += 1
        # bisect_left: the first bucket whose bound is >= the value, as prometheus_client's `<=`
        tally.duration_buckets[bisect_left(DURATION_BUCKETS, duration)] += 1
        tally.duration_sum += duration
        if ttfb is not None:
            tally.ttfb_buckets[bisect_left(TTFT_BUCKETS, ttfb)] += 1
            tally.ttfb_sum += ttfb

    def flush(self) -> None:
        for tally in self._tallies.values():
            tally.flush()

    def forget(self, leading: tuple[str, ...]) -> None:
        """Drop every series whose labels start with `leading` (a deleted ModelServer's)."""
        for metric in (self.requests, self.duration, self.ttfb):
            for labels in list(metric._metrics):
                if labels[: len(leading)] == leading:
                    metric.remove(*labels)
        for cached in [cached for cached in self._tallies if cached[0][: len(leading)] == leading]:
            del self._tallies[cached]


OFF_LOOP_OUTCOMES = ("read", "busy", "too_large", "gone")


def off_loop_counter(prefix: str, registry: CollectorRegistry) -> Counter:
    """Bodies read in the off-loop helper (http/off_loop.py), by outcome, every one present from the start."""
    counter = Counter(
        f"{prefix}_bodies_read_off_loop",
        "Request bodies read in a helper process instead of on the event loop, by outcome: bodies of so "
        "many JSON values that reading them would stall the loop, and any body past its owner's share of "
        "the loop (a key's, else a client address's). read; busy: refused 503 server_busy, the helper's "
        "places (or its owner's) taken; too_large: refused 413 too_many_values, past the helper's memory "
        "bound; gone: refused 503, the helper died under it and is replaced.",
        ["outcome"],
        registry=registry,
    )
    for outcome in OFF_LOOP_OUTCOMES:
        counter.labels(outcome)
    return counter


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


class TLSSeries:
    """`<prefix>_tls_reloads_total{outcome}` and `_tls_certificate_expiry_timestamp_seconds`: what the
    server's certificate (http/tls.py) did with each renewal it saw, and when the one served expires."""

    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        self.reloads = Counter(
            f"{prefix}_tls_reloads",
            "Renewed certificate and key files seen while serving HTTPS, by outcome: loaded (served from the "
            "next handshake on); refused (a key that does not match its certificate, an expired certificate, "
            "a file missing or unreadable: the pair before it still served, the reason in the log). Each "
            "worker process counts its own.",
            ["outcome"],
            registry=registry,
        )
        for outcome in tls.OUTCOMES:
            self.reloads.labels(outcome)
        self.expiry = Gauge(
            f"{prefix}_tls_certificate_expiry_timestamp_seconds",
            "When the served certificate (the leaf of its chain) expires, in Unix time; 0 when serving plain HTTP.",
            registry=registry,
        )

    def changed(self, outcome: str | None, pair: tls.Pair) -> None:
        """http/tls.py's `Changed`: from its polling thread (prometheus_client's metrics take a lock)."""
        if outcome is not None:
            self.reloads.labels(outcome).inc()
        self.expiry.set(pair.not_after.timestamp())
