"""Reading the API key out of an `Authorization` header (pure)."""

from __future__ import annotations

from collections.abc import Iterable

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


def refusal_reason(headers: Iterable[tuple[bytes, bytes]], keys: KeyStore) -> str | None:
    """Why the request's key is refused (missing, malformed, invalid), or None if it is good."""
    key, reason = extract_key(authorization_header(headers))
    if key is not None and not keys.matches(key):
        return "invalid"
    return reason
