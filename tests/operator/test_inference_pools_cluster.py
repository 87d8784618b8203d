"""MODELSERVE_INFERENCE_POOLS against a real API server with the Gateway API Inference Extension's
InferencePool CRD (hack/fetch-inference-extension.sh): what the API server refuses of a pool; the
operator's one pool per namespace (selector, targetPorts, the picker's Service and mirrored
EndpointSlice, owners, a gateway's status.parents on the ModelServer, gone with the last
ModelServer); a pool it does not own left alone and named; the CRD absent, then installed; pools off,
nothing. A control plane of its own (KWOK, one node of 8 GPUs): these tests run their own operators,
which must not meet the session's. No gateway serves these pools here: a test writes status.parents
as one would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.testdata import CRD_PATH
from modelserve.api import pools
from modelserve.contracts.operator_settings import Settings
from modelserve_sandbox.cluster import Cluster, default_cache
from modelserve_sandbox.operator_process import running_operator
from tests.helpers.operator_cluster import RESYNC_SECONDS, OperatorView

POOL_CRD = default_cache() / "inference-extension" / "inference.networking.k8s.io_inferencepools.yaml"
POOL_CRD_NAME = "inferencepools.inference.networking.k8s.io"
POOL_LABEL = "serving.modelserve.dev/inference-pool"
PICKER_NAMESPACE = "modelserve"
PICKER = f"{PICKER_NAMESPACE}/modelserve-gateway"
ON = {"MODELSERVE_INFERENCE_POOLS": "true", "MODELSERVE_PICKER_SERVICE": PICKER}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    assert POOL_CRD.is_file(), "run hack/fetch-inference-extension.sh"
    with Cluster(tmp_path_factory.mktemp("pools"), gpu_nodes=1, cpu_nodes=0, real_node=False, lws=False) as running:
        running.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        running.wait_established()
        running.create_namespace(PICKER_NAMESPACE)
        # The picker's Service as the chart's gateway would have it, its endpoints written by hand
        # (no picker runs here): the operator mirrors the ready ones beside each pool.
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "modelserve-gateway", "namespace": PICKER_NAMESPACE},
            "spec": {"ports": [{"name": "http", "port": 80}, {"name": "epp", "port": 9002, "targetPort": 9003}]},
        }
        endpoints = [
            {"addresses": ["10.20.0.7"], "conditions": {"ready": True}},
            {"addresses": ["10.20.0.8"], "conditions": {"ready": False}},
        ]
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "modelserve-gateway-1",
                "namespace": PICKER_NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": "modelserve-gateway",
                    "endpointslice.kubernetes.io/managed-by": "test",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "epp", "port": 9003}],
            "endpoints": endpoints,
        }
        running.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, slice_]})
        )
        yield running


@pytest.fixture
def pool_crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(POOL_CRD))
    cluster.wait_established(POOL_CRD_NAME)


def _model_server(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": {"model": "LiquidAI/LFM2-350M", "auth": {"mode": "public"}, **spec},
    }


def _view(cluster: Cluster, namespace: str, log: Path) -> OperatorView:
    cluster.create_namespace(namespace)
    return OperatorView(cluster, namespace, log)


def _dry_run(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """The API server's refusal of a server-side dry-run create ("" when it takes it)."""
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False)
    return "" if result.returncode == 0 else result.stderr


def test_the_api_server_takes_the_operators_pool_and_refuses_broken_ones(cluster: Cluster, pool_crd: None) -> None:
    settings = Settings(inference_pools=True, picker_service=PICKER)
    pool = pools.inference_pool("default", [], settings)
    pool["metadata"].pop("ownerReferences")
    assert _dry_run(cluster, pool) == ""

    def broken(change: Any) -> dict[str, Any]:
        body = json.loads(json.dumps(pool))
        change(body["spec"])
        return body

    refused = {
        "spec.targetPorts": broken(lambda spec: spec.update(targetPorts=[])),
        "spec.selector": broken(lambda spec: spec.pop("selector")),
        "port is required when kind is 'Service'": broken(lambda spec: spec["endpointPickerRef"].pop("port")),
        "spec.endpointPickerRef.failureMode": broken(
            lambda spec: spec["endpointPickerRef"].update(failureMode="Sometimes")
        ),
        "port number must be unique": broken(lambda spec: spec.update(targetPorts=[{"number": 8080}] * 2)),
        "spec.targetPorts[0].number": broken(lambda spec: spec.update(targetPorts=[{"number": 70000}])),
        "spec.appProtocol": broken(lambda spec: spec.update(appProtocol="https")),
    }
    for field, body in refused.items():
        said = _dry_run(cluster, body)
        assert said and field in said, f"{field}: {said or 'taken'}"


