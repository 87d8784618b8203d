"""What only a kubelet shows: key rotation through the Secret volume, drain on pod deletion (and the
replacement's model from the node's cache), a crashing engine, the generated securityContext as it
runs, and a pod that starts from the hub while its node's cache is down."""

from __future__ import annotations

import datetime
import json
import threading
import time

import httpx

from harness.sidecar import metric_value
from modelserve.api import manifests
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.pods import pod_ready
from modelserve.operator.starts import fetch_result
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import NODE_CACHE_NAME, NODE_CACHE_NAMESPACE, SMOLLM2_FILE, SMOLLM2_REPO
from modelserve_sandbox.processes import wait_until
from tests.helpers.node_view import (
    GREEDY,
    NO_END,
    PROMPT,
    NodeView,
    Timeline,
    cpu_server,
    hub_file_bytes,
    hub_model_size,
    image_writes,
)


def _chat(base: str, key: str | None, name: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {key}"} if key else {},
        json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **GREEDY},
    )


def test_key_rotation_through_the_secret_volume(node: NodeView) -> None:
    node.apply(cpu_server("rotating"))
    node.wait_phase("rotating", "Ready")
    base = f"http://{node.cluster_ip('rotating')}"
    old = node.secret_value("rotating-api-keys", "api-key")
    assert _chat(base, old, "rotating").status_code == 200
    new = "sk-rotated-" + old[-12:]
    node.kubectl(
        "patch", "secret", "rotating-api-keys", "--type=merge", "-p", json.dumps({"stringData": {"api-key": new}})
    )
    edited = time.monotonic()
    node.wait(lambda: _chat(base, new, "rotating").status_code == 200, "the new key accepted", timeout=180)
    delay = time.monotonic() - edited
    assert _chat(base, old, "rotating").status_code == 401
    restarts = [c["restartCount"] for p in node.pods("rotating") for c in p["status"]["containerStatuses"]]
    assert restarts == [0, 0], restarts  # no restart: the sidecar reloads the mounted keys
    print(f"key rotation: new key accepted {delay:.1f}s after the Secret was edited")
    _engine_dies_in_place(node, "rotating")


def _engine_dies_in_place(node: NodeView, name: str) -> None:
    """The engine of a Ready pod stops in place (its container restarts, the pod stays): the pod leaves
    Ready at the sidecar's next readiness probe (every second), so its Service stops sending it
    requests, and is Ready again once the restarted engine answers. The seconds from the engine's exit
    to the pod's leaving Ready (the kubelet's whole-second timestamps) are printed, not asserted."""
    (pod,) = node.pods(name)
    pod_name = pod["metadata"]["name"]
    # The shell's kill (the engine's image has no kill program): SIGTERM to llama-server, its PID 1.
    node.cluster.kubectl("exec", "-n", node.namespace, pod_name, "-c", "engine", "--", "sh", "-c", "kill -TERM 1")
    seen: dict = {}

    def restarted_and_ready() -> bool:
        found = json.loads(node.kubectl("get", "pod", pod_name, "-o", "json").stdout)
        (engine,) = [s for s in found["status"]["containerStatuses"] if s["name"] == "engine"]
        (ready,) = [c for c in found["status"]["conditions"] if c["type"] == "Ready"]
        if ready["status"] == "False":
            seen.setdefault("left", _instant(ready["lastTransitionTime"]))  # caught while not Ready
        seen.update(engine=engine, ready=ready)
        return engine["restartCount"] == 1 and engine["ready"] and pod_ready(found)

    wait_until(restarted_and_ready, 180, "the engine restarted and the pod Ready again", interval=0.2)
    exited = _instant(seen["engine"]["lastState"]["terminated"]["finishedAt"])
    # It left Ready after the exit and came back: the condition's last transition is after the exit.
    assert _instant(seen["ready"]["lastTransitionTime"]) >= exited, (seen["ready"], exited)
    node.wait_phase(name, "Ready")
    left = seen.get("left")
    after = f"{(left - exited).total_seconds():.0f} s after its exit" if left else "between two looks (not seen)"
    print(f"engine stopped in place: the pod left Ready {after}, whole seconds; Ready again with the engine")


KEEP = "serving.modelserve.dev/test-keeps-the-pod"  # a finalizer: the pod's final status stays readable


