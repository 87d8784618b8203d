"""Golden files: each example's full manifest set, byte for byte; plus the wiring they must show.

Regenerate after an intended change with `make generate` (it sets MODELSERVE_UPDATE_GOLDEN=1 here),
then review the diff.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.testdata import examples
from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.contracts.names import SELECTOR_LABEL
from modelserve.contracts.nodecache import POD_MODEL_LABEL, FetchSettings, Layout, model_key, node_label
from modelserve.contracts.operator_settings import Settings
from modelserve.contracts.sidecar import DRAINED_ROUTE, TLS_DIR, serves_tls
from modelserve.engines.base import HUB_CACHE_PATH

GOLDEN_DIR = Path(__file__).with_name("golden")
SETTINGS = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0")
# What the chart's default release (modelserve, in namespace modelserve) gives the operator.
NODE_CACHE = dataclasses.replace(
    SETTINGS, node_cache_url="http://modelserve-nodecache.modelserve.svc.cluster.local:8090"
)
UID = "00000000-0000-4000-8000-000000000000"
API_KEY = "<generated once by the operator>"


ENGINE_EXAMPLES = sorted(name for name, m in examples().items() if m["spec"].get("profile") != "external")


def _ms(manifest: dict[str, Any], **spec_changes: Any) -> ModelServer:
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": "default", "uid": UID}}
    manifest["spec"] = {**manifest["spec"], **spec_changes}
    return ModelServer.from_manifest(manifest)


def _example(name: str, **spec_changes: Any) -> ModelServer:
    return _ms(examples()[name], **spec_changes)


def render(ms: ModelServer, settings: Settings = SETTINGS) -> str:
    return yaml.safe_dump_all(manifests.owned_objects(ms, settings, API_KEY), sort_keys=False, width=1000)


def _containers(ms: ModelServer) -> dict[str, dict[str, Any]]:
    """The containers of a serving pod (a LeaderWorkerSet's leader where a replica spans nodes)."""
    pod = manifests.serving_pod_template(manifests.workload(ms, SETTINGS))["spec"]
    return {container["name"]: container for container in pod["containers"]}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}


