"""The gateway's connections are bounded as the sidecar's (modelserve/http/limits.py, shared), with its
own settings: raw sockets against the gateway (in this process: harness/in_process.py)
in front of a private sidecar before the replay engine. The bounds themselves are tried in depth
against the sidecar (tests/http/test_hostile_clients.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from harness.in_process import serving_gateway_app
from harness.process_memory import status_bytes
from harness.sidecar import (
    API_KEY,
    SecretDir,
    free_ports,
    launch_sidecar,
    start_replay,
    stop_sidecar,
    wait_ready,
)
from modelserve.gateway.app import Dispatcher
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve_sandbox.processes import ended, wait_until
from tests.helpers.hostile import (
    KEYED,
    chat_head,
    connect,
    endless_headers,
    error_code,
    read_outcome,
    send_until_answered,
    still_serves,
)

DEADLINE_SECONDS = 1.5
BUDGET_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private sidecar before the replay engine: its address."""
    base = tmp_path_factory.mktemp("hostile-gateway")
    replay = start_replay()
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    sidecar = launch_sidecar(base / "logs", replay.url, "tiny", {"MODELSERVE_KEYS_DIR": str(base / "keys")})
    try:
        wait_ready(sidecar)
        yield sidecar.url.removeprefix("http://")
    finally:
        stop_sidecar(sidecar)
        replay.stop()


@contextmanager
def _gateway(
    replica: str, public: bool, budget: int = BUDGET_BYTES, loop_share: int = 200_000
) -> Iterator[tuple[str, Dispatcher]]:
    """The gateway before the private model `tiny` (and, with `public`, a public model `open` on the
    same replica: a request without a key must then be read to know its model); `loop_share`: the
    JSON values a second an owner's bodies may have read on its event loop."""
    route = {"replicas": (replica,), "pods": {replica: "pod-0"}, "ring": Ring([replica])}
    models = [Model("hostile", "tiny", False, **route)] + ([Model("hostile", "open", True, **route)] if public else [])
    (port,) = free_ports(1)
    settings = GatewaySettings.from_env(
        {
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
            "MODELSERVE_GATEWAY_HEAD_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
            "MODELSERVE_GATEWAY_BODY_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
            "MODELSERVE_GATEWAY_BODY_BUDGET_BYTES": str(budget),
            "MODELSERVE_GATEWAY_LOOP_SHARE_VALUES_PER_SECOND": str(loop_share),
        }
    )
    with serving_gateway_app(settings, FixedDiscovery(models)) as served:
        yield served


@pytest.fixture(scope="module")
def gateway_app(replica: str) -> Iterator[tuple[str, Dispatcher]]:
    with _gateway(replica, public=True) as served:
        yield served


@pytest.fixture(scope="module")
def gateway(gateway_app: tuple[str, Dispatcher]) -> str:
    return gateway_app[0]


def test_a_header_section_sent_forever_gets_431(gateway: str) -> None:
    with connect(gateway) as connection:
        connection.sendall(chat_head())
        sent = send_until_answered(connection, endless_headers(), 16 * 1024 * 1024)
        outcome = read_outcome(connection, 15)
    assert outcome.answer is not None and outcome.answer.status == 431 and outcome.closed, (sent, outcome)
    still_serves(gateway)


def test_half_a_header_section_is_cut_at_its_deadline(gateway: str) -> None:
    with connect(gateway) as connection:
        connection.sendall(chat_head(headers={"Content-Length": "100"}))
        outcome = read_outcome(connection, DEADLINE_SECONDS + 20)
    assert outcome.answer is not None and outcome.answer.status == 408 and outcome.closed, outcome


def test_keyless_bodies_beyond_the_budget_get_503_and_it_is_given_back(gateway: str) -> None:
    # The gateway checks no key: it must read a body to know its model, within the budget.
    declared = 600 * 1024
    head = chat_head(headers={"Content-Length": str(declared)}) + b"\r\n"
    with ExitStack() as stack:
        connections = [stack.enter_context(connect(gateway)) for _ in range(3)]
        for connection in connections:
            send_until_answered(connection, [head, *[b" " * 65536] * 7], declared)
        outcomes = [read_outcome(connection, 5) for connection in connections]
    refused = [o for o in outcomes if o.answer is not None and o.answer.status == 503]
    assert refused, outcomes
    assert all(error_code(o.answer.body) == "server_busy" and o.closed for o in refused)  # type: ignore[union-attr]
    still_serves(gateway)


