"""Named API keys from a mounted Secret directory (contracts/key_entries.py: one entry per data key,
plaintext keys or their SHA-256), reloaded when its files change."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from modelserve.contracts.key_entries import HASH_PREFIX, EntryError, KeyEntry, is_hash, parse_entry

from .mount_poll import poll

log = logging.getLogger(__name__)

# Well under the 2 s within which a changed Secret must take effect; a poll is a few stat calls.
POLL_SECONDS = 0.5

# What identifies the directory's content cheaply: (name, mtime_ns, size, inode) of each file.
Signature = tuple[tuple[str, int, int, int], ...]


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


def load_entries(directory: Path) -> tuple[list[KeyEntry], list[str]]:
    """The named keys in a Secret mount, and why each unusable entry was skipped (by name only)."""
    entries: list[KeyEntry] = []
    problems: list[str] = []
    for path in key_files(directory):
        try:
            entries.append(parse_entry(path.name, path.read_text()))
        except FileNotFoundError:  # swapped out mid-read; the next poll sees the new one
            continue
        except UnicodeDecodeError:
            problems.append(f"{path.name}: not UTF-8 text")
        except EntryError as error:
            problems.append(str(error))
    return entries, problems


def digest(candidate: bytes) -> bytes:
    return hashlib.sha256(candidate).digest()


def by_digest(entries: list[KeyEntry]) -> dict[bytes, KeyEntry]:
    """Each credential's SHA-256 (a stored hash as it is, a plaintext key hashed) -> its entry.
    A candidate is looked up by its own digest: what the lookup's timing could reveal is about a
    hash, never about a key, so no comparison need be constant-time."""
    found: dict[bytes, KeyEntry] = {}
    for entry in entries:
        for credential in entry.credentials:
            key = bytes.fromhex(credential[len(HASH_PREFIX) :]) if is_hash(credential) else digest(credential.encode())
            found[key] = entry
    return found


class KeyStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries: tuple[KeyEntry, ...] = ()
        self.problems: tuple[str, ...] = ()  # unusable entries: "<name>: why" (a metric counts them)
        self._by_digest: dict[bytes, KeyEntry] = {}
        self._signature: Signature | None = None
        self.on_change: Callable[[], None] | None = None  # after a reload (the proxy forgets old names)
        self.reload_if_changed()

    def __len__(self) -> int:
        """The credentials (keys and hashes) accepted."""
        return len(self._by_digest)

    def identify(self, candidate: bytes) -> KeyEntry | None:
        """The named key `candidate` is a credential of, or None."""
        return self._by_digest.get(digest(candidate))

    def matches(self, candidate: bytes) -> bool:
        return self.identify(candidate) is not None

    def reload_if_changed(self) -> bool:
        current = signature(self.directory)
        if current == self._signature:
            return False
        entries, problems = load_entries(self.directory)
        self.entries, self.problems = tuple(entries), tuple(problems)
        self._by_digest = by_digest(entries)
        self._signature = current
        # Names and counts only: keys never reach the logs.
        for problem in problems:
            log.warning("skipping key entry %s", problem)
        log.info("loaded %d API key(s) of %d name(s) from %s", len(self), len(entries), self.directory)
        if not self._by_digest:
            log.warning("no API keys in %s: every proxied request is refused", self.directory)
        if self.on_change is not None:
            self.on_change()
        return True

    async def watch(self, interval: float = POLL_SECONDS) -> None:
        """Poll for changes until cancelled (the app's lifespan owns this task)."""
        await poll(self.reload_if_changed, self.directory, interval)
