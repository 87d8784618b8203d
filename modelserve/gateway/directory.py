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
    adapters: tuple[str, ...] = ()  # spec.adapters' names: served by the same replicas
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
    adapters = (modelserver.get("spec") or {}).get("adapters") or []
    return Model(
        namespace=metadata["namespace"],
        name=metadata["name"],
        public=auth.get("mode") == "public",
        created=_epoch(metadata.get("creationTimestamp")),
        replicas=replicas,
        pods=dict(ready),
        ring=Ring(replicas) if replicas else None,
        adapters=tuple(a["name"] for a in adapters if isinstance(a, dict) and isinstance(a.get("name"), str)),
    )


def _epoch(timestamp: str | None) -> int:
    try:
        return int(datetime.fromisoformat(timestamp or "").timestamp())
    except ValueError:
        return 0


OLLAMA_DEFAULT_TAG = ":latest"  # Ollama clients name models with a tag; a served name has none


class Ambiguous(Exception):
    """A served name that more than one watched namespace serves."""

    def __init__(self, name: str, namespaces: list[str], public: bool = False) -> None:
        super().__init__(name)
        self.name = name
        self.namespaces = namespaces
        self.public = public  # every one serving it is public: naming them reveals no private model


class Directory:
    """Served names (a ModelServer's own and its adapters') -> the ModelServer whose replicas serve them."""

    def __init__(self) -> None:
        self.models: dict[Key, Model] = {}
        self._namespaces: dict[str, set[str]] = {}  # served name -> namespaces serving it
        self._owners: dict[Key, Key] = {}  # (namespace, served name) -> the ModelServer serving it

    def put(self, model: Model) -> None:
        self.remove(model.key)  # its adapters may have changed
        self.models[model.key] = model
        for name in (model.name, *model.adapters):
            # A name both a ModelServer and another's adapter take in one namespace: the ModelServer's.
            if self._owners.get((model.namespace, name), model.key) != model.key and name != model.name:
                continue
            self._owners[(model.namespace, name)] = model.key
            self._namespaces.setdefault(name, set()).add(model.namespace)

    def remove(self, key: Key) -> None:
        model = self.models.pop(key, None)
        if model is None:
            return
        for name in (model.name, *model.adapters):
            if self._owners.get((model.namespace, name)) != key:
                continue
            del self._owners[(model.namespace, name)]
            namespaces = self._namespaces.get(name, set())
            namespaces.discard(model.namespace)
            if not namespaces:
                self._namespaces.pop(name, None)

    def resolve(self, requested: str) -> Model | None:
        """The ModelServer serving a request's `model`: its served name or one of its adapters', or
        `namespace/name` where two namespaces serve the same name, either with Ollama's default tag
        `:latest`. Raises Ambiguous for such a bare name."""
        namespace, _, name = requested.removesuffix(OLLAMA_DEFAULT_TAG).rpartition("/")
        if not namespace:
            namespaces = self._namespaces.get(name)
            if not namespaces:
                return None
            if len(namespaces) > 1:
                public = all(self.models[self._owners[(ns, name)]].public for ns in namespaces)
                raise Ambiguous(name, sorted(namespaces), public)
            namespace = next(iter(namespaces))
        owner = self._owners.get((namespace, name))
        return self.models.get(owner) if owner else None

    def resolve_owner(self, model: Model, name: str) -> bool:
        """Whether `model` is the one serving `name` in its namespace (an adapter named like another
        ModelServer there is that ModelServer's name)."""
        return self._owners.get((model.namespace, name)) == model.key

    def listed_name(self, model: Model, name: str | None = None) -> str:
        """How GET /v1/models names a model (or one of its adapters, `name`): bare, unless another
        namespace serves the same name."""
        name = name or model.name
        return name if len(self._namespaces.get(name, ())) < 2 else f"{model.namespace}/{name}"


def served_name(requested: str) -> str:
    """The name a replica knows for a request's `model` (no namespace, no `:latest`)."""
    return requested.removesuffix(OLLAMA_DEFAULT_TAG).rpartition("/")[2]
