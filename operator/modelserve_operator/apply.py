"""Talking to the API server: server-side apply that writes only on change, create-if-absent, status.

Raw REST calls through the kubernetes client's ApiClient (auth and TLS from kubeconfig or the pod),
one code path for every kind the operator touches (the request API of kubernetes>=37).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from .settings import FIELD_MANAGER
from .spec import API_VERSION, KIND, PLURAL

PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    (API_VERSION, KIND): PLURAL,
}
# What a dry-run apply may differ in from the live object without anything having changed.
VOLATILE_METADATA = ("managedFields", "resourceVersion")


def api_client() -> client.ApiClient:
    """An ApiClient for the pod's service account, or the local kubeconfig ($KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """REST path of a collection (namespace None: across namespaces), an object or its subresource."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    out = f"{root}{scope}/{PLURALS[(api_version, kind)]}"
    if name:
        out += f"/{name}"
    if sub:
        out += f"/{sub}"
    return out


def error_message(error: ApiException) -> str:
    """The API server's own explanation of a refused request."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def is_gone(error: ApiException) -> bool:
    """The object, or the namespace it lives in, is going away: nothing is left to reconcile."""
    if error.status == 404:
        return True
    try:
        causes = json.loads(error.body)["details"]["causes"]
    except (TypeError, ValueError, KeyError):
        return False
    return any(cause.get("reason") == "NamespaceTerminating" for cause in causes)


class Kube:
    def __init__(self, api: client.ApiClient, field_manager: str = FIELD_MANAGER):
        self.api = api
        self.field_manager = field_manager

    def _call(
        self,
        method: str,
        url: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        request = self.api.param_serialize(
            method,
            url,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return json.loads(response.data)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        return self._call("GET", path(api_version, kind, namespace), query)["items"]

    def create(self, manifest: dict[str, Any]) -> bool:
        """POST; False when the object already exists."""
        meta = manifest["metadata"]
        try:
            self._call("POST", path(manifest["apiVersion"], manifest["kind"], meta["namespace"]), body=manifest)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def _server_side_apply(self, manifest: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        meta = manifest["metadata"]
        query = [("fieldManager", self.field_manager), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self._call(
            "PATCH",
            path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]),
            query,
            body=manifest,  # sent as JSON, which is YAML
            content_type="application/apply-patch+yaml",
        )

    def apply(self, manifest: dict[str, Any]) -> str:
        """Server-side apply, skipped when a dry run shows the live object already matches.

        Returns "created", "updated", "replaced" or "unchanged". The dry run lets the API server do
        the comparison (defaults, normalized quantities, fields we stopped setting), so an unchanged
        spec costs two reads and no write.
        """
        meta = manifest["metadata"]
        live = self.get(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        if live is None:
            self._server_side_apply(manifest, dry_run=False)
            return "created"
        try:
            preview = self._server_side_apply(manifest, dry_run=True)
        except ApiException as error:
            if error.status != 422:
                raise
            # Another manager's edit can leave list items ours cannot merge with (e.g. a Service
            # port renumbered by `kubectl edit` keeps its name `http`): put our object back whole.
            self._replace(manifest, live)
            return "replaced"
        if _comparable(preview) == _comparable(live):
            return "unchanged"
        self._server_side_apply(manifest, dry_run=False)
        return "updated"

    def _replace(self, manifest: dict[str, Any], live: dict[str, Any]) -> None:
        meta = manifest["metadata"]
        # The API server keeps what it allocated (a Service's clusterIP) when the new object leaves it out.
        body = {**manifest, "metadata": {**meta, "resourceVersion": live["metadata"]["resourceVersion"]}}
        self._call(
            "PUT",
            path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]),
            [("fieldManager", self.field_manager)],
            body=body,
        )

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self._call(
            "PATCH",
            path(api_version, kind, namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in obj.get("metadata", {}).items() if k not in VOLATILE_METADATA}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}
