"""The gateway's settings, each one MODELSERVE_GATEWAY_* variable (the chart sets them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from modelserve.contracts.env import (
    env_setting,
    non_empty,
    non_negative_float,
    path,
    port,
    port_or_off,
    positive_float,
    positive_int,
    read_env,
)
from modelserve.contracts.gateway import LISTEN_PORT

LEAST_IN_FLIGHT = "least-in-flight"
PREFIX_AFFINITY = "prefix-affinity"


def _namespaces(raw: str) -> tuple[str, ...]:
    return tuple(sorted({part.strip() for part in raw.split(",") if part.strip()}))


def _routing(raw: str) -> str:
    if raw not in (LEAST_IN_FLIGHT, PREFIX_AFFINITY):
        raise ValueError(f"must be {LEAST_IN_FLIGHT} or {PREFIX_AFFINITY}")
    return raw


def _load_factor(raw: str) -> float:
    value = positive_float(raw)
    if value < 1:
        raise ValueError("must be at least 1 (1: perfectly even, no affinity kept under load)")
    return value


@dataclass(frozen=True)
class GatewaySettings:
    # Empty: every namespace (a ClusterRole); else only these (a Role in each).
    namespaces: tuple[str, ...] = env_setting("MODELSERVE_GATEWAY_NAMESPACES", _namespaces, default=())
    # The address the gateway listens on.
    listen_host: str = env_setting("MODELSERVE_GATEWAY_LISTEN_HOST", non_empty, default="0.0.0.0")
    # The gateway's port, its Service's target.
    listen_port: int = env_setting("MODELSERVE_GATEWAY_LISTEN_PORT", port, default=LISTEN_PORT)
    # A directory holding a certificate chain `tls.crt` (leaf first) and its key `tls.key`, as a
    # mounted kubernetes.io/tls Secret: the gateway serves HTTPS (TLS 1.2 and later) on its port, and
    # serves a renewed pair within about a second of the files changing (a pair that fails its checks
    # is refused, the one before it kept). Empty: plain HTTP.
    tls_dir: Path | None = env_setting("MODELSERVE_GATEWAY_TLS_DIR", path, default=None)  # noqa: RUF009 - immutable
    # CA certificates (PEM) that sign the certificates of ModelServers serving HTTPS (spec.tls): the
    # gateway checks each replica's against them, for the name <name>.<namespace>.svc, before a key
    # goes to it. Empty: the system's trust store (which no cluster's own CA is in).
    upstream_ca_file: Path | None = env_setting(  # noqa: RUF009 - immutable
        "MODELSERVE_GATEWAY_UPSTREAM_CA_FILE", path, default=None
    )
    # A port for the endpoint picker (gateway/picker.py): the gateway also serves Envoy's external
    # processing gRPC service there (the Gateway API Inference Extension's endpoint picker protocol),
    # so a Gateway API data plane in front of an InferencePool of model pods gets each request's replica
    # from the gateway's own routing, holding and versions, and sends the request there itself; and the
    # gRPC health service. With several workers, the first serves it. 0: no picker.
    picker_port: int = env_setting("MODELSERVE_GATEWAY_PICKER_PORT", port_or_off, default=0)
    # How a replica is picked: least-in-flight (the fewest requests in flight from this gateway) or
    # prefix-affinity (a conversation stays on its replica's prefix cache).
    routing: str = env_setting("MODELSERVE_GATEWAY_ROUTING", _routing, default=LEAST_IN_FLIGHT)
    # Prefix affinity keeps a conversation on its replica until that replica carries this many
    # times the average in flight (consistent hashing with bounded loads).
    affinity_load_factor: float = env_setting("MODELSERVE_GATEWAY_AFFINITY_LOAD_FACTOR", _load_factor, default=1.25)
    # How long a request waits for a ModelServer with no ready replica: a GPU cold start (image
    # pull, weights download and load) takes minutes.
    hold_seconds: float = env_setting("MODELSERVE_GATEWAY_HOLD_SECONDS", positive_float, default=600.0)
    # Requests held per ModelServer at most; beyond it, 429.
    max_held: int = env_setting("MODELSERVE_GATEWAY_MAX_HELD", positive_int, default=256)
    # A held OpenAI stream gets its answer's head and an SSE comment every this many seconds while
    # its model wakes (held_streams.py), so that proxies and clients do not cut it as idle: well
    # under the shortest idle timeouts met (a client's 5 s read timeout, a proxy's 30-60 s). 0: none.
    hold_keepalive_seconds: float = env_setting(
        "MODELSERVE_GATEWAY_HOLD_KEEPALIVE_SECONDS", non_negative_float, default=3.0
    )
    # Wakes remembered per ModelServer (cold_starts.py): the Retry-After of a client turned away
    # while it wakes comes from them.
    wake_history: int = env_setting("MODELSERVE_GATEWAY_WAKE_HISTORY", positive_int, default=5)
    # The largest request body in bytes; beyond it, 413 body_too_large.
    max_body_bytes: int = env_setting("MODELSERVE_GATEWAY_MAX_BODY_BYTES", positive_int, default=10 * 1024 * 1024)
    # JSON values a second one key's (else one client address's) bodies may have read on the event
    # loop (about a fifth of a core at the default); past it they are read in the helper process.
    loop_share_values_per_second: int = env_setting(
        "MODELSERVE_GATEWAY_LOOP_SHARE_VALUES_PER_SECOND", positive_int, default=200_000
    )
    # How long a replica may stay silent (connecting, or between two reads) before the request ends.
    upstream_timeout_seconds: float = env_setting(
        "MODELSERVE_GATEWAY_UPSTREAM_TIMEOUT_SECONDS", positive_float, default=600.0
    )
    # How long a key's answer from a model's sidecar is reused for GET /v1/models.
    models_cache_seconds: float = env_setting(
        "MODELSERVE_GATEWAY_MODELS_CACHE_SECONDS", non_negative_float, default=10.0
    )
    # SIGTERM's drain deadline for requests and streams in flight.
    drain_seconds: float = env_setting("MODELSERVE_GATEWAY_DRAIN_SECONDS", non_negative_float, default=60.0)
    # Connections to the replicas' sidecars, all of them together.
    upstream_max_connections: int = env_setting(
        "MODELSERVE_GATEWAY_UPSTREAM_MAX_CONNECTIONS", positive_int, default=4096
    )

    # What one client connection may take before any check (modelserve/http/limits.py), as the
    # sidecar's: the request head (431), its and the body's deadlines (408), connections (within the
    # open-file limit) and the bytes of request bodies still arriving (503).
    max_head_bytes: int = env_setting("MODELSERVE_GATEWAY_MAX_HEAD_BYTES", positive_int, default=32 * 1024)
    max_header_fields: int = env_setting("MODELSERVE_GATEWAY_MAX_HEADER_FIELDS", positive_int, default=100)
    head_timeout_seconds: float = env_setting("MODELSERVE_GATEWAY_HEAD_TIMEOUT_SECONDS", positive_float, default=15.0)
    body_timeout_seconds: float = env_setting("MODELSERVE_GATEWAY_BODY_TIMEOUT_SECONDS", positive_float, default=60.0)
    max_connections: int = env_setting("MODELSERVE_GATEWAY_MAX_CONNECTIONS", positive_int, default=16384)
    body_budget_bytes: int = env_setting("MODELSERVE_GATEWAY_BODY_BUDGET_BYTES", positive_int, default=64 * 1024 * 1024)
    send_timeout_seconds: float = env_setting("MODELSERVE_GATEWAY_SEND_TIMEOUT_SECONDS", positive_float, default=60.0)

    # Requests held per private ModelServer with a key not yet seen to open it (keys.py): anyone can
    # send a made-up key, so these get a small share of their own, beside `max_held`, and at most
    # `max_held_unverified_per_client` at once per client address (an IPv6 one by its /64).
    max_held_unverified: int = env_setting("MODELSERVE_GATEWAY_MAX_HELD_UNVERIFIED", positive_int, default=8)
    max_held_unverified_per_client: int = env_setting(
        "MODELSERVE_GATEWAY_MAX_HELD_UNVERIFIED_PER_CLIENT", positive_int, default=2
    )

    # Sidecars asked at most per model list (GET /v1/models, /api/tags, /api/ps) whether the
    # caller's key opens their model; the others are listed as last seen (catalog.py).
    model_list_asks: int = env_setting("MODELSERVE_GATEWAY_MODEL_LIST_ASKS", positive_int, default=16)
    # Processes relaying on the one port (http/workers.py), each with its own watches; the requests
    # held per model are bounded for the pod (holding.py). One core carries about 40k token events/s.
    workers: int = env_setting("MODELSERVE_GATEWAY_WORKERS", positive_int, default=1)
    # The gateway's own pod (the chart sets both from the downward API): a certificate it cannot
    # serve at the start is posted as a Warning Event on this pod before it exits. Empty: no Event.
    pod_name: str = env_setting("MODELSERVE_GATEWAY_OWN_POD", str, default="")
    # The namespace of that pod, where the Event goes (the gateway may create Events only there).
    pod_namespace: str = env_setting("MODELSERVE_GATEWAY_OWN_NAMESPACE", str, default="")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewaySettings:
        return read_env(cls, env)
