"""Pure builders: one ModelServer -> the objects the operator applies. No API calls here.

The same spec always gives byte-identical manifests, so reconcile can compare instead of write.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from modelserve.api.status import Transition
from modelserve.contracts import sidecar as contract
from modelserve.contracts.adapters import ADAPTERS_KEY, Desired, render_desired
from modelserve.contracts.api_keys import GENERATED_KEY_FIELD
from modelserve.contracts.events import event_manifest
from modelserve.contracts.names import (
    API_VERSION,
    FIELD_MANAGER,
    GROUP,
    KIND,
    LWS_API_VERSION,
    LWS_GROUP_KEY_LABEL,
    LWS_KIND,
    LWS_WORKER_INDEX_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SELECTOR_LABEL,
    SIDECAR_NAME,
)
from modelserve.contracts.nodecache import (
    DEFAULT_HUB,
    FETCH_COMMAND,
    FETCH_CONTAINER,
    FETCH_MOUNT,
    POD_MODEL_LABEL,
    FetchSettings,
    hub_adapters,
    model_key,
    node_label,
)
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import engine_for, external
from modelserve.engines.base import (
    CACHE_VOLUME,
    CHAT_TEMPLATE_KEY,
    CHAT_TEMPLATE_VOLUME,
    GPU_RESOURCE,
    SHM_VOLUME,
    Engine,
    Role,
)

from . import pools, versions
from .replicas import desired_replicas
from .spec import AuthMode, ModelServer, RolloutStrategy
from .status import Versions

SERVICE_PORT = 80
TLS_SERVICE_PORT = 443  # the Service's port when the pods serve HTTPS (spec.tls): https://NAME.NS.svc/v1
TLS_VOLUME = "tls"
KEYS_VOLUME = "api-keys"
ADAPTERS_VOLUME = "adapters"
REPLICAS_VOLUME = "serving-replicas"
PROBE_PERIOD_SECONDS = 10
# A pod that fetches its model through the node cache starts in seconds once the node holds it: its
# startup probe looks this often, so that its readiness is seen then and not up to 10 s later (a wake
# from zero waits for it). Only such pods: a new period in every template would roll every pod.
FAST_STARTUP_PERIOD_SECONDS = 2
# The engine's preStop lasts until the sidecar's drain is done (at most its budget); this covers the
# engine's own shutdown after it.
ENGINE_SHUTDOWN_SECONDS = 30
# The sidecar keeps accepting new connections this long after the pod is deleted, while the
# endpoint removal reaches every kube-proxy; only then does SIGTERM start its drain.
ENDPOINT_PROPAGATION_SECONDS = 5
# On the pod template: a new chat template rolls the pods (engines read it once, at start).
CHAT_TEMPLATE_HASH_ANNOTATION = f"{GROUP}/chat-template-sha256"
# The ModelServer's ready replicas, kept on each of its pods by the operator (operator/key_share.py):
# the sidecar reads it (a downward API file) and enforces its share of each key's limits.
REPLICAS_ANNOTATION = f"{GROUP}/serving-replicas"
# The key Secret's resourceVersion, kept on each pod by the operator: changing it makes the kubelet
# sync the pod, which refreshes the mounted keys now (a revoked key refused within seconds) rather
# than on its periodic sync a minute or more later. A version, never anything derived from the keys.
KEYS_VERSION_ANNOTATION = f"{GROUP}/keys-version"
# On running pods, not the template: the operator sets it when spec.adapters changes, and the pod's
# update makes the kubelet sync it, which refreshes the mounted list at once instead of on its
# periodic sync (a minute or more) without restarting anything.
ADAPTERS_HASH_ANNOTATION = f"{GROUP}/adapters-sha256"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
NONROOT_UID = 65532
# A node that holds the model is preferred (never required: any node can fetch it).
NODE_CACHE_WEIGHT = 100
# On a prefetch Job: the node it warms.
PREFETCH_NODE_LABEL = f"{GROUP}/prefetch-node"


def nonroot_security_context() -> dict[str, Any]:
    """Our own containers (the sidecar, the fetch): non-root, nothing to gain, a read-only image."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NONROOT_UID,
        "runAsGroup": NONROOT_UID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def generated_secret_name(ms: ModelServer) -> str | None:
    """The key Secret the operator creates, or None when auth is public or a Secret is named."""
    auth = ms.spec.auth
    if auth.mode == AuthMode.PRIVATE and not auth.secret_name:
        return f"{ms.name}-api-keys"
    return None


