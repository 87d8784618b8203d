"""The node's model cache between the programs that meet at it: the operator renders each model pod's
fetch init container (its settings below) and its preferred node affinity (a node label per model);
the fetch client (`modelserve-fetch`, in that init container) downloads through the node agent and
reports what it did in its termination message (`FetchResult`), which the operator reads back from
the pod's status; the node agent (`modelserve-nodecache`, a DaemonSet) labels the nodes that hold a
model and reads which models the pods on its node use from their label, honoured only where their
ModelServer (SELECTOR_LABEL) names that model.

Standard library only: the fetch client runs in every model pod, the operator imports no agent code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from .env import base_url, boolean, comma_list, env_setting, non_empty, path, positive_float, read_env, render_bool
from .names import GROUP

# On a node: the models it holds whole, one label each (value "true"), maintained by its node agent;
# the operator's preferred node affinity asks for it. A hash, as label keys take 63 characters.
NODE_LABEL_PREFIX = f"models.{GROUP}"
# On a model pod: the model it runs (the same hash), so the node agent keeps that model (and its
# ModelServer's hub adapters) while a pod on its node uses it; honoured only when the pod's
# SELECTOR_LABEL names a ModelServer of its namespace whose spec.model has this key.
POD_MODEL_LABEL = f"cache.{GROUP}/model"
FETCH_CONTAINER = "fetch"
FETCH_COMMAND = "modelserve-fetch"
AGENT_PORT = 8090  # the agent's one port (its Service's too): hub routes, /healthz, /metrics
# What the fetch client writes its result to: the kubelet keeps it in the container's status.
TERMINATION_LOG = "/dev/termination-log"
RESULT_LIMIT = 4096  # the kubelet keeps this much of a termination message
# Where the fetch container mounts the pod's hub cache volume (the engine has it at its HF_HOME): not
# under /root, which our image keeps to root (0700), where the fetch's user could not reach it.
FETCH_MOUNT = "/hub-cache"
DEFAULT_HUB = "https://huggingface.co"


class Layout(StrEnum):
    """Which files of a model's repository an engine reads, and so which the fetch downloads."""

    GGUF = "gguf"  # llama.cpp: the GGUF of the :<quant> tag (its splits), and a projector for images
    SAFETENSORS = "safetensors"  # vLLM, SGLang: the weights in one format, configs and tokenizer
    ALL = "all"  # LoRA adapters: every file


def model_key(model: str, revision: str = "main") -> str:
    """A model's short, stable name for labels: 32 hex characters of `<model>@<revision>` (the model
    as the spec writes it, `<org>/<repo>[:<tag>]`)."""
    return hashlib.sha256(f"{model}@{revision}".encode()).hexdigest()[:32]


def hub_adapters(sources: Iterable[str]) -> tuple[str, ...]:
    """The adapters (spec.adapters' sources) the fetch downloads from the hub, each recorded under
    `model_key(source)`: the others are absolute paths in the pod's own cache volume. One rule for the
    operator, which renders them into the fetch's settings, and the node agent, which keeps them."""
    return tuple(source for source in sources if not source.startswith("/"))


def node_label(model: str, revision: str = "main") -> str:
    """The node label that says a node holds `model`."""
    return f"{NODE_LABEL_PREFIX}/m-{model_key(model, revision)}"


def _layout(raw: str) -> Layout:
    try:
        return Layout(raw)
    except ValueError:
        raise ValueError(f"must be one of {', '.join(layout.value for layout in Layout)}") from None