@pytest.mark.parametrize("name", sorted(examples()))
def test_golden_manifest_set(name: str) -> None:
    golden = GOLDEN_DIR / f"{name}.yaml"
    text = render(_example(name))
    assert text == render(_example(name)), "rendering is not byte-stable"
    if os.environ.get("MODELSERVE_UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden.name}: run `make generate`"
    assert text == golden.read_text(), f"{golden.name} differs: run `make generate` and review the diff"


@pytest.mark.parametrize("name", ["smollm2-135m-cpu", "smollm2-135m-vllm"])
def test_golden_manifest_set_with_the_node_cache(name: str) -> None:
    golden = GOLDEN_DIR / f"{name}.node-cache.yaml"
    text = render(_example(name), NODE_CACHE)
    if os.environ.get("MODELSERVE_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden.name}: run `make generate`"
    assert text == golden.read_text(), f"{golden.name} differs: run `make generate` and review the diff"


def _pod(ms: ModelServer, settings: Settings) -> dict[str, Any]:
    return manifests.serving_pod_template(manifests.workload(ms, settings))


def test_with_the_node_cache_each_pod_fetches_its_model_first_and_prefers_nodes_that_hold_it() -> None:
    ms = _example("smollm2-135m-cpu")
    template = _pod(ms, NODE_CACHE)
    (fetch,) = template["spec"]["initContainers"]
    env = _env(fetch)
    assert fetch["command"] == ["modelserve-fetch"] and fetch["image"] == SETTINGS.sidecar_image
    settings = FetchSettings.from_env(env)
    assert settings.model == ms.spec.model and settings.layout == Layout.GGUF
    assert settings.node_cache == NODE_CACHE.node_cache_url
    # Where the engine reads: the hub cache volume's `hub` directory (the engine mounts it at HF_HOME).
    assert fetch["volumeMounts"] == [{"name": "hub-cache", "mountPath": str(settings.cache_dir.parent)}]
    engine_mounts = template["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "hub-cache", "mountPath": HUB_CACHE_PATH} in engine_mounts
    engine = _env({"env": template["spec"]["containers"][0]["env"]})
    assert engine["LLAMA_CACHE"] == f"{HUB_CACHE_PATH}/hub"
    # --offline by its variable in the pinned b11434 (LLAMA_ARG_OFFLINE) and in older images (LLAMA_OFFLINE).
    assert engine["LLAMA_ARG_OFFLINE"] == engine["LLAMA_OFFLINE"] == "1"
    (preferred,) = template["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"] == [{"key": node_label(ms.spec.model), "operator": "Exists"}]
    assert template["metadata"]["labels"][POD_MODEL_LABEL] == model_key(ms.spec.model)
    # A start of seconds is seen within 2 s, not 10 (the same budget of startup_seconds).
    sidecar = next(c for c in template["spec"]["containers"] if c["name"] == "sidecar")
    assert (sidecar["startupProbe"]["periodSeconds"], sidecar["startupProbe"]["failureThreshold"]) == (2, 1800)
    # vLLM reads its snapshot offline, with the adapters' too; with adapters it stays online for the new ones.
    vllm = _example("smollm2-135m-vllm")
    assert _env(_pod(vllm, NODE_CACHE)["spec"]["containers"][0])["HF_HUB_OFFLINE"] == "1"
    lora = _ms(
        examples()["smollm2-135m-vllm"],
        adapters=[{"name": "a", "source": "acme/lora"}, {"name": "b", "source": "/m/b"}],
    )
    (lora_fetch,) = _pod(lora, NODE_CACHE)["spec"]["initContainers"]
    assert FetchSettings.from_env(_env(lora_fetch)).adapters == ("acme/lora",)  # a path is the volume's already
    assert "HF_HUB_OFFLINE" not in _env(_pod(lora, NODE_CACHE)["spec"]["containers"][0])


def test_no_fetch_without_the_node_cache_for_a_path_or_when_the_spec_says_no() -> None:
    assert "initContainers" not in _pod(_example("smollm2-135m-cpu"), SETTINGS)["spec"]
    path = _example("smollm2-135m-cpu", model="/models/smollm2.gguf")
    assert "initContainers" not in _pod(path, NODE_CACHE)["spec"]
    declined = _example("smollm2-135m-cpu", cache={"node": False})
    assert "initContainers" not in _pod(declined, NODE_CACHE)["spec"]
    assert "initContainers" not in _pod(_example("qwen3-mlx"), NODE_CACHE)["spec"]  # external: no engine


def test_the_fetch_gets_the_hub_token_only_where_the_engine_has_it() -> None:
    ms = _example("smollm2-135m-cpu", hfTokenSecretRef={"name": "hub", "key": "token"})
    (fetch,) = _pod(ms, NODE_CACHE)["spec"]["initContainers"]
    assert _env(fetch)["HF_TOKEN"] == {"secretKeyRef": {"name": "hub", "key": "token"}}
    pod = _pod(ms, NODE_CACHE)["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_every_pod_of_a_group_fetches_its_weights() -> None:
    ms = _example("lfm2-24b-a2b-16gpu")
    for template in manifests.pod_templates(manifests.workload(ms, NODE_CACHE)):
        assert [c["name"] for c in template["spec"]["initContainers"]] == ["fetch"]
        affinity = template["spec"]["affinity"]
        assert "podAntiAffinity" in affinity and "nodeAffinity" in affinity


def test_engine_listens_on_loopback_only_and_sidecar_owns_the_named_port() -> None:
    for name in ENGINE_EXAMPLES:
        containers = _containers(_example(name))
        engine, sidecar = containers["engine"], containers["sidecar"]
        host = engine["args"][engine["args"].index("--host") + 1]
        assert host == "127.0.0.1" and "ports" not in engine
        assert sidecar["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        port = engine["args"][engine["args"].index("--port") + 1]
        assert _env(sidecar)["MODELSERVE_UPSTREAM_URL"] == f"http://127.0.0.1:{port}" and port != "8080"


def test_sidecar_probes_give_a_cold_start_its_budget() -> None:
    sidecar = _containers(_example("smollm2-135m-cpu"))["sidecar"]
    startup = sidecar["startupProbe"]
    assert startup["httpGet"] == {"path": "/readyz", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] == SETTINGS.startup_seconds
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_one_sidecar_worker_keeps_the_sidecar_as_it_was() -> None:
    # A single-worker pod's template must not change (it would roll every such pod on an upgrade).
    sidecar = _containers(_example("smollm2-135m-cpu"))["sidecar"]
    assert "MODELSERVE_WORKERS" not in _env(sidecar)
    assert sidecar["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    assert manifests.sidecar_resources(1) == sidecar["resources"]


@pytest.mark.parametrize(
    ("spec", "workers", "resources"),
    [
        (
            {"profile": "low-latency", "sidecar": {"workers": 2}},
            2,
            {"requests": {"cpu": "600m", "memory": "192Mi"}, "limits": {"memory": "768Mi"}},
        ),
        (
            {"sidecar": {"workers": 3}},
            3,
            {"requests": {"cpu": "1100m", "memory": "256Mi"}, "limits": {"memory": "1024Mi"}},
        ),
        (
            {"gpus": 16, "nodes": 2, "sidecar": {"workers": 8}},
            8,
            {"requests": {"cpu": "3600m", "memory": "576Mi"}, "limits": {"memory": "2304Mi"}},
        ),
    ],
)
def test_each_further_sidecar_worker_adds_half_a_core_and_memory(
    spec: dict[str, Any], workers: int, resources: dict[str, Any]
) -> None:
    sidecar = _containers(_example("lfm2-1.2b", **spec))["sidecar"]
    assert _env(sidecar)["MODELSERVE_WORKERS"] == str(workers)
    assert sidecar["resources"] == resources


def test_private_auth_mounts_the_generated_key_secret_into_the_sidecar_only() -> None:
    ms = _example("lfm2-1.2b")
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for obj in manifests.owned_objects(ms, SETTINGS, "k")}
    assert objects[("Secret", "lfm2-1-2b-api-keys")]["stringData"] == {"api-key": "k"}
    containers = _containers(ms)
    assert _env(containers["sidecar"])["MODELSERVE_KEYS_DIR"] == "/etc/modelserve/keys"
    assert containers["sidecar"]["volumeMounts"] == [
        {"name": "api-keys", "mountPath": "/etc/modelserve/keys", "readOnly": True},
        # How many ready replicas share the keys' limits (operator/key_share.py), from the annotation.
        {"name": "serving-replicas", "mountPath": "/etc/modelserve/replicas", "readOnly": True},
    ]
    assert all(mount["name"] not in ("api-keys", "serving-replicas") for mount in containers["engine"]["volumeMounts"])


def test_a_named_key_secret_is_mounted_and_none_is_generated() -> None:
    ms = _example("lfm2-1.2b", auth={"secretName": "team-keys"})
    assert [obj["kind"] for obj in manifests.owned_objects(ms, SETTINGS, "k")] == ["Deployment", "Service"]
    volumes = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "api-keys", "secret": {"secretName": "team-keys"}} in volumes


def test_public_auth_mounts_no_keys() -> None:
    ms = _example("smollm2-135m-cpu")
    sidecar = _containers(ms)["sidecar"]
    assert _env(sidecar)["MODELSERVE_AUTH"] == "public" and "MODELSERVE_KEYS_DIR" not in _env(sidecar)
    assert "volumeMounts" not in sidecar


def test_gpu_limits_and_toleration_follow_the_profile() -> None:
    gpu_pod = manifests.deployment(_example("lfm2-1.2b", gpus=16), SETTINGS)["spec"]["template"]["spec"]
    assert gpu_pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "16"}}
    assert gpu_pod["tolerations"] == [manifests.GPU_TOLERATION]
    cpu_pod = manifests.deployment(_example("smollm2-135m-cpu"), SETTINGS)["spec"]["template"]["spec"]
    assert "tolerations" not in cpu_pod
    assert "nvidia.com/gpu" not in cpu_pod["containers"][0]["resources"]["limits"]


def test_replicas_are_min_plus_buffer() -> None:
    assert manifests.deployment(_example("lfm2-1.2b"), SETTINGS)["spec"]["replicas"] == 2


def test_shm_is_a_memory_volume_sized_by_engine_or_spec() -> None:
    def shm(ms: ModelServer) -> dict[str, Any]:
        volumes = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]["volumes"]
        return next(v["emptyDir"] for v in volumes if v["name"] == "dshm")

    assert shm(_example("lfm2-8b-a1b")) == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert shm(_example("lfm2-1.2b", shmSize="2Gi")) == {"medium": "Memory", "sizeLimit": "2Gi"}


def test_cache_size_makes_an_owned_claim_mounted_as_the_hub_cache() -> None:
    ms = _example("lfm2-1.2b", cache={"size": "50Gi", "storageClassName": "fast"})
    claim = manifests.owned_objects(ms, SETTINGS, "k")[0]
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == "lfm2-1-2b-hub-cache"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "fast",
    }
    pod = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]
    assert {"name": "hub-cache", "persistentVolumeClaim": {"claimName": "lfm2-1-2b-hub-cache"}} in pod["volumes"]
    assert {"name": "hub-cache", "mountPath": "/root/.cache/huggingface"} in pod["containers"][0]["volumeMounts"]


