"""The Helm chart without a cluster: lint, schema, documentation, and the wiring to the operator's code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.contracts import sidecar as sidecar_contract
from modelserve.contracts.gateway import GATEWAY_LABEL, TLS_PORT_NAME, serves_tls
from modelserve.contracts.names import SELECTOR_LABEL
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import ENGINES
from modelserve.gateway.settings import GatewaySettings
from modelserve.operator import main as operator_main
from modelserve.sidecar.metrics import SidecarMetrics
from modelserve_sandbox.cluster import default_cache
from tests.helpers.chart import CHART, REPO, Helm, by_kind, literal_env, template_args

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
EVERYTHING_ON = (
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "dashboard.enabled=true",
    "operator.logLevel=debug",
)
# Kubernetes objects passed through to the pod spec: the API server checks their insides.
PASS_THROUGH = {
    "global",
    "operator.extraEnv[].valueFrom",
    "gateway.extraEnv[].valueFrom",
    "affinity.nodeAffinity",
    "affinity.podAffinity",
    "affinity.podAntiAffinity",
}


def test_lint(helm: Helm) -> None:
    for sets in ((), (*EVERYTHING_ON, "operator.watchNamespaces={team-a,team-b}", "gateway.tls.secretName=gw-tls")):
        args = ["lint", "--strict", str(CHART)]
        for pair in sets:
            args += ["--set", pair]
        result = helm(*args)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
        ({"image": {"tagg": "1.0"}}, "at '/image': additional properties 'tagg' not allowed"),
        ({"operator": {"healthPort": "8080"}}, "at '/operator/healthPort': got string, want integer"),
        ({"operator": {"logLevel": "verbose"}}, "at '/operator/logLevel'"),
        ({"operator": {"watchNamespaces": ["Team_A"]}}, "at '/operator/watchNamespaces/0'"),
        ({"serviceMonitor": {"enabled": "yes"}}, "at '/serviceMonitor/enabled': got string, want boolean"),
        ({"resources": {"limit": {"memory": "1Gi"}}}, "at '/resources': additional properties 'limit' not allowed"),
        ({"gateway": {"tls": {"secretName": "Gateway_TLS"}}}, "at '/gateway/tls/secretName'"),
        ({"gateway": {"upstreamTLS": {"caConfigMap": "Model_CA"}}}, "at '/gateway/upstreamTLS/caConfigMap'"),
    ],
    ids=[
        "unknown-key",
        "unknown-nested-key",
        "wrong-type",
        "not-in-enum",
        "bad-namespace",
        "bool-as-string",
        "typo-in-resources",
        "bad-secret-name",
        "bad-ca-configmap-name",
    ],
)
def test_schema_refuses_bad_values(helm: Helm, tmp_path: Path, values: dict[str, Any], complaint: str) -> None:
    bad = tmp_path / "values.yaml"
    bad.write_text(yaml.safe_dump(values))
    result = helm(*template_args("bad", "default"), "--values", str(bad), check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def _schema_objects(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)] if node.get("type") == "object" else []
    for key, child in node.get("properties", {}).items():
        found += _schema_objects(child, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        found += _schema_objects(node["items"], f"{path}[]")
    return found


def test_schema_is_closed_everywhere() -> None:
    for path, node in _schema_objects(SCHEMA):
        if path in PASS_THROUGH:
            continue
        closed = node.get("additionalProperties")
        # Either a record of known keys (closed), or a map whose values are typed (labels, quantities).
        assert closed is False or (isinstance(closed, dict) and "type" in closed), f"{path or '<root>'} is open"


def _value_paths(node: Any, path: str = "") -> list[str]:
    paths = [path] if path else []
    if isinstance(node, dict):
        for key, child in node.items():
            paths += _value_paths(child, f"{path}.{key}" if path else key)
    return paths


def _schema_node(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = SCHEMA
    for key in path.split("."):
        properties = (node or {}).get("properties")
        if properties is None:  # inside a map (labels, requests): its keys are the user's
            return {"description": "map entry"}
        node = properties.get(key)
    return node


def test_every_value_is_in_the_schema_with_a_description_and_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    for path in _value_paths(VALUES):
        node = _schema_node(path)
        assert node is not None, f"{path} is in values.yaml but not in values.schema.json"
        assert node.get("description"), f"{path} has no description in values.schema.json"
        if node["description"] == "map entry":
            continue
        # The key's line in values.yaml is preceded by its comment.
        key, depth = path.split(".")[-1], path.count(".")
        index = next(
            i
            for i, line in enumerate(lines)
            if line == f"{'  ' * depth}{key}:" or line.startswith(f"{'  ' * depth}{key}: ")
        )
        above = lines[index - 1].strip()
        assert above.startswith("#"), f"{path} has no comment in values.yaml"


def test_every_schema_key_has_a_default_in_values() -> None:
    paths = set(_value_paths(VALUES))
    for path, node in _schema_objects(SCHEMA):
        for key in node.get("properties", {}):
            full = f"{path}.{key}" if path else key
            if full in PASS_THROUGH or "[]" in full:
                continue
            assert full in paths, f"{full} is in the schema but has no default in values.yaml"


def test_chart_crd_is_the_generated_one(helm: Helm) -> None:
    copy = CHART / "files" / "modelserver-crd.yaml"
    assert copy.read_bytes() == (REPO / "crds" / "modelserver.yaml").read_bytes(), (
        "charts/modelserve/files/modelserver-crd.yaml differs from crds/modelserver.yaml: run `make generate`"
    )
    # A template, so `helm upgrade` brings a new schema; no crds/, which Helm would install once and
    # never again.
    assert not (CHART / "crds").exists()
    (rendered,) = by_kind(helm(*template_args("ms", "modelserve-system")).stdout, "CustomResourceDefinition")
    generated = yaml.safe_load(copy.read_text())
    assert rendered["spec"] == generated["spec"] and rendered["metadata"]["name"] == generated["metadata"]["name"]
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    unkept = by_kind(helm(*template_args("ms", "x", "crds.keep=false")).stdout, "CustomResourceDefinition")
    assert "annotations" not in unkept[0]["metadata"]
    assert not by_kind(helm(*template_args("ms", "x", "crds.enabled=false")).stdout, "CustomResourceDefinition")


def _deployment(rendered: str, component: str) -> dict[str, Any]:
    (deployment,) = [
        d
        for d in by_kind(rendered, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return deployment


def _operator_container(rendered: str) -> dict[str, Any]:
    (container,) = _deployment(rendered, "operator")["spec"]["template"]["spec"]["containers"]
    return container


def _gateway_container(rendered: str) -> dict[str, Any]:
    (container,) = _deployment(rendered, "gateway")["spec"]["template"]["spec"]["containers"]
    return container


def test_operator_deployment_is_hardened(helm: Helm) -> None:
    rendered = helm(*template_args("ms", "modelserve-system")).stdout
    deployment = _deployment(rendered, "operator")
    spec = deployment["spec"]
    # Two pods electing a leader: a rolling update never leaves none, a node's loss leaves a standby.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (preferred,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (budget,) = by_kind(rendered, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": spec["selector"]}
    single = helm(*template_args("ms", "modelserve-system", "operator.replicas=1")).stdout
    assert _deployment(single, "operator")["spec"]["replicas"] == 1 and not by_kind(single, "PodDisruptionBudget")
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _operator_container(rendered)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["limits"]["memory"]
    # kopf's liveness endpoint is what the probe asks.
    (liveness,) = [arg for arg in container["args"] if arg.startswith("--liveness=")]
    port = int(re.fullmatch(r"--liveness=http://0\.0\.0\.0:(\d+)/healthz", liveness).group(1))
    assert container["ports"] == [
        {"name": "health", "containerPort": port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8081, "protocol": "TCP"},  # the operator's own /metrics
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_operator_reads_what_the_chart_sets(helm: Helm) -> None:
    rendered = helm(
        *template_args(
            "ms",
            "modelserve-system",
            "image.tag=1.2.3",
            "sidecar.clientLimits.maxHeadBytes=16384",
            "sidecar.clientLimits.maxHeaderFields=64",
            "sidecar.clientLimits.headTimeoutSeconds=10",
            "sidecar.clientLimits.bodyTimeoutSeconds=120",
            "sidecar.clientLimits.maxConnections=2048",
            "sidecar.clientLimits.bodyBudgetBytes=33554432",
            "operator.startupSeconds=900",
            "operator.resyncSeconds=30",
            "operator.clusterDomain=example.internal",
            "operator.metricsPort=9100",
            "operator.leaseSeconds=20",
            "engines.vllm.image=mirror.example/vllm-openai:v9",
            "engines.llamacpp.image=mirror.example/llama:b1",
            "modelPods.imagePullSecrets[0].name=mirror-credentials",
            "modelPods.imagePullSecrets[1].name=hub-mirror",
        ),
        # A fraction of a second too (--set would pass it as a string; a values file or --set-json as a number).
        "--set-json",
        "sidecar.drainSeconds=45.5",
    ).stdout
    env = literal_env(_operator_container(rendered))
    settings = Settings.from_env(env)
    assert settings == Settings(
        sidecar_image="ghcr.io/modelserve/modelserve:1.2.3",
        drain_seconds=45.5,
        startup_seconds=900,
        resync_seconds=30.0,
        cluster_domain="example.internal",
        engine_images={"vllm": "mirror.example/vllm-openai:v9", "llamacpp": "mirror.example/llama:b1"},
        metrics_port=9100,
        gateway_url="http://ms-modelserve-gateway.modelserve-system.svc.example.internal/v1",
        gateway_pod_namespace="modelserve-system",
        node_cache_url="http://ms-modelserve-nodecache.modelserve-system.svc.example.internal:8090",
        leader_election_lease="modelserve-system/ms-modelserve",
        lease_seconds=20.0,
        sidecar_max_head_bytes=16384,
        sidecar_max_header_fields=64,
        sidecar_head_timeout_seconds=10.0,
        sidecar_body_timeout_seconds=120.0,
        sidecar_max_connections=2048,
        sidecar_body_budget_bytes=33554432,
        image_pull_secrets=("mirror-credentials", "hub-mirror"),
    )
    assert all(name.startswith("MODELSERVE_") for name in env)


def test_gateway_is_hardened_and_reads_what_the_chart_sets(helm: Helm) -> None:
    rendered = helm(
        *template_args(
            "ms",
            "modelserve-system",
            "operator.watchNamespaces={b,a}",
            "gateway.routing=prefix-affinity",
            "gateway.holdSeconds=900",
            "gateway.maxHeldPerModel=32",
            "gateway.holdKeepAliveSeconds=10",
            "gateway.maxHeldUnverifiedPerModel=4",
            "gateway.maxHeldUnverifiedPerClient=1",
            "gateway.modelListAsks=8",
            "gateway.clientLimits.maxHeadBytes=16384",
            "gateway.clientLimits.maxHeaderFields=50",
            "gateway.clientLimits.headTimeoutSeconds=5",
            "gateway.clientLimits.bodyTimeoutSeconds=30",
            "gateway.clientLimits.maxConnections=1000",
            "gateway.clientLimits.bodyBudgetBytes=1048576",
            "gateway.drainSeconds=30",
            "gateway.workers=3",
        )
    ).stdout
    deployment = _deployment(rendered, "gateway")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "ms-modelserve-gateway"
    container = _gateway_container(rendered)
    assert container["command"] == ["modelserve-gateway"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The label the operator finds the gateway's pods by, to read what they hold.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[GATEWAY_LABEL] == "ms-modelserve-gateway"
    env = literal_env(container)
    # Its own pod, for the Event a certificate it cannot serve gets: from the downward API.
    fields = {var["name"]: var["valueFrom"]["fieldRef"]["fieldPath"] for var in container["env"] if "valueFrom" in var}
    assert fields == {
        "MODELSERVE_GATEWAY_OWN_POD": "metadata.name",
        "MODELSERVE_GATEWAY_OWN_NAMESPACE": "metadata.namespace",
    }
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert GatewaySettings.from_env(env) == GatewaySettings(
        namespaces=("a", "b"),
        routing="prefix-affinity",
        hold_seconds=900.0,
        max_held=32,
        hold_keepalive_seconds=10.0,
        drain_seconds=30.0,
        max_held_unverified=4,
        max_held_unverified_per_client=1,
        model_list_asks=8,
        max_head_bytes=16384,
        max_header_fields=50,
        head_timeout_seconds=5.0,
        body_timeout_seconds=30.0,
        max_connections=1000,
        body_budget_bytes=1048576,
        workers=3,
    )
    (service,) = [s for s in by_kind(rendered, "Service") if s["metadata"]["name"] == "ms-modelserve-gateway"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    operator_env = literal_env(_operator_container(rendered))
    assert (
        operator_env["MODELSERVE_GATEWAY_URL"] == "http://ms-modelserve-gateway.modelserve-system.svc.cluster.local/v1"
    )


def test_gateway_upstream_tls_mounts_the_ca_configmap_where_the_setting_points(helm: Helm) -> None:
    """gateway.upstreamTLS.caConfigMap: the ConfigMap's key mounted read-only as the file the gateway
    checks spec.tls sidecars against; without it, the setting unset (the system's trust store)."""
    sets = ("gateway.upstreamTLS.caConfigMap=model-ca", "gateway.upstreamTLS.caKey=bundle.pem")
    rendered = helm(*template_args("ms", "modelserve-system", *sets)).stdout
    pod = _deployment(rendered, "gateway")["spec"]["template"]["spec"]
    container = _gateway_container(rendered)
    settings = GatewaySettings.from_env(literal_env(container))
    assert settings.upstream_ca_file == Path("/etc/modelserve/upstream-ca/ca.crt")
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "upstream-ca"]
    assert mount == {"name": "upstream-ca", "mountPath": str(settings.upstream_ca_file.parent), "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "upstream-ca"]
    assert volume == {
        "name": "upstream-ca",
        "configMap": {"name": "model-ca", "items": [{"key": "bundle.pem", "path": "ca.crt"}]},
    }
    plain = GatewaySettings.from_env(
        literal_env(_gateway_container(helm(*template_args("ms", "modelserve-system")).stdout))
    )
    assert plain.upstream_ca_file is None


def test_gateway_tls_mounts_the_secret_and_says_https_everywhere(helm: Helm) -> None:
    """gateway.tls.secretName: the Secret mounted read-only where the setting points, the port (the
    container's, which the operator reads the scheme from, and the Service's) named https, the probes
    in HTTPS, status.gatewayEndpoint https://; and without it, none of that."""
    for port, url_port in ((80, ":80"), (443, "")):
        rendered = helm(
            *template_args(
                "ms", "modelserve-system", "gateway.tls.secretName=gateway-tls", f"gateway.service.port={port}"
            )
        ).stdout
        pod = _deployment(rendered, "gateway")["spec"]["template"]["spec"]
        container = _gateway_container(rendered)
        env = literal_env(container)
        settings = GatewaySettings.from_env(env)
        assert settings.tls_dir == Path("/etc/modelserve/gateway-tls")
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": str(settings.tls_dir), "readOnly": True}
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume == {"name": "tls", "secret": {"secretName": "gateway-tls"}}
        assert container["ports"] == [{"name": TLS_PORT_NAME, "containerPort": 8080, "protocol": "TCP"}]
        assert serves_tls({"spec": pod})  # what the operator reads it from
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
        (service,) = [s for s in by_kind(rendered, "Service") if s["metadata"]["name"] == "ms-modelserve-gateway"]
        assert service["spec"]["ports"] == [
            {"name": "https", "port": port, "targetPort": "https", "protocol": "TCP", "appProtocol": "https"}
        ]
        operator = Settings.from_env(literal_env(_operator_container(rendered)))
        assert operator.gateway_url == f"https://ms-modelserve-gateway.modelserve-system.svc.cluster.local{url_port}/v1"
    plain = helm(*template_args("ms", "modelserve-system")).stdout
    container = _gateway_container(plain)
    assert GatewaySettings.from_env(literal_env(container)).tls_dir is None
    assert [m["name"] for m in container["volumeMounts"]] == ["tmp"]
    assert container["ports"][0]["name"] == "http" and "scheme" not in container["livenessProbe"]["httpGet"]
    assert not serves_tls({"spec": _deployment(plain, "gateway")["spec"]["template"]["spec"]})
    (service,) = [s for s in by_kind(plain, "Service") if s["metadata"]["name"] == "ms-modelserve-gateway"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]


def test_gateway_exposure_renders_an_ingress_and_an_httproute_to_the_service_only_when_asked(helm: Helm) -> None:
    plain = helm(*template_args("ms", "x")).stdout
    assert not by_kind(plain, "Ingress") and not by_kind(plain, "HTTPRoute")
    sets = [
        "gateway.service.port=443",
        "gateway.service.annotations.networking\\.gke\\.io/load-balancer-type=Internal",
        "gateway.ingress.enabled=true",
        "gateway.ingress.className=nginx",
        "gateway.ingress.hosts={models.example.com}",
        "gateway.ingress.tls[0].secretName=models-tls",
        "gateway.ingress.tls[0].hosts={models.example.com}",
        "gateway.ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/proxy-buffering=off",
        "gateway.httpRoute.enabled=true",
        "gateway.httpRoute.parentRefs[0].name=platform",
        "gateway.httpRoute.parentRefs[0].namespace=gateway-system",
        "gateway.httpRoute.hostnames={models.example.com}",
    ]
    rendered = helm(*template_args("ms", "x", *sets)).stdout
    (service,) = [s for s in by_kind(rendered, "Service") if s["metadata"]["name"] == "ms-modelserve-gateway"]
    assert service["metadata"]["annotations"] == {"networking.gke.io/load-balancer-type": "Internal"}
    backend = {"service": {"name": "ms-modelserve-gateway", "port": {"number": 443}}}
    (ingress,) = by_kind(rendered, "Ingress")
    assert ingress["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/proxy-buffering": "off"}
    assert ingress["spec"] == {
        "ingressClassName": "nginx",
        "tls": [{"secretName": "models-tls", "hosts": ["models.example.com"]}],
        "rules": [
            {
                "host": "models.example.com",
                "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
            }
        ],
    }
    (route,) = by_kind(rendered, "HTTPRoute")
    assert route["spec"] == {
        "parentRefs": [{"name": "platform", "namespace": "gateway-system"}],
        "hostnames": ["models.example.com"],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"name": "ms-modelserve-gateway", "port": 443}],
                "timeouts": {"request": "3600s"},  # a generation outlasts an implementation's default
            }
        ],
    }
    refused = helm(*template_args("ms", "x", "gateway.httpRoute.enabled=true"), check=False)
    assert refused.returncode != 0 and "gateway.httpRoute.parentRefs" in refused.stderr, refused.stderr


