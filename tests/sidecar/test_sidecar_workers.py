"""A sidecar with several workers (MODELSERVE_WORKERS, http/workers.py), a real process tree in front
of the replay engine: the kernel spreads connections over the workers, any worker answers /metrics and
/load for all of them, a key's limits and the engine's slots are the pod's whichever worker a request
reaches, a worker that dies is started again and what it held is given back, and SIGTERM drains every
worker's streams. Asserted on the workers' own series, read on their
unix sockets, and on the pod's."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.sidecar import API_KEY, ReplayEngine, SecretDir, Sidecar, launch_sidecar, metric_value, stop_sidecar
from harness.sidecar import wait_ready as wait_sidecar_ready
from modelserve.contracts.key_entries import hash_key
from modelserve.http.workers import sibling_address
from modelserve_sandbox.processes import wait_until

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
CHATS = 'modelserve_sidecar_requests_total{route="/v1/chat/completions",status_class="2xx"}'
IN_FLIGHT = 'modelserve_sidecar_key_in_flight_requests{key="shared",model="tiny"}'
WAITING = 'modelserve_sidecar_key_waiting_requests{key="api-key",model="tiny"}'
STALL = {"x-replay-stall": "6.0"}  # long enough to see it held, and to be refused, on a busy machine
REQUESTS = 24


@pytest.fixture
def workers(replay: ReplayEngine, tmp_path: Path) -> Iterator[Sidecar]:
    """Two workers; the key API_KEY, and `shared` limited to 2 requests in flight in the pod; the
    engine given 3 requests at once."""
    SecretDir(tmp_path / "keys").write(
        {"api-key": API_KEY + "\n", "shared": json.dumps({"keys": [hash_key("key-shared")], "maxInFlight": 2})}
    )
    env = {
        "MODELSERVE_KEYS_DIR": str(tmp_path / "keys"),
        "MODELSERVE_WORKERS": "2",
        "MODELSERVE_ENGINE_CONCURRENCY": "3",
    }
    sidecar = launch_sidecar(tmp_path / "logs", replay.url, "tiny", env)
    try:
        wait_sidecar_ready(sidecar)
        yield sidecar
    finally:
        stop_sidecar(sidecar)


def worker_client(sidecar: Sidecar, index: int) -> httpx.Client:
    """A client of one worker alone, on its unix socket."""
    transport = httpx.HTTPTransport(uds=sibling_address(sidecar.process.pid, index))
    return httpx.Client(transport=transport, base_url="http://worker", timeout=30)


def own_count(sidecar: Sidecar, index: int, sample: str) -> float:
    with worker_client(sidecar, index) as client:
        return metric_value(client.get("/metrics").text, sample)


def fresh(sidecar: Sidecar, index: int) -> bool:
    """Worker `index` answers on its socket, having served nothing yet (it may not listen yet)."""
    try:
        return own_count(sidecar, index, CHATS) == 0
    except httpx.TransportError:
        return False


def worker_pids(sidecar: Sidecar) -> list[int]:
    pid = sidecar.process.pid
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def pod_in_flight(sidecar: Sidecar) -> int:
    return httpx.get(sidecar.url + "/load", timeout=10).json()["inFlight"]


def chat(url: str, key: str = API_KEY, **headers: str) -> httpx.Response:
    return httpx.post(url, json=CHAT, headers={"authorization": f"Bearer {key}", **headers}, timeout=60)


def test_the_workers_share_the_port_and_worker_0_answers_for_the_pod(workers: Sidecar) -> None:
    # Each request on a connection of its own: the kernel picks a worker per connection.
    for _ in range(REQUESTS):
        assert chat(workers.url + "/v1/chat/completions").status_code == 200
    own = [own_count(workers, index, CHATS) for index in range(2)]
    assert sum(own) == REQUESTS
    assert min(own) > 0, f"every request reached one worker: {own}"  # chance 2 ** -23 if spread evenly
    for _ in range(4):  # whichever worker a scrape reaches, the pod's counts
        assert metric_value(workers.metrics(), CHATS) == REQUESTS
        assert httpx.get(workers.url + "/load", timeout=10).json()["arrivals"] == REQUESTS


def test_a_key_limit_and_the_engines_slots_are_the_pods_whichever_worker_a_request_reaches(
    workers: Sidecar,
) -> None:
    """`shared` may have 2 requests in flight in the pod: both may be at worker 0 (split limits gave
    each worker 1), and then worker 1 refuses a third. The engine takes 3 at once: with those 2 and
    one more at worker 0, worker 1's request waits for a slot, and takes one once a request ends."""
    shared = {"authorization": "Key key-shared"}
    with worker_client(workers, 0) as first, worker_client(workers, 1) as second, ThreadPoolExecutor(4) as pool:
        held = [
            pool.submit(first.post, "/v1/chat/completions", json=CHAT, headers={**shared, **STALL}) for _ in range(2)
        ]
        wait_until(lambda: own_count(workers, 0, IN_FLIGHT) == 2, 20, "two requests of `shared` in flight at worker 0")
        refused = second.post("/v1/chat/completions", json=CHAT, headers=shared)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "in_flight"

        public = {"authorization": f"Bearer {API_KEY}"}
        third = pool.submit(first.post, "/v1/chat/completions", json=CHAT, headers={**public, **STALL})
        wait_until(lambda: pod_in_flight(workers) == 3, 20, "3 requests in flight")
        waiting = pool.submit(second.post, "/v1/chat/completions", json=CHAT, headers=public)
        wait_until(lambda: own_count(workers, 1, WAITING) == 1, 20, "worker 1's request waiting for a slot")
        assert not waiting.done()
        assert [answer.result().status_code for answer in [*held, third]] == [200, 200, 200]
        assert waiting.result().status_code == 200
        assert own_count(workers, 1, WAITING) == 0


