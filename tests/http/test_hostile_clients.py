"""A hostile client costs the real sidecar nothing it cannot bound (modelserve/http/limits.py): raw
sockets send what an attacker sends, against a sidecar process before the replay engine, which
records what reached it. Memory and descriptor figures are bench/hostile_bench.py's, not these."""

from __future__ import annotations

import json
import resource
import select
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.process_memory import status_bytes
from harness.sidecar import (
    API_KEY,
    MARK_HEADER,
    ReplayEngine,
    SecretDir,
    Sidecar,
    launch_sidecar,
    metric_value,
    stop_process,
    stop_sidecar,
    wait_ready,
)
from modelserve_sandbox.processes import wait_until
from tests.helpers.hostile import (
    CHAT,
    KEYED,
    answers_in,
    chat_head,
    connect,
    endless_headers,
    error_code,
    read_outcome,
    read_until_closed,
    send_until_answered,
    still_serves,
)

DEADLINE_SECONDS = 1.5  # the head's and the body's, short for the tests
BUDGET_BYTES = 1024 * 1024  # request bodies being received, process-wide
LIMITED_KEY = "sk-limited-7d21"  # a key limited to 2 requests in flight
OTHER_KEY = "sk-other-51c0"  # another team's, without limits


@pytest.fixture(scope="module")
def sidecar(replay: ReplayEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    base = tmp_path_factory.mktemp("hostile-sidecar")
    limited = json.dumps({"keys": [LIMITED_KEY], "maxInFlight": 2, "requestsPerMinute": 1000})
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n", "limited": limited, "other": OTHER_KEY + "\n"})
    running = launch_sidecar(
        base / "logs",
        replay.url,
        "tiny",
        {
            "MODELSERVE_KEYS_DIR": str(base / "keys"),
            "MODELSERVE_HEAD_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
            "MODELSERVE_BODY_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
            "MODELSERVE_BODY_BUDGET_BYTES": str(BUDGET_BYTES),
        },
    )
    try:
        wait_ready(running)
        yield running
    finally:
        stop_sidecar(running)


def test_a_header_section_sent_forever_gets_431_and_the_connection_closed(
    sidecar: Sidecar, replay: ReplayEngine
) -> None:
    with connect(sidecar.url) as connection:
        connection.sendall(chat_head(headers={MARK_HEADER: "endless"}))
        # How much goes out before the answer shows depends on the kernel's buffers and the machine's
        # load (4-8 MiB measured), not on the bound: what counts is that an answer comes at all.
        sent = send_until_answered(connection, endless_headers(), 64 * 1024 * 1024)
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None, f"no answer after {sent} bytes of headers"
    assert outcome.answer.status == 431 and outcome.closed, outcome
    assert error_code(outcome.answer.body) == "request_header_fields_too_large"
    assert replay.marked("endless") == []
    still_serves(sidecar.url)
    assert metric_value(sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="head_too_large"}') >= 1


@pytest.mark.parametrize(
    ("what", "header"),
    [
        ("101 fields", "".join(f"X-Field-{i}: {i}\r\n" for i in range(101))),
        ("a 1 MiB name", "X-" + "n" * (1024 * 1024) + ": 1\r\n"),
        ("a 40 KiB value", "X-Big: " + "v" * (40 * 1024) + "\r\n"),
    ],
)
def test_a_head_beyond_its_bounds_never_reaches_the_engine(
    sidecar: Sidecar, replay: ReplayEngine, what: str, header: str
) -> None:
    mark = f"head-{what}"
    head = chat_head(headers={**KEYED, MARK_HEADER: mark, "Content-Length": str(len(CHAT))})
    with connect(sidecar.url) as connection:
        pieces = [head + header.encode() + b"\r\n" + CHAT]
        send_until_answered(connection, (p[i : i + 65536] for p in pieces for i in range(0, len(p), 65536)), 1 << 24)
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None and outcome.answer.status == 431, (what, outcome)
    assert outcome.closed
    assert replay.marked(mark) == []


@pytest.mark.parametrize(
    ("what", "sent", "status"),
    [
        ("nothing", b"", None),
        ("half a request line", b"POST /v1/chat/comp", 408),
        ("half a header section", chat_head(headers={"Content-Length": "1000"})[:-2], 408),
        (
            "10 of 1,000 body bytes",
            chat_head(headers={**KEYED, "Content-Length": "1000"}) + b"\r\n" + b"{" * 10,
            408,
        ),
    ],
)
def test_a_request_not_complete_in_time_is_cut(sidecar: Sidecar, what: str, sent: bytes, status: int | None) -> None:
    with connect(sidecar.url) as connection:
        if sent:
            connection.sendall(sent)
        outcome = read_outcome(connection, DEADLINE_SECONDS + 20)
    assert outcome.closed, f"{what}: still open"
    if status is None:
        assert outcome.answer is None, outcome
    else:
        assert outcome.answer is not None and outcome.answer.status == status, (what, outcome)
        assert error_code(outcome.answer.body) == "request_timeout"
    reason = {None: "no_request", 408: "head_timeout" if "body" not in what else "body_timeout"}[status]
    assert metric_value(sidecar.metrics(), f'modelserve_sidecar_connections_cut_total{{reason="{reason}"}}') >= 1


def test_a_keyless_body_is_refused_from_the_head_before_it_is_read(sidecar: Sidecar, replay: ReplayEngine) -> None:
    # 65,535 of 65,536 bytes: a body the fast lane would have waited for whole before any check.
    head = chat_head(headers={MARK_HEADER: "keyless-body", "Content-Length": "65536"}) + b"\r\n"
    with connect(sidecar.url) as connection:
        connection.sendall(head + b" " * 65535)
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None and outcome.answer.status == 401, outcome
    assert replay.marked("keyless-body") == []


def test_bodies_beyond_the_process_budget_get_503(sidecar: Sidecar) -> None:
    # Two keyed uploads of 800 KiB, each stopped after 700 KiB: together beyond the 1 MiB budget.
    declared = 800 * 1024
    head = chat_head(headers={**KEYED, "Content-Length": str(declared)}) + b"\r\n"
    with ExitStack() as stack:
        first, second = (stack.enter_context(connect(sidecar.url)) for _ in range(2))
        first.sendall(head + b" " * (700 * 1024))
        send_until_answered(second, [head, *[b" " * 65536] * 11], declared)
        outcomes = [read_outcome(connection, 15) for connection in (second, first)]
    refused = [o for o in outcomes if o.answer is not None and o.answer.status == 503]
    assert len(refused) == 1, outcomes
    assert error_code(refused[0].answer.body) == "server_busy" and refused[0].closed  # type: ignore[union-attr]
    still_serves(sidecar.url)  # the budget is given back


FIRST_REQUESTS = {
    "a body": chat_head(headers={**KEYED, "Content-Length": str(len(CHAT))}) + b"\r\n" + CHAT,
    "no body": b"GET /v1/models HTTP/1.1\r\nHost: modelserve\r\n"
    + f"Authorization: {KEYED['Authorization']}\r\n\r\n".encode(),
}


@pytest.mark.parametrize("first", sorted(FIRST_REQUESTS))
def test_a_pipelined_head_is_held_to_its_bound_in_the_read_that_ended_a_request(
    sidecar: Sidecar, replay: ReplayEngine, first: str
) -> None:
    """Issue 45 N2: a head that began in the same read as the end of the request before it was not
    counted, so a 128 KiB head, which alone gets 431, was accepted (and 4,000 such heads held
    half a GiB)."""
    mark = f"pipelined-head-{first}"
    big = {**KEYED, MARK_HEADER: mark, "X-Big": "v" * (128 * 1024), "Content-Length": str(len(CHAT))}
    with connect(sidecar.url) as connection:
        connection.sendall(FIRST_REQUESTS[first] + chat_head(headers=big) + b"\r\n" + CHAT)  # one write
        data, closed = read_until_closed(connection, 20)
    answers = answers_in(data)
    assert [a.status for a in answers] == [200, 431] and closed, (first, answers, closed)
    assert replay.marked(mark) == []


def test_a_body_in_many_small_chunks_is_no_head(sidecar: Sidecar, replay: ReplayEngine) -> None:
    """The head bound counts what no parsed part accounts for: every chunk's size line and line ends
    are taken off as the chunk completes, so a body of 20,000 small chunks (300 KiB of framing) is not
    taken for a head sent forever, nor is the request pipelined after it."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 60_000}], "max_tokens": 4})
    chunked = b"".join(
        b"%x\r\n%b\r\n" % (len(body[i : i + 3]), body[i : i + 3].encode()) for i in range(0, len(body), 3)
    )
    head = chat_head(headers={**KEYED, MARK_HEADER: "many-chunks", "Transfer-Encoding": "chunked"}) + b"\r\n"
    close = {**KEYED, MARK_HEADER: "after-chunks", "Content-Length": str(len(CHAT)), "Connection": "close"}
    with connect(sidecar.url) as connection:
        connection.sendall(head + chunked + b"0\r\n\r\n" + chat_head(headers=close) + b"\r\n" + CHAT)
        data, _ = read_until_closed(connection, 30)
    assert [a.status for a in answers_in(data)] == [200, 200], data[:300]
    assert len(replay.marked("many-chunks")) == 1 and len(replay.marked("after-chunks")) == 1


def _stream_head(mark: str, length: int) -> bytes:
    # 36 events 0.1 s apart: a stream longer than the body's deadline.
    return chat_head(
        headers={
            **KEYED,
            MARK_HEADER: mark,
            "x-replay-gap": "0.1",
            "x-replay-repeat": "5",
            "Content-Length": str(length),
        }
    )


def test_a_parked_requests_deadline_never_cuts_the_stream_in_front_of_it(
    sidecar: Sidecar, replay: ReplayEngine
) -> None:
    """Issue 45 N9: a stream, and behind it on the connection a request whose body never completes.
    Its body's deadline half-closed the connection mid-stream (the writer then raised `Cannot call
    write() after write_eof()` and the metrics counted an upstream error). Now the stream ends whole
    and the parked request's deadline runs from its turn."""
    stream = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    parked = chat_head(headers={**KEYED, MARK_HEADER: "parked", "Content-Length": "1000"}) + b"\r\n" + b"{" * 10
    errors_before = metric_value(sidecar.metrics(), 'modelserve_sidecar_upstream_errors_total{kind="disconnected"}')
    with connect(sidecar.url) as connection:
        connection.sendall(_stream_head("parked-front", len(stream)) + b"\r\n" + stream + parked)
        data, closed = read_until_closed(connection, DEADLINE_SECONDS + 30)
    answers = answers_in(data)
    assert [a.status for a in answers] == [200, 408] and closed, answers
    events = answers[0].body.split(b"\n\n")[:-1]
    assert len(events) == 36 and events[-1] == b"data: [DONE]", events[-3:]
    assert error_code(answers[1].body) == "request_timeout"
    assert replay.marked("parked") == []
    metrics = sidecar.metrics()
    assert metric_value(metrics, 'modelserve_sidecar_upstream_errors_total{kind="disconnected"}') == errors_before
    assert "Cannot call write() after write_eof()" not in sidecar.logs()


def _stalled(base: str, key: str, declared: int, sent: int, stack: ExitStack) -> Any:
    """A connection that sent the head of a request of `declared` body bytes and `sent` of them."""
    connection = stack.enter_context(connect(base))
    head = chat_head(headers={"Authorization": f"Bearer {key}", "Content-Length": str(declared)}) + b"\r\n"
    connection.sendall(head + b" " * sent)
    return connection


def test_stalled_bodies_that_fill_the_budget_make_room_for_another_keys_request(sidecar: Sidecar) -> None:
    """Issue 45 N1: the bytes of bodies being received are one pool per process; a key holder's
    stalled bodies filled it and every other key's request got 503 server_busy. Now the bodies
    arriving slowest are cut to make room (503 to them), and the request whose bytes arrive gets in."""
    cut_before = metric_value(sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="body_budget"}')
    with ExitStack() as stack:
        stalled = [_stalled(sidecar.url, API_KEY, 300 * 1024, 256 * 1024 - 2, stack) for _ in range(4)]
        # 1 MiB less 8 bytes held: any request with a body crosses the budget.
        answer = httpx.post(
            sidecar.url + "/v1/chat/completions",
            content=CHAT,
            headers={"Authorization": f"Bearer {OTHER_KEY}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        outcomes = [read_outcome(connection, 1) for connection in stalled]
    refused = [o for o in outcomes if o.answer is not None and o.answer.status == 503]
    assert refused and all(error_code(o.answer.body) == "server_busy" for o in refused), outcomes  # type: ignore[union-attr]
    cut = metric_value(sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="body_budget"}')
    assert cut - cut_before == len(refused)


def test_a_client_keeping_many_bodies_fresh_cuts_its_own_not_another_clients_upload(sidecar: Sidecar) -> None:
    """Issue 57 N14: the budget cut the stalest body, so a client that touched each of its bodies just
    before sending more made every honest upload arriving over several reads the stalest, and the one
    cut (0 of 25 served). Now the client holding the most of the budget gives way: the attacker (from
    another address, with a key) loses its own bodies and the upload is served."""
    declared = 10 * 1024 * 1024
    head = chat_head(headers={"Authorization": f"Bearer {OTHER_KEY}", "Content-Length": str(declared)}) + b"\r\n"
    attacker: list[socket.socket] = []
    cut_before = metric_value(sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="body_budget"}')

    def send_or_replace(index: int, data: bytes, stack: ExitStack) -> None:
        """Send on the attacker's connection `index`; one that was cut (answered) comes back anew, as
        an attacker would, so the budget stays full."""
        answered, _, _ = select.select([attacker[index]], [], [], 0)
        try:
            if not answered:
                attacker[index].sendall(data)
                return
        except OSError:
            pass
        attacker[index] = stack.enter_context(connect(sidecar.url, source="127.0.0.2"))
        attacker[index].sendall(head + b" " * (160 * 1024))

    upload = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi " * 100_000}], "max_tokens": 4}
    ).encode()  # 300 KB, in 12 reads
    pieces = [upload[i : i + 25_600] for i in range(0, len(upload), 25_600)]
    with ExitStack() as stack:
        for _ in range(6):  # 960 KiB of the 1 MiB budget
            attacker.append(stack.enter_context(connect(sidecar.url, source="127.0.0.2")))
            attacker[-1].sendall(head + b" " * (160 * 1024))
        honest = stack.enter_context(connect(sidecar.url))
        honest.sendall(chat_head(headers={**KEYED, "Content-Length": str(len(upload))}) + b"\r\n")
        for number, piece in enumerate(pieces):
            honest.sendall(piece)
            time.sleep(0.05)  # the upload's pace (4 Mbit/s): its pieces come in reads of their own
            for index in range(len(attacker)):  # each of its bodies touched: fresher than the upload
                send_or_replace(index, b" ", stack)
            send_or_replace(number % len(attacker), b" " * (64 * 1024), stack)  # and more: over the budget
        outcome = read_outcome(honest, 30)
    assert outcome.answer is not None and outcome.answer.status == 200, outcome
    cut = metric_value(sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="body_budget"}')
    assert cut - cut_before >= 1, (cut, cut_before)  # the attacker's own bodies gave way


def test_a_key_over_its_limits_holds_no_body(sidecar: Sidecar, replay: ReplayEngine) -> None:
    """Issue 45 N1: a key's limits were checked once its body was in, so a key limited to 2 requests
    in flight could keep any number of bodies arriving. Now they are checked from the head: the third
    is refused before any of its body is read, with a Retry-After."""
    with ExitStack() as stack:
        for _ in range(2):
            _stalled(sidecar.url, LIMITED_KEY, 60_000, 1_000, stack)
        for declared in (60_000, 10 * 1024 * 1024):  # a body the protocol collects first, and a larger one
            with connect(sidecar.url) as third:
                head = chat_head(
                    headers={
                        "Authorization": f"Bearer {LIMITED_KEY}",
                        MARK_HEADER: "third",
                        "Content-Length": str(declared),
                    }
                )
                third.sendall(head + b"\r\n")
                outcome = read_outcome(third, DEADLINE_SECONDS)  # before its body's deadline
            assert outcome.answer is not None and outcome.answer.status == 429, outcome
            assert error_code(outcome.answer.body) == "in_flight" and outcome.answer.headers["retry-after"] == "1"
    assert replay.marked("third") == []


def test_a_key_holder_at_the_connection_cap_leaves_the_probes_their_answers(
    replay: ReplayEngine, tmp_path: Path
) -> None:
    """Issue 45 N4: a key without maxInFlight kept the cap + 12 requests in flight at a slow engine,
    and /healthz answered 503 too_many_connections: three failed probes restart the sidecar with every
    tenant's streams. Past the cap a few connections are kept for the server's own routes."""
    SecretDir(tmp_path / "keys").write({"api-key": API_KEY + "\n"})
    running = launch_sidecar(
        tmp_path / "logs",
        replay.url,
        "tiny",
        {"MODELSERVE_KEYS_DIR": str(tmp_path / "keys"), "MODELSERVE_MAX_CONNECTIONS": "16"},
    )
    stall = {**KEYED, "x-replay-stall": "8", "Content-Length": str(len(CHAT))}
    try:
        wait_ready(running)
        with ExitStack() as stack:
            # The cap's 16 first, each serving its request, then 12 more: opened all at once, the
            # server could accept connections 17-28 before any request came, and then it rightly
            # evicts the oldest idle ones instead (the test's flake: 12 `evicted`, no 503).
            held = [stack.enter_context(connect(running.url)) for _ in range(16)]
            for connection in held:
                connection.sendall(chat_head(headers=stall) + b"\r\n" + CHAT)
            in_flight = "modelserve_sidecar_in_flight_requests"
            wait_until(lambda: metric_value(running.metrics(), in_flight) >= 16, 20, "the cap's requests in flight")
            past_cap = [stack.enter_context(connect(running.url)) for _ in range(12)]
            for connection in past_cap:
                connection.sendall(chat_head(headers=stall) + b"\r\n" + CHAT)
            held += past_cap
            for route in ("/healthz", "/readyz", "/load"):
                assert httpx.get(running.url + route, timeout=10).status_code == 200, route
            # Requests for the engine on connections past the cap are refused, not served: the cap's
            # own 16 are answered once the engine is done with them.
            outcomes = [read_outcome(connection, 15) for connection in held]
        statuses = sorted(o.answer.status for o in outcomes if o.answer is not None)
        assert statuses.count(200) <= 16 and set(statuses) <= {200, 503}, statuses
        cut = metric_value(running.metrics(), 'modelserve_sidecar_connections_cut_total{reason="too_many_connections"}')
        cuts = [line for line in running.metrics().splitlines() if "cut_total{" in line and not line.endswith(" 0.0")]
        assert cut >= statuses.count(503) >= 1, (cut, statuses, cuts)
    finally:
        stop_sidecar(running)


def _chunked(body: bytes, trailer: str) -> bytes:
    return b"%x\r\n%b\r\n0\r\n%b\r\n" % (len(body), body, trailer.encode())


def test_a_key_in_a_chunked_trailer_opens_nothing(sidecar: Sidecar, replay: ReplayEngine) -> None:
    head = chat_head(headers={MARK_HEADER: "trailer-key", "Transfer-Encoding": "chunked"}) + b"\r\n"
    with connect(sidecar.url) as connection:
        connection.sendall(head + _chunked(CHAT, f"Authorization: Bearer {API_KEY}\r\n"))  # one write
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None and outcome.answer.status == 401, outcome
    assert replay.marked("trailer-key") == []


def test_trailer_fields_never_become_request_headers(sidecar: Sidecar, replay: ReplayEngine) -> None:
    head = chat_head(headers={**KEYED, MARK_HEADER: "trailer-fields", "Transfer-Encoding": "chunked"}) + b"\r\n"
    with connect(sidecar.url) as connection:
        connection.sendall(head + _chunked(CHAT, "X-Trailer-Probe: yes\r\nX-Forwarded-For: 203.0.113.9\r\n"))
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None and outcome.answer.status == 200, outcome
    (names,) = replay.header_names["trailer-fields"]
    assert "x-trailer-probe" not in names and "x-forwarded-for" not in names, names


def test_an_h2c_upgrade_request_keeps_its_body(sidecar: Sidecar, replay: ReplayEngine) -> None:
    # What curl --http2 sends to an http:// URL: this server speaks HTTP/1.1 and ignores the Upgrade.
    headers = {
        **KEYED,
        MARK_HEADER: "h2c",
        "Connection": "Upgrade, HTTP2-Settings",
        "Upgrade": "h2c",
        "HTTP2-Settings": "AAMAAABkAAQAoAAAAAIAAAAA",
        "Content-Type": "application/json",
        "Content-Length": str(len(CHAT)),
    }
    with connect(sidecar.url) as connection:
        connection.sendall(chat_head(headers=headers) + b"\r\n" + CHAT)
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None and outcome.answer.status == 200, outcome
    assert replay.marked("h2c") == [("POST", "/v1/chat/completions")]


def test_idle_connections_beyond_the_file_limit_leave_room_for_probes(replay: ReplayEngine, tmp_path: Path) -> None:
    """The issue's measurement: a sidecar whose open-file limit is 1024 (a common container
    default), 1,100 keyless connections that send half a request and wait: /healthz and a keyed
    request still answer, each on a new connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.fail(f"this test opens 1,100 sockets; the hard open-file limit is {hard}")
    SecretDir(tmp_path / "keys").write({"api-key": API_KEY + "\n"})
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    running = launch_sidecar(
        tmp_path / "logs",
        replay.url,
        "tiny",
        {"MODELSERVE_KEYS_DIR": str(tmp_path / "keys")},
        argv_prefix=("prlimit", "--nofile=1024:1024", "--"),
    )
    try:
        wait_ready(running)
        with ExitStack() as stack:
            for _ in range(1100):
                try:
                    connection = stack.enter_context(connect(running.url))
                    connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                except OSError:  # made room for by closing the oldest: that is the point
                    continue
            still_serves(running.url)
            evicted = metric_value(running.metrics(), 'modelserve_sidecar_connections_cut_total{reason="evicted"}')
            assert evicted >= 1100 - 448, evicted  # the cap: (1024 - 128) / 2 connections
    finally:
        stop_process(running.process)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    log = running.log.read_text()
    assert "Too many open files" not in log, log[-2000:]


def test_requests_pipelined_far_ahead_of_their_answers_are_not_parked_without_bound(sidecar: Sidecar) -> None:
    """Issue 57 N12: every request pipelined in one read was parsed and parked: 256 KiB of keyed GETs
    became about 4,000 parked request objects per connection (10 connections took the sidecar from 62
    to 93 MiB). Now a connection parks at most 16: the answers in front of the 17th come whole, then a
    429 too_many_pipelined, and the connection closes; what it cost is given back."""
    models = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode()
    ahead = models * (256 * 1024 // len(models))
    before = status_bytes(sidecar.process.pid)
    cut_before = metric_value(
        sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="too_many_pipelined"}'
    )
    with ExitStack() as stack:
        connections = [stack.enter_context(connect(sidecar.url)) for _ in range(10)]
        for connection in connections:
            connection.sendall(ahead)
        received = [read_until_closed(connection, 30) for connection in connections]
        grown = status_bytes(sidecar.process.pid) - before
    for data, closed in received:
        answers = answers_in(data)
        assert closed and 1 <= len(answers) <= 18, (len(answers), closed)
        assert all(a.status == 200 for a in answers[:-1]), [a.status for a in answers]
        assert answers[-1].status == 429 and error_code(answers[-1].body) == "too_many_pipelined", answers[-1]
    cut = metric_value(sidecar.metrics(), 'modelserve_sidecar_connections_cut_total{reason="too_many_pipelined"}')
    assert cut == cut_before + len(connections)
    assert grown < 16 * 1024 * 1024, grown  # was 31 MiB for these 10 (resident memory is not given back)
    still_serves(sidecar.url)


def _flood_without_reading(url: str, piece: bytes, max_bytes: int, stall_seconds: float) -> tuple[socket.socket, int]:
    """Send `piece` again and again on a connection that never reads, until `max_bytes` are sent or
    nothing more goes for `stall_seconds` (the server stopped reading): the socket and bytes sent."""
    connection = connect(url)
    connection.setblocking(False)
    block, sent = piece * (65536 // len(piece)), 0
    pending = memoryview(block)  # what a partial send left of the block: the stream stays whole requests
    last = time.monotonic()
    while sent < max_bytes and time.monotonic() - last < stall_seconds:
        try:
            written = connection.send(pending)
            sent += written
            pending = pending[written:] if written < len(pending) else memoryview(block)
            last = time.monotonic()
        except BlockingIOError:
            select.select([], [connection], [], 0.1)
        except OSError:  # cut
            break
    return connection, sent


def test_a_client_that_never_reads_its_refusals_stops_being_read_and_is_cut(
    replay: ReplayEngine, tmp_path: Path
) -> None:
    """Issue 57 N11 and N13: a keyless connection pipelining requests refused from the head, never
    reading the answers, grew the proxy without bound (sidecar 62 -> 638 MiB for 80 MiB sent): a
    refusal made at once was written with no look at the transport's buffer, so reading never paused;
    and a connection whose answers are never read was never timed out. Now reading stops while the
    client's answers wait in the buffer, and after `sendTimeoutSeconds` the connection is cut."""
    SecretDir(tmp_path / "keys").write({"api-key": API_KEY + "\n"})
    env = {"MODELSERVE_KEYS_DIR": str(tmp_path / "keys"), "MODELSERVE_SEND_TIMEOUT_SECONDS": "2"}
    sidecar = launch_sidecar(tmp_path / "logs", replay.url, "tiny", env)
    try:
        wait_ready(sidecar)
        cut = 'modelserve_sidecar_connections_cut_total{reason="send_timeout"}'
        before, cut_before = status_bytes(sidecar.process.pid), metric_value(sidecar.metrics(), cut)
        keyless = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        connection, sent = _flood_without_reading(sidecar.url, keyless, 32 * 1024 * 1024, stall_seconds=1)
        with connection:
            grown = status_bytes(sidecar.process.pid) - before
            # Each 70-byte request is a 370-byte 401: what was read is answered into a buffer that
            # stops growing at its high-water mark (was 62 -> 307 MiB for 32 MiB sent in 14 s).
            assert grown < 8 * 1024 * 1024 and sent < 16 * 1024 * 1024, (grown, sent)
            wait_until(
                lambda: metric_value(sidecar.metrics(), cut) == cut_before + 1,
                30,
                "the send timeout's cut",
                on_timeout=lambda: (
                    f" (sent {sent} bytes; cuts: "
                    + ", ".join(
                        line
                        for line in sidecar.metrics().splitlines()
                        if line.startswith(cut.split("{", maxsplit=1)[0])
                    )
                    + ")"
                ),
            )
        still_serves(sidecar.url)
    finally:
        stop_sidecar(sidecar)
