"""The ModelServer status types (the CRD's status schema is generated from them); operator/status.py
computes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Condition(BaseModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    type: str = Field(
        description="Ready, Progressing or Degraded; TrafficGuard with spec.traffic.guard, Prefetched with "
        "spec.cache.prefetch, InferencePool with the operator's InferencePools."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, e.g. InsufficientGPU or ModelLoading.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="ModelServer generation the condition reflects.")


def utc_now() -> str:
    """A status timestamp (RFC 3339, whole seconds, as the API server writes them)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KeySecretStatus(BaseModel):
    """The API key the operator generated, so a regenerated key shows where users look."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    name: str = Field(description="The Secret holding the generated key (data key api-key).")
    generated_at: str | None = Field(None, description="When the operator last generated the key (RFC 3339).")
    message: str = Field("", description="What happened to the key last.")


class Scaling(BaseModel):
    """The autoscaler's last change of the replica count."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    reason: Literal["ScaleUp", "ScaleDown"] = Field(description="ScaleUp or ScaleDown.")
    message: str = Field(description="From how many to how many replicas, and the demand that decided it.")
    time: str = Field(description="When (RFC 3339).")


class Versions(BaseModel):
    """The images a ModelServer's pods run (those the operator chooses; a spec.image shows as itself),
    and its sidecar's workers, which the operator also chooses unless the spec names them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    sidecar: str = Field(description="The sidecar's image.")
    engine: str | None = Field(None, description="The engine's image (none with profile external).")
    sidecar_workers: int | None = Field(
        None,
        description="The sidecar's workers (spec.sidecar.workers, else the operator's default for the profile "
        "and GPUs, kept like the images).",
    )
    node_cache: bool | None = Field(
        None,
        description="Whether the pods fetch the model through the node's model cache (an init container), kept "
        "like the images: pods made before the operator had the node cache keep starting without it until "
        "they are replaced anyway.",
    )


class Upgrade(BaseModel):
    """Whether the operator would run newer images than the pods do (upgradePolicy Manual keeps them)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    available: Literal["Yes", "No"] = Field(
        description="Yes: the operator's images (or its default sidecar workers) differ from those running."
    )
    sidecar: str | None = Field(None, description="The sidecar image the operator would run now, when it differs.")
    engine: str | None = Field(None, description="The engine image the operator would run now, when it differs.")
    sidecar_workers: int | None = Field(
        None, description="The sidecar workers the operator would run now (its default), when they differ."
    )
    node_cache: bool | None = Field(
        None, description="Whether the operator would fetch the model through the node cache now, when it differs."
    )
    message: str = Field("", description="What the owner can do about it.")


def newer_than_running(upgrade: dict[str, Any]) -> str:
    """What an upgrade (status.upgrade, as stored) would change, for an Event or the CLI: the newer
    images, and the operator's default sidecar workers when they differ."""
    workers = upgrade.get("sidecarWorkers")
    parts = [upgrade.get("sidecar"), upgrade.get("engine"), f"{workers} sidecar workers" if workers else None]
    if upgrade.get("nodeCache") is not None:
        parts.append("the node's model cache" if upgrade["nodeCache"] else "no node cache")
    return ", ".join(part for part in parts if part)


class AdapterStatus(BaseModel):
    """One LoRA adapter across the ready replicas, as their sidecars report it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    name: str = Field(description="The adapter's served name.")
    source: str = Field(description="Where it loads from.")
    phase: Literal["Loaded", "Pending", "Failed"] = Field(
        description="Loaded in every ready replica; Failed when an engine refused it (message: the engine's "
        "words); else Pending."
    )
    loaded_replicas: int = Field(0, description="Ready replicas whose engine serves it.")
    message: str = Field("", description="The engine's message when it refused the adapter, else a summary.")
    load_seconds: float | None = Field(None, description="The longest time an engine took to load it.")


class GuardStatus(BaseModel):
    """The traffic guard of a version (spec.traffic.guard): whether it stopped its new requests, and why."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    tripped: bool = Field(description="True: the gateways send this version no new requests.")
    reset: str = Field("", description="The guard-reset annotation's value this verdict stands under.")
    message: str = Field("", description="What tripped it, with the figures (error rate, p95 time to first byte).")
    since: str | None = Field(None, description="When it tripped (RFC 3339).")


class StartPhases(BaseModel):
    """Seconds of one replica start, phase by phase (operator/starts.py says where each is read)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    schedule: float | None = Field(None, description="Created -> scheduled to a node.")
    image: float | None = Field(None, description="Image pulls and container creation.")
    weights: float | None = Field(None, description="The model's files fetched into the pod (the node cache's fetch).")
    engine: float | None = Field(
        None, description="The engine started -> the pod Ready (load, first answer, warm-up, readiness probe)."
    )


class LastStart(BaseModel):
    """The latest replica start: where its time went and where its weights came from."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    pod: str = Field(description="The pod that started.")
    node: str = Field("", description="Its node.")
    ready_at: str = Field(description="When it turned Ready (RFC 3339).")
    seconds: float = Field(description="Created -> Ready, in seconds.")
    phases: StartPhases = Field(description="The seconds by phase.")
    source: Literal["node", "hub", "mixed", "local"] | None = Field(
        None, description="Where the weights came from: the node's cache, the hub, both, or the pod's own volume."
    )
    hub_bytes: int | None = Field(None, description="Bytes of the model read from the hub for this start.")
    node_bytes: int | None = Field(None, description="Bytes of the model read from the node's cache.")
    node_cache: str | None = Field(
        None, description="Why the node's cache was not used (it was down, full, or failed a file); unset when it was."
    )
    hub_unreachable: bool | None = Field(
        None,
        description="True when the hub could not be reached and the model came from a copy: the node's cache "
        "(only ever a public model: a gated or private one needs the hub's word for the pod's token), or the "
        "pod's own cache volume (spec.cache's claim), which holds what its namespace fetched before.",
    )


