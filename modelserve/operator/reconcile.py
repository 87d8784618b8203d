"""Level-based reconcile of one ModelServer: read everything, apply what differs, report status.

Any trigger (the ModelServer, one of its children, the periodic resync) runs the same function
from the work queue, one worker per key at a time, so a deleted or edited child is put back
whatever the order of events. Reads come from the watch-fed caches: an object that matches what it
should be costs no request, and the API server hears from the operator only to change something.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.api.status import utc_now
from modelserve.api.validation import explain
from modelserve.contracts.api_keys import new_api_key
from modelserve.contracts.names import API_VERSION, KIND, SELECTOR_LABEL, Key
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.apply import Kube, contains, error_message, fingerprint, is_gone
from modelserve.kube.watch_cache import MODELSERVERS, WatchCache, Watched
from modelserve.kube.workqueue import WorkQueue

from .autoscaling import Autoscaling
from .status import compute_status, invalid_spec_status, key_secret_status, transitions

log = logging.getLogger(__name__)

CHILDREN = tuple(
    Watched(api_version, kind, SELECTOR_LABEL)
    for api_version, kind in (
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("v1", "PersistentVolumeClaim"),
        ("v1", "ConfigMap"),
        ("v1", "Pod"),
    )
)
# Watched so a deleted key Secret is re-created at once; metadata only, so no key is ever read.
SECRETS = Watched("v1", "Secret", SELECTOR_LABEL, metadata_only=True)


@dataclass(frozen=True)
class Caches:
    modelservers: WatchCache
    by_kind: dict[str, WatchCache]  # children and Secrets

    def all(self) -> list[WatchCache]:
        return [self.modelservers, *self.by_kind.values()]


def watch_caches(kube: Kube, namespaces: tuple[str, ...], queue: WorkQueue, backoffs: tuple[float, ...]) -> Caches:
    """A cache per kind the operator reads, each change queueing the ModelServer it concerns."""
    scopes: tuple[str | None, ...] = namespaces or (None,)

    def queue_owner(watched: Watched) -> Any:
        def changed(body: dict[str, Any]) -> None:
            owner = (body["metadata"].get("labels") or {}).get(SELECTOR_LABEL)
            if owner:
                queue.add((body["metadata"]["namespace"], owner))

        return changed

    def queue_itself(body: dict[str, Any]) -> None:
        queue.add((body["metadata"]["namespace"], body["metadata"]["name"]))

    return Caches(
        modelservers=WatchCache(kube, MODELSERVERS, scopes, queue_itself, backoffs),
        by_kind={
            watched.kind: WatchCache(kube, watched, scopes, queue_owner(watched), backoffs)
            for watched in (*CHILDREN, SECRETS)
        },
    )


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings, caches: Caches, autoscaling: Autoscaling):
        self.kube = kube
        self.settings = settings
        self.caches = caches
        self.autoscaling = autoscaling
        # Per ModelServer, per child: the desired manifest's fingerprint and the child's
        # resourceVersion last found (or made) to match it. Only this process's knowledge: after a
        # restart every child is checked with the API server once.
        self._matched: dict[Key, dict[str, tuple[str, str]]] = {}
        self._matched_guard = threading.Lock()

    def reconcile(self, key: Key) -> None:
        namespace, name = key
        try:
            self._reconcile(namespace, name)
        except ApiException as error:
            if not is_gone(error):
                raise
            # Deleted while we looked at it: its children go with it.
            log.debug("%s/%s: gone mid-reconcile: %s", namespace, name, error_message(error))

    def _reconcile(self, namespace: str, name: str) -> None:
        body = self.caches.modelservers.get(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            with self._matched_guard:
                self._matched.pop((namespace, name), None)
            self.autoscaling.forget((namespace, name))
            return  # the garbage collector removes the children through their owner references
        previous = body.get("status") or {}
        generation = body["metadata"]["generation"]
        now = utc_now()
        try:
            ms = ModelServer.from_manifest(body)
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            self._report(body, previous, invalid_spec_status(generation, previous, now, explain(error)), now)
            return
        replicas = self.autoscaling.replicas(ms)
        apply_error, key_generated = self._apply_children(ms, replicas)
        deployment = self.caches.by_kind["Deployment"].get(namespace, name)
        pods = self.caches.by_kind["Pod"].owned_by(namespace, name)
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
            desired=replicas,
            scaling=self.autoscaling.scaling(ms),
            gateway_endpoint=self.settings.gateway_url or None,
        )
        self._report(body, previous, status, now)

    def _report(self, body: dict, previous: dict, status: dict, now: str) -> None:
        """Write the status when it changed, and an Event for each condition that moved."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if status == previous:
            return
        # A merge patch keeps what it does not name: null out what the status no longer has.
        removed = {key: None for key in previous if key not in status}
        written = self.kube.patch_status(API_VERSION, KIND, namespace, name, {**removed, **status})
        # The next reconcile may come before the watch brings this back: it must not write it again.
        self.caches.modelservers.put(written)
        for transition in transitions(previous, status):
            log.info("%s/%s: %s %s", namespace, name, transition.reason, transition.message)
            self.kube.create(manifests.event(body, transition, now, socket.gethostname()))

    def _apply_children(self, ms: ModelServer, replicas: int) -> tuple[str | None, bool]:
        """Apply every child that does not match: (the API server's refusal, if any, for the
        Degraded message; whether a key Secret was created, i.e. a new key generated)."""
        child, key_generated = "", False
        with self._matched_guard:
            matched = self._matched.setdefault((ms.namespace, ms.name), {})
        try:
            for manifest in manifests.server_side_applied(ms, self.settings, replicas):
                child = f"{manifest['kind']} {manifest['metadata']['name']}"
                live = self.caches.by_kind[manifest["kind"]].get(ms.namespace, manifest["metadata"]["name"])
                desired = fingerprint(manifest)
                if live is not None and _matches(matched.get(child), desired, manifest, live):
                    continue
                outcome, resource_version = self.kube.apply(manifest, live)
                matched[child] = (desired, resource_version)
                if outcome != "unchanged":
                    log.info("%s/%s: %s %s", ms.namespace, ms.name, child, outcome)
            # Created once and never applied again: rewriting it would change the key under clients.
            # Create-if-absent: the cache says whether it exists, a 409 that it appeared meanwhile.
            secret = manifests.generated_key_secret(ms, new_api_key())
            if secret and self.caches.by_kind["Secret"].get(ms.namespace, secret["metadata"]["name"]) is None:
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


def _matches(last: tuple[str, str] | None, desired: str, manifest: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether the cached `live` child is known to match `manifest` without asking the API server:
    this manifest was checked against it before (same fingerprint), and either the child has not
    changed since or it still contains every field the manifest sets (a status update, say)."""
    if last is None or last[0] != desired:
        return False  # new to this process, or the ModelServer changed: the API server compares
    return live["metadata"]["resourceVersion"] == last[1] or contains(live, manifest)


class Resync:
    """Queues every cached ModelServer on a period: a reconcile that failed (a refused child, an
    outage) is tried again though nothing changed. It costs no request while everything matches."""

    def __init__(self, caches: Caches, queue: WorkQueue, interval: float):
        self.caches = caches
        self.queue = queue
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modelserve-resync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for body in self.caches.modelservers.items():
                self.queue.add((body["metadata"]["namespace"], body["metadata"]["name"]))