def keys_secret_name(ms: ModelServer) -> str | None:
    """The Secret mounted into the sidecar (None with public auth)."""
    return ms.spec.auth.secret_name or generated_secret_name(ms)


def cache_claim_name(ms: ModelServer) -> str | None:
    """The claim mounted as the hub cache: one named, or the one cache.size makes; None otherwise
    (cache.node and cache.prefetch alone keep the pod's emptyDir)."""
    cache = ms.spec.cache
    if cache is None or (cache.claim_name is None and cache.size is None):
        return None
    return cache.claim_name or f"{ms.name}-hub-cache"


def chat_template_name(ms: ModelServer) -> str:
    return f"{ms.name}-chat-template"


def adapters_name(ms: ModelServer) -> str:
    return f"{ms.name}-adapters"


def endpoint(ms: ModelServer, cluster_domain: str) -> str:
    scheme = "https" if ms.spec.tls else "http"
    return f"{scheme}://{ms.name}.{ms.namespace}.svc.{cluster_domain}/v1"


def port_name(ms: ModelServer) -> str:
    """The sidecar's port's name, which says to its readers whether it serves HTTPS."""
    return contract.TLS_PORT_NAME if ms.spec.tls else "http"


def component(ms: ModelServer) -> str:
    """What serves the model: the engine's name, or `external`."""
    return external.COMPONENT if ms.spec.external else engine_for(ms.spec.profile).name


OPERATORS = {MANAGED_BY_LABEL: MANAGED_BY}  # on every pod the operator makes
PREFETCH_POD_LABELS = {"app.kubernetes.io/component": "prefetch", **OPERATORS}


def labels(ms: ModelServer) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "modelserver",
        "app.kubernetes.io/instance": ms.name,
        "app.kubernetes.io/component": component(ms),
        **OPERATORS,
        SELECTOR_LABEL: ms.name,
    }


