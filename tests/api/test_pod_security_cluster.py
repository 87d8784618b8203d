"""Pod Security admission of a ModelServer's pods, by the real API server: every profile's pods, a
replica's own and a LeaderWorkerSet group's leader and worker alike (vLLM's and SGLang's), are
admitted where `restricted` is enforced, and so where `baseline` is. KWOK pods are admitted by the API
server like any, so the GPU profiles count too."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.testdata import examples
from modelserve.api.manifests import workload
from modelserve.api.spec import ModelServer
from modelserve.contracts.operator_settings import Settings
from modelserve_sandbox.cluster import Cluster
from tests.helpers.operator_cluster import OperatorView

SETTINGS = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0")
# Every example, and SGLang across two nodes (no example has it): vLLM's group is lfm2-24b-a2b-16gpu.
SGLANG_GROUP = "lfm2-8b-a1b-2-nodes"
# Pods the scheduler leaves Pending: admitted and created, holding no GPU of the shared cluster.
NOWHERE = {"serving.modelserve.dev/test": "no-such-node"}


def _manifests() -> dict[str, dict[str, Any]]:
    manifests = dict(examples())
    sglang = copy.deepcopy(manifests["lfm2-8b-a1b"])
    sglang["metadata"]["name"] = SGLANG_GROUP
    sglang["spec"].update(gpus=16, nodes=2)
    manifests[SGLANG_GROUP] = sglang
    return manifests


@pytest.fixture(scope="module")
def enforcing(cluster: Cluster) -> Iterator[dict[str, str]]:
    """A namespace enforcing each Pod Security level (latest version), by level."""
    namespaces = {}
    for level in ("baseline", "restricted"):
        name = f"psa-{level}-{uuid.uuid4().hex[:6]}"
        cluster.create_namespace(name)
        cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}")
        namespaces[level] = name
    yield namespaces
    for name in namespaces.values():
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _pods(name: str) -> list[dict[str, Any]]:
    """The pods the Deployment's ReplicaSet would create for a manifest, or a LeaderWorkerSet's
    leader and worker (a replica spanning nodes)."""
    made = workload(ModelServer.from_manifest(_manifests()[name]), SETTINGS)
    if made["kind"] == "Deployment":
        templates = [made["spec"]["template"]]
    else:
        group = made["spec"]["leaderWorkerTemplate"]
        templates = [group["leaderTemplate"], group["workerTemplate"]]
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {**t["metadata"], "name": "psa"}, "spec": t["spec"]}
        for t in templates
    ]


def _admit(cluster: Cluster, namespace: str, pods: list[dict[str, Any]]) -> list[Any]:
    """The API server's answers to a dry-run create of each pod."""
    return [
        cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
        for pod in pods
    ]


def test_the_cases_cover_every_profile_and_both_engines_across_nodes() -> None:
    specs = [ModelServer.from_manifest(manifest).spec for manifest in _manifests().values()]
    assert {spec.profile for spec in specs} == {"high-throughput", "low-latency", "cpu", "external"}
    assert {spec.profile for spec in specs if spec.multi_node} == {"high-throughput", "low-latency"}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
@pytest.mark.parametrize("name", sorted(_manifests()))
def test_every_pod_is_admitted(cluster: Cluster, enforcing: dict[str, str], level: str, name: str) -> None:
    pods = _pods(name)
    assert len(pods) == (2 if ModelServer.from_manifest(_manifests()[name]).spec.multi_node else 1)
    for result in _admit(cluster, enforcing[level], pods):
        assert result.returncode == 0, result.stderr


def test_the_restricted_namespace_refuses_a_root_engine(cluster: Cluster, enforcing: dict[str, str]) -> None:
    # The control: the vLLM pod with its user taken away (its image's root, as before) is refused, for
    # that alone, so the admissions above are the level's verdict, not a namespace that enforces nothing.
    pod = _pods("lfm2-1.2b")[0]
    engine = pod["spec"]["containers"][0]
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup"):
        del engine["securityContext"][key]
    (result,) = _admit(cluster, enforcing["restricted"], [pod])
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:latest": runAsNonRoot != true' in result.stderr, result.stderr
    for other in ("allowPrivilegeEscalation", "unrestricted capabilities", "seccompProfile", "restricted volume"):
        assert other not in result.stderr, result.stderr


# Each engine, and both kinds of group, through the operator in the restricted namespace.
OPERATOR_CASES = ("smollm2-135m-cpu", "lfm2-1.2b", "lfm2-8b-a1b", "lfm2-24b-a2b-16gpu", SGLANG_GROUP)


def test_the_operator_s_pods_are_created_in_a_restricted_namespace(
    cluster: Cluster, crd_installed: None, operator_process: Any, enforcing: dict[str, str]
) -> None:
    """Through the operator and the ReplicaSet, StatefulSet and LeaderWorkerSet controllers: every pod
    exists (a group's leader and worker), no FailedCreate."""
    namespace = enforcing["restricted"]
    ops = OperatorView(cluster, namespace, operator_process[1])
    expected = {}
    for name in OPERATOR_CASES:
        manifest = copy.deepcopy(_manifests()[name])
        manifest["spec"]["nodeSelector"] = NOWHERE
        ops.apply(manifest)
        made = workload(ModelServer.from_manifest(manifest), SETTINGS)
        group = made["spec"].get("leaderWorkerTemplate", {}).get("size", 1)  # a Deployment's pods: 1 a replica
        expected[manifest["metadata"]["name"]] = made["spec"]["replicas"] * group

    def created() -> dict[str, int]:
        items = json.loads(ops.kubectl("get", "pods", "-o", "json").stdout)["items"]
        counts = dict.fromkeys(expected, 0)
        for pod in items:
            counts[pod["metadata"]["labels"]["serving.modelserve.dev/modelserver"]] += 1
        return counts

    ops.wait(lambda: created() == expected, f"pods {expected} in {namespace}")
    events = json.loads(ops.kubectl("get", "events", "-o", "json").stdout)["items"]
    assert not [e["message"] for e in events if e["reason"] == "FailedCreate"]
