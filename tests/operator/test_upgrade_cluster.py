"""Day two on a control plane of its own (KWOK, one node of 8 GPUs): a rollout without spare GPUs says
so and rolls in place with Replace; an operator upgrade restarts no model pod, opting in rolls that
ModelServer only; with two replicas electing a leader on a Lease, killing the
leader hands the reconciler and the wake-up of held requests to the standby (times printed); a
leader releases the Lease when it stops and steps down when another holds it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.testdata import CRD_PATH
from modelserve import __version__
from modelserve.api.spec import ModelServer
from modelserve.engines import vllm
from modelserve.kube.apply import Kube
from modelserve.kube.lease import Elector, Timing
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.operator_process import running_operator
from modelserve_sandbox.processes import free_ports, start_process, stop_process, tail, wait_until

SELECTOR = "serving.modelserve.dev/modelserver"
RESYNC_SECONDS = 2
BUMPED_SIDECAR = f"ghcr.io/modelserve/modelserve:{__version__}-bumped"
# This release's engine bump: the previous release's operator chose the vLLM it pinned, this one
# chooses its own pin, by default.
PREVIOUS_VLLM = f"vllm/vllm-openai:v{vllm.ENGINE.previous_version}"
BUMPED_VLLM = vllm.ENGINE.image
WAIT_SECONDS = 90


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Its own control plane: these tests run their own operators, which must not meet the session's.
    with Cluster(tmp_path_factory.mktemp("day2"), gpu_nodes=1, cpu_nodes=0, real_node=False, lws=False) as running:
        running.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        running.wait_established()
        yield running


def _vllm(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": {"model": "LiquidAI/LFM2-350M", "auth": {"mode": "public"}, **spec},
    }


def _apply(cluster: Cluster, namespace: str, *manifests: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(manifests)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(items))


def _get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    return json.loads(result.stdout) if result.stdout.strip() else {}


def _pods(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, str]]:
    """uid -> {container: image} of the ModelServer's pods that are not terminating."""
    items = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", f"{SELECTOR}={name}", "-o", "json").stdout)
    return {
        pod["metadata"]["uid"]: {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        for pod in items["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def _default_workers(manifest: dict[str, Any]) -> int:
    """The sidecar's workers the operator chooses for a ModelServer that names none (by model size:
    LFM2-350M on one GPU streams enough tokens for several)."""
    return ModelServer.from_manifest(
        {**manifest, "metadata": {**manifest["metadata"], "namespace": "n"}}
    ).spec.sidecar_workers


def _fetches(cluster: Cluster, namespace: str, name: str) -> bool:
    """Whether the ModelServer's Deployment starts its pods with the node cache's fetch."""
    template = _get(cluster, namespace, "deployment", name)["spec"]["template"]["spec"]
    return [c["name"] for c in template.get("initContainers") or []] == ["fetch"]


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return _get(cluster, namespace, "modelserver", name).get("status", {})


def _rolled_out(cluster: Cluster, namespace: str, name: str, sidecar: str, count: int) -> bool:
    pods = _pods(cluster, namespace, name)
    status = _status(cluster, namespace, name)
    return (
        len(pods) == count
        and all(images["sidecar"] == sidecar for images in pods.values())
        and status.get("phase") == "Ready"
    )


def _condition(cluster: Cluster, namespace: str, name: str, type_: str) -> tuple[str, str]:
    conditions = _status(cluster, namespace, name).get("conditions") or []
    found = next((c for c in conditions if c["type"] == type_), {})
    return found.get("status", ""), found.get("reason", "")


def _delete_namespace(cluster: Cluster, namespace: str) -> None:
    """Gone before the next test: its pods' GPUs are free again (one node of 8 here)."""
    cluster.kubectl("delete", "namespace", namespace, "--timeout=120s")


def test_a_rollout_without_spare_gpus_says_so_and_replace_rolls_in_place(cluster: Cluster, tmp_path: Path) -> None:
    namespace = "scarce"
    cluster.create_namespace(namespace)
    env = {**cluster.operator_env, "MODELSERVE_RESYNC_SECONDS": str(RESYNC_SECONDS)}
    try:
        with running_operator(env, tmp_path / "operator") as (_, log):
            # Every GPU of the node: a surge pod has nowhere to go.
            _apply(cluster, namespace, _vllm("big", gpus=8))
            wait_until(lambda: _status(cluster, namespace, "big").get("phase") == "Ready", WAIT_SECONDS, "big Ready")
            (first,) = _pods(cluster, namespace, "big")
            _apply(cluster, namespace, _vllm("big", gpus=8, maxModelLen=4096))  # changes the pods
            wait_until(
                lambda: _condition(cluster, namespace, "big", "Progressing") == ("True", "WaitingForGPUs"),
                WAIT_SECONDS,
                "Progressing WaitingForGPUs",
                on_timeout=lambda: "\n" + tail(log, 30),
            )
            status = _status(cluster, namespace, "big")
            assert status["phase"] == "Updating"
            assert _condition(cluster, namespace, "big", "Ready") == ("True", "Ready")  # the old pod serves
            assert _condition(cluster, namespace, "big", "Degraded") == ("False", "AsExpected")
            message = next(c["message"] for c in status["conditions"] if c["type"] == "Progressing")
            assert "waiting for GPUs" in message and "nvidia.com/gpu" in message, message
            # Replace: the old pod goes first and gives its GPUs to the new one.
            _apply(cluster, namespace, _vllm("big", gpus=8, maxModelLen=4096, rolloutStrategy="Replace"))
            wait_until(
                lambda: (
                    _condition(cluster, namespace, "big", "Progressing") == ("False", "Complete")
                    and _status(cluster, namespace, "big").get("phase") == "Ready"
                    and first not in _pods(cluster, namespace, "big")
                ),
                WAIT_SECONDS,
                "big rolled in place and Ready",
                on_timeout=lambda: "\n" + tail(log, 30),
            )
    finally:
        _delete_namespace(cluster, namespace)


def test_an_operator_upgrade_restarts_no_model_pod_and_opting_in_rolls_that_modelserver_only(
    cluster: Cluster, tmp_path: Path
) -> None:
    namespace = "upgrade"
    cluster.create_namespace(namespace)
    new_env = {**cluster.operator_env, "MODELSERVE_RESYNC_SECONDS": str(RESYNC_SECONDS)}
    new_env.pop("MODELSERVE_ENGINE_IMAGE_VLLM", None)  # the operator's own pin
    new_env.pop("MODELSERVE_NODE_CACHE_URL", None)
    old_env = {**new_env, "MODELSERVE_ENGINE_IMAGE_VLLM": PREVIOUS_VLLM}
    new_env["MODELSERVE_SIDECAR_IMAGE"] = BUMPED_SIDECAR
    # The new release also brings the node's model cache (the chart's nodeCache): kept back as well.
    new_env["MODELSERVE_NODE_CACHE_URL"] = "http://modelserve-nodecache.modelserve.svc.cluster.local:8090"
    replicas = {"min": 2, "max": 2}
    with running_operator(old_env, tmp_path / "old") as (_, log):
        _apply(cluster, namespace, _vllm("kept", replicas=replicas), _vllm("opted", replicas=replicas))
        for name in ("kept", "opted"):
            wait_until(
                lambda name=name: _status(cluster, namespace, name).get("phase") == "Ready",
                WAIT_SECONDS,
                f"{name} Ready under the old operator",
                on_timeout=lambda: "\n" + tail(log, 30),
            )
    before = {name: _pods(cluster, namespace, name) for name in ("kept", "opted")}
    old_sidecar = next(iter(before["kept"].values()))["sidecar"]
    assert old_sidecar != BUMPED_SIDECAR and all(len(pods) == 2 for pods in before.values())
    generations = {n: _get(cluster, namespace, "deployment", n)["metadata"]["generation"] for n in before}

    with running_operator(new_env, tmp_path / "new") as (_, log):
        for name in ("kept", "opted"):
            wait_until(
                lambda name=name: (_status(cluster, namespace, name).get("upgrade") or {}).get("available") == "Yes",
                WAIT_SECONDS,
                f"{name}'s status to show the pending upgrade",
                on_timeout=lambda: "\n" + tail(log, 30),
            )
        # A new ModelServer starts on the new release's images.
        _apply(cluster, namespace, _vllm("fresh"))
        wait_until(lambda: _rolled_out(cluster, namespace, "fresh", BUMPED_SIDECAR, 1), WAIT_SECONDS, "fresh Ready")
        assert next(iter(_pods(cluster, namespace, "fresh").values()))["engine"] == BUMPED_VLLM
        assert _fetches(cluster, namespace, "fresh")  # and the node cache
        time.sleep(3 * RESYNC_SECONDS)  # resync rounds: any of them would have rolled the pods
        kept = _status(cluster, namespace, "kept")
        assert kept["versions"] == {
            "sidecar": old_sidecar,
            "engine": before["kept"][next(iter(before["kept"]))]["engine"],
            "sidecarWorkers": _default_workers(_vllm("kept")),  # the operator's default, by model size
            "nodeCache": False,
        }
        assert (kept["upgrade"]["sidecar"], kept["upgrade"]["engine"]) == (BUMPED_SIDECAR, BUMPED_VLLM)
        assert kept["upgrade"]["nodeCache"] is True and not _fetches(cluster, namespace, "kept")
        assert kept["versions"]["engine"] == PREVIOUS_VLLM  # the engine it runs, kept

        # The Event names the new engine release too.
        def upgrade_events() -> list[str]:
            selector = "involvedObject.name=kept"
            out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", selector, "-o", "json")
            return [e["message"] for e in json.loads(out.stdout)["items"] if e.get("reason") == "UpgradeAvailable"]

        wait_until(lambda: bool(upgrade_events()), WAIT_SECONDS, "kept's UpgradeAvailable Event")
        assert all(BUMPED_VLLM in message for message in upgrade_events()), upgrade_events()
        for name, pods in before.items():
            assert _pods(cluster, namespace, name) == pods, f"{name}'s pods were replaced by the upgrade"
            assert _get(cluster, namespace, "deployment", name)["metadata"]["generation"] == generations[name]
        wide = cluster.kubectl("get", "ms", "kept", "-n", namespace, "-o", "wide").stdout
        assert "UPGRADE" in wide.splitlines()[0] and old_sidecar in wide and " Yes" in wide, wide

        # The owner opts in: that ModelServer rolls onto the new images, the other keeps running.
        patch = json.dumps({"spec": {"upgradePolicy": "Automatic"}})
        cluster.kubectl("patch", "ms", "opted", "-n", namespace, "--type", "merge", "-p", patch)
        wait_until(
            lambda: _rolled_out(cluster, namespace, "opted", BUMPED_SIDECAR, 2),
            WAIT_SECONDS,
            "opted rolled onto the new images",
            on_timeout=lambda: "\n" + tail(log, 30),
        )
        assert not set(_pods(cluster, namespace, "opted")) & set(before["opted"])
        assert _status(cluster, namespace, "opted")["upgrade"]["available"] == "No"
        assert _fetches(cluster, namespace, "opted")  # its new pods fetch through the node cache
        assert _pods(cluster, namespace, "kept") == before["kept"]


def _operator(cluster: Cluster, log_dir: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    argv = [str(Path(sys.executable).with_name("modelserve-operator"))]
    return start_process(name, argv, log_dir, env={**cluster.operator_env, **env})


def _lease_holder(cluster: Cluster, namespace: str) -> str:
    lease = _get(cluster, namespace, "lease", "modelserve-operator")
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def _hold_a_request(gateway: str, model: str) -> None:
    """A chat request to a model at zero: the gateway holds it until a replica is ready."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    request = urllib.request.Request(
        f"http://{gateway}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with contextlib.suppress(OSError):  # KWOK's pods serve nothing: only the wake-up is measured
        urllib.request.urlopen(request, timeout=WAIT_SECONDS).read()


def test_killing_the_leader_hands_reconcile_and_wake_up_to_the_standby(cluster: Cluster, tmp_path: Path) -> None:
    namespace = "failover"
    cluster.create_namespace(namespace)
    (gateway_port,) = free_ports(1)
    gateway_address = f"127.0.0.1:{gateway_port}"
    gateway_env = {
        **cluster.env,
        "MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1",
        "MODELSERVE_GATEWAY_LISTEN_PORT": str(gateway_port),
        "MODELSERVE_GATEWAY_HOLD_SECONDS": str(WAIT_SECONDS),
    }
    gateway = start_process(
        "gateway", [str(Path(sys.executable).with_name("modelserve-gateway"))], tmp_path, gateway_env
    )
    env = {
        "MODELSERVE_LEADER_ELECTION_LEASE": f"{namespace}/modelserve-operator",
        "MODELSERVE_GATEWAY_ADDRESSES": gateway_address,
        "MODELSERVE_RESYNC_SECONDS": str(RESYNC_SECONDS),
    }
    operators = {name: _operator(cluster, tmp_path, name, env) for name in ("operator-a", "operator-b")}
    logs = {name: tmp_path / f"{name}.log" for name in operators}
    try:
        wait_until(lambda: _lease_holder(cluster, namespace) != "", WAIT_SECONDS, "a leader")
        holder = _lease_holder(cluster, namespace)
        leader = next(name for name, process in operators.items() if f"_{process.pid}_" in holder)
        standby = next(name for name in operators if name != leader)
        # The leader serves: a ModelServer at zero (min 0, nothing asked yet) and one that runs.
        _apply(cluster, namespace, _vllm("sleepy", replicas={"min": 0, "max": 1}), _vllm("before"))
        wait_until(lambda: _status(cluster, namespace, "sleepy").get("phase") == "Idle", WAIT_SECONDS, "sleepy Idle")
        wait_until(lambda: _get(cluster, namespace, "deployment", "before"), WAIT_SECONDS, "before's Deployment")
        assert "leading as" not in logs[standby].read_text(), "the standby leads beside the leader"

        os.kill(operators[leader].pid, signal.SIGKILL)
        killed = time.monotonic()
        _apply(cluster, namespace, _vllm("after"))
        threading.Thread(target=_hold_a_request, args=(gateway_address, f"{namespace}/sleepy"), daemon=True).start()
        times: dict[str, float] = {}

        def progress() -> bool:
            if "deployment" not in times and _get(cluster, namespace, "deployment", "after"):
                times["deployment"] = time.monotonic() - killed
            sleepy = _get(cluster, namespace, "deployment", "sleepy")
            if "wake" not in times and sleepy and sleepy["spec"]["replicas"] >= 1:
                times["wake"] = time.monotonic() - killed
            return len(times) == 2

        wait_until(
            progress,
            WAIT_SECONDS,
            "the standby to create after's Deployment and wake sleepy",
            on_timeout=lambda: f" ({times})\n{tail(logs[standby], 30)}",
        )
        assert operators[standby].poll() is None and f"_{operators[standby].pid}_" in _lease_holder(cluster, namespace)
        print(
            f"\nleader killed -> new ModelServer's Deployment {times['deployment']:.1f} s, "
            f"held request wakes a model at zero {times['wake']:.1f} s (lease 15 s, retry 2 s)"
        )
    finally:
        for process in operators.values():
            stop_process(process, grace_seconds=20)
        stop_process(gateway)


def test_a_leader_steps_down_when_another_holds_the_lease_and_releases_it_when_stopped(cluster: Cluster) -> None:
    namespace = "lease"
    cluster.create_namespace(namespace)
    kube = Kube(cluster.api_client())
    timing = Timing(duration=6, renew_deadline=4, retry=0.5)
    first, second = (Elector(kube, namespace, "op", identity, timing) for identity in ("first", "second"))
    stop_first, stop_second = threading.Event(), threading.Event()
    lost = threading.Event()
    try:
        assert first.campaign(stop_first)
        keeper = threading.Thread(target=first.keep, args=(stop_first, lost.set), daemon=True)
        keeper.start()
        # A standby does not take a renewed Lease, however often it tries.
        assert not any(second.try_hold() for _ in range(3))
        # The leader stops: it releases the Lease, and the standby takes it at its next try.
        stop_first.set()
        keeper.join(timeout=10)
        released = time.monotonic()
        assert second.campaign(stop_second) and time.monotonic() - released < timing.retry * 4
        assert _get(cluster, namespace, "lease", "op")["spec"]["leaseTransitions"] == 1
        # A leader that finds another holder (it was cut off, and the Lease taken) steps down at once.
        keeper = threading.Thread(target=second.keep, args=(stop_second, lost.set), daemon=True)
        keeper.start()
        patch = json.dumps({"spec": {"holderIdentity": "someone-else"}})
        cluster.kubectl("patch", "lease", "op", "-n", namespace, "--type", "merge", "-p", patch)
        assert lost.wait(timing.renew_deadline), "the leader did not step down"
    finally:
        stop_first.set()
        stop_second.set()
