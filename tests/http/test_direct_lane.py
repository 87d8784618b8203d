"""The server's fast lane (modelserve/http/direct.py) on the wire, against a real sidecar process in
front of the replay engine: the consumer routes it serves answer byte for byte as the ASGI way does
(reached by spelling the same route with a percent-encoded letter, which the fast lane leaves to
ASGI), and the HTTP/1.1 habits uvicorn had hold: pipelining, keep-alive, 100-continue, HTTP/1.0,
chunked request bodies, oversized bodies."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import httptools
import httpx
import pytest

from harness.sidecar import API_KEY, ReplayEngine, Sidecar
from modelserve_sandbox.processes import wait_until

HELLO = [{"role": "user", "content": "hello"}]
CHAT = json.dumps({"model": "tiny", "messages": HELLO}).encode()
STREAM = json.dumps({"model": "tiny", "messages": HELLO, "stream": True}).encode()
# The same routes, spelt so the fast lane does not take them (its table holds exact raw paths).
ASGI_SPELLING = {
    "/v1/chat/completions": "/v1/chat/%63ompletions",
    "/v1/models": "/v1/%6Dodels",
    "/v1/completions": "/v1/%63ompletions",
}


class Answers:
    """HTTP/1.1 answers read off one connection, in order, as a client sees them."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[dict] = []
        self.current: dict = {}
        self.closed = False

    def on_message_begin(self) -> None:
        self.current = {"headers": [], "body": b""}
        self.parts: list[bytes] = []  # joined once the answer is whole (a long stream comes in many)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current["headers"].append((name.decode().lower(), value.decode()))

    def on_headers_complete(self) -> None:
        self.current["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.current["body"] = b"".join(self.parts)
        self.done.append(self.current)

    def read(self, count: int) -> list[dict]:
        """The next `count` answers (fewer when the server closes first)."""
        while len(self.done) < count and not self.closed:
            data = self.connection.recv(65536)
            if not data:
                self.closed = True
                break
            self.parser.feed_data(data)
        answers, self.done = self.done[:count], self.done[count:]
        return answers

    def closed_by_server(self) -> bool:
        self.connection.settimeout(10)
        return self.connection.recv(1) == b""


def request(method: str, target: str, body: bytes = b"", key: str | None = API_KEY, **headers: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: sidecar"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if body or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def connect(sidecar: Sidecar) -> socket.socket:
    host, port = sidecar.url.removeprefix("http://").rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=30)
    return connection


def raw_exchange(sidecar: Sidecar, data: bytes) -> bytes:
    """Everything the sidecar sends back for `data` on a connection it closes."""
    with connect(sidecar) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def without_date(raw: bytes) -> bytes:
    """The engine's Date header passes through and changes by the second."""
    head, _, body = raw.partition(b"\r\n\r\n")
    kept = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(kept) + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    ("method", "path", "body", "key", "extra"),
    [
        ("POST", "/v1/chat/completions", CHAT, API_KEY, {}),
        ("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": "hi"}).encode(), API_KEY, {}),
        ("GET", "/v1/models", b"", API_KEY, {}),
        ("POST", "/v1/chat/completions", CHAT, None, {}),
        ("POST", "/v1/chat/completions", CHAT, "wrong-key", {}),
        ("POST", "/v1/chat/completions", b'{"model": ', API_KEY, {}),
        ("POST", "/v1/chat/completions", json.dumps({"model": "other", "messages": HELLO}).encode(), API_KEY, {}),
        ("POST", "/v1/chat/completions", CHAT, API_KEY, {"x_replay_drop_once": "lanes"}),
    ],
    ids=["chat", "completions", "models", "no-key", "wrong-key", "bad-json", "unknown-model", "engine-hangs-up"],
)
def test_the_fast_lane_answers_byte_for_byte_as_the_asgi_way(
    method: str, path: str, body: bytes, key: str | None, extra: dict[str, str], replay_sidecar: Sidecar
) -> None:
    answers = []
    for target in (path, ASGI_SPELLING[path]):
        headers = {**extra, "Connection": "close"}
        if "x_replay_drop_once" in headers:
            headers["x_replay_drop_once"] += target  # the replay hangs up once per value
        answers.append(without_date(raw_exchange(replay_sidecar, request(method, target, body, key, **headers))))
    fast, asgi = answers
    assert fast.startswith(b"HTTP/1.1 "), fast
    assert fast == asgi


