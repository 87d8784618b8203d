"""vLLM's real load drives the autoscaler: concurrent streams on the example's one replica make the
operator add a second (the real node advertises two `nvidia.com/gpu`), and the gateway sends new
requests to the replica with the fewest in flight; a flag vLLM refuses shows as a CrashLoop carrying
vLLM's own words. Runs after test_vllm_on_node.py has freed the GPUs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from modelserve_sandbox import realnode
from modelserve_sandbox.processes import wait_until
from tests.helpers.node_view import QUESTION, VLLM_READY_SECONDS, NodeView, Timeline, vllm_example

# One request in flight per replica: three concurrent streams want three, capped at max 2.
REPLICAS = {"min": 1, "buffer": 0, "max": 2, "targetPerReplica": 1, "scaleDownDelaySeconds": 600}
STREAMS = 3


def test_concurrent_streams_scale_vllm_from_one_replica_to_two(node: NodeView, host_gateway: str) -> None:
    name = "tiny-elastic"
    node.apply(vllm_example(name, replicas=REPLICAS, auth={"mode": "public"}))
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
    assert finished[0] >= 1
    assert "ScaleUp" in [e["reason"] for e in node.events(name)]
    assert {pod["spec"]["nodeName"] for pod in node.ready_pods(name)} == {realnode.NODE_NAME}

    # The same two real replicas behind the gateway: while a long stream holds one, the next
    # requests go to the other (least in flight), as the gateway tests show with llama.cpp.
    wait_until(lambda: gateway_replicas(host_gateway, name) == 2, 60, "the gateway routes to both replicas")
    rounds: list[Round] = []
    held: list[tuple[str, str]] = []
    for _ in range(HOLD_ROUNDS):
        this_round = route_beside_a_long_stream(host_gateway, name)
        rounds.append(this_round)
        # A quick request shows the routing choice only when the long stream was in flight at the
        # gateway all the while (the gateway's own count says so, not the client's clock: a starved
        # client reads chunks late) and the policy alone placed it (no failover after an error).
        held += [
            (this_round.long_pod, quick.pod)
            for quick in this_round.quick
            if quick.beside_long and quick.decisions == {"least_in_flight": 1}
        ]
        if len(held) >= 4:
            break
    restarts = {pod["metadata"]["name"]: restart_count(pod) for pod in node.pods(name)}
    report = f"rounds: {rounds}; container restarts: {restarts}"
    print(report)
    assert len(held) >= 4, f"too few quick requests routed by the policy beside a long stream: {report}"
    assert all(long_pod != quick_pod for long_pod, quick_pod in held), f"{held}; {report}"


# Long streams at most, until four quick requests were routed beside one: on two shared cores a
# quick request takes about as long as a fifth of the long stream, so a round gives one to three.
HOLD_ROUNDS = 12
QUICK_PER_ROUND = 4


@dataclass
class Quick:
    pod: str  # the replica that answered (the gateway's x-modelserve-replica header)
    beside_long: bool  # the gateway held the long stream from before this request until after it
    decisions: dict[str, float]  # the gateway's routing decisions while it ran, by kind
    errors: dict[str, float]  # the gateway's upstream errors while it ran, by kind


@dataclass
class Round:
    long_pod: str
    quick: list[Quick] = field(default_factory=list)


def route_beside_a_long_stream(gateway: str, name: str) -> Round:
    """One long stream (it holds one replica) and quick requests sent one after another while it runs."""
    long_stream = {"model": name, "messages": QUESTION, "max_tokens": 480, "stream": True, "ignore_eos": True}
    seen: dict[str, Any] = {}
    first_chunk, ended = threading.Event(), threading.Event()

    def hold() -> None:
        with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=long_stream, timeout=300) as answer:
            seen["pod"] = answer.headers["x-modelserve-replica"]
            for _ in answer.iter_raw():
                first_chunk.set()
        ended.set()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    quick: list[Quick] = []
    try:
        assert first_chunk.wait(120), "the long stream never started"
        for _ in range(QUICK_PER_ROUND):
            if ended.is_set():
                break
            before = gateway_counters(gateway, name)
            answer = httpx.post(
                f"{gateway}/v1/chat/completions",
                json={"model": name, "messages": QUESTION, "max_tokens": 1},
                timeout=120,
            )
            assert answer.status_code == 200, answer.text
            # The gateway counts a request once it has ended there (in the step that sends its last
            # bytes): one more ended and one still in flight mean the long stream outlasted this one.
            after = counted_after(gateway, name, finished(before))
            quick.append(
                Quick(
                    answer.headers["x-modelserve-replica"],
                    in_flight(before) == 1 and finished(after) == finished(before) + 1 and in_flight(after) == 1,
                    rises(before, after, "modelserve_gateway_routing_decisions_total", "decision"),
                    rises(before, after, "modelserve_gateway_upstream_errors_total", "kind"),
                )
            )
    finally:
        holder.join(timeout=300)
    return Round(seen["pod"], quick)


def gateway_counters(gateway: str, model: str) -> dict[str, float]:
    """The gateway's /metrics samples for `model`, by their whole series line."""
    samples = {}
    for line in httpx.get(f"{gateway}/metrics", timeout=10).text.splitlines():
        if not line.startswith("#") and f'model="{model}"' in line:
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    return samples


def rises(before: dict[str, float], after: dict[str, float], metric: str, label: str) -> dict[str, float]:
    """How much each `label` value of counter `metric` rose between two samples (pure)."""
    rises = {}
    for series, value in after.items():
        if series.startswith(metric + "{") and value > before.get(series, 0.0):
            rises[series.split(f'{label}="', 1)[1].split('"', 1)[0]] = value - before.get(series, 0.0)
    return rises


def counted_after(gateway: str, model: str, ended_before: float) -> dict[str, float]:
    """The gateway's samples once it counts more ended requests than `ended_before` (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        samples = gateway_counters(gateway, model)
        if finished(samples) > ended_before:
            return samples
        time.sleep(0.1)
    raise TimeoutError("the gateway never counted the quick request")


def finished(samples: dict[str, float]) -> float:
    """Requests the gateway has ended, of any status (pure)."""
    return sum(value for series, value in samples.items() if series.startswith("modelserve_gateway_requests_total{"))


def in_flight(samples: dict[str, float]) -> float:
    """Requests the gateway holds at replicas now (pure)."""
    return sum(
        value for series, value in samples.items() if series.startswith("modelserve_gateway_in_flight_requests{")
    )


def gateway_replicas(gateway: str, model: str) -> float:
    """The gateway's own count of the replicas it routes `model` to (its /metrics)."""
    for series, value in gateway_counters(gateway, model).items():
        if series.startswith("modelserve_gateway_ready_replicas{"):
            return value
    return 0.0


def restart_count(pod: dict[str, Any]) -> dict[str, int]:
    return {c["name"]: c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", [])}


def test_a_flag_vllm_refuses_shows_as_crash_loop_in_vllms_words(node: NodeView) -> None:
    name = "tiny-refused"
    node.apply(vllm_example(name, engineArgs=["--no-such-flag"]))
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
