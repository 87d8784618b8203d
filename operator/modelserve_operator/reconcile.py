"""Level-based reconcile of one ModelServer: read everything, apply what differs, report status.

Any trigger (the ModelServer, one of its children, the periodic resync) runs the same function,
serialized per object, so a deleted or edited child is put back whatever the order of events.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import defaultdict
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from . import manifests
from .api_keys import new_api_key
from .apply import Kube, error_message, is_gone
from .settings import Settings
from .spec import API_VERSION, KIND, ModelServer
from .status import compute_status, invalid_spec_status, key_secret_status, transitions
from .validation import explain

log = logging.getLogger(__name__)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings):
        self.kube = kube
        self.settings = settings
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    def reconcile(self, namespace: str, name: str) -> None:
        with self._locks_guard:
            lock = self._locks[(namespace, name)]
        with lock:
            try:
                self._reconcile(namespace, name)
            except ApiException as error:
                if not is_gone(error):
                    raise
                # Deleted while we looked at it: its children go with it.
                log.debug("%s/%s: gone mid-reconcile: %s", namespace, name, error_message(error))

    def _reconcile(self, namespace: str, name: str) -> None:
        body = self.kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return  # the garbage collector removes the children through their owner references
        previous = body.get("status") or {}
        generation = body["metadata"]["generation"]
        now = utc_now()
        try:
            ms = ModelServer.from_manifest(body)
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            self._report(body, previous, invalid_spec_status(generation, previous, now, explain(error)), now)
            return
        apply_error, key_generated = self._apply_children(ms)
        deployment = self.kube.get("apps/v1", "Deployment", namespace, name)
        pods = self.kube.list("v1", "Pod", namespace, f"{manifests.SELECTOR_LABEL}={name}")
        status = compute_status(
            ms,
            generation,
            deployment,
            pods,
            previous,
            now,
            manifests.endpoint(ms, self.settings.cluster_domain),
            apply_error,
            key_secret_status(manifests.generated_secret_name(ms), key_generated, previous, now),
        )
        self._report(body, previous, status, now)

    def _report(self, body: dict, previous: dict, status: dict, now: str) -> None:
        """Write the status when it changed, and an Event for each condition that moved."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if status == previous:
            return
        # A merge patch keeps what it does not name: null out what the status no longer has.
        removed = {key: None for key in previous if key not in status}
        self.kube.patch_status(API_VERSION, KIND, namespace, name, {**removed, **status})
        for transition in transitions(previous, status):
            log.info("%s/%s: %s %s", namespace, name, transition.reason, transition.message)
            self.kube.create(manifests.event(body, transition, now, socket.gethostname()))

    def _apply_children(self, ms: ModelServer) -> tuple[str | None, bool]:
        """Apply every child: (the API server's refusal, if any, for the Degraded message; whether
        a key Secret was created, i.e. a new key generated)."""
        child, key_generated = "", False
        try:
            for manifest in manifests.server_side_applied(ms, self.settings):
                child = f"{manifest['kind']} {manifest['metadata']['name']}"
                outcome = self.kube.apply(manifest)
                if outcome != "unchanged":
                    log.info("%s/%s: %s %s", ms.namespace, ms.name, child, outcome)
            secret = manifests.generated_key_secret(ms, new_api_key())
            # Created once and never applied again: rewriting it would change the key under clients.
            # Create-if-absent (409 = already there) so the operator never needs to read a Secret.
            if secret:
                child = f"Secret {secret['metadata']['name']}"
                key_generated = self.kube.create(secret)
                if key_generated:
                    log.info("%s/%s: %s created", ms.namespace, ms.name, child)
        except ApiException as error:
            if is_gone(error):
                raise
            message = f"{child} was refused: {error_message(error)}"
            log.warning("%s/%s: %s", ms.namespace, ms.name, message)
            return message, key_generated
        return None, key_generated


class Resync:
    """Reconciles every ModelServer on a period: repairs drift no watch reports (e.g. the key Secret)."""

    def __init__(self, reconciler: Reconciler, interval: float, namespaces: tuple[str, ...] = ()):
        self.reconciler = reconciler
        self.interval = interval
        self.namespaces = namespaces or (None,)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modelserve-resync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                for namespace in self.namespaces:
                    for item in self.reconciler.kube.list(API_VERSION, KIND, namespace):
                        if self._stop.is_set():
                            return
                        meta = item["metadata"]
                        self.reconciler.reconcile(meta["namespace"], meta["name"])
            except Exception:  # keep resyncing: the next round may succeed where this one failed
                log.exception("resync round failed")
