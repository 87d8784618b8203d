"""Versions of one served name through the real gateway (in this process, on uvicorn) in front of
real sidecar processes and the replay engine: the split by weight as the gateway's own counters
count it, a weight change taking effect, the name listed once, and a failing version's guard
stopping its traffic until its reset annotation changes. The watches, the operator's status and
the real engine are proven in tests/realnode/test_rollout_on_node.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import pytest

from harness.in_process import serving_gateway
from harness.sidecar import ReplayEngine, Sidecar, free_ports, launch_sidecar, metric_value, start_replay, stop_sidecar
from harness.sidecar import wait_ready as sidecar_ready
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve.gateway.versions import Guard
from modelserve_sandbox.processes import wait_until

DEAD = "127.0.0.1:9"  # nothing listens on the discard port: connections are refused
SPLIT_REQUESTS = 200
GUARD = Guard(window=10, max_error_rate=0.2, max_ttft_ratio=5.0)


@dataclass
class Setup:
    base: str
    discovery: FixedDiscovery
    replicas: dict[str, str]  # version -> its sidecar's address


def version(name: str, replica: str, weight: int, guard: Guard | None = None, reset: str = "") -> Model:
    return Model(
        "apps",
        name,
        True,
        replicas=(replica,),
        pods={replica: f"{name}-pod"},
        ring=Ring([replica]),
        served_as="bot",
        weight=weight,
        guard=guard,
        guard_reset=reset,
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base = tmp_path_factory.mktemp("versions")
    replay: ReplayEngine = start_replay()
    sidecars: list[Sidecar] = []
    try:
        for name in ("bot-v1", "bot-v2"):
            env = {"MODELSERVE_AUTH": "public", "MODELSERVE_UPSTREAM_MODEL": "tiny"}  # what the replay engine serves
            sidecars.append(launch_sidecar(base / "logs", replay.url, name, env))
        for sidecar in sidecars:
            sidecar_ready(sidecar)
        replicas = {name: s.url.removeprefix("http://") for name, s in zip(("bot-v1", "bot-v2"), sidecars, strict=True)}
        discovery = FixedDiscovery(
            [version("bot-v1", replicas["bot-v1"], 90), version("bot-v2", replicas["bot-v2"], 10)]
        )
        (port,) = free_ports(1)
        settings = GatewaySettings.from_env({"MODELSERVE_GATEWAY_LISTEN_PORT": str(port)})
        with serving_gateway(settings, discovery) as url:
            yield Setup(url, discovery, replicas)
    finally:
        for sidecar in sidecars:
            stop_sidecar(sidecar)
        replay.stop()


def answered(setup: Setup, name: str) -> float:
    """The gateway's own count of answers by a version (2xx)."""
    text = httpx.get(setup.base + "/metrics", timeout=10).text
    return metric_value(
        text, f'modelserve_gateway_requests_total{{model="{name}",namespace="apps",status_class="2xx"}}'
    )


def all_on(setup: Setup, name: str) -> bool:
    """Whether the next ten conversations all went to version `name`."""
    return {ask(setup, i).headers.get("x-modelserve-replica") for i in range(900, 910)} == {f"{name}-pod"}


def ask(setup: Setup, conversation: int) -> httpx.Response:
    messages = [{"role": "user", "content": f"question {conversation}"}]
    return httpx.post(f"{setup.base}/v1/chat/completions", json={"model": "bot", "messages": messages}, timeout=60)


def test_requests_split_by_weight_and_a_conversation_keeps_its_version(setup: Setup) -> None:
    before = {name: answered(setup, name) for name in setup.replicas}
    pods = [ask(setup, i).headers["x-modelserve-replica"] for i in range(SPLIT_REQUESTS)]
    counts = {name: answered(setup, name) - before[name] for name in setup.replicas}
    assert counts["bot-v1"] + counts["bot-v2"] == SPLIT_REQUESTS
    # 10% of 200: 20 expected; outside [5, 40] with probability below 1e-4 for a fair split.
    assert 5 <= counts["bot-v2"] <= 40, counts
    # The same conversation again: the same version each time.
    assert [ask(setup, i).headers["x-modelserve-replica"] for i in range(20)] == pods[:20]
    listed = httpx.get(setup.base + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in listed] == ["bot"]
    tags = httpx.get(setup.base + "/api/tags", timeout=10).json()["models"]
    assert [m["name"] for m in tags] == ["bot:latest"]


def test_a_weight_change_takes_effect_at_once(setup: Setup) -> None:
    v1, v2 = setup.replicas["bot-v1"], setup.replicas["bot-v2"]
    setup.discovery.update(version("bot-v1", v1, 0))
    setup.discovery.update(version("bot-v2", v2, 100))
    try:
        # The update reaches the gateway's loop a moment later, as a watch event would.
        wait_until(lambda: all_on(setup, "bot-v2"), 30, "the gateway taking the new weights")
        before = answered(setup, "bot-v2")
        assert {ask(setup, i).status_code for i in range(30)} == {200}
        assert answered(setup, "bot-v2") - before == 30
    finally:
        setup.discovery.update(version("bot-v1", v1, 90))
        setup.discovery.update(version("bot-v2", v2, 10))


def test_a_failing_version_trips_its_guard_and_gets_no_new_requests_until_reset(setup: Setup) -> None:
    v1 = setup.replicas["bot-v1"]
    failing = version("bot-v2", DEAD, 50, GUARD)
    setup.discovery.update(version("bot-v1", v1, 50))
    setup.discovery.update(failing)
    try:
        statuses = []
        for i in range(400):  # bounded: the guard needs GUARD.window of the failing version's answers
            statuses.append(ask(setup, i).status_code)
            if httpx.get(setup.base + "/guards", timeout=10).json()["guards"]:
                break
        (report,) = httpx.get(setup.base + "/guards", timeout=10).json()["guards"]
        # Its window also holds its answers from before it failed: the failures are those just seen.
        failures = statuses.count(503)
        assert (report["name"], report["requests"]) == ("bot-v2", GUARD.window), report
        assert report["errorRate"] == failures / GUARD.window > GUARD.max_error_rate, report
        assert f"{failures} of its last {GUARD.window} requests failed" in report["message"]
        # Tripped: every new request goes to the stable version.
        assert {ask(setup, i).status_code for i in range(40)} == {200}
        metrics = httpx.get(setup.base + "/metrics", timeout=10).text
        assert (
            metric_value(metrics, 'modelserve_gateway_traffic_guard_trips_total{model="bot-v2",namespace="apps"}') == 1
        )
        # A new reset value clears it: the version takes requests again.
        setup.discovery.update(replace(failing, guard_reset="2026-11-26T20:00:00Z"))
        wait_until(lambda: not httpx.get(setup.base + "/guards", timeout=10).json()["guards"], 30, "the reset")
        assert 503 in {ask(setup, i).status_code for i in range(40)}
    finally:
        setup.discovery.update(version("bot-v1", v1, 90))
        setup.discovery.update(version("bot-v2", setup.replicas["bot-v2"], 10))
