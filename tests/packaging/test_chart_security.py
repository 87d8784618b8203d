"""The chart's opt-in NetworkPolicy for model pods, the node agents' own, and its ClusterRoles for the
cluster's default user roles, rendered by helm and matched against what the operator really labels
and serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.contracts.operator_settings import Settings
from tests.helpers.chart import MINIMUM_KUBE_VERSION, REPO, Helm, by_kind, template_args

POLICY_ON = ("networkPolicy.enabled=true", "networkPolicy.namespaces={team-a,team-b}")


def _example_pod(path: str, tls: dict[str, str] | None = None) -> dict[str, Any]:
    example = yaml.safe_load((REPO / "examples" / path).read_text())
    if tls is not None:
        example["spec"]["tls"] = tls
    ms = ModelServer.from_manifest(example)
    return manifests.deployment(ms, Settings(sidecar_image="s:1"))["spec"]["template"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _model_policies(rendered: str) -> list[dict[str, Any]]:
    return [p for p in by_kind(rendered, "NetworkPolicy") if p["metadata"]["name"].endswith("-model-ingress")]


def test_no_network_policy_for_model_pods_unless_asked(helm: Helm) -> None:
    assert not _model_policies(helm(*template_args("ms", "modelserve-system")).stdout)


def _agent_policy(rendered: str) -> dict[str, Any]:
    (policy,) = [p for p in by_kind(rendered, "NetworkPolicy") if p["metadata"]["name"] == "ms-modelserve-nodecache"]
    return policy


def test_only_the_operators_pods_and_monitoring_reach_the_node_agents(helm: Helm) -> None:
    """Issue 57 M4: every pod in the cluster reached every node's agent (all its routes, one port)."""
    rendered = helm(*template_args("ms", "modelserve-system")).stdout
    policy = _agent_policy(rendered)["spec"]
    (agents,) = by_kind(rendered, "DaemonSet")
    assert _selects(policy["podSelector"]["matchLabels"], agents["spec"]["template"]["metadata"]["labels"])
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {p["name"] for c in agents["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])} == {"http"}
    pods, monitoring = rule["from"]
    assert pods["namespaceSelector"] == {}  # the operator watches every namespace
    ms = ModelServer.from_manifest(yaml.safe_load((REPO / "examples" / "smollm2-135m-cpu.yaml").read_text()))
    prefetch = manifests.prefetch_job(ms, Settings(sidecar_image="s:1"), "node-1")["spec"]["template"]
    for pod in (_example_pod("smollm2-135m-cpu.yaml"), _example_pod("lfm2-1.2b.yaml"), prefetch):
        assert _selects(pods["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    for other in ("ms-modelserve", "ms-modelserve-gateway"):  # the chart's own pods: Helm's, not the operator's
        assert not _selects(pods["podSelector"]["matchLabels"], _pod_labels(rendered, other))
    assert monitoring == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    watched = _agent_policy(helm(*template_args("ms", "x", "operator.watchNamespaces={team-a,team-b}")).stdout)
    namespaces = [source["namespaceSelector"].get("matchLabels") for source in watched["spec"]["ingress"][0]["from"]]
    assert namespaces[:2] == [{"kubernetes.io/metadata.name": "team-a"}, {"kubernetes.io/metadata.name": "team-b"}]
    assert not by_kind(helm(*template_args("ms", "x", "nodeCache.networkPolicy=false")).stdout, "NetworkPolicy")


def test_the_policy_guards_every_model_pod_in_each_namespace(helm: Helm) -> None:
    rendered = helm(*template_args("ms", "modelserve-system", *POLICY_ON)).stdout
    policies = _model_policies(rendered)
    assert [p["metadata"]["namespace"] for p in policies] == ["team-a", "team-b"]
    policy = policies[0]["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    # The sidecar's one port, by its name: `http`, or `https` when it serves TLS (spec.tls).
    admitted = [[{"port": "http", "protocol": "TCP"}, {"port": "https", "protocol": "TCP"}]]
    for example in ("smollm2-135m-cpu.yaml", "lfm2-1.2b.yaml", "lfm2-8b-a1b.yaml", "external/qwen3-mlx.yaml"):
        for tls in (None, {"secretName": "model-tls"}):
            pod = _example_pod(example, tls)
            assert _selects(policy["podSelector"]["matchLabels"], pod["metadata"]["labels"]), example
            ports = {port["name"] for container in pod["spec"]["containers"] for port in container.get("ports", [])}
            assert [rule["ports"] for rule in policy["ingress"]] == admitted
            assert ports == {"https" if tls else "http"}  # the sidecar's, the pod's only port


def _pod_labels(rendered: str, name: str) -> dict[str, str]:
    deployment = next(d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"] == name)
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_the_policy_lets_in_the_operator_gateway_monitoring_and_chosen_namespaces_only(helm: Helm) -> None:
    sets = (*POLICY_ON, "networkPolicy.allowedNamespaces={apps}")
    rendered = helm(*template_args("ms", "modelserve-system", *sets)).stdout
    (rule,) = _model_policies(rendered)[0]["spec"]["ingress"]
    operator, gateway, monitoring, apps = rule["from"]
    release_namespace = {"kubernetes.io/metadata.name": "modelserve-system"}
    operator_labels = _pod_labels(rendered, "ms-modelserve")
    gateway_labels = _pod_labels(rendered, "ms-modelserve-gateway")
    # The operator's autoscaler reads each sidecar's /load; the gateway routes requests.
    assert operator["namespaceSelector"]["matchLabels"] == release_namespace
    assert _selects(operator["podSelector"]["matchLabels"], operator_labels)
    assert not _selects(operator["podSelector"]["matchLabels"], gateway_labels)
    assert gateway["namespaceSelector"]["matchLabels"] == release_namespace
    assert _selects(gateway["podSelector"]["matchLabels"], gateway_labels)
    assert not _selects(gateway["podSelector"]["matchLabels"], operator_labels)
    assert monitoring == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert apps == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}


def test_without_gateway_or_monitoring_only_the_operator_gets_in(helm: Helm) -> None:
    sets = (*POLICY_ON, "gateway.enabled=false", "networkPolicy.monitoringNamespace=")
    policy = _model_policies(helm(*template_args("ms", "x", *sets)).stdout)[0]
    (rule,) = policy["spec"]["ingress"]
    components = [source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for source in rule["from"]]
    assert components == ["operator"]


def test_the_policy_defaults_to_the_watched_namespaces_and_needs_some(helm: Helm) -> None:
    sets = ("networkPolicy.enabled=true", "operator.watchNamespaces={team-a}")
    (policy,) = _model_policies(helm(*template_args("ms", "x", *sets)).stdout)
    assert policy["metadata"]["namespace"] == "team-a"
    refused = helm(*template_args("ms", "x", "networkPolicy.enabled=true"), check=False)
    assert refused.returncode != 0 and "networkPolicy.enabled needs networkPolicy.namespaces" in refused.stderr


def _admits_monitoring(policy: dict[str, Any], port: str) -> bool:
    """Some ingress rule of the policy lets every pod of the monitoring namespace in on the port."""
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    return any(
        monitoring in rule.get("from", []) and any(p.get("port") == port for p in rule.get("ports", []))
        for rule in policy["spec"]["ingress"]
    )


def test_the_monitoring_namespace_reaches_every_scraped_port(helm: Helm) -> None:
    """Each ServiceMonitor's targets, where a NetworkPolicy guards them, let Prometheus's namespace
    (networkPolicy.monitoringNamespace) in on the port it scrapes; the gateway and the operator have no
    policy of the chart's, so nothing keeps a scrape out."""
    sets = (*POLICY_ON, "serviceMonitor.enabled=true")
    rendered = helm(*template_args("ms", "modelserve-system", *sets)).stdout
    policies = by_kind(rendered, "NetworkPolicy")
    services = by_kind(rendered, "Service")
    # Every pod template the chart renders (by its namespace), and a ModelServer's, in a guarded namespace.
    pods = [
        (w["metadata"]["namespace"], w["spec"]["template"])
        for w in [*by_kind(rendered, "Deployment"), *by_kind(rendered, "DaemonSet")]
    ]
    pods.append(("team-a", _example_pod("lfm2-1.2b.yaml")))
    guarded = set()
    for monitor in by_kind(rendered, "ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        if monitor["metadata"]["name"] == "ms-modelserve-modelservers":
            targets = [(ns, pod) for ns, pod in pods if ns == "team-a"]
            target_port = "http"  # the ModelServer Service's port targets the sidecar's named port
        else:
            (service,) = [
                s for s in services if _selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
            ]
            (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
            target_port = port["targetPort"]
            targets = [
                (ns, pod) for ns, pod in pods if _selects(service["spec"]["selector"], pod["metadata"]["labels"])
            ]
        assert targets, monitor["metadata"]["name"]
        for namespace, pod in targets:
            named = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            assert target_port in named, (monitor["metadata"]["name"], named)
            for policy in policies:
                if policy["metadata"]["namespace"] == namespace and _selects(
                    policy["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"]
                ):
                    guarded.add(monitor["metadata"]["name"])
                    assert _admits_monitoring(policy, target_port), (
                        monitor["metadata"]["name"],
                        policy["metadata"]["name"],
                    )
    assert guarded == {"ms-modelserve-modelservers", "ms-modelserve-nodecache"}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"networkPolicy": {"namespace": ["a"]}}, "at '/networkPolicy': additional properties 'namespace' not allowed"),
        ({"networkPolicy": {"allowedNamespaces": ["Apps"]}}, "at '/networkPolicy/allowedNamespaces/0'"),
        ({"rbac": {"aggregateToDefaultRoles": "yes"}}, "at '/rbac/aggregateToDefaultRoles': got string, want boolean"),
    ],
    ids=["unknown-key", "bad-namespace", "bool-as-string"],
)
def test_schema_refuses_bad_security_values(helm: Helm, tmp_path: Path, values: dict[str, Any], complaint: str) -> None:
    bad = tmp_path / "values.yaml"
    bad.write_text(yaml.safe_dump(values))
    result = helm(*template_args("bad", "default"), "--values", str(bad), check=False)
    assert result.returncode != 0 and complaint in result.stderr


def test_modelservers_join_the_default_view_and_edit_roles(helm: Helm) -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(helm(*template_args("ms", "x")).stdout, "ClusterRole")}
    view, edit = roles["ms-modelserve-view"], roles["ms-modelserve-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {"aggregate-to-edit", "aggregate-to-admin"} <= {
        key.removeprefix("rbac.authorization.k8s.io/") for key in edit["metadata"]["labels"]
    }
    assert all(rule["verbs"] == ["get", "list", "watch"] for rule in view["rules"])
    assert {verb for rule in edit["rules"] for verb in rule["verbs"]} >= {"create", "delete", "patch", "update"}
    # Neither reaches anything but ModelServers: no Secret, no pod, nothing of the operator's.
    for role in (view, edit):
        assert {group for rule in role["rules"] for group in rule["apiGroups"]} == {"serving.modelserve.dev"}
    off = helm(*template_args("ms", "x", "rbac.aggregateToDefaultRoles=false")).stdout
    assert {r["metadata"]["name"] for r in by_kind(off, "ClusterRole")} == {
        "ms-modelserve",
        "ms-modelserve-gateway",
        "ms-modelserve-nodecache",
    }


def test_the_node_agents_admission_policy_is_never_left_out_silently(helm: Helm) -> None:
    (policy,) = by_kind(helm(*template_args("ms", "x")).stdout, "ValidatingAdmissionPolicy")
    rule = policy["spec"]["validations"][0]["expression"]
    for part in ("object.spec", "annotations", "finalizers", "ownerReferences", "labels"):
        assert part in rule, part
    # 1.29 does not serve it: the chart says so, and renders without it only when told to.
    refused = helm(*template_args("ms", "x", kube_version=MINIMUM_KUBE_VERSION), check=False)
    assert refused.returncode != 0 and "nodeCache.admissionPolicy=false" in refused.stderr, refused.stderr
    told = helm(*template_args("ms", "x", "nodeCache.admissionPolicy=false", kube_version=MINIMUM_KUBE_VERSION))
    assert not by_kind(told.stdout, "ValidatingAdmissionPolicy") and by_kind(told.stdout, "DaemonSet")
    served = [*template_args("ms", "x", kube_version=MINIMUM_KUBE_VERSION), "--api-versions"]
    served.append("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    assert by_kind(helm(*served).stdout, "ValidatingAdmissionPolicyBinding")


def test_the_node_agents_rbac_is_its_three_questions(helm: Helm) -> None:
    """The pods of its node (as metadata), each pod's ModelServer by name (issue 57 L7: a pod's model
    label pins a model only where its ModelServer names it), its node's labels. `get` alone on
    ModelServers: it lists no tenant's, and nothing reaches a Secret."""
    roles = {r["metadata"]["name"]: r for r in by_kind(helm(*template_args("ms", "x")).stdout, "ClusterRole")}
    assert roles["ms-modelserve-nodecache"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["serving.modelserve.dev"], "resources": ["modelservers"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    ]
