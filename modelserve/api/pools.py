"""Pure builders of a namespace's InferencePool (Gateway API Inference Extension v1) and of the
selectorless Service and EndpointSlice its endpointPickerRef names. No API calls here.

One pool per namespace, named `modelserve`, for every ModelServer there: modelserve's picker routes
by the request body's model among all of them, so one HTTPRoute rule and one picker serve the whole
namespace (several pools behind one route or Gateway is where data planes break: istio #61594,
#58392). The pool's selector is a label only the pods that serve HTTP carry (a Deployment's pods, a
LeaderWorkerSet's leaders), rendered only with pools on; its targetPort the sidecar's port.

A pool's endpointPickerRef names a Service of its own namespace, while the picker runs in the
release namespace; ExternalName Services are refused by the API's own rules ("Implementations MUST
NOT support ExternalName Services"), and Envoy-based data planes build the picker's cluster from the
Service's EndpointSlices. So each pool's namespace gets a selectorless Service and an EndpointSlice
mirroring the picker Service's ready endpoints: what kube-proxy and every EndpointSlice reader reach.

The three are owned by every ModelServer of the namespace (owner references, none the controller):
the garbage collector deletes them once the last one goes, the operator running or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelserve.contracts import sidecar as contract
from modelserve.contracts.names import (
    API_VERSION,
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_LABEL,
    KIND,
    MANAGED_BY,
    MANAGED_BY_LABEL,
)
from modelserve.contracts.operator_settings import Settings

from .spec import ModelServer
from .status import InferencePoolStatus, PoolParent

POOL_NAME = "modelserve"
PICKER_NAME = f"{POOL_NAME}-epp"  # the selectorless Service and its EndpointSlice
PICKER_PORT_NAME = "grpc"
H2C = "kubernetes.io/h2c"  # the picker speaks gRPC (ext_proc) in clear inside the cluster
# EndpointSlices: who keeps this one (never the EndpointSlice controller, which owns those it names).
SLICE_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ENDPOINT_SLICE_API_VERSION = "discovery.k8s.io/v1"
ENDPOINT_SLICE_KIND = "EndpointSlice"


def pooled(ms: ModelServer, settings: Settings) -> bool:
    """Whether the ModelServer's serving pods belong to its namespace's pool: pools on, and its sidecars
    serve plain HTTP (a pool has one appProtocol for every pod, and spec.tls's sidecars serve HTTPS)."""
    return settings.inference_pools and ms.spec.tls is None


def pod_labels(ms: ModelServer, settings: Settings) -> dict[str, str]:
    """The label a serving pod template gets (nothing with pools off: no pod rolls)."""
    return {INFERENCE_POOL_LABEL: POOL_NAME} if pooled(ms, settings) else {}


@dataclass(frozen=True)
class Owner:
    name: str
    uid: str


def owners(modelservers: list[dict[str, Any]]) -> list[Owner]:
    """The namespace's ModelServers that own its pool: every one not being deleted, by name."""
    live = [body["metadata"] for body in modelservers if not body["metadata"].get("deletionTimestamp")]
    return sorted((Owner(meta["name"], meta["uid"]) for meta in live), key=lambda owner: owner.name)


def _metadata(namespace: str, name: str, owned_by: list[Owner]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, INFERENCE_POOL_LABEL: POOL_NAME},
        "ownerReferences": [
            {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name, "uid": owner.uid} for owner in owned_by
        ],
    }


def inference_pool(namespace: str, owned_by: list[Owner], settings: Settings) -> dict[str, Any]:
    """The namespace's pool: its serving pods on the sidecar's port, modelserve's picker."""
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": _metadata(namespace, POOL_NAME, owned_by),
        "spec": {
            "selector": {"matchLabels": {INFERENCE_POOL_LABEL: POOL_NAME}},
            "targetPorts": [{"number": contract.LISTEN_PORT}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": PICKER_NAME,
                "port": {"number": settings.picker_port},
                "failureMode": settings.picker_failure_mode,
            },
        },
    }


def picker_service(namespace: str, owned_by: list[Owner], settings: Settings) -> dict[str, Any]:
    """The selectorless Service the pool's endpointPickerRef names (its endpoints: picker_slice)."""
    port = {"name": PICKER_PORT_NAME, "port": settings.picker_port, "protocol": "TCP", "appProtocol": H2C}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(namespace, PICKER_NAME, owned_by),
        "spec": {"type": "ClusterIP", "ports": [port]},
    }


