"""Talking to the API server: server-side apply that writes only on change, create-if-absent, status,
and the list and watch requests the caches are fed by.

Raw REST calls through the kubernetes client's ApiClient (auth and TLS from kubeconfig or the pod),
one code path for every kind the operator touches (the request API of kubernetes>=37).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from modelserve.contracts.names import (
    API_VERSION,
    FIELD_MANAGER,
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_PLURAL,
    KIND,
    LWS_API_VERSION,
    LWS_KIND,
    LWS_PLURAL,
    PLURAL,
    USER_AGENT,
)

PLURALS = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("v1", "Node"): "nodes",
    ("batch/v1", "Job"): "jobs",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    (API_VERSION, KIND): PLURAL,
    (LWS_API_VERSION, LWS_KIND): LWS_PLURAL,
    (INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND): INFERENCE_POOL_PLURAL,
    ("discovery.k8s.io/v1", "EndpointSlice"): "endpointslices",
}
# What a dry-run apply may differ in from the live object without anything having changed.
VOLATILE_METADATA = ("managedFields", "resourceVersion")
JSON = "application/json"
# Metadata only (Secrets: the operator never holds a key it did not just generate).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_OBJECT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
# A request that takes longer has met a broken connection, not a slow API server.
REQUEST_TIMEOUT = (10, 60)
# Watches end server-side after this long (the API server sends bookmarks meanwhile); a read that
# waits longer than that plus a margin has lost its connection.
WATCH_SECONDS = 300
WATCH_READ_TIMEOUT = WATCH_SECONDS + 60


def api_client() -> client.ApiClient:
    """An ApiClient for the pod's service account, or the local kubeconfig ($KUBECONFIG), whose
    requests name the operator in the API server's audit log."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api = client.ApiClient()
    api.user_agent = USER_AGENT
    return api


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
        content_type: str = JSON,
        accept: str = JSON,
    ) -> dict[str, Any]:
        response = self._send(method, url, query, body, content_type, accept, REQUEST_TIMEOUT)
        response.read()
        _raise_unless_ok(response)
        return json.loads(response.data)

    def _send(
        self,
        method: str,
        url: str,
        query: list[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        accept: str,
        timeout: tuple[float, float],
    ) -> Any:
        method, url, headers, body, post = self.api.param_serialize(
            method,
            url,
            query_params=query or [],
            header_params={"Accept": accept, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(method, url, headers, body, post, _request_timeout=timeout)

    def list_all(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None, metadata_only: bool
    ) -> dict[str, Any]:
        """One LIST: the items and the resourceVersion to watch from."""
        query = [("labelSelector", label_selector)] if label_selector else []
        accept = METADATA_LIST if metadata_only else JSON
        return self._call("GET", path(api_version, kind, namespace), query, accept=accept)

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None,
        metadata_only: bool,
        since: str,
    ) -> Iterator[dict[str, Any]]:
        """The watch events after resourceVersion `since`, until the API server ends the watch."""
        query = [("watch", "true"), ("allowWatchBookmarks", "true"), ("resourceVersion", since)]
        query.append(("timeoutSeconds", str(WATCH_SECONDS)))
        if label_selector:
            query.append(("labelSelector", label_selector))
        accept = METADATA_OBJECT if metadata_only else JSON
        url = path(api_version, kind, namespace)
        response = self._send("GET", url, query, None, JSON, accept, (REQUEST_TIMEOUT[0], WATCH_READ_TIMEOUT))
        try:
            if not 200 <= response.status <= 299:
                response.read()  # the refusal's body, for the exception
            _raise_unless_ok(response)
            pending = b""
            for chunk in response.response.stream(64 * 1024, decode_content=True):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.response.release_conn()

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def exists(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Whether the object exists, asked as a metadata-only LIST by name: the list verb is enough
        (the operator may list Secrets' metadata, never get one), and no data comes back."""
        query = [("fieldSelector", f"metadata.name={name}")]
        found = self._call("GET", path(api_version, kind, namespace), query, accept=METADATA_LIST)
        return bool(found.get("items"))

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return self.list_all(api_version, kind, namespace, label_selector, metadata_only=False)["items"]

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

    def create_returning(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """POST, returning what the API server stored (409 raised when it exists)."""
        meta = manifest["metadata"]
        return self._call("POST", path(manifest["apiVersion"], manifest["kind"], meta["namespace"]), body=manifest)

    def update(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """PUT of a whole object read before (its metadata.resourceVersion: 409 raised when it changed since)."""
        meta = manifest["metadata"]
        return self._call(
            "PUT",
            path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]),
            [("fieldManager", self.field_manager)],
            body=manifest,
        )

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

    def apply(self, manifest: dict[str, Any], live: dict[str, Any] | None) -> tuple[str, str]:
        """Server-side apply against `live` (the cached object, None when absent), skipped when a
        dry run shows it already matches.

        Returns ("created" | "updated" | "replaced" | "unchanged", the resulting resourceVersion).
        The dry run lets the API server do the comparison (defaults, normalized quantities, fields
        we stopped setting), so an unchanged spec costs one request and no write.
        """
        if live is None:
            created = self._server_side_apply(manifest, dry_run=False)
            return "created", created["metadata"]["resourceVersion"]
        try:
            preview = self._server_side_apply(manifest, dry_run=True)
        except ApiException as error:
            if error.status != 422:
                raise
            # Another manager's edit can leave list items ours cannot merge with (e.g. a Service
            # port renumbered by `kubectl edit` keeps its name `http`): put our object back whole.
            return "replaced", self._replace(manifest, live)["metadata"]["resourceVersion"]
        if _comparable(preview) == _comparable(live):
            return "unchanged", preview["metadata"]["resourceVersion"]
        updated = self._server_side_apply(manifest, dry_run=False)
        return "updated", updated["metadata"]["resourceVersion"]

    def _replace(self, manifest: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        # The API server keeps what it allocated (a Service's clusterIP) when the new object leaves it out.
        return self.update({**manifest, "metadata": {**meta, "resourceVersion": live["metadata"]["resourceVersion"]}})

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete one object, its dependents after it (background); False when it was gone already."""
        try:
            self._call(
                "DELETE",
                path(api_version, kind, namespace, name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves this kind now (a CRD installed apart from the operator)."""
        try:
            resources = self._call("GET", f"/apis/{api_version}")["resources"]
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return any(resource.get("kind") == kind for resource in resources)

    def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any]:
        """A merge patch (one annotation, the status subresource); returns the object as written."""
        return self._call(
            "PATCH",
            path(api_version, kind, namespace, name, sub),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        return self.patch(api_version, kind, namespace, name, {"status": status}, sub="status")


def _raise_unless_ok(response: Any) -> None:
    if not 200 <= response.status <= 299:
        raise ApiException(http_resp=response)


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in obj.get("metadata", {}).items() if k not in VOLATILE_METADATA}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}


def fingerprint(manifest: dict[str, Any]) -> str:
    """A digest of a desired manifest: equal digests, equal manifests."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def known_to_match(last: tuple[str, str] | None, desired: str, manifest: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether the cached `live` child is known to match `manifest` without asking the API server:
    this manifest (fingerprint `desired`) was checked against it before (`last`: that fingerprint and
    the resourceVersion then), and either the child has not changed since or it still contains every
    field the manifest sets (a status update, say)."""
    if last is None or last[0] != desired:
        return False  # new to this process, or the manifest changed: the API server compares
    return live["metadata"]["resourceVersion"] == last[1] or contains(live, manifest)


def contains(live: Any, desired: Any) -> bool:
    """Whether `live` already holds every field of `desired`, as server-side apply would leave it:
    dicts may carry more (defaults, other managers' fields), lists match item by item, scalars as
    the API server prints them (2 and "2" alike). False means "ask the API server", never "differs"."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            key in live and contains(live[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(map(contains, live, desired))
    return live == desired or (not isinstance(live, (dict, list)) and str(live) == str(desired))