def test_the_client_limits_the_chart_renders_by_default_are_the_programs_own(helm: Helm) -> None:
    # Helm reads a values file's numbers as floats: 67108864 rendered as "6.7108864e+07" unless it
    # is made an integer in the template, which the programs' settings would refuse.
    rendered = helm(*template_args("ms", "modelserve-system")).stdout
    gateway = GatewaySettings.from_env(literal_env(_gateway_container(rendered)))
    operator = Settings.from_env(literal_env(_operator_container(rendered)))
    sidecar_defaults = sidecar_contract.Settings.__dataclass_fields__
    for name in sidecar_contract.CLIENT_LIMITS:
        assert getattr(gateway, name) == getattr(GatewaySettings(), name), name
        assert operator.sidecar_limits[name] == sidecar_defaults[name].default, name


def test_gateway_reads_and_never_writes_nor_sees_secrets(helm: Helm) -> None:
    for scope in ((), ("operator.watchNamespaces={a,b}",)):
        rendered = helm(*template_args("ms", "modelserve-system", *scope)).stdout
        roles = [
            role
            for role in [*by_kind(rendered, "Role"), *by_kind(rendered, "ClusterRole")]
            if role["metadata"]["name"] == "ms-modelserve-gateway"
        ]
        assert len(roles) == (2 if scope else 1)
        for role in roles:
            assert role["rules"] == [
                {"apiGroups": ["serving.modelserve.dev"], "resources": ["modelservers"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            ]


def test_gateway_can_be_turned_off(helm: Helm) -> None:
    rendered = helm(*template_args("ms", "modelserve-system", "gateway.enabled=false")).stdout
    assert [d["metadata"]["name"] for d in by_kind(rendered, "Deployment")] == ["ms-modelserve"]
    assert not [s for s in by_kind(rendered, "Service") if "gateway" in s["metadata"]["name"]]
    operator_env = {var["name"] for var in _operator_container(rendered)["env"]}
    assert "MODELSERVE_GATEWAY_URL" not in operator_env and "MODELSERVE_GATEWAY_POD_NAMESPACE" not in operator_env


def test_operator_accepts_the_chart_arguments(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = helm(*template_args("ms", "x", "operator.watchNamespaces={a,b}", "operator.logLevel=debug")).stdout
    args = _operator_container(rendered)["args"]
    assert args == ["--liveness=http://0.0.0.0:8080/healthz", "--namespace=a", "--namespace=b", "--verbose"]
    seen: dict[str, Any] = {}
    monkeypatch.setattr(operator_main, "run", lambda *a: seen.update(call=a))  # parse only, run nothing
    operator_main.main(args)
    assert seen["call"][1:] == (("a", "b"), "http://0.0.0.0:8080/healthz", True)


def test_service_monitor_selects_the_operators_services(helm: Helm) -> None:
    rendered = helm(*template_args("ms", "monitoring", *EVERYTHING_ON)).stdout
    (monitor,) = [
        m for m in by_kind(rendered, "ServiceMonitor") if m["metadata"]["name"] == "ms-modelserve-modelservers"
    ]
    example = yaml.safe_load((REPO / "examples" / "lfm2-1.2b.yaml").read_text())
    example["metadata"]["namespace"] = "default"
    service = manifests.service(ModelServer.from_manifest(example))
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [port["name"] for port in service["spec"]["ports"]]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    # Prometheus's service-discovery label for the ModelServer's name label.
    source = "__meta_kubernetes_service_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", SELECTOR_LABEL)
    assert endpoint["relabelings"] == [{"sourceLabels": [source], "targetLabel": "modelserver"}]


def _sample_names(family: Metric) -> list[str]:
    """The names a scrape shows for a metric family, whether or not it has samples yet."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
    return [family.name + suffix for suffix in suffixes]


def test_dashboard_charts_series_the_sidecar_exports(helm: Helm) -> None:
    rendered = helm(*template_args("ms", "monitoring", *EVERYTHING_ON)).stdout
    (config_map,) = by_kind(rendered, "ConfigMap")
    dashboard = json.loads(config_map["data"]["modelserve.json"])
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exported = {name for family in SidecarMetrics().registry.collect() for name in _sample_names(family)}
    used = {name for expr in exprs for name in re.findall(r"modelserve_sidecar_\w+", expr)}
    assert used and used <= exported, used - exported
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {
        "Requests",
        "In-flight requests",
        "Latency (completions)",
        "Time to first byte (completions)",
        "Tokens per second",
        "KV-cache use",
    } <= titles
    kv_cache = next(panel for panel in dashboard["panels"] if panel["title"] == "KV-cache use")
    kv_metrics = {re.search(r"\((\S+?)\{", target["expr"]).group(1) for target in kv_cache["targets"]}
    # llama.cpp exports no KV-cache gauge (tests/engines/test_engine_source.py holds every engine series
    # the dashboard reads to what the pinned version exports).
    assert kv_metrics == {"vllm:kv_cache_usage_perc", "sglang:token_usage"}
    # Each engine's own series, by the prefix its module declares, and no series of an unknown one.
    engine_series = {name for expr in exprs for name in re.findall(r"\b([a-z]+:\w+)\{", expr)}
    assert {name.split(":")[0] + ":" for name in engine_series} == {e.metric_prefix for e in ENGINES.values()}


def test_inference_pools_are_off_by_default_and_on_bring_their_settings_rules_and_optional_crd(helm: Helm) -> None:
    default = helm(*template_args("ms", "modelserve-system")).stdout
    # Off: no setting, no rule, no CRD (nothing changes for a release without pools).
    operator = _deployment(default, "operator")["spec"]["template"]["spec"]["containers"][0]
    assert not [e for e in operator["env"] if "POOL" in e["name"] or "PICKER" in e["name"]]
    granted = {r for role in by_kind(default, "ClusterRole") for rule in role["rules"] for r in rule["resources"]}
    assert not granted & {"inferencepools", "endpointslices"}
    assert [c["spec"]["group"] for c in by_kind(default, "CustomResourceDefinition")] == ["serving.modelserve.dev"]
    on = helm(*template_args("ms", "modelserve-system", "inferencePools.enabled=true")).stdout
    env = {
        e["name"]: e.get("value")
        for e in _deployment(on, "operator")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MODELSERVE_INFERENCE_POOLS"] == "true"
    # The chart's gateway serves the picker, by default.
    assert env["MODELSERVE_PICKER_SERVICE"] == "modelserve-system/ms-modelserve-gateway"
    assert (env["MODELSERVE_PICKER_PORT"], env["MODELSERVE_PICKER_FAILURE_MODE"]) == ("9002", "FailClose")
    # ... on the port the pools lead to: its setting, its container's port and its Service's (h2c).
    gateway = _gateway_container(on)
    assert GatewaySettings.from_env(literal_env(gateway)).picker_port == 9002
    assert {"name": "picker", "containerPort": 9002, "protocol": "TCP"} in gateway["ports"]
    (service,) = [s for s in by_kind(on, "Service") if s["metadata"]["name"] == "ms-modelserve-gateway"]
    assert {
        "name": "picker",
        "port": 9002,
        "targetPort": "picker",
        "protocol": "TCP",
        "appProtocol": "kubernetes.io/h2c",
    } in service["spec"]["ports"]
    assert GatewaySettings.from_env(literal_env(_gateway_container(default))).picker_port == 0
    elsewhere = helm(
        *template_args("ms", "x", "inferencePools.enabled=true", "inferencePools.picker.service=p/epp")
    ).stdout
    assert GatewaySettings.from_env(literal_env(_gateway_container(elsewhere))).picker_port == 0
    (role,) = [r for r in by_kind(on, "ClusterRole") if r["metadata"]["name"] == "ms-modelserve"]
    rules = {
        (group, resource): rule["verbs"]
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules[("inference.networking.k8s.io", "inferencepools")] == [
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "update",
    ]
    assert rules[("discovery.k8s.io", "endpointslices")] == ["get", "list", "watch", "create", "patch", "update"]
    assert "delete" in rules[("apps", "deployments")] and "delete" not in rules[("discovery.k8s.io", "endpointslices")]
    # The CRD is the pinned module's, only when asked, kept on uninstall.
    crds = [c["metadata"]["name"] for c in by_kind(on, "CustomResourceDefinition")]
    assert crds == ["modelservers.serving.modelserve.dev"]
    with_crd = helm(*template_args("ms", "x", "inferencePools.enabled=true", "inferencePools.crd.enabled=true")).stdout
    (pool_crd,) = [
        c for c in by_kind(with_crd, "CustomResourceDefinition") if c["spec"]["group"] != "serving.modelserve.dev"
    ]
    shipped = yaml.safe_load((CHART / "files" / "inferencepool-crd.yaml").read_text())
    assert (
        pool_crd["spec"] == shipped["spec"] and pool_crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    )
    # Watching namespaces: the picker's namespace (the release's) grants reads of its Service and slices only.
    watched = helm(*template_args("ms", "x", "inferencePools.enabled=true", "operator.watchNamespaces={a}")).stdout
    (picker,) = [r for r in by_kind(watched, "Role") if r["metadata"]["name"] == "ms-modelserve-picker"]
    assert picker["metadata"]["namespace"] == "x"
    assert [(r["resources"], r["verbs"]) for r in picker["rules"]] == [
        (["services"], ["list", "watch"]),
        (["endpointslices"], ["list", "watch"]),
    ]
    # No gateway: the picker must be named.
    refused = helm(*template_args("ms", "x", "inferencePools.enabled=true", "gateway.enabled=false"), check=False)
    assert refused.returncode != 0 and "inferencePools.picker.service" in refused.stderr


def test_the_shipped_inference_pool_crd_is_the_pinned_modules() -> None:
    cached = default_cache() / "inference-extension" / "inference.networking.k8s.io_inferencepools.yaml"
    assert cached.is_file(), "run hack/fetch-inference-extension.sh"
    assert (CHART / "files" / "inferencepool-crd.yaml").read_bytes() == cached.read_bytes(), (
        "charts/modelserve/files/inferencepool-crd.yaml differs from hack/fetch-inference-extension.sh's pin: copy it"
    )
