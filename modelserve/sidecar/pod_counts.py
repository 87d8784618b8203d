"""What the sidecar's workers share (http/shared_rows.py), so its limits mean what they mean with one
process: in each worker's row, the engine slots it holds, since when its oldest request has waited for
one, and for each key name it serves that name's requests in flight and its requests and tokens over
the last minute. A worker adds the other rows to its own counts when it checks a limit."""

from __future__ import annotations

from typing import NamedTuple

from modelserve.http.shared_rows import Names, SharedRows

SLOTS = 0  # engine slots held
OLDEST = 1  # monotonic ns since the oldest request waiting for a slot waits (0: none waits)
HEADER = 2
MAX_NAMES = 4096  # per worker (the Secret's names, and the ones forgotten since, reused)
WIDTH = HEADER + Names.width(MAX_NAMES, 3)


class KeyCounts(NamedTuple):
    in_flight: int
    requests: int  # in the last minute
    tokens: int  # in the last minute


NONE = KeyCounts(0, 0, 0)


class PodCounts:
    """This worker's row, written here only, and its siblings' rows, read."""

    def __init__(self, rows: SharedRows, own: int) -> None:
        self.own = rows.row(own)
        self.others = [rows.row(index) for index in range(rows.rows) if index != own]
        self.names = Names(rows, own, HEADER, MAX_NAMES, 3)

    # --- engine slots ---------------------------------------------------------------------------

    def hold(self, slots: int, oldest_waiting_ns: int) -> None:
        self.own[SLOTS] = slots
        self.own[OLDEST] = oldest_waiting_ns

    def slots_elsewhere(self) -> int:
        return sum(row[SLOTS] for row in self.others)

    def oldest_elsewhere(self) -> int:
        """Since when (monotonic ns) the longest-waiting request of another worker waits; 0: none."""
        waiting = [row[OLDEST] for row in self.others if row[OLDEST]]
        return min(waiting) if waiting else 0

    # --- key names ------------------------------------------------------------------------------

    def publish(self, name: str, counts: KeyCounts) -> bool:
        return self.names.publish(name, counts)

    def elsewhere(self, name: str) -> KeyCounts | None:
        """`name`'s counts in the other workers together; None when it is not shared (no room)."""
        counts = self.names.elsewhere(name)
        return None if counts is None else KeyCounts(*counts)

    def forget(self, name: str) -> None:
        self.names.forget(name)
