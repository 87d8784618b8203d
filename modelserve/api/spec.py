"""The ModelServer resource as pydantic models, camelCase on the wire.

The CRD schema is generated from these classes (`crd.py`). Cross-field rules are declared once,
as `Rule`s on the class they constrain, and enforced twice: as CEL `x-kubernetes-validations` in
the API server and by the model's own validator, so an offline render refuses what
`kubectl apply` refuses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel

from modelserve.contracts.choices import AcrossNodes, Dtype
from modelserve.engines import ENGINES, Profile, view

from . import engine_rules
from .rules import Rule

GROUP = "serving.modelserve.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ModelServer"
PLURAL = "modelservers"


def _add_rules_to_schema(schema: dict[str, Any], cls: type) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_validation() for rule in rules]


class WireModel(BaseModel):
    """Base of every spec class: camelCase aliases, unknown fields refused, immutable, rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel,  # and only the camelCase names: the API server knows no others
        extra="forbid",
        frozen=True,
        json_schema_extra=_add_rules_to_schema,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> WireModel:
        broken = [rule.message for rule in self.rules if not rule.holds(self)]
        if broken:
            raise ValueError("; ".join(broken))
        return self

    def to_wire(self) -> dict[str, Any]:
        """The JSON form a manifest carries: aliases, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# Kubernetes resource.Quantity, as its own validation spells it (RE2-compatible).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)]
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ObjectName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
LabelValue = Annotated[str, StringConstraints(max_length=63)]
# What an engine profile loads: a hub id `<org>/<name>` (with an optional `:<quant>` tag for GGUF
# repos); no backslash, so CEL takes it as it is. Checked by a rule, since profile external takes
# an external server's own ids too (e.g. Ollama's `llama3.2:1b`), which the schema's pattern allows.
HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9._-]+)?$"
# Any model id: an absolute path, or letters, digits and `._:@/-`.
MODEL_PATTERN = r"^(/\S+|[A-Za-z0-9][A-Za-z0-9._:@/-]*)$"
# An http(s) server root: no credentials in it (the URL shows in the pod spec and the sidecar's log),
# no query or fragment.
EXTERNAL_URL_PATTERN = r"^https?://[^\s/?#@]+(/[^\s?#]*)?$"
# The ModelServer name names the Service, so it must be a DNS-1035 label.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 63
MAX_GPUS = 64
MAX_NODES = 16


class AuthMode(StrEnum):
    """Whether the sidecar requires an API key."""

    PRIVATE = "private"
    PUBLIC = "public"


class UpgradePolicy(StrEnum):
    """Whether a new operator release's sidecar and engine images reach a running ModelServer."""

    MANUAL = "Manual"  # kept until the spec changes the pods anyway, or the owner picks Automatic
    AUTOMATIC = "Automatic"  # taken at once: every pod rolls when the operator is upgraded


class RolloutStrategy(StrEnum):
    """How a change of the pods replaces the running ones."""

    SURGE = "Surge"  # a new pod first, then an old one goes: no capacity lost, needs spare GPUs
    REPLACE = "Replace"  # an old pod goes first, its GPUs serve the new one: one replica fewer meanwhile


class Replicas(WireModel):
    min: int = Field(1, ge=0, le=1000, description="Replicas kept warm at all times (0 allows scale to zero).")
    buffer: int = Field(
        0, ge=0, le=1000, description="Idle replicas kept above current demand, for bursts and preempted GPUs."
    )
    max: int = Field(1, ge=1, le=1000, description="Ceiling on replicas.")
    target_per_replica: int | None = Field(
        None,
        ge=1,
        le=10000,
        description="Requests in flight one replica serves at full speed, the autoscaler's target: demand "
        "above it adds replicas. Unset: 64 for high-throughput, 32 for low-latency (or the engine's batch if "
        "smaller), the engine's slots for cpu (llama.cpp's --parallel, 4 unless engineArgs say), 8 for "
        "external. How many reach the "
        "engine at once is the engine's own batch, not this (--max-num-seqs, --max-running-requests, "
        "--parallel in engineArgs, else the engine's default).",
    )
    scale_down_delay_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="Replicas go only once demand has wanted fewer for this long (cold starts take minutes).",
    )
    idle_window_seconds: int = Field(
        600,
        ge=1,
        le=86400,
        description="With no request for this long the buffer is let go, and with min 0 the last replica.",
    )
    count: int | None = Field(
        None,
        ge=0,
        le=1000,
        description="Set through the /scale subresource (kubectl scale, an HPA, KEDA): exactly this many "
        "replicas, between min and max, and the built-in autoscaler off. Unset: the autoscaler decides.",
    )

    rules = (
        Rule("self.min <= self.max", "replicas.min must not exceed replicas.max", "min", lambda r: r.min <= r.max),
        Rule(
            "self.min + self.buffer <= self.max",
            "replicas.min + replicas.buffer must not exceed replicas.max",
            "buffer",
            lambda r: r.min + r.buffer <= r.max,
        ),
        Rule(
            "!has(self.count) || (self.count >= self.min && self.count <= self.max)",
            "replicas.count must be between replicas.min and replicas.max",
            "count",
            lambda r: r.count is None or r.min <= r.count <= r.max,
        ),
    )


