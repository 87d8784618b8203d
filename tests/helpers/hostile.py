"""Raw-socket clients that behave as an attacker would against the sidecar and the gateway: bytes on
the wire exactly as written (HTTP clients normalise, frame and time out on their own), every loop
bounded in bytes and time, every socket closed by the caller's `with`."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from harness.sidecar import API_KEY, RawAnswer, dechunk

KEYED = {"Authorization": f"Bearer {API_KEY}"}
CHAT = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


@dataclass
class Outcome:
    """What a raw client got: the answer (None: none came) and whether the server closed."""

    answer: RawAnswer | None
    closed: bool


def still_serves(base: str) -> None:
    """/healthz and a keyed chat request (model `tiny`) answer, each on a new connection."""
    assert httpx.get(base + "/healthz", timeout=10).status_code == 200
    answer = httpx.post(base + "/v1/chat/completions", content=CHAT, headers=KEYED, timeout=30)
    assert answer.status_code == 200, answer.text


def error_code(body: bytes) -> str:
    """The code of an OpenAI-shaped error answer."""
    return json.loads(body)["error"]["code"]


def connect(base: str, timeout: float = 10.0, source: str | None = None) -> socket.socket:
    """A connection to `base`; `source`: the local address it comes from (another 127.x.y.z: another
    client as the server counts them)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout, source_address=(source, 0) if source else None)


def send_until_answered(connection: socket.socket, pieces: Iterable[bytes], max_bytes: int) -> int:
    """Send `pieces` until the server answers (or closes), `max_bytes` are sent, or a write fails;
    the bytes sent."""
    sent = 0
    for piece in pieces:
        readable, _, _ = select.select([connection], [], [], 0)
        if readable or sent >= max_bytes:
            break
        try:
            connection.sendall(piece)
        except OSError:  # the server closed (and reset) under the write
            break
        sent += len(piece)
    return sent


def read_outcome(connection: socket.socket, bound: float) -> Outcome:
    """The first answer within `bound` seconds, and whether the connection was closed after it
    (or instead of it)."""
    deadline = time.monotonic() + bound
    data = b""
    closed = False
    answer: RawAnswer | None = None
    while time.monotonic() < deadline:
        connection.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            break
        except OSError:  # reset
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
        answer = _whole_answer(data)
        if answer is not None:
            # Closed after it? Either way it shows within a moment of the answer.
            connection.settimeout(min(3.0, max(0.05, deadline - time.monotonic())))
            try:
                closed = connection.recv(1) == b""
            except TimeoutError:
                closed = False
            except OSError:
                closed = True
            break
    if answer is None and data:
        answer = _whole_answer(data, complete=False)
    return Outcome(answer, closed)


def read_until_closed(connection: socket.socket, bound: float) -> tuple[bytes, bool]:
    """Everything the server sends within `bound` seconds, and whether it closed the connection."""
    deadline = time.monotonic() + bound
    data = b""
    while time.monotonic() < deadline:
        connection.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            return data, False
        except OSError:  # reset
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def answers_in(data: bytes) -> list[RawAnswer]:
    """The whole answers, one after another, in what a connection received (pipelined requests')."""
    answers = []
    while data:
        answer, used = _answer_and_length(data)
        if answer is None:
            break
        answers.append(answer)
        data = data[used:]
    return answers


def _answer_and_length(data: bytes) -> tuple[RawAnswer | None, int]:
    """The first whole answer in `data` and the bytes it takes (its framing walked: chunks one by one)."""
    head, found, rest = data.partition(b"\r\n\r\n")
    if not found:
        return None, 0
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
    start = len(head) + 4
    if headers.get("transfer-encoding") != "chunked":
        length = int(headers.get("content-length", 0))
        if len(rest) < length:
            return None, 0
        return RawAnswer(int(status_line.split()[1]), headers, rest[:length]), start + length
    body, at = b"", 0
    while True:
        line_end = rest.find(b"\r\n", at)
        if line_end < 0:
            return None, 0
        size = int(rest[at:line_end].split(b";")[0], 16)
        at = line_end + 2
        if size == 0:
            end = rest.find(b"\r\n", at)  # no trailers in these answers: the blank line
            return (None, 0) if end < 0 else (RawAnswer(int(status_line.split()[1]), headers, body), start + end + 2)
        if len(rest) < at + size + 2:
            return None, 0
        body += rest[at : at + size]
        at += size + 2


def _whole_answer(data: bytes, complete: bool = True) -> RawAnswer | None:
    head, found, rest = data.partition(b"\r\n\r\n")
    if not found:
        return None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
    if "content-length" in headers:
        length = int(headers["content-length"])
        if complete and len(rest) < length:
            return None
        rest = rest[:length]
    elif headers.get("transfer-encoding") == "chunked":
        if complete and not rest.endswith(b"0\r\n\r\n"):
            return None
        rest = dechunk(rest)
    return RawAnswer(int(status_line.split()[1]), headers, rest)


def chat_head(path: str = "/v1/chat/completions", headers: dict[str, str] | None = None) -> bytes:
    """A request line and headers, without the blank line that ends them."""
    lines = [f"POST {path} HTTP/1.1", "Host: modelserve", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return "".join(line + "\r\n" for line in lines).encode("latin-1")


def endless_headers(piece_bytes: int = 16 * 1024) -> Iterable[bytes]:
    """Header lines forever, `piece_bytes` at a time (the caller bounds the total)."""
    index = 0
    while True:
        lines = []
        size = 0
        while size < piece_bytes:
            line = f"X-Fill-{index}: {'a' * 200}\r\n".encode()
            lines.append(line)
            size += len(line)
            index += 1
        yield b"".join(lines)
