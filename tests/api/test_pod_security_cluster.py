"""Pod Security admission of a ModelServer's pods, by the real API server: every profile's pods are
admitted where `baseline` is enforced, and cpu's (llama.cpp, non-root) and external's (the sidecar
alone) where `restricted` is; vLLM and SGLang run as their images' root user, which `restricted`
refuses by name. KWOK pods are admitted by the API server like any, so the GPU profiles count too."""

from __future__ import annotations

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
RESTRICTED_EXAMPLES = ("smollm2-135m-cpu", "qwen3-mlx")  # llama.cpp and external
ROOT_EXAMPLES = ("lfm2-1.2b", "lfm2-24b-a2b-16gpu", "lfm2-8b-a1b", "lfm2-vl-1.6b", "tiny-chatml-vllm")  # vLLM, SGLang


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
    """The pods the Deployment's ReplicaSet would create for an example, or a LeaderWorkerSet's
    leader and worker (a replica spanning nodes)."""
    made = workload(ModelServer.from_manifest(examples()[name]), SETTINGS)
    if made["kind"] == "Deployment":
        templates = [made["spec"]["template"]]
    else:
        group = made["spec"]["leaderWorkerTemplate"]
        templates = [group["leaderTemplate"], group["workerTemplate"]]
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {**t["metadata"], "name": "psa"}, "spec": t["spec"]}
        for t in templates
    ]


def _admit(cluster: Cluster, namespace: str, name: str) -> list[Any]:
    """The API server's answers to a dry-run create of each of the example's pods."""
    return [
        cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
        for pod in _pods(name)
    ]


def test_examples_cover_every_profile() -> None:
    assert set(RESTRICTED_EXAMPLES) | set(ROOT_EXAMPLES) == set(examples())


@pytest.mark.parametrize("name", sorted(examples()))
def test_every_profile_is_admitted_under_baseline(cluster: Cluster, enforcing: dict[str, str], name: str) -> None:
    for result in _admit(cluster, enforcing["baseline"], name):
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", RESTRICTED_EXAMPLES)
def test_cpu_and_external_are_admitted_under_restricted(cluster: Cluster, enforcing: dict[str, str], name: str) -> None:
    for result in _admit(cluster, enforcing["restricted"], name):
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ROOT_EXAMPLES)
def test_root_engines_are_refused_under_restricted_for_root_alone(
    cluster: Cluster, enforcing: dict[str, str], name: str
) -> None:
    # Everything else restricted asks is there: the refusal names runAsNonRoot and nothing else.
    for result in _admit(cluster, enforcing["restricted"], name):
        assert result.returncode != 0
        assert 'violates PodSecurity "restricted:latest": runAsNonRoot != true' in result.stderr, result.stderr
        assert 'container "engine" must not set securityContext.runAsNonRoot=false' not in result.stderr
        for other in ("allowPrivilegeEscalation", "unrestricted capabilities", "seccompProfile", "restricted volume"):
            assert other not in result.stderr, result.stderr


def test_the_operator_s_pods_are_created_in_enforcing_namespaces(
    cluster: Cluster, crd_installed: None, operator_process: Any, enforcing: dict[str, str]
) -> None:
    """Through the operator and the ReplicaSet controller: pods exist, no FailedCreate."""
    cases = {"lfm2-1.2b": enforcing["baseline"], "smollm2-135m-cpu": enforcing["restricted"]}
    for name, namespace in cases.items():
        ops = OperatorView(cluster, namespace, operator_process[1])
        ops.apply(examples()[name])
        ms_name = examples()[name]["metadata"]["name"]
        selector = f"serving.modelserve.dev/modelserver={ms_name}"

        def pods(ops: OperatorView = ops, selector: str = selector) -> list[Any]:
            return json.loads(ops.kubectl("get", "pods", "-l", selector, "-o", "json").stdout)["items"]

        ops.wait(pods, f"a pod of {ms_name} in {namespace}")
        events = json.loads(ops.kubectl("get", "events", "-o", "json").stdout)["items"]
        assert not [e["message"] for e in events if e["reason"] == "FailedCreate"]
