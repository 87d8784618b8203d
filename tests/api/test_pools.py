"""The namespace's InferencePool and its picker's Service and EndpointSlice, rendered (api/pools.py);
the pods' pool label, only with pools on."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from harness.testdata import examples
from modelserve.api import manifests, pools
from modelserve.api.spec import ModelServer
from modelserve.contracts.env import ConfigError, read_env
from modelserve.contracts.names import INFERENCE_POOL_LABEL, LWS_KIND
from modelserve.contracts.operator_settings import Settings
from modelserve.contracts.sidecar import LISTEN_PORT

OFF = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0")
ON = dataclasses.replace(OFF, inference_pools=True, picker_service="modelserve/modelserve-gateway")
UID = "00000000-0000-4000-8000-000000000000"
OWNERS = [pools.Owner("a", "uid-a"), pools.Owner("b", "uid-b")]


def _example(name: str, **spec: Any) -> ModelServer:
    manifest = examples()[name]
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": "team", "uid": UID}}
    return ModelServer.from_manifest({**manifest, "spec": {**manifest["spec"], **spec}})


def test_with_pools_off_no_pod_template_changes() -> None:
    for name in examples():
        ms = _example(name)
        for template in manifests.pod_templates(manifests.workload(ms, OFF)):
            assert INFERENCE_POOL_LABEL not in template["metadata"]["labels"]


def test_with_pools_on_only_the_pods_that_serve_http_carry_the_pool_label() -> None:
    deployment = manifests.workload(_example("lfm2-1.2b"), ON)
    assert deployment["spec"]["template"]["metadata"]["labels"][INFERENCE_POOL_LABEL] == pools.POOL_NAME
    group = manifests.workload(_example("lfm2-24b-a2b-16gpu"), ON)
    assert group["kind"] == LWS_KIND
    leader, worker = manifests.pod_templates(group)
    assert leader["metadata"]["labels"][INFERENCE_POOL_LABEL] == pools.POOL_NAME
    assert INFERENCE_POOL_LABEL not in worker["metadata"]["labels"]  # no sidecar: serves no HTTP
    # spec.tls: its sidecars serve HTTPS, which a pool (appProtocol http) does not reach.
    tls = manifests.workload(_example("lfm2-1.2b", tls={"secretName": "cert"}), ON)
    assert INFERENCE_POOL_LABEL not in tls["spec"]["template"]["metadata"]["labels"]


def test_the_pool_selects_the_labelled_pods_on_the_sidecar_port_and_names_the_local_picker() -> None:
    pool = pools.inference_pool("team", OWNERS, ON)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["metadata"]["name"] == "modelserve" and pool["metadata"]["namespace"] == "team"
    assert pool["spec"]["selector"] == {"matchLabels": {INFERENCE_POOL_LABEL: "modelserve"}}
    assert pool["spec"]["targetPorts"] == [{"number": LISTEN_PORT}] == [{"number": 8080}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "modelserve-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    # Owned by every ModelServer of the namespace, none the controller: gone with the last one.
    refs = pool["metadata"]["ownerReferences"]
    assert [(ref["name"], ref["uid"]) for ref in refs] == [("a", "uid-a"), ("b", "uid-b")]
    assert not any(ref.get("controller") or ref.get("blockOwnerDeletion") for ref in refs)
    assert pools.ours(pool)
    fail_open = dataclasses.replace(ON, picker_failure_mode="FailOpen", picker_port=9100)
    ref = pools.inference_pool("team", OWNERS, fail_open)["spec"]["endpointPickerRef"]
    assert (ref["failureMode"], ref["port"]) == ("FailOpen", {"number": 9100})


def test_owners_are_the_namespaces_modelservers_not_being_deleted() -> None:
    bodies = [
        {"metadata": {"name": "b", "uid": "2"}},
        {"metadata": {"name": "a", "uid": "1"}},
        {"metadata": {"name": "c", "uid": "3", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
    ]
    assert pools.owners(bodies) == [pools.Owner("a", "1"), pools.Owner("b", "2")]


PICKER_SERVICE = {
    "metadata": {"name": "modelserve-gateway", "namespace": "modelserve"},
    "spec": {"ports": [{"name": "http", "port": 80}, {"name": "epp", "port": 9002, "targetPort": 9003}]},
}


def _slice(name: str, endpoints: list[tuple[str, bool]], port: int = 9003, kind: str = "IPv4") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "modelserve"},
        "addressType": kind,
        "ports": [{"name": "http", "port": 8080}, {"name": "epp", "port": port}],
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": ready}, "nodeName": "n1", "targetRef": {"name": "p"}}
            for address, ready in endpoints
        ],
    }


def test_the_picker_slice_mirrors_the_pickers_ready_endpoints_on_its_port() -> None:
    slices = [_slice("gw-b", [("10.0.0.2", True), ("10.0.0.3", False)]), _slice("gw-a", [("10.0.0.1", True)])]
    picker = pools.picker_endpoints(ON, PICKER_SERVICE, slices)
    assert picker.problem == "" and picker.port == 9003
    body = pools.picker_slice("team", OWNERS, picker)
    assert body["metadata"]["labels"]["kubernetes.io/service-name"] == "modelserve-epp"
    # Never the EndpointSlice controller's: it would take the slice over.
    assert body["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "modelserve-operator"
    assert body["addressType"] == "IPv4"
    assert body["endpoints"] == [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "nodeName": "n1"},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": True}, "nodeName": "n1"},
    ]
    assert body["ports"] == [{"name": "grpc", "port": 9003, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}]
    service = pools.picker_service("team", OWNERS, ON)
    assert "selector" not in service["spec"]  # selectorless: its endpoints are the slice's
    assert service["spec"]["ports"] == [
        {"name": "grpc", "port": 9002, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}
    ]


@pytest.mark.parametrize(
    ("service", "slices", "problem"),
    [
        (None, [], "the picker Service modelserve/modelserve-gateway was not found"),
        ({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}]}}, [], "has no port 9002"),
        (PICKER_SERVICE, [], "has no ready endpoints"),
        (PICKER_SERVICE, [_slice("gw", [("10.0.0.1", False)])], "has no ready endpoints"),
    ],
)
def test_a_picker_without_ready_endpoints_says_why(
    service: dict[str, Any] | None, slices: list[dict[str, Any]], problem: str
) -> None:
    picker = pools.picker_endpoints(ON, service, slices)
    assert problem in picker.problem and picker.endpoints == ()
    assert pools.picker_slice("team", OWNERS, picker)["endpoints"] == []


def test_the_pool_status_summarises_its_parents() -> None:
    assert pools.pool_status(None).parents == []
    assert "no Gateway" in pools.parents_summary(pools.pool_status(None))
    pool = {
        "status": {
            "parents": [
                {
                    "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference"},
                    "controllerName": "example.net/gateway",
                    "conditions": [
                        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
                        {"type": "ResolvedRefs", "status": "False", "reason": "InvalidExtensionRef", "message": "no"},
                    ],
                }
            ]
        }
    }
    status = pools.pool_status(pool)
    parent = status.parents[0]
    assert (parent.name, parent.accepted, parent.resolved_refs, parent.message) == ("inference", "True", "False", "no")
    assert parent.controller_name == "example.net/gateway"
    assert pools.parents_summary(status) == "Gateway inference: Accepted=True, ResolvedRefs=False"


def test_pools_need_the_picker_service() -> None:
    with pytest.raises(ConfigError, match="MODELSERVE_PICKER_SERVICE is required"):
        read_env(Settings, {"MODELSERVE_INFERENCE_POOLS": "true"})
    with pytest.raises(ConfigError, match="MODELSERVE_PICKER_SERVICE"):
        read_env(Settings, {"MODELSERVE_INFERENCE_POOLS": "true", "MODELSERVE_PICKER_SERVICE": "no-slash"})
    with pytest.raises(ConfigError, match="MODELSERVE_PICKER_FAILURE_MODE"):
        read_env(Settings, {"MODELSERVE_PICKER_FAILURE_MODE": "Sometimes"})
    settings = read_env(Settings, {"MODELSERVE_INFERENCE_POOLS": "true", "MODELSERVE_PICKER_SERVICE": "ms/gw"})
    assert (settings.inference_pools, settings.picker_service, settings.picker_port) == (True, "ms/gw", 9002)
    assert read_env(Settings, {}).inference_pools is False
