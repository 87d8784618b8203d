"""How many ready replicas share a key's limits: the operator writes the count into an annotation of
each of the ModelServer's pods, the kubelet mirrors it into a file of a downward API volume, and this
reads the file (polled, as the keys are). Each sidecar then enforces 1/N of each limit."""

from __future__ import annotations

import logging
from pathlib import Path

from .mount_poll import poll

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0


def read_count(path: Path) -> int:
    """The count in the file; 1 when it is absent, empty or not a whole number above 0 (a pod the
    operator has not annotated yet, a sidecar outside Kubernetes)."""
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return 1
    return int(text) if text.isdigit() and int(text) > 0 else 1


class ReplicaShare:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = read_count(path)

    def refresh(self) -> None:
        count = read_count(self.path)
        if count != self.count:
            log.info("key limits now shared by %d ready replica(s)", count)
            self.count = count

    async def watch(self, interval: float = POLL_SECONDS) -> None:
        """Poll the file until cancelled (the app's lifespan owns this task)."""
        await poll(self.refresh, self.path, interval)
