"""A fair share of a busy engine: at most `capacity` requests reach it at once; the others wait here,
one queue per key name, and as slots free up the queues are served in turn (a key with weight w takes
w requests per turn). A key that floods lengthens its own queue, not the others' wait: a new key's
request waits for at most one turn of each other waiting key.

The capacity is the ModelServer's `replicas.targetPerReplica`, the requests one replica serves at full
speed (what the autoscaler already scales on): past it an engine only queues them itself, first come
first served, where no key can be told apart. Requests waiting here are still in flight for /load,
so the autoscaler sees the real queue.

With several workers (http/workers.py) the slots are the pod's (pod_counts.py): a worker counts the
others' slots as taken, and lets the worker whose request has waited longest take a freed one first.
A worker learns of a slot freed elsewhere by looking again every POLL_SECONDS while its requests wait:
small beside a request that waited for a busy engine."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from .pod_counts import PodCounts

POLL_SECONDS = 0.005


class FairShare:
    def __init__(self, capacity: int, pod: PodCounts | None = None) -> None:
        self.capacity = capacity  # 0: no bound (requests reach the engine as they come)
        self.pod = pod if capacity else None  # the other workers' slots; None: this process's alone
        self.busy = 0  # requests holding a slot (here)
        # Per name, its waiting requests: since when each waits (monotonic ns), and its grant.
        self.queues: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self.weights: dict[str, int] = {}
        self.turns: deque[str] = deque()  # names with requests waiting, the one served first at the left
        self.credit = 0  # requests the name at the left may still take in its turn
        self.poller: asyncio.Task[None] | None = None  # looks again for slots freed by other workers

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def waiting_for(self, name: str) -> int:
        queue = self.queues.get(name)
        return len(queue) if queue else 0

    def take_now(self) -> bool:
        """A slot at once (True), if one is free and nobody waits for one (here or in another worker)."""
        if self.capacity and (self.turns or not self._free() or (self.pod and self.pod.oldest_elsewhere())):
            return False
        self.busy += 1
        self._publish()
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
        queue.append((time.monotonic_ns(), granted))
        # Slots may have freed since `take_now` said no (the express lane hands a waiting request to
        # a task, which starts later): hand them out now, or nobody would until the next release.
        self._grant()
        if self.pod is not None and self.poller is None and self.turns:
            self.poller = asyncio.create_task(self._poll())
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

    def _free(self) -> bool:
        if not self.capacity:
            return True
        return self.busy + (self.pod.slots_elsewhere() if self.pod else 0) < self.capacity

    def _first_in_line(self) -> bool:
        """No other worker's request has waited longer than this worker's longest-waiting one."""
        if self.pod is None:
            return True
        elsewhere = self.pod.oldest_elsewhere()
        return not elsewhere or elsewhere >= self._oldest()

    def _oldest(self) -> int:
        return min((queue[0][0] for queue in self.queues.values()), default=0)

    def _publish(self) -> None:
        if self.pod is not None:
            self.pod.hold(self.busy, self._oldest())

    async def _poll(self) -> None:
        try:
            while self.turns:
                await asyncio.sleep(POLL_SECONDS)
                self._grant()
        finally:
            self.poller = None

    def _grant(self) -> None:
        while self.turns and self._free() and self._first_in_line():
            name = self.turns[0]
            queue = self.queues[name]
            _, granted = queue.popleft()
            self.busy += 1
            granted.set_result(None)
            self.credit -= 1
            if not queue:
                self._drop(name)
            elif self.credit <= 0:
                self.turns.rotate(-1)
                self.credit = self.weights[self.turns[0]]
        self._publish()

    def _leave(self, name: str, granted: asyncio.Future[None]) -> None:
        queue = self.queues.get(name)
        if queue is None:
            return
        for entry in queue:
            if entry[1] is granted:
                queue.remove(entry)
                break
        else:
            return
        if not queue:
            self._drop(name)
        self._publish()

    def _drop(self, name: str) -> None:
        """`name` has nobody waiting: out of the turns (the next in turn starts with its full weight)."""
        first = self.turns[0] == name
        self.turns.remove(name)
        del self.queues[name]
        del self.weights[name]
        if first and self.turns:
            self.credit = self.weights[self.turns[0]]