@dataclass(frozen=True)
class PickerEndpoints:
    """The picker Service's endpoints as its EndpointSlices list them, on its picker port."""

    address_type: str
    port: int | None  # the pods' port (None: the Service or that port not found)
    endpoints: tuple[dict[str, Any], ...]
    problem: str = ""  # why there are none, for the condition


def picker_endpoints(
    settings: Settings, service: dict[str, Any] | None, slices: list[dict[str, Any]]
) -> PickerEndpoints:
    """The ready endpoints of the picker's Service (`service`, its EndpointSlices `slices`) on the port
    numbered settings.picker_port: by that port's name, as the slices name their ports."""
    if service is None:
        return PickerEndpoints("IPv4", None, (), f"the picker Service {settings.picker_service} was not found")
    ports = (service.get("spec") or {}).get("ports") or []
    named = next((p.get("name") or "" for p in ports if p.get("port") == settings.picker_port), None)
    if named is None:
        return PickerEndpoints(
            "IPv4", None, (), f"the picker Service {settings.picker_service} has no port {settings.picker_port}"
        )
    found: dict[str, list[dict[str, Any]]] = {}
    target: int | None = None
    for piece in sorted(slices, key=lambda s: s["metadata"]["name"]):
        port = next((p.get("port") for p in piece.get("ports") or [] if (p.get("name") or "") == named), None)
        if port is None:
            continue
        target = target or port
        for endpoint in piece.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False or port != target:
                continue
            kept = {"addresses": endpoint["addresses"], "conditions": {"ready": True}}
            for key in ("nodeName", "zone"):
                if endpoint.get(key):
                    kept[key] = endpoint[key]
            found.setdefault(piece.get("addressType", "IPv4"), []).append(kept)
    address_type = "IPv4" if "IPv4" in found or not found else sorted(found)[0]
    endpoints = tuple(sorted(found.get(address_type, []), key=lambda e: e["addresses"]))
    problem = "" if endpoints else f"the picker Service {settings.picker_service} has no ready endpoints"
    return PickerEndpoints(address_type, target, endpoints, problem)


def picker_slice(namespace: str, owned_by: list[Owner], picker: PickerEndpoints) -> dict[str, Any]:
    """The EndpointSlice of the selectorless picker Service: the picker's ready endpoints (none while
    it has none, or while its Service is not found)."""
    metadata = _metadata(namespace, PICKER_NAME, owned_by)
    metadata["labels"].update({SERVICE_NAME_LABEL: PICKER_NAME, SLICE_MANAGED_BY_LABEL: MANAGED_BY})
    ports = []
    if picker.port is not None:
        ports = [{"name": PICKER_PORT_NAME, "port": picker.port, "protocol": "TCP", "appProtocol": H2C}]
    return {
        "apiVersion": ENDPOINT_SLICE_API_VERSION,
        "kind": ENDPOINT_SLICE_KIND,
        "metadata": metadata,
        "addressType": picker.address_type,
        "endpoints": list(picker.endpoints),
        "ports": ports,
    }


def ours(body: dict[str, Any]) -> bool:
    """Whether an existing object of a pool's names is the operator's (its marker label)."""
    return (body["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def pool_status(pool: dict[str, Any] | None) -> InferencePoolStatus:
    """The pool as a ModelServer's status shows it: its name, and each parent (Gateway) a data plane
    reported in the pool's status.parents, with its Accepted and ResolvedRefs."""
    parents = []
    for parent in ((pool or {}).get("status") or {}).get("parents") or []:
        ref = parent.get("parentRef") or {}
        conditions = {c.get("type"): c for c in parent.get("conditions") or []}
        said = [c.get("message", "") for c in conditions.values() if c.get("status") != "True" and c.get("message")]
        parents.append(
            PoolParent(
                kind=ref.get("kind") or "Gateway",
                namespace=ref.get("namespace") or "",
                name=ref.get("name") or "",
                controller_name=parent.get("controllerName"),
                accepted=(conditions.get("Accepted") or {}).get("status", "Unknown"),
                resolved_refs=(conditions.get("ResolvedRefs") or {}).get("status", "Unknown"),
                message="; ".join(said),
            )
        )
    return InferencePoolStatus(name=POOL_NAME, parents=parents)


def parents_summary(status: InferencePoolStatus) -> str:
    """What the pool's gateways say, for the condition's message."""
    if not status.parents:
        return "no Gateway reports it as a parent yet (status.parents is empty)"
    parts = []
    for parent in status.parents:
        where = f"{parent.kind} {parent.namespace + '/' if parent.namespace else ''}{parent.name}"
        parts.append(f"{where}: Accepted={parent.accepted}, ResolvedRefs={parent.resolved_refs}")
    return "; ".join(parts)
