"""The chart against the real API server: server-side dry run of its output, install and uninstall."""

from __future__ import annotations

import json
import uuid

import pytest

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import wait_until
from tests.helpers.chart import CHART, by_kind, objects, template_args


def server_version(cluster: Cluster) -> str:
    return json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]


@pytest.mark.parametrize("scope", ["all-namespaces", "watched-namespaces"])
def test_api_server_accepts_the_rendered_chart(cluster: Cluster, namespace: str, scope: str) -> None:
    # Everything but the ServiceMonitor, whose CRD (Prometheus Operator's) the sandbox lacks.
    sets = [
        "dashboard.enabled=true",
        "podAnnotations.team=ml",
        "nodeSelector.kubernetes\\.io/os=linux",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "operator.extraEnv[0].name=HTTPS_PROXY",
        "operator.extraEnv[0].value=http://proxy:3128",
        "networkPolicy.enabled=true",
        "networkPolicy.allowedNamespaces={default}",
    ]
    if scope == "watched-namespaces":
        sets.append(f"operator.watchNamespaces={{{namespace},default}}")
    else:
        sets.append(f"networkPolicy.namespaces={{{namespace}}}")
    rendered = cluster.helm(
        *template_args("dry", namespace, *sets, kube_version=server_version(cluster)),
        "--include-crds",
        "--api-versions",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",  # the API server compiles its CEL
    ).stdout
    kinds = sorted({doc["kind"] for doc in objects(rendered)})
    expected = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "CustomResourceDefinition",
        "DaemonSet",  # the node cache's agents
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",  # the operator's two pods
        "Role",  # leader election's, in the release namespace
        "RoleBinding",
        "Service",  # the gateway's, the node cache's
        "ServiceAccount",
        "ValidatingAdmissionPolicy",  # the node cache agent changes only its labels of a node
        "ValidatingAdmissionPolicyBinding",
    }
    assert set(kinds) == expected
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr
    # Per watched namespace, the operator's Role and the gateway's (the release's namespace is
    # watched, so the operator needs no extra Role there to read the gateway's pods); and leader election's.
    assert len(by_kind(rendered, "Role")) == (5 if scope == "watched-namespaces" else 1)
    # The model pods' per namespace, and the node agents' own.
    assert len(by_kind(rendered, "NetworkPolicy")) == (2 if scope == "watched-namespaces" else 1) + 1


def test_install_and_uninstall(cluster: Cluster, namespace: str) -> None:
    release = f"modelserve-{uuid.uuid4().hex[:6]}"  # contains the chart name: objects are named after it
    installed = cluster.helm("install", release, str(CHART), "--namespace", namespace, "--wait", "--timeout", "120s")
    assert "STATUS: deployed" in installed.stdout
    assert "kubectl get ms -n default -w" in installed.stdout  # NOTES.txt tells what to do next
    try:
        deployment = json.loads(cluster.kubectl("get", "deployment", release, "-n", namespace, "-o", "json").stdout)
        assert deployment["status"]["readyReplicas"] == 2  # KWOK ran the pods; --wait saw them Ready
        for kind in ("clusterrole", "clusterrolebinding"):
            cluster.kubectl("get", kind, release)
        cluster.kubectl("get", "crd", "modelservers.serving.modelserve.dev")
        # The node cache's agent may patch nodes (RBAC cannot say which labels), and its policy holds
        # it to its own models.serving.modelserve.dev/ labels, as the API server enforces it.
        agent = f"--as=system:serviceaccount:{namespace}:{release}-nodecache"
        said: list[str] = []

        def refused() -> bool:  # once the policy's binding is in force (the API server loads it)
            attempt = cluster.kubectl("label", "node", "cpu-0", "team=ml", agent, check=False)
            if attempt.returncode == 0:
                cluster.kubectl("label", "node", "cpu-0", "team-")
                return False
            said.append(attempt.stderr)
            return True

        wait_until(refused, 30, "the node cache agent refused another label of a node")
        assert "may change only a node's models.serving.modelserve.dev/ labels" in said[-1], said[-1]
        ours = "models.serving.modelserve.dev/m-0123456789abcdef0123456789abcdef"
        cluster.kubectl("label", "node", "cpu-0", f"{ours}=true", agent)
        cluster.kubectl("label", "node", "cpu-0", f"{ours}-")
    finally:
        uninstalled = cluster.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
    assert f'release "{release}" uninstalled' in uninstalled.stdout
    for kind, ns in (
        ("clusterrole", None),
        ("clusterrolebinding", None),
        ("serviceaccount", namespace),
        ("deployment", namespace),
    ):
        scope = ["-n", ns] if ns else []
        gone = cluster.kubectl("get", kind, release, *scope, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, f"{kind} {release} survived the uninstall"
    # Helm never deletes CRDs from crds/: ModelServers (and their models) outlive an uninstall.
    cluster.kubectl("get", "crd", "modelservers.serving.modelserve.dev")
