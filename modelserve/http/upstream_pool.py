"""The hot path's upstream client: pooled keep-alive HTTP/1.1 connections, each an asyncio Protocol
with httptools' C parser, for the one thing the proxies do per request: send a method, a path,
headers and a body they already hold, and stream back the status, the raw headers and the body.

Why not aiohttp here (it stays for the probes, the engine's metrics and the gateway's model lists):
its per-request machinery (ClientRequest, CIMultiDicts, payload objects, tracing, timers per chunk)
was a third of the proxies' CPU per request in profiles; this does the same exchange in a few
Python calls. Errors say what happened in the words the metrics use (connect, disconnected,
timeout), and nothing here retries: the callers decide (the sidecar once, the gateway on another
replica).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httptools

# Below the engines' own keep-alive (uvicorn's default 5 s, which vLLM keeps), so the proxy never
# reuses a connection the engine is closing at that moment (it would look like a dead engine).
KEEPALIVE_SECONDS = 3.0
# Above this much body read ahead of a slow client, stop reading the upstream (TCP pushes back).
READ_AHEAD_BYTES = 256 * 1024
# A body this small goes out in one write with its head (one segment instead of two).
JOIN_BODY_BYTES = 64 * 1024
# Methods whose empty body still gets `Content-Length: 0`, as aiohttp sent it (the engines saw that).
_LENGTH_WHEN_EMPTY = frozenset({"POST", "PUT", "PATCH"})
# Methods never sent with a body: a server that does not frame one reads it as the next request.
_BODILESS = frozenset({"GET", "HEAD"})

Headers = list[tuple[bytes, bytes]]


class UpstreamError(Exception):
    """The exchange with the upstream failed (a timeout is TimeoutError)."""


class ConnectFailed(UpstreamError):
    """No connection could be made (refused, unreachable, TLS failed)."""


class TLSRefused(ConnectFailed):
    """The TLS handshake failed: most often the upstream's certificate is not trusted, or does not
    name the server name it was checked for."""


class Disconnected(UpstreamError):
    """The connection closed, reset or answered garbage before the response headers were complete:
    the request may not have reached the upstream, so a caller may send it again."""


class BodyCut(UpstreamError):
    """The connection ended in the middle of the response body."""


class _Surplus(Exception):
    """Raised from the parser's callback to stop it at a second message after a complete response."""


@dataclass(frozen=True)
class Origin:
    """Where a URL's requests go, and the Host header and credentials they carry (pure)."""

    key: str  # scheme://host:port, what the pool keys its idle connections by (a str hashes once)
    scheme: str
    host: str
    port: int
    host_header: bytes
    authorization: bytes | None  # Basic credentials from the URL's userinfo, as aiohttp sent them


def split_url(url: str) -> tuple[Origin, bytes]:
    """(origin, request target) of an absolute http(s) URL whose path is already encoded (pure)."""
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode("latin-1")
        authorization = b"Basic " + base64.b64encode(credentials)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = shown if port == default else f"{shown}:{port}"
    key = f"{parts.scheme}://{shown}:{port}"
    origin = Origin(key, parts.scheme, host, port, host_header.encode("idna"), authorization)
    return origin, target.encode("latin-1")


def forbid_get_body(method: str, body: bytes) -> None:
    """Raise ValueError for a body on a GET or HEAD (the proxies refuse one before: never sent)."""
    if body and method in _BODILESS:
        raise ValueError(f"a {method} request is never sent with a body")