def _pool(ops: OperatorView) -> dict[str, Any] | None:
    return ops.get("inferencepool", "modelserve")


def test_the_operator_keeps_one_pool_for_the_namespaces_models(
    cluster: Cluster, pool_crd: None, tmp_path: Path
) -> None:
    with running_operator({**cluster.operator_env, **ON}, tmp_path, RESYNC_SECONDS) as (process, log):
        ops = _view(cluster, "team", log)
        ops.apply(_model_server("alpha"))
        ops.apply(_model_server("beta", gpuMemoryUtilization=0.8))
        for name in ("alpha", "beta"):
            ops.wait_ready(name)
            applied = ops.wait_reason(name, "InferencePool", "True", "Applied")
            assert "InferencePool team/modelserve" in applied["message"] and "1 ready" in applied["message"]
        pool = _pool(ops)
        assert pool is not None
        assert pool["spec"]["selector"] == {"matchLabels": {POOL_LABEL: "modelserve"}}
        assert pool["spec"]["targetPorts"] == [{"number": 8080}]
        assert pool["spec"]["endpointPickerRef"] == {
            "group": "",
            "kind": "Service",
            "name": "modelserve-epp",
            "port": {"number": 9002},
            "failureMode": "FailClose",
        }
        ops.wait(lambda: len((_pool(ops) or {})["metadata"].get("ownerReferences") or []) == 2, "both own the pool")
        # Every serving pod carries the selector's label (and so is in the pool).
        pods = json.loads(ops.kubectl("get", "pods", "-l", f"{POOL_LABEL}=modelserve", "-o", "json").stdout)["items"]
        assert {p["metadata"]["labels"]["serving.modelserve.dev/modelserver"] for p in pods} == {"alpha", "beta"}
        # The picker, reachable from the pool's namespace: a selectorless Service and the picker's ready endpoint.
        service = ops.get("service", "modelserve-epp") or {}
        assert "selector" not in service["spec"] and service["spec"]["ports"][0]["port"] == 9002
        slice_ = ops.get("endpointslice", "modelserve-epp") or {}
        assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "modelserve-epp"
        assert [e["addresses"] for e in slice_["endpoints"]] == [["10.20.0.7"]]
        assert slice_["ports"][0]["port"] == 9003

        # A gateway accepts the pool: what it writes shows on every ModelServer of the namespace.
        parents = {
            "status": {
                "parents": [
                    {
                        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference"},
                        "conditions": [
                            {
                                "type": "Accepted",
                                "status": "True",
                                "reason": "Accepted",
                                "message": "",
                                "lastTransitionTime": "2026-12-01T00:00:00Z",
                            },
                            {
                                "type": "ResolvedRefs",
                                "status": "True",
                                "reason": "ResolvedRefs",
                                "message": "",
                                "lastTransitionTime": "2026-12-01T00:00:00Z",
                            },
                        ],
                    }
                ]
            }
        }
        ops.kubectl(
            "patch", "inferencepool", "modelserve", "--subresource=status", "--type=merge", "-p", json.dumps(parents)
        )

        def parents_shown(name: str) -> bool:
            status = ((ops.get("modelserver", name) or {}).get("status") or {}).get("inferencePool") or {}
            return [(p["name"], p["accepted"], p["resolvedRefs"]) for p in status.get("parents", [])] == [
                ("inference", "True", "True")
            ]

        for name in ("alpha", "beta"):
            ops.wait(lambda name=name: parents_shown(name), f"{name} shows the pool's parent")
        assert "Gateway inference: Accepted=True" in ops.condition("alpha", "InferencePool")["message"]

        # Deleted by the garbage collector with the namespace's last ModelServer, not before.
        ops.kubectl("delete", "modelserver", "alpha")
        ops.wait(
            lambda: (
                [ref["name"] for ref in (_pool(ops) or {}).get("metadata", {}).get("ownerReferences", [])] == ["beta"]
            ),
            "beta alone owns the pool",
        )
        ops.kubectl("delete", "modelserver", "beta")
        ops.wait(lambda: _pool(ops) is None and ops.get("service", "modelserve-epp") is None, "the pool gone")
        assert process.poll() is None


