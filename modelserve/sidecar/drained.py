"""When the sidecar is done with a deleted pod, for the engine's preStop (`GET /drained`, which the
kubelet asks as the pod is deleted): once the sidecar was told to stop (SIGTERM, after its own preStop
gave the endpoints time to drop the pod) and no request is in flight in any of its workers, or at its
drain's end. So the engine stops as soon as the last stream ended: with a fixed preStop sleep of the
whole drain budget, a deleted idle pod held its GPU 65 s and its replacement waited for it.

Each worker, once told to stop, publishes its requests in flight in its row of the pod's shared counts
(pod_counts.py) until it exits; whichever worker the kubelet's request reached adds them up. Before
that (no stop yet) nothing is published: the serving path pays nothing for this."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import Gauge

from .pod_counts import PodCounts

POLL_SECONDS = 0.1
# Asked with no stop coming (not the kubelet's preStop, or a pod whose SIGTERM never arrives): answered
# after this anyway, so the request ends.
STOP_WAIT_SECONDS = 120.0


class Drain:
    """One worker's side: told to stop (from uvicorn's signal handler), its in-flight published."""

    def __init__(self, in_flight: Callable[[], int], pod: PodCounts | None, waiting: Gauge) -> None:
        self.in_flight = in_flight
        self.pod = pod
        self.waiting = waiting  # the requests in `until_drained` now
        self._told = asyncio.Event()

    def stop(self) -> None:
        """Called in the signal handler, on the loop's thread: no await, only a wake-up."""
        with contextlib.suppress(RuntimeError):  # no loop running (not serving yet): nothing waits
            asyncio.get_running_loop().call_soon_threadsafe(self._told.set)

    async def publish(self) -> None:
        """Until cancelled (the worker's end): once told to stop, its in-flight for its siblings."""
        await self._told.wait()
        if self.pod is None:
            return
        while True:
            self.pod.publish_in_flight(self.in_flight())
            await asyncio.sleep(POLL_SECONDS)

    def finished(self) -> None:
        """The worker's requests are over (its server's drain ended): published as they are, last."""
        if self._told.is_set() and self.pod is not None:
            self.pod.publish_in_flight(self.in_flight())

    def pod_in_flight(self) -> int | None:
        """Requests in flight in this worker and the others (None: a sibling has not published yet)."""
        own = self.in_flight()
        if self.pod is None:
            return own
        theirs = self.pod.in_flight_elsewhere()
        return None if theirs is None else own + theirs

    async def until_drained(self, drain_seconds: float) -> str:
        """Wait until told to stop and the pod holds no request (at most `drain_seconds` after the stop):
        why it ended."""
        self.waiting.inc()
        try:
            return await self._until_drained(drain_seconds)
        finally:
            self.waiting.dec()

    async def _until_drained(self, drain_seconds: float) -> str:
        try:
            await asyncio.wait_for(self._told.wait(), STOP_WAIT_SECONDS)
        except TimeoutError:
            return "not stopping"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_seconds
        while loop.time() < deadline:
            if self.pod_in_flight() == 0:
                return "drained"
            await asyncio.sleep(POLL_SECONDS)
        return "drain deadline"
