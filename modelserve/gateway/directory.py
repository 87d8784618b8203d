"""What the gateway routes by: each watched ModelServer, keyed by its served name, with the
addresses of its pods that may take a request now (Ready, not terminating)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from modelserve.contracts.names import Key
from modelserve.contracts.sidecar import LISTEN_PORT
from modelserve.kube.pods import pod_ready, readable

from .routing import Ring


@dataclass(frozen=True)
class Model:
    namespace: str
    name: str  # the served name: the ModelServer's name
    public: bool  # spec.auth.mode public: every caller may see it listed
    created: int = 0  # the ModelServer's creation, in seconds since the epoch (GET /v1/models)
    replicas: tuple[str, ...] = ()  # "podIP:port" of the sidecars that take requests
    pods: dict[str, str] = field(default_factory=dict, compare=False)  # address -> pod name
    ring: Ring | None = field(default=None, compare=False)

    @property
    def key(self) -> Key:
        return self.namespace, self.name


def routable(pod: dict[str, Any]) -> bool:
    """A pod that takes new requests: Ready, not terminating (draining), its sidecar running with an
    address (which also keeps simulated pods, such as KWOK's, whose address nothing serves, out)."""
    return pod_ready(pod) and readable(pod)


def model_of(modelserver: dict[str, Any], pods: Iterable[dict[str, Any]]) -> Model:
    metadata = modelserver["metadata"]
    auth = (modelserver.get("spec") or {}).get("auth") or {}
    ready = sorted(
        (f"{pod['status']['podIP']}:{LISTEN_PORT}", pod["metadata"]["name"]) for pod in pods if routable(pod)
    )
    replicas = tuple(address for address, _ in ready)
    return Model(
        namespace=metadata["namespace"],
        name=metadata["name"],
        public=auth.get("mode") == "public",
        created=_epoch(metadata.get("creationTimestamp")),
        replicas=replicas,
        pods=dict(ready),
        ring=Ring(replicas) if replicas else None,
    )


def _epoch(timestamp: str | None) -> int:
    try:
        return int(datetime.fromisoformat(timestamp or "").timestamp())
    except ValueError:
        return 0


OLLAMA_DEFAULT_TAG = ":latest"  # Ollama clients name models with a tag; a served name has none


class Ambiguous(Exception):
    """A served name that more than one watched namespace serves."""

    def __init__(self, name: str, namespaces: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.namespaces = namespaces


class Directory:
    def __init__(self) -> None:
        self.models: dict[Key, Model] = {}
        self._namespaces: dict[str, set[str]] = {}  # served name -> namespaces serving it

    def put(self, model: Model) -> None:
        self.models[model.key] = model
        self._namespaces.setdefault(model.name, set()).add(model.namespace)

    def remove(self, key: Key) -> None:
        if self.models.pop(key, None) is not None:
            namespaces = self._namespaces.get(key[1], set())
            namespaces.discard(key[0])
            if not namespaces:
                del self._namespaces[key[1]]

    def resolve(self, requested: str) -> Model | None:
        """The ModelServer a request's `model` names: its served name, or `namespace/name` where
        two namespaces serve the same name, either with Ollama's default tag `:latest`. Raises
        Ambiguous for such a bare name."""
        namespace, _, name = requested.removesuffix(OLLAMA_DEFAULT_TAG).rpartition("/")
        if namespace:
            return self.models.get((namespace, name))
        namespaces = self._namespaces.get(name)
        if not namespaces:
            return None
        if len(namespaces) > 1:
            raise Ambiguous(name, sorted(namespaces))
        return self.models.get((next(iter(namespaces)), name))

    def listed_name(self, model: Model) -> str:
        """How GET /v1/models names a model: bare, unless another namespace serves the same name."""
        return model.name if len(self._namespaces.get(model.name, ())) < 2 else f"{model.namespace}/{model.name}"
