"""MODELSERVE_INFERENCE_POOLS: each namespace's InferencePool, kept by the reconcile of any of its
ModelServers (api/pools.py renders it, and says why one pool per namespace and how the picker is
reached). Watched: the pools (all of them: one of the pool's name that is not the operator's is left
alone and named), the picker Service and EndpointSlice the operator made beside each, and the
picker's own Service and EndpointSlices in its namespace, whose ready endpoints are mirrored.

The InferencePool CRD is installed apart from the operator: until the API server serves it, every
ModelServer says so in its InferencePool condition (asked again every few seconds, as for
LeaderWorkerSet), and nothing else changes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from modelserve.api import pools
from modelserve.api.spec import ModelServer
from modelserve.api.status import InferencePoolStatus
from modelserve.contracts import sidecar
from modelserve.contracts.names import (
    INFERENCE_POOL_API_VERSION,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
)
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.apply import Kube, error_message, fingerprint, is_gone, known_to_match
from modelserve.kube.watch_cache import WatchCache, Watched
from modelserve.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

CONDITION = "InferencePool"
MISSING = "InferencePoolMissing"
CONFLICT = "InferencePoolConflict"
REFUSED = "InferencePoolRefused"
PICKER_UNAVAILABLE = "PickerUnavailable"
SERVES_HTTPS = "ServesHTTPS"
# The condition's reasons, whether each is True, and its message's shape (for the docs' reasons table).
REASONS = {
    "Applied": (True, "its pods serve in InferencePool <namespace>/modelserve ...; <what its Gateways say>"),
    MISSING: (False, "the API server serves no inference.networking.k8s.io/v1 InferencePool: install its CRD"),
    CONFLICT: (
        False,
        "InferencePool <namespace>/modelserve (or its picker's Service or EndpointSlice) exists and "
        "is not the operator's: left as it is",
    ),
    REFUSED: (False, "<kind> <name> was refused: <the API server's words>"),
    PICKER_UNAVAILABLE: (False, "the picker Service <namespace/name> was not found, or has no ready endpoints"),
    SERVES_HTTPS: (False, "spec.tls: its sidecars serve HTTPS: its pods are not in the pool"),
}
PROBE_SECONDS = 10.0
LIST_SECONDS = 30.0
MISSING_MESSAGE = (
    f"MODELSERVE_INFERENCE_POOLS is on and the API server serves no {INFERENCE_POOL_API_VERSION} "
    f"{INFERENCE_POOL_KIND}: install the Gateway API Inference Extension's CRD (v1.0.0 or later; the "
    "chart's inferencePools.crd.enabled)"
)

POOLS = Watched(INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND)
LOCAL_SERVICES = Watched("v1", "Service", INFERENCE_POOL_LABEL)
LOCAL_SLICES = Watched(pools.ENDPOINT_SLICE_API_VERSION, pools.ENDPOINT_SLICE_KIND, INFERENCE_POOL_LABEL)
PICKER_SERVICES = Watched("v1", "Service")
PICKER_SLICES = Watched(pools.ENDPOINT_SLICE_API_VERSION, pools.ENDPOINT_SLICE_KIND, pools.SERVICE_NAME_LABEL)


@dataclass(frozen=True)
class PoolReport:
    """A ModelServer's InferencePool condition (status, reason, message) and status.inferencePool."""

    ok: bool
    reason: str
    message: str
    status: InferencePoolStatus | None = None

    @property
    def condition(self) -> tuple[bool, str, str]:
        return self.ok, self.reason, self.message


