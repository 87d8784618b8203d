"""What the CLI asks of the cluster in the current kubeconfig: ModelServers, their key, a port-forward.

Errors come out as ClusterError with a message for people (never a traceback, never a key).
"""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from modelserve.api.spec import AuthMode
from modelserve.contracts.key_entries import EntryError, is_hash, parse_entry
from modelserve.contracts.names import API_VERSION, KIND
from modelserve.kube import apply

FIELD_MANAGER = "modelserve-cli"
PORT_FORWARD_SECONDS = 30
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+)")


class ClusterError(Exception):
    """Something the cluster (or kubectl) said no to, in words for the user."""


def _api_message(error: Exception) -> str:
    if isinstance(error, ApiException):
        return apply.error_message(error)
    return f"cannot reach the cluster: {error}"


class _Absent(Exception):
    pass


class Cluster:
    """The current kubeconfig context (or the pod's service account) and its namespace."""

    def __init__(self) -> None:
        try:
            config.load_kube_config()
            _, active = config.list_kube_config_contexts()
            self.namespace = (active or {}).get("context", {}).get("namespace") or "default"
        except (config.ConfigException, OSError) as error:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                raise ClusterError(f"no cluster to talk to: {error}") from None
            self.namespace = "default"
        api = client.ApiClient()
        api.user_agent = FIELD_MANAGER
        self.kube = apply.Kube(api, FIELD_MANAGER)

    def _do(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except ApiException as error:
            raise ClusterError(_api_message(error)) from None
        except Exception as error:  # urllib3's connection errors: the cluster is not there
            if type(error).__module__.startswith(("urllib3", "ssl", "socket")) or isinstance(error, OSError):
                raise ClusterError(_api_message(error)) from None
            raise

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        found = self._do(self.kube.get, API_VERSION, KIND, namespace, name)
        if found is None:
            raise ClusterError(f'ModelServer "{name}" not found in namespace "{namespace}"')
        return found

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        return self._do(self.kube.list, API_VERSION, KIND, namespace)

    def delete(self, name: str, namespace: str) -> None:
        url = apply.path(API_VERSION, KIND, namespace, name)
        try:
            self._do(self._delete, url)
        except _Absent:
            raise ClusterError(f'ModelServer "{name}" not found in namespace "{namespace}"') from None

    def _delete(self, url: str) -> None:
        try:
            self.kube._call("DELETE", url)
        except ApiException as error:
            if error.status == 404:
                raise _Absent from None
            raise

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the CLI's own field manager."""
        return self._do(self.kube._server_side_apply, manifest, False)

    def secret_data(self, name: str, namespace: str) -> dict[str, str]:
        secret = self._do(self.kube.get, "v1", "Secret", namespace, name)
        if secret is None:
            raise ClusterError(f'the key Secret "{name}" is not in namespace "{namespace}" (yet)')
        return _decoded(secret)

    def secret(self, name: str, namespace: str) -> dict[str, Any] | None:
        return self._do(self.kube.get, "v1", "Secret", namespace, name)

    def patch_secret_entry(
        self, name: str, namespace: str, data_key: str, text: str | None, resource_version: str | None = None
    ) -> None:
        """Set one data entry to `text`, or remove it (None), leaving the Secret's other entries alone:
        a JSON merge patch, so two people editing different keys do not undo each other. A merge patch
        removes a key only when it is null in `data` (stringData is write-only, merged into data).
        With `resource_version`, the API server refuses (409) if the Secret changed since it was read."""
        patch: dict[str, Any] = {"data": {data_key: None}} if text is None else {"stringData": {data_key: text}}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        self._do(self.kube.patch, "v1", "Secret", namespace, name, patch)

    def create_secret(self, name: str, namespace: str, data_key: str, text: str) -> None:
        """A new Secret with one entry (refused with 409 if someone created it meanwhile)."""
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque",
            "stringData": {data_key: text},
        }
        self._do(self.kube.create_returning, manifest)


def _decoded(secret: dict[str, Any]) -> dict[str, str]:
    # errors="replace": a binary entry someone else put there is shown as unreadable, not a crash.
    data = secret.get("data") or {}
    return {key: base64.b64decode(value).decode(errors="replace") for key, value in data.items()}