def _metadata(ms: ModelServer, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ms.namespace,
        "labels": labels(ms),
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": ms.name,
                "uid": ms.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def _http_probe(path: str, period: int, failures: int, tls: bool = False) -> dict[str, Any]:
    get = {"path": path, "port": contract.TLS_PORT_NAME, "scheme": "HTTPS"} if tls else {"path": path, "port": "http"}
    return {
        "httpGet": get,
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def sidecar_settings(ms: ModelServer, settings: Settings) -> contract.Settings:
    """What the pod's sidecar runs with, in the contract's terms: in front of the profile's engine
    on 127.0.0.1, or of the external server."""
    spec = ms.spec
    sampling = spec.sampling_defaults.model_dump(mode="json", exclude_none=True) if spec.sampling_defaults else {}
    common = {
        "served_model": ms.name,
        "listen_host": "0.0.0.0",  # the pod's address: the Service reaches the pod here
        "listen_port": contract.LISTEN_PORT,
        "auth_public": spec.auth.mode == AuthMode.PUBLIC,
        "vision": spec.vision,
        "sampling_defaults": MappingProxyType(sampling),
        "drain_seconds": settings.drain_seconds,
        # What the engine batches: past it, requests wait their turn by key here (fair share), not in the
        # engine's own queue, first come first served.
        "engine_concurrency": spec.engine_concurrency,
        "workers": spec.sidecar_workers,
        "tls_dir": Path(contract.TLS_DIR) if spec.tls else None,
        **settings.sidecar_limits,
    }
    if spec.external:
        return contract.Settings(
            upstream_url=spec.external.url.rstrip("/"),
            engine_health_path=external.HEALTH_PATH,
            engine_metrics=False,  # Ollama and MLX servers have no /metrics
            engine_probe_timeout_seconds=external.PROBE_TIMEOUT_SECONDS,
            upstream_model=spec.model,
            **common,
        )
    engine = engine_for(spec.profile)
    if spec.adapters is not None:
        common["adapter_api"] = engine.adapter_api
    return contract.Settings(
        upstream_url=engine.upstream_url(),
        engine_health_path=engine.health_path,
        engine_metrics_path=engine.metrics_path,
        engine_probe_timeout_seconds=engine.probe_timeout_seconds,
        sampling_aliases=MappingProxyType(dict(engine.sampling_aliases)),
        **common,
    )


def sidecar_resources(workers: int) -> dict[str, Any]:
    """The sidecar's requests and limits for its workers. One worker: what every sidecar had before
    workers existed, so a single-worker pod's template (and its pods) stay as they were. Each further
    worker is a process of its own: half a core requested (a worker's tail stays good up to about half
    a core's token events) and no CPU limit (throttling would stall streams); 64Mi more memory
    requested for its interpreter and buffers, 256Mi more allowed for its request bodies in flight."""
    extra = workers - 1
    return {
        "requests": {"cpu": f"{100 + 500 * extra}m", "memory": f"{128 + 64 * extra}Mi"},
        "limits": {"memory": f"{512 + 256 * extra}Mi"},
    }


def sidecar_container(ms: ModelServer, settings: Settings) -> dict[str, Any]:
    sidecar = sidecar_settings(ms, settings)
    startup = FAST_STARTUP_PERIOD_SECONDS if versions.node_cache(ms, settings) else PROBE_PERIOD_SECONDS
    tls = ms.spec.tls is not None
    container: dict[str, Any] = {
        "name": SIDECAR_NAME,
        "image": settings.sidecar_image,
        "command": ["modelserve-sidecar"],
        "ports": [{"name": port_name(ms), "containerPort": sidecar.listen_port, "protocol": "TCP"}],
        "env": [{"name": name, "value": value} for name, value in sidecar.to_env().items()],
        # Cold starts pull a large image and download weights before /readyz can pass.
        "startupProbe": _http_probe(contract.READY_ROUTE, startup, settings.startup_seconds // startup, tls),
        # Each second, and one failure is enough: an engine that dies in place stops getting traffic
        # within about a second (it was up to 15 s). A slow engine does not flap: /readyz answers from
        # its last finished check while one runs, and turns false only past the probe timeout.
        "readinessProbe": _http_probe(contract.READY_ROUTE, 1, 1, tls),
        "livenessProbe": _http_probe(contract.HEALTH_ROUTE, PROBE_PERIOD_SECONDS, 3, tls),
        "resources": sidecar_resources(sidecar.workers),
        "lifecycle": {"preStop": {"sleep": {"seconds": ENDPOINT_PROPAGATION_SECONDS}}},
        "securityContext": nonroot_security_context(),
    }
    mounts = []
    if not sidecar.auth_public:
        mounts.append({"name": KEYS_VOLUME, "mountPath": str(sidecar.keys_dir), "readOnly": True})
        replicas_dir = str(sidecar.replicas_file.parent)
        mounts.append({"name": REPLICAS_VOLUME, "mountPath": replicas_dir, "readOnly": True})
    if ms.spec.adapters is not None:
        # A ConfigMap volume, not env: the kubelet updates its files in a running pod (no roll).
        mounts.append({"name": ADAPTERS_VOLUME, "mountPath": str(sidecar.adapters_dir), "readOnly": True})
    if tls:
        # A Secret volume: the kubelet swaps a renewed certificate in, which the sidecar follows.
        mounts.append({"name": TLS_VOLUME, "mountPath": contract.TLS_DIR, "readOnly": True})
        # A certificate it cannot serve ends it with one line: kept in the status for CrashLoop's words.
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _volumes(ms: ModelServer, engine: Engine | None, with_keys: bool = True) -> list[dict[str, Any]]:
    """The pod's volumes; `engine` None: no engine container, so only the sidecar's keys; `with_keys`
    False: no sidecar (a group's worker), so no keys."""
    volumes: list[dict[str, Any]] = []
    if engine is not None:
        shm = {"medium": "Memory", "sizeLimit": ms.spec.shm_size or engine.shm_size}
        claim = cache_claim_name(ms)
        cache = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
        volumes += [{"name": SHM_VOLUME, "emptyDir": shm}, {"name": CACHE_VOLUME, **cache}]
        volumes += [{"name": mount["name"], "emptyDir": {}} for mount in engine.writable_mounts()]
    if ms.spec.chat_template is not None:
        config_map = {"name": chat_template_name(ms), "items": [{"key": CHAT_TEMPLATE_KEY, "path": CHAT_TEMPLATE_KEY}]}
        volumes.append({"name": CHAT_TEMPLATE_VOLUME, "configMap": config_map})
    secret = keys_secret_name(ms)
    if secret and with_keys:
        volumes.append({"name": KEYS_VOLUME, "secret": {"secretName": secret}})
        # The kubelet writes the annotation into the file, and rewrites it when the annotation changes.
        field = {"fieldPath": f"metadata.annotations['{REPLICAS_ANNOTATION}']"}
        count = {"path": PurePosixPath(contract.REPLICAS_FILE).name, "fieldRef": field}
        volumes.append({"name": REPLICAS_VOLUME, "downwardAPI": {"items": [count]}})
    if ms.spec.adapters is not None and with_keys:  # the sidecar's pods only
        config_map = {"name": adapters_name(ms), "items": [{"key": ADAPTERS_KEY, "path": ADAPTERS_KEY}]}
        volumes.append({"name": ADAPTERS_VOLUME, "configMap": config_map})
    if ms.spec.tls is not None and with_keys:  # the sidecar's pods only
        volumes.append({"name": TLS_VOLUME, "secret": {"secretName": ms.spec.tls.secret_name}})
    return volumes


def _pod_annotations(ms: ModelServer, default_container: str) -> dict[str, str]:
    annotations = {"kubectl.kubernetes.io/default-container": default_container}
    if ms.spec.chat_template is not None:
        digest = hashlib.sha256(ms.spec.chat_template.encode()).hexdigest()
        annotations[CHAT_TEMPLATE_HASH_ANNOTATION] = digest
    return annotations


def sidecar_done_seconds(settings: Settings) -> int:
    """When the sidecar is done with a deleted pod: endpoints updated, then its drain. The drain may
    be fractional (uvicorn's graceful shutdown takes a float), but the engine's preStop sleep and the
    grace period are whole seconds to Kubernetes: rounded up, so the engine never stops first."""
    return ENDPOINT_PROPAGATION_SECONDS + math.ceil(settings.drain_seconds)


def _containers(ms: ModelServer, settings: Settings) -> tuple[list[dict[str, Any]], Engine | None, int]:
    """The pod's containers, its engine (None with profile external: the sidecar alone) and its
    termination grace period."""
    # The engine outlives the sidecar's preStop and drain, so a draining stream keeps its engine.
    done_seconds = sidecar_done_seconds(settings)
    sidecar = sidecar_container(ms, settings)
    if ms.spec.external:
        return [sidecar], None, done_seconds + external.SHUTDOWN_SECONDS
    engine = engine_for(ms.spec.profile)
    engine_image = settings.engine_image(engine.name, engine.image)
    fetched = versions.node_cache(ms, settings)
    port = sidecar_settings(ms, settings).listen_port
    engine_container = engine.container(
        ms,
        engine_image,
        done_seconds,
        settings.hub_endpoint,
        fetched=fetched,
        sidecar_port=port,
        sidecar_tls=ms.spec.tls is not None,
    )
    return [engine_container, sidecar], engine, done_seconds + ENGINE_SHUTDOWN_SECONDS


def pull_secrets(ms: ModelServer, settings: Settings) -> list[str]:
    """The Secrets a model's pods pull their images with: its own first, then the operator's, once each."""
    return list(dict.fromkeys([*(ref.name for ref in ms.spec.image_pull_secrets), *settings.image_pull_secrets]))


def _with_pull_secrets(ms: ModelServer, settings: Settings, pod: dict[str, Any]) -> None:
    names = pull_secrets(ms, settings)
    if names:
        pod["imagePullSecrets"] = [{"name": name} for name in names]


def _engine_pod_security(engine: Engine | None) -> dict[str, Any]:
    return engine.pod_security_context() if engine else {}


def _pod_spec(
    ms: ModelServer, containers: list[dict[str, Any]], engine: Engine | None, grace_seconds: int, with_keys: bool
) -> dict[str, Any]:
    spec = ms.spec
    pod: dict[str, Any] = {
        # Service links would inject e.g. VLLM_PORT into the engine's environment, which vLLM reads.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_seconds,
        # Each container also sets its own; restricted Pod Security accepts either.
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, **_engine_pod_security(engine)},
        "containers": containers,
        "volumes": _volumes(ms, engine, with_keys),
    }
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    tolerations = [GPU_TOLERATION] if spec.gpu_count else []
    tolerations += [toleration.to_wire() for toleration in spec.tolerations]
    if tolerations:
        pod["tolerations"] = tolerations
    return pod


def fetch_container(ms: ModelServer, settings: Settings, engine: Engine) -> dict[str, Any]:
    """The init container that puts the model (and its hub adapters) into the hub cache volume through
    the node cache (modelserve-fetch): our image, non-root, no ServiceAccount token, the hub token only
    where the engine has it too; its result in its termination message, which the operator reads."""
    spec = ms.spec
    adapters = hub_adapters(a.source for a in spec.adapters or ())
    fetch = FetchSettings(
        model=spec.model,
        layout=engine.model_layout,
        adapters=adapters,
        hub=settings.hub_endpoint or DEFAULT_HUB,
        node_cache=settings.node_cache_url,
    )
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in fetch.to_env().items()]
    if spec.hf_token_secret_ref:
        ref = spec.hf_token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return {
        "name": FETCH_CONTAINER,
        "image": settings.sidecar_image,
        "command": [FETCH_COMMAND],
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": FETCH_MOUNT}],
        "securityContext": nonroot_security_context(),
    }


def _with_node_cache(ms: ModelServer, settings: Settings, engine: Engine | None, pod: dict[str, Any]) -> None:
    """The node cache's part of a pod that fetches its model through it: the fetch init container, and
    a preference for nodes that hold the model already (their label, kept by the node agent)."""
    if engine is None or not versions.node_cache(ms, settings):
        return
    pod["initContainers"] = [fetch_container(ms, settings, engine)]
    preferred = {
        "weight": NODE_CACHE_WEIGHT,
        "preference": {"matchExpressions": [{"key": node_label(ms.spec.model), "operator": "Exists"}]},
    }
    affinity = pod.setdefault("affinity", {})
    affinity["nodeAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [preferred]}


def prefetch_job_name(ms: ModelServer, node: str) -> str:
    """`<name>-prefetch-<8 hex of the node>`: one per node, within a name's 63 characters."""
    return f"{ms.name[:45]}-prefetch-{hashlib.sha256(node.encode()).hexdigest()[:8]}"


def prefetch_job(ms: ModelServer, settings: Settings, node: str) -> dict[str, Any]:
    """A Job that places the model in `node`'s node cache (spec.cache.prefetch): the model pods' own
    fetch, warm-only (nothing written in the pod), on that node, in the ModelServer's namespace, so
    the hub token never leaves it. Its pod tolerates what the model's pods tolerate: a node they
    cannot run on is not worth warming."""
    engine = engine_for(ms.spec.profile)
    fetch = fetch_container(ms, settings, engine)
    fetch["env"].append({"name": "MODELSERVE_FETCH_WARM_ONLY", "value": "true"})
    fetch.pop("volumeMounts")
    node_term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [fetch],
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [node_term]}}
        },
    }
    tolerations = [GPU_TOLERATION] if ms.spec.gpu_count else []
    tolerations += [toleration.to_wire() for toleration in ms.spec.tolerations]
    if tolerations:
        pod["tolerations"] = tolerations
    _with_pull_secrets(ms, settings, pod)  # it runs the sidecar's image
    metadata = _metadata(ms, prefetch_job_name(ms, node))
    metadata["labels"][PREFETCH_NODE_LABEL] = node
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": settings.startup_seconds,
            # Gone a while after it ends: the node's label says from then on whether it holds the model.
            "ttlSecondsAfterFinished": 600,
            # Not the ModelServer's selector label: its pods are no replicas. The operator's label: the
            # node agent's NetworkPolicy lets in the pods it makes.
            "template": {"metadata": {"labels": PREFETCH_POD_LABELS}, "spec": pod},
        },
    }