def _delete_kept(node: NodeView, pod: str) -> datetime.datetime:
    """Delete `pod`, kept (a finalizer) so its final status stays readable: when the API server took the
    deletion (its deletionTimestamp is that plus the grace period, read before the kubelet's last
    delete sets it anew)."""
    node.kubectl("patch", "pod", pod, "--type=merge", "-p", json.dumps({"metadata": {"finalizers": [KEEP]}}))
    node.kubectl("delete", "pod", pod, "--wait=false")
    metadata = json.loads(node.kubectl("get", "pod", pod, "-o", "json").stdout)["metadata"]
    grace = datetime.timedelta(seconds=metadata["deletionGracePeriodSeconds"])
    return _instant(metadata["deletionTimestamp"]) - grace


def _engine_stopped_after(node: NodeView, pod: str, deleted: datetime.datetime) -> tuple[float, str]:
    """Seconds from `deleted` to the pod's engine's exit (the kubelet's finishedAt), and the pod's
    containers' last log lines and Events; the kept pod then let go."""
    finished: list[datetime.datetime] = []

    def engine_stopped() -> bool:
        found = json.loads(node.kubectl("get", "pod", pod, "-o", "json").stdout)
        for status in found["status"].get("containerStatuses", []):
            if status["name"] == "engine" and "terminated" in status.get("state", {}):
                finished.append(_instant(status["state"]["terminated"]["finishedAt"]))
        return bool(finished)

    try:
        node.wait(engine_stopped, f"{pod}'s engine to exit", timeout=150)
        logs = "\n".join(
            node.kubectl("logs", pod, "-c", container, "--tail=8", check=False).stdout
            for container in ("sidecar", "engine")
        )
        events = node.kubectl("get", "events", "--field-selector", f"involvedObject.name={pod}", check=False)
        logs += "\n" + events.stdout
    finally:
        node.kubectl("patch", "pod", pod, "--type=json", "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')
    return (finished[0] - deleted).total_seconds(), logs


def _instant(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_pod_deletion_during_a_stream_loses_nothing(node: NodeView) -> None:
    node.apply(cpu_server("draining", public=True, replicas={"min": 2, "buffer": 0, "max": 2}))
    node.wait(lambda: len(node.ready_pods("draining")) == 2, "two ready replicas", timeout=180)
    base = f"http://{node.cluster_ip('draining')}"
    timeline = Timeline()
    streamed: dict[str, object] = {}

    def long_stream() -> None:
        # Likely outlasts the preStop (5 s), so the drain holds it, and ends well inside the drain
        # deadline (60 s) however loaded the cores: about 9 tokens/s on two busy cores, 2.4 on two
        # cores shared with a whole cold set-up (160 tokens took 67 s there, and the deadline cut them).
        request = {
            "model": "draining",
            "messages": PROMPT,
            "max_tokens": 64,
            "stream": True,
            "logit_bias": NO_END,
            **GREEDY,
        }
        try:
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=request, timeout=120) as response:
                streamed["body"] = b"".join(response.iter_raw())
                streamed["status"] = response.status_code
        except httpx.HTTPError as error:
            streamed["error"] = repr(error)
        timeline.add("stream ended")

    pods = node.ready_pods("draining")  # listed once: each poll below is then two quick requests
    thread = threading.Thread(target=long_stream)
    thread.start()
    # The replica serving the stream is the one whose sidecar counts a request in flight.
    serving = None
    deadline = time.monotonic() + 60
    while serving is None and thread.is_alive() and time.monotonic() < deadline:
        for pod in pods:
            metrics = httpx.get(f"http://{pod['status']['podIP']}:8080/metrics", timeout=10).text
            if metric_value(metrics, "modelserve_sidecar_in_flight_requests") >= 1:
                serving = pod["metadata"]["name"]
        time.sleep(0.1)
    assert serving, f"no replica shows the stream in flight: {streamed}\n{timeline}"
    deleted = _delete_kept(node, serving)
    timeline.add(f"deleted {serving}")
    answered, failures = 0, []
    while thread.is_alive() or answered < 10:
        try:
            response = _chat(base, None, "draining")
            if response.status_code == 200:
                answered += 1
            else:
                failures.append(f"{response.status_code} {response.text[:200]}")
        except httpx.HTTPError as error:
            failures.append(repr(error))
        if time.monotonic() > deadline + 150 or len(failures) > 20:
            break
        time.sleep(0.2)
    thread.join(timeout=120)
    timeline.add(f"{answered} requests answered during the drain")
    body = streamed.get("body", b"")
    assert streamed.get("status") == 200 and isinstance(body, bytes), f"{streamed}\n{timeline}"
    assert body.rstrip().endswith(b"data: [DONE]"), f"stream cut:\n{body[-300:]!r}\n{timeline}"
    assert failures == [], f"{failures}\n{timeline}"
    assert answered >= 10
    # The engine stopped once its sidecar's drain was done (the stream over), not after a fixed preStop
    # sleep of the whole drain budget (5 + 60 s: a deleted pod held its engine, and its GPU, that long).
    streaming, logs = _engine_stopped_after(node, serving, deleted)
    assert streaming < manifests.sidecar_done_seconds(Settings()), (streaming, str(timeline), logs)
    # The deleted pod's replacement reads the whole model from the node's cache, no byte from the hub.
    hub_before = hub_file_bytes(node.cluster)
    node.wait(
        lambda: len([p for p in node.ready_pods("draining") if p["metadata"]["name"] != serving]) == 2,
        "the replacement replica Ready",
        timeout=180,
    )
    (replacement,) = [
        p for p in node.ready_pods("draining") if p["metadata"]["name"] not in {x["metadata"]["name"] for x in pods}
    ]
    result = fetch_result(replacement)
    assert result and (result.hub_bytes, result.source) == (0, "node"), result
    assert result.node_bytes == hub_model_size(node.cluster, SMOLLM2_REPO, SMOLLM2_FILE)
    assert hub_file_bytes(node.cluster) == hub_before
    # An idle replica deleted: its engine stops once the endpoints had their 5 s and nothing is in flight.
    (idle,) = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] != serving]
    idle_seconds, logs = _engine_stopped_after(node, idle, _delete_kept(node, idle))
    assert idle_seconds < manifests.ENDPOINT_PROPAGATION_SECONDS + 15, (idle_seconds, logs)
    print(f"deleted pod to its engine's exit: {streaming:.0f} s with a stream in flight, {idle_seconds:.0f} s idle")