@dataclass(frozen=True)
class FetchSettings:
    """What the fetch client does, from its environment (the operator renders it with `to_env`). The
    token is not here: it comes as HF_TOKEN from the ModelServer's Secret, as the engine's does."""

    # The model as the spec names it: <org>/<repo>, or <org>/<repo>:<quant> of a GGUF repository.
    model: str = env_setting("MODELSERVE_FETCH_MODEL", non_empty)
    # Which of its files the engine reads (Layout): a GGUF's, one weight format's, every file.
    layout: Layout = env_setting("MODELSERVE_FETCH_LAYOUT", _layout, default=Layout.SAFETENSORS)  # noqa: RUF009 - immutable
    # spec.adapters' hub ids, fetched whole after the model (one the hub refuses is left to the engine).
    adapters: tuple[str, ...] = env_setting("MODELSERVE_FETCH_ADAPTERS", comma_list, ",".join, default=())
    # The hub, or the cluster's mirror of it (the operator's MODELSERVE_HUB_ENDPOINT).
    hub: str = env_setting("MODELSERVE_FETCH_HUB", base_url, default=DEFAULT_HUB)
    # The node agent's base URL; empty: straight from the hub.
    node_cache: str = env_setting("MODELSERVE_FETCH_NODE_CACHE", base_url, default="")
    # The hub cache's `hub` directory (huggingface_hub's layout, which llama.cpp b9093 and b11434 read too).
    cache_dir: Path = env_setting("MODELSERVE_FETCH_CACHE_DIR", path, default=Path(FETCH_MOUNT) / "hub")  # noqa: RUF009 - immutable
    # Prefetch: through the node agent into the node's cache only, nothing written here.
    warm_only: bool = env_setting("MODELSERVE_FETCH_WARM_ONLY", boolean, render_bool, default=False)
    # How long a connection to the node agent may take before the hub is asked instead: a Service
    # with internalTrafficPolicy Local drops packets when the node has no agent.
    connect_seconds: float = env_setting("MODELSERVE_FETCH_CONNECT_SECONDS", positive_float, default=2.0)
    # Where the result goes (FetchResult's JSON): the kubelet keeps the termination log in the status.
    result_path: Path = env_setting("MODELSERVE_FETCH_RESULT", path, default=Path(TERMINATION_LOG))  # noqa: RUF009 - immutable

    @classmethod
    def from_env(cls, env: dict[str, str]) -> FetchSettings:
        return read_env(cls, env)

    def to_env(self) -> dict[str, str]:
        """The variables that differ from the defaults (the model always), in field order."""
        out = {}
        for setting in dataclasses.fields(self):
            value = getattr(self, setting.name)
            if setting.name == "model" or value != setting.default:
                out[setting.metadata["env"]] = setting.metadata["render"](value)
        return out


class Source(StrEnum):
    NODE = "node"  # every byte from the node's cache
    HUB = "hub"  # every byte from the hub (through the node agent that kept a copy, or straight)
    MIXED = "mixed"
    LOCAL = "local"  # already in the pod's volume (a claim kept from before)


@dataclass(frozen=True)
class FetchResult:
    """What one fetch did: the operator's weights phase and byte counts, and whether the node's cache
    served (`node_cache`: empty when it did, else what went wrong, for a Warning Event)."""

    model: str
    seconds: float
    hub_bytes: int = 0  # bytes this fetch caused to cross from the hub
    node_bytes: int = 0  # bytes the node's cache already held
    local_bytes: int = 0  # bytes already in the pod's volume
    files: int = 0
    node_cache: str = ""
    error: str = ""  # why the fetch failed (the pod's init container fails with it)
    # The hub could not be reached: the node cache answered from its records (a public model it holds whole).
    hub_unreachable: bool = False

    @property
    def source(self) -> Source:
        if self.hub_bytes and self.node_bytes:
            return Source.MIXED
        if self.hub_bytes:
            return Source.HUB
        if self.node_bytes:
            return Source.NODE
        return Source.LOCAL

    def to_json(self) -> str:
        body = {
            "model": self.model,
            "seconds": round(self.seconds, 3),
            "hubBytes": self.hub_bytes,
            "nodeBytes": self.node_bytes,
            "localBytes": self.local_bytes,
            "files": self.files,
            "source": self.source.value,
        }
        if self.node_cache:
            body["nodeCache"] = self.node_cache[:1000]
        if self.error:
            body["error"] = self.error[:2000]
        if self.hub_unreachable:
            body["hubUnreachable"] = True
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None) -> FetchResult | None:
        """A result back from a termination message; None for anything else (an older or foreign one)."""
        try:
            body: Any = json.loads(text or "")
            return cls(
                model=str(body["model"]),
                seconds=float(body["seconds"]),
                hub_bytes=int(body.get("hubBytes", 0)),
                node_bytes=int(body.get("nodeBytes", 0)),
                local_bytes=int(body.get("localBytes", 0)),
                files=int(body.get("files", 0)),
                node_cache=str(body.get("nodeCache", "")),
                error=str(body.get("error", "")),
                hub_unreachable=body.get("hubUnreachable") is True,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