class TrafficGuard(WireModel):
    """A version's guard: compared with the stable versions of its served name, over windows of requests."""

    window: int = Field(
        50,
        ge=20,
        le=1000,
        description="Requests judged: this version's last this many answers, against the stable versions' "
        "last this many (at least 20: the p95 of fewer is their slowest, and one stray answer would trip it).",
    )
    max_error_rate: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Highest share of the window that may fail (5xx, or the replica unreachable or cut off).",
    )
    max_time_to_first_token_ratio: float = Field(
        2.0,
        ge=1,
        le=100,
        description="Highest p95 time to first byte over the window, as a multiple of the stable versions' "
        "p95 (judged once they have answered a full window too).",
    )
    min_slowdown_seconds: float = Field(
        0.2,
        ge=0,
        le=600,
        description="How much higher than the stable versions' the p95 must also be to trip the guard: on "
        "answers of tens of milliseconds, a ratio alone trips on scheduling noise.",
    )


class Traffic(WireModel):
    """How the gateway offers this ModelServer: under which model name, and what share of that name's requests."""

    served_name: Annotated[str, StringConstraints(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)] | None = Field(
        None,
        description="The model name clients send to the gateway; ModelServers of one namespace with the same "
        "servedName are versions of one model and share its requests by weight (the gateway lists the name "
        "once). Default: metadata.name.",
    )
    weight: int = Field(
        100,
        ge=0,
        le=100,
        description="This version's share of its served name's requests, relative to the other versions' "
        "weights (90 and 10: a tenth here). 0: no new requests. A conversation stays on one version.",
    )
    guard: TrafficGuard | None = Field(
        None,
        description="Stop new requests to this version when it fails more, or answers slower, than the stable "
        "versions (those without a guard); status condition TrafficGuard says why, with the figures. The "
        "annotation serving.modelserve.dev/guard-reset, set to a new value, clears a tripped guard.",
    )


STOP_MAX_ITEMS = 4
STOP_MAX_LENGTH = 256


class SamplingDefaults(WireModel):
    temperature: float | None = Field(None, ge=0, le=2, description="Randomness; 0 is deterministic.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling cut-off (top_p).")
    top_k: int | None = Field(None, ge=-1, le=1000, description="Sample from the k most probable tokens; -1 disables.")
    min_p: float | None = Field(
        None, ge=0, le=1, description="Minimum token probability relative to the most likely one."
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0,
        le=2,
        description="Values above 1 discourage repetition (repetition_penalty; the sidecar also sends it to "
        "llama.cpp as repeat_penalty, the only name that engine reads).",
    )
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description="Tokens generated at most (max_tokens).")
    # At most 4, as OpenAI's API takes (clients validate against it); vLLM, SGLang and llama.cpp take more.
    stop: (
        Annotated[
            list[Annotated[str, StringConstraints(min_length=1, max_length=STOP_MAX_LENGTH)]],
            Field(min_length=1, max_length=STOP_MAX_ITEMS),
        ]
        | None
    ) = Field(
        None,
        description=f"Strings that end generation (stop), e.g. a chat template's end-of-turn marker: 1 to "
        f"{STOP_MAX_ITEMS} strings of at most {STOP_MAX_LENGTH} characters; a request's own stop replaces the list.",
    )


class Auth(WireModel):
    mode: AuthMode = Field(
        AuthMode.PRIVATE, description="private: every request needs an API key; public: no key needed."
    )
    secret_name: ObjectName | None = Field(
        None,
        description="Secret whose every data entry holds API keys (one per line). Unset with private: "
        "the operator generates `<name>-api-keys` once and never rewrites it.",
    )

    rules = (
        Rule(
            "self.mode == 'private' || !has(self.secretName)",
            "auth.secretName only applies to auth.mode private",
            "secretName",
            lambda a: a.mode == AuthMode.PRIVATE or a.secret_name is None,
        ),
    )


# An external server's target when targetPerReplica is unset (an Ollama host serves a few at once).
EXTERNAL_TARGET_PER_REPLICA = 8
MAX_SIDECAR_WORKERS = 16
# Unset, the workers follow the token rate the engine's GPUs stream (Engine.token_events, by the model's
# size: engines/token_rates.py): one per this many token events/s (measured on two cores: at about 13k
# events/s per worker the tail latency was near nginx's in most runs, one worker saturates a core near
# 40k; docs/performance.md), at most DEFAULT_MAX_SIDECAR_WORKERS.
EVENTS_PER_SIDECAR_WORKER = 12_000
DEFAULT_MAX_SIDECAR_WORKERS = 8