class NodeWarmth(BaseModel):
    """One node spec.cache.prefetch selects: whether its node cache holds the model."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    node: str = Field(description="The node.")
    state: Literal["Held", "Fetching", "Failed"] = Field(
        description="Held: its node cache holds the model whole; Fetching: its prefetch Job runs; Failed: it failed."
    )
    message: str | None = Field(None, description="Why it failed.")


class CacheStatus(BaseModel):
    """spec.cache.prefetch, node by node."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    warm: str = Field(description="Nodes holding the model of those selected, e.g. 2/3.")
    nodes: list[NodeWarmth] = Field(
        default_factory=list,
        description="Each selected node.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["node"]},
    )
    message: str | None = Field(None, description="What keeps a node from holding it.")


class PoolParent(BaseModel):
    """One parent (a Gateway) of the namespace's InferencePool, as the gateway wrote it in the pool's
    status.parents."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    kind: str = Field("Gateway", description="The parent's kind.")
    namespace: str = Field("", description="The parent's namespace (empty: the pool's).")
    name: str = Field(description="The parent's name.")
    controller_name: str | None = Field(None, description="The gateway controller that wrote it.")
    accepted: Literal["True", "False", "Unknown"] = Field(description="The parent's Accepted condition.")
    resolved_refs: Literal["True", "False", "Unknown"] = Field(
        description="The parent's ResolvedRefs condition (the picker's Service among the refs)."
    )
    message: str = Field("", description="What the conditions that are not True say.")


class InferencePoolStatus(BaseModel):
    """The namespace's InferencePool (MODELSERVE_INFERENCE_POOLS) and what gateways say of it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    name: str = Field(description="The InferencePool (inference.networking.k8s.io/v1) in this namespace.")
    parents: list[PoolParent] = Field(
        default_factory=list, description="The pool's parents (Gateways), from its status.parents; at most 32."
    )


class ModelServerStatus(BaseModel):
    """What the operator observed, written to the status subresource."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    observed_generation: int | None = Field(None, description="Generation of the spec this status reflects.")
    phase: Literal["Pending", "Loading", "Ready", "Updating", "Degraded", "Idle"] | None = Field(
        None, description="Summary: Pending, Loading, Ready, Updating, Degraded or Idle (no replicas asked)."
    )
    desired_replicas: int | None = Field(None, description="Replicas the autoscaler asks for now.")
    replicas: int | None = Field(
        None,
        description="Replicas the workload runs: pods of the Deployment, or groups of the LeaderWorkerSet "
        "when a replica spans nodes.",
    )
    selector: str | None = Field(
        None, description="Label selector of one pod per replica (a group's leader), for the /scale subresource."
    )
    ready_replicas: int | None = Field(
        None,
        description="Replicas ready: pods whose sidecar reports the model ready; with nodes above 1, groups "
        "whose every pod is ready.",
    )
    endpoint: str | None = Field(None, description="In-cluster base URL of the OpenAI-compatible API.")
    gateway_endpoint: str | None = Field(
        None,
        description="In-cluster base URL of the gateway, one endpoint for every model (the request's model "
        "picks); it holds requests while the model scales from zero.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing and Degraded; TrafficGuard with spec.traffic.guard; Prefetched with "
        "spec.cache.prefetch; InferencePool with the operator's InferencePools (MODELSERVE_INFERENCE_POOLS).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    key_secret: KeySecretStatus | None = Field(
        None, description="The generated API key's Secret (auth.mode private without auth.secretName)."
    )
    scaling: Scaling | None = Field(None, description="The autoscaler's last change of the replica count.")
    guard: GuardStatus | None = Field(None, description="The traffic guard's verdict (spec.traffic.guard).")
    versions: Versions | None = Field(None, description="The images the pods are made with.")
    upgrade: Upgrade | None = Field(None, description="Whether newer images are available (operator upgrade).")
    adapters: list[AdapterStatus] | None = Field(
        None,
        description="Each of spec.adapters in the ready replicas' engines (loaded, pending, or failed with the "
        "engine's message).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    last_start: LastStart | None = Field(None, description="The latest replica start, phase by phase.")
    cache: CacheStatus | None = Field(None, description="spec.cache.prefetch: which selected nodes hold the model.")
    inference_pool: InferencePoolStatus | None = Field(
        None,
        description="The namespace's InferencePool this ModelServer's pods are in, and its Gateways "
        "(MODELSERVE_INFERENCE_POOLS).",
    )


@dataclass(frozen=True)
class Transition:
    """A condition that changed, worth an Event."""

    type: str  # Normal or Warning
    reason: str
    message: str
