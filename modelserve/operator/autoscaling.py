"""The autoscaler at work: every couple of seconds each autoscaled ModelServer's pods report their
load (the sidecar's /load), the pure decision (autoscaler.py) picks the replicas, and a change
queues a reconcile, which applies it and reports it (status.scaling, an Event).

Decisions live in this process: after a restart the Deployment's own replica count is where it
starts from, and nothing is scaled down before a whole scale-down delay has been watched.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException

from modelserve.api import manifests
from modelserve.api.replicas import autoscaled, desired_replicas
from modelserve.api.spec import ModelServer, ModelServerSpec
from modelserve.api.status import Scaling, utc_now
from modelserve.contracts import gateway
from modelserve.contracts.names import Key
from modelserve.contracts.pod_urls import url_of
from modelserve.contracts.sidecar import LOAD_ROUTE, PodLoad, base_of
from modelserve.kube.apply import Kube, error_message
from modelserve.kube.pods import pod_ready, readable
from modelserve.kube.watch_cache import WatchCache
from modelserve.kube.workqueue import WorkQueue

from . import metrics
from .autoscaler import Decision, History, Load, Policy, decide
from .status import ready_replicas, replicas_present, serving_pods
from .traffic_guard import merge_reports

log = logging.getLogger(__name__)

PERIOD_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 1.0
READERS = 8
# Kubernetes' ReplicaSet controller removes the pods with the lowest cost first.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def policy(spec: ModelServerSpec) -> Policy:
    """The autoscaler's policy from the spec (its target with the engine's default applied)."""
    replicas = spec.replicas
    return Policy(
        min=replicas.min,
        buffer=replicas.buffer,
        max=replicas.max,
        target=spec.target_per_replica,
        scale_down_delay=replicas.scale_down_delay_seconds,
        idle_window=replicas.idle_window_seconds,
    )


def _unverified() -> ssl.SSLContext:
    """TLS to a gateway's or a sidecar's pod by its address, which its certificate does not name (it
    names the Service): the certificate is not checked. What is read there (counts of held requests,
    tripped guards, a pod's load and adapters) was read in plain HTTP before they served TLS, and
    nothing secret is sent: no key, no request content."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


_POD_TLS = _unverified()


def read_json(url: str) -> Any:
    """A pod's JSON answer, or None when it cannot be read now."""
    context = _POD_TLS if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_SECONDS, context=context) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


def read_pod_load(base: str) -> PodLoad | None:
    """One sidecar's load (at `base`: contracts.sidecar.base_of), or None when it cannot be read now."""
    body = read_json(url_of(base, LOAD_ROUTE))
    try:
        return None if body is None else PodLoad.from_json(body)
    except (KeyError, TypeError, ValueError):
        return None


def read_held(address: str) -> dict[Key, int]:
    """What one gateway (host:port or https://host:port) holds, per ModelServer (nothing when it
    cannot be read)."""
    body = read_json(url_of(address, gateway.HELD_ROUTE))
    try:
        return {} if body is None else gateway.held_from_json(body)
    except (KeyError, TypeError, ValueError):
        return {}


def read_guards(address: str) -> dict[Key, tuple[str, gateway.GuardReport]]:
    """The traffic guards one gateway (host:port or https://host:port) tripped (nothing when it
    cannot be read)."""
    body = read_json(url_of(address, gateway.GUARDS_ROUTE))
    try:
        return {} if body is None else gateway.guards_from_json(body)
    except (KeyError, TypeError, ValueError):
        return {}


def gateway_addresses(gateway_pods: list[dict[str, Any]], others: tuple[str, ...] = ()) -> list[str]:
    """host:port of every gateway to read (https://host:port for one serving HTTPS): the ready
    gateway pods, and those given by address."""
    pods = [pod for pod in gateway_pods if pod_ready(pod) and readable(pod, gateway.GATEWAY_CONTAINER)]
    return [gateway.base_of(pod) for pod in pods] + list(others)


def total_held(addresses: list[str], read: Callable[[str], dict[Key, int]]) -> dict[Key, int]:
    """Requests held across the gateways, per ModelServer."""
    totals: dict[Key, int] = {}
    for address in addresses:
        for key, count in read(address).items():
            totals[key] = totals.get(key, 0) + count
    return totals


