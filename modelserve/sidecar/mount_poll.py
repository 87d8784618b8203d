"""Following a file the kubelet keeps up to date in a volume (a Secret, a downward API file): poll it,
since the kubelet swaps the files under a running container and nothing announces it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


async def poll(refresh: Callable[[], object], path: Path, interval: float) -> None:
    """`refresh()` every `interval` seconds until cancelled (the app's lifespan owns the task); a
    failed read is logged and tried again on the next round, the last good state kept meanwhile."""
    while True:
        await asyncio.sleep(interval)
        try:
            refresh()
        except OSError as exc:
            log.warning("reading %s failed: %s", path, exc)
