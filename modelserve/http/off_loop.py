"""CPU work a request brings that would stall the event loop, done in a process of its own.

Reading JSON of millions of values (a 10 MiB body of `[],[],...`) takes the json module about a
second, and a C call holds the interpreter throughout: in a thread it stalls the loop all the same.
So a proxy hands such work to one helper process, at most `pending` at a time (more: busy, for the
caller to refuse; at most `per_owner` of them one owner's, so whoever sends the most large bodies
cannot hold every place: issue 57 N16), and its loop goes on serving every other request meanwhile.
The helper is started at first use, spawned (a clean interpreter, not a fork of this one with its
loop and threads), and what goes back to the loop must be small: unpickling a million values would
stall it again.

The helper's memory is bounded (its data segment, `memory_bytes`): a body whose values would take
more (10 MiB of `[[],[],...]` took 549 MiB, past the pod's limit) ends in a MemoryError there, not in
the OOM killer's choice of process, and is TOO_LARGE here. A helper that dies all the same (killed)
is replaced at the next call; the calls it had are GONE. It dies with the process that started it
(PR_SET_PDEATHSIG), so a proxy killed, or ending with os._exit as a worker does, leaves no helper (nor
the resource tracker it kept alive) behind; a fork server would outlive it, as would the helper.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import resource
import signal
from collections.abc import Callable, Hashable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import errors
from .workers import die_with_parent

BUSY = object()  # `run`'s answer when `pending` calls (or `per_owner` of its owner's) are in progress already
TOO_LARGE = object()  # `run`'s answer when the work needed more than the helper's memory bound
GONE = object()  # `run`'s answer when the helper died under the call (the next call gets a new one)
MEMORY_BYTES = 256 * 1024 * 1024  # the helper's data segment: a 10 MiB body of long text reads in ~40 MiB
_OUTCOMES = ((BUSY, "busy"), (TOO_LARGE, "too_large"), (GONE, "gone"))  # the metric's labels (http/metrics.py)


def outcome(result: Any) -> str:
    """The metric's label for what `OffLoop.run` gave: read, or why it gave no result."""
    return next((name for marker, name in _OUTCOMES if result is marker), "read")


def refusal(result: Any, program: str, memory_bytes: int) -> errors.ErrorResponse | None:
    """The answer for a call that gave no result (busy, too large, helper gone), else None.
    `program`: whose reader, in the client's words (this gateway, this sidecar)."""
    if result is BUSY:
        return errors.server_busy(f"This {program} is reading too many very large request bodies; retry later.")
    if result is TOO_LARGE:
        return errors.too_many_values(memory_bytes)
    if result is GONE:
        return errors.server_busy(f"This {program}'s body reader stopped while reading this request; retry.")
    return None


def _start_helper(limit: int) -> None:
    """In the helper, before any work: killed when its starter dies; its heap (brk and anonymous
    mappings) at most `limit` bytes."""
    die_with_parent(signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


class OffLoop:
    def __init__(self, pending: int, memory_bytes: int = MEMORY_BYTES, per_owner: int | None = None) -> None:
        self.pending = pending
        self.per_owner = pending if per_owner is None else per_owner
        self.memory_bytes = memory_bytes
        self.running = 0
        self.replaced = 0  # helpers found dead and replaced
        self._executor: ProcessPoolExecutor | None = None
        self._owners: collections.Counter[Hashable] = collections.Counter()

    async def run(self, function: Callable[..., Any], *args: Any, owner: Hashable = None) -> Any:
        """`function(*args)` in the helper process (a module-level function, its arguments and result
        pickled), or BUSY, TOO_LARGE or GONE. `owner`: whose share of the places the call takes."""
        if self.running >= self.pending or self._owners[owner] >= self.per_owner:
            return BUSY
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_helper,
                initargs=(self.memory_bytes,),
            )
        executor = self._executor
        self.running += 1
        self._owners[owner] += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, function, *args)
        except MemoryError:
            return TOO_LARGE
        except BrokenProcessPool:
            if self._executor is executor:  # the first of its calls to see it: replace it once
                executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
                self.replaced += 1
            return GONE
        finally:
            self.running -= 1
            self._owners[owner] -= 1
            if not self._owners[owner]:
                del self._owners[owner]

    def helper_pids(self) -> list[int]:
        """The helper's process id while one runs (what an operator, or a test, kills to see it replaced)."""
        processes = getattr(self._executor, "_processes", None) or {}
        return list(processes)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
