"""Replicas follow real load: real sidecars in front of the real llama.cpp engine report their
requests in flight, the operator scales 1 -> 2 under load and back to 1 when it eases, and the
streams running through the scale-down all finish. The second replica, on the node the first fetched
the model to, reads no byte of it from the hub, and each start's phases reach the status, an Event
and the operator's metrics."""

from __future__ import annotations

import json
import threading
import time

import httpx

from modelserve.operator.starts import fetch_result
from modelserve_sandbox.cluster import SMOLLM2_FILE, SMOLLM2_REPO
from tests.helpers.node_view import (
    GREEDY,
    NO_END,
    PROMPT,
    NodeView,
    Timeline,
    cpu_server,
    hub_file_bytes,
    hub_model_size,
    start_phases_seen,
)

# One request in flight per replica: three concurrent streams want three, capped at max 2.
REPLICAS = {
    "min": 1,
    "buffer": 0,
    "max": 2,
    "targetPerReplica": 1,
    "scaleDownDelaySeconds": 20,
    "idleWindowSeconds": 30,
}
STREAMS = 3
LOAD_SECONDS_AT_MOST = 240


class Load:
    """`streams` clients each streaming one completion after another until told to ease off."""

    def __init__(self, base: str, streams: int, timeline: Timeline) -> None:
        self.base = base
        self.timeline = timeline
        self.streams = streams
        self.finished = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(streams)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def ease_to(self, streams: int) -> None:
        with self._lock:
            self.streams = streams

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=180)

    def _client(self, index: int) -> None:
        request = {
            "model": "elastic",
            "messages": PROMPT,
            "max_tokens": 48,
            "stream": True,
            "logit_bias": NO_END,
            **GREEDY,
        }
        deadline = time.monotonic() + LOAD_SECONDS_AT_MOST
        while time.monotonic() < deadline:
            with self._lock:
                if index >= self.streams:
                    return
            try:
                with httpx.stream("POST", f"{self.base}/v1/chat/completions", json=request, timeout=180) as answer:
                    body = b"".join(answer.iter_raw())
                ok = answer.status_code == 200 and body.rstrip().endswith(b"data: [DONE]")
                detail = f"{answer.status_code} {body[-200:]!r}"
            except httpx.HTTPError as error:
                ok, detail = False, repr(error)
            with self._lock:
                if ok:
                    self.finished += 1
                else:
                    self.failures.append(detail)
                    self.timeline.add(f"stream {index} failed: {detail}")


def _state(node: NodeView) -> str:
    deployment = node.get("deployment", "elastic") or {}
    ready = node.ready_pods("elastic")
    in_flight = []
    for pod in ready:
        try:
            in_flight.append(httpx.get(f"http://{pod['status']['podIP']}:8080/load", timeout=5).json()["inFlight"])
        except httpx.HTTPError:
            in_flight.append("?")
    return f"replicas {deployment.get('spec', {}).get('replicas')}, ready {len(ready)}, in flight {in_flight}"


def test_replicas_follow_real_load_up_and_back_down(node: NodeView, operator_metrics_port: int) -> None:
    hub_before = hub_file_bytes(node.cluster)
    node.apply(cpu_server("elastic", public=True, replicas=REPLICAS))
    node.wait_phase("elastic", "Ready")
    base = f"http://{node.cluster_ip('elastic')}"
    timeline = Timeline()
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(1.0):
            timeline.add(_state(node))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = Load(base, STREAMS, timeline)
    try:
        timeline.add(f"load: {STREAMS} streams")
        load.start()
        node.wait(lambda: len(node.ready_pods("elastic")) == 2, f"two ready replicas under load\n{timeline}", 200)
        timeline.add("two replicas ready")
        # The node's model cache: the model crossed from the hub once at most (not at all when an
        # earlier test left it on the node), and the second replica read every byte from the node.
        first, second = sorted(node.ready_pods("elastic"), key=lambda pod: pod["metadata"]["creationTimestamp"])
        size = hub_model_size(node.cluster, SMOLLM2_REPO, SMOLLM2_FILE)
        fetched = {pod["metadata"]["name"]: fetch_result(pod) for pod in (first, second)}
        assert all(fetched.values()), fetched
        assert fetched[second["metadata"]["name"]].hub_bytes == 0, fetched
        assert fetched[second["metadata"]["name"]].node_bytes == size, fetched
        assert hub_file_bytes(node.cluster) - hub_before <= size, fetched
        # One stream goes on through the scale-down: it must not be cut.
        load.ease_to(1)
        timeline.add("load: 1 stream")
        node.wait(
            lambda: (node.get("deployment", "elastic") or {})["spec"]["replicas"] == 1,
            f"back to one replica\n{timeline}",
            120,
        )
        timeline.add("scaled down to 1")
        node.wait(lambda: len(node.pods("elastic")) == 1, f"the second pod gone\n{timeline}", 240)
        timeline.add("second pod gone")
        load.ease_to(0)
        load.join()
    finally:
        load.ease_to(0)
        sampling.set()
        sampler.join(timeout=10)
    print(f"\nautoscaling on the real node:\n{timeline}")
    assert load.failures == [], f"{load.failures}\n{timeline}"
    assert load.finished >= STREAMS
    reasons = [e["reason"] for e in node.events("elastic")]
    assert "ScaleUp" in reasons and "ScaleDown" in reasons, reasons
    status = (node.get("modelserver", "elastic") or {})["status"]
    assert status["scaling"]["reason"] == "ScaleDown" and status["desiredReplicas"] == 1, json.dumps(status)
    # Each start's phases: an Event for each replica, the status' last one, the operator's histograms.
    started = [e["message"] for e in node.events("elastic") if e["reason"] == "Started"]
    assert len(started) >= 2 and all("weights" in m and "from the node" in m for m in started), started
    assert set(status["lastStart"]["phases"]) == {"schedule", "image", "weights", "engine"}, status["lastStart"]
    # The operator's own metrics say the same.
    exported = httpx.get(f"http://127.0.0.1:{operator_metrics_port}/metrics", timeout=10).text
    seen = start_phases_seen(exported, "llamacpp")
    assert all(seen.get(phase, 0) >= 2 for phase in ("schedule", "image", "weights", "engine", "total")), seen
    labels = f'modelserver="elastic",namespace="{node.namespace}"'
    ours = [line for line in exported.splitlines() if line.startswith("modelserve_operator_")]
    assert f"modelserve_operator_desired_replicas{{{labels}}} 1.0" in ours, ours
    for reason in ("ScaleUp", "ScaleDown"):
        assert any(
            line.startswith(f'modelserve_operator_scale_decisions_total{{reason="{reason}"}}') for line in ours
        ), ours
