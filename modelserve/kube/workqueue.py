"""A work queue of ModelServer keys: each key waits at most once, and one worker at a time has it.

A burst of events about one ModelServer (its pods, its Deployment, its status) costs one reconcile
once a worker is free, and memory holds keys, not event bodies.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


class WorkQueue:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.handle: Callable[[Key], None] = lambda key: None
        self._pending: deque[Key] = deque()
        self._queued: set[Key] = set()  # in _pending
        self._active: set[Key] = set()  # being handled
        self._again: set[Key] = set()  # added while active: handled once more after
        self._changed = threading.Condition()
        self._stopped = False
        self._threads: list[threading.Thread] = []

    def start(self, handle: Callable[[Key], None]) -> None:
        """Start the workers; keys added before wait for them."""
        self.handle = handle
        for index in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"reconcile-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 30.0) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def add(self, key: Key) -> None:
        with self._changed:
            if key in self._active:
                self._again.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._pending.append(key)
                self._changed.notify()

    def __len__(self) -> int:
        with self._changed:
            return len(self._pending) + len(self._again)

    def _next(self) -> Key | None:
        with self._changed:
            while not self._pending and not self._stopped:
                self._changed.wait()
            if self._stopped:
                return None
            key = self._pending.popleft()
            self._queued.discard(key)
            self._active.add(key)
            return key

    def _done(self, key: Key) -> None:
        with self._changed:
            self._active.discard(key)
            if key in self._again:
                self._again.discard(key)
                self._queued.add(key)
                self._pending.append(key)
                self._changed.notify()

    def _work(self) -> None:
        while (key := self._next()) is not None:
            try:
                self.handle(key)
            except Exception:  # a failed reconcile waits for the next change or resync
                log.exception("%s/%s: reconcile failed", *key)
            finally:
                self._done(key)
