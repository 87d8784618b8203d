"""The node agent's questions to the API server, with its pod's ServiceAccount: which models the pods
on its node use, and making its node's labels say which models it holds (NODE_LABEL_PREFIX keys only,
the rest of the node untouched). Its RBAC is that much: list pods (read as metadata), get
ModelServers, get and patch nodes (the chart's ClusterRole; a ValidatingAdmissionPolicy holds the
patch to these labels).

A pod's POD_MODEL_LABEL is a claim anyone who creates a pod can make: it pins a model only when the
pod carries its ModelServer's name (SELECTOR_LABEL) and that ModelServer, in the pod's namespace,
names that model. Then its hub adapters are in use too: the fetch recorded them beside the model."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from modelserve.contracts.names import GROUP, PLURAL, SELECTOR_LABEL, VERSION, Key
from modelserve.contracts.nodecache import NODE_LABEL_PREFIX, POD_MODEL_LABEL, hub_adapters, model_key

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# An object's name (a DNS-1123 subdomain), as the API server checks it: a label value that is none
# (`..`, `a_b`) names no ModelServer, and never reaches a URL.
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_changes(current: dict[str, str], held: set[str]) -> dict[str, str | None]:
    """The merge patch of the node's labels that makes its NODE_LABEL_PREFIX labels exactly the held
    models' (keys as contracts.nodecache.node_label writes them); {} when they already are (pure)."""
    wanted = {f"{NODE_LABEL_PREFIX}/m-{key}" for key in held}
    ours = {name for name in current if name.startswith(f"{NODE_LABEL_PREFIX}/")}
    changes: dict[str, str | None] = {name: "true" for name in wanted if current.get(name) != "true"}
    changes.update(dict.fromkeys(ours - wanted))
    return changes


@dataclass(frozen=True)
class Pin:
    """A pod's claim that a model is in use on its node: its namespace, the ModelServer its
    SELECTOR_LABEL names, the model key its POD_MODEL_LABEL says."""

    namespace: str
    server: str
    key: str

    @property
    def owner(self) -> Key:
        return (self.namespace, self.server)


@dataclass(frozen=True)
class ServerModels:
    """What a ModelServer has fetched onto a node: its model, and its adapters from the hub."""

    model: str
    adapters: tuple[str, ...] = ()


def pod_pins(items: Iterable[Mapping[str, Any]]) -> set[Pin]:
    """The claims of the pods listed (as metadata): a pod being deleted claims nothing, nor one
    without both labels, nor one whose ModelServer label is no object name (pure)."""
    found = set()
    for item in items:
        metadata = item.get("metadata") or {}
        labels = metadata.get("labels") or {}
        key, server = labels.get(POD_MODEL_LABEL, ""), labels.get(SELECTOR_LABEL, "")
        if metadata.get("deletionTimestamp") or not key or not _OBJECT_NAME.match(server):
            continue
        found.add(Pin(str(metadata.get("namespace", "")), server, key))
    return found


def server_models(body: Any) -> ServerModels:
    """spec.model and spec.adapters' hub sources of a ModelServer as the API server returns it: these
    two fields only, read without the api layer (the node cache imports contracts/ only). Anything
    else there is ignored; a spec without a model names none (pure)."""
    spec = body.get("spec") if isinstance(body, dict) else None
    spec = spec if isinstance(spec, dict) else {}
    model = spec.get("model")
    adapters = spec.get("adapters")
    sources = [a.get("source") for a in adapters if isinstance(a, dict)] if isinstance(adapters, list) else []
    return ServerModels(
        model if isinstance(model, str) else "",
        hub_adapters(source for source in sources if isinstance(source, str) and source),
    )


def keys_in_use(pins: Iterable[Pin], servers: Mapping[Key, ServerModels | None]) -> set[str]:
    """The model keys in use: each pin whose ModelServer (None or absent: there is none) names the
    model it claims, with that ModelServer's hub adapters. A pin of another model than its
    ModelServer's, as a pod left from before a change of spec.model has, is not honoured (pure)."""
    in_use: set[str] = set()
    for pin in pins:
        models = servers.get(pin.owner)
        if models is None or not models.model or model_key(models.model) != pin.key:
            continue
        in_use.add(pin.key)
        in_use.update(model_key(source) for source in models.adapters)
    return in_use


class CannotSay(Exception):
    """The API server did not answer a question the agent asked of it (anything but 200, or 404 for
    a ModelServer): what is in use is unknown, so every model is kept."""