class Sidecar(WireModel):
    """The sidecar in front of the engine (or the external server): keys, limits, the fair share."""

    workers: int | None = Field(
        None,
        ge=1,
        le=MAX_SIDECAR_WORKERS,
        description="Sidecar processes relaying on the pod's one port. Unset (GPU profiles): one per 12k "
        "streamed tokens/s the engine's GPUs may send at full batch, at most 8, the rate estimated from the "
        "model's size in its name: about 100k/(billions of active parameters) tokens/s per GPU, at most 40k, "
        "8B when the name gives no size (an 8B model on 1 GPU: 2; a 1.2B: 4; a 70B on 4 GPUs: 1); cpu and "
        "external: 1. Pods running when an operator upgrade changes that default keep theirs until they "
        "are replaced anyway. They share a key's limits and the engine's slots as one process would. Each "
        "beyond the first adds 500m CPU and 64Mi memory to the sidecar's requests and 256Mi to its memory "
        "limit.",
    )


class SecretKeyRef(WireModel):
    name: ObjectName = Field(description="Secret in the ModelServer's namespace.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        "token", description="Data key in that Secret."
    )


class LocalObjectReference(WireModel):
    name: ObjectName = Field(description="Secret in the ModelServer's namespace.")


class TLS(WireModel):
    """HTTPS on the model's pods: the sidecar serves it, so keys never cross the network in clear."""

    secret_name: ObjectName = Field(
        description="kubernetes.io/tls Secret in the ModelServer's namespace (tls.crt, tls.key; cert-manager's shape) "
        "whose certificate names the Service (<name>.<namespace>.svc): each pod's sidecar serves HTTPS with it, on "
        "the Service's port 443, and serves a renewal without a restart. The gateway checks it against its "
        "MODELSERVE_GATEWAY_UPSTREAM_CA_FILE (the chart's gateway.upstreamTLS)."
    )


class Prefetch(WireModel):
    """Nodes to place the model on before any pod needs it (a fetch Job per node, in this namespace)."""

    node_selector: Annotated[dict[str, LabelValue], Field(min_length=1, max_length=32)] = Field(
        description="Labels of the nodes to warm; every matching node gets the model in its node cache."
    )


class Cache(WireModel):
    claim_name: ObjectName | None = Field(None, description="Existing PersistentVolumeClaim to use as the hub cache.")
    size: Quantity | None = Field(
        None, description="Size of a new PersistentVolumeClaim `<name>-hub-cache` the operator creates and owns."
    )
    storage_class_name: ObjectName | None = Field(None, description="Storage class of the new claim (with size).")
    node: bool | None = Field(
        None,
        description="Fetch the model through the node's model cache (the chart's nodeCache): each pod's init "
        "container fetches it from the agent on its node, which holds it after the first pod there, so later "
        "pods on the node read no byte from the hub. false: the engine downloads as it starts. Unset: the node "
        "cache where the operator has one (a ModelServer made before it takes it when its pods are replaced "
        "anyway, or when this is set).",
    )
    prefetch: Prefetch | None = Field(
        None, description="Place the model in the node cache of these nodes before any pod needs it."
    )

    rules = (
        Rule(
            "!(has(self.claimName) && has(self.size))",
            "cache.claimName and cache.size are exclusive: one names a claim, the other makes one",
            "size",
            lambda c: c.claim_name is None or c.size is None,
        ),
        Rule(
            "has(self.claimName) || has(self.size) || has(self.node) || has(self.prefetch)",
            "cache needs one of cache.claimName, cache.size, cache.node and cache.prefetch",
            "size",
            lambda c: any(v is not None for v in (c.claim_name, c.size, c.node, c.prefetch)),
        ),
        Rule(
            "!has(self.storageClassName) || has(self.size)",
            "cache.storageClassName only applies with cache.size",
            "storageClassName",
            lambda c: c.storage_class_name is None or c.size is not None,
        ),
        Rule(
            "!has(self.prefetch) || !(has(self.claimName) || has(self.size))",
            "cache.prefetch warms the nodes' caches, which a claim does not read from: with cache.claimName or "
            "cache.size the model is on the claim",
            "prefetch",
            lambda c: c.prefetch is None or (c.claim_name is None and c.size is None),
        ),
        Rule(
            "!has(self.prefetch) || !has(self.node) || self.node",
            "cache.prefetch needs the node cache: cache.node is false",
            "prefetch",
            lambda c: c.prefetch is None or c.node is not False,
        ),
    )


