"""Watch-fed caches of everything the operator reads: list once, then watch; a read is a dict lookup.

One thread per kind and namespace runs the list-then-watch loop of an informer: a LIST replaces the
cache whole (what vanished during a lost watch is noticed), the watch continues from its
resourceVersion, a watch that expired (410) lists again. Every change reports the object it
touched, so a change, not a timer, is what makes the operator reconcile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from modelserve.contracts.names import API_VERSION, KIND, Key

from .apply import Kube, error_message

log = logging.getLogger(__name__)

# Retries of a failed API request (watches included) wait at most 2 s, so after an API server
# outage the operator sees the cluster again within a couple of seconds (kopf's own default climbs
# 1, 1, 2, 3, 5, 8, 13, 21 s); ~90 s of retries before a request of kopf's fails.
API_RETRY_BACKOFFS = (0.5, 1.0, *([2.0] * 44))
OnChange = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Watched:
    api_version: str
    kind: str
    # Only objects carrying this label (server-side: nothing else crosses the wire), indexed by its value.
    owner_label: str | None = None
    # Metadata only: a cached Secret is its name and labels, never the key it holds.
    metadata_only: bool = False


# The operator's and the gateway's view of every ModelServer.
MODELSERVERS = Watched(API_VERSION, KIND)


def compact(watched: Watched, body: dict[str, Any]) -> dict[str, Any]:
    """What the operator keeps of an object: never managedFields (most of a body's bytes, read by
    nobody here); of a Pod, only what its status is computed from. Listed items lack apiVersion
    and kind: every cached object has them."""
    metadata = {key: value for key, value in body["metadata"].items() if key != "managedFields"}
    head = {"apiVersion": watched.api_version, "kind": watched.kind, "metadata": metadata}
    if watched.metadata_only:
        return head
    if watched.kind == "Pod":
        spec = body.get("spec") or {}
        # Its containers' port names: a sidecar's says whether it serves HTTPS (contracts.sidecar.serves_tls).
        containers = [
            {"name": c.get("name"), "ports": [{"name": p.get("name")} for p in c.get("ports") or []]}
            for c in spec.get("containers") or []
        ]
        return {
            **head,
            "spec": {"nodeName": spec.get("nodeName"), "containers": containers},
            "status": body.get("status") or {},
        }
    return {**body, **head}


def owner_of(watched: Watched, body: dict[str, Any]) -> str | None:
    return (body["metadata"].get("labels") or {}).get(watched.owner_label) if watched.owner_label else None


def key_of(body: dict[str, Any]) -> Key:
    return body["metadata"].get("namespace", ""), body["metadata"]["name"]


def newer(candidate: dict[str, Any], current: dict[str, Any] | None) -> bool:
    """Whether `candidate` is a later version than `current` (etcd's revisions count up)."""
    if current is None:
        return True
    try:
        return int(candidate["metadata"]["resourceVersion"]) >= int(current["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return True


class WatchCache:
    """The objects of one kind (in the given namespaces, None: all), kept current by watches."""

    def __init__(
        self,
        kube: Kube,
        watched: Watched,
        namespaces: tuple[str | None, ...],
        on_change: OnChange,
        retry_backoffs: tuple[float, ...],
    ) -> None:
        self.kube = kube
        self.watched = watched
        self.namespaces = namespaces
        self.on_change = on_change
        self.retry_backoffs = retry_backoffs
        self._objects: dict[Key, dict[str, Any]] = {}
        self._owned: dict[Key, set[str]] = {}  # (namespace, owner) -> names
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listed: set[str | None] = set()
        self._all_listed = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(namespace,), name=f"watch-{watched.kind}", daemon=True)
            for namespace in namespaces
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()  # a thread blocked in a watch ends with the process (daemon) or its timeout

    def wait_listed(self, timeout: float) -> bool:
        """Whether every namespace was listed once within `timeout` seconds."""
        return self._all_listed.wait(timeout)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((namespace, name))

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def owned_by(self, namespace: str, owner: str) -> list[dict[str, Any]]:
        """The objects of `namespace` whose owner label is `owner`."""
        with self._lock:
            names = self._owned.get((namespace, owner), ())
            return [self._objects[(namespace, name)] for name in names]

    def put(self, body: dict[str, Any]) -> None:
        """Record what the operator itself just wrote, unless the watch already brought a later one."""
        body = compact(self.watched, body)
        with self._lock:
            if newer(body, self._objects.get(key_of(body))):
                self._store(body)

    # The two writers of _objects and _owned, called with _lock held.
    def _store(self, body: dict[str, Any]) -> None:
        key = key_of(body)
        self._drop(key)
        self._objects[key] = body
        owner = owner_of(self.watched, body)
        if owner is not None:
            self._owned.setdefault((key[0], owner), set()).add(key[1])

    def _drop(self, key: Key) -> None:
        body = self._objects.pop(key, None)
        owner = owner_of(self.watched, body) if body else None
        if owner is not None:
            names = self._owned.get((key[0], owner), set())
            names.discard(key[1])
            if not names:
                self._owned.pop((key[0], owner), None)

    def _run(self, namespace: str | None) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                since = self._list(namespace)
                failures = 0
                while not self._stop.is_set():  # each watch ends after WATCH_SECONDS: go on from there
                    since = self._watch(namespace, since)
            except Exception as error:  # an outage, a 410, a reset: list again
                detail = error_message(error) if isinstance(error, ApiException) else repr(error)
                # One failure is routine (a watch expired); several in a row are an outage worth a line.
                level = logging.WARNING if failures >= 2 else logging.DEBUG
                log.log(level, "%s watch in %s: %s", self.watched.kind, namespace or "all namespaces", detail)
                backoff = self.retry_backoffs[min(failures, len(self.retry_backoffs) - 1)]
                failures += 1
                self._stop.wait(backoff)

    def _list(self, namespace: str | None) -> str:
        watched = self.watched
        listed = self.kube.list_all(
            watched.api_version, watched.kind, namespace, watched.owner_label, watched.metadata_only
        )
        fresh = {key_of(body): compact(watched, body) for body in listed.get("items") or []}  # null when empty
        with self._lock:
            mine = {key: body for key, body in self._objects.items() if namespace in (None, key[0])}
            for key in mine.keys() - fresh.keys():
                self._drop(key)
            for body in fresh.values():
                self._store(body)
        for key, body in mine.items():
            if key not in fresh:
                self.on_change(body)
        for key, body in fresh.items():
            if mine.get(key, {}).get("metadata", {}).get("resourceVersion") != body["metadata"]["resourceVersion"]:
                self.on_change(body)
        self._listed.add(namespace)
        if len(self._listed) == len(self.namespaces):
            self._all_listed.set()
        return listed["metadata"]["resourceVersion"]

    def _watch(self, namespace: str | None, since: str) -> str:
        """Apply one watch's events to the cache; returns the last resourceVersion seen when the API
        server ends the watch, raises when it broke (the caller lists again)."""
        watched = self.watched
        events = self.kube.watch(
            watched.api_version, watched.kind, namespace, watched.owner_label, watched.metadata_only, since
        )
        for event in events:
            if self._stop.is_set():
                break
            kind, body = event["type"], event["object"]
            if kind == "ERROR":  # 410 Gone: our resourceVersion is too old
                raise RuntimeError(f"watch error: {body.get('message', body)}")
            since = body["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            body = compact(watched, body)
            with self._lock:
                if kind == "DELETED":
                    self._drop(key_of(body))
                elif newer(body, self._objects.get(key_of(body))):  # not behind what put() recorded
                    self._store(body)
            self.on_change(body)
        return since