def _pod_template(ms: ModelServer, pod: dict[str, Any], serving: dict[str, str] | None = None) -> dict[str, Any]:
    """`serving`: the labels of pods that serve HTTP (the InferencePool's, with pools on)."""
    pod_labels = {**labels(ms), **(serving or {})}
    if pod.get("initContainers"):
        # The node agent keeps a model while a pod on its node carries its key.
        pod_labels[POD_MODEL_LABEL] = model_key(ms.spec.model)
    return {
        "metadata": {"labels": pod_labels, "annotations": _pod_annotations(ms, pod["containers"][0]["name"])},
        "spec": pod,
    }


def rolling_update(ms: ModelServer) -> dict[str, int]:
    """Surge: never take a serving replica away before its replacement can answer (it needs the GPUs
    of one more replica). Replace: free an old replica's GPUs first, for a cluster with none spare."""
    if ms.spec.rollout_strategy == RolloutStrategy.REPLACE:
        return {"maxSurge": 0, "maxUnavailable": 1}
    return {"maxSurge": 1, "maxUnavailable": 0}


def deployment(ms: ModelServer, settings: Settings, replicas: int | None = None) -> dict[str, Any]:
    """`replicas`: the autoscaler's count (None: where it starts, min + buffer)."""
    spec = ms.spec
    containers, engine, grace_seconds = _containers(ms, settings)
    pod = _pod_spec(ms, containers, engine, grace_seconds, with_keys=True)
    _with_node_cache(ms, settings, engine, pod)
    _with_pull_secrets(ms, settings, pod)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(ms, ms.name),
        "spec": {
            "replicas": desired_replicas(spec.replicas) if replicas is None else replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": settings.startup_seconds,
            "selector": {"matchLabels": {SELECTOR_LABEL: ms.name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(ms)},
            "template": _pod_template(ms, pod, pools.pod_labels(ms, settings)),
        },
    }


