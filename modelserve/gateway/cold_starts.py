"""What this gateway has seen of each ModelServer's wakes, and the Retry-After it tells from them.

A wake is timed from the first request held while the model had no ready replica to its first
ready replica: what a client at zero waits. The last few are kept per model (bounded; a deleted
model's go with it), and a client turned away while the model wakes (429 `hold_queue_full`, or 503
`model_starting` once its hold timed out) is told to come back when the wake should be over:

    Retry-After = the recent median wake - how long this wake has lasted; once past the median,
                  the recent longest - how long it has lasted; at least 1 s.
    With no wake seen yet: the model's last replica start as the operator measured it (its status'
    lastStart), less how long this wake has lasted. Without either, or a wake already longer than
    every estimate: the fixed value.

A wake nobody waits for (its held requests all left) is given up after `give_up_after` seconds
without one: the gateway cannot tell a pod still loading from one that never started, and a stale
start would be taken for a wake of hours.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from modelserve.contracts.names import Key


def retry_after_seconds(
    observed: Sequence[float], waking_for: float | None, fallback: float, last_start: float | None = None
) -> int:
    """Whole seconds until the model should be up, by its recent wakes `observed` (else its last start
    as the operator measured it, `last_start`) and how long this one has lasted (`waking_for`; None:
    none is in progress), or `fallback` without an estimate (pure)."""
    estimates = (statistics.median(observed), max(observed)) if observed else (last_start,) if last_start else ()
    waited = waking_for or 0.0
    for estimate in estimates:
        if estimate > waited:
            return max(1, math.ceil(estimate - waited))
    return max(1, math.ceil(fallback))


@dataclass
class _Wake:
    since: float  # the first request held for it
    left: float | None = None  # when its last held request left (None: one is held now)


class ColdStarts:
    """Each model's wake in progress and its last `keep` wakes, in seconds. Every method takes the
    time (`now`, a monotonic clock) from its caller, so that the rules are tested without waiting."""

    def __init__(self, keep: int = 5, give_up_after: float = 600.0) -> None:
        self.keep = keep
        self.give_up_after = give_up_after
        self._waking: dict[Key, _Wake] = {}
        self._observed: dict[Key, deque[float]] = {}

    def held(self, key: Key, now: float) -> None:
        """A request is held for `key` (it has no ready replica): its wake starts, or goes on."""
        wake = self._waking.get(key)
        if wake is None or self._given_up(wake, now):
            self._waking[key] = _Wake(now)
        else:
            wake.left = None

    def unheld(self, key: Key, now: float) -> None:
        """The last request held for `key` left (answered, timed out or gone); its wake goes on."""
        wake = self._waking.get(key)
        if wake is not None and wake.left is None:
            wake.left = now

    def ready(self, key: Key, now: float) -> float | None:
        """A replica of `key` is ready: the wake in progress, if any, in seconds (kept)."""
        wake = self._waking.pop(key, None)
        if wake is None or self._given_up(wake, now):
            return None
        seconds = now - wake.since
        self._observed.setdefault(key, deque(maxlen=self.keep)).append(seconds)
        return seconds

    def forget(self, key: Key) -> None:
        """`key` was deleted: a ModelServer of the same name later starts afresh."""
        self._waking.pop(key, None)
        self._observed.pop(key, None)

    def observed(self, key: Key) -> list[float]:
        """The last wakes of `key`, oldest first."""
        return list(self._observed.get(key, ()))

    def waking_for(self, key: Key, now: float) -> float | None:
        """How long the wake of `key` in progress has lasted; None when none is."""
        wake = self._waking.get(key)
        if wake is None or self._given_up(wake, now):
            return None
        return now - wake.since

    def retry_after(self, key: Key, now: float, fallback: float, last_start: float | None = None) -> int:
        return retry_after_seconds(self.observed(key), self.waking_for(key, now), fallback, last_start)

    def _given_up(self, wake: _Wake, now: float) -> bool:
        return wake.left is not None and now - wake.left > self.give_up_after
