"""Requests held while their ModelServer has no ready replica (at zero, or all replicas restarting).

A held request waits on its ModelServer's wake-up future, which the directory resolves when a
replica turns Ready; the count of held requests is what the gateway publishes (HELD_ROUTE) and
the operator's autoscaler counts as demand, so the first request to a sleeping model is what wakes
it. Bounded per ModelServer (then 429) and in time (then 503 with Retry-After); a client that
hangs up leaves the queue at once.

Requests for a private model whose key the gateway has not seen open it (keys.py) wait in a small
share of their own, per model and per client address: anyone can send a made-up key, and those
must neither take the verified users' places nor hold many models awake. They are still demand
(a new key can only be checked by a replica), so `held()` counts both.

Each wake is timed here (cold_starts.py), from the first request held to the first ready replica:
what the gateway tells the clients it turns away about when to come back.

With several workers (http/workers.py) the bounds per model are the pod's: each worker publishes its
counts per model (http/shared_rows.py) and adds the others' when it admits one more. The bound per
client stays each worker's share of it (client addresses are anyone's to make up: no shared table
of them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from modelserve.contracts.names import Key
from modelserve.http.shared_rows import Names, SharedRows

from .cold_starts import ColdStarts

# Per worker, the models with requests held at once whose counts the others see (an entry is freed
# when its model holds none): past it, a model's bound is checked on this worker's counts alone.
MAX_HELD_MODELS = 1024
SHARED_WIDTH = Names.width(MAX_HELD_MODELS, 2)  # a model's held requests, and the unverified ones


def shared_counts(rows: SharedRows, own: int) -> Names:
    """This worker's counts of held requests by model, and its siblings'."""
    return Names(rows, own, 0, MAX_HELD_MODELS, 2)


class Outcome(Enum):
    READY = "ready"  # a replica is ready: route the request
    TIMEOUT = "timeout"
    FULL = "full"
    GONE = "client_gone"


class Holding:
    def __init__(
        self,
        max_held: int,
        on_count: Callable[[Key, int], None] = lambda key, count: None,
        max_unverified: int = 8,
        max_unverified_per_client: int = 2,
        cold_starts: ColdStarts | None = None,
        on_woken: Callable[[Key, float], None] = lambda key, seconds: None,
        clock: Callable[[], float] = time.monotonic,
        shared: Names | None = None,
    ) -> None:
        self.max_held = max_held
        self.on_count = on_count  # the held-requests gauge
        self.max_unverified = max_unverified
        self.max_unverified_per_client = max_unverified_per_client
        self._held: dict[Key, int] = {}  # every held request, verified or not
        self._unverified: dict[Key, int] = {}
        self._clients: dict[str, int] = {}  # unverified requests held per client, whatever their model
        self._wake: dict[Key, asyncio.Future[None]] = {}
        self.cold_starts = cold_starts or ColdStarts()
        self.on_woken = on_woken  # the wake-time histogram
        self.clock = clock
        self.shared = shared  # the other workers' counts by model (None: one process)

    def held(self) -> dict[Key, int]:
        return {key: count for key, count in self._held.items() if count}

    def count(self, key: Key) -> int:
        return self._held.get(key, 0)

    def wake(self, key: Key) -> None:
        """A replica of `key` turned ready: every request held for it goes on."""
        woke_in = self.cold_starts.ready(key, self.clock())
        if woke_in is not None:
            self.on_woken(key, woke_in)
        self._release(key)

    def forget(self, key: Key) -> None:
        """`key` was deleted: every request held for it goes on (to find it gone)."""
        self.cold_starts.forget(key)
        self._release(key)

    def retry_after(self, key: Key, fallback: float, last_start: float | None = None) -> int:
        """When a client turned away should come back (cold_starts.retry_after_seconds)."""
        return self.cold_starts.retry_after(key, self.clock(), fallback, last_start)

    def _release(self, key: Key) -> None:
        future = self._wake.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def admits(self, key: Key, unverified_from: str | None = None) -> bool:
        """Whether one more request for `key` may wait: a verified one (None) within `max_held` of
        its kind, an unverified one (from that client) within both of its shares."""
        held, unverified = self._held.get(key, 0), self._unverified.get(key, 0)
        for theirs in (self.shared.elsewhere(_name(key)) if self.shared is not None else None) or ():
            held, unverified = held + theirs[0], unverified + theirs[1]
        if unverified_from is None:
            return held - unverified < self.max_held
        return (
            unverified < self.max_unverified and self._clients.get(unverified_from, 0) < self.max_unverified_per_client
        )

    async def wait(
        self, key: Key, timeout: float, disconnected: asyncio.Future[Any], unverified_from: str | None = None
    ) -> Outcome:
        """Wait until `wake(key)`, `timeout` seconds, or the client's disconnect, whichever first.
        `unverified_from`: the client (http/limits.client_bucket) of a request held in the unverified share."""
        if not self.admits(key, unverified_from):
            return Outcome.FULL
        future = self._wake.get(key)
        if future is None or future.done():
            future = self._wake[key] = asyncio.get_running_loop().create_future()
        self._held[key] = self._held.get(key, 0) + 1
        self.cold_starts.held(key, self.clock())
        if unverified_from is not None:
            _add(self._unverified, key, 1)
            _add(self._clients, unverified_from, 1)
        self._counted(key)
        try:
            # asyncio.wait cancels nothing: the future others wait on outlives this request's timeout.
            done, _ = await asyncio.wait((future, disconnected), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if unverified_from is not None:
                _add(self._unverified, key, -1)
                _add(self._clients, unverified_from, -1)
            self._held[key] -= 1
            self._counted(key)
            if not self._held[key]:
                del self._held[key]
                self.cold_starts.unheld(key, self.clock())
        if disconnected in done:
            return Outcome.GONE
        return Outcome.READY if done else Outcome.TIMEOUT

    def _counted(self, key: Key) -> None:
        """`key`'s count changed: the gauge, and the other workers' view of it."""
        held = self._held[key]
        self.on_count(key, held)
        if self.shared is not None:
            if held:
                self.shared.publish(_name(key), (held, self._unverified.get(key, 0)))
            else:
                self.shared.forget(_name(key))


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def _add(counts: dict[Any, int], name: Any, step: int) -> None:
    """Count up or down, keeping no zero entries (clients and models come and go)."""
    count = counts.get(name, 0) + step
    if count:
        counts[name] = count
    else:
        counts.pop(name, None)
