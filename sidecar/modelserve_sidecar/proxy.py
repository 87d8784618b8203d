"""The proxy: a raw ASGI app that checks the key and the request, then streams the engine's answer
back chunk by chunk. Everything on the per-request path is here, kept free of framework layers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from time import perf_counter
from typing import Any

import aiohttp
from yarl import URL

from . import errors
from .auth import refusal_reason
from .contract import Settings
from .demand import Demand
from .keys import KeyStore
from .metrics import ROUTE_SCOPE_KEY, SidecarMetrics, route_label, status_class
from .request_checks import SAMPLING_ROUTES, check_body
from .usage import ResponseTail, usage_from_tail

log = logging.getLogger(__name__)

# RFC 9110 7.6.1: meaningful for one connection only, never forwarded.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Also not sent to the engine: Host and Content-Length (aiohttp sets both for the body it sends,
# which may have been rewritten), Expect (uvicorn already answered the client's 100-continue, and the
# whole body is here) and Authorization (the engine has no use for the key; keeps it out of its logs).
DROP_TO_ENGINE = HOP_BY_HOP | {b"host", b"content-length", b"expect", b"authorization"}
RETRY_AFTER_SECONDS = 5
CLIENT_CLOSED = "client_closed"
USAGE_TYPES = frozenset({"application/json", "text/event-stream"})
# Bounded, so clients sending endless distinct paths cannot grow the cache.
MAX_CACHED_TARGETS = 256

Headers = list[tuple[bytes, bytes]]


def filter_headers(headers: Iterable[tuple[bytes, bytes]], drop: frozenset[bytes]) -> Headers:
    """Headers without `drop` and without any header the Connection header names (pure)."""
    kept: Headers = []
    for raw_name, value in headers:
        name = raw_name.lower()
        if name == b"connection":
            drop = drop | {token.strip().lower() for token in value.split(b",")}
        kept.append((name, value))
    return [(name, value) for name, value in kept if name not in drop]


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


async def respond(send: Any, error: errors.ErrorResponse, close: bool = False) -> int:
    body = error.body()
    headers = error.headers(body)
    if close:  # the rest of an oversized body is not read, so the connection cannot be reused
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return error.status


class Proxy:
    def __init__(self, settings: Settings, keys: KeyStore | None, metrics: SidecarMetrics) -> None:
        self.settings = settings
        self.keys = keys  # None in public mode
        self.metrics = metrics
        self.demand = Demand()
        self.session: aiohttp.ClientSession | None = None  # opened by the app's lifespan
        self._base = settings.upstream_url
        self._targets: dict[tuple[bytes, bytes], URL] = {}

    def key_refusal(self, headers: Iterable[tuple[bytes, bytes]]) -> errors.ErrorResponse | None:
        """The 401 for a request whose key is refused (and counted), or None when it may pass."""
        if self.keys is None:
            return None
        reason = refusal_reason(headers, self.keys)
        if reason is None:
            return None
        self.metrics.auth_failures.labels(reason).inc()
        return errors.unauthorized(reason)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        start = perf_counter()
        route = route_label(scope.get(ROUTE_SCOPE_KEY) or scope["path"])
        exchange = _Exchange(start)
        self.metrics.in_flight.inc()
        self.demand.in_flight += 1
        try:
            await self._handle(scope, receive, send, exchange)
        finally:
            self.metrics.in_flight.dec()
            self.demand.in_flight -= 1
            label = CLIENT_CLOSED if exchange.client_gone else status_class(exchange.status)
            self.metrics.observe(route, label, perf_counter() - start, exchange.ttfb)

    async def _handle(self, scope: dict[str, Any], receive: Any, send: Any, exchange: _Exchange) -> None:
        headers = scope["headers"]
        refused = self.key_refusal(headers)
        if refused is not None:
            exchange.status = await respond(send, refused)
            return
        self.demand.arrived()

        limit = self.settings.max_body_bytes
        declared = content_length(headers)
        if declared is not None and declared > limit:
            exchange.status = await respond(send, errors.body_too_large(limit), close=True)
            return
        try:
            body = await read_body(receive, limit)
        except ClientGone:
            exchange.client_gone = True
            return
        if body is None:
            exchange.status = await respond(send, errors.body_too_large(limit), close=True)
            return

        path = scope["path"]
        if scope["method"] == "POST":
            checked = check_body(
                path, body, self.settings.served_model, self.settings.vision, self.settings.sampling_defaults
            )
            if isinstance(checked, errors.ErrorResponse):
                exchange.status = await respond(send, checked)
                return
            body = checked
        await self._forward(scope, receive, send, body, exchange, count_usage=path in SAMPLING_ROUTES)

    async def _forward(
        self, scope: dict[str, Any], receive: Any, send: Any, body: bytes, exchange: _Exchange, count_usage: bool
    ) -> None:
        target = self._target(scope["raw_path"], scope["query_string"])
        to_engine = [
            (n.decode("latin-1"), v.decode("latin-1")) for n, v in filter_headers(scope["headers"], DROP_TO_ENGINE)
        ]

        # receive() only returns again when the client goes away: that cancels this task, which
        # closes the engine connection, which makes the engine abort the generation.
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task, exchange))
        started = False
        try:
            upstream = await self._open(scope["method"], target, to_engine, body)
            async with upstream:
                exchange.status = upstream.status
                if upstream.status >= 500:
                    self.metrics.upstream_errors.labels("status_5xx").inc()
                await send(
                    {
                        "type": "http.response.start",
                        "status": upstream.status,
                        "headers": filter_headers(upstream.raw_headers, HOP_BY_HOP),
                    }
                )
                started = True
                # Only answers that carry usage: JSON, or SSE streams.
                counted = count_usage and upstream.status == 200 and upstream.content_type in USAGE_TYPES
                tail = ResponseTail() if counted else None
                async for chunk in upstream.content.iter_any():
                    if exchange.ttfb is None:
                        exchange.ttfb = perf_counter() - exchange.start
                    if tail is not None:
                        tail.add(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                watcher.cancel()  # before the last send: after it, receive() reports a disconnect
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            if tail is not None:
                self.metrics.count_usage(usage_from_tail(tail.bytes()))
        except asyncio.CancelledError:
            if not exchange.client_gone:
                raise  # shutdown, not a disconnect
            task.uncancel()
        except (TimeoutError, aiohttp.ClientError) as exc:
            await self._upstream_failed(send, exc, started, exchange)
        finally:
            watcher.cancel()

    async def _open(
        self, method: str, target: URL, headers: list[tuple[str, str]], body: bytes
    ) -> aiohttp.ClientResponse:
        """Send the request; the engine's response headers have arrived when this returns."""
        assert self.session is not None, "the upstream session opens in the app's lifespan"
        try:
            return await self.session.request(method, target, headers=headers, data=body or None, allow_redirects=False)
        except aiohttp.ServerDisconnectedError:
            # Nearly always a pooled keep-alive connection the engine had just closed (servers close
            # idle or errored connections at will), which the request never reached: once more, on a
            # new connection. An engine that is really gone then refuses it, which answers 503.
            return await self.session.request(method, target, headers=headers, data=body or None, allow_redirects=False)

    def _target(self, raw_path: bytes, query: bytes) -> URL:
        """The engine URL for a request path; parsed URLs of the common paths are reused."""
        key = (raw_path, query)
        url = self._targets.get(key)
        if url is None:
            text = self._base + raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
            url = URL(text, encoded=True)  # as the client encoded it, not re-quoted
            if len(self._targets) < MAX_CACHED_TARGETS:
                self._targets[key] = url
        return url

    async def _upstream_failed(self, send: Any, exc: BaseException, started: bool, exchange: _Exchange) -> None:
        timeout = isinstance(exc, asyncio.TimeoutError)
        connect = isinstance(exc, aiohttp.ClientConnectorError)
        kind = "timeout" if timeout else "connect" if connect else "disconnected"
        self.metrics.upstream_errors.labels(kind).inc()
        if started:
            # Too late for a status: ending without the final chunk tells the client it is cut.
            log.warning("engine response broke off (%s): %s", kind, type(exc).__name__)
            return
        log.warning("engine unreachable (%s): %s", kind, exc)
        if timeout:
            exchange.status = await respond(send, errors.upstream_timeout(self.settings.upstream_timeout_seconds))
        else:
            exchange.status = await respond(send, errors.engine_unavailable(RETRY_AFTER_SECONDS))


class _Exchange:
    """What one request did, for its metrics."""

    __slots__ = ("client_gone", "start", "status", "ttfb")

    def __init__(self, start: float) -> None:
        self.start = start
        self.status = 500
        self.ttfb: float | None = None
        self.client_gone = False


async def read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body, or None when it grows beyond `limit` bytes."""
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


async def _cancel_on_disconnect(receive: Any, task: asyncio.Task[Any], exchange: _Exchange) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    exchange.client_gone = True
    task.cancel()
