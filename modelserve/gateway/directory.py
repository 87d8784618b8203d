"""What the gateway routes by: each watched ModelServer, keyed by its served name, with the
addresses of its pods that may take a request now (Ready, not terminating). ModelServers of one
namespace with one served name (spec.traffic.servedName) are versions of one model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from modelserve.contracts.names import Key
from modelserve.contracts.sidecar import base_of
from modelserve.kube.pods import pod_ready, readable

from .routing import Ring
from .versions import DEFAULT_WEIGHT, GUARD_RESET_ANNOTATION, Guard, tripped_in_status


@dataclass(frozen=True)
class Model:
    namespace: str
    name: str  # the ModelServer's name: what its replicas serve (the engine's served model name)
    public: bool  # spec.auth.mode public: every caller may see it listed
    created: int = 0  # the ModelServer's creation, in seconds since the epoch (GET /v1/models)
    # The sidecars that take requests: "podIP:port", or "https://podIP:port" for one serving HTTPS (spec.tls)
    replicas: tuple[str, ...] = ()
    pods: dict[str, str] = field(default_factory=dict, compare=False)  # address -> pod name
    adapters: tuple[str, ...] = ()  # spec.adapters' names: served by the same replicas
    ring: Ring | None = field(default=None, compare=False)
    served_as: str = ""  # spec.traffic.servedName: the name clients send ("": the ModelServer's name)
    weight: int = DEFAULT_WEIGHT  # spec.traffic.weight: its share among the versions of that name
    guard: Guard | None = None  # spec.traffic.guard
    guard_reset: str = ""  # the reset annotation's value: a new one clears a tripped guard
    tripped_in_status: bool = False  # the status says its guard tripped (since guard_reset was set)
    # status.lastStart.seconds: the operator's measure of its latest replica start (what a wake costs)
    last_start: float | None = field(default=None, compare=False)

    @property
    def key(self) -> Key:
        return self.namespace, self.name

    @property
    def served(self) -> str:
        """The name the gateway serves it under."""
        return self.served_as or self.name

    @property
    def server_name(self) -> str:
        """The name its sidecars' certificates are checked against (spec.tls): its Service's."""
        return f"{self.name}.{self.namespace}.svc"


def routable(pod: dict[str, Any]) -> bool:
    """A pod that takes new requests: Ready, not terminating (draining), its sidecar running with an
    address (which also keeps simulated pods, such as KWOK's, whose address nothing serves, out)."""
    return pod_ready(pod) and readable(pod)


def model_of(modelserver: dict[str, Any], pods: Iterable[dict[str, Any]]) -> Model:
    metadata = modelserver["metadata"]
    auth = (modelserver.get("spec") or {}).get("auth") or {}
    traffic = (modelserver.get("spec") or {}).get("traffic") or {}
    reset = ((metadata.get("annotations") or {}).get(GUARD_RESET_ANNOTATION)) or ""
    ready = sorted((base_of(pod), pod["metadata"]["name"]) for pod in pods if routable(pod))
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
        served_as=str(traffic.get("servedName") or ""),
        weight=int(traffic.get("weight", DEFAULT_WEIGHT)),
        guard=Guard.of(traffic.get("guard")),
        guard_reset=reset,
        tripped_in_status=tripped_in_status(modelserver.get("status") or {}, reset),
        last_start=_last_start(modelserver.get("status") or {}),
    )


