"""What the sidecar's workers share (http/shared_rows.py), so its limits mean what they mean with one
process: in each worker's row, the engine slots it holds, the fair share's virtual time there and its
next waiting request's start tag (fair_share.py), and for each key name it serves that name's requests
in flight, its requests and tokens over the last minute, and where its last tagged request ends. A
worker adds the other rows to its own counts when it checks a limit."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import NamedTuple

from modelserve.http.shared_rows import Names, SharedRows

SLOTS = 0  # engine slots held
VIRTUAL = 1  # the start tag of the last request served
HEAD_START = 2  # the next waiting request's start tag + 1 (0: none waits)
HEAD_SINCE = 3  # since when it waits (monotonic ns)
PID = 4  # the worker's process, once it takes nudges (0: not yet)
IN_FLIGHT = 5  # once told to stop: its requests in flight + 1 (0: not published yet; drained.py)
HEADER = 6
MAX_NAMES = 4096  # per worker (the Secret's names, and the ones forgotten since, reused)
FINISH = 3  # a name's field after its KeyCounts
NUDGE = signal.SIGUSR1  # ignored until a worker listens (http/serve.py), then handled by its loop
WIDTH = HEADER + Names.width(MAX_NAMES, 4)


class KeyCounts(NamedTuple):
    in_flight: int
    requests: int  # in the last minute
    tokens: int  # in the last minute


NONE = KeyCounts(0, 0, 0)


class PodCounts:
    """This worker's row, written here only, and its siblings' rows, read."""

    def __init__(self, rows: SharedRows, own: int) -> None:
        self.names = Names(rows, own, HEADER, MAX_NAMES, 4)
        self.own, self.others = self.names.own, self.names.others

    # --- engine slots and turns -----------------------------------------------------------------

    def hold(self, slots: int, virtual: int, head: tuple[int, int] | None) -> None:
        """This worker's slots held, virtual time, and next waiting request (start, since)."""
        own = self.own
        own[SLOTS] = slots
        own[VIRTUAL] = virtual
        own[HEAD_SINCE] = head[1] if head is not None else 0
        own[HEAD_START] = head[0] + 1 if head is not None else 0  # last: the head is whole when seen

    def slots_elsewhere(self) -> int:
        return sum(row[SLOTS] for row in self.others)

    def virtual_elsewhere(self) -> int:
        return max((row[VIRTUAL] for row in self.others), default=0)

    def head_elsewhere(self) -> tuple[int, int] | None:
        """The other workers' first request in turn (start, since), or None when none waits."""
        heads = [(row[HEAD_START] - 1, row[HEAD_SINCE]) for row in self.others if row[HEAD_START]]
        return min(heads) if heads else None

    def listen(self, listening: bool) -> None:
        """Whether this worker takes nudges (its loop handles NUDGE) from now on."""
        self.own[PID] = os.getpid() if listening else 0

    def nudge(self) -> None:
        """Wake the worker whose request is first in turn: a slot freed here is its to take now, not
        at its next look."""
        heads = [(row[HEAD_START], row[HEAD_SINCE], row[PID]) for row in self.others if row[HEAD_START] and row[PID]]
        if heads:
            with contextlib.suppress(ProcessLookupError):  # it died: its row is cleared as it starts again
                os.kill(min(heads)[2], NUDGE)

    def publish_in_flight(self, count: int) -> None:
        self.own[IN_FLIGHT] = count + 1

    def in_flight_elsewhere(self) -> int | None:
        """The other workers' requests in flight as they published them; None while one has not."""
        published = [row[IN_FLIGHT] for row in self.others]
        return None if not all(published) else sum(published) - len(published)

    def publish_finish(self, name: str, finish: int) -> None:
        self.names.publish(name, (finish,), FINISH)

    def finish_elsewhere(self, name: str) -> int:
        return max((counts[FINISH] for counts in self.names.elsewhere(name) or ()), default=0)

    # --- key names ------------------------------------------------------------------------------

    def publish(self, name: str, counts: KeyCounts) -> bool:
        return self.names.publish(name, counts)

    def elsewhere(self, name: str) -> KeyCounts | None:
        """`name`'s counts in the other workers together; None when it is not shared (no room)."""
        found = self.names.elsewhere(name)
        if found is None:
            return None
        return KeyCounts(*(sum(counts[field] for counts in found) for field in range(FINISH)))

    def forget(self, name: str) -> None:
        self.names.forget(name)
