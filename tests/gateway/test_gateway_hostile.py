"""The gateway's connections are bounded as the sidecar's (modelserve/http/limits.py, shared), with its
own settings: raw sockets against the gateway (in this process: tests.helpers.in_process.py)
in front of a private sidecar before the replay engine. The bounds themselves are tried in depth
against the sidecar (tests/http/test_hostile_clients.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from harness.sidecar import (
    API_KEY,
    SecretDir,
    free_ports,
    launch_sidecar,
    start_replay,
    stop_sidecar,
    wait_ready,
)
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from tests.helpers.hostile import (
    chat_head,
    connect,
    endless_headers,
    error_code,
    read_outcome,
    send_until_answered,
    still_serves,
)
from tests.helpers.in_process import serving_gateway

DEADLINE_SECONDS = 1.5
BUDGET_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("hostile-gateway")
    replay = start_replay()
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    sidecar = launch_sidecar(base / "logs", replay.url, "tiny", {"MODELSERVE_KEYS_DIR": str(base / "keys")})
    try:
        wait_ready(sidecar)
        replica = sidecar.url.removeprefix("http://")
        model = Model("hostile", "tiny", False, replicas=(replica,), pods={replica: "pod-0"}, ring=Ring([replica]))
        (port,) = free_ports(1)
        settings = GatewaySettings.from_env(
            {
                "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
                "MODELSERVE_GATEWAY_HEAD_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
                "MODELSERVE_GATEWAY_BODY_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
                "MODELSERVE_GATEWAY_BODY_BUDGET_BYTES": str(BUDGET_BYTES),
            }
        )
        with serving_gateway(settings, FixedDiscovery([model])) as url:
            yield url
    finally:
        stop_sidecar(sidecar)
        replay.stop()


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
