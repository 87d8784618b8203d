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
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from modelserve.api import manifests, versions
from modelserve.api.spec import AuthMode, ModelServer
from modelserve.api.status import GuardStatus, LastStart, Transition, utc_now
from modelserve.api.validation import explain
from modelserve.api.versions import upgrade
from modelserve.contracts import sidecar
from modelserve.contracts.api_keys import new_api_key
from modelserve.contracts.names import API_VERSION, KIND, LWS_API_VERSION, LWS_KIND, SELECTOR_LABEL, Key
from modelserve.contracts.nodecache import Source
from modelserve.contracts.operator_settings import Settings
from modelserve.kube.apply import Kube, error_message, fingerprint, is_gone, known_to_match
from modelserve.kube.pods import pod_ready, readable
from modelserve.kube.watch_cache import MODELSERVERS, WatchCache, Watched
from modelserve.kube.workqueue import WorkQueue

from . import metrics, prefetch
from .adapters import adapter_statuses, pods_to_nudge, read_pod_adapters
from .autoscaling import Autoscaling
from .key_share import pods_to_tell, sharing_replicas
from .pools import Pools
from .starts import new_starts
from .status import (
    Observed,
    Reported,
    compute_status,
    invalid_spec_status,
    key_secret_status,
    missing_kind_status,
    mounts_waiting,
    pulls_failing,
    serving_pods,
    transitions,
)
from .traffic_guard import guard_status, reset_value

log = logging.getLogger(__name__)

CHILDREN = tuple(
    Watched(api_version, kind, SELECTOR_LABEL)
    for api_version, kind in (
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("v1", "PersistentVolumeClaim"),
        ("v1", "ConfigMap"),
        ("v1", "Pod"),
        ("batch/v1", "Job"),  # spec.cache.prefetch's, one per node
    )
)
# Nodes, watched only once a ModelServer asks to prefetch: their labels say which hold which model.
NODES = Watched("v1", "Node", metadata_only=True)
# Watched so a deleted key Secret is re-created at once; metadata only, so no key is ever read.
SECRETS = Watched("v1", "Secret", SELECTOR_LABEL, metadata_only=True)
# Watched only where the API server serves it: LeaderWorkerSet is installed apart from the operator.
LEADER_WORKER_SETS = Watched(LWS_API_VERSION, LWS_KIND, SELECTOR_LABEL)
# How often a ModelServer that needs LeaderWorkerSet asks the API server again whether it is served.
LWS_PROBE_SECONDS = 10.0
LWS_LIST_SECONDS = 30.0
LWS_MISSING = (
    "spec.nodes above 1 runs each replica as a LeaderWorkerSet group, and the API server serves no "
    f"{LWS_API_VERSION} {LWS_KIND}: install the LeaderWorkerSet release (kubernetes-sigs/lws v0.9.0 or later)"
)


@dataclass(frozen=True)
class Caches:
    modelservers: WatchCache
    by_kind: dict[str, WatchCache]  # children and Secrets
    make: Any = None  # Watched -> a new WatchCache like the others (for a kind served later)
    make_nodes: Any = None  # () -> a WatchCache of every Node, queueing the ModelServers that prefetch

    def all(self) -> list[WatchCache]:
        return [self.modelservers, *self.by_kind.values()]