def _one_pod_per_node(ms: ModelServer) -> dict[str, Any]:
    """No two pods of one group on the same node (a replica spans `nodes` nodes, as asked), while
    groups may share nodes: pods of this ModelServer with the same group key repel each other."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {SELECTOR_LABEL: ms.name}},
                    "matchLabelKeys": [LWS_GROUP_KEY_LABEL],
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


def leader_worker_set(ms: ModelServer, settings: Settings, replicas: int | None = None) -> dict[str, Any]:
    """A replica spanning `nodes` nodes: one LeaderWorkerSet group of that many pods. The leader runs
    the engine's serving side and the sidecar (the only pod that serves HTTP, the one the Service
    selects); the workers run the engine's other ranks. `replicas` counts groups."""
    spec = ms.spec
    engine = engine_for(spec.profile)
    image = settings.engine_image(engine.name, engine.image)
    done_seconds = sidecar_done_seconds(settings)
    grace_seconds = done_seconds + ENGINE_SHUTDOWN_SECONDS

    fetched = versions.node_cache(ms, settings)

    def pod(role: Role) -> dict[str, Any]:
        leader = role == Role.LEADER
        # The leader's engine stops once its sidecar is done; the workers' (no sidecar) after the drain.
        port = sidecar_settings(ms, settings).listen_port if leader else None
        engine_container = engine.container(ms, image, done_seconds, settings.hub_endpoint, role, fetched, port)
        containers = [engine_container, sidecar_container(ms, settings)] if leader else [engine_container]
        # Workers keep running until their leader's drain is over: the same grace period.
        pod = _pod_spec(ms, containers, engine, grace_seconds, with_keys=leader)
        pod["affinity"] = _one_pod_per_node(ms)
        _with_node_cache(ms, settings, engine, pod)  # every pod of a group loads the weights
        _with_pull_secrets(ms, settings, pod)
        return _pod_template(ms, pod, pools.pod_labels(ms, settings) if leader else None)

    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _metadata(ms, ms.name),
        "spec": {
            "replicas": desired_replicas(spec.replicas) if replicas is None else replicas,
            # Workers start with their leader: they need only its address, not its readiness.
            "startupPolicy": "LeaderCreated",
            # A headless Service per group (`<name>-<group>`), not the shared one LeaderWorkerSet would
            # name `<name>`: that name is the ModelServer's own Service, and with it taken LeaderWorkerSet
            # makes none, so the leader address (<name>-<group>.<subdomain>.<namespace>) would not resolve.
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            # As the Deployment's: by rolloutStrategy, a new group first or an old one first.
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling_update(ms)},
            "leaderWorkerTemplate": {
                "size": spec.node_count,
                # A group is one engine: a pod that restarts has lost its ranks' state, so the whole
                # group is made again (LeaderWorkerSet's default, written out).
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod(Role.LEADER),
                "workerTemplate": pod(Role.WORKER),
            },
        },
    }