def test_a_stream_has_the_same_head_and_events_on_both_lanes(replay_sidecar: Sidecar) -> None:
    seen = []
    for target in ("/v1/chat/completions", ASGI_SPELLING["/v1/chat/completions"]):
        with connect(replay_sidecar) as connection:
            connection.sendall(request("POST", target, STREAM, Connection="close"))
            (answer,) = Answers(connection).read(1)
        seen.append((answer["status"], [h for h in answer["headers"] if h[0] != "date"], answer["body"]))
    assert seen[0][0] == 200 and seen[0][2].endswith(b"data: [DONE]\n\n"), seen[0]
    assert seen[0] == seen[1]


def test_pipelined_requests_are_answered_in_order_on_one_connection(replay_sidecar: Sidecar) -> None:
    with connect(replay_sidecar) as connection:
        connection.sendall(
            request("POST", "/v1/chat/completions", CHAT)
            + request("GET", "/v1/models")
            + request("POST", "/v1/chat/completions", CHAT, key="wrong-key")
            + request("GET", "/healthz")  # an own route, served by the ASGI app, in the same queue
            + request("POST", "/v1/chat/completions", STREAM)
        )
        answers = Answers(connection).read(5)
    assert [a["status"] for a in answers] == [200, 200, 401, 200, 200]
    assert json.loads(answers[0]["body"])["object"] == "chat.completion"
    assert json.loads(answers[1]["body"])["object"] == "list"
    assert json.loads(answers[2]["body"])["error"]["code"] == "invalid_api_key"
    assert json.loads(answers[3]["body"]) == {"status": "ok"}
    assert answers[4]["body"].endswith(b"data: [DONE]\n\n")


def test_one_connection_serves_many_requests_and_stays_open(replay_sidecar: Sidecar) -> None:
    with connect(replay_sidecar) as connection:
        reader = Answers(connection)
        for _ in range(20):
            connection.sendall(request("POST", "/v1/chat/completions", CHAT))
            (answer,) = reader.read(1)
            assert answer["status"] == 200
            assert ("connection", "close") not in answer["headers"]
        assert not reader.closed


def test_a_connection_idle_for_the_keep_alive_timeout_is_closed_and_a_busy_one_is_not(
    replay_sidecar: Sidecar,
) -> None:
    """uvicorn's keep-alive timeout (5 s from the end of the last answer), kept with one timer per
    connection: requests 3 s apart outlast two timeouts on one connection, then it closes 5 s after
    the last answer."""
    with connect(replay_sidecar) as connection:
        reader = Answers(connection)
        for _ in range(4):
            connection.sendall(request("POST", "/v1/chat/completions", CHAT))
            (answer,) = reader.read(1)
            assert answer["status"] == 200 and not reader.closed
            time.sleep(3)
        connection.sendall(request("POST", "/v1/chat/completions", CHAT))
        assert reader.read(1)[0]["status"] == 200
        last_answer = time.monotonic()
        connection.settimeout(15)
        assert connection.recv(1) == b""  # closed by the sidecar
        assert 4.5 <= time.monotonic() - last_answer < 10


def test_expect_100_continue_is_answered_when_the_body_is_wanted(replay_sidecar: Sidecar) -> None:
    with connect(replay_sidecar) as connection:
        head = request("POST", "/v1/chat/completions", CHAT, Expect="100-continue")[: -len(CHAT)]
        connection.sendall(head)
        assert connection.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(CHAT)
        (answer,) = Answers(connection).read(1)
    assert answer["status"] == 200
    # A refused key is answered at once, without inviting the body.
    with connect(replay_sidecar) as connection:
        connection.sendall(
            request("POST", "/v1/chat/completions", CHAT, key="wrong-key", Expect="100-continue")[: -len(CHAT)]
        )
        (answer,) = Answers(connection).read(1)
    assert answer["status"] == 401