@dataclass(frozen=True)
class KeyStore:
    """A ModelServer's key Secret as the key commands read it; `resource_version` None: not there yet."""

    secret: str
    namespace: str
    generated: bool  # the operator's <name>-api-keys: the operator creates it, the CLI never does
    data: dict[str, str]
    resource_version: str | None


def key_store(cluster: Cluster, name: str, namespace: str) -> KeyStore:
    """The key Secret of ModelServer `name`; ClusterError when it takes no keys (auth.mode public)."""
    where = key_secret(cluster.get(name, namespace))
    if where is None:
        raise ClusterError(
            f'ModelServer "{name}" has auth.mode public: it checks no API keys (set auth.mode private first)'
        )
    secret_name, generated_field = where
    found = cluster.secret(secret_name, namespace)
    if found is None:
        return KeyStore(secret_name, namespace, bool(generated_field), {}, None)
    return KeyStore(
        secret_name, namespace, bool(generated_field), _decoded(found), found["metadata"]["resourceVersion"]
    )


def write_key_entry(cluster: Cluster, store: KeyStore, data_key: str, text: str | None) -> None:
    """Set or remove one entry of the store's Secret, refused if the Secret changed since it was read
    (another `key create` of the same name); a named Secret not there yet is created, the generated one
    is left to the operator (creating it first would keep the operator from putting its key in)."""
    if store.resource_version is not None:
        cluster.patch_secret_entry(store.secret, store.namespace, data_key, text, store.resource_version)
    elif store.generated:
        raise ClusterError(
            f'the operator has not created the key Secret "{store.secret}" in namespace "{store.namespace}" yet '
            "(is it running?): try again once it has"
        )
    elif text is not None:
        cluster.create_secret(store.secret, store.namespace, data_key, text)


def key_secret(ms: dict[str, Any]) -> tuple[str, str] | None:
    """(Secret name, data key or "" for the first entry) holding the key; None with public auth."""
    auth = (ms.get("spec") or {}).get("auth") or {}
    if auth.get("mode") == AuthMode.PUBLIC:
        return None
    if auth.get("secretName"):
        return auth["secretName"], ""
    return f"{ms['metadata']['name']}-api-keys", "api-key"


def first_key(data: dict[str, str], key: str) -> str | None:
    """The key in a Secret's data: the named entry's, or the first of the first entry (in name order)
    that holds one. Only a plaintext credential is a key: a hash (what `modelserve key create` stores)
    cannot be sent, and an entry that does not parse is skipped, as the sidecar skips it."""
    for name in [key] if key else sorted(data):
        try:
            entry = parse_entry(name, data.get(name) or "")
        except EntryError:
            continue
        plain = [credential for credential in entry.credentials if not is_hash(credential)]
        if plain:
            return plain[0]
    return None


def read_key(cluster: Cluster, ms: dict[str, Any]) -> str | None:
    where = key_secret(ms)
    if where is None:
        return None
    secret, key = where
    found = first_key(cluster.secret_data(secret, ms["metadata"]["namespace"]), key)
    if found is None:
        raise ClusterError(
            f'the Secret "{secret}" holds no API key in plaintext (a hashed one cannot be read back): pass --key'
        )
    return found


@contextlib.contextmanager
def port_forward(name: str, namespace: str) -> Iterator[str]:
    """`kubectl port-forward svc/NAME :80` on a free local port; yields the base URL, stops it after."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ClusterError("kubectl is not on PATH: install it, or pass --url to reach the model another way")
    process = subprocess.Popen(
        [kubectl, "port-forward", "-n", namespace, f"svc/{name}", ":80"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = _forwarded_port(process)
        # Keep reading kubectl's output, so a full pipe never blocks it.
        for pipe in (process.stdout, process.stderr):
            threading.Thread(target=pipe.read, daemon=True).start()  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _forwarded_port(process: subprocess.Popen) -> int:
    """The local port kubectl chose, from its first line; its error if it exits instead."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(PORT_FORWARD_SECONDS)
    match = FORWARDING.search(lines[0]) if lines else None
    if match:
        return int(match.group(1))
    process.kill()
    process.wait(5)
    said = process.stderr.read().strip() or f"no answer within {PORT_FORWARD_SECONDS}s"  # type: ignore[union-attr]
    raise ClusterError(f"kubectl port-forward failed: {said}")