def test_stalled_keyless_bodies_that_fill_the_budget_make_room_for_a_keyed_request(gateway: str) -> None:
    """Issue 45 N1: the gateway holds no keys and reads a body to know its model, within one budget
    per process; seven stalled keyless bodies filled it and 99% of legitimate requests got 503
    server_busy while /healthz stayed 200. Now the bodies whose bytes came longest ago are cut to make
    room for the request whose bytes are arriving."""
    with ExitStack() as stack:
        stalled = []
        for _ in range(4):  # 1 MiB less 8 bytes held: any request with a body crosses the budget
            connection = stack.enter_context(connect(gateway))
            connection.sendall(
                chat_head(headers={"Content-Length": str(300 * 1024)}) + b"\r\n" + b" " * (256 * 1024 - 2)
            )
            stalled.append(connection)
        still_serves(gateway)
        outcomes = [read_outcome(connection, 1) for connection in stalled]
    refused = [o for o in outcomes if o.answer is not None and o.answer.status == 503]
    assert refused and all(error_code(o.answer.body) == "server_busy" for o in refused), outcomes  # type: ignore[union-attr]


def test_a_keyless_body_with_no_public_model_is_refused_from_its_head(replica: str) -> None:
    """Issue 45 N8: with no public ModelServer a request without a key can only get its sidecar's
    401: the gateway answers it from the head, before any of its body is held or read."""
    with _gateway(replica, public=False) as (url, _), connect(url) as connection:
        connection.sendall(chat_head(headers={"Content-Length": str(10 * 1024 * 1024)}) + b"\r\n" + b"[" * 1000)
        outcome = read_outcome(connection, 10)
    assert outcome.answer is not None and outcome.answer.status == 401, outcome
    assert error_code(outcome.answer.body) == "missing_api_key"


def _read_off_loop(app: Dispatcher, outcome: str) -> float:
    return (
        app.proxy.metrics.registry.get_sample_value(
            "modelserve_gateway_bodies_read_off_loop_total", {"outcome": outcome}
        )
        or 0.0
    )


def test_a_body_of_very_many_values_is_read_off_the_event_loop(gateway_app: tuple[str, Dispatcher]) -> None:
    """Issue 45 N8: a 10 MiB body of `[[],[],...]` took the gateway about a second of its event loop
    to read (keyless bodies back to back took keyed requests from 2 ms to 555 ms at p90). Such a body
    is read in a helper process; the request is routed and answered as any other."""
    url, app = gateway_app
    before = _read_off_loop(app, "read")
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    heavy = json.dumps({**request, "x": [[]] * 30_000})
    answer = httpx.post(url + "/v1/chat/completions", content=heavy, headers=KEYED, timeout=60)
    assert answer.status_code == 200, answer.text
    assert _read_off_loop(app, "read") == before + 1
    still_serves(url)  # a light body is read on the loop
    assert _read_off_loop(app, "read") == before + 1


def test_bodies_past_their_owners_share_of_the_loop_are_read_off_it(replica: str) -> None:
    """Issue 57 N18: bodies just under the off-loop threshold (20,000 values, about 20 ms each) were all
    read on the event loop, and one connection sending them held it at 100%. Now each owner has a share
    of the loop (values a second); a body past it is read in the helper process, answered as any other,
    while a light body stays on the loop. Here the share (5,000 a second) is below one such body."""
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    under_threshold = json.dumps({**request, "x": [0] * 9_000})  # about 9,000 values: read on the loop before
    with _gateway(replica, public=False, loop_share=5_000) as (url, app):
        before = _read_off_loop(app, "read")
        for _ in range(3):
            answer = httpx.post(url + "/v1/chat/completions", content=under_threshold, headers=KEYED, timeout=60)
            assert answer.status_code == 200, answer.text
        assert _read_off_loop(app, "read") == before + 3
        light = httpx.post(url + "/v1/chat/completions", json=request, headers=KEYED, timeout=60)
        assert light.status_code == 200, light.text
        assert _read_off_loop(app, "read") == before + 3  # within its share: on the loop