def _last_start(status: dict[str, Any]) -> float | None:
    seconds = (status.get("lastStart") or {}).get("seconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


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
    """Served names (a ModelServer's own, or its spec.traffic.servedName, and its adapters') -> the
    ModelServers whose replicas serve them: one, or the versions of a served name."""

    def __init__(self) -> None:
        self.models: dict[Key, Model] = {}
        self.public = 0  # public ModelServers: none, and a request without a key has nowhere to go
        self._namespaces: dict[str, set[str]] = {}  # served name -> namespaces serving it
        self._owners: dict[Key, tuple[Key, ...]] = {}  # (namespace, served name) -> the ModelServers serving it
        # "https://podIP:port" -> the name its certificate must carry (Model.server_name): what the
        # upstream pool checks a TLS replica's certificate against (it connects to the address).
        self.server_names: dict[str, str] = {}

    def put(self, model: Model) -> None:
        self.remove(model.key)  # its adapters may have changed
        self.models[model.key] = model
        self.public += model.public
        for replica in model.replicas:
            if replica.startswith("https://"):
                self.server_names[replica] = model.server_name
        for name in (model.served, *model.adapters):
            owners = self._owners.get((model.namespace, name), ())
            if name == model.served:
                # A name both a ModelServer and another's adapter take in one namespace: the ModelServer's.
                owners = tuple(o for o in owners if self.models[o].served == name)
            elif owners:
                continue  # an adapter's name already served: by a ModelServer, or the first adapter
            self._owners[(model.namespace, name)] = tuple(sorted((*owners, model.key)))
            self._namespaces.setdefault(name, set()).add(model.namespace)

    def remove(self, key: Key) -> None:
        model = self.models.pop(key, None)
        if model is None:
            return
        self.public -= model.public
        for replica in model.replicas:
            if self.server_names.get(replica) == model.server_name:  # a reused address may be another's now
                del self.server_names[replica]
        for name in (model.served, *model.adapters):
            owners = self._owners.get((model.namespace, name), ())
            if key not in owners:
                continue
            left = tuple(o for o in owners if o != key)
            if left:
                self._owners[(model.namespace, name)] = left
                continue
            del self._owners[(model.namespace, name)]
            namespaces = self._namespaces.get(name, set())
            namespaces.discard(model.namespace)
            if not namespaces:
                self._namespaces.pop(name, None)

    def resolve(self, requested: str) -> Model | None:
        """A ModelServer serving a request's `model` (the first of its versions): see `versions`."""
        versions = self.versions(requested)
        return versions[0] if versions else None

    def versions(self, requested: str) -> tuple[Model, ...]:
        """The ModelServers serving a request's `model`: its served name or one of its adapters', or
        `namespace/name` where two namespaces serve the same name, either with Ollama's default tag
        `:latest`. Several for a served name with versions; none for an unknown name. Raises
        Ambiguous for a bare name two namespaces serve."""
        namespace, _, name = requested.removesuffix(OLLAMA_DEFAULT_TAG).rpartition("/")
        if not namespace:
            namespaces = self._namespaces.get(name)
            if not namespaces:
                return ()
            if len(namespaces) > 1:
                public = all(self.models[o].public for ns in namespaces for o in self._owners[(ns, name)])
                raise Ambiguous(name, sorted(namespaces), public)
            namespace = next(iter(namespaces))
        return tuple(self.models[o] for o in self._owners.get((namespace, name), ()))

    def resolve_owner(self, model: Model, name: str) -> bool:
        """Whether `model` is one serving `name` in its namespace (an adapter named like another
        ModelServer there is that ModelServer's name)."""
        return model.key in self._owners.get((model.namespace, name), ())

    def listed_name(self, model: Model, name: str | None = None) -> str:
        """How GET /v1/models names a model (or one of its adapters, `name`): bare, unless another
        namespace serves the same name."""
        name = name or model.served
        return name if len(self._namespaces.get(name, ())) < 2 else f"{model.namespace}/{name}"


def endpoint_of(replica: str) -> str:
    """A replica's `podIP:port`, without the `https://` of a sidecar serving TLS (what an endpoint
    picker names: a data plane sending there must then speak TLS itself)."""
    return replica.removeprefix("https://")


def served_name(requested: str) -> str:
    """The name a replica knows for a request's `model` (no namespace, no `:latest`)."""
    return requested.removesuffix(OLLAMA_DEFAULT_TAG).rpartition("/")[2]
