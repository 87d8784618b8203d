"""The node agent's two questions to the API server, with its pod's ServiceAccount: which models the
pods on its node use (their POD_MODEL_LABEL, read as metadata only), and making its node's labels say
which models it holds (NODE_LABEL_PREFIX keys only, the rest of the node untouched). Its RBAC is that
much: list pods, get and patch nodes (the chart's ClusterRole; a ValidatingAdmissionPolicy holds the
patch to these labels)."""

from __future__ import annotations

import json
import logging
import os
import ssl
from pathlib import Path

import aiohttp

from modelserve.contracts.nodecache import NODE_LABEL_PREFIX, POD_MODEL_LABEL

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def label_changes(current: dict[str, str], held: set[str]) -> dict[str, str | None]:
    """The merge patch of the node's labels that makes its NODE_LABEL_PREFIX labels exactly the held
    models' (keys as contracts.nodecache.node_label writes them); {} when they already are (pure)."""
    wanted = {f"{NODE_LABEL_PREFIX}/m-{key}" for key in held}
    ours = {name for name in current if name.startswith(f"{NODE_LABEL_PREFIX}/")}
    changes: dict[str, str | None] = {name: "true" for name in wanted if current.get(name) != "true"}
    changes.update(dict.fromkeys(ours - wanted))
    return changes


class NodeApi:
    """The API server as the agent's pod sees it (in-cluster: the `kubernetes` Service, the mounted
    token, re-read each time as the kubelet rotates it)."""

    def __init__(self, node_name: str, session: aiohttp.ClientSession) -> None:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        self.base = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
        self.node_name = node_name
        self.session = session
        self.ssl = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        self._labels: dict[str, str] | None = None

    @staticmethod
    def in_cluster() -> bool:
        return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").is_file()

    def _headers(self, accept: str = "application/json") -> dict[str, str]:
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        return {"Authorization": f"Bearer {token}", "Accept": accept}

    async def models_in_use(self) -> set[str] | None:
        """The models of the pods on this node (None when the API server cannot say: keep them all)."""
        params = {"fieldSelector": f"spec.nodeName={self.node_name}", "labelSelector": POD_MODEL_LABEL}
        try:
            async with self.session.get(
                f"{self.base}/api/v1/pods", params=params, headers=self._headers(METADATA_LIST), ssl=self.ssl
            ) as answer:
                if answer.status != 200:
                    log.warning("listing the pods on %s: %s %s", self.node_name, answer.status, await answer.text())
                    return None
                items = (await answer.json()).get("items") or []
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
            log.warning("listing the pods on %s: %r", self.node_name, error)
            return None
        return {
            (item.get("metadata") or {}).get("labels", {}).get(POD_MODEL_LABEL, "")
            for item in items
            if not (item.get("metadata") or {}).get("deletionTimestamp")
        } - {""}

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