def test_an_http_10_request_is_answered_and_the_connection_closed(replay_sidecar: Sidecar) -> None:
    with connect(replay_sidecar) as connection:
        connection.sendall(request("POST", "/v1/chat/completions", CHAT).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        reader = Answers(connection)
        (answer,) = reader.read(1)
        assert answer["status"] == 200
        assert ("connection", "close") in answer["headers"]
        assert reader.closed or reader.closed_by_server()


def test_a_chunked_request_body_is_read_whole(replay_sidecar: Sidecar) -> None:
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {API_KEY}\r\n"
    head += "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    halves = (CHAT[:10], CHAT[10:])
    body = b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in halves) + b"0\r\n\r\n"
    with connect(replay_sidecar) as connection:
        connection.sendall(head.encode() + body)
        (answer,) = Answers(connection).read(1)
    assert answer["status"] == 200, answer


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "chunked"])
def test_a_body_over_the_limit_is_413_and_the_connection_closed(declared: bool, replay_sidecar: Sidecar) -> None:
    big = b'{"model": "tiny", "pad": "' + b"x" * 70000 + b'"}'  # the fixture's limit: 65536 bytes
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {API_KEY}\r\n"
    if declared:
        data = (head + f"Content-Length: {len(big)}\r\n\r\n").encode() + big
    else:
        data = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%b\r\n0\r\n\r\n" % (len(big), big)
    with connect(replay_sidecar) as connection:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.sendall(data)  # refused before it was all sent: the answer is already there
        reader = Answers(connection)
        (answer,) = reader.read(1)
        assert answer["status"] == 413
        assert json.loads(answer["body"])["error"]["code"] == "body_too_large"
        assert ("connection", "close") in answer["headers"]


def test_a_client_gone_mid_stream_stops_the_engine_stream(replay: ReplayEngine, replay_sidecar: Sidecar) -> None:
    before = replay.streams.count("client_gone")
    with connect(replay_sidecar) as connection:
        connection.sendall(request("POST", "/v1/chat/completions", STREAM, x_replay_gap="0.5"))
        assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
    # The fast lane's connection_lost cancels the relay, which closes the engine's connection.
    wait_until(lambda: replay.streams.count("client_gone") > before, 20, "the engine's stream to be cut")


def test_a_stream_to_a_client_that_stops_reading_holds_the_engine_and_arrives_whole(
    replay: ReplayEngine, replay_sidecar: Sidecar
) -> None:
    """Back-pressure both ways: while a client with a small receive window reads nothing, a 25 MB
    stream (more than every buffer on the way holds) stops short at the engine: the relay stopped
    reading it. Once the client reads, the stream goes on and arrives byte for byte as the engine
    sent it. A relay that never resumed would hang here (the socket's timeout fails the test)."""
    repeat = "16000"
    direct = httpx.post(
        replay.url + "/v1/chat/completions", content=STREAM, headers={"x-replay-repeat": repeat}, timeout=60
    ).content
    host, port = replay_sidecar.url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as connection:
        # Before connecting, so the window the client offers is small from the start.
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        connection.settimeout(30)
        connection.connect((host, int(port)))
        before = replay.sent
        connection.sendall(request("POST", "/v1/chat/completions", STREAM, x_replay_repeat=repeat))
        wait_until(lambda: _settled(replay), 30, "the engine's stream to stop moving")
        assert replay.sent - before < len(direct) // 2, "the relay read the engine on while its client read nothing"
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
            if b"".join(chunks[-2:]).endswith(b"0\r\n\r\n"):
                break  # the chunked body's end: the connection stays open for the next request
    answers = Answers(connection)
    answers.parser.feed_data(b"".join(chunks))
    (answer,) = answers.done
    assert answer["status"] == 200 and len(direct) > 20_000_000
    assert answer["body"] == direct


def _settled(replay: ReplayEngine, quiet_seconds: float = 0.5) -> bool:
    """The engine wrote nothing for `quiet_seconds` (it was held, or finished)."""
    sent = replay.sent
    time.sleep(quiet_seconds)
    return sent > 0 and replay.sent == sent
