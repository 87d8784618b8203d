"""Replicas spanning nodes, against the real control plane and the real LeaderWorkerSet controller
(its webhooks included): KWOK's two 8-GPU nodes hold one 16-GPU group, a pod on each."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from harness.testdata import examples
from tests.helpers.operator_cluster import OperatorView

GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _manifest(name: str, **spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(examples()["lfm2-24b-a2b-16gpu"])
    manifest["metadata"]["name"] = name
    manifest["spec"].update(spec)
    return manifest


def _pods(ops: OperatorView, name: str) -> list[dict[str, Any]]:
    out = ops.kubectl("get", "pods", "-l", f"serving.modelserve.dev/modelserver={name}", "-o", "json").stdout
    return [pod for pod in json.loads(out)["items"] if not pod["metadata"].get("deletionTimestamp")]


def _by_role(pods: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    labels = [(pod["metadata"]["labels"][GROUP_INDEX], pod["metadata"]["labels"][WORKER_INDEX]) for pod in pods]
    return dict(zip(labels, pods, strict=True))


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {var["name"]: var.get("value", "") for var in container.get("env", [])}


def _service_targets(ops: OperatorView, name: str) -> list[str]:
    out = ops.kubectl("get", "endpointslices", "-l", f"kubernetes.io/service-name={name}", "-o", "json").stdout
    return sorted(
        endpoint["targetRef"]["name"]
        for item in json.loads(out)["items"]
        for endpoint in item.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
    )


@pytest.mark.parametrize("profile", ["high-throughput", "low-latency"])
def test_sixteen_gpus_run_as_one_group_of_two_pods_one_per_node(ops: OperatorView, profile: str) -> None:
    name = f"big-{'vllm' if profile == 'high-throughput' else 'sglang'}"
    ops.apply(_manifest(name, profile=profile))
    ms = ops.wait_ready(name)
    assert (ms["status"]["replicas"], ms["status"]["readyReplicas"]) == (1, 1)  # one group
    lws = ops.get("leaderworkerset", name) or {}
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]
    assert ops.get("deployment", name) is None

    pods = _by_role(_pods(ops, name))
    leader, worker = pods[("0", "0")], pods[("0", "1")]
    assert set(pods) == {("0", "0"), ("0", "1")}
    assert {leader["spec"]["nodeName"], worker["spec"]["nodeName"]} == {"gpu-0", "gpu-1"}
    assert [c["name"] for c in leader["spec"]["containers"]] == ["engine", "sidecar"]
    assert [c["name"] for c in worker["spec"]["containers"]] == ["engine"]
    # LeaderWorkerSet's pod webhook gave every container the group's variables.
    engine = worker["spec"]["containers"][0]
    assert _env(engine)["LWS_LEADER_ADDRESS"] == f"{name}-0.{name}-0.{ops.namespace}"
    assert (_env(engine)["LWS_GROUP_SIZE"], _env(engine)["LWS_WORKER_INDEX"]) == ("2", "1")
    assert _env(leader["spec"]["containers"][1])["LWS_WORKER_INDEX"] == "0"
    for pod in (leader, worker):
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    if profile == "high-throughput":
        # The worker's script joins the head on $LWS_LEADER_ADDRESS, the variable checked above.
        assert engine["command"][:2] == ["/bin/sh", "-c"] and "LWS_LEADER_ADDRESS" in engine["command"][2]
    else:
        assert engine["args"][engine["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    # The Service reaches the leader alone (the only pod serving HTTP); a headless Service per
    # group gives the leader's address.
    ops.wait(lambda: _service_targets(ops, name) == [leader["metadata"]["name"]], "the Service to select the leader")
    assert (ops.get("service", f"{name}-0") or {})["spec"]["clusterIP"] == "None"


def test_scale_in_groups_and_a_deleted_worker_recreates_its_group(ops: OperatorView) -> None:
    # 8 GPUs over 2 nodes: each group takes 4 on gpu-0 and 4 on gpu-1, so two groups fit.
    name = "groups"
    ops.apply(_manifest(name, gpus=8, replicas={"min": 1, "max": 2}))
    ops.wait_ready(name)
    ops.kubectl("scale", "modelserver", name, "--replicas=2")

    def groups(count: int) -> bool:
        status = (ops.get("modelserver", name) or {}).get("status", {})
        pods = _pods(ops, name)
        return status.get("readyReplicas") == count == status.get("replicas") and len(pods) == 2 * count

    ops.wait(lambda: groups(2), "two groups of two pods ready")
    assert (ops.get("leaderworkerset", name) or {})["spec"]["replicas"] == 2
    assert set(_by_role(_pods(ops, name))) == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}
    ops.kubectl("scale", "modelserver", name, "--replicas=1")
    ops.wait(lambda: groups(1), "one group left")
    assert set(_by_role(_pods(ops, name))) == {("0", "0"), ("0", "1")}

    leader_uid = _by_role(_pods(ops, name))[("0", "0")]["metadata"]["uid"]
    ops.kubectl("delete", "pod", f"{name}-0-1", "--wait=false")

    def recreated() -> bool:
        pods = _by_role(_pods(ops, name))
        return ("0", "0") in pods and pods[("0", "0")]["metadata"]["uid"] != leader_uid

    # RecreateGroupOnPodRestart: the leader goes too, and the group comes back whole.
    ops.wait(recreated, "the group's leader to be recreated with it")
    ops.wait(lambda: groups(1), "the group ready again")


def test_a_group_that_cannot_be_placed_is_insufficient_gpu(ops: OperatorView) -> None:
    ops.apply(_manifest("huge", gpus=32))
    degraded = ops.wait_reason("huge", "Degraded", "True", "InsufficientGPU")
    assert "no node has 16 free nvidia.com/gpu" in degraded["message"]


def test_moving_between_one_node_and_several_leaves_no_orphan(ops: OperatorView) -> None:
    name = "mover"
    ops.apply(_manifest(name, gpus=8, nodes=1))
    ops.wait_ready(name)
    assert ops.get("deployment", name) and ops.get("leaderworkerset", name) is None
    ops.apply(_manifest(name, gpus=16, nodes=2))
    ops.wait_ready(name, generation=2)
    ops.wait(lambda: ops.get("deployment", name) is None, "the Deployment to go")
    ops.wait(lambda: len(_pods(ops, name)) == 2, "only the group's two pods")
    ops.apply(_manifest(name, gpus=8, nodes=1))
    ops.wait_ready(name, generation=3)
    ops.wait(lambda: ops.get("leaderworkerset", name) is None, "the LeaderWorkerSet to go")
    ops.wait(lambda: len(_pods(ops, name)) == 1, "only the Deployment's pod")