def test_a_bad_engine_flag_shows_as_crash_loop(node: NodeView) -> None:
    node.apply(cpu_server("crashing", public=True, engineArgs=["--no-such-flag"]))
    condition = node.wait_reason("crashing", "Degraded", "True", "CrashLoop", timeout=180)
    assert "engine" in condition["message"] and "code 1" in condition["message"], condition
    # Ready turning False is a Normal Event; Degraded turning True is the Warning (written just after
    # the status, so waited for).
    warnings: list[dict] = []

    def warned() -> bool:
        events = node.events("crashing")
        warnings[:] = [e for e in events if e["reason"] == "CrashLoop" and e["type"] == "Warning"]
        return bool(warnings)

    node.wait(warned, "the CrashLoop Warning Event", 30)
    assert warnings[0]["message"].startswith("Degraded is True: "), warnings
    assert "code 1" in warnings[0]["message"]


def test_an_image_that_cannot_be_pulled_names_the_pull_secret_its_namespace_lacks(node: NodeView) -> None:
    # Nothing listens on port 1 of the node's loopback: the kubelet's pull is refused at once.
    unpullable = "127.0.0.1:1/modelserve/no-such-engine:0"
    node.apply(cpu_server("unpullable", public=True, image=unpullable, imagePullSecrets=[{"name": "regcred"}]))
    lacking = f"imagePullSecrets not found in namespace {node.namespace}: regcred"

    def degraded_naming(wanted: bool) -> bool:
        condition = node.condition("unpullable", "Degraded")
        named = condition.get("reason") == "ImagePullError" and lacking in condition.get("message", "")
        return condition.get("reason") == "ImagePullError" and named == wanted

    node.wait(lambda: degraded_naming(True), "Degraded ImagePullError naming the missing Secret", 180)
    pod = node.pods("unpullable")[0]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}], pod["spec"]
    config = json.dumps({"auths": {"127.0.0.1:1": {"auth": "dXNlcjpwYXNz"}}})  # user:pass, for no registry
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"}}
    node.apply({**secret, "type": "kubernetes.io/dockerconfigjson", "stringData": {".dockerconfigjson": config}})
    node.wait(lambda: degraded_naming(False), "Degraded ImagePullError without the Secret, once it exists", 120)
    warnings = [e for e in node.events("unpullable") if e["reason"] == "ImagePullError" and e["type"] == "Warning"]
    assert warnings and warnings[0]["message"].startswith("Degraded is True: "), warnings


