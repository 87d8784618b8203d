"""The gateway with two workers (MODELSERVE_GATEWAY_WORKERS, http/workers.py), a real process tree in
front of a real sidecar: connections spread over the workers, /metrics and /held answer for the
pod (what the operator reads) whichever worker a request reaches, and the bound on requests held per
model is the pod's; the endpoint picker is the first worker's alone. Asserted on each worker's own
series, read on its unix socket, and on the pod's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.picker_client import Stream, body_pieces, picked, request_headers
from harness.picker_client import chat as chat_body
from harness.sidecar import Sidecar, free_ports, launch_sidecar, metric_value, start_replay, stop_sidecar, wait_ready
from modelserve.http.workers import sibling_address
from modelserve_sandbox.processes import start_process, stop_process, tail, wait_until

SERVE = Path(__file__).resolve().parents[1] / "fixtures" / "gateway_workers" / "serve.py"
CHATS = 'modelserve_gateway_requests_total{model="tiny",namespace="a",status_class="2xx"}'
REQUESTS = 24
HELD = 4
PICKED = 'modelserve_gateway_picker_streams_total{outcome="picked"}'


@dataclass
class Gateway:
    url: str
    pid: int
    picker: str  # host:port of the endpoint picker
    replica: str  # the sidecar's host:port


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp("gateway-workers")
    replay = start_replay()
    sidecar: Sidecar | None = None
    try:
        sidecar = launch_sidecar(base / "logs", replay.url, "tiny", {"MODELSERVE_AUTH": "public"})
        wait_ready(sidecar)
        port, picker = free_ports(2)
        env = {
            "MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1",
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
            "MODELSERVE_GATEWAY_PICKER_PORT": str(picker),
            "MODELSERVE_GATEWAY_WORKERS": "2",
            "MODELSERVE_GATEWAY_HOLD_SECONDS": "10",
            "MODELSERVE_GATEWAY_MAX_HELD": str(HELD),
        }
        argv = [sys.executable, str(SERVE), sidecar.url.removeprefix("http://")]
        process = start_process("gateway", argv, base / "logs", env)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert process.poll() is None, tail(base / "logs" / "gateway.log")
            try:
                return httpx.get(url + "/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_until(ready, 30, "the gateway's workers")
            yield Gateway(url, process.pid, f"127.0.0.1:{picker}", sidecar.url.removeprefix("http://"))
        finally:
            stop_process(process)
            assert process.returncode == 0, tail(base / "logs" / "gateway.log")
    finally:
        if sidecar is not None:
            stop_sidecar(sidecar)
        replay.stop()


def worker_client(gateway: Gateway, index: int) -> httpx.Client:
    """A client of one worker alone, on its unix socket."""
    transport = httpx.HTTPTransport(uds=sibling_address(gateway.pid, index))
    return httpx.Client(transport=transport, base_url="http://worker", timeout=60)


def own_metrics(gateway: Gateway, index: int) -> str:
    with worker_client(gateway, index) as client:
        return client.get("/metrics").text


def chat(gateway: Gateway, model: str, client: httpx.Client | None = None) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if client is not None:
        return client.post("/v1/chat/completions", json=body)
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60)


def held(gateway: Gateway) -> int:
    entries = httpx.get(gateway.url + "/held", timeout=10).json()["held"]
    return sum(e["requests"] for e in entries if e["name"] == "sleepy")


def test_requests_spread_over_the_workers_and_the_pod_counts_them_all(gateway: Gateway) -> None:
    for _ in range(REQUESTS):  # a connection each: the kernel picks a worker per connection
        assert chat(gateway, "tiny").status_code == 200
    own = [metric_value(own_metrics(gateway, index), CHATS) for index in range(2)]
    assert sum(own) == REQUESTS
    assert min(own) > 0, f"every request reached one worker: {own}"  # chance 2 ** -23 if spread evenly
    for _ in range(4):  # whichever worker a scrape reaches
        assert metric_value(httpx.get(gateway.url + "/metrics", timeout=10).text, CHATS) == REQUESTS


def test_held_requests_and_their_bound_are_the_pods_whichever_worker_holds_them(gateway: Gateway) -> None:
    """The pod holds HELD requests for `sleepy` (MODELSERVE_GATEWAY_MAX_HELD): all of them at worker 0
    (split bounds gave each worker half), and then worker 1 turns the next one away."""
    with worker_client(gateway, 0) as first, worker_client(gateway, 1) as second, ThreadPoolExecutor(HELD) as pool:
        waiting = [pool.submit(chat, gateway, "sleepy", first) for _ in range(HELD)]
        wait_until(lambda: held(gateway) == HELD, 8, f"{HELD} requests held in the pod")
        full = chat(gateway, "sleepy", second)
        assert full.status_code == 429 and full.headers["retry-after"]
        assert all(w.result().status_code == 503 for w in waiting)  # the hold ran out: no replica came
    assert held(gateway) == 0


def test_the_first_worker_alone_serves_the_picker_and_its_holds_are_the_pods(gateway: Gateway) -> None:
    """Every pick is counted at worker 0 (so its in-flight counts see them all); a stream it holds is
    the pod's demand on /held whichever worker answers."""
    for _ in range(4):
        stream = Stream(gateway.picker)
        try:
            assert picked(stream.request(chat_body("tiny"))) == gateway.replica
            stream.body_back()
            stream.respond()
        finally:
            stream.close()
    assert [metric_value(own_metrics(gateway, index), PICKED) for index in range(2)] == [4, 0]
    assert metric_value(httpx.get(gateway.url + "/metrics", timeout=10).text, PICKED) == 4
    waiting = Stream(gateway.picker)
    try:
        waiting.send(request_headers(), *body_pieces(chat_body("sleepy")))
        wait_until(lambda: held(gateway) == 1, 8, "the picker's stream held in the pod")
    finally:
        waiting.cancel()
    wait_until(lambda: held(gateway) == 0, 8, "the gone stream unheld")
