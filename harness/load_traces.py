"""Load traces and a replica simulator, for the autoscaler's unit tests and its benchmark.

A trace is requests arriving per second, one value per second. The simulator serves them with
replicas that take `cold_start` seconds to become ready and serve `target` requests at once, each
for `service` seconds; what finds no free slot waits in a queue. A rule maps what it observes
(time, requests in flight or waiting, the last arrival, the current replicas) to a replica count,
called every `period` seconds. Deterministic: the same trace and rule give the same figures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from modelserve.operator.autoscaler import History, Load, Policy, decide

Trace = list[float]
# (now, demand: in flight + waiting, last arrival or None, current replicas) -> replicas
Rule = Callable[[float, float, float | None, int], int]


def burst(seconds: int = 3600, base: float = 0.3, peak: float = 6.0, at: int = 900, length: int = 300) -> Trace:
    return [peak if at <= t < at + length else base for t in range(seconds)]


def ramp(seconds: int = 3600, top: float = 5.0) -> Trace:
    half = seconds / 2
    return [top * (t / half if t < half else (seconds - t) / half) for t in range(seconds)]


def diurnal(seconds: int = 7200, low: float = 0.1, high: float = 4.0) -> Trace:
    """A day in two hours: quiet night, busy afternoon."""
    return [low + (high - low) * (1 - math.cos(2 * math.pi * t / seconds)) / 2 for t in range(seconds)]


def spike_then_idle(seconds: int = 3600, peak: float = 8.0, length: int = 60) -> Trace:
    return [peak if t < length else 0.0 for t in range(seconds)]


def flapping_bait(seconds: int = 3600, low: float = 2.2, high: float = 2.6, every: int = 60) -> Trace:
    """Load that swings around a replica boundary (2.4 req/s x 10 s = 24 in flight = 3 x 8)."""
    return [high if (t // every) % 2 else low for t in range(seconds)]


TRACES: dict[str, Callable[[], Trace]] = {
    "burst": burst,
    "ramp": ramp,
    "diurnal": diurnal,
    "spike then idle": spike_then_idle,
    "flapping bait": flapping_bait,
}


@dataclass(frozen=True)
class Outcome:
    replica_minutes: float  # cost: replicas existing (loading ones too), integrated over time
    waited: int  # requests that found no free slot on arrival
    worst_wait: float  # seconds
    scale_events: int
    timeline: list[tuple[int, int, float]]  # (second, replicas, demand), one per period


def simulate(
    trace: Trace,
    rule: Rule,
    start_replicas: int,
    cold_start: float = 120,
    service: float = 10,
    target: int = 8,
    period: int = 2,
) -> Outcome:
    ready_at: list[float] = [0.0] * start_replicas  # replicas, by when each is ready
    waiting: deque[float] = deque()  # arrival times
    serving: list[float] = []  # end times
    owed = 0.0
    last_arrival: float | None = None
    replica_seconds = waited = events = 0
    worst = 0.0
    timeline: list[tuple[int, int, float]] = []
    for now, rate in enumerate(trace):
        owed += rate
        arrivals = int(owed)
        owed -= arrivals
        if arrivals:
            last_arrival = now
        serving = [end for end in serving if end > now]
        ready = sum(1 for at in ready_at if at <= now)
        free = ready * target - len(serving)
        for _ in range(arrivals):
            if free > 0 and not waiting:
                serving.append(now + service)
                free -= 1
            else:
                waiting.append(now)
                waited += 1
        while waiting and free > 0:
            worst = max(worst, now - waiting.popleft())
            serving.append(now + service)
            free -= 1
        if now % period == 0:
            demand = len(serving) + len(waiting)
            wanted = rule(now, demand, last_arrival, len(ready_at))
            if wanted != len(ready_at):
                events += 1
            if wanted > len(ready_at):
                ready_at += [now + cold_start] * (wanted - len(ready_at))
            elif wanted < len(ready_at):
                ready_at = sorted(ready_at)[:wanted]  # the loading ones go first: they serve nothing
            timeline.append((now, len(ready_at), demand))
        replica_seconds += len(ready_at)
    worst = max([worst, *(len(trace) - at for at in waiting)])
    return Outcome(replica_seconds / 60, waited, worst, events, timeline)


def autoscaler_rule(policy: Policy) -> Rule:
    """The operator's autoscaler as a simulator rule (its history kept between calls)."""
    history = History(since=0.0)

    def rule(now: float, demand: float, last_arrival: float | None, current: int) -> int:
        nonlocal history
        decision, history = decide(policy, history, Load(now, demand, 0.0, last_arrival), current)
        return decision.replicas

    return rule
