"""A model rolled out under one name on the real node: two llama.cpp ModelServers serving SmolLM2 as
versions of `bot` (spec.traffic), the operator and the gateway as `make dev` runs them on the host.
The split is read from the gateway's own counters; weights change without restarting anything; a
version made slow (its default answer 192 times longer) trips its guard, its traffic stops, and its
status says why, with the figures, until its reset annotation changes."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from harness.pod_states import restart_counts
from harness.sidecar import metric_value
from modelserve.contracts.names import SIDECAR_NAME
from modelserve_sandbox.host_programs import HostPrograms
from tests.helpers.node_view import GREEDY, NO_END, NodeView, cpu_server

SPLIT_REQUESTS = 200
WINDOW = 20  # p95 of 20 is the 19th: one outlier of a busy machine does not trip it
RATIO = 6.0  # the guard's bound on bot-v2's p95 time to first byte against bot-v1's
# bot-v2's default answer: 192 times bot-v1's 2 tokens. SmolLM2 decodes 96 tokens in about the time
# a busy machine's noise adds to a 2-token answer's p95, so 96 left the ratio near the guard's 3x.
SLOW_TOKENS = 384


# One thread each: bot-v2's long answers then take one core, not both, so bot-v1's short ones are not
# slowed by them too. Sharing the two cores, bot-v1's p95 rose with bot-v2's and the ratio stayed under
# the guard's bound for 145 slow answers (a cold CI run timed out on it).
ONE_CORE = ["--threads", "1", "--threads-batch", "1"]


def version(name: str, weight: int, max_tokens: int, guard: dict | None = None, **spec: object) -> dict:
    traffic: dict = {"servedName": "bot", "weight": weight}
    if guard is not None:
        traffic["guard"] = guard
    return cpu_server(
        name, public=True, traffic=traffic, samplingDefaults={"maxTokens": max_tokens}, engineArgs=ONE_CORE, **spec
    )


def answered(gateway: str, namespace: str, name: str) -> float:
    text = httpx.get(f"http://{gateway}/metrics", timeout=10).text
    return metric_value(
        text, f'modelserve_gateway_requests_total{{model="{name}",namespace="{namespace}",status_class="2xx"}}'
    )


def mean_ttfb(gateway: str, namespace: str, name: str) -> float:
    """The gateway's mean time to first byte for one version (what a failure message shows)."""
    text = httpx.get(f"http://{gateway}/metrics", timeout=10).text
    labels = f'{{model="{name}",namespace="{namespace}"}}'
    total = metric_value(text, f"modelserve_gateway_time_to_first_byte_seconds_sum{labels}")
    return total / max(1.0, metric_value(text, f"modelserve_gateway_time_to_first_byte_seconds_count{labels}"))


def ask_all(gateway: str, conversations: range, **extra: object) -> list[int]:
    """Each conversation's first turn through the gateway (four at a time); their statuses."""

    def ask(i: int) -> int:
        body = {"model": "bot", "messages": [{"role": "user", "content": f"Say hello to guest {i}"}], **extra}
        return httpx.post(f"http://{gateway}/v1/chat/completions", json=body, timeout=120).status_code

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(ask, conversations))


