"""vLLM's real load drives the autoscaler: concurrent streams on the example's one replica make the
operator add a second (the real node advertises two `nvidia.com/gpu`), and the gateway sends new
requests to the replica with the fewest in flight; a flag vLLM refuses shows as a CrashLoop carrying
vLLM's own words. The second replica reads its weights from the node's cache, none from the hub, and
vLLM loads them offline from the layout the fetch wrote. Runs after test_vllm_on_node.py has freed
the GPUs. On the sandbox's tiny random-weight model: here vLLM's start and speed on two shared cores
matter, its answers do not."""

from __future__ import annotations

import threading
import time

import httpx

from harness.pod_states import restart_counts
from modelserve.operator.starts import fetch_result
from modelserve_sandbox import realnode, tiny_model
from modelserve_sandbox.processes import wait_until
from tests.helpers.gateway_routing import gateway_replicas, routed_beside_long_streams
from tests.helpers.node_view import (
    QUESTION,
    VLLM_READY_SECONDS,
    NodeView,
    Timeline,
    hub_file_bytes,
    hub_model_size,
    tiny_vllm,
)

# One request in flight per replica: three concurrent streams want three, capped at max 2.
REPLICAS = {"min": 1, "buffer": 0, "max": 2, "targetPerReplica": 1, "scaleDownDelaySeconds": 600}
STREAMS = 3
# The long stream that holds one replica while quick requests go to the other. On two shared cores
# a quick request took 0.04-4.3 s (4 s while the other replica streamed: the CPU is the streams') and
# 480 tokens 1.0-2.6 s, so in the full suite a 480-token stream (the example's maxModelLen was 512)
# ended during the first quick request in nine rounds of twelve. The tiny model has 2048 positions:
# this test's ModelServer allows them, and the rounds may be more.
LONG_TOKENS = 1900
ROUNDS = 24


def test_concurrent_streams_scale_vllm_from_one_replica_to_two(node: NodeView, host_gateway: str) -> None:
    name = "tiny-elastic"
    hub_before = hub_file_bytes(node.cluster)
    node.apply(tiny_vllm(name, replicas=REPLICAS, auth={"mode": "public"}, maxModelLen=LONG_TOKENS + 100))
    node.wait_phase(name, "Ready", VLLM_READY_SECONDS)
    base = f"http://{node.cluster_ip(name)}"
    timeline = Timeline()
    stop = threading.Event()
    failures: list[str] = []
    finished = [0]
    request = {"model": name, "messages": QUESTION, "max_tokens": 300, "stream": True, "ignore_eos": True}

    def client(index: int) -> None:
        deadline = time.monotonic() + VLLM_READY_SECONDS
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                with httpx.stream("POST", f"{base}/v1/chat/completions", json=request, timeout=300) as answer:
                    body = b"".join(answer.iter_raw())
                if answer.status_code == 200 and body.rstrip().endswith(b"data: [DONE]"):
                    finished[0] += 1
                else:
                    failures.append(f"stream {index}: {answer.status_code} {body[-200:]!r}")
            except httpx.HTTPError as error:
                failures.append(f"stream {index}: {error!r}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    try:
        node.wait(
            lambda: (node.get("deployment", name) or {}).get("spec", {}).get("replicas") == 2,
            "the operator scales to 2 under vLLM's load",
            240,
        )
        timeline.add("deployment replicas 2")
        node.wait(lambda: len(node.ready_pods(name)) == 2, "two vLLM replicas Ready", VLLM_READY_SECONDS)
        timeline.add("two replicas ready")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=320)
    print(f"\nvLLM autoscaling:\n{timeline}")
    assert failures == [], failures
    first, second = sorted(node.ready_pods(name), key=lambda pod: pod["metadata"]["creationTimestamp"])
    fetched = [fetch_result(pod) for pod in (first, second)]
    assert fetched[0] and fetched[1], fetched
    # Its weights from the node's cache: the tiny model crossed from the hub once at most.
    assert (fetched[1].hub_bytes, fetched[1].source) == (0, "node"), fetched
    assert hub_file_bytes(node.cluster) - hub_before <= hub_model_size(node.cluster, tiny_model.REPO), fetched
    assert finished[0] >= 1
    assert "ScaleUp" in [e["reason"] for e in node.events(name)]
    assert {pod["spec"]["nodeName"] for pod in node.ready_pods(name)} == {realnode.NODE_NAME}

    # The same two real replicas behind the gateway: while a long stream holds one, the next
    # requests go to the other (least in flight), as the gateway tests show with llama.cpp.
    wait_until(lambda: gateway_replicas(host_gateway, name) == 2, 60, "the gateway routes to both replicas")
    long_stream = {"model": name, "messages": QUESTION, "max_tokens": LONG_TOKENS, "stream": True, "ignore_eos": True}
    quick = {"model": name, "messages": QUESTION, "max_tokens": 1}
    held, rounds = routed_beside_long_streams(host_gateway, long_stream, quick, rounds=ROUNDS)
    restarts = {pod["metadata"]["name"]: restart_counts(pod) for pod in node.pods(name)}
    report = f"rounds: {rounds}; container restarts: {restarts}"
    print(report)
    assert len(held) >= 4, f"too few quick requests routed by the policy beside a long stream: {report}"
    assert all(long_pod != quick_pod for long_pod, quick_pod in held), f"{held}; {report}"


def test_a_flag_vllm_refuses_shows_as_crash_loop_in_vllms_words(node: NodeView) -> None:
    name = "tiny-refused"
    node.apply(tiny_vllm(name, engineArgs=["--no-such-flag"]))
    # vLLM runs ~20 s before it reads its arguments, so the pod is in CrashLoopBackOff only between
    # restarts: keep the condition as first seen.
    seen: dict = {}

    def crash_loop() -> bool:
        condition = node.condition(name, "Degraded")
        if not seen and (condition.get("status"), condition.get("reason")) == ("True", "CrashLoop"):
            seen.update(condition)
        return bool(seen)

    node.wait(crash_loop, f"ModelServer {name} Degraded=True (CrashLoop)", VLLM_READY_SECONDS)
    condition = seen
    assert "engine" in condition["message"], condition
    assert "unrecognized arguments: --no-such-flag" in condition["message"], condition
