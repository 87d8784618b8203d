"""Proofs that the test control plane is a real one: scheduling, GPUs, GC, CEL, CLIs."""

from __future__ import annotations

import ipaddress
import json
import re

from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import wait_until

KUBE_VERSION = "v1.33.13"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _gpu_pod_spec(gpus: int) -> dict:
    return {
        "tolerations": [GPU_TOLERATION],
        "containers": [
            {
                "name": "c",
                "image": "registry.invalid/never-pulled:1",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }


def _get(cluster: Cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def test_gpu_deployment_becomes_available_on_a_fake_gpu_node(cluster: Cluster, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-app", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "gpu-app"}},
            "template": {"metadata": {"labels": {"app": "gpu-app"}}, "spec": _gpu_pod_spec(1)},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment))

    def available() -> bool:
        status = _get(cluster, "deployment", "gpu-app", "-n", namespace).get("status", {})
        return any(c["type"] == "Available" and c["status"] == "True" for c in status.get("conditions", []))

    wait_until(available, 90, "Deployment gpu-app Available")
    pods = _get(cluster, "pods", "-n", namespace, "-l", "app=gpu-app")["items"]
    assert len(pods) == 1
    assert re.fullmatch(r"gpu-\d+", pods[0]["spec"]["nodeName"])
    assert pods[0]["status"]["phase"] == "Running"


def test_pod_asking_more_gpus_than_any_node_stays_pending_unschedulable(cluster: Cluster, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big", "namespace": namespace},
        "spec": _gpu_pod_spec(16),
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    found: dict = {}

    def unschedulable() -> bool:
        status = _get(cluster, "pod", "too-big", "-n", namespace).get("status", {})
        for condition in status.get("conditions", []):
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                found.update(condition, phase=status.get("phase"))
                return True
        return False

    wait_until(unschedulable, 60, "pod too-big marked Unschedulable")
    assert found["status"] == "False"
    assert found["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in found["message"]


def test_deleting_an_owner_deletes_its_dependents(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    uid = _get(cluster, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(dependent))
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_until(
        lambda: cluster.kubectl("get", "configmap", "dependent", "-n", namespace, check=False).returncode != 0,
        60,
        "the garbage collector to delete the dependent ConfigMap",
    )


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.proof.modelserve.dev"},
    "spec": {
        "group": "proof.modelserve.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                                "x-kubernetes-validations": [
                                    {"rule": "self.min <= self.max", "message": "spec.min must not exceed spec.max"}
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_with_a_cel_rule_refuses_a_bad_object_at_kubectl_apply(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    cluster.wait_established("widgets.proof.modelserve.dev")

    def widget(name: str, lo: int, hi: int) -> str:
        return json.dumps(
            {
                "apiVersion": "proof.modelserve.dev/v1",
                "kind": "Widget",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"min": lo, "max": hi},
            }
        )

    cluster.kubectl("apply", "-f", "-", input=widget("good", 1, 2))
    refused = cluster.kubectl("apply", "-f", "-", input=widget("bad", 3, 2), check=False)
    assert refused.returncode != 0
    assert "spec.min must not exceed spec.max" in refused.stderr
    assert cluster.kubectl("get", "widget", "bad", "-n", namespace, check=False).returncode != 0


def test_kubectl_and_helm_answer_with_real_versions(cluster: Cluster) -> None:
    versions = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == KUBE_VERSION
    assert versions["serverVersion"]["gitVersion"] == KUBE_VERSION
    helm = cluster.helm("version", "--short").stdout
    assert helm.startswith("v3.")
    # helm talks to the same API server with the same kubeconfig.
    assert cluster.helm("list", "--all-namespaces").returncode == 0


def test_kwok_heartbeats_every_node_through_a_lease(cluster: Cluster) -> None:
    # Without lease heartbeats the node lifecycle controller declares every node not-ready
    # after its grace period and turns every pod unready in the middle of a test session.
    nodes = {n["metadata"]["name"] for n in _get(cluster, "nodes")["items"]}

    def leased() -> bool:
        leases = _get(cluster, "leases", "-n", "kube-node-lease")["items"]
        return nodes <= {lease["metadata"]["name"] for lease in leases if lease["spec"].get("renewTime")}

    wait_until(leased, 30, f"a renewed Lease for each of the nodes {sorted(nodes)}")


def test_the_service_range_holds_thousands_of_services(cluster: Cluster, namespace: str) -> None:
    # One Service per ModelServer: a /24 capped the sandbox at ~250 of them.
    cidrs = json.loads(cluster.kubectl("get", "servicecidr", "kubernetes", "-o", "json").stdout)["spec"]["cidrs"]
    assert [ipaddress.ip_network(cidr).num_addresses for cidr in cidrs] == [65536]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "far"}}
    service["spec"] = {"clusterIP": "10.0.200.7", "ports": [{"port": 80}]}  # beyond any /24
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(service))