class KeyRef(WireModel):
    name: ObjectName = Field(description="Object in the ModelServer's namespace.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(description="Data key.")
    optional: bool | None = Field(None, description="Start even when the key is missing.")


class FieldRef(WireModel):
    field_path: Annotated[str, StringConstraints(min_length=1, max_length=256)] = Field(
        description="Pod field, e.g. metadata.name or status.podIP."
    )


class EnvVarSource(WireModel):
    secret_key_ref: KeyRef | None = Field(None, description="Value from a Secret key.")
    config_map_key_ref: KeyRef | None = Field(None, description="Value from a ConfigMap key.")
    field_ref: FieldRef | None = Field(None, description="Value from a pod field.")

    rules = (
        Rule(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)].filter(x, x).size() == 1",
            "valueFrom needs exactly one of secretKeyRef, configMapKeyRef and fieldRef",
            "secretKeyRef",
            lambda s: [s.secret_key_ref, s.config_map_key_ref, s.field_ref].count(None) == 2,
        ),
    )


class EnvVar(WireModel):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)] = Field(
        description="Variable name."
    )
    value: Annotated[str, StringConstraints(max_length=32768)] | None = Field(None, description="Literal value.")
    value_from: EnvVarSource | None = Field(None, description="Value taken from a Secret, ConfigMap or pod field.")

    rules = (
        Rule(
            "!(has(self.value) && has(self.valueFrom))",
            "env entries take value or valueFrom, not both",
            "valueFrom",
            lambda e: e.value is None or e.value_from is None,
        ),
    )


class Toleration(WireModel):
    key: Annotated[str, StringConstraints(max_length=316)] | None = Field(
        None, description="Taint key; unset matches all."
    )
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (the default).")
    value: Annotated[str, StringConstraints(max_length=63)] | None = Field(None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; unset matches all."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="How long a NoExecute taint is tolerated.")

    rules = (
        Rule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value)",
            "tolerations with operator Exists take no value",
            "value",
            lambda t: t.operator != "Exists" or t.value is None,
        ),
    )


# An adapter's served name: what clients put in `model`. No ':' (SGLang reads <base>:<adapter>) and no
# '/' (the gateway reads <namespace>/<name>).
ADAPTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"
# A hub id without a :quant tag, or an absolute path (in the cache volume).
ADAPTER_SOURCE_PATTERN = r"^(/\S+|[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)$"
MAX_ADAPTERS = 32
# "runai_streamer or fastsafetensors with profile high-throughput (vLLM 0.33.0); ... low-latency ..."
LOAD_FORMATS_TAKEN = engine_rules.load_formats_taken()
ADAPTERS_NAMED = engine_rules.named(engine_rules.adapter_profiles())  # "profiles high-throughput and low-latency"
# vLLM 0.33.0's --max-lora-rank choices (config/lora.py MaxLoRARanks); SGLang takes any rank.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class Adapter(WireModel):
    """One LoRA adapter of the ModelServer's model, served under its own name."""

    name: Annotated[str, StringConstraints(pattern=ADAPTER_NAME_PATTERN, max_length=63)] = Field(
        description="The adapter's served name: clients put it in `model` as they put the ModelServer's name."
    )
    source: Annotated[str, StringConstraints(pattern=ADAPTER_SOURCE_PATTERN, max_length=256)] = Field(
        description="Hub id `<org>/<name>` of a PEFT adapter repository (downloaded by the engine through the "
        "hub endpoint into the hub cache) or an absolute path in the cache volume."
    )


class AdapterLimits(WireModel):
    """What the engine reserves for adapters when it starts (a change restarts the pods)."""

    max_rank: int = Field(
        view.DEFAULT_MAX_RANK,
        description="Largest adapter rank the engine accepts (vLLM --max-lora-rank, SGLang --max-lora-rank); "
        f"vLLM 0.33.0 takes {', '.join(map(str, LORA_RANKS))}.",
    )
    max_per_batch: int = Field(
        view.DEFAULT_MAX_PER_BATCH,
        ge=1,
        le=MAX_ADAPTERS,
        description="Adapters in one running batch (vLLM --max-loras; SGLang --max-loras-per-batch, which "
        "counts the base too, gets one more); more adapters may be loaded, they take turns.",
    )

    rules = (
        Rule(
            f"self.maxRank in {list(LORA_RANKS)}",
            f"adapterLimits.maxRank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM 0.33.0's choices)",
            "maxRank",
            lambda a: a.max_rank in LORA_RANKS,
        ),
    )


# In characters (what the API server counts): up to 4 bytes each in UTF-8, so at most 512 KiB,
# well inside a ConfigMap's 1 MiB; real templates are a few KiB.
CHAT_TEMPLATE_MAX_LENGTH = 128 * 1024

QuantityMap = Annotated[dict[str, Quantity], Field(max_length=16)]


