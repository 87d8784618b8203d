"""Versions of one served name (spec.traffic): which one takes a request, by weight, and the guard
that stops sending requests to a version doing worse than the stable ones (pure, but `Guards`'
small state).

The choice is weighted rendezvous hashing on the conversation's prefix: every turn of one chat
lands on the same version (its prefix cache, and one model's voice), and a weight change moves only
the share of conversations it must. Without a prefix the choice is a weighted draw.

The guard compares windows of requests, not of time, so a version with little traffic is judged
on as many answers as a busy one: the last `window` answers of the guarded version against the
last `window` of the stable versions (those of the name without a guard). It trips on either

- the error rate: more failed answers (5xx, the replica unreachable or cut off) among its last
  `window` than `maxErrorRate` of a window allows (judged from the first answer: a version failing
  from its start is stopped after a few requests, not after a window); or
- the p95 time to first byte of its answered requests above `maxTimeToFirstTokenRatio` times the
  stable versions' p95, and above it by `minSlowdownSeconds` at least (both sides see the same mix
  of requests: the split is random per conversation, so a ratio of the same statistic is fair
  without knowing the requests' sizes).

A tripped version gets no new requests until its reset annotation changes; each gateway judges
what it relayed, and the operator writes a trip into the status, which every gateway then obeys.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelserve.contracts.gateway import GUARD_RESET_ANNOTATION, GuardReport
from modelserve.contracts.names import Key

DEFAULT_WEIGHT = 100
MAX_WINDOW = 1000  # the CRD's bound on guard.window: what a stable version keeps for any guard
__all__ = ["DEFAULT_WEIGHT", "GUARD_RESET_ANNOTATION", "Guard", "Guards", "choose", "judge", "tripped_in_status"]


@dataclass(frozen=True)
class Guard:
    window: int = 50
    max_error_rate: float = 0.1
    max_ttft_ratio: float = 2.0
    min_slowdown: float = 0.2  # seconds the p95 must also exceed the stable versions' by

    @classmethod
    def of(cls, spec: Any) -> Guard | None:
        """spec.traffic.guard as the API server stored it (defaults filled in), or None."""
        if not isinstance(spec, Mapping):
            return None
        return cls(
            window=int(spec.get("window", cls.window)),
            max_error_rate=float(spec.get("maxErrorRate", cls.max_error_rate)),
            max_ttft_ratio=float(spec.get("maxTimeToFirstTokenRatio", cls.max_ttft_ratio)),
            min_slowdown=float(spec.get("minSlowdownSeconds", cls.min_slowdown)),
        )


@dataclass(frozen=True)
class Outcome:
    at: float  # when it ended (monotonic): orders the stable versions' answers together
    ttfb: float | None  # seconds to the first byte of the answer; None when it failed before one
    failed: bool


def tripped_in_status(status: Mapping[str, Any], reset: str) -> bool:
    """Whether the status says the guard tripped, under the reset annotation's current value
    (a reset since makes that trip history)."""
    guard = status.get("guard")
    return isinstance(guard, Mapping) and guard.get("tripped") is True and (guard.get("reset") or "") == reset


def _unit(prefix: bytes, version: Key) -> float:
    """A uniform number in (0, 1) for a (conversation, version) pair."""
    digest = hashlib.blake2b(prefix + b"\x1f" + "/".join(version).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 1) / (2**64 + 1)


def choose(versions: Sequence[Any], prefix: bytes | None, rng: random.Random) -> Any | None:
    """The version (a directory Model) to take a request, among those with a weight above 0; None
    when none has. Weighted rendezvous hashing on the prefix, or a weighted draw without one."""
    candidates = [v for v in versions if v.weight > 0]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    if prefix is None:
        return rng.choices(candidates, weights=[v.weight for v in candidates])[0]
    # The highest weight / -ln(u) wins: each version wins with probability weight / total.
    return max(candidates, key=lambda v: v.weight / -math.log(_unit(prefix, v.key)))


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile (nearest rank), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def judge(guard: Guard, own: Sequence[Outcome], stable: Sequence[Outcome]) -> GuardReport | None:
    """The guard's verdict: a report when it trips, else None. Failures count from the first answer
    (more than a window may hold, and no later answer can bring the rate back); the time to first
    byte is judged on full windows only."""
    recent = list(own)[-guard.window :]
    failures = sum(o.failed for o in recent)
    rate = failures / len(recent) if recent else 0.0
    if failures > guard.max_error_rate * guard.window:
        message = (
            f"{failures} of its last {len(recent)} requests failed "
            f"(more than {guard.max_error_rate:.0%} of a window of {guard.window})"
        )
        return GuardReport(message, len(recent), rate, None, None)
    if len(own) < guard.window:
        return None
    own_p95 = p95([o.ttfb for o in recent if o.ttfb is not None and not o.failed])
    stable_recent = sorted(stable, key=lambda o: o.at)[-guard.window :]
    stable_p95 = (
        p95([o.ttfb for o in stable_recent if o.ttfb is not None and not o.failed])
        if len(stable_recent) >= guard.window
        else None
    )
    figures = {"requests": len(recent), "error_rate": rate, "p95_seconds": own_p95, "stable_p95_seconds": stable_p95}
    slower = own_p95 is not None and stable_p95 and own_p95 - stable_p95 >= guard.min_slowdown
    if slower and own_p95 > guard.max_ttft_ratio * stable_p95:
        message = (
            f"p95 time to first byte {own_p95:.2f} s over its last {len(recent)} requests, "
            f"{own_p95 / stable_p95:.1f}x the stable versions' {stable_p95:.2f} s (at most {guard.max_ttft_ratio:g}x)"
        )
        return GuardReport(message=message, **figures)
    return None


@dataclass
class _Trip:
    reset: str  # the reset annotation's value when it tripped
    report: GuardReport


class Guards:
    """The answers of every version of a served name with versions, and the trips they made."""

    def __init__(self, clock=time.monotonic) -> None:
        self._outcomes: dict[Key, deque[Outcome]] = {}
        self._trips: dict[Key, _Trip] = {}
        self._clock = clock

    def record(self, model: Any, versions: Sequence[Any], ttfb: float | None, failed: bool) -> GuardReport | None:
        """One answer of `model` (a version among `versions`); the report if its guard tripped now."""
        self.update(model)
        window = model.guard.window if model.guard else MAX_WINDOW
        outcomes = self._outcomes.get(model.key)
        if outcomes is None or outcomes.maxlen != window:
            outcomes = self._outcomes[model.key] = deque(outcomes or (), maxlen=window)
        outcomes.append(Outcome(self._clock(), ttfb, failed))
        if model.guard is None or model.key in self._trips:
            return None
        stable = [o for v in versions if v.guard is None for o in self._outcomes.get(v.key, ())]
        report = judge(model.guard, outcomes, stable)
        if report is not None:
            self._trips[model.key] = _Trip(model.guard_reset, report)
        return report

    def tripped(self, model: Any) -> bool:
        """Whether `model` gets no new requests: its guard tripped here, or the status says so."""
        self.update(model)
        return model.tripped_in_status or model.key in self._trips

    def reports(self) -> dict[Key, tuple[str, GuardReport]]:
        """The trips this gateway made: (the reset value they were made under, the report)."""
        return {key: (trip.reset, trip.report) for key, trip in self._trips.items()}

    def forget(self, key: Key) -> None:
        self._outcomes.pop(key, None)
        self._trips.pop(key, None)

    def update(self, model: Any) -> None:
        """A version's entry changed: a new reset value clears a trip and the answers it was judged on."""
        trip = self._trips.get(model.key)
        if trip is not None and trip.reset != model.guard_reset:
            self.forget(model.key)
