"""A sidecar with several workers (MODELSERVE_WORKERS, http/workers.py), a real process tree in front
of the replay engine: the kernel spreads connections over the workers, worker 0 answers /metrics and
/load for all of them, each worker takes its share of a key's limits, a worker that dies is started
again, and SIGTERM drains every worker's streams. Asserted on the workers' own series, read on their
unix sockets, and on the pod's."""

from __future__ import annotations

import json
import os
import signal
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
REQUESTS = 24


@pytest.fixture
def workers(replay: ReplayEngine, tmp_path: Path) -> Iterator[Sidecar]:
    """Two workers; the key API_KEY, and `shared` limited to 2 requests in flight in the pod."""
    SecretDir(tmp_path / "keys").write(
        {"api-key": API_KEY + "\n", "shared": json.dumps({"keys": [hash_key("key-shared")], "maxInFlight": 2})}
    )
    env = {"MODELSERVE_KEYS_DIR": str(tmp_path / "keys"), "MODELSERVE_WORKERS": "2"}
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


def worker_pids(sidecar: Sidecar) -> list[int]:
    pid = sidecar.process.pid
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


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


def test_each_worker_takes_its_share_of_a_key_limit(workers: Sidecar) -> None:
    """`shared` may have 2 requests in flight in the pod: 1 at each worker, as 2 replicas would."""
    slow = {"x-replay-stall": "6.0"}  # long enough to see it held, and to be refused, on a busy machine
    with worker_client(workers, 0) as first, worker_client(workers, 1) as second, ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            first.post, "/v1/chat/completions", json=CHAT, headers={"authorization": "Key key-shared", **slow}
        )
        wait_until(lambda: own_count(workers, 0, IN_FLIGHT) == 1, 20, "one request of `shared` in flight at worker 0")
        assert (
            first.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Key key-shared"}).status_code
            == 429
        )
        assert (
            second.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Key key-shared"}).status_code
            == 200
        )
        assert held.result().status_code == 200


def test_a_dead_worker_is_started_again_and_sigterm_drains_every_worker(workers: Sidecar) -> None:
    before = worker_pids(workers)
    assert len(before) == 2
    os.kill(before[1], signal.SIGKILL)
    wait_until(lambda: len(pids := worker_pids(workers)) == 2 and before[1] not in pids, 20, "a new worker")
    wait_until(lambda: own_count(workers, 1, CHATS) == 0, 20, "the new worker to answer on its socket")
    for _ in range(6):
        assert chat(workers.url + "/v1/chat/completions").status_code == 200

    with ThreadPoolExecutor(2) as pool:
        streams = [
            pool.submit(chat, workers.url + "/v1/chat/completions", **{"x-replay-stall": "5.0"}) for _ in range(2)
        ]
        wait_until(lambda: httpx.get(workers.url + "/load", timeout=10).json()["inFlight"] == 2, 20, "2 in flight")
        workers.process.send_signal(signal.SIGTERM)
        assert [stream.result().status_code for stream in streams] == [200, 200]
        assert all(stream.result().json()["choices"] for stream in streams)
    assert workers.process.wait(timeout=30) == 0  # after every worker exited (it waits for them)