class Resources(WireModel):
    limits: QuantityMap | None = Field(None, description="Limits of the engine container (cpu, memory, ...).")
    requests: QuantityMap | None = Field(None, description="Requests of the engine container (cpu, memory, ...).")

    rules = tuple(
        Rule(
            f"!has(self.{part}) || !('nvidia.com/gpu' in self.{part})",
            f"resources.{part} must not name nvidia.com/gpu: set spec.gpus",
            part,
            lambda r, part=part: "nvidia.com/gpu" not in (getattr(r, part) or {}),
        )
        for part in ("limits", "requests")
    )


class External(WireModel):
    url: Annotated[str, StringConstraints(pattern=EXTERNAL_URL_PATTERN, max_length=2048)] = Field(
        description="Root URL of the OpenAI-compatible server, e.g. http://10.0.0.5:11434 (Ollama) or "
        "http://mac-studio.lan:8080 (mlx_lm.server); the sidecar appends /v1/... to it."
    )

    rules = (
        Rule(
            "!self.url.endsWith('/v1') && !self.url.endsWith('/v1/')",
            "external.url is the server's root, without /v1: the sidecar appends /v1/... itself",
            "url",
            lambda e: not e.url.rstrip("/").endswith("/v1"),
        ),
    )


# The fields that configure an engine, which profile external has none of: (wire name, attribute,
# CEL saying it is set). The fields only some engines read have their rules (engine_rules.py).
ENGINE_FIELDS = (
    ("gpus", "gpus", "has(self.gpus)"),
    ("dtype", "dtype", "self.dtype != 'auto'"),
    ("maxModelLen", "max_model_len", "has(self.maxModelLen)"),
    ("gpuMemoryUtilization", "gpu_memory_utilization", "has(self.gpuMemoryUtilization)"),
    ("toolCallParser", "tool_call_parser", "has(self.toolCallParser)"),
    ("loadFormat", "load_format", "has(self.loadFormat)"),
    ("chatTemplate", "chat_template", "has(self.chatTemplate)"),
    ("hfTokenSecretRef", "hf_token_secret_ref", "has(self.hfTokenSecretRef)"),
    ("cache", "cache", "has(self.cache)"),
    ("image", "image", "has(self.image)"),
    ("engineArgs", "engine_args", "has(self.engineArgs) && self.engineArgs.size() > 0"),
    ("env", "env", "has(self.env) && self.env.size() > 0"),
    ("resources", "resources", "has(self.resources)"),
    ("shmSize", "shm_size", "has(self.shmSize)"),
)


def _engine_field_is_set(spec: Any, attribute: str) -> bool:
    value = getattr(spec, attribute)
    if attribute == "dtype":
        return value != Dtype.AUTO
    return bool(value) if isinstance(value, list) else value is not None


def _external_rules() -> tuple[Rule, ...]:
    """Profile external runs no engine: every field that configures one is refused, by name."""
    return tuple(
        Rule(
            f"self.profile != '{Profile.EXTERNAL}' || !({is_set})",
            f"{wire} does not apply to profile external: the external server runs the model",
            wire,
            lambda s, attribute=attribute: s.profile != Profile.EXTERNAL or not _engine_field_is_set(s, attribute),
        )
        for wire, attribute, is_set in ENGINE_FIELDS
    )


def _refuse_repeats(field: str, names: list[str]) -> None:
    """A list keyed by name holds each name once: the CRD says the same with x-kubernetes-list-type map."""
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{field} names must be unique; repeated: {', '.join(duplicates)}")