def test_a_dead_worker_is_started_again_and_sigterm_drains_every_worker(workers: Sidecar) -> None:
    """Worker 1 dies holding one of `shared`'s 2 requests: once started again, it holds none, so
    worker 0 takes 2."""
    before = worker_pids(workers)
    assert len(before) == 2
    shared = {"authorization": "Key key-shared"}
    with worker_client(workers, 1) as second, ThreadPoolExecutor(1) as pool:
        lost = pool.submit(second.post, "/v1/chat/completions", json=CHAT, headers={**shared, **STALL})
        wait_until(lambda: own_count(workers, 1, IN_FLIGHT) == 1, 20, "a request of `shared` at worker 1")
        os.kill(before[1], signal.SIGKILL)
        with pytest.raises(httpx.TransportError):
            lost.result()
    wait_until(lambda: len(pids := worker_pids(workers)) == 2 and before[1] not in pids, 20, "a new worker")
    wait_until(lambda: fresh(workers, 1), 20, "the new worker to answer on its socket")
    with worker_client(workers, 0) as first, ThreadPoolExecutor(2) as pool:
        held = [
            pool.submit(first.post, "/v1/chat/completions", json=CHAT, headers={**shared, **STALL}) for _ in range(2)
        ]
        assert [answer.result().status_code for answer in held] == [200, 200]
    for _ in range(6):
        assert chat(workers.url + "/v1/chat/completions").status_code == 200

    # The engine's preStop (the kubelet's GET /drained as the pod is deleted) reaches worker 0 while both
    # requests are on worker 1: it is answered once they have ended, not before and not a budget later.
    ended: list[float] = []
    with worker_client(workers, 1) as second, worker_client(workers, 0) as first, ThreadPoolExecutor(3) as pool:

        def stream() -> httpx.Response:
            answer = second.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {API_KEY}", **STALL}
            )
            ended.append(time.monotonic())
            return answer

        streams = [pool.submit(stream) for _ in range(2)]
        serving = "modelserve_sidecar_in_flight_requests"
        wait_until(lambda: own_count(workers, 1, serving) == 2, 20, "2 in flight at worker 1")
        drained = pool.submit(first.get, "/drained", timeout=60)
        waiting = "modelserve_sidecar_drain_waiting_requests"
        wait_until(lambda: own_count(workers, 0, waiting) == 1, 20, "the preStop's request waiting at worker 0")
        assert not drained.done()  # no stop yet: the pod is not being deleted
        workers.process.send_signal(signal.SIGTERM)
        assert [stream.result().status_code for stream in streams] == [200, 200]
        assert all(stream.result().json()["choices"] for stream in streams)
        answer = drained.result()
        answered = time.monotonic()
    assert answer.status_code == 200 and answer.json() == {"drained": True, "reason": "drained"}, answer.text
    assert answered >= max(ended)  # after the last request on the other worker ended
    assert workers.process.wait(timeout=30) == 0  # after every worker exited (it waits for them)
