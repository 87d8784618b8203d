"""API keys from a mounted Secret directory, reloaded when its files change."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

# Well under the 2 s within which a changed Secret must take effect; a poll is a few stat calls.
POLL_SECONDS = 0.5

# What identifies the directory's content cheaply: (name, mtime_ns, size, inode) of each file.
Signature = tuple[tuple[str, int, int, int], ...]


def parse_keys(text: str) -> set[bytes]:
    """Every non-blank line is a key; surrounding whitespace is ignored."""
    return {line.strip().encode() for line in text.splitlines() if line.strip()}


def key_files(directory: Path) -> list[Path]:
    """Files in a Secret mount. Kubernetes keeps its bookkeeping (`..data`, `..2026_...`) under
    dot names, and the visible names are symlinks into it, which is why links are followed."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [directory / n for n in names if not n.startswith(".") and (directory / n).is_file()]


def signature(directory: Path) -> Signature:
    entries = []
    for path in key_files(directory):
        try:
            st = path.stat()
        except FileNotFoundError:  # swapped out between listing and stat; the next poll sees it
            continue
        entries.append((path.name, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(entries)


def load_keys(directory: Path) -> set[bytes]:
    keys: set[bytes] = set()
    for path in key_files(directory):
        try:
            keys |= parse_keys(path.read_text())
        except (FileNotFoundError, UnicodeDecodeError) as exc:
            log.warning("skipping key file %s: %s", path.name, type(exc).__name__)
    return keys


class KeyStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._keys: tuple[bytes, ...] = ()
        self._signature: Signature | None = None
        self.reload_if_changed()

    def __len__(self) -> int:
        return len(self._keys)

    def matches(self, candidate: bytes) -> bool:
        """Constant time per key, and every key is compared, so timing tells nothing."""
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(candidate, key)
        return found

    def reload_if_changed(self) -> bool:
        current = signature(self.directory)
        if current == self._signature:
            return False
        self._keys = tuple(sorted(load_keys(self.directory)))
        self._signature = current
        # The count only: keys never reach the logs.
        log.info("loaded %d API key(s) from %s", len(self._keys), self.directory)
        if not self._keys:
            log.warning("no API keys in %s: every proxied request is refused", self.directory)
        return True

    async def watch(self, interval: float = POLL_SECONDS) -> None:
        """Poll for changes until cancelled (the app's lifespan owns this task)."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.reload_if_changed()
            except OSError as exc:
                log.warning("reading keys from %s failed: %s", self.directory, exc)
