"""checkov (the pinned version, hack/install-checkov.sh) over what a user deploys: `modelserve render`
of every example and `helm template` of the chart (NetworkPolicy, watched namespaces and monitoring on).

The checks it must pass are chosen below, each a container or pod hardening rule, RBAC rule or
host-isolation rule. Checks left out, and why:
- CKV_K8S_43 image digests, CKV_K8S_15 imagePullPolicy Always: images are pinned by tag (the chart
  takes a digest for the operator); multi-GB engine images must not be pulled on every start.
- CKV_K8S_21 default namespace: `modelserve render` writes the namespace a manifest names, default.
- CKV_K8S_11 CPU limits: throttling adds latency to every token; CKV_K8S_13 memory limits: an
  engine's memory follows its model and GPU, so spec.resources sets it (the sidecar has a limit).
- CKV_K8S_8/9 probes on every container: the sidecar's probes cover the engine (its readiness is
  the engine's), on purpose.
- CKV_K8S_38 service-account tokens: the operator and the gateway call the API server; model pods
  mount none (automountServiceAccountToken false).
- CKV2_K8S_6 a NetworkPolicy per pod: opt-in in the chart (networkPolicy.*), since the chart cannot
  know every namespace; the graph check cannot join a chart's policy to rendered model pods.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from modelserve_sandbox.checkov import checkov_binary
from tests.helpers.chart import REPO, Helm, template_args

HARDENING = (
    "CKV_K8S_16",  # not privileged
    "CKV_K8S_17",  # no host PID
    "CKV_K8S_18",  # no host IPC
    "CKV_K8S_19",  # no host network
    "CKV_K8S_20",  # allowPrivilegeEscalation false
    "CKV_K8S_25",  # no added capabilities
    "CKV_K8S_26",  # no hostPort
    "CKV_K8S_27",  # no docker socket
    "CKV_K8S_28",  # NET_RAW dropped
    "CKV_K8S_29",  # a pod securityContext
    "CKV_K8S_30",  # a container securityContext
    "CKV_K8S_31",  # seccomp RuntimeDefault
    "CKV_K8S_35",  # Secrets as files rather than env (HF_TOKEN from a secretKeyRef passes)
    "CKV_K8S_37",  # capabilities drop ALL
    "CKV_K8S_39",  # no SYS_ADMIN
    "CKV_K8S_41",  # not the default ServiceAccount
    "CKV_K8S_49",  # no wildcards in Roles and ClusterRoles
    "CKV_K8S_155",  # no admission webhook control
    "CKV_K8S_157",  # no bind
    "CKV_K8S_158",  # no escalate
    "CKV2_K8S_1",  # no RoleBinding escalation to a ServiceAccount
    "CKV2_K8S_3",  # no impersonate
    "CKV2_K8S_5",  # no reading every Secret
)
NON_ROOT = (
    "CKV_K8S_22",  # read-only root filesystem
    "CKV_K8S_23",  # runAsNonRoot
    "CKV_K8S_40",  # a high UID
)
# vLLM's and SGLang's engines run non-root, but on a root filesystem left writable (to root: their user
# writes only to volumes) for the NVIDIA container toolkit's hooks on GPU nodes (engines/base.py): these
# examples' engines pass every check above but the read-only root's. The cpu (llama.cpp) and external ones
# pass all. The 16-GPU example is a LeaderWorkerSet, a kind checkov does not read: its leader and worker
# pods meet Pod Security in tests/api/test_pod_security_cluster.py instead.
WRITABLE_ROOT = "CKV_K8S_22"
# The node cache's agent runs with no capability, but its hostPath store is made by the kubelet, root's:
# one init container (own-store) runs as root with CAP_CHOWN alone (everything else dropped, no privilege
# escalation) to give that directory to the agent's user (charts/modelserve/templates/nodecache.yaml).
# checkov reads the DaemonSet as a whole; the test below holds the added capability to that one step.
ADDED_CAPABILITY = "CKV_K8S_25"
NODE_CACHE_DAEMONSET = "DaemonSet/modelserve-system/ms-modelserve-nodecache"
GPU_PROFILES = ("high-throughput", "low-latency")
EXAMPLES = sorted((REPO / "examples").glob("*.yaml")) + sorted((REPO / "examples").glob("external/*.yaml"))
MODELSERVE = Path(sys.executable).with_name("modelserve")


def _write_manifests(helm: Helm, out: Path) -> None:
    for path in EXAMPLES:
        render = subprocess.run(
            [str(MODELSERVE), "render", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        (out / f"example-{path.stem}.yaml").write_text(render.stdout)
    sets = (
        "networkPolicy.enabled=true",
        "operator.watchNamespaces={team-a}",
        "dashboard.enabled=true",
        "gateway.tls.secretName=gateway-tls",
        "serviceMonitor.enabled=true",  # and the operator's metrics Service
        "prometheusRule.enabled=true",
    )
    (out / "chart.yaml").write_text(helm(*template_args("ms", "modelserve-system", *sets)).stdout)


def _results(out: Path) -> dict[str, Any]:
    checks = ",".join(HARDENING + NON_ROOT)
    command = [str(checkov_binary()), "--directory", str(out), "--framework", "kubernetes", "--check", checks]
    result = subprocess.run(
        [*command, "--output", "json", "--compact", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(result.stdout)
    assert isinstance(report, dict) and report["check_type"] == "kubernetes", result.stdout[:500]
    return report["results"]


def _gpu_engine_deployments() -> list[str]:
    """The examples whose pods run vLLM or SGLang in a Deployment (one node per replica)."""
    manifests = [yaml.safe_load(path.read_text()) for path in EXAMPLES]
    return [
        m["metadata"]["name"]
        for m in manifests
        if m["spec"].get("profile", "high-throughput") in GPU_PROFILES and m["spec"].get("nodes", 1) == 1
    ]


def _added_capabilities(chart: Path) -> dict[tuple[str, str], list[str]]:
    """(kind, container) -> the capabilities it adds, of every container the chart renders."""
    added = {}
    for doc in yaml.safe_load_all(chart.read_text()):
        pod = ((doc or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            caps = (container.get("securityContext") or {}).get("capabilities") or {}
            if caps.get("add"):
                added[(doc["kind"], container["name"])] = caps["add"]
    return added


def _resource(check: dict[str, Any]) -> str:
    kind, namespace, name = check["resource"].split(".")[:3]
    return f"{kind}/{namespace}/{name}"


def test_checkov_finds_only_the_gpu_engines_writable_root_and_the_node_caches_chown(helm: Helm, tmp_path: Path) -> None:
    _write_manifests(helm, tmp_path)
    results = _results(tmp_path)
    failed = {(check["check_id"], _resource(check)) for check in results["failed_checks"]}
    expected = {(WRITABLE_ROOT, f"Deployment/default/{name}") for name in _gpu_engine_deployments()}
    assert expected, "no example runs vLLM or SGLang in a Deployment"
    expected.add((ADDED_CAPABILITY, NODE_CACHE_DAEMONSET))
    assert failed == expected, sorted(failed ^ expected)
    assert _added_capabilities(tmp_path / "chart.yaml") == {("DaemonSet", "own-store"): ["CHOWN"]}
    # Every chosen check ran on something (a misspelt id or an unread file passes nothing).
    passed = {(check["check_id"], _resource(check)) for check in results["passed_checks"]}
    assert {check for check, _ in passed | failed} == set(HARDENING + NON_ROOT)
    deployments = {resource for _, resource in passed if resource.startswith("Deployment/")}
    assert {"Deployment/default/smollm2-135m-cpu", "Deployment/default/qwen3-mlx"} <= deployments
    assert {"Deployment/modelserve-system/ms-modelserve", "Deployment/modelserve-system/ms-modelserve-gateway"} <= (
        deployments
    )
