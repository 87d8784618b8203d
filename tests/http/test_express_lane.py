"""The express lane (modelserve/http/express.py) of a real sidecar process in front of the replay
engine: a request sent on an idle pooled connection and answered from the connections' callbacks,
without a task. What a task did for it has to hold without one: a client that leaves while the engine
has not answered is counted and frees its place, the drain on SIGTERM waits for it, and the drain
deadline answers it 500 as a cancelled task's request. Each test first warms the pool (an answered
request leaves its connection idle for 3 s), so the request under test takes the express lane."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Callable

import httpx

from harness.sidecar import (
    API_KEY,
    ReplayEngine,
    Sidecar,
    metric_value,
    read_recording,
    start_replay,
    wait_until,
)

StartSidecar = Callable[..., Sidecar]
CHAT = "/v1/chat/completions"
BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}).encode()
GONE = f'modelserve_sidecar_requests_total{{route="{CHAT}",status_class="client_closed"}}'


def _request(stall: float, key: str = API_KEY) -> bytes:
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: sidecar\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\nx-replay-stall: {stall}\r\n\r\n"
    ).encode() + BODY


def _connect(sidecar: Sidecar) -> socket.socket:
    host, port = sidecar.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def _warm(sidecar: Sidecar) -> None:
    answer = httpx.post(sidecar.url + CHAT, content=BODY, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert answer.status_code == 200, answer.text


def _received_after(replay: ReplayEngine, count: int) -> Callable[[], bool]:
    return lambda: len(replay.received) > count


def test_a_client_gone_before_the_answer_is_counted_and_frees_its_place(
    replay: ReplayEngine, replay_sidecar: Sidecar
) -> None:
    before = metric_value(replay_sidecar.metrics(), GONE)
    _warm(replay_sidecar)
    arrived = len(replay.received)
    with _connect(replay_sidecar) as connection:
        connection.sendall(_request(stall=1.5))
        wait_until(_received_after(replay, arrived), 10, "the request to reach the engine", interval=0.02)
    # The client is gone while the engine still works on it: counted as such, nothing left in flight.
    wait_until(lambda: metric_value(replay_sidecar.metrics(), GONE) == before + 1, 10, "the hang-up to be counted")
    assert metric_value(replay_sidecar.metrics(), "modelserve_sidecar_in_flight_requests") == 0
    _warm(replay_sidecar)  # the pool lost that connection, and answers on another


def _answer_through_sigterm(sidecar: Sidecar, stall: float) -> bytes:
    """A request the engine answers after `stall` seconds; the sidecar is sent SIGTERM while it waits.
    Everything the client received."""
    _warm(sidecar)
    received: list[bytes] = []
    with _connect(sidecar) as connection:
        connection.sendall(_request(stall, key="any"))  # a public sidecar
        time.sleep(0.3)  # sent and waiting for the engine
        sidecar.process.send_signal(signal.SIGTERM)
        while chunk := connection.recv(65536):
            received.append(chunk)
    assert sidecar.process.wait(timeout=30) in (0, -signal.SIGTERM)
    return b"".join(received)


def test_sigterm_drains_a_request_waiting_for_its_answer(start_sidecar: StartSidecar) -> None:
    replay = start_replay()
    try:
        sidecar = start_sidecar(replay.url, MODELSERVE_AUTH="public", MODELSERVE_DRAIN_SECONDS="30")
        answer = _answer_through_sigterm(sidecar, stall=1.5)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nconnection: close" in head.lower(), head
        assert body == read_recording("chat.http").body
    finally:
        replay.stop()


def test_the_drain_deadline_answers_a_request_still_waiting_500(start_sidecar: StartSidecar) -> None:
    replay = start_replay()
    try:
        sidecar = start_sidecar(replay.url, MODELSERVE_AUTH="public", MODELSERVE_DRAIN_SECONDS="0.5")
        answer = _answer_through_sigterm(sidecar, stall=8)
        assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n"), answer
        assert "still waiting for its upstream at the drain deadline" in sidecar.logs()
    finally:
        replay.stop()


def test_many_requests_at_once_share_the_pooled_connections(replay: ReplayEngine, replay_sidecar: Sidecar) -> None:
    """Concurrent requests beside idle and busy pooled connections: every answer whole, none lost."""
    _warm(replay_sidecar)
    answers: list[httpx.Response] = []

    def client() -> None:
        with httpx.Client(timeout=30) as session:
            for _ in range(20):
                answers.append(
                    session.post(replay_sidecar.url + CHAT, content=BODY, headers={"Authorization": f"Key {API_KEY}"})
                )

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 160
    assert {(a.status_code, a.content) for a in answers} == {(200, read_recording("chat.http").body)}
    assert metric_value(replay_sidecar.metrics(), "modelserve_sidecar_in_flight_requests") == 0