def watch_caches(
    kube: Kube, namespaces: tuple[str, ...], queue: WorkQueue, backoffs: tuple[float, ...], lws: bool = False
) -> Caches:
    """A cache per kind the operator reads, each change queueing the ModelServer it concerns;
    `lws`: LeaderWorkerSets too (served by the API server now)."""
    scopes: tuple[str | None, ...] = namespaces or (None,)

    def queue_owner(watched: Watched) -> Any:
        def changed(body: dict[str, Any]) -> None:
            owner = (body["metadata"].get("labels") or {}).get(SELECTOR_LABEL)
            if owner:
                queue.add((body["metadata"]["namespace"], owner))

        return changed

    def queue_itself(body: dict[str, Any]) -> None:
        queue.add((body["metadata"]["namespace"], body["metadata"]["name"]))

    modelservers = WatchCache(kube, MODELSERVERS, scopes, queue_itself, backoffs)

    def queue_prefetching(_: dict[str, Any]) -> None:
        for body in modelservers.items():
            if ((body.get("spec") or {}).get("cache") or {}).get("prefetch"):
                queue_itself(body)

    return Caches(
        modelservers=modelservers,
        by_kind={
            watched.kind: WatchCache(kube, watched, scopes, queue_owner(watched), backoffs)
            for watched in (*CHILDREN, SECRETS, *([LEADER_WORKER_SETS] if lws else []))
        },
        make=lambda watched: WatchCache(kube, watched, scopes, queue_owner(watched), backoffs),
        make_nodes=lambda: WatchCache(kube, NODES, (None,), queue_prefetching, backoffs),
    )


