"""The server's fast lane: uvicorn's HTTP/1.1 protocol (httptools), with the proxied consumer routes
handed straight to the proxy instead of through an ASGI cycle.

Why: per request, the ASGI cycle (scope and message dicts, an Event per receive, the task that runs
the app, the task that watches `receive` for a disconnect, header checks on every send) cost more
CPU than the proxying itself in profiles. Here a proxied request is one task reading the body this
protocol collected, and answering with writes to the transport; the protocol's `connection_lost`
is the disconnect. Everything else (the sidecar's and gateway's own routes, Ollama's, refusals,
WebSocket upgrades) is served by the ASGI app exactly as before.

What the ASGI path did is kept on the wire: the same status line, headers in the order given, the
same framing (the upstream's length, else chunked), `connection: close` when the connection ends,
100-continue when the body is first read, pipelined requests answered in order, the keep-alive
timeout, flow control both ways, and uvicorn's graceful shutdown (it sees these tasks and cycles).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol

from .downstream import ClientGone, Exchange, Headers, hung_up
from .limits import RESERVED_CONNECTIONS, BodyBudget, ConnectionLimits, client_bucket, cut, refusal

log = logging.getLogger(__name__)

Handler = Callable[["DirectDownstream"], Awaitable[None]]


class DirectHandler(Protocol):
    """A proxy on the fast lane: `express` first (once the body is in, from the protocol's callbacks,
    without a task: express.py), and `direct` in a task when it declines or cannot start at once."""

    async def direct(self, request: DirectDownstream) -> None: ...

    def express(self, request: DirectDownstream) -> bool:
        """Serve the request (or start serving it) without awaiting; False, with nothing done, to
        leave it to `direct`."""

    def on_head(self, request: DirectDownstream) -> bool:
        """Once its head is in, before its body is read: answer (a refusal from the headers alone,
        the sidecar's 401) and True, or False with nothing done."""


# (method, raw path) -> the handler: exact bytes, so a path that needs decoding takes the ASGI way.
DirectRoutes = Mapping[tuple[bytes, bytes], DirectHandler]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_NO_BODY_STATUSES = (204, 304)
_INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class DirectDownstream:
    """One request on the fast lane: what it asked (method, path, headers, then its body) and its
    answer, written to the connection. Plays uvicorn's request-response cycle for the protocol
    (pipelining, shutdown), and the Downstream (downstream.py) for the proxy."""

    __slots__ = (
        "_body",
        "_body_size",
        "_cancel",
        "_chunked",
        "_flow",
        "_gone",
        "_protocol",
        "_transport",
        "_waiter",
        "admission",
        "admitted",
        "default_headers",
        "disconnected",
        "headers",
        "keep_alive",
        "loop",
        "method",
        "more_body",
        "on_lost",
        "on_response",
        "path",
        "response_complete",
        "response_started",
        "task",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        protocol: DirectProtocol,
        method: str,
        path: str,
        headers: Headers,
        keep_alive: bool,
        expect_100_continue: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.default_headers = protocol.server_state.default_headers
        self._protocol = protocol
        self.on_response: Callable[[], None] = protocol.on_response_complete
        self._transport = protocol.transport
        self._flow = protocol.flow
        self.loop = protocol.loop
        self._body: list[bytes] = []
        self._body_size = 0
        self.more_body = True
        self._waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self._chunked = False
        self._gone: asyncio.Future[None] | None = None
        self._cancel: tuple[asyncio.Task[Any], Exchange] | None = None
        self.task: asyncio.Task[None] | None = None  # the one running the proxy for it
        self.admitted = False  # the handler's `on_head` let it through from its head
        self.admission: Any = None  # and what it let it in with (pipeline.py's `admit`)
        # The express lane's (express.py) instead of a task to cancel: called once if the client goes.
        self.on_lost: Callable[[], None] | None = None

    # --- fed by the protocol ------------------------------------------------------------------

    def received(self, chunk: bytes) -> None:
        if self.response_complete:
            return  # an answer given before the body was read (a refusal): the rest is not wanted
        self._body.append(chunk)
        self._body_size += len(chunk)
        if self._body_size > HIGH_WATER_LIMIT:
            self._flow.pause_reading()  # read on when the proxy asks for more (read_body)
        self._wake()

    def complete(self) -> None:
        if not self.response_complete:
            self.more_body = False
            self._wake()

    def lost(self) -> None:
        self._body = []  # nobody reads it now: freed at once, however long the request's objects live
        if self.response_complete:
            return
        self.disconnected = True
        self._wake()
        cancel, self._cancel = self._cancel, None
        hung_up(self._gone, cancel)
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- the Downstream, awaiting ---------------------------------------------------------------

    async def read_body(self, limit: int) -> bytes | None:
        if self.waiting_for_100_continue and not self._transport.is_closing():
            self._transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        while self.more_body and not self.disconnected and self._body_size <= limit:
            self._flow.resume_reading()
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.disconnected:
            raise ClientGone
        if self._body_size > limit:
            return None
        return self.body()

    @property
    def client_host(self) -> str | None:
        """The client's address (the connection's peer), as ASGI's scope["client"][0]."""
        client = self._protocol.client
        return client[0] if client else None

    # --- without awaiting (the express lane) -------------------------------------------------------

    @property
    def body_size(self) -> int:
        return self._body_size

    @property
    def write_paused(self) -> bool:
        return self._flow.write_paused

    def body(self) -> bytes:
        """The whole body, once the protocol has it all (`more_body` false)."""
        body = self._body
        return body[0] if len(body) == 1 else b"".join(body)

    def whole_now(self, status: int, headers: Headers, body: bytes) -> None:
        """`whole` without waiting for a slow client to read (the transport buffers what it must)."""
        self._cancel = None
        if self.disconnected:
            return
        self._transport.write(self._head(status, headers) + self._framed_last(body))
        self._completed()

    def spawn(self, handler: Handler) -> None:
        """Go on in a task of this request's own, as if `handler` had been its handler."""
        self._protocol.start_task(self, handler)

    def track(self, job: Any) -> None:
        """While the express lane serves it: `job.cancel()` is the server's drain deadline, as a
        task's cancel (uvicorn waits for its tasks on shutdown, then cancels them)."""
        self._protocol.tasks.add(job)

    def untrack(self, job: Any) -> None:
        self._protocol.tasks.discard(job)

    # --- the Downstream -------------------------------------------------------------------------

    async def start(self, status: int, headers: Headers) -> None:
        if self._flow.write_paused and not self.disconnected:
            await self._flow.drain()
        if not self.disconnected:
            self._transport.write(self._head(status, headers))

    async def write(self, chunk: bytes) -> None:
        if self._flow.write_paused and not self.disconnected:
            await self._flow.drain()
        if self.disconnected or not chunk:
            return
        if self._chunked:
            self._transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            self._transport.write(chunk)

    def write_now(self, chunk: bytes, last: bool) -> bool:
        """`write`, or `end` when `last`, without waiting for a slow client (the transport buffers
        what it must); False when the client's buffer is full (await `drain` before more)."""
        if last:
            self._cancel = None
        if self.disconnected:
            return True
        if last:
            self._transport.write(self._framed_last(chunk))
            self._completed()
        elif chunk:
            self._transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if self._chunked else chunk)
        return not self._flow.write_paused

    async def drain(self) -> None:
        if self._flow.write_paused and not self.disconnected:
            await self._flow.drain()

    async def end(self, chunk: bytes = b"") -> None:
        self._cancel = None  # from here a hang-up is the answer's own end, not a client gone
        if self._flow.write_paused and not self.disconnected:
            await self._flow.drain()
        if self.disconnected:
            return
        self._transport.write(self._framed_last(chunk))
        self._completed()

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        """A complete answer, head and body in one write (one segment for a short answer)."""
        self._cancel = None
        if self._flow.write_paused and not self.disconnected:
            await self._flow.drain()
        self.whole_now(status, headers, body)

    def gone(self) -> asyncio.Future[None]:
        if self._gone is None:
            self._gone = self.loop.create_future()
            if self.disconnected:
                self._gone.set_result(None)
        return self._gone

    def cancel_on_disconnect(self, exchange: Exchange) -> None:
        assert self.task is not None
        self._cancel = (self.task, exchange)

    # --- the wire -----------------------------------------------------------------------------

    def _head(self, status: int, headers: Headers) -> bytes:
        """The status line and headers as uvicorn writes them, choosing the framing."""
        self.response_started = True  # as uvicorn: an invalid header below then closes, no 500
        self.waiting_for_100_continue = False
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += (name, b": ", value, b"\r\n")
        framed = False
        closes = False
        for raw_name, value in headers:
            if HEADER_VALUE_RE.search(value):  # as uvicorn: never a header that could split the answer
                raise RuntimeError("Invalid HTTP header value.")
            name = raw_name.lower()
            if name == b"content-length":
                framed = True
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                framed = self._chunked = True
            elif name == b"connection" and b"close" in (token.strip().lower() for token in value.split(b",")):
                self.keep_alive = False
                closes = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closes:
            content.append(b"connection: close\r\n")
        if not framed and status not in _NO_BODY_STATUSES:
            self._chunked = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _framed_last(self, chunk: bytes) -> bytes:
        if not self._chunked:
            return chunk
        if chunk:
            return b"%x\r\n%b\r\n0\r\n\r\n" % (len(chunk), chunk)
        return _LAST_CHUNK

    def _completed(self) -> None:
        self.response_complete = True
        if not self.keep_alive:
            self._transport.close()
        self.on_response()

    def cut(self) -> None:
        """End the connection in the middle of the answer: the client sees it was cut."""
        self._transport.close()

    def failed(self, exc: BaseException) -> None:
        """The proxy failed serving it, as uvicorn answers an app that raised: a 500 before the answer
        started, after it the connection closed (the client sees the answer cut)."""
        log.error("Exception in %s %s", self.method, self.path, exc_info=exc)
        if not self.response_started:
            self.internal_error()
        elif not self.response_complete:
            self.cut()

    def internal_error(self) -> None:
        """uvicorn's answer to an app that failed before answering (none to a client gone)."""
        self.response_started = True
        self.response_complete = True
        if not self.disconnected:
            self._transport.write(_INTERNAL_ERROR)
        self._transport.close()
        self.on_response()


# What DirectProtocol takes of uvicorn's HttpToolsProtocol, private parts included (hence uvicorn's pin
# in pyproject.toml): the methods it overrides, those it calls, the attributes it reads or sets.
# tests/http/test_uvicorn_seams.py checks each against the installed uvicorn, so an upgrade that
# renames or reshapes one fails a test, not the proxies.
UVICORN_OVERRIDES = (
    "connection_made",
    "data_received",
    "connection_lost",
    "on_message_begin",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "_start_asgi_task",
    "_unset_keepalive_if_required",
)
UVICORN_CALLS = (
    "_should_upgrade",
    "_unsupported_upgrade_warning",
    "handle_websocket_upgrade",
    "send_400_response",
    "timeout_keep_alive_handler",
)
UVICORN_ATTRIBUTES = (
    "app_state",
    "asgi_version",
    "client",
    "connections",
    "cycle",
    "expect_100_continue",
    "flow",
    "headers",
    "limit_concurrency",
    "logger",
    "loop",
    "parser",
    "pipeline",
    "root_path",
    "scheme",
    "scope",
    "server",
    "server_state",
    "tasks",
    "timeout_keep_alive",
    "timeout_keep_alive_task",
    "transport",
    "url",
)

# How long a connection refused by a bound still reads (and drops) what its client sends.
LINGER_SECONDS = 2.0
BUDGET_MESSAGE = "This server is receiving too many request bodies; retry later."
# Requests a connection may send ahead of the answer going out (HTTP/1.1 pipelining), parked until
# their turn: each is a request object held (about 700 bytes), and one read of 256 KiB of GETs parked
# 4,000 of them. Past this many the connection gets 429 after the answers before it and is closed.
PIPELINED = 16
PIPELINED_MESSAGE = f"More than {PIPELINED} requests sent ahead of their answers on one connection."
CONNECTIONS_MESSAGE = "Too many connections to this server; retry later."


class _Refused(Exception):
    """Stops the parser: the connection was answered and closed by a bound (limits.py)."""


class DirectProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a fast lane for `routes` (set on a subclass, see
    `protocol_for`); every other request goes through the ASGI app as in uvicorn. Every connection,
    whichever way its requests go, is held to `limits` (limits.py)."""

    routes: ClassVar[DirectRoutes] = MappingProxyType({})
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    max_connections: ClassVar[int] = ConnectionLimits.max_connections  # within the file limit
    budget: ClassVar[BodyBudget] = BodyBudget(ConnectionLimits.body_budget_bytes)
    # The connections with no complete request being served (idle, or a request still arriving), in
    # the order they became so: at the connection cap the first one makes room for a new one.
    evictable: ClassVar[dict[DirectProtocol, None]] = {}
    # Those of the connections past the cap (`_own_only`), in the same order: one of them makes room
    # only for another such (evicting one frees no place within the cap).
    evictable_own: ClassVar[dict[DirectProtocol, None]] = {}
    running: DirectDownstream | None = None  # the fast-lane request answering now, if any
    # A request whose handler starts once its whole body is in (express first), and that handler.
    deferred: tuple[DirectDownstream, DirectHandler] | None = None
    # The deadlines' clocks (None: not running). `idle_since`: when the last answer ended with nothing
    # after it (the keep-alive timeout); `head_since`: since when a request head is awaited (the
    # connection's start, or the first byte of the next request); `body_since`: since its head was
    # in. One timer per connection reads them, set again only when it fires or when a deadline comes
    # sooner than the one it waits for (a timer made and cancelled per request was a few per cent of
    # the proxies' CPU).
    idle_since: float | None = None
    head_since: float | None = None
    body_since: float | None = None
    # Since when an answer waits on a client that reads none of it (the transport's buffer over its
    # high-water mark): reading stops meanwhile, and past `limits.send_seconds` the connection is cut.
    send_since: float | None = None
    _guard_due = 0.0
    url = b""
    # Bytes read that no parsed part of a request accounts for yet. Each part is taken off as the parser
    # completes it, at its wire size (the head's line and fields, each field as `name: value`; a body's
    # payload; a chunk's size line and end; a trailer field), so what is left is a head or trailers
    # still arriving, whichever read brought them: a pipelined head that began in the read that ended
    # the request before it counts from its first byte. Zero again whenever a read ends with a request.
    _unparsed = 0
    _between = True  # no request begun since the last one ended (or the connection's start)
    # The request being received: its head's field bytes (names and values), its trailer fields,
    # whether its body is coming (head in, message not complete), the bytes of it counted in the
    # budget, and the current chunk's payload so far.
    _head_fields = 0
    _trailers = 0
    _in_body = False
    _body_held = 0
    _body_last = 0.0  # when its last body bytes came
    _body_client: str | None = None  # whose share of the budget they are (limits.client_bucket), once known
    _chunk_bytes = 0
    _refused = False
    _own_only = False  # one of the connections past the cap: the server's own routes only
    _after_answer = b""  # a refusal written once the answer in front of it ends
    _upgrade_ignored = False  # an Upgrade (h2c) not taken: its request is parsed again without it

    # --- the connection -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        now = self.loop.time()
        self.head_since = now
        connections = len(self.connections)
        if connections > self.max_connections:
            if self.evictable:
                next(iter(self.evictable)).evict()
            else:
                self._own_only = True
                if connections > self.max_connections + RESERVED_CONNECTIONS:
                    if not self.evictable_own:
                        self._refuse(503, CONNECTIONS_MESSAGE, "too_many_connections", "too_many_connections", False)
                        return
                    next(iter(self.evictable_own)).evict()
        self._order[self] = None
        self._arm(now + self.limits.head_seconds)

    @property
    def _order(self) -> dict[DirectProtocol, None]:
        """The eviction order this connection is in."""
        return self.evictable_own if self._own_only else self.evictable

    def evict(self, reason: str = "evicted") -> None:
        """Close without an answer, as an idle keep-alive connection is: one that serves nothing now
        (idle, or its request still arriving) to make room for a new one, or one that sent nothing
        of a request within the head's deadline."""
        self._order.pop(self, None)
        cut(reason)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and closing (lingering): dropped
        self.idle_since = None  # data arrived: not idle
        self._unparsed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self._upgrade_ignored:
                self._parse_without_upgrade(data[upgrade.args[0] :])
            elif self._should_upgrade():
                self._leave_bounds()  # the connection goes to uvicorn's WebSocket protocol
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._refused:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return
        # Bounds on what is still arriving: a head or trailers sent forever are never complete.
        if self._between:
            self._unparsed = 0  # the read ended with a request: nothing of one is held
        elif self._unparsed > self.limits.max_head_bytes:
            what = "trailers" if self._in_body else "header fields"
            self._refuse(431, f"Request {what} too large.", "request_header_fields_too_large", "head_too_large")

    def _leave_bounds(self) -> None:
        """Out of the bounds' bookkeeping (gone, or handed to another protocol): no timer, no place in
        the eviction order, no share of the body budget."""
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self._order.pop(self, None)
        self._release_body()

    def _parse_without_upgrade(self, rest: bytes) -> None:
        """A request asking to upgrade to what this server does not speak (h2c: curl --http2 sends it):
        the parser took its body for the new protocol's bytes, so it is parsed again as the plain
        HTTP/1.1 request it also is (RFC 9110 7.8: a server may ignore Upgrade), body and all."""
        self._upgrade_ignored = False
        parser = self.parser
        method, version = parser.get_method(), parser.get_http_version()
        head = [method, b" ", self.url, b" HTTP/", version.encode("ascii"), b"\r\n"]
        for name, value in self.headers:
            kept = value
            if name == b"connection":
                kept = b", ".join(t.strip() for t in value.split(b",") if t.strip().lower() != b"upgrade")
            if name != b"upgrade" and kept:
                head += (name, b": ", kept, b"\r\n")
        head.append(b"\r\n")
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
        self.head_since = self.loop.time()
        self._unparsed = 0  # counted again as it is parsed again
        self.data_received(b"".join(head) + rest)

    def _refuse(self, status: int, message: str, code: str, reason: str, linger: bool = True) -> None:
        """Answer with one of the bounds' own errors and close. While a request in front of the refused
        one is still answered (the refused one parked behind it, or its head still arriving), or the
        refused request's own answer goes out, nothing is cut: that answer ends whole, then the refusal
        follows and the connection closes (`on_response_complete`); requests parked behind it are
        dropped unanswered. Nothing is written when the request still arriving was answered already
        (its 401 before its body). With `linger`, what the client still sends is read and dropped for
        a moment after the answer (as nginx's lingering close): closed at once with unread bytes, the
        connection would be reset, and a reset can take the answer with it before the client reads it."""
        if self._refused:  # refused once already (a deadline that fires while the answer lingers)
            return
        self._refused = True
        cut(reason)
        cycle = self.cycle  # the refused request's, once its head is in; else the one before it
        transport = self.transport
        answer = refusal(status, message, code, self.url.startswith(b"/api/"))
        # Nothing more is parsed: the head received so far (the parser's partial field, the fields) is
        # freed now, not when the connection goes after lingering.
        self.parser = httptools.HttpRequestParser(self)
        self.headers = []
        if self._in_body:
            in_front = bool(self.pipeline) or (cycle.response_started and not cycle.response_complete)  # type: ignore[truthy-function]
        else:
            in_front = cycle is not None and not cycle.response_complete
        if in_front:
            for parked, _ in self.pipeline:
                if isinstance(parked, DirectDownstream):
                    parked.lost()
            self.pipeline.clear()
            self._release_body()
            self._after_answer = answer if not (self._in_body and cycle.response_started) else b""  # type: ignore[truthy-function]
            return
        answered = cycle is not None and cycle.response_started and self._in_body  # type: ignore[truthy-function]
        if not transport.is_closing() and not answered:
            transport.write(answer)
        # Its handler, if one runs, finds the client gone at once, and writes nothing more.
        if isinstance(cycle, DirectDownstream):
            cycle.lost()
        elif cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
        if linger:
            self._linger()
        else:
            transport.close()

    def _linger(self) -> None:
        transport = self.transport
        if not transport.is_closing() and transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave_bounds()
        if self.deferred is not None:  # gone before its body was in: the task finds it gone
            cycle, handler = self.deferred
            self.deferred = None
            self._start_asgi_task(cycle, handler)
        running = self.running
        if running is not None:
            running.lost()
        cycle = self.cycle
        if isinstance(cycle, DirectDownstream):
            cycle.lost()
            self.cycle = None  # type: ignore[assignment]  # uvicorn's own handling is for its cycles
        super().connection_lost(exc)
        # Nothing of the connection outlives it by a reference cycle (the protocol and its requests
        # point at each other): a body it held is freed now, not at the collector's next pass.
        self.running = None
        self.cycle = None  # type: ignore[assignment]
        self.pipeline.clear()
        if cycle is not None and not isinstance(cycle, DirectDownstream):
            cycle.body = b""

    # --- the parser's callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        # The ASGI scope is built only for a request that takes the ASGI way (on_headers_complete).
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = None  # type: ignore[assignment]
        self._between = False
        self._head_fields = self._trailers = 0
        if self.head_since is None:
            self.head_since = self.loop.time()
            self._arm(self.head_since + self.limits.head_seconds)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_body:  # a chunked body's trailer: never a request header (dropped, but counted)
            self._unparsed -= len(name) + len(value) + 4
            self._trailers += 1
            if len(self.headers) + self._trailers > self.limits.max_header_fields:
                self._refuse(
                    431, "Too many request header fields.", "request_header_fields_too_large", "too_many_fields"
                )
                raise _Refused
            return
        self._head_fields += len(name) + len(value)
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        limits = self.limits
        fields = self._head_fields + 4 * len(self.headers)  # `name: value` and its line's end, each
        if len(self.headers) > limits.max_header_fields or len(self.url) + fields > limits.max_head_bytes:
            reason = "too_many_fields" if len(self.headers) > limits.max_header_fields else "head_too_large"
            self._refuse(431, "Request header fields too large.", "request_header_fields_too_large", reason)
            raise _Refused
        # The head's request line (`METHOD url HTTP/1.1`), fields and blank line are accounted for.
        self._unparsed = max(0, self._unparsed - len(parser.get_method()) - len(self.url) - fields - 14)
        if self._own_only and (
            parser.get_method() != b"GET" or httptools.parse_url(self.url).path not in limits.own_paths
        ):
            self._refuse(503, CONNECTIONS_MESSAGE, "too_many_connections", "too_many_connections", linger=False)
            raise _Refused
        previous = self.cycle
        parked = previous is not None and not previous.response_complete  # behind an answer still going out
        if parked and len(self.pipeline) >= PIPELINED:
            self._refuse(429, PIPELINED_MESSAGE, "too_many_pipelined", "too_many_pipelined")
            raise _Refused
        upgrade = parser.should_upgrade()
        if upgrade and not self._should_upgrade() and parser.get_method() != b"CONNECT":
            self._upgrade_ignored = True  # parsed again without it (data_received)
            return
        now = self.loop.time()
        self.head_since = None
        self._chunk_bytes = 0
        self._in_body = True
        if parked:  # its client cannot send its body until its turn (reading pauses): its deadline starts then
            self.body_since = None
        else:
            self.body_since = now
            due = now + limits.body_seconds
            if self.timeout_keep_alive_task is None or due < self._guard_due:  # `_arm`, inlined: per request
                self._arm(due)
        handler = path = None
        if self.limit_concurrency is None and not upgrade:
            path = httptools.parse_url(self.url).path
            handler = self.routes.get((parser.get_method(), path))
        if handler is None or path is None:
            self.scope = self._asgi_scope()
            super().on_headers_complete()
            return
        http_version = parser.get_http_version()
        self.cycle = DirectDownstream(  # type: ignore[assignment]
            self,
            parser.get_method().decode("ascii"),
            path.decode("ascii"),
            self.headers,
            http_version != "1.0" and parser.should_keep_alive(),
            self.expect_100_continue,
        )
        if not parked:
            if self._body_fits(self.cycle):  # type: ignore[arg-type]
                self.running = self.cycle  # type: ignore[assignment]
                if not handler.on_head(self.cycle):  # type: ignore[arg-type]
                    self.cycle.admitted = True  # type: ignore[attr-defined]
                    self.deferred = (self.cycle, handler)  # type: ignore[assignment]
            else:
                self._start_asgi_task(self.cycle, handler)  # type: ignore[arg-type]
        else:  # pipelined behind an answer still going out: its turn comes in on_response_complete
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, handler))  # type: ignore[arg-type]

    def _asgi_scope(self) -> Any:
        """The scope uvicorn's on_message_begin builds."""
        return {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    @staticmethod
    def _body_fits(cycle: DirectDownstream) -> bool:
        """A body the protocol can collect before the handler starts: a declared length within the
        read buffer, and no client waiting for 100-continue before it sends it."""
        if cycle.waiting_for_100_continue:
            return False
        for name, value in cycle.headers:
            if name == b"content-length":
                return value.isdigit() and int(value) <= HIGH_WATER_LIMIT
            if name == b"transfer-encoding":
                return False
        return True  # no body

    def _start_deferred(self) -> None:
        deferred, self.deferred = self.deferred, None
        if deferred is None:
            return
        cycle, handler = deferred
        self.running = cycle
        try:
            if handler.express(cycle):
                return
        except Exception as exc:  # as a task's failure (_run)
            cycle.failed(exc)
            return
        self._start_asgi_task(cycle, handler)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if not isinstance(cycle, DirectDownstream):
            super()._start_asgi_task(cycle, app)
            return
        self.start_task(cycle, app.direct)

    def start_task(self, cycle: DirectDownstream, handler: Handler) -> None:
        self.running = cycle
        task = cycle.task = self.loop.create_task(_run(cycle, handler))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_chunk_header(self) -> None:
        self._chunk_bytes = 0

    def on_chunk_complete(self) -> None:
        # Its size line and the line end after its payload (the last chunk's: after the trailers).
        self._unparsed -= len(b"%x" % self._chunk_bytes) + 4

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._unparsed -= size
        self._chunk_bytes += size
        cycle = self.cycle
        if not cycle.response_complete:  # bytes kept for the request (else dropped as they come)
            budget = self.budget
            if not self._body_held:
                budget.holders[self] = None
                if self._body_client is None:  # once per connection
                    self._body_client = client_bucket(self.client[0] if self.client else None)
            self._body_held += size
            self._body_last = self.loop.time()
            budget.add(self._body_client or "", size)
            if budget.used > budget.limit and not self._make_room():
                self._release_body()
                self._refuse(503, BUDGET_MESSAGE, "server_busy", "body_budget")
                raise _Refused
        if isinstance(cycle, DirectDownstream):
            cycle.received(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._upgrade_ignored:
            return  # the request is parsed again without its Upgrade
        self._in_body = False
        self._between = True
        self.body_since = None
        self._release_body()
        cycle = self.cycle
        if cycle is None:
            return  # a WebSocket upgrade's (uvicorn's own)
        if not cycle.response_complete:
            self._order.pop(self, None)  # a complete request being served: never made room with
        elif not self.pipeline:  # answered before its body was in (a refusal): idle from now
            now = self.idle_since = self.loop.time()
            self._arm(now + self.timeout_keep_alive)
        if isinstance(cycle, DirectDownstream):
            cycle.complete()
            if self.deferred is not None:
                self._start_deferred()
        else:
            super().on_message_complete()

    def _release_body(self) -> None:
        if self._body_held:
            budget = self.budget
            budget.remove(self._body_client or "", self._body_held)
            budget.holders.pop(self, None)
            self._body_held = 0

    def _make_room(self) -> bool:
        """Cut bodies until the budget holds this one's bytes again: each time the stalest body (its
        last bytes came longest ago) of the client holding the most (limits.py). False when that is
        this one: its client holds the most and it is the stalest of them (alone, more than the
        budget). Only when the budget is full: scans of the connections holding body bytes (at most
        the connection cap)."""
        budget = self.budget
        while budget.used > budget.limit:
            heaviest = budget.heaviest()
            stalest = min((h for h in budget.holders if h._body_client == heaviest), key=_last_body_bytes)
            if stalest is self:
                return False
            stalest._release_body()
            stalest._refuse(503, BUDGET_MESSAGE, "server_busy", "body_budget")
        return True

    # --- a client that does not read ------------------------------------------------------------

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark for this client: read nothing more from
        it until it reads (what it sends would only be answered into the same buffer: refusals from
        the head cost nothing to make, so without this a client that never reads grew the buffer
        without bound), and cut it if it reads nothing for `send_seconds`."""
        super().pause_writing()
        self.flow.pause_reading()
        now = self.send_since = self.loop.time()
        self._arm(now + self.limits.send_seconds)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.send_since = None
        # Reading stays paused while requests wait parked their turn (on_response_complete resumes it).
        if not self.pipeline and not self._refused and not self.transport.is_closing():
            self.flow.resume_reading()

    # --- the deadlines --------------------------------------------------------------------------

    def _unset_keepalive_if_required(self) -> None:
        self.idle_since = None  # data arrived (or the connection went): not idle

    def on_response_complete(self) -> None:
        """uvicorn's, but for its timer: the connection is idle from now, unless a request waits."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self._refused:  # a bound refused the connection while this answer went out: now it is whole
            self.transport.write(self._after_answer)
            self._linger()
            return
        self.idle_since = None
        if not self.flow.write_paused:  # else its client reads first (resume_writing)
            self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            if cycle is self.cycle and self._in_body:  # its body's deadline runs from its turn (reading resumes)
                now = self.body_since = self.loop.time()
                self._arm(now + self.limits.body_seconds)
            self._start_asgi_task(cycle, app)
            return
        # Last in the order (it left it when its request was complete), unless still receiving that
        # request's body after an early answer.
        self._order[self] = None
        if not self._in_body:
            now = self.idle_since = self.loop.time()
            due = now + self.timeout_keep_alive
            if self.timeout_keep_alive_task is None or due < self._guard_due:  # `_arm`, inlined
                self._arm(due)

    def _arm(self, due: float) -> None:
        """Have the one timer fire by `due` (it already does when it waits for a sooner deadline)."""
        timer = self.timeout_keep_alive_task
        if timer is not None:
            if due >= self._guard_due:
                return
            timer.cancel()
        self._guard_due = due
        self.timeout_keep_alive_task = self.loop.call_at(due, self._check_deadlines)

    def _check_deadlines(self) -> None:
        """Close the connection whose deadline passed: idle for the keep-alive timeout (silently), or
        a request head or body not in in time (408; silently when nothing of a request came)."""
        self.timeout_keep_alive_task = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        limits = self.limits
        due = []
        if self.send_since is not None:
            if now >= self.send_since + limits.send_seconds:
                cut("send_timeout")
                self.transport.abort()  # what waits in its buffer would never go: closing would keep it
                return
            due.append(self.send_since + limits.send_seconds)
        if self.body_since is not None:
            if now >= self.body_since + limits.body_seconds:
                message = f"The request body did not arrive within {limits.body_seconds:g} s."
                self._refuse(408, message, "request_timeout", "body_timeout")
                return
            due.append(self.body_since + limits.body_seconds)
        if self.head_since is not None:
            if now >= self.head_since + limits.head_seconds:
                if self._unparsed or not self._between:
                    message = f"The request head did not arrive within {limits.head_seconds:g} s."
                    self._refuse(408, message, "request_timeout", "head_timeout")
                else:
                    self.evict("no_request")
                return
            due.append(self.head_since + limits.head_seconds)
        if self.idle_since is not None:
            if now >= self.idle_since + self.timeout_keep_alive:
                self.timeout_keep_alive_handler()
                return
            due.append(self.idle_since + self.timeout_keep_alive)
        if due:
            self._arm(min(due))


async def _run(request: DirectDownstream, handler: Handler) -> None:
    """Run one fast-lane request as uvicorn runs an ASGI app: a failure before the answer started is
    a 500, after it the connection is closed (the client sees the answer cut)."""
    try:
        await handler(request)
    except BaseException as exc:
        request.failed(exc)
    else:
        if not request.response_started and not request.disconnected:
            log.error("%s %s returned without answering", request.method, request.path)
            request.internal_error()
        elif not request.response_complete and not request.disconnected:
            request.cut()  # an answer cut upstream: the client sees it end early
    finally:
        request.on_response = _nothing


def _nothing() -> None:
    pass


def _last_body_bytes(protocol: DirectProtocol) -> float:
    return protocol._body_last


def protocol_for(routes: DirectRoutes, limits: ConnectionLimits, max_connections: int) -> type[DirectProtocol]:
    """The protocol class uvicorn instantiates per connection, with `routes` on its fast lane, and
    `limits` on every connection (at most `max_connections` of them)."""
    attributes = {
        "routes": dict(routes),
        "limits": limits,
        "max_connections": max_connections,
        "budget": BodyBudget(limits.body_budget_bytes),
        "evictable": {},
        "evictable_own": {},
    }
    return type("DirectProtocol", (DirectProtocol,), attributes)
