"""Usage by key name, as Prometheus series: requests, prompt and completion tokens, refusals, and the
requests in flight and waiting now. Counted in plain numbers on the hot path and read when scraped.
Only configured names are ever counted (an unknown key is refused before it has a name), so the
series are bounded by the Secret's entries."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "modelserve_sidecar_key"


class KeyUsage(Collector):
    def __init__(
        self,
        model: str,
        in_flight: Callable[[str], int],
        waiting: Callable[[str], int],
        registry: CollectorRegistry,
    ) -> None:
        self.model = model  # the served name: every series carries it, to sum across ModelServers
        self.in_flight = in_flight
        self.waiting = waiting
        self.counts: dict[str, list[int]] = {}  # name -> [requests, prompt tokens, completion tokens]
        self.refusals: dict[tuple[str, str], int] = {}  # (name, reason) -> refused requests
        registry.register(self)

    def started(self, name: str) -> None:
        counts = self.counts.get(name)
        if counts is None:
            counts = self.counts[name] = [0, 0, 0]
        counts[0] += 1

    def used(self, name: str, usage: tuple[int, int] | None) -> None:
        if usage is not None:
            counts = self.counts[name]
            counts[1] += usage[0]
            counts[2] += usage[1]

    def refused(self, name: str, reason: str) -> None:
        self.refusals[(name, reason)] = self.refusals.get((name, reason), 0) + 1

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        model = self.model
        requests = CounterMetricFamily(
            f"{PREFIX}_requests", "Requests admitted, by key name and model.", labels=["key", "model"]
        )
        tokens = CounterMetricFamily(
            f"{PREFIX}_tokens",
            "Tokens the engine reported, by key name, model and kind (prompt, completion).",
            labels=["key", "model", "kind"],
        )
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_in_flight_requests", "Requests being served now, by key name and model.", labels=["key", "model"]
        )
        waiting = GaugeMetricFamily(
            f"{PREFIX}_waiting_requests",
            "Requests waiting for their turn at a busy engine, by key name and model.",
            labels=["key", "model"],
        )
        for name, (count, prompt, completion) in list(self.counts.items()):
            requests.add_metric([name, model], count)
            tokens.add_metric([name, model, "prompt"], prompt)
            tokens.add_metric([name, model, "completion"], completion)
            in_flight.add_metric([name, model], self.in_flight(name))
            waiting.add_metric([name, model], self.waiting(name))
        refusals = CounterMetricFamily(
            f"{PREFIX}_refusals",
            "Requests refused over a key's limit, by key name, model and reason "
            "(in_flight, requests_per_minute, tokens_per_minute, engine_busy).",
            labels=["key", "model", "reason"],
        )
        for (name, reason), count in list(self.refusals.items()):
            refusals.add_metric([name, model, reason], count)
        yield from (requests, tokens, in_flight, waiting, refusals)