def test_a_pool_the_operator_does_not_own_is_left_alone_and_named(
    cluster: Cluster, pool_crd: None, tmp_path: Path
) -> None:
    with running_operator({**cluster.operator_env, **ON}, tmp_path, RESYNC_SECONDS) as (process, log):
        ops = _view(cluster, "theirs", log)
        foreign = {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "modelserve"},
            "spec": {
                "selector": {"matchLabels": {"app": "theirs"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "their-epp", "port": {"number": 9002}},
            },
        }
        ops.apply(foreign)
        before = _pool(ops) or {}
        ops.apply(_model_server("gamma"))
        conflict = ops.wait_reason("gamma", "InferencePool", "False", "InferencePoolConflict")
        assert "InferencePool theirs/modelserve exists and is not the operator's" in conflict["message"]
        warnings = [e for e in ops.events("gamma") if (e["type"], e["reason"]) == ("Warning", "InferencePoolConflict")]
        assert warnings and "theirs/modelserve" in warnings[0]["message"]
        # The model serves all the same; their pool is as they wrote it, and nothing was made beside it.
        ops.wait_ready("gamma")
        after = _pool(ops) or {}
        assert (
            after["spec"] == before["spec"]
            and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        )
        assert ops.get("service", "modelserve-epp") is None
        assert process.poll() is None


def test_without_the_crd_the_model_says_so_then_gets_its_pool_once_installed(cluster: Cluster, tmp_path: Path) -> None:
    cluster.kubectl("delete", "crd", POOL_CRD_NAME, "--ignore-not-found", "--wait=true")
    with running_operator({**cluster.operator_env, **ON}, tmp_path, RESYNC_SECONDS) as (process, log):
        ops = _view(cluster, "early", log)
        ops.apply(_model_server("delta"))
        missing = ops.wait_reason("delta", "InferencePool", "False", "InferencePoolMissing")
        assert "serves no inference.networking.k8s.io/v1 InferencePool" in missing["message"]
        warnings = [e for e in ops.events("delta") if (e["type"], e["reason"]) == ("Warning", "InferencePoolMissing")]
        assert warnings
        ops.wait_ready("delta")  # the model serves without its pool
        cluster.kubectl("apply", "--server-side", "-f", str(POOL_CRD))
        cluster.wait_established(POOL_CRD_NAME)
        ops.wait_reason("delta", "InferencePool", "True", "Applied")
        assert _pool(ops) is not None
        assert process.poll() is None


def test_with_pools_off_nothing_is_made(cluster: Cluster, pool_crd: None, tmp_path: Path) -> None:
    with running_operator(cluster.operator_env, tmp_path, RESYNC_SECONDS) as (process, log):
        ops = _view(cluster, "plain", log)
        ops.apply(_model_server("epsilon"))
        ms = ops.wait_ready("epsilon")
        assert "inferencePool" not in ms["status"]
        assert not ops.condition("epsilon", "InferencePool")
        assert _pool(ops) is None and ops.get("service", "modelserve-epp") is None
        template = (ops.get("deployment", "epsilon") or {})["spec"]["template"]
        assert POOL_LABEL not in template["metadata"]["labels"]
        assert process.poll() is None
