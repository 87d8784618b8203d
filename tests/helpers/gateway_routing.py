"""Where the gateway routes a request while a long stream holds one replica, judged by the gateway's
own counters rather than the test client's clock: on two busy cores a client reads chunks late,
so a stream that has ended at the gateway can still look alive to it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Quick:
    pod: str  # the replica that answered (the gateway's x-modelserve-replica header)
    beside_long: bool  # the gateway held the long stream from before this request until after it
    decisions: dict[str, float]  # the gateway's routing decisions while it ran, by kind
    errors: dict[str, float]  # the gateway's upstream errors while it ran, by kind
    seconds: float = 0.0  # from sending it to its answer (the report's clue when rounds fall short)

    @property
    def by_policy_beside_long(self) -> bool:
        """Routed while the long stream held its replica, by the policy alone (no failover)."""
        return self.beside_long and self.decisions == {"least_in_flight": 1}


@dataclass
class Round:
    long_pod: str
    quick: list[Quick] = field(default_factory=list)
    long_seconds: float = 0.0  # the long stream, from its first chunk to its end as its client read it


def routed_beside_long_streams(
    gateway: str, long_request: dict[str, Any], quick_request: dict[str, Any], wanted: int = 4, rounds: int = 12
) -> tuple[list[tuple[str, str]], list[Round]]:
    """Rounds of one long stream and quick requests beside it until `wanted` quick ones were routed by
    the policy while it ran: [(the long stream's replica, the quick one's)], and every round."""
    held: list[tuple[str, str]] = []
    seen: list[Round] = []
    for _ in range(rounds):
        this_round = route_beside_a_long_stream(gateway, long_request, quick_request)
        seen.append(this_round)
        held += [(this_round.long_pod, quick.pod) for quick in this_round.quick if quick.by_policy_beside_long]
        if len(held) >= wanted:
            break
    return held, seen


def route_beside_a_long_stream(
    gateway: str, long_request: dict[str, Any], quick_request: dict[str, Any], quick_count: int = 4
) -> Round:
    """One long stream (it holds one replica) and quick requests sent one after another while it
    runs; the long stream is cut once they are done."""
    model = long_request["model"]
    seen: dict[str, Any] = {}
    first_chunk, ended, release = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=long_request, timeout=300) as answer:
            seen["pod"] = answer.headers["x-modelserve-replica"]
            for _ in answer.iter_raw():
                if not first_chunk.is_set():
                    seen["first"] = time.monotonic()
                first_chunk.set()
                if release.is_set():
                    break
        seen["seconds"] = round(time.monotonic() - seen.get("first", time.monotonic()), 3)
        ended.set()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    quick: list[Quick] = []
    try:
        assert first_chunk.wait(120), "the long stream never started"
        for _ in range(quick_count):
            if ended.is_set():
                break
            before = gateway_counters(gateway, model)
            sent = time.monotonic()
            answer = httpx.post(f"{gateway}/v1/chat/completions", json=quick_request, timeout=120)
            seconds = round(time.monotonic() - sent, 3)
            assert answer.status_code == 200, answer.text
            # The gateway counts a request once it has ended there (in the step that sends its last
            # bytes): one more ended and one still in flight mean the long stream outlasted this one.
            after = counted_after(gateway, model, finished(before))
            quick.append(
                Quick(
                    answer.headers["x-modelserve-replica"],
                    in_flight(before) == 1 and finished(after) == finished(before) + 1 and in_flight(after) == 1,
                    rises(before, after, "modelserve_gateway_routing_decisions_total", "decision"),
                    rises(before, after, "modelserve_gateway_upstream_errors_total", "kind"),
                    seconds,
                )
            )
    finally:
        release.set()
        holder.join(timeout=300)
    return Round(seen["pod"], quick, seen.get("seconds", 0.0))


def gateway_counters(gateway: str, model: str) -> dict[str, float]:
    """The gateway's /metrics samples for `model`, by their whole series line."""
    samples = {}
    for line in httpx.get(f"{gateway}/metrics", timeout=10).text.splitlines():
        if not line.startswith("#") and f'model="{model}"' in line:
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    return samples


def gateway_replicas(gateway: str, model: str) -> float:
    """The gateway's own count of the replicas it routes `model` to."""
    for series, value in gateway_counters(gateway, model).items():
        if series.startswith("modelserve_gateway_ready_replicas{"):
            return value
    return 0.0


def rises(before: dict[str, float], after: dict[str, float], metric: str, label: str) -> dict[str, float]:
    """How much each `label` value of counter `metric` rose between two samples (pure)."""
    risen = {}
    for series, value in after.items():
        if series.startswith(metric + "{") and value > before.get(series, 0.0):
            risen[series.split(f'{label}="', 1)[1].split('"', 1)[0]] = value - before.get(series, 0.0)
    return risen


def counted_after(gateway: str, model: str, ended_before: float) -> dict[str, float]:
    """The gateway's samples once it counts more ended requests than `ended_before` (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        samples = gateway_counters(gateway, model)
        if finished(samples) > ended_before:
            return samples
        time.sleep(0.1)
    raise TimeoutError("the gateway never counted the quick request")


def finished(samples: dict[str, float]) -> float:
    """Requests the gateway has ended, of any status (pure)."""
    return sum(value for series, value in samples.items() if series.startswith("modelserve_gateway_requests_total{"))


def in_flight(samples: dict[str, float]) -> float:
    """Requests the gateway holds at replicas now (pure)."""
    return sum(
        value for series, value in samples.items() if series.startswith("modelserve_gateway_in_flight_requests{")
    )
