"""The proxies' upstream client (modelserve/http/upstream_pool.py): the request bytes it writes, and
how it reads answers and failures, against raw servers on loopback scripted byte by byte."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.sidecar import free_ports
from modelserve.http.relay import upstream_error_kind
from modelserve.http.upstream_pool import (
    BodyCut,
    ConnectFailed,
    Disconnected,
    Pool,
    Response,
    mime_type,
    request_head,
    split_url,
)

# A raw server's script: reads what it needs from the connection, writes what it answers.
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


async def _body(answer: Response) -> bytes:
    chunks = []
    async with answer:
        while chunk := await answer.read_chunk():
            chunks.append(chunk)
    return b"".join(chunks)


def _run(script: Script, exchange: Callable[[Pool, str], Awaitable[object]], read_timeout: float = 5.0) -> object:
    async def main() -> object:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(max_connections=8, connect_timeout=5.0, read_timeout=read_timeout)
        try:
            return await asyncio.wait_for(exchange(pool, f"http://127.0.0.1:{port}"), 20)
        finally:
            await pool.close()
            server.close()

    return asyncio.run(main())


def test_split_url_and_head_write_what_aiohttp_wrote() -> None:
    origin, target = split_url("http://127.0.0.1:8000/v1/chat/completions")
    assert (origin.host, origin.port, origin.host_header, target) == (
        "127.0.0.1",
        8000,
        b"127.0.0.1:8000",
        b"/v1/chat/completions",
    )
    headers = [(b"content-type", b"application/json"), (b"x-a", b"1")]
    assert request_head("POST", target, origin, headers, 7) == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
        b"x-a: 1\r\nContent-Length: 7\r\n\r\n"
    )
    assert request_head("POST", target, origin, [], 0).endswith(b"Content-Length: 0\r\n\r\n")
    assert (
        request_head("GET", b"/v1/models", origin, [], 0) == b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"
    )


def test_split_url_default_ports_base_path_and_credentials() -> None:
    origin, target = split_url("https://user:p%40ss@models.example.com/base/v1/models")
    assert (origin.scheme, origin.port, origin.host_header, target) == (
        "https",
        443,
        b"models.example.com",
        b"/base/v1/models",
    )
    assert origin.authorization == b"Basic dXNlcjpwQHNz"  # user:p@ss
    assert split_url("http://[::1]:80/x")[0].host_header == b"[::1]"


def test_mime_type() -> None:
    assert mime_type([(b"Content-Type", b"Text/Event-Stream; charset=utf-8")]) == "text/event-stream"
    assert mime_type([]) == "application/octet-stream"


def test_keep_alive_connection_is_reused_and_bodies_read_whole() -> None:
    seen: list[bytes] = []
    connections = 0

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while not reader.at_eof():
            try:
                seen.append(await _read_request(reader))
            except asyncio.IncompleteReadError:
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b'3\r\n{"a\r\n4\r\n":1}\r\n0\r\n\r\n')
            await writer.drain()

    async def exchange(pool: Pool, base: str) -> list[bytes]:
        bodies = []
        for _ in range(3):
            answer = await pool.request("POST", base + "/v1/x", [(b"content-type", b"application/json")], b"{}")
            assert answer.status == 200 and answer.content_type == "application/json"
            bodies.append(await _body(answer))
        return bodies

    assert _run(script, exchange) == [b'{"a":1}'] * 3
    assert connections == 1
    assert all(request.endswith(b"Content-Length: 2\r\n\r\n{}") for request in seen)


def test_body_delimited_by_the_connection_end() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async def exchange(pool: Pool, base: str) -> bytes:
        return await _body(await pool.request("GET", base + "/v1/models", []))

    assert _run(script, exchange) == b"all of it"


def test_failures_are_named_as_the_metrics_count_them() -> None:
    async def closes_before_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async def cuts_the_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()
        writer.close()

    async def stays_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(3)

    async def failure(pool: Pool, base: str) -> BaseException:
        try:
            await _body(await pool.request("POST", base + "/v1/x", [], b"{}"))
        except (TimeoutError, ConnectFailed, Disconnected, BodyCut) as exc:
            return exc
        raise AssertionError("no failure")

    gone = _run(closes_before_answering, failure)
    assert isinstance(gone, Disconnected) and upstream_error_kind(gone) == "disconnected"
    cut = _run(cuts_the_body, failure)
    assert isinstance(cut, BodyCut) and upstream_error_kind(cut) == "disconnected"
    silent = _run(stays_silent, failure, read_timeout=0.5)
    assert isinstance(silent, TimeoutError) and upstream_error_kind(silent) == "timeout"

    async def refused() -> BaseException:
        (port,) = free_ports(1)  # nothing listens there
        pool = Pool(max_connections=8, connect_timeout=5.0, read_timeout=5.0)
        with pytest.raises(ConnectFailed) as caught:
            await pool.request("GET", f"http://127.0.0.1:{port}/v1/models", [])
        return caught.value

    assert upstream_error_kind(asyncio.run(refused())) == "connect"


def test_a_connection_the_upstream_closed_while_pooled_is_not_reused() -> None:
    connections = 0

    async def answers_once_then_closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # keep-alive advertised
        await writer.drain()
        writer.close()

    async def exchange(pool: Pool, base: str) -> list[bytes]:
        first = await _body(await pool.request("GET", base + "/v1/models", []))
        await asyncio.sleep(0.1)  # the FIN arrives while the connection is in the pool
        return [first, await _body(await pool.request("GET", base + "/v1/models", []))]

    assert _run(answers_once_then_closes, exchange) == [b"ok", b"ok"]
    assert connections == 2


# --- bytes after a complete response ------------------------------------------------------------------

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
# What a desynchronised (or smuggling) upstream sends after it: a response nobody asked for, or garbage.
SURPLUS = {
    "response": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
    "garbage": b"x",
}


@contextmanager
def naive_upstream(answer: bytes) -> Iterator[tuple[str, list[threading.Event]]]:
    """A keep-alive HTTP/1.1 server on Python's http.server that writes `answer` to every GET, byte
    for byte: its base URL, and per connection an event set when the connection has ended."""
    ended: list[threading.Event] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self) -> None:
            done = threading.Event()
            ended.append(done)
            try:
                super().handle()  # request after request, until the client closes the connection
            finally:
                done.set()

        def do_GET(self) -> None:
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", ended
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize("surplus", sorted(SURPLUS))
def test_bytes_after_a_complete_response_close_its_connection(surplus: str) -> None:
    with naive_upstream(ANSWER + SURPLUS[surplus]) as (base, ended):

        async def exchange() -> None:
            pool = Pool(max_connections=8, connect_timeout=5.0, read_timeout=5.0)
            try:
                first = await pool.request("GET", base + "/v1/models", [])
                # Closed as the surplus arrives, before the caller is done with the response...
                assert await asyncio.to_thread(ended[0].wait, 10), "the connection was kept"
                # ...which is delivered as it was: its own headers and body, nothing of the surplus.
                assert (first.status, first.raw_headers) == (200, [(b"Content-Length", b"2")])
                assert await _body(first) == b"ok"
                second = await pool.request("GET", base + "/v1/models", [])
                assert await _body(second) == b"ok"
                assert len(ended) == 2  # on a new connection
            finally:
                await pool.close()

        asyncio.run(asyncio.wait_for(exchange(), 30))


def test_bytes_in_a_later_read_before_the_release_close_the_connection() -> None:
    surplus_allowed, surplus_sent, client_closed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def answers_then_more(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(ANSWER)
        await writer.drain()
        await surplus_allowed.wait()
        writer.write(SURPLUS["response"])
        await writer.drain()
        surplus_sent.set()
        if not await reader.read():  # the client closed its end
            client_closed.set()

    async def exchange(pool: Pool, base: str) -> bytes:
        answer = await pool.request("GET", base + "/v1/models", [])
        assert answer.complete and answer.raw_headers == [(b"Content-Length", b"2")]
        surplus_allowed.set()  # the response is in: now the surplus, in a read of its own
        await asyncio.wait_for(client_closed.wait(), 10)
        assert answer.raw_headers == [(b"Content-Length", b"2")]
        return await _body(answer)

    assert _run(answers_then_more, exchange) == b"ok"
    assert surplus_sent.is_set()


def test_a_get_is_never_sent_with_a_body() -> None:
    async def sends() -> None:
        (port,) = free_ports(1)  # nothing listens there: refused before any connection is tried
        pool = Pool(max_connections=8, connect_timeout=5.0, read_timeout=5.0)
        with pytest.raises(ValueError, match="never sent with a body"):
            await pool.request("GET", f"http://127.0.0.1:{port}/v1/models", [], b'{"model": "tiny"}')
        with pytest.raises(ValueError, match="never sent with a body"):
            pool.send_now("GET", f"http://127.0.0.1:{port}/v1/models", [], b"x", lambda _: None)

    asyncio.run(sends())
