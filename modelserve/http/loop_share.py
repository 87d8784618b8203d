"""How much of a proxy's event loop one owner's JSON bodies may take (issue 57 N7, N18).

A body of very many values is read off the loop at once (http/off_loop.py). A body just under that
threshold takes the loop about 20 ms, and an owner sending them back to back held it at 100%: every
other client's request waited behind each one. So each owner (a key, or a client address: the proxy
says whose) has a share of values read on the loop, refilled at `values_per_second`; a body that would
overdraw it is read off the loop instead, in the helper's places, of which an owner holds only a few.
An owner below its share pays nothing more than the count of a body's separators (C speed).

The count is of values (http/json_body.value_count), the measure the threshold already uses: the json
module builds about a million a second, so the programs' default share (their settings
MODELSERVE_LOOP_SHARE_VALUES_PER_SECOND, MODELSERVE_GATEWAY_LOOP_SHARE_VALUES_PER_SECOND), 200,000 a
second, is about a fifth of one core.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from time import monotonic

# Owners remembered at most: past it, those whose share refilled whole are forgotten (they lose
# nothing), so a flood of addresses costs bounded memory.
MAX_OWNERS = 4096


class LoopShare:
    def __init__(self, values_per_second: int, clock: Callable[[], float] = monotonic) -> None:
        self.rate = values_per_second
        self._left: dict[Hashable, tuple[float, float]] = {}  # owner -> (values left, when counted)
        self._now = clock

    def take(self, owner: Hashable, values: int) -> bool:
        """Whether `owner` may have a body of `values` read on the loop now (its share is then spent
        by that much); False: read it off the loop (its share untouched)."""
        now = self._now()
        left, then = self._left.get(owner, (self.rate, now))
        left = min(self.rate, left + (now - then) * self.rate)
        on_loop = values <= left
        self._left[owner] = (left - values if on_loop else left, now)
        if len(self._left) > MAX_OWNERS:
            self._forget(now)
        return on_loop

    def _forget(self, now: float) -> None:
        self._left = {
            owner: (left, then)
            for owner, (left, then) in self._left.items()
            if left + (now - then) * self.rate < self.rate
        }

    def owners(self) -> int:
        return len(self._left)