def test_versions_share_a_name_by_weight_and_a_slow_one_is_rolled_back(sandbox: HostPrograms, view: NodeView) -> None:
    gateway, ns = sandbox.gateway_address, view.namespace
    view.apply(version("bot-v1", 90, 2))
    # 6x, not 3x: a busy machine's noise took bot-v2's 2-token p95 to 3.0x and 3.7x the stable one's
    # in the split (two CI runs, the guard tripped before the slow answers began); the slow answers
    # (384 tokens against 2) stand at 12x or more.
    guard = {"window": WINDOW, "maxErrorRate": 0.2, "maxTimeToFirstTokenRatio": RATIO}
    # bot-v2's sidecar runs two workers (spec.sidecar.workers): its kubelet probes, the operator's
    # /load and the gateway's requests reach either, read-only root and all.
    view.apply(version("bot-v2", 10, SLOW_TOKENS, guard, sidecar={"workers": 2}))
    for name in ("bot-v1", "bot-v2"):
        view.wait_phase(name, "Ready")
    (v2_pod,) = view.pods("bot-v2")
    # (`kubectl exec` takes the namespace before its command: view.kubectl would put it after.)
    pod = v2_pod["metadata"]["name"]
    children = ["exec", "-n", ns, pod, "-c", SIDECAR_NAME, "--", "cat", "/proc/1/task/1/children"]
    workers = view.cluster.kubectl(*children)
    assert len(workers.stdout.split()) == 2, workers.stdout
    pods = {p["metadata"]["name"]: restart_counts(p) for name in ("bot-v1", "bot-v2") for p in view.pods(name)}
    listed = httpx.get(f"http://{gateway}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in listed if m["owned_by"] == ns] == ["bot"]

    # 90/10, every answer the same length: the gateway's counters count the split.
    same = {"max_tokens": 2, **GREEDY}
    assert set(ask_all(gateway, range(SPLIT_REQUESTS), **same)) == {200}
    v2 = answered(gateway, ns, "bot-v2")
    assert answered(gateway, ns, "bot-v1") + v2 == SPLIT_REQUESTS
    assert 5 <= v2 <= 40, v2  # 20 expected; outside with probability below 1e-4

    # 0/100 within seconds, nothing restarted: every request on bot-v2.
    view.kubectl("patch", "ms", "bot-v1", "--type=merge", "-p", json.dumps({"spec": {"traffic": {"weight": 0}}}))
    view.kubectl("patch", "ms", "bot-v2", "--type=merge", "-p", json.dumps({"spec": {"traffic": {"weight": 100}}}))
    view.wait(lambda: _all_on(gateway, ns, "bot-v2", same), "the gateway taking 0/100", 60)
    before = answered(gateway, ns, "bot-v2")
    assert set(ask_all(gateway, range(1000, 1040), **same)) == {200}
    assert answered(gateway, ns, "bot-v2") - before == 40

    # 50/50, answers of each version's own default length: bot-v2's 384 tokens against bot-v1's 2.
    view.kubectl("patch", "ms", "bot-v1", "--type=merge", "-p", json.dumps({"spec": {"traffic": {"weight": 50}}}))
    view.kubectl("patch", "ms", "bot-v2", "--type=merge", "-p", json.dumps({"spec": {"traffic": {"weight": 50}}}))
    slow = {"logit_bias": NO_END, **GREEDY}
    # Small batches, the guards read after each: the guard trips on the first few slow answers (its
    # window's p95 is its 19th of 20), and each slow answer costs the node 384 tokens. In batches of 40
    # a cold CI run's busy node spent the test's whole 900 s on them.
    for batch in range(50):  # bounded: at most 400 requests, as before
        ask_all(gateway, range(2000 + 8 * batch, 2008 + 8 * batch), **slow)
        if httpx.get(f"http://{gateway}/guards", timeout=10).json()["guards"]:
            break
    guards = httpx.get(f"http://{gateway}/guards", timeout=10).json()["guards"]
    assert len(guards) == 1, (guards, mean_ttfb(gateway, ns, "bot-v1"), mean_ttfb(gateway, ns, "bot-v2"))
    (report,) = guards
    assert report["name"] == "bot-v2" and report["p95Seconds"] > RATIO * report["stableP95Seconds"], report
    # Tripped: no new request reaches bot-v2; the status says why, with the figures.
    before = answered(gateway, ns, "bot-v2")
    assert set(ask_all(gateway, range(3000, 3040), **slow)) == {200}
    assert answered(gateway, ns, "bot-v2") == before
    condition = view.wait_reason("bot-v2", "TrafficGuard", "False", "GuardTripped")
    assert "p95 time to first byte" in condition["message"] and "stable versions'" in condition["message"], condition
    view.wait(lambda: "GuardTripped" in [e["reason"] for e in view.events("bot-v2")], "the GuardTripped Event", 30)
    wide = view.kubectl("get", "ms", "bot-v2", "-o", "wide").stdout
    assert "GuardTripped" in wide and "bot" in wide, wide

    # A person resets it: bot-v2 takes requests again.
    view.kubectl("annotate", "ms", "bot-v2", "serving.modelserve.dev/guard-reset=first-reset", "--overwrite")
    view.wait_reason("bot-v2", "TrafficGuard", "True", "GuardHolding")
    before = answered(gateway, ns, "bot-v2")
    ask_all(gateway, range(4000, 4020), **same)
    assert answered(gateway, ns, "bot-v2") > before
    after = {p["metadata"]["name"]: restart_counts(p) for name in ("bot-v1", "bot-v2") for p in view.pods(name)}
    assert after == pods, "a weight change or a guard restarted a pod"


def _all_on(gateway: str, namespace: str, name: str, extra: dict) -> bool:
    """Whether the next 10 requests all go to `name` (the gateway has the new weights)."""
    before = answered(gateway, namespace, name)
    ask_all(gateway, range(500, 510), **extra)
    return answered(gateway, namespace, name) - before == 10