class NodeApi:
    """The API server as the agent sees it: `base` (https://host:port), `token` called for each
    request, `ca_file` the API server's CA. In a pod, `from_service_account`."""

    def __init__(
        self, node_name: str, session: aiohttp.ClientSession, base: str, token: Callable[[], str], ca_file: Path
    ) -> None:
        self.base = base.rstrip("/")
        self.node_name = node_name
        self.session = session
        self.token = token
        self.ssl = ssl.create_default_context(cafile=str(ca_file))
        self._labels: dict[str, str] | None = None

    @classmethod
    def from_service_account(cls, node_name: str, session: aiohttp.ClientSession) -> NodeApi:
        """In-cluster: the `kubernetes` Service, the mounted CA and token (re-read for each request:
        the kubelet rotates it)."""
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        base = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
        return cls(node_name, session, base, lambda: (SERVICE_ACCOUNT / "token").read_text().strip(),
                   SERVICE_ACCOUNT / "ca.crt")  # fmt: skip

    @staticmethod
    def in_cluster() -> bool:
        return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").is_file()

    def _headers(self, accept: str = "application/json") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}", "Accept": accept}

    async def models_in_use(self) -> set[str] | None:
        """The model keys the pods on this node use, as `keys_in_use` decides from their labels and
        their ModelServers (None when the API server cannot say: keep them all)."""
        try:
            pins = pod_pins(await self._pods_here())
            servers = await self._model_servers({pin.owner for pin in pins})
        except (CannotSay, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
            log.warning("the models in use on %s: %r", self.node_name, error)
            return None
        return keys_in_use(pins, servers)

    async def _model_servers(self, owners: set[Key]) -> dict[Key, ServerModels | None]:
        """One GET per ModelServer with a pod here, side by side. Not a LIST: these are a handful,
        where a LIST would bring every ModelServer of the cluster (chat templates and all) to every
        node's agent, and `get` lets the agent enumerate no tenant's ModelServers."""
        ordered = sorted(owners)
        answers = await asyncio.gather(*(self._model_server(*owner) for owner in ordered), return_exceptions=True)
        servers: dict[Key, ServerModels | None] = {}
        for owner, answer in zip(ordered, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer  # the first failure: the others' answers say nothing without it
            servers[owner] = answer
        return servers

    async def _pods_here(self) -> list[dict[str, Any]]:
        """The pods on this node that carry a model label, as metadata."""
        params = {"fieldSelector": f"spec.nodeName={self.node_name}", "labelSelector": POD_MODEL_LABEL}
        async with self.session.get(
            f"{self.base}/api/v1/pods", params=params, headers=self._headers(METADATA_LIST), ssl=self.ssl
        ) as answer:
            if answer.status != 200:
                raise CannotSay(f"listing its pods: {answer.status} {(await answer.text())[:500]}")
            return (await answer.json()).get("items") or []

    async def _model_server(self, namespace: str, name: str) -> ServerModels | None:
        """A ModelServer's models, None when it does not exist (404)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}/{quote(name, safe='')}"
        async with self.session.get(f"{self.base}{path}", headers=self._headers(), ssl=self.ssl) as answer:
            if answer.status == 404:
                return None
            if answer.status != 200:
                raise CannotSay(f"{answer.status} {(await answer.text())[:500]}")
            return server_models(await answer.json())

    async def label(self, held: set[str]) -> None:
        """Make the node's model labels say `held` (one GET at first, a PATCH when they change)."""
        node = f"{self.base}/api/v1/nodes/{self.node_name}"
        try:
            if self._labels is None:
                async with self.session.get(node, headers=self._headers(), ssl=self.ssl) as answer:
                    answer.raise_for_status()
                    self._labels = (await answer.json())["metadata"].get("labels") or {}
            changes = label_changes(self._labels, held)
            if not changes:
                return
            patch = json.dumps({"metadata": {"labels": changes}})
            headers = {**self._headers(), "Content-Type": "application/merge-patch+json"}
            async with self.session.patch(node, data=patch, headers=headers, ssl=self.ssl) as answer:
                answer.raise_for_status()
                self._labels = (await answer.json())["metadata"].get("labels") or {}
            log.info("node %s labels: %s", self.node_name, changes)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as error:
            self._labels = None  # read them again next time
            log.warning("labelling node %s: %r", self.node_name, error)
