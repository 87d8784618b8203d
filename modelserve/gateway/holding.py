"""Requests held while their ModelServer has no ready replica (at zero, or all replicas restarting).

A held request waits on its ModelServer's wake-up future, which the directory resolves when a
replica turns Ready; the count of held requests is what the gateway publishes (HELD_ROUTE) and
the operator's autoscaler counts as demand, so the first request to a sleeping model is what wakes
it. Bounded per ModelServer (then 429) and in time (then 503 with Retry-After); a client that
hangs up leaves the queue at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import Enum
from typing import Any

from modelserve.contracts.names import Key


class Outcome(Enum):
    READY = "ready"  # a replica is ready: route the request
    TIMEOUT = "timeout"
    FULL = "full"
    GONE = "client_gone"


class Holding:
    def __init__(self, max_held: int, on_count: Callable[[Key, int], None] = lambda key, count: None) -> None:
        self.max_held = max_held
        self.on_count = on_count  # the held-requests gauge
        self._held: dict[Key, int] = {}
        self._wake: dict[Key, asyncio.Future[None]] = {}

    def held(self) -> dict[Key, int]:
        return {key: count for key, count in self._held.items() if count}

    def count(self, key: Key) -> int:
        return self._held.get(key, 0)

    def wake(self, key: Key) -> None:
        """A replica of `key` turned ready: every request held for it goes on."""
        future = self._wake.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, key: Key, timeout: float, disconnected: asyncio.Future[Any]) -> Outcome:
        """Wait until `wake(key)`, `timeout` seconds, or the client's disconnect, whichever first."""
        if self._held.get(key, 0) >= self.max_held:
            return Outcome.FULL
        future = self._wake.get(key)
        if future is None or future.done():
            future = self._wake[key] = asyncio.get_running_loop().create_future()
        self._held[key] = self._held.get(key, 0) + 1
        self.on_count(key, self._held[key])
        try:
            # asyncio.wait cancels nothing: the future others wait on outlives this request's timeout.
            done, _ = await asyncio.wait((future, disconnected), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._held[key] -= 1
            self.on_count(key, self._held[key])
            if not self._held[key]:
                del self._held[key]
        if disconnected in done:
            return Outcome.GONE
        return Outcome.READY if done else Outcome.TIMEOUT