def test_generated_security_context_runs_as_generated(node: NodeView) -> None:
    node.apply(cpu_server("confined", public=True))
    node.wait_phase("confined", "Ready")
    pod = node.ready_pods("confined")[0]
    deployment = node.get("deployment", "confined") or {}
    assert deployment["metadata"]["generation"] == 1, "the operator rolled the Deployment after creating it"
    name = pod["metadata"]["name"]
    probe = (
        "import os,pathlib\n"
        "status = pathlib.Path('/proc/self/status').read_text()\n"
        "cap = next(l.split()[1] for l in status.splitlines() if l.startswith('CapEff'))\n"
        "nnp = next(l.split()[1] for l in status.splitlines() if l.startswith('NoNewPrivs'))\n"
        "try:\n    open('/written', 'w'); ro = False\nexcept OSError:\n    ro = True\n"
        "print(os.getuid(), os.getgid(), cap, nnp, ro)"
    )
    out = node.cluster.kubectl(
        "exec", "-n", node.namespace, name, "-c", "sidecar", "--", "python", "-c", probe
    ).stdout.split()
    assert out == ["65532", "65532", "0000000000000000", "1", "True"], out
    # Nothing in the pod wrote to its image's filesystem: every container's overlay upper
    # layer holds no file after serving (what it writes goes to its volumes).
    httpx.post(
        f"http://{pod['status']['podIP']}:8080/v1/chat/completions",
        timeout=60,
        json={"model": "confined", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    written = image_writes(node.cluster, pod)
    assert written == {"engine": [], "sidecar": []}, written


def previous_log(cluster, pod: dict, container: str) -> str:
    """A container's log before its last restart (what a failing assertion should show)."""
    meta = pod["metadata"]
    args = ("logs", "--previous", "-c", container, "-n", meta["namespace"], meta["name"])
    return cluster.kubectl(*args, check=False).stdout[-3000:]


def test_node_and_host_facts(node_cluster) -> None:
    nodes = json.loads(node_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    real = by_name[realnode.NODE_NAME]
    assert real["metadata"]["labels"]["type"] == "real"
    assert real["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert not real["spec"].get("taints")
    # The fake CPU node is kept for pods that ask for it; the real one takes everything else.
    assert by_name["cpu-0"]["spec"]["taints"][0]["key"] == "kwok.x-k8s.io/node"


def test_with_its_nodes_cache_down_a_pod_starts_from_the_hub_and_says_so(node: NodeView) -> None:
    """The node agent gone from the node (its DaemonSet kept off it): the Service's Local policy has no
    endpoint there, the fetch's connection times out, and the pod starts from the hub, no restart,
    with a Warning Event and the reason in the status."""
    patch = {"spec": {"template": {"spec": {"nodeSelector": {"modelserve.dev/node-cache-test": "nowhere"}}}}}
    daemonset = ("daemonset", NODE_CACHE_NAME, "-n", NODE_CACHE_NAMESPACE)
    cluster = node.cluster
    cluster.kubectl("patch", *daemonset, "--type=merge", "-p", json.dumps(patch))
    try:
        node.wait(
            lambda: not cluster.kubectl("get", "pods", "-n", NODE_CACHE_NAMESPACE, "-o", "name").stdout.strip(),
            "the node agent gone",
            timeout=90,
        )
        node.apply(cpu_server("uncached", public=True))
        ready = node.wait_phase("uncached", "Ready")
        (pod,) = node.ready_pods("uncached")
        result = fetch_result(pod)
        assert result and result.source == "hub" and "node cache is unreachable" in result.node_cache, result
        restarted = [s for s in pod["status"]["initContainerStatuses"] if s.get("restartCount", 0)]
        ended = [((s.get("lastState") or {}).get("terminated") or {}) for s in restarted]
        # The fetch's own failure (its exit 1, or 2 for its settings; out of memory) fails the test. Two
        # CI runs in five saw one restart whose first attempt left no log line at all, so it never ran
        # the fetch's code: it is shown, not failed on.
        own = [end for end in ended if end.get("exitCode") in (1, 2) or end.get("reason") == "OOMKilled"]
        assert not own, (own, previous_log(cluster, pod, "fetch"))
        if ended:
            print(f"\nfetch restarted, not by its own failure: {ended} {previous_log(cluster, pod, 'fetch')!r}")
        warnings = [e["message"] for e in node.events("uncached") if e["reason"] == "NodeCacheUnavailable"]
        assert warnings and "read its model from the hub" in warnings[0], warnings
        assert "unreachable" in ready["status"]["lastStart"]["nodeCache"], ready["status"]["lastStart"]
    finally:
        restore = {"spec": {"template": {"spec": {"nodeSelector": None}}}}
        cluster.kubectl("patch", *daemonset, "--type=merge", "-p", json.dumps(restore))
        node.wait(cluster.node_cache_ready, "the node agent back", timeout=120)