class Autoscaling:
    def __init__(
        self,
        kube: Kube,
        modelservers: WatchCache,
        pods: WatchCache,
        workloads: dict[str, WatchCache],
        queue: WorkQueue,
        gateways: WatchCache | None = None,
        other_gateways: tuple[str, ...] = (),
    ):
        self.kube = kube
        self.gateways = gateways  # the gateway's pods, whose held requests are demand
        self.other_gateways = other_gateways  # host:port of gateways that are not pods
        self.modelservers = modelservers
        self.pods = pods
        # Deployments and, once served, LeaderWorkerSets, by kind (the reconciler's caches).
        self.workloads = workloads
        self.queue = queue
        self._decided: dict[Key, int] = {}
        self._scaling: dict[Key, Scaling] = {}
        self._histories: dict[Key, History] = {}
        self._last_arrival: dict[Key, float] = {}
        self._guards: dict[Key, tuple[str, gateway.GuardReport]] = {}  # the gateways' traffic guard trips
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="pod-load")
        self._thread = threading.Thread(target=self._run, name="modelserve-autoscaler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._readers.shutdown(wait=False, cancel_futures=True)

    def replicas(self, ms: ModelServer) -> int:
        """What the workload runs now (pods, or groups where a replica spans nodes): the last
        decision, or (new, or after a restart) what it already runs, within the bounds."""
        bounds = ms.spec.replicas
        if not autoscaled(bounds):
            return desired_replicas(bounds)
        with self._lock:
            decided = self._decided.get((ms.namespace, ms.name))
        if decided is None:
            (_, kind), _ = manifests.workload_kinds(ms)
            cache = self.workloads.get(kind)
            workload = cache.get(ms.namespace, ms.name) if cache else None
            running = ((workload or {}).get("spec") or {}).get("replicas")
            decided = desired_replicas(bounds) if running is None else running
        return max(bounds.min, min(bounds.max, decided))

    def scaling(self, ms: ModelServer) -> Scaling | None:
        with self._lock:
            return self._scaling.get((ms.namespace, ms.name))

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_SECONDS):
            pods = self.gateways.items() if self.gateways is not None else []
            addresses = gateway_addresses(pods, self.other_gateways)
            held = total_held(addresses, read_held)
            self._take_guards(merge_reports([read_guards(address) for address in addresses]))
            for body in self.modelservers.items():
                try:
                    self._step(body, held)
                except Exception:  # one ModelServer's trouble must not stop the others'
                    log.exception("%s/%s: autoscaling failed", body["metadata"]["namespace"], body["metadata"]["name"])

    def guard_report(self, ms: ModelServer) -> tuple[str, gateway.GuardReport] | None:
        """A gateway's trip of this ModelServer's traffic guard: (the reset value it stands under, why)."""
        with self._lock:
            return self._guards.get((ms.namespace, ms.name))

    def _take_guards(self, reports: dict[Key, tuple[str, gateway.GuardReport]]) -> None:
        """The gateways' trips now; a ModelServer whose trip is new is reconciled (its status says so)."""
        with self._lock:
            changed = [key for key in reports if self._guards.get(key) != reports[key]]
            self._guards = reports
        for key in changed:
            self.queue.add(key)

    def _step(self, body: dict[str, Any], held: dict[Key, int]) -> None:
        bounds = (body.get("spec") or {}).get("replicas") or {}
        if (
            bounds.get("max", 1) <= bounds.get("min", 1)
            or "count" in bounds
            or body["metadata"].get("deletionTimestamp")
        ):
            return  # cheap test first: parsing every ModelServer every 2 s is not
        ms = ModelServer.from_manifest(body)
        key = (ms.namespace, ms.name)
        pods = [
            pod for pod in self.pods.owned_by(ms.namespace, ms.name) if not pod["metadata"].get("deletionTimestamp")
        ]
        # The load is read from the sidecars: on every pod of a Deployment, a group's leader.
        ready = [pod for pod in serving_pods(pods) if pod_ready(pod) and readable(pod)]
        loads = dict(
            zip(
                (pod["metadata"]["name"] for pod in ready),
                self._readers.map(read_pod_load, (base_of(pod) for pod in ready)),
                strict=True,
            )
        )
        known = {name: load for name, load in loads.items() if load is not None}
        if pods and not known and any(pod_ready(pod) for pod in pods):
            return  # replicas answer, but none can be read: hold rather than guess
        now = time.monotonic()
        arrivals = [
            now - load.seconds_since_arrival for load in known.values() if load.seconds_since_arrival is not None
        ]
        with self._lock:
            last = max([*arrivals, self._last_arrival.get(key, float("-inf"))])
            if arrivals:
                self._last_arrival[key] = last
            history = self._histories.get(key) or History(since=now)
        current = self.replicas(ms)
        load = Load(
            at=now,
            in_flight=sum(load.in_flight for load in known.values()),
            held=held.get(key, 0),
            last_request_at=None if last == float("-inf") else last,
            # Replicas (groups) with a pod that is not ready yet.
            loading=replicas_present(pods) - ready_replicas(pods, ms.spec.node_count),
        )
        decision, history = decide(policy(ms.spec), history, load, current)
        with self._lock:
            self._histories[key] = history
        metrics.DEMAND.labels(*key).set(load.in_flight)
        metrics.HELD.labels(*key).set(load.held)
        metrics.DESIRED_REPLICAS.labels(*key).set(decision.replicas)
        if decision.replicas == current:
            return
        # A ReplicaSet removes the pods of least cost first; a LeaderWorkerSet always the groups of
        # highest index, so costs would mean nothing there.
        if decision.replicas < current and not ms.spec.multi_node:
            self._mark_deletion_costs(ms, known)
        self._follow(ms, decision)

    def _follow(self, ms: ModelServer, decision: Decision) -> None:
        key = (ms.namespace, ms.name)
        log.info("%s/%s: %s %s", ms.namespace, ms.name, decision.reason, decision.message)
        metrics.SCALE_DECISIONS.labels(decision.reason).inc()
        with self._lock:
            self._decided[key] = decision.replicas
            self._scaling[key] = Scaling(reason=decision.reason, message=decision.message, time=utc_now())
        self.queue.add(key)

    def _mark_deletion_costs(self, ms: ModelServer, loads: dict[str, PodLoad]) -> None:
        """The pods serving least go first: each one's cost is its requests in flight."""
        for name, load in loads.items():
            pod = self.pods.get(ms.namespace, name) or {}
            cost = str(load.in_flight)
            if ((pod.get("metadata") or {}).get("annotations") or {}).get(DELETION_COST) == cost:
                continue
            try:
                self.kube.patch("v1", "Pod", ms.namespace, name, {"metadata": {"annotations": {DELETION_COST: cost}}})
            except ApiException as error:  # the pod may be gone already: its cost no longer matters
                log.debug("%s/%s: pod %s deletion cost: %s", ms.namespace, ms.name, name, error_message(error))

    def forget(self, key: Key) -> None:
        with self._lock:
            for memory in (self._decided, self._scaling, self._histories, self._last_arrival):
                memory.pop(key, None)
        metrics.forget(*key)
