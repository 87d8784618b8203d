"""Token usage read from the end of engine responses (pure), for the token counters."""

from __future__ import annotations

import json
from typing import Any

# Engines put `usage` at the end: the last keys of a JSON answer, the last event before
# `data: [DONE]` of a stream. Only this much of a response's end is kept and searched.
TAIL_BYTES = 16384

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\r\n"


def usage_counts(usage: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a `usage` object, if it is one: chat and completions
    name them so (embeddings have no completion), the Responses API input_tokens and output_tokens."""
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens", 0)
    else:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return prompt, completion


def usage_from_tail(tail: bytes) -> tuple[int, int] | None:
    """The last `"usage": {...}` in the end of a JSON answer or an SSE stream (a stream that
    reports usage in every chunk ends with the cumulative one). Decoding only that object, not
    the whole answer, keeps the cost independent of the answer's length."""
    text = tail.decode("utf-8", "replace")
    end = len(text)
    while (key := text.rfind('"usage"', 0, end)) >= 0:
        end = key
        at = _skip_whitespace(text, key + len('"usage"'))
        if at < len(text) and text[at] == ":":
            try:
                value, _ = _DECODER.raw_decode(text, _skip_whitespace(text, at + 1))
            except ValueError:
                continue
            counts = usage_counts(value)
            if counts is not None:
                return counts
    return None


def _skip_whitespace(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


class ResponseTail:
    """Keeps the last TAIL_BYTES (at least) of a response body: each chunk appended as it is (a stream
    adds one per token), cut back to TAIL_BYTES in one join once twice that is held."""

    __slots__ = ("_chunks", "_limit", "_size")

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = limit

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size >= 2 * self._limit:
            kept = b"".join(self._chunks)[-self._limit :]
            self._chunks = [kept]
            self._size = len(kept)

    def bytes(self) -> bytes:
        return b"".join(self._chunks)
