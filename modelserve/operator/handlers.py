"""kopf wiring, kept thin: kopf runs the process (signals, liveness, logging); at startup it starts
the watch-fed caches, the work queue that reconciles what they report, and the resync.

No kopf resource handlers: kopf's per-object event streams held every watched body in memory and
gave no way to read a child without a request (~8 per reconcile). The caches (watch_cache.py) keep
compact bodies, and the queue holds keys. Nothing is stored in the objects and no finalizer is
added, so deleting a ModelServer never waits for the operator and an unchanged object is never written.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

import kopf

from modelserve.contracts.gateway import GATEWAY_LABEL
from modelserve.contracts.names import LWS_API_VERSION, LWS_KIND
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.apply import Kube, api_client
from modelserve.kube.lease import Elector, Timing
from modelserve.kube.watch_cache import API_RETRY_BACKOFFS, WatchCache, Watched
from modelserve.kube.workqueue import WorkQueue

from . import metrics
from .autoscaling import Autoscaling
from .pools import Pools
from .reconcile import Reconciler, Resync, watch_caches

log = logging.getLogger(__name__)

# Reconciles run side by side: most cost no request, the rest wait on the API server.
WORKERS = 8
LISTED_LOG_SECONDS = 30


@kopf.on.startup()
def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # the reconciler posts its own Events, one per transition
    settings.networking.error_backoffs = API_RETRY_BACKOFFS
    operator_settings: Settings = memo.settings
    kube = Kube(api_client())
    queue = WorkQueue(WORKERS)
    # LeaderWorkerSets are watched when their CRD is installed (else from when a ModelServer needs it).
    lws = kube.serves(LWS_API_VERSION, LWS_KIND)
    caches = watch_caches(kube, tuple(memo.get("namespaces", ())), queue, API_RETRY_BACKOFFS, lws=lws)
    by_kind = caches.by_kind
    gateways = gateway_pods(kube, operator_settings.gateway_pod_namespace)
    # Gateway pods (the chart's) are found by label; gateways that are not pods (make dev's, on the
    # host) by address: the requests either holds are the demand that wakes a model at zero.
    memo.autoscaling = Autoscaling(
        kube,
        caches.modelservers,
        by_kind["Pod"],
        by_kind,
        queue,
        gateways,
        operator_settings.gateway_addresses,
    )
    # MODELSERVE_INFERENCE_POOLS: each namespace's InferencePool, its picker's endpoints mirrored beside it.
    namespaces = tuple(memo.get("namespaces", ()))
    memo.pools = (
        Pools(kube, operator_settings, caches.modelservers, queue, namespaces, API_RETRY_BACKOFFS)
        if operator_settings.inference_pools
        else None
    )
    memo.reconciler = Reconciler(kube, operator_settings, caches, memo.autoscaling, memo.pools)
    memo.queue = queue
    memo.caches = caches
    memo.resync = Resync(caches, queue, operator_settings.resync_seconds)
    metrics.QUEUE_DEPTH.set_function(lambda: len(queue))
    if operator_settings.metrics_port:
        metrics.serve(operator_settings.metrics_port)
    memo.gateways = gateways
    memo.elector = elector(kube, operator_settings)
    memo.stopping, memo.started = threading.Event(), threading.Event()
    memo.keeper = None
    threading.Thread(target=_lead_then_run, args=(memo,), name="modelserve-leading", daemon=True).start()


def elector(kube: Kube, settings: Settings) -> Elector | None:
    """This replica's campaign for the Lease, when the operator runs with leader election."""
    if not settings.leader_election_lease:
        return None
    namespace, _, name = settings.leader_election_lease.partition("/")
    # The pid names the process beside others on one host; the suffix makes a restarted container a new candidate.
    identity = f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    return Elector(kube, namespace, name, identity, Timing.for_lease(settings.lease_seconds))


def _lead_then_run(memo: kopf.Memo) -> None:
    """Campaign (with leader election), then start the caches; reconcile, resync and autoscale only
    once every cache has listed: a child not yet listed would look missing. A standby holds no cache."""
    if memo.elector is not None:
        if not memo.elector.campaign(memo.stopping):
            return
        memo.keeper = threading.Thread(
            target=memo.elector.keep, args=(memo.stopping, _step_down), name="modelserve-lease", daemon=True
        )
        memo.keeper.start()
    for cache in [*_caches(memo), *([memo.gateways] if memo.gateways else [])]:
        cache.start()
    for cache in _caches(memo):
        while not cache.wait_listed(LISTED_LOG_SECONDS):
            log.warning("still waiting for the first list of %s", cache.watched.kind)
    if memo.stopping.is_set():
        return
    memo.queue.start(memo.reconciler.reconcile)
    memo.resync.start()
    memo.autoscaling.start()
    memo.started.set()


def _caches(memo: kopf.Memo) -> list[WatchCache]:
    """Every cache listed before the first reconcile: the children's, and the pools' when kept."""
    return [*memo.caches.all(), *(memo.pools.caches() if memo.pools is not None else [])]


def _step_down() -> None:
    # As controller-runtime does: a replica that lost the Lease may have reconciles in flight that
    # another leader now races; it ends at once, and restarts (the kubelet) as a standby.
    os._exit(1)


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    if memo.started.is_set():
        memo.autoscaling.stop()
        memo.resync.stop()
        memo.queue.stop()
    for cache in [*memo.caches.all(), *([memo.gateways] if memo.gateways else [])]:
        cache.stop()
    if memo.pools is not None:
        memo.pools.stop()
    # Last: the Lease is released (a standby takes over at its next try) once nothing writes any more.
    memo.stopping.set()
    if memo.keeper is not None:
        memo.keeper.join(timeout=10)


def gateway_pods(kube: Kube, namespace: str) -> WatchCache | None:
    """The gateway's pods (by their label, in its namespace), whose held requests are demand."""
    if not namespace:
        return None
    watched = Watched("v1", "Pod", GATEWAY_LABEL)
    return WatchCache(kube, watched, (namespace,), lambda body: None, API_RETRY_BACKOFFS)