def test_the_body_reader_is_bounded_in_memory_and_replaced_when_it_dies(replica: str) -> None:
    """Issue 57 N15: one keyless 10 MiB body of nested lists took the helper to 549 MiB (past the pod's
    512 Mi), and once it died it was never replaced: every later large body got 500 while /healthz
    stayed 200. Now it reads within its bound (413 too_many_values past it, the helper still there),
    and a helper killed as the OOM killer would is replaced at the next large body."""
    with _gateway(replica, public=True, budget=32 * 1024 * 1024) as (url, app):
        _bounded_and_replaced(url, app)


def _bounded_and_replaced(url: str, app: Dispatcher) -> None:
    work = app.proxy.off_loop_work
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    heavy = json.dumps({**request, "x": [[]] * 30_000})
    assert httpx.post(url + "/v1/chat/completions", content=heavy, headers=KEYED, timeout=60).status_code == 200
    (helper,) = work.helper_pids()
    bloated = b'{"model": "tiny", "x": [' + b"[[]]," * (10 * 1024 * 1024 // 5 - 20) + b"[]]}"  # 4.2 million lists
    before = _read_off_loop(app, "too_large")
    answer = httpx.post(url + "/v1/chat/completions", content=bloated, headers=KEYED, timeout=120)
    assert answer.status_code == 413 and error_code(answer.content) == "too_many_values", answer.text[:300]
    assert _read_off_loop(app, "too_large") == before + 1
    assert work.helper_pids() == [helper]  # refused inside its bound: the same helper, alive
    assert status_bytes(helper, "VmHWM") < 320 * 1024 * 1024, status_bytes(helper, "VmHWM")
    os.kill(helper, signal.SIGKILL)
    wait_until(lambda: ended(helper), 30, "the helper to die")
    gone = _read_off_loop(app, "gone")
    outcomes = [
        httpx.post(url + "/v1/chat/completions", content=heavy, headers=KEYED, timeout=60).status_code for _ in range(3)
    ]
    # At most the one call that met the dead helper is refused (503, retryable); then a new one reads.
    assert outcomes[-1] == 200 and outcomes.count(503) <= 1 and set(outcomes) <= {200, 503}, outcomes
    assert _read_off_loop(app, "gone") - gone == outcomes.count(503)
    assert work.helper_pids() and work.helper_pids() != [helper] and work.replaced >= 1


def test_many_large_bodies_from_one_client_leave_the_body_reader_to_others(replica: str) -> None:
    """Issue 57 N16: the body reader's places were one queue for everyone: 4 connections sending large
    bodies kept them, and 0 of 60 legitimate large requests were served. Now a key a replica accepted
    has its own place and any other request takes its address's one: eight connections of made-up keys
    hold one place between them while every large request of the proven key is read."""
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    heavy = json.dumps({**request, "x": [[]] * 200_000})  # 800 KB: under the body limit
    stop = threading.Event()
    attacks: list[int] = []

    def attacker(number: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer made-up-{number}"}, timeout=60) as client:
            for _ in range(10_000):
                if stop.is_set():
                    return
                attacks.append(client.post(url + "/v1/chat/completions", content=heavy).status_code)

    with _gateway(replica, public=False, budget=64 * 1024 * 1024) as (url, app):
        assert httpx.post(url + "/v1/chat/completions", json=request, headers=KEYED, timeout=60).status_code == 200
        threads = [threading.Thread(target=attacker, args=(n,), daemon=True) for n in range(8)]
        for thread in threads:
            thread.start()
        try:
            wait_until(
                lambda: _read_off_loop(app, "busy") >= 8,
                20,
                "the attackers to fill their share",
                on_timeout=lambda: f"{sorted(set(attacks))} {len(attacks)} read={_read_off_loop(app, 'read')}",
            )
            served = [
                httpx.post(url + "/v1/chat/completions", content=heavy, headers=KEYED, timeout=60).status_code
                for _ in range(12)
            ]
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
    assert served == [200] * 12, served
    # The attacker is refused (401, 503), or, on cores busy with the rest of the suite, cut by the
    # body deadline (408): each is a refusal; the honest client's twelve answers are the point.
    assert set(attacks) <= {401, 408, 503} and attacks.count(503) >= 8, sorted(set(attacks))
