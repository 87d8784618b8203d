"""Token usage read from engine responses (pure), for the token counters."""

from __future__ import annotations

import json
from typing import Any

# The streaming usage chunk is the last event before `data: [DONE]`; a few KiB of tail hold it.
TAIL_BYTES = 8192


def usage_counts(payload: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a response object's `usage`, if it has one."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return prompt, completion


def usage_from_json(body: bytes) -> tuple[int, int] | None:
    try:
        return usage_counts(json.loads(body))
    except ValueError:
        return None


def usage_from_sse(tail: bytes) -> tuple[int, int] | None:
    """The usage of the last SSE event that carries one (engines that report usage in every
    chunk end with the cumulative total)."""
    for event in reversed(tail.split(b"\n\n")):
        if b'"usage"' not in event:
            continue
        data = b"".join(line[5:] for line in event.split(b"\n") if line.startswith(b"data:"))
        counts = usage_from_json(data)
        if counts is not None:
            return counts
    return None


class ResponseTail:
    """Keeps the last TAIL_BYTES (at least) of a response body without copying every chunk."""

    __slots__ = ("_chunks", "_size", "_limit")

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = limit

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while len(self._chunks) > 1 and self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.pop(0))

    def bytes(self) -> bytes:
        return b"".join(self._chunks)