def request_head(method: str, target: bytes, origin: Origin, headers: Headers, body_length: int) -> bytes:
    """The request line and headers, in the order aiohttp wrote them: Host, the caller's headers,
    then the length (pure)."""
    lines = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nHost: ", origin.host_header, b"\r\n"]
    for name, value in headers:
        lines += (name, b": ", value, b"\r\n")
    if origin.authorization is not None:
        lines += (b"Authorization: ", origin.authorization, b"\r\n")
    if body_length or method in _LENGTH_WHEN_EMPTY:
        lines += (b"Content-Length: ", str(body_length).encode("ascii"), b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def mime_type(headers: Headers) -> str:
    """The media type of a Content-Type header, lower-cased without parameters; aiohttp's default
    when there is none (pure)."""
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower().decode("latin-1") or "application/octet-stream"
    return "application/octet-stream"


class Response:
    """One upstream response: status and raw headers once `Pool.request` returns, then the body.
    Used as `async with`: on leaving, the connection goes back to the pool if the body was read to
    its end, and is closed otherwise (which is how an upstream learns a client went away)."""

    __slots__ = ("_connection", "raw_headers", "read_chunk", "status")

    def __init__(self, connection: _Connection, status: int, raw_headers: Headers) -> None:
        self._connection = connection
        self.status = status
        self.raw_headers = raw_headers
        # What has arrived of the body since the last call (waiting for some), b"" at its end: the
        # connection's own coroutine, not one more wrapped around it on every chunk.
        self.read_chunk: Callable[[], Awaitable[bytes]] = connection.read_chunk

    @property
    def content_type(self) -> str:
        return mime_type(self.raw_headers)

    @property
    def complete(self) -> bool:
        """The whole body has arrived (some of it may not have been read yet)."""
        return self._connection.complete

    def rest(self) -> bytes:
        """What has arrived of the body and not been read, without waiting: all of it when complete."""
        return self._connection.take()

    @property
    def at_end(self) -> bool:
        """The whole body has been read (the last chunk may go out as the last one, in one write)."""
        connection = self._connection
        return connection.complete and not connection.body

    def pipe(self, sink: Callable[[bytes, bool], bool], drain: Callable[[], Awaitable[None]]) -> Awaitable[None]:
        """The rest of the body to `sink` as it arrives, from the connection's callbacks (no reader
        woken per chunk): `sink(chunk, last)`, False when it is full (then `drain()` is awaited)."""
        return self._connection.pipe(sink, drain)

    def release(self) -> None:
        self._connection.done()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self._connection.done()


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.headers: Headers = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.framed = False  # a length or chunked: else the body ends when the connection does
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        # Instead of a waiter: called once the response headers are in (after the whole segment that
        # brought them was parsed) or the exchange failed. The server's express lane (express.py).
        self.on_answer: Callable[[_Connection], None] | None = None
        # Instead of a reader woken per chunk (Response.pipe): given the body bytes each read brought,
        # from this protocol's callback, and whether they end the body; False to pause reading.
        self.sink: Callable[[bytes, bool], bool] | None = None
        self.sink_ended = False  # the sink was given the body's end
        self.last_read = 0.0
        self.released = False

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.released or self.complete:
            # Bytes after the response's end (nobody asked for them): a desynchronised or smuggling
            # upstream, never trusted again; the complete response is what was answered. (In the
            # read that ends it, llhttp skips CR and LF between messages: they can carry nothing.)
            self.close()
            return
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.complete:  # more after the end in this read (stopped by on_message_begin): likewise
                self.close()
            else:
                error = Disconnected(f"malformed response: {exc}") if not self.headers_done else BodyCut(str(exc))
                self._fail(error)
        if self.headers_done and self.on_answer is not None:
            self._answered()
        elif self.sink is not None and self.error is None and (self.body or self.complete):
            self._deliver()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.complete:
            return
        if self.headers_done and not self.framed and exc is None:
            self.complete = True  # a body delimited by the connection's end
            self._wake()
        elif self.headers_done:
            self._fail(BodyCut("the upstream closed the connection in the middle of the response"))
        else:
            self._fail(Disconnected("the upstream closed the connection before answering"))

    def pause_writing(self) -> None:  # a large body to an upstream that reads slowly: the transport buffers it
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a second message in the read that ended the first: stop before it
            raise _Surplus

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        if self.sink is not None:
            return  # delivered once the read is parsed (data_received), with no reader to wake
        self.buffered += len(body)
        if self.buffered > READ_AHEAD_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.framed = True
        self.pool.busy.discard(self)
        self._wake()

    # --- the exchange -------------------------------------------------------------------------

    def send(self, method: str, target: bytes, headers: Headers, body: bytes) -> None:
        """Write the request (raises Disconnected when the connection is closing under us)."""
        self._reset()
        head = request_head(method, target, self.origin, headers, len(body))
        assert self.transport is not None
        try:
            if len(body) <= JOIN_BODY_BYTES:
                self.transport.write(head + body)
            else:
                self.transport.writelines((head, body))
        except (RuntimeError, OSError) as exc:  # closing under us (the upstream's FIN was on its way)
            self.close()
            raise Disconnected(f"the connection closed before the request was sent: {exc}") from exc
        self.last_read = self.loop.time()
        self.pool.watch(self)

    def answer(self) -> Response | BaseException:
        """Once `on_answer` was called: the response (its headers in, maybe its body), or the error."""
        if self.headers_done:
            return Response(self, self.parser.get_status_code(), self.headers)
        assert self.error is not None
        return self.error

    def _answered(self) -> None:
        on_answer, self.on_answer = self.on_answer, None
        if on_answer is not None:
            on_answer(self)

    async def exchange(self, method: str, target: bytes, headers: Headers, body: bytes) -> Response:
        self.send(method, target, headers, body)
        try:
            while not self.headers_done:
                await self._wait()
        except BaseException:
            self.close()
            raise
        return Response(self, self.parser.get_status_code(), self.headers)

    async def read_chunk(self) -> bytes:
        try:
            while not self.body:
                if self.complete:
                    return b""
                await self._wait()
        except BaseException:
            self.close()
            raise
        return self.take()

    def take(self) -> bytes:
        """The body bytes buffered so far (reading on if a slow reader had paused them)."""
        body = self.body
        chunk = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.last_read = self.loop.time()
            self.transport.resume_reading()
        return chunk

    def _deliver(self) -> None:
        """What this read brought of the body, to the sink; reading paused if the sink is full (the
        reader, woken, waits for it to drain and resumes), the reader woken at the body's end."""
        assert self.sink is not None
        body = self.body
        chunk = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self.sink_ended = self.complete
        if not self.sink(chunk, self.complete) and not self.complete and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            self._wake()
        if self.complete:
            self._wake()

    async def pipe(self, sink: Callable[[bytes, bool], bool], drain: Callable[[], Awaitable[None]]) -> None:
        """The rest of the body to `sink` from this protocol's callbacks, until it ends (raises the
        exchange's error). `drain`: until the sink takes more, after it said it was full."""
        self.sink = sink
        self.buffered = 0
        try:
            if self.body or self.complete:
                self._deliver()
            while not self.complete:
                if not self.paused:
                    await self._wait()
                    continue
                # Paused by the sink (its client's buffer full), or by the read-ahead bound before
                # the pipe was laid: on once the client has drained.
                await drain()
                self.paused = False
                self.last_read = self.loop.time()
                if self.transport is not None:
                    self.transport.resume_reading()
                if self.body or self.complete:
                    self._deliver()
            if not self.sink_ended:  # a body the connection's end delimited: it ended in connection_lost
                self._deliver()
        except BaseException:
            self.close()
            raise
        finally:
            self.sink = None

    def done(self) -> None:
        """The caller is finished with the response: pool the connection, or close it."""
        if self.released:
            return
        self.released = True
        self.pool.busy.discard(self)
        if self.complete and self.keep_alive and not self.closed and not self.body:
            self.pool.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        self.pool.busy.discard(self)
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        if self.error is not None:
            raise self.error

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()
        self.close()
        if self.on_answer is not None and not self.headers_done:
            self._answered()

    def check_silence(self, now: float, timeout: float) -> None:
        """Fail the exchange if the upstream has sent nothing for `timeout` seconds (aiohttp's
        sock_read). A paused read is a slow client, not a silent upstream."""
        if self.paused:
            self.last_read = now
        elif now - self.last_read >= timeout:
            self._fail(TimeoutError(f"the upstream sent nothing for {timeout:g} s"))


class Pool:
    """Keep-alive connections per origin, at most `max_connections` open at once (a request beyond
    waits for one), each reused only within KEEPALIVE_SECONDS of its last exchange."""

    def __init__(
        self,
        max_connections: int,
        connect_timeout: float,
        read_timeout: float,
        tls: ssl.SSLContext | None = None,
        server_names: Mapping[str, str] | None = None,
    ) -> None:
        """`tls`: the context https origins are checked with (default: the system's trust store);
        `server_names`: the name an https origin's certificate must carry, by the origin's key
        (scheme://host:port), where it is not the host (the gateway reaches a pod by its address,
        whose certificate names its Service)."""
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle_by_origin: dict[str, list[_Connection]] = {}
        self._open = 0
        self._all: set[_Connection] = set()
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._origins: dict[str, tuple[Origin, bytes]] = {}
        self._ssl = tls
        self._server_names: Mapping[str, str] = server_names if server_names is not None else {}
        # Connections waiting for an answer, checked for silence by one periodic sweep: a timer per
        # exchange (or per chunk) cost more than the sweep.
        self.busy: set[_Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_seconds = min(1.0, read_timeout / 4)

    async def request(
        self, method: str, url: str, headers: Headers, body: bytes = b"", fresh: bool = False
    ) -> Response:
        """Send the request; the response's status and headers have arrived when this returns.
        `fresh`: the idle connections to that origin closed first, so it goes on a new one (the retry
        after a pooled connection failed: its peer may have closed the others it left idle too). At
        the connection limit it waits, and may then take one another request has just put back."""
        forbid_get_body(method, body)
        origin, target = self._split(url)
        if fresh:
            for connection in self._idle_by_origin.pop(origin.key, []):
                connection.close()
        connection = self._idle(origin) or await self._acquire(origin)
        return await connection.exchange(method, target, headers, body)

    def send_now(
        self, method: str, url: str, headers: Headers, body: bytes, on_answer: Callable[[_Connection], None]
    ) -> _Connection | None:
        """Send the request at once on an idle pooled connection, which calls `on_answer` when the
        response headers are in or the exchange failed (its `answer()` says which); None, and nothing
        sent, when no idle connection is fresh. Raises Disconnected when the write fails."""
        forbid_get_body(method, body)
        origin, target = self._split(url)
        connection = self._idle(origin)
        if connection is None:
            return None
        connection.send(method, target, headers, body)
        connection.on_answer = on_answer  # nothing can arrive before the loop's next read
        return connection

    def _split(self, url: str) -> tuple[Origin, bytes]:
        split = self._origins.get(url)
        if split is None:
            split = self._origins[url] = split_url(url)
            if len(self._origins) > 4096:  # gateway URLs follow replicas: never an unbounded cache
                self._origins.clear()
        return split

    def _idle(self, origin: Origin) -> _Connection | None:
        """A pooled connection to `origin` still fresh, if there is one."""
        idle = self._idle_by_origin.get(origin.key)
        if idle:
            now = idle[-1].loop.time()
            while idle:
                connection = idle.pop()
                fresh = now - connection.idle_since < KEEPALIVE_SECONDS
                if fresh and not connection.closed and not connection.transport.is_closing():  # type: ignore[union-attr]
                    return connection
                connection.close()
        return None

    async def _acquire(self, origin: Origin) -> _Connection:
        while True:
            connection = self._idle(origin)
            if connection is not None:
                return connection
            if self._open < self.max_connections:
                break
            waiter = asyncio.get_running_loop().create_future()  # all connections are busy: rare
            self._waiting.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
        self._open += 1
        connection = _Connection(self, origin)
        self._all.add(connection)
        try:
            await self._connect(connection)
        except BaseException:
            self.forget(connection)
            raise
        return connection

    async def _connect(self, connection: _Connection) -> None:
        origin = connection.origin
        tls: ssl.SSLContext | None = None
        if origin.scheme == "https":
            tls = self._ssl = self._ssl or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        name = self._server_names.get(origin.key, origin.host) if tls else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(
                    lambda: connection, origin.host, origin.port, ssl=tls, server_hostname=name
                )
        except ssl.SSLError as exc:
            raise TLSRefused(f"TLS with {origin.host}:{origin.port} as {name}: {exc}") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {exc}") from exc

    def watch(self, connection: _Connection) -> None:
        self.busy.add(connection)
        if self._sweep is None:
            self._sweep = connection.loop.call_later(self._sweep_seconds, self._check_silence)

    def _check_silence(self) -> None:
        self._sweep = None
        if not self.busy:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in list(self.busy):
            connection.check_silence(now, self.read_timeout)
        if self.busy:
            self._sweep = loop.call_later(self._sweep_seconds, self._check_silence)

    def put_back(self, connection: _Connection) -> None:
        connection.idle_since = connection.loop.time()  # the next exchange resets the rest
        self._idle_by_origin.setdefault(connection.origin.key, []).append(connection)
        self._wake_one()

    def forget(self, connection: _Connection) -> None:
        """A connection closed: it no longer counts, and a waiting request may open one."""
        if connection in self._all:
            self._all.discard(connection)
            self._open -= 1
            idle = self._idle_by_origin.get(connection.origin.key)
            if idle and connection in idle:
                idle.remove(connection)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._all):
            connection.close()
        await asyncio.sleep(0)  # let the transports run their connection_lost
