"""A named API key: one data entry of a key Secret (the sidecar reads it, the CLI writes it).

The entry's name is the Secret's data key; it is what metrics, logs and refusals show, never the key.
Its text is either

- lines (the format every key Secret had so far): each non-blank line one credential of that name,
  the key itself or `sha256:<64 hex digits>`, the SHA-256 of the key; or
- a JSON object (the text starts with `{`), as `modelserve key create` writes it:
  `{"keys": ["sha256:..."], "maxInFlight": 4, "requestsPerMinute": 60, "tokensPerMinute": 20000,
  "expires": "2027-01-01T00:00:00Z", "weight": 2}`; every field but `keys` optional.

Several credentials under one name are one identity (how a key is rotated: the new one added, the old
one removed later). The limits are the ModelServer's as a whole (the sidecars of its replicas share
them); they are not secret, a key's value is, which is why only its hash need be stored."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HASH_PREFIX = "sha256:"
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
# A Secret's data key (what Kubernetes allows there), which is the name the metrics carry; not a dot
# name, which a Secret mount keeps for its own bookkeeping (and the sidecar skips).
NAME = re.compile(r"^[-_a-zA-Z0-9][-._a-zA-Z0-9]{0,252}$")
LIMIT_FIELDS = {
    "maxInFlight": "max_in_flight",
    "requestsPerMinute": "requests_per_minute",
    "tokensPerMinute": "tokens_per_minute",
    "weight": "weight",
}


class EntryError(ValueError):
    """An entry the sidecar cannot use; the message names the field."""


@dataclass(frozen=True)
class KeyLimits:
    max_in_flight: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    expires: float | None = None  # seconds since the epoch
    weight: int = 1  # its turns in the fair share of a busy engine, against other keys'

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_in_flight, self.requests_per_minute, self.tokens_per_minute))


@dataclass(frozen=True)
class KeyEntry:
    name: str
    credentials: tuple[str, ...]  # plaintext keys and `sha256:<hex>` hashes
    limits: KeyLimits = KeyLimits()


def hash_key(key: str) -> str:
    """What an entry stores in place of the key."""
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def is_hash(credential: str) -> bool:
    return bool(_HASH.match(credential))


def parse_time(text: str) -> float:
    """An RFC 3339 time (`Z` or an offset) as seconds since the epoch."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError("no time zone")
    return moment.timestamp()


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_entry(name: str, text: str) -> KeyEntry:
    """The entry named `name` (a Secret data key) from its text; EntryError naming what is wrong."""
    if not NAME.match(name):
        raise EntryError(f"{name!r}: not a Secret data key")
    if not text.lstrip().startswith("{"):
        credentials = tuple(line.strip() for line in text.splitlines() if line.strip())
        _check_hashes(name, credentials)
        return KeyEntry(name, credentials)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise EntryError(f"{name}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(document, dict):
        raise EntryError(f"{name}: a JSON object is expected")
    unknown = set(document) - {"keys", "expires", *LIMIT_FIELDS}
    if unknown:
        raise EntryError(f"{name}: unknown field {sorted(unknown)[0]}")
    keys = document.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) and k.strip() for k in keys):
        raise EntryError(f"{name}: keys must be a list of keys or sha256:<hex> hashes")
    credentials = tuple(k.strip() for k in keys)
    _check_hashes(name, credentials)
    return KeyEntry(name, credentials, _limits(name, document))


def _check_hashes(name: str, credentials: tuple[str, ...]) -> None:
    """A credential spelt as a hash must be one (else it would be taken for a key nobody has)."""
    for credential in credentials:
        if credential.startswith(HASH_PREFIX) and not is_hash(credential):
            raise EntryError(f"{name}: keys: {credential[:12]}... is not sha256: and 64 lowercase hex digits")


def _limits(name: str, document: dict[str, Any]) -> KeyLimits:
    values: dict[str, Any] = {}
    for field, attribute in LIMIT_FIELDS.items():
        value = document.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise EntryError(f"{name}: {field} must be a whole number of at least 1")
        values[attribute] = value
    if document.get("expires") is not None:
        try:
            values["expires"] = parse_time(str(document["expires"]))
        except ValueError:
            raise EntryError(f"{name}: expires must be an RFC 3339 time, as 2027-01-01T00:00:00Z") from None
    return KeyLimits(**values)


def render_entry(entry: KeyEntry) -> str:
    """The entry's JSON text, as `parse_entry` reads it back (the CLI writes this)."""
    document: dict[str, Any] = {"keys": list(entry.credentials)}
    limits = entry.limits
    for field, attribute in LIMIT_FIELDS.items():
        value = getattr(limits, attribute)
        if value is not None and not (attribute == "weight" and value == 1):
            document[field] = value
    if limits.expires is not None:
        document["expires"] = format_time(limits.expires)
    return json.dumps(document, sort_keys=True)
