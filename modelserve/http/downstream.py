"""The client side of one proxied exchange, as the hot path (relay.py, both proxies) sees it: read the
request body, answer, learn that the client went away. Two kinds:

- `AsgiDownstream`, over ASGI's `receive` and `send`: what the Ollama adapter and every route served
  through the ASGI app use;
- the direct protocol's exchange (direct.py), which the server hands the proxied consumer routes to
  without an ASGI cycle, a task per request less and no message dicts.

Both behave alike byte for byte on the wire; the tests run the proxies through both.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from . import errors

Headers = list[tuple[bytes, bytes]]


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


class Exchange:
    """One request through the pipeline (pipeline.py): what it did, for its metrics, and its plan."""

    __slots__ = ("admitted", "client_gone", "ended", "plan", "read", "route", "start", "status", "ttfb")

    def __init__(self, start: float) -> None:
        self.start = start
        self.admitted: Any = None  # what `admit` let it in with (the sidecar's key): `end` gives it back
        self.read: Any = None  # its body as `read` read it off the event loop, for `plan` (pipeline.py)
        self.status = 500
        self.ttfb: float | None = None
        self.client_gone = False
        self.route = ""  # the route its metrics name
        self.plan: Any = None  # the pipeline's Plan, once its body was checked
        self.ended = False


class Downstream(Protocol):
    async def read_body(self, limit: int) -> bytes | None:
        """The whole request body, None when it grows beyond `limit` bytes; raises ClientGone."""

    async def start(self, status: int, headers: Headers) -> None:
        """The status line and headers (sent at once: a stream's client sees them before any token)."""

    async def write(self, chunk: bytes) -> None:
        """Body bytes, more to follow."""

    async def end(self, chunk: bytes = b"") -> None:
        """The last body bytes: the answer is complete."""

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        """A complete answer at once."""

    def gone(self) -> asyncio.Future[None]:
        """Done when the client goes away (only asked for while the request is held or relayed)."""

    def cancel_on_disconnect(self, exchange: Exchange) -> None:
        """From now until `end`, a client that goes away sets `exchange.client_gone` and cancels the
        task serving the request (which closes the upstream connection, which makes the engine abort
        the generation)."""


def hung_up(gone: asyncio.Future[None] | None, cancel: tuple[asyncio.Task[Any], Exchange] | None) -> None:
    """The client went away: `gone` is done, and the task relaying its answer (if any) is marked
    and cancelled."""
    if gone is not None and not gone.done():
        gone.set_result(None)
    if cancel is not None:
        task, exchange = cancel
        exchange.client_gone = True
        task.cancel()


async def answer(client: Downstream, error: errors.ErrorResponse, close: bool = False) -> int:
    """Answer with one of our own errors; its status."""
    body = error.body()
    headers = error.headers(body)
    if close:  # the rest of an oversized body is not read, so the connection cannot be reused
        headers.append((b"connection", b"close"))
    await client.whole(error.status, headers, body)
    return error.status


async def read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body from ASGI's `receive`, or None when it grows beyond `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class AsgiDownstream:
    """A Downstream over ASGI's `receive` and `send`. One watcher task, started when a disconnect is
    first asked about, reads `receive` (ASGI allows one reader) until the client goes away."""

    __slots__ = ("_cancel", "_done", "_gone", "_receive", "_send", "_watcher")

    def __init__(self, receive: Any, send: Any) -> None:
        self._receive = receive
        self._send = send
        self._gone: asyncio.Future[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._cancel: tuple[asyncio.Task[Any], Exchange] | None = None
        self._done = False

    async def read_body(self, limit: int) -> bytes | None:
        return await read_body(self._receive, limit)

    async def start(self, status: int, headers: Headers) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, chunk: bytes) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self, chunk: bytes = b"") -> None:
        # Before the last send: after it, receive() reports a disconnect, which is no client gone.
        self._done = True
        self._cancel = None
        if self._watcher is not None:
            self._watcher.cancel()
        await self._send({"type": "http.response.body", "body": chunk, "more_body": False})

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        await self.start(status, headers)
        await self.end(body)

    def gone(self) -> asyncio.Future[None]:
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
            self._watch()
        return self._gone

    def cancel_on_disconnect(self, exchange: Exchange) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._cancel = (task, exchange)
        self._watch()

    def close(self) -> None:
        """The exchange is over: stop watching."""
        self._cancel = None
        if self._watcher is not None:
            self._watcher.cancel()

    def _watch(self) -> None:
        if self._watcher is None and not self._done:
            self._watcher = asyncio.get_running_loop().create_task(self._wait_for_disconnect())

    async def _wait_for_disconnect(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        cancel, self._cancel = self._cancel, None
        hung_up(self._gone, cancel)
