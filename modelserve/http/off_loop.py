"""CPU work a request brings that would stall the event loop, done in a process of its own.

Reading JSON of millions of values (a 10 MiB body of `[],[],...`) takes the json module about a
second, and a C call holds the interpreter throughout: in a thread it stalls the loop all the same.
So a proxy hands such work to one helper process, at most `pending` at a time (more: busy, for the
caller to refuse), and its loop goes on serving every other request meanwhile. The helper is started
at first use, from a fork server (a clean process, not a fork of this one with its loop and threads),
and what goes back to the loop must be small: unpickling a million values would stall it again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

BUSY = object()  # `run`'s answer when `pending` calls are in progress already


class OffLoop:
    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.running = 0
        self._executor: ProcessPoolExecutor | None = None

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` in the helper process (a module-level function, its arguments and result
        pickled), or BUSY."""
        if self.running >= self.pending:
            return BUSY
        if self._executor is None:
            self._executor = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver"))
        self.running += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)
        finally:
            self.running -= 1

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
