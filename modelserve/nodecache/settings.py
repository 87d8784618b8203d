"""The node agent's settings, each one MODELSERVE_NODECACHE_* variable (the chart sets them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelserve.contracts.env import base_url, byte_quantity, env_setting, non_empty, path, port, positive_float
from modelserve.contracts.nodecache import AGENT_PORT, DEFAULT_HUB


@dataclass(frozen=True)
class Settings:
    # The store's directory (the chart's hostPath, mounted).
    root: Path = env_setting("MODELSERVE_NODECACHE_ROOT", path)  # noqa: RUF009 - immutable
    # The store's size at most; models no pod on the node uses are evicted to stay under it.
    size_limit: int = env_setting("MODELSERVE_NODECACHE_SIZE_LIMIT", byte_quantity, default=50 * 2**30)
    # Where it listens: the pod's address, for its Service and the kubelet's probes.
    listen_host: str = env_setting("MODELSERVE_NODECACHE_LISTEN_HOST", non_empty, default="0.0.0.0")
    # Its one port: the hub's routes, /healthz, /metrics (the chart's nodeCache.port).
    listen_port: int = env_setting("MODELSERVE_NODECACHE_PORT", port, default=AGENT_PORT)
    # The hub (or the cluster's mirror of it): the engines' own MODELSERVE_HUB_ENDPOINT.
    hub: str = env_setting("MODELSERVE_NODECACHE_HUB", base_url, default=DEFAULT_HUB)
    # This node's name (the downward API): its labels say which models it holds, and the pods on it
    # (with their ModelServers) say which models are in use. Empty: neither (a store on its own).
    node_name: str = env_setting("MODELSERVE_NODECACHE_NODE_NAME", non_empty, default="")
    # How often the node's labels and the pods' models are brought up to date.
    sync_seconds: float = env_setting("MODELSERVE_NODECACHE_SYNC_SECONDS", positive_float, default=10.0)
    # A file's answer is cut once its client has read none of it for this long: a client that does not
    # read would otherwise pin the file from eviction, and hold the agent's memory, for good.
    send_timeout_seconds: float = env_setting("MODELSERVE_NODECACHE_SEND_TIMEOUT_SECONDS", positive_float, default=60.0)
    # How long the hub may stay silent on a file's HEAD or a model's listing before it is taken for
    # down (huggingface_hub gives these 10 s): then a public model held whole is answered from the
    # node's records. A hub that took connections and never answered cost 241 s per attempt.
    hub_answer_timeout_seconds: float = env_setting(
        "MODELSERVE_NODECACHE_HUB_ANSWER_TIMEOUT_SECONDS", positive_float, default=20.0
    )
