"""Each named key's use against its limits (contracts/key_entries.py): requests in flight, requests and
tokens over the last minute. Pure: the clock is passed in.

The minute is a sliding window of one-second buckets, so a key's state is at most 60 buckets per
measure whatever its traffic, and a refusal can say when the window will have room again.

With several workers (http/workers.py), each publishes its counts per name (pod_counts.py) and adds
the others' to its own when it checks: the pod's use, as with one process. A worker's minute counts
are published as they change and again each second (`publish_all`), as its oldest buckets expire."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from modelserve.contracts.key_entries import KeyEntry
from modelserve.http.workers import share

from .pod_counts import NONE, KeyCounts, PodCounts

WINDOW_SECONDS = 60
# Over maxInFlight, a request of the key's own must end first, and when is not known: a second is the
# wait told (clients that retry on 429 wait for Retry-After, or back off from half a second).
IN_FLIGHT_RETRY_SECONDS = 1.0

# Why a key's request is refused: the metrics label, and what the client is told.
IN_FLIGHT = "in_flight"
REQUESTS_PER_MINUTE = "requests_per_minute"
TOKENS_PER_MINUTE = "tokens_per_minute"


class Window:
    """Amounts over the last WINDOW_SECONDS, in one-second buckets."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()  # [second, amount], oldest first
        self.total = 0

    def _expire(self, now: float) -> None:
        horizon = int(now) - WINDOW_SECONDS
        buckets = self.buckets
        while buckets and buckets[0][0] <= horizon:
            self.total -= buckets.popleft()[1]

    def add(self, now: float, amount: int) -> None:
        self._expire(now)
        second = int(now)
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += amount
        else:
            self.buckets.append([second, amount])
        self.total += amount

    def sum(self, now: float) -> int:
        self._expire(now)
        return self.total

    def room_after(self, now: float, limit: int) -> float:
        """Seconds until the window's sum falls below `limit` (as its oldest buckets leave it)."""
        self._expire(now)
        total = self.total
        for second, amount in self.buckets:
            total -= amount
            if total < limit:
                return second + WINDOW_SECONDS - now
        return 0.0


@dataclass
class KeyUse:
    in_flight: int = 0
    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)


class KeyLimiter:
    """The use of every configured key name (an unknown name never gets state here). With `pod`, one
    worker's: its use plus the other workers' (or, for a name the shared rows have no room for, its
    `workers` share of each limit)."""

    def __init__(self, pod: PodCounts | None = None, workers: int = 1) -> None:
        self.uses: dict[str, KeyUse] = {}
        self.pod = pod
        self.workers = workers

    def use(self, name: str) -> KeyUse:
        use = self.uses.get(name)
        if use is None:
            use = self.uses[name] = KeyUse()
        return use

    def in_flight(self, name: str) -> int:
        """Read when scraped: no state made for a name that has none (or was forgotten)."""
        use = self.uses.get(name)
        return use.in_flight if use is not None else 0

    def refusal(self, entry: KeyEntry, now: float, replicas: int = 1) -> tuple[str, float | None] | None:
        """(why, seconds until it may pass or None if unknown) when `entry` is over this replica's
        share of a limit (1/`replicas` of it, rounded up), else None."""
        limits = entry.limits
        if not limits.limited:
            return None
        use = self.use(entry.name)
        theirs = self.pod.elsewhere(entry.name) if self.pod is not None else NONE
        if theirs is None:  # not shared: this worker's part of the pod's share
            theirs, replicas = NONE, replicas * self.workers
        if limits.max_in_flight is not None and use.in_flight + theirs.in_flight >= share(
            limits.max_in_flight, replicas
        ):
            return IN_FLIGHT, IN_FLIGHT_RETRY_SECONDS
        if limits.requests_per_minute is not None:
            limit = share(limits.requests_per_minute, replicas)
            if use.requests.sum(now) + theirs.requests >= limit:
                return REQUESTS_PER_MINUTE, _room_after(use.requests, now, limit, theirs.requests)
        if limits.tokens_per_minute is not None:
            limit = share(limits.tokens_per_minute, replicas)
            if use.tokens.sum(now) + theirs.tokens >= limit:
                return TOKENS_PER_MINUTE, _room_after(use.tokens, now, limit, theirs.tokens)
        return None

    def started(self, name: str, now: float) -> None:
        use = self.use(name)
        use.in_flight += 1
        use.requests.add(now, 1)
        self._publish(name, use, now)

    def finished(self, name: str, tokens: int, now: float) -> None:
        """A request ended: `tokens`, prompt and completion as the engine reported them (0 if it did not)."""
        use = self.use(name)
        use.in_flight -= 1
        if tokens:
            use.tokens.add(now, tokens)
        self._publish(name, use, now)

    def publish_all(self, now: float) -> None:
        """Every name's counts again, as their oldest buckets leave the minute (with `pod` only)."""
        if self.pod is not None:
            for name, use in self.uses.items():
                if use.requests.total or use.tokens.total:
                    self._publish(name, use, now)

    def _publish(self, name: str, use: KeyUse, now: float) -> None:
        if self.pod is not None:
            self.pod.publish(name, KeyCounts(use.in_flight, use.requests.sum(now), use.tokens.sum(now)))

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget the state of names no longer configured (and idle): bounded by the Secret's entries."""
        kept = set(names)
        for name in [n for n, use in self.uses.items() if n not in kept and use.in_flight == 0]:
            del self.uses[name]
            if self.pod is not None:
                self.pod.forget(name)


def _room_after(window: Window, now: float, limit: int, theirs: int) -> float | None:
    """Seconds until this key's window has room, when this worker's buckets alone say it: None when
    other workers hold some of it (theirs leave at times this worker does not know, and a wait too
    long would hold the client back for nothing)."""
    return None if theirs else window.room_after(now, limit)
