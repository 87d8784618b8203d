"""The hot path both the sidecar and the gateway run: read a request body, send it upstream
(upstream_pool.py), and stream the answer back to the client (downstream.py) chunk by chunk, untouched.
No framework layer; a client that goes away cancels the upstream request (which aborts the generation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from time import perf_counter
from typing import Any

from . import errors
from .direct import DirectDownstream
from .downstream import AsgiDownstream, ClientGone, Downstream, Exchange, answer
from .upstream_pool import ConnectFailed, Response, TLSRefused, UpstreamError
from .usage import ResponseTail

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
# Answers that carry token usage: JSON, or SSE streams.
USAGE_TYPES = frozenset({"application/json", "text/event-stream"})

Headers = list[tuple[bytes, bytes]]


def authorization_header(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The raw `Authorization` value from ASGI headers (names arrive lower-cased)."""
    for name, value in headers:
        if name == b"authorization":
            return value
    return None


def filter_headers(headers: Iterable[tuple[bytes, bytes]], drop: frozenset[bytes]) -> Headers:
    """Headers without `drop` and without any header the Connection header names, names lower-cased
    (pure; `drop` holds Connection)."""
    kept: Headers = []
    named: set[bytes] | None = None
    for raw_name, value in headers:
        name = raw_name.lower()
        if name == b"connection":
            named = (named or set()) | {token.strip().lower() for token in value.split(b",")}
        elif name not in drop:
            kept.append((name, value))
    return kept if named is None else [(name, value) for name, value in kept if name not in named]


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def upstream_error_kind(exc: BaseException) -> str:
    """The metrics label of a failed upstream exchange."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, TLSRefused):
        return "tls"
    return "connect" if isinstance(exc, ConnectFailed) else "disconnected"


async def respond(send: Any, error: errors.ErrorResponse, close: bool = False) -> int:
    """`answer` through an ASGI `send`."""
    return await answer(AsgiDownstream(None, send), error, close)


async def read_limited_body(headers: Headers, client: Downstream, limit: int, exchange: Exchange) -> bytes | None:
    """The request body, or None when the request was settled here: a 413 for a body larger than
    `limit` (declared or read), or the client gone while it was read (exchange.client_gone)."""
    declared = content_length(headers)
    if declared is not None and declared > limit:
        exchange.status = await answer(client, errors.body_too_large(limit), close=True)
        return None
    try:
        body = await client.read_body(limit)
    except ClientGone:
        exchange.client_gone = True
        return None
    if body is None:
        exchange.status = await answer(client, errors.body_too_large(limit), close=True)
    return body


def answer_head(
    upstream: Response,
    exchange: Exchange,
    count_usage: bool,
    extra_headers: Callable[[], Iterable[tuple[bytes, bytes]]] | None,
) -> tuple[Headers, ResponseTail | None]:
    """The headers to answer with, and the tail to keep when the answer's usage is counted."""
    exchange.status = upstream.status
    headers = filter_headers(upstream.raw_headers, HOP_BY_HOP)
    if extra_headers is not None:  # known once the upstream is chosen (the gateway's replica)
        headers.extend(extra_headers())
    counted = count_usage and upstream.status == 200 and upstream.content_type in USAGE_TYPES
    return headers, (ResponseTail() if counted else None)


def whole_body(upstream: Response, exchange: Exchange, tail: ResponseTail | None) -> bytes:
    """A complete answer's body (what came with its headers), timed and kept for its usage."""
    body = upstream.rest()
    if body:
        exchange.ttfb = perf_counter() - exchange.start
        if tail is not None:
            tail.add(body)
    return body


def _sink(
    write_now: Callable[[bytes, bool], bool], exchange: Exchange, tail: ResponseTail | None
) -> Callable[[bytes, bool], bool]:
    """What the upstream connection calls with each read's body bytes: timed, kept for the usage,
    written to the client (the last with the body's end)."""

    def sink(chunk: bytes, last: bool) -> bool:
        if chunk:
            if exchange.ttfb is None:
                exchange.ttfb = perf_counter() - exchange.start
            if tail is not None:
                tail.add(chunk)
        return write_now(chunk, last)

    return sink


async def relay(
    client: Downstream,
    exchange: Exchange,
    open_upstream: Callable[[], Awaitable[Response]],
    failed: Callable[[BaseException], errors.ErrorResponse],
    count_usage: bool = False,
    extra_headers: Callable[[], Iterable[tuple[bytes, bytes]]] | None = None,
) -> tuple[bytes | None, BaseException | None]:
    """Open the upstream request and stream its answer to the client.

    Returns the end of the answer when `count_usage` and it may carry usage, and the upstream
    error if there was one (after a status was sent, the answer just ends without its final
    chunk, which tells the client it was cut; before, the client gets `failed(error)`)."""
    # A client that goes away cancels this task, which closes the upstream connection, which makes
    # the engine abort the generation.
    client.cancel_on_disconnect(exchange)
    started = False
    try:
        upstream = await open_upstream()
        try:
            headers, tail = answer_head(upstream, exchange, count_usage, extra_headers)
            started = True
            if upstream.complete:  # the whole answer came with its headers: out in one write
                await client.whole(upstream.status, headers, whole_body(upstream, exchange, tail))
                return (tail.bytes() if tail is not None else None), None
            await client.start(upstream.status, headers)
            if isinstance(client, DirectDownstream):  # written from the upstream's callbacks, no task woken
                await upstream.pipe(_sink(client.write_now, exchange, tail), client.drain)
                return (tail.bytes() if tail is not None else None), None
            last = b""
            while chunk := await upstream.read_chunk():
                if exchange.ttfb is None:
                    exchange.ttfb = perf_counter() - exchange.start
                if tail is not None:
                    tail.add(chunk)
                if upstream.at_end:  # the answer's last bytes: they end it, in one write (a short answer's all)
                    last = chunk
                    break
                await client.write(chunk)
            await client.end(last)
        finally:
            upstream.release()  # pooled again if read to its end, else closed
        return (tail.bytes() if tail is not None else None), None
    except asyncio.CancelledError:
        if not exchange.client_gone:
            raise  # shutdown, not a disconnect
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()
    except (TimeoutError, UpstreamError) as exc:
        if not started:
            exchange.status = await answer(client, failed(exc))
        return None, exc
    return None, None