class ModelServerSpec(WireModel):
    """What to serve and how; the operator turns it into a Deployment, a Service and a key Secret."""

    model: Annotated[str, StringConstraints(pattern=MODEL_PATTERN, max_length=256)] = Field(
        description="Hub id `<org>/<name>` (e.g. LiquidAI/LFM2-1.2B; profile cpu also takes "
        "`<org>/<repo>:<quant>` of a GGUF repo) or an absolute path in the cache volume; with profile "
        "external, the id the external server lists in /v1/models (e.g. llama3.2:1b)."
    )
    profile: Profile = Field(
        Profile.HIGH_THROUGHPUT,
        description=engine_rules.profiles_described(),
    )
    external: External | None = Field(
        None, description="profile external only: the OpenAI-compatible server outside the cluster."
    )
    dtype: Dtype = Field(
        Dtype.AUTO, description="Weights/activations type for the GPU engines; cpu takes the GGUF's own types."
    )
    max_model_len: int | None = Field(
        None, ge=1, le=10_000_000, description="Context length in tokens; unset: the model's own."
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of each GPU's memory the engine may use (vLLM --gpu-memory-utilization, "
        "SGLang --mem-fraction-static); unset: the engine's default.",
    )
    tool_call_parser: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=64)] | None = (
        Field(
            None,
            description="Tool-call parser of the model family, as the profile's engine spells it (vLLM: e.g. lfm2, "
            "hermes, llama3_json; SGLang: e.g. lfm2, hermes, llama3); enables tool_choice auto.",
        )
    )
    load_format: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_]*$", max_length=64)] | None = Field(
        None,
        description=f"A faster weight loader, passed to the engine as --load-format: {LOAD_FORMATS_TAKEN}. "
        "runai_streamer streams safetensors with concurrent reads; fastsafetensors needs its package in the "
        "engine image and GPU direct storage to pay off. Unset: the engine's own loader.",
    )
    chat_template: Annotated[str, StringConstraints(min_length=1, max_length=CHAT_TEMPLATE_MAX_LENGTH)] | None = Field(
        None,
        description="Jinja chat template the engine uses instead of the model's own (vLLM and SGLang "
        "--chat-template, llama.cpp --chat-template-file); kept in the ConfigMap `<name>-chat-template`. "
        "The engine parses it when it starts.",
    )
    gpus: int | None = Field(
        None,
        ge=0,
        le=MAX_GPUS,
        description="GPUs per replica, across all its nodes (with nodes N, each of its N pods gets gpus / N as "
        "its nvidia.com/gpu limit); unset: 1 for the GPU profiles, 0 for cpu.",
    )
    nodes: int | None = Field(
        None,
        ge=1,
        le=MAX_NODES,
        description="Nodes one replica spans (GPU profiles): above 1, each replica is a LeaderWorkerSet group of "
        "this many pods, one per node (needs the LeaderWorkerSet controller); unset: 1, a Deployment.",
    )
    across_nodes: AcrossNodes | None = Field(
        None,
        description="With nodes above 1, how the model is split between nodes: pipeline (tensor parallel "
        "within a node, pipeline parallel across nodes: the least traffic between nodes) or tensor (tensor "
        "parallel over every GPU of the group: needs a fast interconnect); unset: pipeline.",
    )
    replicas: Replicas = Field(
        default=Replicas(),
        description="Replica bounds and the autoscaler: demand in flight over targetPerReplica, plus buffer "
        "while active, between min and max.",
    )
    torch_compile: bool = Field(
        False, description="low-latency only: compile the model (longer start, lower per-token latency)."
    )
    chunked_prefill_size: int | None = Field(
        None, ge=-1, le=1_000_000, description="low-latency only: prefill chunk in tokens; -1 disables chunking."
    )
    vision: bool = Field(False, description="The model accepts image_url parts; otherwise the sidecar refuses them.")
    sampling_defaults: SamplingDefaults | None = Field(
        None, description="Sampling values the sidecar fills in where a request leaves them out."
    )
    auth: Auth = Field(default=Auth(), description="API-key authentication enforced by the sidecar.")
    sidecar: Sidecar | None = Field(None, description="The sidecar's processes.")
    hf_token_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key holding a hub token for gated models (HF_TOKEN)."
    )
    cache: Cache | None = Field(
        None, description="Hub cache volume at /root/.cache/huggingface; unset: an emptyDir per pod."
    )
    tls: TLS | None = Field(None, description="HTTPS on the model's pods; unset: plain HTTP inside the cluster.")
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] = Field(
        default_factory=list,
        description="Secrets (kubernetes.io/dockerconfigjson, in the ModelServer's namespace) the model's pods and "
        "prefetch Jobs pull the sidecar and engine images with, before the operator's own "
        "(MODELSERVE_IMAGE_PULL_SECRETS, the chart's modelPods.imagePullSecrets).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    image: Annotated[str, StringConstraints(pattern=r"^[^\s]+$", max_length=512)] | None = Field(
        None,
        description="Engine image instead of the profile's pinned one; the operator still writes the pinned "
        "version's flags and checks toolCallParser and loadFormat against the pinned version's names.",
    )
    engine_args: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=1024)]], Field(max_length=64)
    ] = Field(default_factory=list, description="Extra engine flags, appended last.")
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(
        default_factory=list,
        description="Extra engine environment; wins over the operator's variables of the same name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    adapters: Annotated[list[Adapter], Field(max_length=MAX_ADAPTERS)] | None = Field(
        None,
        description=f"LoRA adapters of the model ({ADAPTERS_NAMED}), each served under its own name. Setting the "
        "field (even to []) starts the engine with LoRA on; adding or removing adapters afterwards loads or "
        "unloads them in the running engines, without a restart.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    adapter_limits: AdapterLimits | None = Field(
        None,
        description="With adapters: the largest rank and how many adapters share a batch; unset: "
        f"{view.DEFAULT_MAX_RANK} and {view.DEFAULT_MAX_PER_BATCH}.",
    )
    resources: Resources | None = Field(None, description="Engine container resources besides GPUs.")
    node_selector: Annotated[dict[str, LabelValue], Field(max_length=32)] | None = Field(
        None, description="Node labels a pod's node must carry."
    )
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list, description="Extra tolerations (GPU profiles already tolerate nvidia.com/gpu)."
    )
    shm_size: Quantity | None = Field(
        None, description="Size of the /dev/shm memory volume; unset: the engine's default."
    )
    upgrade_policy: UpgradePolicy = Field(
        UpgradePolicy.MANUAL,
        description="Manual: an operator upgrade leaves the running pods alone; the sidecar and engine images "
        "they run are kept (status.upgrade says when newer ones are available) until a change of this spec "
        "replaces the pods anyway. Automatic: the operator's images are taken at once, rolling every pod.",
    )
    traffic: Traffic | None = Field(
        None,
        description="The gateway's name for this model and this version's share of it (weights, rollback guard).",
    )
    rollout_strategy: RolloutStrategy = Field(
        RolloutStrategy.SURGE,
        description="How changed pods replace running ones. Surge: a new pod starts before an old one goes "
        "(no capacity lost; needs the GPUs of one more replica, and waits for them when none are free). "
        "Replace: an old pod goes first and the new one takes its GPUs (works on a full cluster; one replica "
        "fewer meanwhile, so with one replica the model is down through the cold start).",
    )

    # The rules an engine's facts make (api/engine_rules.py) among the spec's own, in this order.
    rules = (
        *engine_rules.gpu_rules(),
        Rule(
            "!has(self.acrossNodes) || (has(self.nodes) && self.nodes > 1)",
            "acrossNodes only applies with nodes above 1",
            "acrossNodes",
            lambda s: s.across_nodes is None or s.node_count > 1,
        ),
        *engine_rules.own_field_rules(),
        Rule(
            "!has(self.chunkedPrefillSize) || self.chunkedPrefillSize != 0",
            "chunkedPrefillSize must be -1 (no chunking) or a positive number of tokens",
            "chunkedPrefillSize",
            lambda s: s.chunked_prefill_size != 0,
        ),
        *engine_rules.dtype_rules(),
        *engine_rules.gpu_memory_rules(),
        *engine_rules.tool_call_parser_rules(),
        *engine_rules.load_format_rules(),
        Rule(
            f"self.profile == '{Profile.EXTERNAL}' || self.model.startsWith('/') || "
            f"self.model.matches('{HUB_ID_PATTERN}')",
            "model must be a hub id <org>/<name> or an absolute path for the engine profiles",
            "model",
            lambda s: s.profile == Profile.EXTERNAL or s.model.startswith("/") or re.match(HUB_ID_PATTERN, s.model),
        ),
        *engine_rules.tagged_model_rules(),
        Rule(
            "!has(self.cache) || !self.model.startsWith('/') || !(has(self.cache.prefetch) || "
            "(has(self.cache.node) && self.cache.node))",
            "cache.node and cache.prefetch fetch a hub model: a model given as an absolute path is read from the "
            "cache volume as it is",
            "cache",
            lambda s: (
                s.cache is None
                or not s.model.startswith("/")
                or (s.cache.prefetch is None and s.cache.node is not True)
            ),
        ),
        Rule(
            f"(self.profile == '{Profile.EXTERNAL}') == has(self.external)",
            "external (the server's url) is required with profile external and only applies to it",
            "external",
            lambda s: (s.profile == Profile.EXTERNAL) == (s.external is not None),
        ),
        *engine_rules.adapter_rules(),
        Rule(
            "!has(self.adapterLimits) || has(self.adapters)",
            "adapterLimits only applies with adapters",
            "adapterLimits",
            lambda s: s.adapter_limits is None or s.adapters is not None,
        ),
        *_external_rules(),
        *engine_rules.owned_flag_rules(),
        *engine_rules.group_flag_rules(),
        *engine_rules.admin_flag_rules(),
        *engine_rules.removed_flag_rules(),
        *engine_rules.admin_env_rules(),
    )

    @field_validator("env")
    @classmethod
    def _unique_env_names(cls, env: list[EnvVar]) -> list[EnvVar]:
        _refuse_repeats("env", [var.name for var in env])
        return env

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_pull_secrets(cls, secrets: list[LocalObjectReference]) -> list[LocalObjectReference]:
        _refuse_repeats("imagePullSecrets", [secret.name for secret in secrets])
        return secrets

    @field_validator("adapters")
    @classmethod
    def _unique_adapter_names(cls, adapters: list[Adapter] | None) -> list[Adapter] | None:
        _refuse_repeats("adapters", [adapter.name for adapter in adapters or []])
        return adapters

    # The sizes an engine works out (engines/view.py), for the operator's other readers.
    @property
    def gpu_count(self) -> int:
        """GPUs per replica with the profile's default applied."""
        return view.gpu_count(self, _on_gpus(self.profile))

    @property
    def node_count(self) -> int:
        """Nodes (pods) per replica: above 1, a LeaderWorkerSet group."""
        return view.node_count(self)

    @property
    def multi_node(self) -> bool:
        return view.multi_node(self)

    @property
    def gpus_per_node(self) -> int:
        """Each pod's nvidia.com/gpu limit (the rules make gpus a multiple of nodes)."""
        return view.gpus_per_node(self, _on_gpus(self.profile))

    @property
    def sidecar_workers(self) -> int:
        """The sidecar's processes: spec.sidecar.workers, else enough for the tokens/s the engine's
        GPUs stream (Engine.token_events), between 1 and DEFAULT_MAX_SIDECAR_WORKERS."""
        if self.named_sidecar_workers is not None:
            return self.named_sidecar_workers
        engine = ENGINES.get(self.profile)
        events = engine.token_events(self) if engine is not None else 0
        return max(1, min(DEFAULT_MAX_SIDECAR_WORKERS, -(-events // EVENTS_PER_SIDECAR_WORKER)))

    @property
    def target_per_replica(self) -> int:
        """The autoscaler's target: replicas.targetPerReplica, else the engine's default for it."""
        if self.replicas.target_per_replica is not None:
            return self.replicas.target_per_replica
        engine = ENGINES.get(self.profile)
        return engine.target_per_replica(self) if engine is not None else EXTERNAL_TARGET_PER_REPLICA

    @property
    def engine_concurrency(self) -> int:
        """Requests the sidecar lets reach the engine at once: the engine's batch (Engine.batch_size);
        for an external server, whose batch the operator cannot know, the autoscaler's target."""
        engine = ENGINES.get(self.profile)
        return engine.batch_size(self) if engine is not None else self.target_per_replica

    @property
    def named_sidecar_workers(self) -> int | None:
        """spec.sidecar.workers as written (None: unset, the operator's default)."""
        return self.sidecar.workers if self.sidecar is not None else None


def _on_gpus(profile: Profile) -> bool:
    """Whether the profile's engine runs on GPUs (profile external runs none)."""
    engine = ENGINES.get(profile)
    return engine is not None and engine.on_gpus


# A rule on the whole object: the API server lets CEL see metadata.name there.
NAME_RULE = Rule(
    f"self.metadata.name.size() <= {NAME_MAX_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
    f"metadata.name must be a DNS-1035 label (lower case letters, digits and '-', starting with a letter, "
    f"at most {NAME_MAX_LENGTH} characters): it names the Service",
    "metadata.name",
    lambda name: len(name) <= NAME_MAX_LENGTH and re.match(NAME_PATTERN, name) is not None,
)


# Also on the whole object: an adapter named like the ModelServer would hide the base model.
ADAPTER_NAME_RULE = Rule(
    "!has(self.spec.adapters) || !self.spec.adapters.exists(a, a.name == self.metadata.name)",
    "an adapter must not be named like the ModelServer: that is its base model's served name",
    "spec.adapters",
    lambda manifest: (
        not any(
            (a or {}).get("name") == (manifest.get("metadata") or {}).get("name")
            for a in (manifest.get("spec") or {}).get("adapters") or []
        )
    ),
)


@dataclass(frozen=True)
class ModelServer:
    """One ModelServer object: identity plus validated spec."""

    name: str
    namespace: str
    uid: str
    spec: ModelServerSpec

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> ModelServer:
        """Validate a whole manifest the way the API server would; raises ValueError."""
        if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
            raise ValueError(f"not a {KIND} of {API_VERSION}")
        metadata = manifest.get("metadata") or {}
        name = metadata.get("name", "")
        if not NAME_RULE.holds(name):
            raise ValueError(NAME_RULE.message)
        if not ADAPTER_NAME_RULE.holds(manifest):
            raise ValueError(f"{ADAPTER_NAME_RULE.field}: {ADAPTER_NAME_RULE.message}")
        return cls(
            name=name,
            namespace=metadata.get("namespace") or "default",
            uid=metadata.get("uid", ""),
            spec=parse_spec(manifest.get("spec") or {}),
        )


def _json_numbers(value: Any) -> Any:
    """A whole-number float as an int, as the API server's validation counts it (4096.0 is an integer)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _json_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_numbers(item) for item in value]
    return value


def parse_spec(wire: Any) -> ModelServerSpec:
    """The spec from its wire form, typed as strictly as the API server types it: "4096" is no
    integer, true no number, "yes" no boolean (pydantic's lax mode would take all three)."""
    try:
        text = json.dumps(_json_numbers(wire))
    except (TypeError, ValueError) as error:  # e.g. a YAML date or a NaN: not JSON at all
        raise ValueError(f"spec is not JSON data: {error}") from None
    return ModelServerSpec.model_validate_json(text, strict=True)