def _workload(ms: ModelServer, settings: Settings, replicas: int | None = None) -> dict[str, Any]:
    if ms.spec.multi_node:
        return leader_worker_set(ms, settings, replicas)
    return deployment(ms, settings, replicas)


def pod_templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template of a workload: a Deployment's, a LeaderWorkerSet's leaders' and workers'."""
    if workload["kind"] == LWS_KIND:
        group = workload["spec"]["leaderWorkerTemplate"]
        return [group["leaderTemplate"], group["workerTemplate"]]
    return [workload["spec"]["template"]]


def image_versions(ms: ModelServer, settings: Settings, live: dict[str, Any] | None) -> tuple[Versions, Versions, str]:
    """(the images the operator would run now, those to render, the template hash to record), given
    the `live` workload of the same kind (None: none yet). See versions.py."""
    current = versions.operator_versions(ms, settings)
    spec_hash = versions.template_hash(
        pod_templates(_workload(*versions.rendering(settings, ms, versions.placeholder(ms)))) + versions.hashed(ms)
    )
    running = versions.recorded(live, serving_pod_template(live) if live else None)
    return current, versions.in_use(ms, current, live, running, spec_hash), spec_hash


def workload(
    ms: ModelServer, settings: Settings, replicas: int | None = None, live: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What runs the replicas: a LeaderWorkerSet when one spans nodes, else a Deployment. `live`: the
    one running now, whose images are kept unless the pods are replaced anyway (versions.py)."""
    _, used, spec_hash = image_versions(ms, settings, live)
    body = _workload(*versions.rendering(settings, ms, used), replicas)
    body["metadata"]["annotations"] = versions.annotations(used, spec_hash)
    return body


