"""A fair share of a busy engine: at most `capacity` requests reach it at once; the others wait here,
one queue per key name, and as slots free up the queues are served in turn (a key with weight w takes
w requests per turn). A key that floods lengthens its own queue, not the others' wait: a new key's
request waits for at most one turn of each other waiting key.

The capacity is the ModelServer's `replicas.targetPerReplica`, the requests one replica serves at full
speed (what the autoscaler already scales on): past it an engine only queues them itself, first come
first served, where no key can be told apart. Requests waiting here are still in flight for /load,
so the autoscaler sees the real queue."""

from __future__ import annotations

import asyncio
from collections import deque


class FairShare:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # 0: no bound (requests reach the engine as they come)
        self.busy = 0  # requests holding a slot
        self.queues: dict[str, deque[asyncio.Future[None]]] = {}
        self.weights: dict[str, int] = {}
        self.turns: deque[str] = deque()  # names with requests waiting, the one served first at the left
        self.credit = 0  # requests the name at the left may still take in its turn

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def waiting_for(self, name: str) -> int:
        queue = self.queues.get(name)
        return len(queue) if queue else 0

    def take_now(self) -> bool:
        """A slot at once (True), if one is free and nobody waits for one."""
        if self.capacity and (self.busy >= self.capacity or self.turns):
            return False
        self.busy += 1
        return True

    async def take(self, name: str, weight: int, gone: asyncio.Future[None], timeout: float) -> bool:
        """Wait in `name`'s queue for a slot: True once it holds one; False when the client went away
        or `timeout` seconds passed first (then it holds none)."""
        granted = asyncio.get_running_loop().create_future()
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = deque()
            self.turns.append(name)
            if len(self.turns) == 1:
                self.credit = weight
        self.weights[name] = weight
        queue.append(granted)
        # Slots may have freed since `take_now` said no (the express lane hands a waiting request to
        # a task, which starts later): hand them out now, or nobody would until the next release.
        self._grant()
        try:
            await asyncio.wait_for(asyncio.wait((granted, gone), return_when=asyncio.FIRST_COMPLETED), timeout)
        except TimeoutError:
            pass
        except BaseException:  # cancelled (the client went away, the server stops)
            if granted.done() and not granted.cancelled():
                self.release()  # granted as it was cancelled: nobody will give it back
            else:
                granted.cancel()
                self._leave(name, granted)
            raise
        if not granted.done():
            granted.cancel()
            self._leave(name, granted)
            return False
        return True

    def release(self) -> None:
        """A slot given back (its request ended): the next turn's request takes it."""
        self.busy -= 1
        self._grant()

    def _grant(self) -> None:
        while self.turns and (not self.capacity or self.busy < self.capacity):
            name = self.turns[0]
            queue = self.queues[name]
            granted = queue.popleft()
            self.busy += 1
            granted.set_result(None)
            self.credit -= 1
            if not queue:
                self._drop(name)
            elif self.credit <= 0:
                self.turns.rotate(-1)
                self.credit = self.weights[self.turns[0]]

    def _leave(self, name: str, granted: asyncio.Future[None]) -> None:
        queue = self.queues.get(name)
        if queue is None:
            return
        try:
            queue.remove(granted)
        except ValueError:
            return
        if not queue:
            self._drop(name)

    def _drop(self, name: str) -> None:
        """`name` has nobody waiting: out of the turns (the next in turn starts with its full weight)."""
        first = self.turns[0] == name
        self.turns.remove(name)
        del self.queues[name]
        del self.weights[name]
        if first and self.turns:
            self.credit = self.weights[self.turns[0]]