class Pools:
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        modelservers: WatchCache,
        queue: WorkQueue,
        namespaces: tuple[str, ...],
        backoffs: tuple[float, ...],
    ):
        self.kube = kube
        self.settings = settings
        self.modelservers = modelservers
        self.queue = queue
        self.backoffs = backoffs
        self.scopes: tuple[str | None, ...] = namespaces or (None,)
        self.picker_namespace, _, self.picker_name = settings.picker_service.partition("/")
        self.services = WatchCache(kube, LOCAL_SERVICES, self.scopes, self._queue_namespace, backoffs)
        self.slices = WatchCache(kube, LOCAL_SLICES, self.scopes, self._queue_namespace, backoffs)
        picker_scope = (self.picker_namespace,)
        self.picker_services = WatchCache(kube, PICKER_SERVICES, picker_scope, self._picker_changed, backoffs)
        self.picker_slices = WatchCache(kube, PICKER_SLICES, picker_scope, self._picker_changed, backoffs)
        self.pools: WatchCache | None = None  # from when the API server serves the kind
        self._probed_at = float("-inf")
        self._probe_guard = threading.Lock()
        self._apply_guard = threading.Lock()
        # Per (namespace, child): the manifest's fingerprint and the resourceVersion found to match it.
        self._matched: dict[tuple[str, str], tuple[str, str]] = {}

    def caches(self) -> list[WatchCache]:
        """The caches started (and listed) with the operator's own."""
        return [self.services, self.slices, self.picker_services, self.picker_slices]

    def stop(self) -> None:
        for cache in [*self.caches(), *([self.pools] if self.pools else [])]:
            cache.stop()

    def _queue_namespace(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"].get("namespace")
        for ms in self.modelservers.items():
            if ms["metadata"]["namespace"] == namespace:
                self.queue.add((namespace, ms["metadata"]["name"]))

    def _picker_changed(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        if meta["name"] != self.picker_name and (meta.get("labels") or {}).get(pools.SERVICE_NAME_LABEL) != (
            self.picker_name
        ):
            return
        for ms in self.modelservers.items():
            self.queue.add((ms["metadata"]["namespace"], ms["metadata"]["name"]))

    def pool_cache(self) -> WatchCache | None:
        """The InferencePools' cache, started the first time the API server is found serving the kind
        (asked again at most every PROBE_SECONDS while it does not)."""
        with self._probe_guard:
            if self.pools is not None:
                return self.pools
            if time.monotonic() - self._probed_at < PROBE_SECONDS:
                return None
            self._probed_at = time.monotonic()
            if not self.kube.serves(INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND):
                return None
            cache = WatchCache(self.kube, POOLS, self.scopes, self._queue_namespace, self.backoffs)
            cache.start()
            if not cache.wait_listed(LIST_SECONDS):  # a pool not yet listed would look missing
                cache.stop()
                return None
            self.pools = cache
            log.info("the API server serves %s %s: keeping pools", INFERENCE_POOL_API_VERSION, INFERENCE_POOL_KIND)
            return cache

    def sync(self, namespace: str, ms: ModelServer | None = None) -> PoolReport | None:
        """Keep `namespace`'s pool (and its picker Service and EndpointSlice) as its ModelServers ask;
        `ms`: the one reconciled now, whose report this is (None: one was deleted; no report)."""
        cache = self.pool_cache()
        if cache is None:
            return PoolReport(False, MISSING, MISSING_MESSAGE) if ms is not None else None
        owned = pools.owners([body for body in self.modelservers.items() if body["metadata"]["namespace"] == namespace])
        if not owned:
            return None  # the garbage collector deletes what the last owner owned
        where = f"{namespace}/{pools.POOL_NAME}"
        pool = cache.get(namespace, pools.POOL_NAME)
        if pool is not None and not pools.ours(pool):
            message = (
                f"InferencePool {where} exists and is not the operator's (no {MANAGED_BY_LABEL}: "
                f"{MANAGED_BY} label): left as it is; rename or delete it for the operator's pool"
            )
            return PoolReport(False, CONFLICT, message)
        picker = pools.picker_endpoints(
            self.settings,
            self.picker_services.get(self.picker_namespace, self.picker_name),
            self.picker_slices.owned_by(self.picker_namespace, self.picker_name),
        )
        children = [
            (pools.picker_service(namespace, owned, self.settings), self.services),
            (pools.picker_slice(namespace, owned, picker), self.slices),
            (pools.inference_pool(namespace, owned, self.settings), cache),
        ]
        try:
            for manifest, live_cache in children:
                foreign = self._apply(namespace, manifest, live_cache)
                if foreign:
                    message = (
                        f"{foreign} exists and is not the operator's (no {MANAGED_BY_LABEL}: {MANAGED_BY} "
                        f"label): left as it is, and no pool made; rename or delete it for the operator's pool"
                    )
                    return PoolReport(False, CONFLICT, message)
        except ApiException as error:
            if is_gone(error):
                raise
            child = f"{manifest['kind']} {namespace}/{manifest['metadata']['name']}"
            return PoolReport(False, REFUSED, f"{child} was refused: {error_message(error)}")
        if ms is None:
            return None
        status = pools.pool_status(pool)
        if not pools.pooled(ms, self.settings):
            message = (
                f"spec.tls: its sidecars serve HTTPS, and InferencePool {where} reaches its pods over plain HTTP "
                "(appProtocol http): its pods are not in the pool"
            )
            return PoolReport(False, SERVES_HTTPS, message, status)
        if picker.problem:
            message = f"InferencePool {where} selects its pods, but {picker.problem}: its gateways cannot pick"
            return PoolReport(False, PICKER_UNAVAILABLE, message, status)
        message = (
            f"its pods serve in InferencePool {where} (port {sidecar.LISTEN_PORT}), picker "
            f"{self.settings.picker_service} ({len(picker.endpoints)} ready); {pools.parents_summary(status)}"
        )
        return PoolReport(True, "Applied", message, status)

    def _apply(self, namespace: str, manifest: dict[str, Any], cache: WatchCache) -> str:
        """Apply one child unless it is known to match; returns the object that stopped it (one of its
        name that is not the operator's), else ""."""
        meta = manifest["metadata"]
        child = (namespace, f"{manifest['kind']} {meta['name']}")
        desired = fingerprint(manifest)
        live = cache.get(namespace, meta["name"])
        with self._apply_guard:
            last = self._matched.get(child)
            if live is not None and known_to_match(last, desired, manifest, live):
                return ""
            if live is None and last is None:
                api_version, kind = manifest["apiVersion"], manifest["kind"]
                if self.kube.exists(api_version, kind, namespace, meta["name"]):
                    return f"{kind} {namespace}/{meta['name']}"  # not ours: ours carry the label the cache watches
            outcome, resource_version = self.kube.apply(manifest, live)
            self._matched[child] = (desired, resource_version)
        if outcome != "unchanged":
            log.info("%s: %s %s", namespace, child[1], outcome)
        return ""
