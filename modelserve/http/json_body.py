"""JSON a client sent, read and written without an exception escaping (pure): a hostile body (100,000
nested `[`, an integer of 5,000 digits) makes the json module raise RecursionError or a plain
ValueError, which would answer 500 with a traceback in the log; here it is a reason to refuse."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

NESTED_TOO_DEEPLY = "nested too deeply"
# Values in a body beyond which reading it would stall an event loop (such a body is read off it:
# pipeline.py): the json module builds about a million small values a second, so this many cost about 20 ms.
MANY_VALUES = 20_000


@dataclass(frozen=True)
class BadJson:
    """Why a body is not JSON the proxies take, in words for the client's 400."""

    reason: str


def parse(data: bytes | str) -> Any | BadJson:
    """The JSON value `data` holds, or why it cannot be read."""
    try:
        return json.loads(data)
    except RecursionError:
        return BadJson(NESTED_TOO_DEEPLY)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return BadJson(str(exc))
    except ValueError:  # the one other: an integer past Python's digit limit (its message names sys)
        return BadJson(f"a number has more than {sys.get_int_max_str_digits()} digits")


def value_count(data: bytes) -> int:
    """About how many values `data`, as JSON, holds, at most (pure): its separators and openings
    counted at C speed, a few milliseconds a megabyte, plus one."""
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def encode(value: Any) -> bytes | BadJson:
    """`value` (read from a client) as JSON; BadJson when it is nested too deeply to write: within
    the limit where it was read, it may be beyond it a few levels deeper or further down the stack."""
    try:
        return json.dumps(value).encode()
    except RecursionError:
        return BadJson(NESTED_TOO_DEEPLY)
