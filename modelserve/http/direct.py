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

log = logging.getLogger(__name__)

Handler = Callable[["DirectDownstream"], Awaitable[None]]


class DirectHandler(Protocol):
    """A proxy on the fast lane: `express` first (once the body is in, from the protocol's callbacks,
    without a task: express.py), and `direct` in a task when it declines or cannot start at once."""

    async def direct(self, request: DirectDownstream) -> None: ...

    def express(self, request: DirectDownstream) -> bool:
        """Serve the request (or start serving it) without awaiting; False, with nothing done, to
        leave it to `direct`."""


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


class DirectProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a fast lane for `routes` (set on a subclass, see
    `protocol_for`); every other request goes through the ASGI app as in uvicorn."""

    routes: ClassVar[DirectRoutes] = MappingProxyType({})
    running: DirectDownstream | None = None  # the fast-lane request answering now, if any
    # A request whose handler starts once its whole body is in (express first), and that handler.
    deferred: tuple[DirectDownstream, DirectHandler] | None = None
    # When the last answer ended with nothing after it (None: a request is coming or being answered):
    # the keep-alive timeout's clock, read by one timer per connection instead of uvicorn's timer per
    # request (a timer made and cancelled per request was a few per cent of the proxies' CPU).
    idle_since: float | None = None

    def on_message_begin(self) -> None:
        # The ASGI scope is built only for a request that takes the ASGI way (on_headers_complete).
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = None  # type: ignore[assignment]

    def on_headers_complete(self) -> None:
        parser = self.parser
        handler = path = None
        if self.limit_concurrency is None and not parser.should_upgrade():
            path = httptools.parse_url(self.url).path
            handler = self.routes.get((parser.get_method(), path))
        if handler is None or path is None:
            self.scope = self._asgi_scope()
            super().on_headers_complete()
            return
        http_version = parser.get_http_version()
        previous = self.cycle
        self.cycle = DirectDownstream(  # type: ignore[assignment]
            self,
            parser.get_method().decode("ascii"),
            path.decode("ascii"),
            self.headers,
            http_version != "1.0" and parser.should_keep_alive(),
            self.expect_100_continue,
        )
        if previous is None or previous.response_complete:
            if self._body_fits(self.cycle):  # type: ignore[arg-type]
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

    def on_body(self, body: bytes) -> None:
        if isinstance(self.cycle, DirectDownstream):
            self.cycle.received(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if isinstance(self.cycle, DirectDownstream):
            self.cycle.complete()
            if self.deferred is not None:
                self._start_deferred()
        else:
            super().on_message_complete()

    # --- the keep-alive timeout ---------------------------------------------------------------

    def _unset_keepalive_if_required(self) -> None:
        self.idle_since = None  # data arrived (or the connection went): not idle

    def on_response_complete(self) -> None:
        """uvicorn's, but for its timer: the connection is idle from now, unless a request waits."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self.idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_check)

    def _keep_alive_check(self) -> None:
        """Close the connection idle for the keep-alive timeout; while it is busy, the next answer's
        end sets the timer again."""
        self.timeout_keep_alive_task = None
        if self.idle_since is None:
            return
        left = self.idle_since + self.timeout_keep_alive - self.loop.time()
        if left <= 0:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        if self.deferred is not None:  # gone before its body was in: the task finds it gone
            cycle, handler = self.deferred
            self.deferred = None
            self._start_asgi_task(cycle, handler)
        running = self.running
        if running is not None:
            running.lost()
        if isinstance(self.cycle, DirectDownstream):
            self.cycle.lost()
            self.cycle = None  # type: ignore[assignment]  # uvicorn's own handling is for its cycles
        super().connection_lost(exc)


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


def protocol_for(routes: DirectRoutes) -> type[DirectProtocol]:
    """The protocol class uvicorn instantiates per connection, with `routes` on its fast lane."""
    return type("DirectProtocol", (DirectProtocol,), {"routes": dict(routes)})
