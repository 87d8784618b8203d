"""A fair share of a busy engine: at most `capacity` requests reach it at once; the others wait here,
and as slots free up the keys are served in turn (a key with weight w takes w requests per turn). A
key that floods lengthens its own queue, not the others' wait: a new key's request waits for at most
one turn of each other waiting key.

The turns are start-time fair queuing (Goyal, Vin and Cheng, 1996): each request is tagged when it
arrives with a start, the later of the last start served (the virtual time) and where its key's
previous request ends (its finish: start + TURN / weight); the waiting request with the lowest start
is served next, the earlier arrival first on a tie. So a key's requests take every other key's turn
between two of its own, and a key that was idle starts at the present, with no credit saved up.

The capacity is the ModelServer's `replicas.targetPerReplica`, the requests one replica serves at full
speed (what the autoscaler already scales on): past it an engine only queues them itself, first come
first served, where no key can be told apart. Requests waiting here are still in flight for /load,
so the autoscaler sees the real queue.

With several workers (http/workers.py) the slots and the turns are the pod's (pod_counts.py): a worker
counts the others' slots as taken, tags with the latest virtual time and key finish any worker has
published, and serves its lowest-tagged request only when no other worker's waits with a lower tag. A
worker that frees a slot another worker's request is first for nudges that worker (a signal, see
pod_counts.py); each also looks again every POLL_SECONDS while its requests wait, in case a nudge
was missed (a worker starting again)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from .pod_counts import PodCounts

POLL_SECONDS = 0.02
TURN = 720720  # a turn in tags: divisible by every weight up to 16, so their steps are exact


@dataclass(order=True)
class Waiting:
    """One waiting request, ordered by its start tag, then by its arrival."""

    start: int
    since: int  # monotonic ns (the same clock in every worker)
    order: int
    name: str = field(compare=False)
    finish: int = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)


class FairShare:
    def __init__(self, capacity: int, pod: PodCounts | None = None) -> None:
        self.capacity = capacity  # 0: no bound (requests reach the engine as they come)
        self.pod = pod if capacity else None  # the other workers' slots and turns; None: this process's
        self.busy = 0  # requests holding a slot (here)
        self.queue: list[Waiting] = []  # a heap; requests that left stay until they reach its top
        self.queued: dict[str, int] = {}  # requests waiting, by key name
        self.finish: dict[str, int] = {}  # where each key's last request tagged here ends
        self.virtual = 0  # the start of the last request served here
        self.arrivals = itertools.count()
        self.poller: asyncio.Task[None] | None = None  # looks again for slots freed by other workers

    @property
    def waiting(self) -> int:
        return sum(self.queued.values())

    def waiting_for(self, name: str) -> int:
        return self.queued.get(name, 0)

    def take_now(self, name: str, weight: int) -> bool:
        """A slot at once (True), if one is free and nobody waits for one (here or in another worker)."""
        if self.capacity:
            if self._head() is not None or not self._free() or (self.pod and self.pod.head_elsewhere()):
                return False
            start, _ = self._tag(name, weight)
            self.virtual = max(self.virtual, start)
        self.busy += 1
        self._publish()
        return True

    async def take(self, name: str, weight: int, gone: asyncio.Future[None], timeout: float) -> bool:
        """Wait for a slot, in `name`'s turns: True once it holds one; False when the client went away
        or `timeout` seconds passed first (then it holds none)."""
        start, finish = self._tag(name, weight)
        waiting = Waiting(
            start, time.monotonic_ns(), next(self.arrivals), name, finish, asyncio.get_running_loop().create_future()
        )
        heapq.heappush(self.queue, waiting)
        self.queued[name] = self.queued.get(name, 0) + 1
        # Slots may have freed since `take_now` said no (the express lane hands a waiting request to
        # a task, which starts later): hand them out now, or nobody would until the next release.
        self._grant()
        if self.pod is not None and self.poller is None and self._head() is not None:
            self.poller = asyncio.create_task(self._poll())
        granted = waiting.granted
        try:
            await asyncio.wait_for(asyncio.wait((granted, gone), return_when=asyncio.FIRST_COMPLETED), timeout)
        except TimeoutError:
            pass
        except BaseException:  # cancelled (the client went away, the server stops)
            if granted.done() and not granted.cancelled():
                self.release()  # granted as it was cancelled: nobody will give it back
            else:
                self._leave(waiting)
            raise
        if not granted.done():
            self._leave(waiting)
            return False
        return True

    def release(self) -> None:
        """A slot given back (its request ended): the next in turn takes it."""
        self.busy -= 1
        self._grant()

    # --- turns ------------------------------------------------------------------------------------

    def _tag(self, name: str, weight: int) -> tuple[int, int]:
        """A new request's start and finish; its key's finish moves on to it."""
        virtual, finish = self.virtual, self.finish.get(name, 0)
        if self.pod is not None:
            virtual = max(virtual, self.pod.virtual_elsewhere())
            finish = max(finish, self.pod.finish_elsewhere(name))
        start = max(virtual, finish)
        end = self.finish[name] = start + max(1, TURN // max(1, weight))
        if self.pod is not None:
            self.pod.publish_finish(name, end)
        return start, end

    def _head(self) -> Waiting | None:
        """The next request in turn here (requests that left are dropped on the way)."""
        queue = self.queue
        while queue and queue[0].granted.done():
            heapq.heappop(queue)
        return queue[0] if queue else None

    def _free(self) -> bool:
        if not self.capacity:
            return True
        return self.busy + (self.pod.slots_elsewhere() if self.pod else 0) < self.capacity

    def _first_in_line(self, head: Waiting) -> bool:
        """No other worker's next request comes before this worker's."""
        if self.pod is None:
            return True
        theirs = self.pod.head_elsewhere()
        return theirs is None or (head.start, head.since) <= theirs

    def nudged(self) -> None:
        """Another worker freed a slot this worker's request is first for."""
        self._grant()

    def _grant(self) -> None:
        while (head := self._head()) is not None and self._free():
            if not self._first_in_line(head):
                break
            heapq.heappop(self.queue)
            self._count_out(head.name)
            self.busy += 1
            self.virtual = max(self.virtual, head.start)
            head.granted.set_result(None)
        self._publish()
        if self.pod is not None and self._free():
            self.pod.nudge()  # a free slot: the worker whose request is first for it, if any, takes it

    def _leave(self, waiting: Waiting) -> None:
        """A request that stops waiting: out of its key's count (and of the heap once at its top); its
        key's finish back to its start if it was the key's last, so leaving costs the key no turn."""
        waiting.granted.cancel()
        self._count_out(waiting.name)
        if self.finish.get(waiting.name) == waiting.finish:
            self.finish[waiting.name] = waiting.start
            if self.pod is not None:
                self.pod.publish_finish(waiting.name, waiting.start)
        self._publish()

    def _count_out(self, name: str) -> None:
        left = self.queued[name] - 1
        if left:
            self.queued[name] = left
        else:
            del self.queued[name]
            if self.finish.get(name, 0) <= self.virtual:
                del self.finish[name]  # behind the present: the next request starts there anyway

    def _publish(self) -> None:
        if self.pod is not None:
            head = self._head()
            self.pod.hold(self.busy, self.virtual, (head.start, head.since) if head is not None else None)

    async def _poll(self) -> None:
        try:
            while self._head() is not None:
                await asyncio.sleep(POLL_SECONDS)
                self._grant()
        finally:
            self.poller = None