def serving_pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod template of the pods that serve HTTP: a Deployment's, a LeaderWorkerSet's leaders'."""
    if workload["kind"] == LWS_KIND:
        return workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    return workload["spec"]["template"]


def workload_kinds(ms: ModelServer) -> tuple[tuple[str, str], tuple[str, str]]:
    """((apiVersion, kind) of the workload the spec asks for, that of the one it does not): a
    ModelServer that changes between one node and several has its old workload deleted."""
    deployment_kind, lws_kind = ("apps/v1", "Deployment"), (LWS_API_VERSION, LWS_KIND)
    return (lws_kind, deployment_kind) if ms.spec.multi_node else (deployment_kind, lws_kind)


def service_selector(ms: ModelServer) -> dict[str, str]:
    """The pods that serve: every pod of a Deployment, a LeaderWorkerSet's leaders (its workers have
    no sidecar and serve no HTTP)."""
    if ms.spec.multi_node:
        return {SELECTOR_LABEL: ms.name, LWS_WORKER_INDEX_LABEL: "0"}
    return {SELECTOR_LABEL: ms.name}


def _service_port(ms: ModelServer) -> dict[str, Any]:
    if ms.spec.tls:
        name = contract.TLS_PORT_NAME
        return {"name": name, "port": TLS_SERVICE_PORT, "targetPort": name, "protocol": "TCP", "appProtocol": name}
    return {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}


