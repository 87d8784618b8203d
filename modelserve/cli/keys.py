"""What `modelserve key create|list|revoke|rotate` do to a key Secret's entries, as pure functions.

An entry is one named key (modelserve/contracts/key_entries.py): the CLI writes it as JSON holding only
the key's hash and its limits, so the Secret never holds a key the CLI generated, and the key is shown
once, when it is made. The Kubernetes side (reading the Secret, patching one entry) is in cluster.py.
"""

from __future__ import annotations

import re
from dataclasses import replace

from modelserve.contracts.key_entries import (
    NAME,
    EntryError,
    KeyEntry,
    KeyLimits,
    format_time,
    hash_key,
    is_hash,
    parse_entry,
    parse_time,
    render_entry,
)

LIST_COLUMNS = ["NAME", "CREDENTIALS", "MAX-IN-FLIGHT", "REQ/MIN", "TOKENS/MIN", "WEIGHT", "EXPIRES"]
# A lifetime as people type it (30d, 12h, 90m); anything else must be an RFC 3339 time.
DURATION = re.compile(r"^(\d+)([dhm])$")
UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60}
UNSET = "-"


class KeyCommandError(ValueError):
    """A request the key commands refuse, in words for the user (never holding a key)."""


def check_name(name: str) -> None:
    # The name is the Secret's data key, and what metrics and logs show: Kubernetes' rule for data keys.
    if not NAME.match(name):
        raise KeyCommandError(
            f"{name!r} is not a valid key name: 1 to 253 letters, digits, '-', '_' or '.' (a Secret data key)"
        )
    # A Secret mount keeps its own bookkeeping under dot names, and the sidecar skips them all: an entry
    # named so would be stored and listed but never accepted (and Kubernetes refuses "." and "..").
    if name.startswith("."):
        raise KeyCommandError(f"{name!r} is not a valid key name: it must not start with '.'")


def parse_expires(text: str, now: float) -> float:
    """`--expires` as seconds since the epoch: a lifetime from now (30d, 12h, 90m) or an RFC 3339 time."""
    match = DURATION.match(text.strip())
    if match:
        amount = int(match.group(1))
        if amount < 1:
            raise KeyCommandError(f"--expires {text}: a lifetime must be at least 1{match.group(2)}")
        return now + amount * UNIT_SECONDS[match.group(2)]
    try:
        moment = parse_time(text.strip())
    except ValueError:
        raise KeyCommandError(
            f"--expires {text!r}: not a lifetime (30d, 12h, 90m) nor an RFC 3339 time (2027-01-01T00:00:00Z)"
        ) from None
    if moment <= now:
        raise KeyCommandError(f"--expires {text}: that time is past")
    return moment


def limits(
    max_in_flight: int | None = None,
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
    expires: float | None = None,
    weight: int | None = None,
) -> KeyLimits:
    """The limits of a new entry; each number at least 1 (what the sidecar accepts, checked here so a
    refusal comes before anything is written rather than as an entry the sidecar ignores)."""
    numbers = {
        "--max-in-flight": max_in_flight,
        "--requests-per-minute": requests_per_minute,
        "--tokens-per-minute": tokens_per_minute,
        "--weight": weight,
    }
    for flag, value in numbers.items():
        if value is not None and value < 1:
            raise KeyCommandError(f"{flag} {value}: must be a whole number of at least 1")
    return KeyLimits(max_in_flight, requests_per_minute, tokens_per_minute, expires, 1 if weight is None else weight)


def new_entry(name: str, key: str, key_limits: KeyLimits) -> str:
    """The text of a new entry: the key's hash (never the key) and the limits."""
    check_name(name)
    return render_entry(KeyEntry(name, (hash_key(key),), key_limits))


def existing_entry(data: dict[str, str], name: str, secret: str) -> KeyEntry:
    """The entry `name` of a Secret's data; refused when absent or unreadable (its limits would be lost)."""
    if name not in data:
        raise KeyCommandError(f'no key named "{name}" in the Secret "{secret}"')
    try:
        return parse_entry(name, data[name])
    except EntryError as error:
        raise KeyCommandError(f'the Secret "{secret}": {error}') from None


def rotated(entry: KeyEntry, key: str, keep_old: bool) -> str:
    """The entry's text with `key` (hashed) replacing its credentials, or beside them with `keep_old`
    (an overlap while clients move to the new key); the limits stay. A legacy lines entry becomes JSON."""
    old = [c for c in entry.credentials if keep_old and c != hash_key(key)]
    return render_entry(replace(entry, credentials=(hash_key(key), *old)))


def credentials_summary(entry: KeyEntry) -> str:
    """How many credentials, and of which kind: "1 hashed", "2 plaintext", "1 hashed, 1 plaintext"."""
    hashed = sum(1 for c in entry.credentials if is_hash(c))
    plain = len(entry.credentials) - hashed
    parts = [f"{hashed} hashed"] if hashed else []
    parts += [f"{plain} plaintext"] if plain else []
    return ", ".join(parts) or "none"


def _number(value: int | None) -> str:
    return UNSET if value is None else str(value)


def list_row(name: str, text: str, now: float) -> list[str]:
    """One entry's row: counts and limits only (never a credential); an unreadable entry, its name and
    why it is unusable (the sidecar skips it), as one cell."""
    try:
        entry = parse_entry(name, text)
    except EntryError as error:
        return [name, "invalid: " + str(error).removeprefix(f"{name}: ")]
    found = entry.limits
    expires = UNSET if found.expires is None else ("expired" if found.expires <= now else format_time(found.expires))
    return [
        name,
        credentials_summary(entry),
        _number(found.max_in_flight),
        _number(found.requests_per_minute),
        _number(found.tokens_per_minute),
        str(found.weight),
        expires,
    ]


def list_table(data: dict[str, str], now: float) -> str:
    """`modelserve key list`: a row per entry of the Secret, in name order, laid out like kubectl's
    tables; an invalid entry's message runs on past the columns instead of widening one of them."""
    rows = [LIST_COLUMNS] + [list_row(name, data[name], now) for name in sorted(data)]
    full = [row for row in rows if len(row) == len(LIST_COLUMNS)]
    widths = [max(len(row[0]) for row in rows)] + [
        max(len(row[i]) for row in full) for i in range(1, len(LIST_COLUMNS))
    ]
    lines = ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"
