"""Reading the API key out of an `Authorization` header, and whose it is (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from modelserve.contracts.key_entries import KeyEntry
from modelserve.http.relay import authorization_header

from .keys import KeyStore

# `Key` is the serverless platforms' scheme, `Bearer` is what OpenAI SDKs send.
_SCHEMES = (b"bearer", b"key")


def extract_key(header: bytes | None) -> tuple[bytes | None, str | None]:
    """(key, None) for `<Bearer|Key> <key>` with any scheme case, else (None, failure reason)."""
    if header is None or not header.strip():
        return None, "missing"
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() not in _SCHEMES:
        return None, "malformed"
    return parts[1], None


def identify(headers: Iterable[tuple[bytes, bytes]], keys: KeyStore, now: float) -> tuple[KeyEntry | None, str | None]:
    """(the named key, None) for a good key, else why it is refused: (None, missing, malformed or
    invalid), or (the named key, expired). `now`: seconds since the epoch."""
    key, reason = extract_key(authorization_header(headers))
    if key is None:
        return None, reason
    entry = keys.identify(key)
    if entry is None:
        return None, "invalid"
    expires = entry.limits.expires
    if expires is not None and now >= expires:
        return entry, "expired"
    return entry, None