def test_existing_claim_is_mounted_and_not_created() -> None:
    ms = _example("lfm2-1.2b", cache={"claimName": "models"})
    assert all(obj["kind"] != "PersistentVolumeClaim" for obj in manifests.owned_objects(ms, SETTINGS, "k"))
    pod = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]
    assert {"name": "hub-cache", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]


@pytest.mark.parametrize("cache", [{"node": True}, {"prefetch": {"nodeSelector": {"pool": "gpu"}}}, {"node": False}])
def test_the_node_cache_settings_alone_keep_the_pods_own_hub_cache(cache: dict) -> None:
    # No claim is named or made, so none is mounted (a pod naming a missing claim never schedules).
    ms = _example("lfm2-1.2b", cache=cache)
    assert all(obj["kind"] != "PersistentVolumeClaim" for obj in manifests.owned_objects(ms, SETTINGS, "k"))
    pod = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]
    assert {"name": "hub-cache", "emptyDir": {}} in pod["volumes"]


def test_hf_token_comes_from_the_named_secret_and_user_env_wins() -> None:
    ms = _example(
        "lfm2-1.2b",
        hfTokenSecretRef={"name": "hf", "key": "token"},
        env=[{"name": "HF_HOME", "value": "/models"}, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
    )
    engine = _containers(ms)["engine"]
    assert engine["env"] == [
        {"name": "HF_HOME", "value": "/models"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        # The non-root engine's home, cache and temporary directories, on its volumes.
        {"name": "HOME", "value": "/root"},
        {"name": "USER", "value": "modelserve"},
        {"name": "XDG_CACHE_HOME", "value": "/root/.cache"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    ]


def test_children_are_owned_by_the_modelserver() -> None:
    for obj in manifests.owned_objects(_example("lfm2-1.2b"), SETTINGS, "k"):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "serving.modelserve.dev/v1alpha1",
            "kind": "ModelServer",
            "name": "lfm2-1-2b",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_service_maps_port_80_to_the_sidecar() -> None:
    service = manifests.service(_example("lfm2-1.2b"))
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"] == {"serving.modelserve.dev/modelserver": "lfm2-1-2b"}


def test_termination_grace_outlasts_the_drain() -> None:
    pod = manifests.deployment(_example("lfm2-1.2b"), SETTINGS)["spec"]["template"]["spec"]
    engine, sidecar = pod["containers"]
    # The sidecar keeps taking connections while endpoints update, then drains; the engine
    # outlives both, and the grace period outlives the engine's shutdown.
    propagation = sidecar["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert propagation == manifests.ENDPOINT_PROPAGATION_SECONDS > 0
    # The engine stops once its sidecar says it is done (at most its drain after its stop), not a fixed
    # sleep of the whole budget later: the kubelet asks the sidecar's port as the pod is deleted.
    port = sidecar["ports"][0]["containerPort"]
    assert engine["lifecycle"]["preStop"] == {"httpGet": {"path": DRAINED_ROUTE, "port": port}}
    assert pod["terminationGracePeriodSeconds"] > propagation + SETTINGS.drain_seconds
    assert sidecar["readinessProbe"]["periodSeconds"] == 1 and sidecar["readinessProbe"]["failureThreshold"] == 1


@pytest.mark.parametrize("name", ["lfm2-1.2b", "lfm2-24b-a2b-16gpu"])
def test_a_fractional_drain_goes_to_the_sidecar_and_rounds_up_in_whole_seconds(name: str) -> None:
    settings = Settings(sidecar_image=SETTINGS.sidecar_image, drain_seconds=30.5)
    pod = manifests.serving_pod_template(manifests.workload(_example(name), settings))["spec"]
    containers = {container["name"]: container for container in pod["containers"]}
    assert _env(containers["sidecar"])["MODELSERVE_DRAIN_SECONDS"] == "30.5"
    # Kubernetes takes whole seconds for a preStop sleep (a group's workers, which have no sidecar to ask)
    # and the grace period: never shorter than the drain.
    assert "httpGet" in containers["engine"]["lifecycle"]["preStop"]
    done = manifests.ENDPOINT_PROPAGATION_SECONDS + 31
    workload = manifests.workload(_example(name), settings)
    if workload["kind"] == manifests.LWS_KIND:
        (worker,) = workload["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
        engine_sleep = worker["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert type(engine_sleep) is int and engine_sleep == done
    assert type(pod["terminationGracePeriodSeconds"]) is int and pod["terminationGracePeriodSeconds"] > done


def test_engine_image_comes_from_spec_then_operator_settings_then_the_pinned_tag() -> None:
    settings = Settings.from_env(
        {"MODELSERVE_ENGINE_IMAGE_VLLM": "mirror.example/vllm-openai:v9", "MODELSERVE_ENGINE_IMAGE_SGLANG": ""}
    )
    assert settings.engine_images == {"vllm": "mirror.example/vllm-openai:v9"}

    def engine_image(ms: ModelServer) -> str:
        pod = manifests.deployment(ms, settings)["spec"]["template"]["spec"]
        return next(c["image"] for c in pod["containers"] if c["name"] == "engine")

    assert engine_image(_example("lfm2-1.2b")) == "mirror.example/vllm-openai:v9"
    assert engine_image(_example("lfm2-1.2b", image="own/vllm:1")) == "own/vllm:1"
    assert engine_image(_example("lfm2-8b-a1b")).startswith("lmsysorg/sglang:v0.5.")


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def test_a_chat_template_is_an_owned_config_map_mounted_read_only_into_the_engine() -> None:
    ms = _example("lfm2-1.2b", chatTemplate=TEMPLATE)
    objects = manifests.owned_objects(ms, SETTINGS, "k")
    assert [obj["kind"] for obj in objects][:2] == ["ConfigMap", "Deployment"]  # there before the pods
    config_map = objects[0]
    assert config_map["metadata"]["name"] == "lfm2-1-2b-chat-template"
    assert config_map["metadata"]["labels"][SELECTOR_LABEL] == "lfm2-1-2b"  # the watch sees it
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == UID
    assert config_map["data"] == {"chat_template.jinja": TEMPLATE}
    pod = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]
    assert {
        "name": "chat-template",
        "configMap": {
            "name": "lfm2-1-2b-chat-template",
            "items": [{"key": "chat_template.jinja", "path": "chat_template.jinja"}],
        },
    } in pod["volumes"]
    assert all(mount["name"] != "chat-template" for mount in _containers(ms)["sidecar"].get("volumeMounts", []))


def test_a_new_chat_template_rolls_the_pods() -> None:
    def annotations(ms: ModelServer) -> dict[str, str]:
        return manifests.deployment(ms, SETTINGS)["spec"]["template"]["metadata"]["annotations"]

    first = annotations(_example("lfm2-1.2b", chatTemplate=TEMPLATE))
    second = annotations(_example("lfm2-1.2b", chatTemplate=TEMPLATE + "{{ '' }}"))
    key = manifests.CHAT_TEMPLATE_HASH_ANNOTATION
    assert first[key] != second[key] and len(first[key]) == 64
    assert key not in annotations(_example("lfm2-1.2b"))
    assert all(obj["kind"] != "ConfigMap" for obj in manifests.owned_objects(_example("lfm2-1.2b"), SETTINGS, "k"))


def test_an_external_server_gets_the_sidecar_alone_pointed_at_its_url() -> None:
    ms = _example("qwen3-mlx")
    pod = manifests.deployment(ms, SETTINGS)["spec"]["template"]["spec"]
    (sidecar,) = pod["containers"]
    assert sidecar["name"] == "sidecar"
    env = _env(sidecar)
    assert env["MODELSERVE_UPSTREAM_URL"] == "http://mac-studio.lan:8080"
    assert env["MODELSERVE_UPSTREAM_MODEL"] == "mlx-community/Qwen3-4B-4bit"
    assert (env["MODELSERVE_ENGINE_HEALTH_PATH"], env["MODELSERVE_ENGINE_METRICS"]) == ("/v1/models", "false")
    # No GPU, no model download: no toleration, no shared memory, no hub cache, no engine image.
    assert "tolerations" not in pod and "nvidia.com/gpu" not in str(pod)
    assert [volume["name"] for volume in pod["volumes"]] == ["api-keys", "serving-replicas"]
    assert "HF_" not in str(pod) and "huggingface" not in str(pod)
    assert pod["terminationGracePeriodSeconds"] > sidecar["lifecycle"]["preStop"]["sleep"]["seconds"]
    template = manifests.deployment(ms, SETTINGS)["spec"]["template"]["metadata"]
    assert template["annotations"]["kubectl.kubernetes.io/default-container"] == "sidecar"
    assert template["labels"]["app.kubernetes.io/component"] == "external"
    kinds = [obj["kind"] for obj in manifests.owned_objects(ms, SETTINGS, "k")]
    assert kinds == ["Deployment", "Service", "Secret"]


def test_an_external_url_keeps_no_trailing_slash() -> None:
    ms = _example("qwen3-mlx", external={"url": "https://mlx.example.com/"})
    assert _env(_containers(ms)["sidecar"])["MODELSERVE_UPSTREAM_URL"] == "https://mlx.example.com"


def test_a_replica_spanning_nodes_is_a_leader_worker_set_group_and_the_service_selects_leaders() -> None:
    ms = _example("lfm2-24b-a2b-16gpu", replicas={"min": 2, "max": 3})
    objects = manifests.server_side_applied(ms, SETTINGS)
    assert [obj["kind"] for obj in objects] == ["LeaderWorkerSet", "Service"]
    lws, service = objects
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["spec"]["replicas"] == 2  # groups
    template = lws["spec"]["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    assert service["spec"]["selector"] == {SELECTOR_LABEL: ms.name, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    leader, worker = template["leaderTemplate"]["spec"], template["workerTemplate"]["spec"]
    # Only the leader serves HTTP: the sidecar and its keys are there alone.
    assert [c["name"] for c in leader["containers"]] == ["engine", "sidecar"]
    assert [c["name"] for c in worker["containers"]] == ["engine"]
    assert "api-keys" in {v["name"] for v in leader["volumes"]}
    assert {v["name"] for v in worker["volumes"]} == {"dshm", "hub-cache", "engine-home", "engine-cache", "engine-tmp"}
    for pod in (leader, worker):
        assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
        # The same user, volumes and group on every pod of the group.
        assert pod["containers"][0]["securityContext"]["runAsUser"] == 65532
        assert pod["securityContext"]["fsGroup"] == 65532
        assert pod["tolerations"] == [manifests.GPU_TOLERATION]
        (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
    assert template["workerTemplate"]["metadata"]["labels"][SELECTOR_LABEL] == ms.name


def test_one_node_keeps_the_deployment_and_its_service_selects_every_pod() -> None:
    ms = _example("lfm2-24b-a2b-16gpu", gpus=8, nodes=1)
    assert [obj["kind"] for obj in manifests.server_side_applied(ms, SETTINGS)] == ["Deployment", "Service"]
    assert manifests.service(ms)["spec"]["selector"] == {SELECTOR_LABEL: ms.name}


def test_pull_secrets_reach_every_model_pod_and_prefetch_job_the_modelservers_own_first() -> None:
    settings = dataclasses.replace(NODE_CACHE, image_pull_secrets=("mirror", "regcred"))
    own = [{"name": "regcred"}, {"name": "team-registry"}]
    wanted = [{"name": "regcred"}, {"name": "team-registry"}, {"name": "mirror"}]
    one_node = _example(ENGINE_EXAMPLES[0], imagePullSecrets=own)
    pod = manifests.serving_pod_template(manifests.workload(one_node, settings))["spec"]
    assert pod["imagePullSecrets"] == wanted
    spanning = _example("lfm2-24b-a2b-16gpu", imagePullSecrets=own)
    templates = manifests.pod_templates(manifests.workload(spanning, settings))
    assert len(templates) == 2 and all(t["spec"]["imagePullSecrets"] == wanted for t in templates)
    prefetching = _example(ENGINE_EXAMPLES[0], imagePullSecrets=own, cache={"prefetch": {"nodeSelector": {"a": "b"}}})
    job = manifests.prefetch_job(prefetching, settings, "gpu-0")
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == wanted
    # None named: the pods say nothing (what every pod that runs today was made with: nothing rolls).
    plain = manifests.serving_pod_template(manifests.workload(_example(ENGINE_EXAMPLES[0]), NODE_CACHE))["spec"]
    assert "imagePullSecrets" not in plain


def test_spec_tls_makes_each_sidecar_serve_https_from_the_secret_and_says_so_to_its_readers() -> None:
    ms = _example(ENGINE_EXAMPLES[0], tls={"secretName": "model-tls"})
    pod = _pod(ms, SETTINGS)["spec"]
    containers = {container["name"]: container for container in pod["containers"]}
    sidecar, engine = containers["sidecar"], containers["engine"]
    assert sidecar["ports"] == [{"name": "https", "containerPort": 8080, "protocol": "TCP"}]
    assert _env(sidecar)["MODELSERVE_TLS_DIR"] == TLS_DIR
    assert {"name": "tls", "mountPath": TLS_DIR, "readOnly": True} in sidecar["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "model-tls"}} in pod["volumes"]
    # The kubelet's probes and the engine's preStop speak HTTPS to it (probes never check a certificate).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["scheme"] == "HTTPS" and sidecar[probe]["httpGet"]["port"] == "https"
    assert engine["lifecycle"]["preStop"]["httpGet"] == {"path": DRAINED_ROUTE, "port": 8080, "scheme": "HTTPS"}
    assert sidecar["terminationMessagePolicy"] == "FallbackToLogsOnError"  # a refused certificate's line
    assert serves_tls({"spec": pod})
    assert manifests.service(ms)["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP", "appProtocol": "https"}
    ]
    assert manifests.endpoint(ms, "cluster.local") == f"https://{ms.name}.default.svc.cluster.local/v1"
    # A group's workers have no sidecar, so no certificate.
    spanning = _example("lfm2-24b-a2b-16gpu", tls={"secretName": "model-tls"})
    leader, worker = manifests.pod_templates(manifests.workload(spanning, SETTINGS))
    assert any(v["name"] == "tls" for v in leader["spec"]["volumes"])
    assert not any(v["name"] == "tls" for v in worker["spec"].get("volumes", []))
    # Unset: nothing of it in the pods (what every pod that runs today was made with: nothing rolls).
    plain = _pod(_example(ENGINE_EXAMPLES[0]), SETTINGS)["spec"]
    plain_sidecar = next(c for c in plain["containers"] if c["name"] == "sidecar")
    assert "MODELSERVE_TLS_DIR" not in _env(plain_sidecar) and not serves_tls({"spec": plain})
    assert "scheme" not in plain_sidecar["readinessProbe"]["httpGet"]
