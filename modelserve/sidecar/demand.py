"""This pod's demand, for the operator's autoscaler: requests in flight and the last arrival."""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

from modelserve.contracts.sidecar import PodLoad


class Demand:
    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.in_flight = in_flight  # the requests in flight now (the pipeline counts them)
        self.arrivals = 0
        self._last_arrival: float | None = None

    def arrived(self) -> None:
        """A request passed the key check (refused ones wake nothing up)."""
        self.arrivals += 1
        self._last_arrival = monotonic()

    def now(self) -> PodLoad:
        since = None if self._last_arrival is None else round(monotonic() - self._last_arrival, 3)
        return PodLoad(self.in_flight(), self.arrivals, since)