def service(ms: ModelServer) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ms, ms.name),
        "spec": {
            "type": "ClusterIP",
            "selector": service_selector(ms),
            "ports": [_service_port(ms)],
        },
    }


def cache_claim(ms: ModelServer) -> dict[str, Any] | None:
    """The hub cache claim the operator owns (cache.size), or None."""
    cache = ms.spec.cache
    if cache is None or cache.size is None:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        claim_spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(ms, f"{ms.name}-hub-cache"),
        "spec": claim_spec,
    }


def chat_template_config_map(ms: ModelServer) -> dict[str, Any] | None:
    """The ConfigMap holding spec.chatTemplate, mounted into the engine, or None."""
    if ms.spec.chat_template is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ms, chat_template_name(ms)),
        "data": {CHAT_TEMPLATE_KEY: ms.spec.chat_template},
    }


def adapters_config_map(ms: ModelServer) -> dict[str, Any] | None:
    """The ConfigMap listing spec.adapters for the sidecars, or None without adapters."""
    if ms.spec.adapters is None:
        return None
    desired = [Desired(adapter.name, adapter.source) for adapter in ms.spec.adapters]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ms, adapters_name(ms)),
        "data": {ADAPTERS_KEY: render_desired(desired)},
    }


def adapters_digest(ms: ModelServer) -> str | None:
    """The hash of the adapters ConfigMap's text, or None without adapters (pure)."""
    config_map = adapters_config_map(ms)
    return None if config_map is None else hashlib.sha256(config_map["data"][ADAPTERS_KEY].encode()).hexdigest()


def key_secret(metadata: dict[str, Any], key: str) -> dict[str, Any]:
    """A Secret holding one API key (for the generated one and for `modelserve key new`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": {GENERATED_KEY_FIELD: key},
    }


def generated_key_secret(ms: ModelServer, key: str) -> dict[str, Any] | None:
    """The key Secret the operator creates once and never applies again (the key must not change),
    or None when it generates none."""
    name = generated_secret_name(ms)
    return key_secret(_metadata(ms, name), key) if name else None


def server_side_applied(
    ms: ModelServer, settings: Settings, replicas: int | None = None, live: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The children kept in place by server-side apply, in apply order (the key Secret is not one):
    what the pods mount comes before the workload (a Deployment or a LeaderWorkerSet, `live` now)."""
    mounted = [cache_claim(ms), chat_template_config_map(ms), adapters_config_map(ms)]
    return [obj for obj in mounted if obj] + [workload(ms, settings, replicas, live), service(ms)]


def owned_objects(ms: ModelServer, settings: Settings, api_key: str) -> list[dict[str, Any]]:
    """Every object the operator makes for one ModelServer (`api_key` goes into a generated Secret)."""
    secret = generated_key_secret(ms, api_key)
    return server_side_applied(ms, settings) + ([secret] if secret else [])


def event(body: dict[str, Any], transition: Transition, now: str, reporter: str) -> dict[str, Any]:
    """A core/v1 Event about the ModelServer (what `kubectl describe ms` lists)."""
    meta = body["metadata"]
    involved = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
        "resourceVersion": meta["resourceVersion"],
    }
    return event_manifest(
        involved, transition.type, transition.reason, transition.message, FIELD_MANAGER, reporter, now
    )
