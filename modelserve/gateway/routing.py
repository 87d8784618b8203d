"""Which replica gets a request (pure): the least in flight, or, with prefix affinity, the
conversation's own replica unless it carries too much more than its share.

Least in flight scans every ready replica (a ModelServer has a handful; exact beats power of two
choices there) and breaks ties at random, so idle replicas share the work. Prefix affinity is
consistent hashing with bounded loads (Mirrokni et al.): the conversation's prefix hashes onto a
ring of replicas and walks on past any replica that already has more than `load_factor` times
the average in flight, so turns of one chat reuse the engine's prefix (KV) cache while a hot
conversation cannot swamp one replica.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any

VIRTUAL_NODES = 64  # points per replica on the ring: an even share without a large ring
PREFIX_CHARS = 2048  # of a completion prompt's opening that identifies it
PART_CHARS = 1024  # of each opening message's text


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def least_in_flight(
    replicas: Sequence[str], in_flight: Mapping[str, int], rng: random.Random, exclude: Collection[str] = ()
) -> str | None:
    """The replica with the fewest requests in flight (a random one of those tied), or None."""
    best: list[str] = []
    low = math.inf
    for replica in replicas:
        if replica in exclude:
            continue
        load = in_flight.get(replica, 0)
        if load < low:
            best, low = [replica], load
        elif load == low:
            best.append(replica)
    return rng.choice(best) if best else None


def affinity_key(prefix: bytes, served: str, base: str) -> bytes:
    """The ring key of a conversation: its prefix, and for an adapter its name first (the engine's
    prefix cache holds an adapter's prefixes apart from the base's)."""
    return prefix if served == base else served.encode() + b"\x1d" + prefix


def conversation_prefix(request: Mapping[str, Any]) -> bytes | None:
    """What identifies a conversation: its messages up to and including the first user turn (later
    turns append to it), or the opening of a completion prompt. None: nothing to key on.

    Each message counts with its role and at most PART_CHARS of its text, so a long system prompt
    many conversations share still leaves their first user turns to tell them apart, and a
    megabyte image costs no more than a line of text."""
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        opening = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            opening.append(f"{_string(message.get('role'))}\x1f{_text(message.get('content'))[:PART_CHARS]}")
            if message.get("role") == "user":
                break
        return "\x1e".join(opening).encode()
    prompt = request.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt[:PREFIX_CHARS].encode()
    return None


def _text(content: Any) -> str:
    """A message's text: the string, or its parts' texts and image URLs (each cut short)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces = []
    for part in content:
        if isinstance(part, dict):
            text, image = part.get("text"), part.get("image_url")
            url = _string(image.get("url")) if isinstance(image, dict) else ""
            pieces.append((text if isinstance(text, str) else url)[:PART_CHARS])
    return "\x1d".join(pieces)


def _string(value: Any) -> str:
    """A string field, else "": never str() of a client's value, which for 100,000 nested lists
    raises RecursionError (and costs its whole size)."""
    return value if isinstance(value, str) else ""


class Ring:
    """The consistent-hash ring of one ModelServer's replicas."""

    def __init__(self, replicas: Sequence[str]) -> None:
        points = sorted(
            (_hash(f"{replica}#{i}".encode()), replica) for replica in replicas for i in range(VIRTUAL_NODES)
        )
        self._hashes = [point for point, _ in points]
        self._owners = [owner for _, owner in points]
        self.replicas = tuple(sorted(set(replicas)))

    def pick(
        self, prefix: bytes, in_flight: Mapping[str, int], load_factor: float, exclude: Collection[str] = ()
    ) -> tuple[str | None, bool]:
        """(replica, whether it is the prefix's own one): the first replica clockwise from the
        prefix's hash whose load stays within `load_factor` times the average with this request."""
        candidates = [r for r in self.replicas if r not in exclude]
        if not candidates:
            return None, False
        total = sum(in_flight.get(r, 0) for r in candidates) + 1
        bound = math.ceil(load_factor * total / len(candidates))
        start = bisect.bisect(self._hashes, _hash(prefix)) % len(self._hashes)
        first: str | None = None
        seen: set[str] = set()
        for step in range(len(self._owners)):
            owner = self._owners[(start + step) % len(self._owners)]
            if owner in seen or owner in exclude:
                continue
            seen.add(owner)
            if first is None:
                first = owner
            if in_flight.get(owner, 0) + 1 <= bound:
                return owner, owner == first
            if len(seen) == len(candidates):
                break
        return None, False  # unreachable with load_factor >= 1: some replica is at most average
