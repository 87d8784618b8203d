"""What the gateway knows of keys while holding none: whether a request carries one at all, and which
`Authorization` values (by digest, never the value) a model's replicas let through, learned from
their answers. Every memory here is bounded in entries and gives up its oldest entry at the bound,
never all of them: a flood of made-up keys cannot grow it, nor wipe what real callers rely on.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

from modelserve.contracts.names import Key

# A key seen opening a model is trusted to wake it for a week: long enough to span a model's
# quiet days at zero, so its users are held with the verified requests, not the small share.
OPENED_MEMORY_SECONDS = 7 * 24 * 3600.0
MAX_ENTRIES = 100_000

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def keyless(authorization: bytes | None) -> bool:
    """No key at all, as the sidecar's `missing` refusal: no header, or a blank one."""
    return authorization is None or not authorization.strip()


def digest(authorization: bytes) -> bytes:
    return hashlib.sha256(authorization).digest()


# Answers a sidecar's server may give before its key check (modelserve/http/limits.py and the
# like: a head too large or too slow, a server at its limits): they say nothing of the key.
BEFORE_THE_KEY_CHECK = frozenset({408, 429, 431})


def proof(status: int) -> bool | None:
    """What a replica's answer says of the key it was sent with: True, it opens the model (the
    sidecar checks the key before anything else it answers); False, refused (401); None for an
    answer that may come before that check."""
    if status == 401:
        return False
    if status >= 500 or status in BEFORE_THE_KEY_CHECK:
        return None
    return True


class Recent(Generic[K, V]):
    """A dict bounded in entries, each with when it was written; at the bound the oldest written
    goes (dicts keep insertion order, and a rewritten entry moves to the end)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> tuple[float, V] | None:
        """(when written, value), or None."""
        return self._entries.get(key)

    def put(self, key: K, value: V, now: float) -> None:
        entries = self._entries
        if entries.pop(key, None) is None and len(entries) >= self.max_entries:
            del entries[next(iter(entries))]
        entries[key] = (now, value)

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)


class Opened:
    """Which key digests opened which model: fed by the model lists' asks (catalog.py) and by every
    answer the gateway relays; what lets a key's requests for a model at zero be held as verified."""

    def __init__(self, max_age: float = OPENED_MEMORY_SECONDS, max_entries: int = MAX_ENTRIES) -> None:
        self.max_age = max_age
        self._seen: Recent[tuple[bytes, Key], None] = Recent(max_entries)
        self._keys: Recent[bytes, None] = Recent(max_entries)  # the keys of `_seen`, when last proven

    def __len__(self) -> int:
        return len(self._seen)

    def _fresh(self, seen: tuple[float, None] | None, now: float | None) -> bool:
        return seen is not None and (time.monotonic() if now is None else now) - seen[0] < self.max_age

    def opens(self, key_digest: bytes, model: Key, now: float | None = None) -> bool:
        return self._fresh(self._seen.get((key_digest, model)), now)

    def opens_some(self, key_digest: bytes, now: float | None = None) -> bool:
        """Whether the key opened any model lately: a key a replica accepted, not one made up."""
        return self._fresh(self._keys.get(key_digest), now)

    def learn(self, key_digest: bytes, model: Key, opened: bool | None, now: float | None = None) -> None:
        """`opened` as `proof` gives it: True remembers (afresh), False forgets, None leaves it."""
        if opened:
            at = time.monotonic() if now is None else now
            self._seen.put((key_digest, model), None, at)
            self._keys.put(key_digest, None, at)
        elif opened is False:
            self._seen.pop((key_digest, model))
            self._keys.pop(key_digest)  # until a replica accepts it again
