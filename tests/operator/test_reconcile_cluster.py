"""The operator against the real control plane: create, update, drift repair, cascade, status, no-op."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import time
from typing import Any

from harness.testdata import EXAMPLES_DIR, examples
from modelserve.engines import vllm
from tests.helpers.operator_cluster import RESYNC_SECONDS, OperatorView

SMALL = {
    "apiVersion": "serving.modelserve.dev/v1alpha1",
    "kind": "ModelServer",
    "metadata": {"name": "small"},
    "spec": {"model": "LiquidAI/LFM2-350M", "maxModelLen": 2048},
}


SERVICE_PORTS = [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]


def _small(**spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(SMALL)
    manifest["spec"].update(spec)
    return manifest


def _engine(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _resource_versions(ops: OperatorView, *objects: tuple[str, str]) -> dict[tuple[str, str], str]:
    return {obj: (ops.get(*obj) or {})["metadata"]["resourceVersion"] for obj in objects}


def test_create_makes_owned_children_and_reports_ready(ops: OperatorView) -> None:
    ops.apply(examples()["lfm2-1.2b"])
    ms = ops.wait_ready("lfm2-1-2b")
    status = ms["status"]
    assert status["endpoint"] == f"http://lfm2-1-2b.{ops.namespace}.svc.cluster.local/v1"
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)  # min 1 + buffer 1

    deployment = ops.get("deployment", "lfm2-1-2b")
    service = ops.get("service", "lfm2-1-2b")
    secret = ops.get("secret", "lfm2-1-2b-api-keys")
    assert deployment and service and secret
    for child in (deployment, service, secret):
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("ModelServer", ms["metadata"]["uid"], True)
    assert _engine(deployment)["args"][:2] == ["LiquidAI/LFM2-1.2B", "--served-model-name"]
    assert service["spec"]["ports"][0]["port"] == 80
    assert base64.b64decode(secret["data"]["api-key"]).startswith(b"msk-")
    shown = ops.kubectl("get", "deployment", "lfm2-1-2b", "-o", "json", "--show-managed-fields").stdout
    fields = json.loads(shown)["metadata"]["managedFields"]
    assert {entry["manager"] for entry in fields if entry["operation"] == "Apply"} == {"modelserve-operator"}

    events = {(e["type"], e["reason"]) for e in ops.events("lfm2-1-2b")}
    assert ("Normal", "Ready") in events and ("Normal", "Complete") in events
    table = ops.kubectl("get", "ms").stdout
    assert "lfm2-1-2b" in table and "True" in table and "LiquidAI/LFM2-1.2B" in table


def test_spec_change_rolls_the_deployment_and_keeps_the_key(ops: OperatorView) -> None:
    ops.apply(_small())
    ops.wait_ready("small")
    before = ops.get("deployment", "small")
    key = (ops.get("secret", "small-api-keys") or {})["data"]
    assert before

    ops.apply(_small(maxModelLen=4096))
    ms = ops.wait_ready("small", generation=2)
    after = ops.get("deployment", "small")
    assert after and after["metadata"]["generation"] > before["metadata"]["generation"]
    args = _engine(after)["args"]
    assert args[args.index("--max-model-len") + 1] == "4096"
    revisions = ops.kubectl("get", "replicasets", "-l", "serving.modelserve.dev/modelserver=small", "-o", "name")
    assert len(revisions.stdout.split()) == 2  # a new ReplicaSet: the pods rolled
    assert ms["status"]["conditions"][0]["observedGeneration"] == 2
    assert (ops.get("secret", "small-api-keys") or {})["data"] == key


def test_what_the_spec_no_longer_asks_for_leaves_the_deployment(ops: OperatorView) -> None:
    ops.apply(_small(nodeSelector={"pool": "a100"}, env=[{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]))
    ops.wait(lambda: ops.get("deployment", "small"), "the Deployment")
    ops.apply(
        {**_small(), "spec": {"model": "LiquidAI/LFM2-350M", "profile": "low-latency", "auth": {"mode": "public"}}}
    )

    def switched() -> bool:
        deployment = ops.get("deployment", "small")
        return bool(deployment) and _engine(deployment)["image"].startswith("lmsysorg/sglang")

    ops.wait(switched, "the Deployment to switch to SGLang")
    pod = (ops.get("deployment", "small") or {})["spec"]["template"]["spec"]
    volumes = [volume["name"] for volume in pod["volumes"]]
    assert "nodeSelector" not in pod and volumes == ["dshm", "hub-cache", "engine-home", "engine-cache", "engine-tmp"]
    # The user's VLLM_LOGGING_LEVEL is gone; what remains is the operator's own for SGLang.
    engine_env = [var["name"] for var in pod["containers"][0]["env"]]
    non_root = ["HOME", "USER", "XDG_CACHE_HOME", "TMPDIR"]
    assert engine_env == ["HF_HOME", *non_root, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "DISABLE_OPENAPI_DOC"]
    assert "MODELSERVE_KEYS_DIR" not in {var["name"] for var in pod["containers"][1]["env"]}
    ops.wait_ready("small", generation=2)


def test_deleted_and_edited_children_are_restored(ops: OperatorView) -> None:
    ops.apply(_small())
    ops.wait_ready("small")
    deployment_uid = (ops.get("deployment", "small") or {})["metadata"]["uid"]
    key = (ops.get("secret", "small-api-keys") or {})["data"]["api-key"]

    ops.kubectl("delete", "deployment", "small", "--wait=false")
    ops.wait(
        lambda: (ops.get("deployment", "small") or {}).get("metadata", {}).get("uid") not in (None, deployment_uid),
        "the Deployment to be recreated",
    )
    ops.kubectl("scale", "deployment", "small", "--replicas=3")
    image_edit = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:1"}]
    ops.kubectl("patch", "deployment", "small", "--type=json", "-p", json.dumps(image_edit))

    def restored() -> bool:
        deployment = ops.get("deployment", "small")
        return (
            bool(deployment)
            and deployment["spec"]["replicas"] == 1
            and _engine(deployment)["image"] == vllm.ENGINE.image
        )

    ops.wait(restored, "the edited Deployment to be restored")

    ops.kubectl("delete", "service", "small")
    ops.wait(lambda: ops.get("service", "small"), "the Service to be recreated")
    # What `kubectl edit` makes of a renumbered port: a new list item, still named http.
    renumbered = {"spec": {"ports": [{"name": "http", "port": 81}]}}
    ops.kubectl("patch", "service", "small", "--type=merge", "-p", json.dumps(renumbered))
    ops.wait(lambda: (ops.get("service", "small") or {})["spec"]["ports"] == SERVICE_PORTS, "the Service port back")

    # The Secret watch sees the key Secret go: the operator makes a new one, with a new key.
    ops.kubectl("delete", "secret", "small-api-keys")
    ops.wait(lambda: ops.get("secret", "small-api-keys"), "the key Secret to be recreated", timeout=10 * RESYNC_SECONDS)
    assert (ops.get("secret", "small-api-keys") or {})["data"]["api-key"] != key
    ops.wait_ready("small")


def test_deleting_the_modelserver_deletes_its_children(ops: OperatorView) -> None:
    ops.apply(_small())
    ops.wait_ready("small")
    ops.kubectl("delete", "modelserver", "small")
    children = (("deployment", "small"), ("service", "small"), ("secret", "small-api-keys"))
    ops.wait(lambda: not any(ops.get(*child) for child in children), "the garbage collector to delete the children")
    selector = "serving.modelserve.dev/modelserver=small"
    ops.wait(lambda: not ops.kubectl("get", "pods", "-l", selector, "-o", "name").stdout.strip(), "the pods to go")


def test_insufficient_gpu_is_reported_then_clears(ops: OperatorView) -> None:
    # The 16-GPU example on one node: no node has 16 GPUs.
    manifest = copy.deepcopy(examples()["lfm2-24b-a2b-16gpu"])
    del manifest["spec"]["nodes"]
    name = manifest["metadata"]["name"]
    ops.apply(manifest)
    degraded = ops.wait_reason(name, "Degraded", "True", "InsufficientGPU")
    assert "Insufficient nvidia.com/gpu" in degraded["message"] and "16" in degraded["message"]
    ms = ops.get("modelserver", name) or {}
    assert ms["status"]["phase"] == "Degraded" and ops.condition(name, "Ready")["reason"] == "InsufficientGPU"
    assert "InsufficientGPU" in ops.kubectl("get", "ms", name).stdout
    warnings = [e for e in ops.events(name) if (e["type"], e["reason"]) == ("Warning", "InsufficientGPU")]
    assert warnings and "Insufficient nvidia.com/gpu" in warnings[0]["message"]

    manifest = copy.deepcopy(manifest)
    manifest["spec"]["gpus"] = 1
    ops.apply(manifest)
    ops.wait_ready(name, generation=2)
    assert ops.condition(name, "Degraded")["reason"] == "AsExpected"
    assert any((e["type"], e["reason"]) == ("Normal", "AsExpected") for e in ops.events(name))


def test_ready_pods_without_their_service_are_not_ready(ops: OperatorView) -> None:
    # A quota that admits no Service: the API server refuses it as it refuses a full Service range.
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-services"}}
    quota["spec"] = {"hard": {"services": "0"}}
    ops.apply(quota)
    ops.apply(_small(auth={"mode": "public"}))
    ops.wait(lambda: (ops.get("deployment", "small") or {}).get("status", {}).get("readyReplicas") == 1, "the pod")
    ready = ops.wait_reason("small", "Ready", "False", "ApplyFailed")
    assert ready["message"].startswith("Service small was refused:") and "exceeded quota" in ready["message"]
    assert ops.get("service", "small") is None
    ms = ops.get("modelserver", "small") or {}
    assert ms["status"]["phase"] == "Degraded" and ms["status"]["readyReplicas"] == 1
    assert "ApplyFailed" in ops.kubectl("get", "ms", "small").stdout

    ops.kubectl("delete", "resourcequota", "no-services")
    ops.wait_ready("small")  # the next resync creates the Service
    assert ops.get("service", "small") is not None


def test_a_deleted_key_secret_comes_back_with_a_new_key_and_a_warning(ops: OperatorView) -> None:
    ops.apply(_small())
    ms = ops.wait_ready("small")
    assert ms["status"]["keySecret"]["name"] == "small-api-keys"
    first_key = (ops.get("secret", "small-api-keys") or {})["data"]["api-key"]
    ops.kubectl("delete", "secret", "small-api-keys")
    ops.wait(lambda: ops.get("secret", "small-api-keys"), "the operator to re-create the key Secret")
    assert (ops.get("secret", "small-api-keys") or {})["data"]["api-key"] != first_key

    def warned() -> list[dict[str, Any]]:
        return [e for e in ops.events("small") if (e["type"], e["reason"]) == ("Warning", "APIKeyRegenerated")]

    ops.wait(warned, "a Warning Event about the new key")
    assert "Secret small-api-keys was missing" in warned()[0]["message"]
    key_secret = (ops.get("modelserver", "small") or {})["status"]["keySecret"]
    assert "a new API key was generated" in key_secret["message"]
    assert "small-api-keys" in ops.kubectl("describe", "ms", "small").stdout


def test_examples_settle_ready_but_the_group_short_of_gpus(ops: OperatorView) -> None:
    ops.kubectl("apply", "--recursive", "-f", str(EXAMPLES_DIR))
    by_name = {m["metadata"]["name"]: m for m in examples().values()}
    single = [name for name, m in by_name.items() if m["spec"].get("nodes", 1) == 1]
    assert len(single) == 6  # qwen3-mlx's pod is the sidecar alone, which KWOK runs like any
    for name in single:
        ops.wait_ready(name)
    # The 16-GPU example is a group of two 8-GPU pods, one per node: with the other examples on
    # gpu-0 and gpu-1 neither node has 8 GPUs free (test_multinode_cluster.py places it alone).
    degraded = ops.wait_reason("lfm2-24b-a2b-16gpu", "Degraded", "True", "InsufficientGPU")
    assert "no node has 8 free nvidia.com/gpu" in degraded["message"]
    assert (ops.get("leaderworkerset", "lfm2-24b-a2b-16gpu") or {})["spec"]["leaderWorkerTemplate"]["size"] == 2
    cpu = ops.get("deployment", "smollm2-135m-cpu") or {}
    assert "tolerations" not in cpu["spec"]["template"]["spec"]


def test_nothing_changed_means_nothing_written(ops: OperatorView) -> None:
    ops.apply(_small())
    ops.wait_ready("small")
    objects = (("modelserver", "small"), ("deployment", "small"), ("service", "small"), ("secret", "small-api-keys"))
    time.sleep(2 * RESYNC_SECONDS)  # let the last status write and its echo events pass
    before = _resource_versions(ops, *objects)
    events_before = len(ops.events("small"))
    time.sleep(3 * RESYNC_SECONDS)  # three resync rounds, each a full reconcile
    assert _resource_versions(ops, *objects) == before
    assert len(ops.events("small")) == events_before


def test_kubectl_scale_sets_the_replicas_through_the_scale_subresource(ops: OperatorView) -> None:
    ops.apply(_small(replicas={"min": 1, "max": 4}))
    ms = ops.wait_ready("small")
    # On KWOK nodes no sidecar can be read: the autoscaler holds at min + buffer.
    assert ms["status"]["desiredReplicas"] == 1 and ms["status"]["selector"].endswith("=small")
    ops.kubectl("scale", "modelserver", "small", "--replicas=3")

    def scaled() -> bool:
        status = (ops.get("modelserver", "small") or {}).get("status", {})
        return status.get("desiredReplicas") == 3 and status.get("readyReplicas") == 3

    ops.wait(scaled, "three replicas ready")
    assert (ops.get("deployment", "small") or {})["spec"]["replicas"] == 3

    def shares() -> list[str | None]:
        """What each live pod is told of the replicas sharing the key limits (key_share.py)."""
        listed = ops.kubectl("get", "pods", "-l", "serving.modelserve.dev/modelserver=small", "-o", "json").stdout
        return [
            (pod["metadata"].get("annotations") or {}).get("serving.modelserve.dev/serving-replicas")
            for pod in json.loads(listed)["items"]
            if not pod["metadata"].get("deletionTimestamp")
        ]

    ops.wait(lambda: shares() == ["3", "3", "3"], "each pod told that 3 replicas share the key limits")
    scale = json.loads(
        ops.kubectl(
            "get", "--raw", f"/apis/serving.modelserve.dev/v1alpha1/namespaces/{ops.namespace}/modelservers/small/scale"
        ).stdout
    )
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (3, 3)
    refused = ops.kubectl("scale", "modelserver", "small", "--replicas=9", check=False)
    assert refused.returncode != 0 and "replicas.count must be between replicas.min and replicas.max" in refused.stderr


def test_a_changed_adapter_list_annotates_the_running_pods_and_replaces_none(ops: OperatorView) -> None:
    pirate, poet = {"name": "pirate", "source": "acme/pirate-lora"}, {"name": "poet", "source": "acme/poet-lora"}

    def pods() -> dict[str, str | None]:
        listed = ops.kubectl("get", "pods", "-l", "serving.modelserve.dev/modelserver=small", "-o", "json").stdout
        return {
            pod["metadata"]["uid"]: (pod["metadata"].get("annotations") or {}).get(
                "serving.modelserve.dev/adapters-sha256"
            )
            for pod in json.loads(listed)["items"]
        }

    def listed_digest() -> str:
        text = (ops.get("configmap", "small-adapters") or {})["data"]["adapters.json"]
        return hashlib.sha256(text.encode()).hexdigest()

    ops.apply(_small(adapters=[pirate]))
    ops.wait_ready("small")
    ops.wait(lambda: set(pods().values()) == {listed_digest()}, "the pods annotated with the list they mount")
    first = pods()

    ops.apply(_small(adapters=[pirate, poet]))
    # The kubelet refreshes a ConfigMap volume when it syncs the pod, which an annotation's change
    # makes it do at once: the pods stay, each with the new list's hash.
    ops.wait(lambda: set(pods().values()) == {listed_digest()} != set(first.values()), "the pods annotated anew")
    assert pods().keys() == first.keys()
    revisions = ops.kubectl("get", "replicasets", "-l", "serving.modelserve.dev/modelserver=small", "-o", "name")
    assert len(revisions.stdout.split()) == 1
