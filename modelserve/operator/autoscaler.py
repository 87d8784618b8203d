"""Replicas that follow demand: the pure decision, from samples of load to a replica count.

    recommendation = clamp(ceil(demand / target - tolerance) + (buffer if active else 0), min, max)

`demand` is the requests in flight across the ModelServer's pods plus those held waiting for a
replica; `active` means a request arrived within the idle window (or one is in flight or held).
Up: at once, to the recommendation (pods still loading count as replicas, so a burst is not
answered twice). Down: only to the highest recommendation seen over the scale-down delay, at most
halving per step, never while a replica is still loading, and never before this process has
watched a whole delay (after a restart it knows nothing of the minutes before). With `min: 0` an
idle ModelServer reaches zero: buffer replicas do not keep it awake, and while it is active one
replica stays whatever the buffer (`replicas.idleWindowSeconds` keeps the last replica; without it,
requests a few seconds apart would each pay a cold start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Policy:
    min: int
    buffer: int
    max: int
    target: float  # requests in flight one replica serves at full speed
    scale_down_delay: float  # seconds of lower recommendations before replicas go
    idle_window: float  # seconds without a request before the buffer is let go
    tolerance: float = 0.1  # demand up to 10% over target per replica takes no extra replica


@dataclass(frozen=True)
class Load:
    at: float  # seconds, monotonic
    in_flight: float  # across the pods
    held: float = 0.0  # requests waiting for a replica (a gateway's queue)
    last_request_at: float | None = None  # the latest arrival seen
    loading: int = 0  # replicas not ready yet: never a reason to scale down


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str  # "ScaleUp", "ScaleDown", "Steady"
    message: str


@dataclass(frozen=True)
class History:
    """What the decision remembers: when it started watching, and its recent recommendations."""

    since: float
    recommendations: tuple[tuple[float, int], ...] = field(default=())


def is_active(policy: Policy, load: Load) -> bool:
    if load.in_flight > 0 or load.held > 0:
        return True
    return load.last_request_at is not None and load.at - load.last_request_at < policy.idle_window


def recommendation(policy: Policy, load: Load) -> int:
    demand = load.in_flight + load.held
    needed = max(0, math.ceil(demand / policy.target - policy.tolerance))
    if demand > 0:
        needed = max(needed, 1)
    active = is_active(policy, load)
    # Active, the last replica stays for the idle window even with min 0 and buffer 0.
    wanted = max(needed + (policy.buffer if active else 0), 1 if active else 0)
    return max(policy.min, min(policy.max, wanted))


def decide(policy: Policy, history: History, load: Load, current: int) -> tuple[Decision, History]:
    """The replica count for now, given the current one (pods loading included)."""
    wanted = recommendation(policy, load)
    kept = tuple((at, r) for at, r in history.recommendations if at > load.at - policy.scale_down_delay)
    history = History(history.since, (*kept, (load.at, wanted)))
    demand = f"{load.in_flight:g} in flight" + (f", {load.held:g} held" if load.held else "")
    per = f"{policy.target:g} per replica"
    if current > policy.max:  # the ceiling was lowered: no delay
        return Decision(policy.max, "ScaleDown", f"{current} -> {policy.max} replicas: replicas.max"), history
    if wanted > current:
        return Decision(wanted, "ScaleUp", f"{current} -> {wanted} replicas: {demand}, {per}"), history
    highest = max(r for _, r in history.recommendations)
    watched_long_enough = load.at - history.since >= policy.scale_down_delay
    target = max(highest, current // 2, policy.min)
    if target < current and watched_long_enough and not load.loading:
        message = f"{current} -> {target} replicas: at most {highest} wanted over {policy.scale_down_delay:g} s"
        return Decision(target, "ScaleDown", f"{message} ({demand})"), history
    return Decision(max(current, policy.min), "Steady", f"{current} replicas: {demand}, {per}"), history