class Reconciler:
    def __init__(
        self, kube: Kube, settings: Settings, caches: Caches, autoscaling: Autoscaling, pools: Pools | None = None
    ):
        self.kube = kube
        self.pools = pools  # with MODELSERVE_INFERENCE_POOLS
        self.settings = settings
        self.caches = caches
        self.autoscaling = autoscaling
        # Per ModelServer, per child: the desired manifest's fingerprint and the child's
        # resourceVersion last found (or made) to match it. Only this process's knowledge: after a
        # restart every child is checked with the API server once.
        self._matched: dict[Key, dict[str, tuple[str, str]]] = {}
        self._matched_guard = threading.Lock()
        self._lws_guard = threading.Lock()
        self._lws_probed_at = float("-inf")
        # Per ModelServer, the pods whose start this process has reported (pruned to the live pods).
        self._started: dict[Key, set[str]] = {}
        self._nodes: WatchCache | None = None

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
                self._started.pop((namespace, name), None)
            self.autoscaling.forget((namespace, name))
            if self.pools is not None:
                self.pools.sync(namespace)  # the namespace's pool, owned by those left (if any)
            return  # the garbage collector removes the children through their owner references
        previous = body.get("status") or {}
        generation = body["metadata"]["generation"]
        now = utc_now()
        try:
            ms = ModelServer.from_manifest(body)
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            self._report(body, previous, invalid_spec_status(generation, previous, now, explain(error)), now)
            return
        endpoint = manifests.endpoint(ms, self.settings.cluster_domain)
        if ms.spec.multi_node and not self.lws_cache():
            # Nothing to run the groups with: say so where users look, and touch no child (a
            # Deployment of the same name would serve the model on one node, which it does not fit).
            self._report(body, previous, missing_kind_status(generation, previous, now, endpoint, LWS_MISSING), now)
            return
        replicas = self.autoscaling.replicas(ms)
        (_, kind), _ = manifests.workload_kinds(ms)
        # The workload as it runs: its images are kept through an operator upgrade (api/versions.py).
        live = self.caches.by_kind[kind].get(namespace, name)
        current, used, _ = manifests.image_versions(ms, self.settings, live)
        apply_error, key_generated = self._apply_children(ms, replicas, live)
        workload = self.caches.by_kind[kind].get(namespace, name)
        pods = self.caches.by_kind["Pod"].owned_by(namespace, name)
        digest = manifests.adapters_digest(ms)
        if digest is not None and apply_error is None:
            self._annotate(ms, pods_to_nudge(digest, serving_pods(pods)), manifests.ADAPTERS_HASH_ANNOTATION, digest)
        if ms.spec.auth.mode == AuthMode.PRIVATE:
            count = str(sharing_replicas(pods))
            self._annotate(ms, pods_to_tell(pods, count), manifests.REPLICAS_ANNOTATION, count)
            secret = self.caches.by_kind["Secret"].get(ms.namespace, manifests.keys_secret_name(ms) or "")
            if secret is not None:
                version = secret["metadata"]["resourceVersion"]
                told = pods_to_tell(pods, version, manifests.KEYS_VERSION_ANNOTATION)
                self._annotate(ms, told, manifests.KEYS_VERSION_ANNOTATION, version)
        last_start = self._report_starts(ms, body, pods, previous, now)
        prefetched = self._prefetch(ms)
        pool = self.pools.sync(namespace, ms) if self.pools is not None else None
        status = compute_status(
            ms,
            Observed(
                generation,
                workload,
                pods,
                previous,
                apply_error,
                self._missing_pull_secrets(ms, pods),
                self._missing_tls_secret(ms, pods),
            ),
            Reported(
                now,
                endpoint,
                desired=replicas,
                scaling=self.autoscaling.scaling(ms),
                gateway_endpoint=self.settings.gateway_url or None,
                key_secret=key_secret_status(manifests.generated_secret_name(ms), key_generated, previous, now),
                versions=used,
                upgrade=upgrade(current, used),
                guard=self._guard(ms, body, previous, now),
                last_start=last_start,
                prefetch=prefetched,
                pool=pool,
            ),
        )
        if ms.spec.adapters is not None:
            # Read on every reconcile (the resync comes every few seconds): the sidecars load
            # adapters on their own, so no watch event announces a change.
            ready = [pod for pod in serving_pods(pods) if pod_ready(pod) and readable(pod)]
            reports = [read_pod_adapters(sidecar.base_of(pod)) for pod in ready]
            adapters = adapter_statuses(ms, reports) or []
            status["adapters"] = [
                adapter.model_dump(mode="json", by_alias=True, exclude_none=True) for adapter in adapters
            ]
        self._report(body, previous, status, now)

    def _report_starts(
        self, ms: ModelServer, body: dict[str, Any], pods: list[dict[str, Any]], previous: dict[str, Any], now: str
    ) -> LastStart | None:
        """Each replica start not reported yet: its phases to the metrics and an Event (a Warning too when
        its fetch could not use the node's cache); the latest for the status (else the one it has)."""
        with self._matched_guard:
            seen = self._started.setdefault((ms.namespace, ms.name), set())
            seen &= {pod["metadata"].get("uid") for pod in pods}
        reported = previous.get("lastStart") or {}
        starts = new_starts(pods, seen, reported.get("readyAt"))
        engine = manifests.component(ms)
        for start in starts:
            seen.add(start.uid)
            metrics.observe_start(start, engine)
            log.info("%s/%s: %s", ms.namespace, ms.name, start.describe())
            events = [Transition("Normal", "Started", start.describe())]
            if start.fetch is not None and start.fetch.node_cache:
                why = f"pod {start.pod} read its model from the hub, not the node's cache: {start.fetch.node_cache}"
                events.append(Transition("Warning", "NodeCacheUnavailable", why))
            if start.fetch is not None and start.fetch.hub_unreachable:
                copy = "its own cache volume's copy" if start.fetch.source == Source.LOCAL else "the node's copy"
                why = f"pod {start.pod} started from {copy} of its model: the hub could not be reached"
                events.append(Transition("Warning", "HubUnreachable", why))
            for event in events:
                try:
                    self.kube.create(manifests.event(body, event, now, socket.gethostname()))
                except ApiException as error:
                    if is_gone(error):
                        raise
                    log.warning("%s/%s: event %s: %s", ms.namespace, ms.name, event.reason, error_message(error))
        if starts:
            return starts[-1].status()
        try:
            return LastStart.model_validate(reported) if reported else None
        except ValueError:
            return None

    def _missing_pull_secrets(self, ms: ModelServer, pods: list[dict[str, Any]]) -> tuple[str, ...]:
        """The pull Secrets the namespace lacks, asked only while a pod cannot pull an image."""
        names = manifests.pull_secrets(ms, self.settings)
        if not names or not pulls_failing(pods):
            return ()
        return self._missing_secrets(ms, names, "imagePullSecrets")

    def _missing_tls_secret(self, ms: ModelServer, pods: list[dict[str, Any]]) -> bool:
        """Whether spec.tls's Secret is missing, asked only while a pod waits for its volumes."""
        if ms.spec.tls is None or not mounts_waiting(pods):
            return False
        return bool(self._missing_secrets(ms, (ms.spec.tls.secret_name,), "spec.tls's Secret"))

    def _missing_secrets(self, ms: ModelServer, names: Iterable[str], what: str) -> tuple[str, ...]:
        """Which of `names` (Secrets its pods need: `what`) the namespace lacks, each looked up by name
        (metadata only); nothing when the API server cannot say."""
        try:
            return tuple(name for name in names if not self.kube.exists("v1", "Secret", ms.namespace, name))
        except ApiException as error:
            if is_gone(error):
                raise
            log.warning("%s/%s: looking up %s: %s", ms.namespace, ms.name, what, error_message(error))
            return ()

    def _prefetch(self, ms: ModelServer) -> prefetch.Plan | None:
        """spec.cache.prefetch: a fetch Job for each selected node that does not hold the model (applied
        here), and the nodes' state for the status. None without prefetch, or without the node cache."""
        if ms.spec.cache is None or ms.spec.cache.prefetch is None or not versions.node_cache(ms, self.settings):
            return None
        nodes = self.nodes_cache()
        if nodes is None:
            return None
        jobs = self.caches.by_kind["Job"].owned_by(ms.namespace, ms.name)
        planned = prefetch.plan(ms, self.settings, nodes.items(), jobs)
        with self._matched_guard:
            matched = self._matched.setdefault((ms.namespace, ms.name), {})
        for job in planned.jobs:
            child = f"Job {job['metadata']['name']}"
            live = self.caches.by_kind["Job"].get(ms.namespace, job["metadata"]["name"])
            desired = fingerprint(job)
            if live is not None and known_to_match(matched.get(child), desired, job, live):
                continue
            try:
                outcome, resource_version = self.kube.apply(job, live)
            except ApiException as error:
                if is_gone(error):
                    raise
                log.warning("%s/%s: %s: %s", ms.namespace, ms.name, child, error_message(error))
                continue
            matched[child] = (desired, resource_version)
            if outcome != "unchanged":
                log.info("%s/%s: %s %s", ms.namespace, ms.name, child, outcome)
        return planned

    def nodes_cache(self) -> WatchCache | None:
        """Every node's labels, watched from the first ModelServer that prefetches on."""
        with self._lws_guard:
            if self._nodes is None:
                cache = self.caches.make_nodes()
                cache.start()
                if not cache.wait_listed(LWS_LIST_SECONDS):
                    cache.stop()
                    return None
                self._nodes = cache
            return self._nodes

    def _guard(self, ms: ModelServer, body: dict[str, Any], previous: dict[str, Any], now: str) -> GuardStatus | None:
        """spec.traffic.guard's verdict: the gateways' trips, kept until the reset annotation changes."""
        if ms.spec.traffic is None or ms.spec.traffic.guard is None:
            return None
        return guard_status(reset_value(body), previous, self.autoscaling.guard_report(ms), now)

    def _annotate(self, ms: ModelServer, names: list[str], annotation: str, value: str) -> None:
        """Annotate pods: the adapters list they should mount (pods_to_nudge says why), the replicas
        sharing the key limits (key_share.py)."""
        patch = {"metadata": {"annotations": {annotation: value}}}
        for pod in names:
            try:
                self.kube.patch("v1", "Pod", ms.namespace, pod, patch)
            except ApiException as error:  # gone or going: a new pod is annotated in its turn
                log.debug("%s/%s: pod %s %s: %s", ms.namespace, ms.name, pod, annotation, error_message(error))

    def lws_cache(self) -> WatchCache | None:
        """The LeaderWorkerSet cache, started the first time the API server is found serving the
        kind (asked again at most every LWS_PROBE_SECONDS while it does not)."""
        with self._lws_guard:
            cache = self.caches.by_kind.get(LWS_KIND)
            if cache is not None:
                return cache
            if time.monotonic() - self._lws_probed_at < LWS_PROBE_SECONDS:
                return None
            self._lws_probed_at = time.monotonic()
            if not self.kube.serves(LWS_API_VERSION, LWS_KIND):
                return None
            cache = self.caches.make(LEADER_WORKER_SETS)
            cache.start()
            if not cache.wait_listed(LWS_LIST_SECONDS):  # a child not yet listed would look missing
                cache.stop()
                return None
            self.caches.by_kind[LWS_KIND] = cache
            log.info("the API server serves %s %s: watching them", LWS_API_VERSION, LWS_KIND)
            return cache

    def _report(self, body: dict, previous: dict, status: dict, now: str) -> None:
        """Write the status when it changed, and an Event for each condition that moved."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if status == previous:
            return
        written = self.kube.patch_status(API_VERSION, KIND, namespace, name, merge_patch(previous, status))
        # The next reconcile may come before the watch brings this back: it must not write it again.
        self.caches.modelservers.put(written)
        for transition in transitions(previous, status):
            log.info("%s/%s: %s %s", namespace, name, transition.reason, transition.message)
            self.kube.create(manifests.event(body, transition, now, socket.gethostname()))

    def _apply_children(self, ms: ModelServer, replicas: int, live: dict[str, Any] | None) -> tuple[str | None, bool]:
        """Apply every child that does not match: (the API server's refusal, if any, for the
        Degraded message; whether a key Secret was created, i.e. a new key generated)."""
        child, key_generated = "", False
        with self._matched_guard:
            matched = self._matched.setdefault((ms.namespace, ms.name), {})
        try:
            for manifest in manifests.server_side_applied(ms, self.settings, replicas, live):
                child = f"{manifest['kind']} {manifest['metadata']['name']}"
                live = self.caches.by_kind[manifest["kind"]].get(ms.namespace, manifest["metadata"]["name"])
                desired = fingerprint(manifest)
                if live is not None and known_to_match(matched.get(child), desired, manifest, live):
                    continue
                outcome, resource_version = self.kube.apply(manifest, live)
                matched[child] = (desired, resource_version)
                if outcome != "unchanged":
                    log.info("%s/%s: %s %s", ms.namespace, ms.name, child, outcome)
            child = self._delete_other_workload(ms, matched)
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

    def _delete_other_workload(self, ms: ModelServer, matched: dict[str, tuple[str, str]]) -> str:
        """A ModelServer that moved between one node and several has its old workload (Deployment or
        LeaderWorkerSet) deleted once the new one is applied: no orphan keeps GPUs. Returns the child
        it deleted, for a refusal's message."""
        (_, new_kind), (api_version, kind) = manifests.workload_kinds(ms)
        cache = self.caches.by_kind.get(kind)
        old = cache.get(ms.namespace, ms.name) if cache else None
        child = f"{kind} {ms.name}"
        if old is None or old["metadata"].get("deletionTimestamp"):
            return child
        owners = old["metadata"].get("ownerReferences") or []
        if not any(owner.get("uid") == ms.uid for owner in owners):
            return child  # not ours: never delete what another owner made
        if self.kube.delete(api_version, kind, ms.namespace, ms.name):
            log.info("%s/%s: %s deleted (the replicas now run as a %s)", ms.namespace, ms.name, child, new_kind)
        matched.pop(child, None)
        return child


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


def merge_patch(previous: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch from `previous` to `wanted`: a merge patch keeps what it does not name, so
    what `wanted` no longer has is nulled, in nested objects too (status.cache.message once every node
    holds the model); lists are replaced whole."""
    patch: dict[str, Any] = {key: None for key in previous if key not in wanted}
    for key, value in wanted.items():
        before = previous.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    return patch
