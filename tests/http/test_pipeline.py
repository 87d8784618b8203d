"""The request pipeline (modelserve/http/pipeline.py): both lanes of the direct protocol run the same
steps in the same order, and the ledger sees each lifecycle rule broken (so the check every proxy
test ends with, harness/lifecycle.py, can fail).

The sidecar's own steps run in a real uvicorn server in this process, in front of the replay engine
(vLLM's recorded answers); only a record of which step ran is added."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.in_process import serving
from harness.lifecycle import counts_in, ledger_counts
from harness.sidecar import API_KEY, ReplayEngine, SecretDir, start_replay
from modelserve.contracts.sidecar import Settings
from modelserve.http.downstream import Exchange
from modelserve.http.pipeline import ENDED_TWICE, PICKED_WHILE_HELD, SETTLED_TWICE, Plan
from modelserve.http.upstream import open_pool
from modelserve.sidecar.keys import KeyStore
from modelserve.sidecar.metrics import SidecarMetrics
from modelserve.sidecar.proxy import Proxy
from modelserve_sandbox.processes import free_ports, wait_until

STEPS = ("admit", "plan", "ready", "wait", "pick", "release", "passes_on", "tried", "settle", "end")
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Recorded(Proxy):
    """The sidecar's steps, each noting its name in `ran` before it runs."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.ran: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in STEPS:
            object.__getattribute__(self, "ran").append(name)
        return object.__getattribute__(self, name)


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayEngine]:
    engine = start_replay()
    yield engine
    engine.stop()


@pytest.fixture
def served(replay: ReplayEngine, tmp_path: Any) -> Iterator[tuple[str, Recorded]]:
    """The recorded sidecar proxy alone on the direct protocol's lanes, private (key API_KEY)."""
    SecretDir(tmp_path / "keys").write({"api-key": API_KEY + "\n"})
    env = {"MODELSERVE_UPSTREAM_URL": replay.url, "MODELSERVE_SERVED_MODEL": "tiny"}
    settings = Settings.from_env({**env, "MODELSERVE_KEYS_DIR": str(tmp_path / "keys")})
    keys = KeyStore(settings.keys_dir)
    proxy = Recorded(settings, keys, SidecarMetrics())
    (port,) = free_ports(1)
    direct = {(b"POST", b"/v1/chat/completions"): proxy}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the pool opens on the server's loop
            await receive()
            proxy.pool = open_pool(4, 10)
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await proxy.pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await proxy(scope, receive, send)

    def ready(url: str) -> bool:
        return proxy.pool is not None and _listening(url)

    with serving(app, port, direct, proxy.ledger, ready, "the recorded proxy") as url:
        yield url, proxy


def _listening(url: str) -> bool:
    try:
        httpx.get(url + "/nothing", timeout=1)
        return True
    except httpx.TransportError:
        return False


def _steps_of(proxy: Recorded, send: Any) -> list[str]:
    """The steps one request ran, once it ended (bounded wait: its task's last line may run after
    the client read the answer)."""
    proxy.ran.clear()
    begun = proxy.ledger.begun
    send()
    wait_until(lambda: proxy.ledger.ended == begun + 1, 10, "the request to end")
    return list(proxy.ran)


def test_the_express_and_task_lanes_run_the_same_steps_in_the_same_order(served: tuple[str, Recorded]) -> None:
    url, proxy = served
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def whole() -> None:  # its body within the read buffer: the express lane
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200

    def chunked() -> None:  # a body of unknown length: the task lane
        body = httpx.Request("POST", "/", json=CHAT).read()
        answer = httpx.post(url + "/v1/chat/completions", content=iter([body]), headers=headers)
        assert answer.status_code == 200

    express, task = _steps_of(proxy, whole), _steps_of(proxy, chunked)
    assert express == task == ["admit", "plan", "ready", "pick", "passes_on", "settle", "release", "end"]


def test_a_refused_key_runs_admit_and_end_only(served: tuple[str, Recorded]) -> None:
    url, proxy = served

    def refused() -> None:
        answer = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"})
        assert answer.status_code == 401

    assert _steps_of(proxy, refused) == ["admit", "end"]


def test_the_ledger_sees_each_rule_broken_and_the_metrics_show_it() -> None:
    metrics = SidecarMetrics()
    settings = Settings.from_env({"MODELSERVE_UPSTREAM_URL": "http://127.0.0.1:1/", "MODELSERVE_SERVED_MODEL": "t"})
    proxy = Proxy(settings, None, metrics)
    exchange = proxy._begin("/v1/chat/completions")
    plan = proxy._plan(exchange, "POST", "/v1/chat/completions", [], b'{"model": "t"}')
    assert isinstance(plan, Plan)
    proxy._pick(plan, 0)
    proxy._pick(plan, 1)  # a second pick without releasing the first
    proxy.settled(exchange, None, None)
    proxy.settled(exchange, None, None)
    proxy.finish(exchange)
    proxy._end(exchange)
    assert proxy.ledger.broken == {PICKED_WHILE_HELD: 1, SETTLED_TWICE: 1, ENDED_TWICE: 1}
    assert ledger_counts(proxy.ledger) == (0, 0, {PICKED_WHILE_HELD: 1, SETTLED_TWICE: 1, ENDED_TWICE: 1})
    assert counts_in(metrics.render(None).decode(), "modelserve_sidecar") == ledger_counts(proxy.ledger)

    never_ended = proxy._begin("/v1/models")
    assert counts_in(metrics.render(None).decode(), "modelserve_sidecar")[:2] == (1, 0)
    proxy._end(never_ended)
    assert isinstance(never_ended, Exchange)
