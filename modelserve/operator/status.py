"""ModelServer status as a pure function of what the cluster shows: (spec, workload, pods) -> status.

The workload is a Deployment, or a LeaderWorkerSet where a replica spans nodes: then a replica is a
group of pods, and it is ready when every pod of its group is (the leader's sidecar answers only once
the engine, which needs every rank, does)."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from modelserve.api.replicas import desired_replicas
from modelserve.api.spec import ModelServer, RolloutStrategy
from modelserve.api.status import (
    Condition,
    GuardStatus,
    KeySecretStatus,
    LastStart,
    ModelServerStatus,
    Scaling,
    Transition,
    Upgrade,
    Versions,
    newer_than_running,
)
from modelserve.contracts.gateway import TRAFFIC_GUARD_CONDITION
from modelserve.contracts.names import LWS_GROUP_INDEX_LABEL, LWS_WORKER_INDEX_LABEL, SELECTOR_LABEL
from modelserve.contracts.nodecache import FETCH_CONTAINER, FetchResult
from modelserve.kube.pods import pod_ready

from .traffic_guard import guard_condition_parts

PREFETCHED_CONDITION = "Prefetched"  # with spec.cache.prefetch: every selected node holds the model
# With MODELSERVE_INFERENCE_POOLS: the pods serve in the namespace's InferencePool (operator/pools.py).
INFERENCE_POOL_CONDITION = "InferencePool"
# Its False reasons that are no fault (the pods serve HTTPS: not in a pool), so no Warning.
POOL_EXPECTED_REASONS = frozenset({"ServesHTTPS"})

IMAGE_PULL_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
CONFIG_REASONS = {"CreateContainerConfigError", "CreateContainerError"}


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def last_words(message: str, limit: int = 300) -> str:
    """The last line a container wrote before it died (its termination message, which falls back
    to its log's tail): where an engine says why it refused to start."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


# What a node lacks, in the scheduler's words ("Insufficient <resource>"), by the reason naming it.
SHORT_OF = {"nvidia.com/gpu": "InsufficientGPU", "cpu": "InsufficientCPU", "memory": "InsufficientMemory"}
NO_MATCHING_NODE = "NoMatchingNode"
UNTOLERATED_TAINT = "UntoleratedTaint"
UNSCHEDULABLE = "Unschedulable"
UNSCHEDULABLE_REASONS = (*SHORT_OF.values(), NO_MATCHING_NODE, UNTOLERATED_TAINT, UNSCHEDULABLE)
# The scheduler's causes that exclude a node by its labels or name (NodeAffinity, NodeName plugins;
# "node selector" in releases before 1.19).
_NOT_MATCHING = re.compile(r"didn't match (Pod's node affinity|node selector|the requested node name)")


def scheduler_causes(message: str) -> dict[str, int]:
    """The causes a scheduler's Unschedulable message lists, each with how many nodes it kept out:
    "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) had untolerated taint {k: v}. preemption:
    ..." -> {"Insufficient cpu": 1, "node(s) had untolerated taint {k: v}": 3}. What follows the list
    (preemption's own verdict) and a cause without a count (a PreFilter's, such as unbound claims)
    are left out."""
    _, found, listed = message.partition(" nodes are available: ")
    if not found:
        return {}
    causes: dict[str, int] = {}
    for part in re.split(r", (?=\d+ )", listed.split(". ", 1)[0].rstrip(".")):
        count, _, cause = part.partition(" ")
        if count.isdigit() and cause:
            causes[cause] = causes.get(cause, 0) + int(count)
    return causes


def unschedulable_reason(message: str) -> str:
    """The reason for a pod the scheduler could not place, from its message: what the nodes lack
    (GPUs, cpu or memory: the one most nodes lack, on a tie in that order), else nodes excluded by
    the pod's nodeSelector or affinity, else by taints it does not tolerate, else Unschedulable.
    Shortages first: a taint or a selector usually keeps a pod off nodes by design (the control
    plane, GPU nodes for a CPU pod), while a node that lacks room is one the pod could have used."""
    causes = scheduler_causes(message)
    short: dict[str, int] = {}
    for cause, nodes in causes.items():
        if cause.startswith("Insufficient "):
            resource = cause.removeprefix("Insufficient ")
            short[resource] = short.get(resource, 0) + nodes
    if short:
        order = [*SHORT_OF, *sorted(short)]  # on a tie GPUs, cpu, memory, then any other resource
        most = min(short, key=lambda resource: (-short[resource], order.index(resource)))
        return SHORT_OF.get(most, UNSCHEDULABLE)  # another resource (ephemeral-storage...): the scheduler's words
    if any(_NOT_MATCHING.search(cause) for cause in causes):
        return NO_MATCHING_NODE
    if any("taint" in cause for cause in causes):
        return UNTOLERATED_TAINT
    return UNSCHEDULABLE


def unschedulable_problem(name: str, message: str, gpus: int) -> Problem:
    """A pod the scheduler could not place: the reason for what is short, with the scheduler's words."""
    reason = unschedulable_reason(message)
    what = {
        "InsufficientGPU": f"no node has {gpus} free nvidia.com/gpu for pod {name}",
        "InsufficientCPU": f"no node has the cpu pod {name} requests free",
        "InsufficientMemory": f"no node has the memory pod {name} requests free",
        NO_MATCHING_NODE: f"no node matches the nodeSelector or affinity of pod {name}",
        UNTOLERATED_TAINT: f"nodes have taints pod {name} does not tolerate",
    }.get(reason, f"pod {name}")
    return Problem(reason, f"{what}: {message}")


def container_statuses(status: dict[str, Any]) -> list[dict[str, Any]]:
    """A pod status's init containers' statuses, then its containers'."""
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _waiting_on(pods: list[dict[str, Any]], reasons: Collection[str]) -> bool:
    """Whether a container of these pods waits for one of `reasons` (the kubelet's words)."""
    return any(
        ((container.get("state") or {}).get("waiting") or {}).get("reason") in reasons
        for pod in pods
        for container in container_statuses(pod.get("status") or {})
    )


def pulls_failing(pods: list[dict[str, Any]]) -> bool:
    """Whether a container of these pods waits on an image it cannot pull (then the pull Secrets are
    worth checking: a missing one is the usual cause on a private registry)."""
    return _waiting_on(pods, IMAGE_PULL_REASONS)


def mounts_waiting(pods: list[dict[str, Any]]) -> bool:
    """Whether a pod on a node (only the kubelet writes container statuses) still waits for its
    containers to be created (then a volume's missing Secret is worth checking: the kubelet cannot
    mount it, and says so only in an Event)."""
    return _waiting_on(pods, ("ContainerCreating",))


def pod_problem(pod: dict[str, Any], gpus: int, missing_pull_secrets: tuple[str, ...] = ()) -> Problem | None:
    """Why one pod cannot serve, if the pod says so; `missing_pull_secrets`: the pull Secrets its
    namespace lacks, named where an image cannot be pulled."""
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        scheduled = (condition.get("type"), condition.get("status"), condition.get("reason"))
        if scheduled == ("PodScheduled", "False", "Unschedulable"):
            return unschedulable_problem(name, condition.get("message", ""), gpus)
    for container in status.get("initContainerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        if container.get("name") == FETCH_CONTAINER and waiting.get("reason") == "CrashLoopBackOff":
            # The fetch failed more than once: the hub refused the model, or it is not there.
            result = FetchResult.parse(last.get("message"))
            said = result.error if result and result.error else last_words(last.get("message", ""))
            return Problem(
                "FetchFailed",
                f"pod {name} could not fetch its model (tried {container.get('restartCount', 0) + 1} times): {said}",
            )
    for container in container_statuses(status):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        detail = waiting.get("message") or reason
        if reason in IMAGE_PULL_REASONS:
            lacking = ""
            if missing_pull_secrets:
                namespace = pod["metadata"].get("namespace", "")
                lacking = f"; imagePullSecrets not found in namespace {namespace}: {', '.join(missing_pull_secrets)}"
            return Problem("ImagePullError", f"pod {name} container {container['name']}: {detail}{lacking}")
        if reason == "CrashLoopBackOff":
            last = (container.get("lastState") or {}).get("terminated") or {}
            exit_detail = f"{last.get('reason', 'exited')} with code {last.get('exitCode', '?')}"
            said = last_words(last.get("message", ""))
            return Problem(
                "CrashLoop",
                f"pod {name} container {container['name']} restarted {container.get('restartCount', 0)} times, "
                f"last {exit_detail}" + (f": {said}" if said else ""),
            )
        if reason in CONFIG_REASONS:
            return Problem("ContainerConfigError", f"pod {name} container {container['name']}: {detail}")
    return None


def group_of(pod: dict[str, Any]) -> str:
    """The replica a pod belongs to: its LeaderWorkerSet group, or the pod itself in a Deployment."""
    labels = pod["metadata"].get("labels") or {}
    return labels.get(LWS_GROUP_INDEX_LABEL) or pod["metadata"]["name"]


def ready_replicas(pods: list[dict[str, Any]], group_size: int) -> int:
    """Replicas whose every pod is ready: pods of a Deployment (group_size 1), whole groups of a
    LeaderWorkerSet (a group with a pod missing or not ready serves nothing)."""
    if group_size == 1:
        return sum(1 for pod in pods if pod_ready(pod))
    ready: dict[str, int] = {}
    for pod in pods:
        if pod_ready(pod):
            ready[group_of(pod)] = ready.get(group_of(pod), 0) + 1
    return sum(1 for count in ready.values() if count >= group_size)


def replicas_present(pods: list[dict[str, Any]]) -> int:
    """Replicas that have at least one live pod (groups, for a LeaderWorkerSet)."""
    return len({group_of(pod) for pod in pods if not pod["metadata"].get("deletionTimestamp")})


def serving_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that serve HTTP: all of a Deployment's, a LeaderWorkerSet's leaders."""
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(LWS_WORKER_INDEX_LABEL, "0") == "0"]


def first_problem(
    ms: ModelServer,
    workload: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    missing_pull_secrets: tuple[str, ...] = (),
    missing_tls_secret: bool = False,
) -> Problem | None:
    for condition in ((workload or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            return Problem("ReplicaFailure", condition.get("message", ""))
    live = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
    for pod in sorted(live, key=lambda p: p["metadata"]["name"]):
        problem = pod_problem(pod, ms.spec.gpus_per_node, missing_pull_secrets)
        if problem:
            return problem
    if missing_tls_secret and ms.spec.tls is not None:
        return Problem(
            "TLSSecretMissing",
            f"spec.tls.secretName {ms.spec.tls.secret_name} not found in namespace {ms.namespace}: "
            "the pods wait to mount it (create the kubernetes.io/tls Secret, or its cert-manager Certificate)",
        )
    return None


def _waiting(workload: dict[str, Any] | None, pods: list[dict[str, Any]], group_size: int = 1) -> Problem:
    """What a replica that is not ready yet is waiting for."""
    if workload is None or not pods:
        return Problem("Creating", f"creating the {(workload or {}).get('kind', 'Deployment')}'s pods")
    if any((pod.get("spec") or {}).get("nodeName") for pod in pods):
        return group_waiting(pods, group_size) or Problem("ModelLoading", "waiting for the engine to load the model")
    return Problem("Scheduling", "waiting for the scheduler to place the pods")


WAITING_FOR_GROUP = "WaitingForGroup"


def _index(pod: dict[str, Any], label: str) -> tuple[int, str]:
    """A pod's LeaderWorkerSet index label, for sorting numerically ("10" after "9")."""
    value = (pod["metadata"].get("labels") or {}).get(label, "")
    return (int(value) if value.isdigit() else -1, value)


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" or pod_ready(pod)


def _pod_state(pod: dict[str, Any]) -> str:
    """Where a pod that does not run yet is, in the kubelet's words: not scheduled yet, or on its node
    a container's waiting reason (ContainerCreating while the image is pulled), else its phase."""
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return "not scheduled yet"
    for container in container_statuses(status):
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return f"{reason} on {node}"
    return f"{status.get('phase') or 'Pending'} on {node}"


def group_waiting(pods: list[dict[str, Any]], group_size: int) -> Problem | None:
    """A LeaderWorkerSet group whose pods do not all run yet (the first by index): its engine starts
    only once every pod runs and has found the leader (vLLM's Ray cluster, SGLang's rendezvous), each
    pod waiting for the others meanwhile, so say how many run and which pods are missing, and where
    they are. None for a Deployment's pods (group_size 1) or when every group's pods run."""
    if group_size == 1:
        return None
    groups: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp"):
            groups.setdefault(group_of(pod), []).append(pod)
    for group in sorted(groups, key=lambda group: _index(groups[group][0], LWS_GROUP_INDEX_LABEL)):
        members = sorted(groups[group], key=lambda pod: _index(pod, LWS_WORKER_INDEX_LABEL))
        running = sum(1 for pod in members if _running(pod))
        if running >= group_size:
            continue
        missing = [f"{pod['metadata']['name']} ({_pod_state(pod)})" for pod in members if not _running(pod)]
        if len(members) < group_size:
            missing.append(f"{group_size - len(members)} not created yet")
        return Problem(
            WAITING_FOR_GROUP,
            f"group {group}: {running} of {group_size} pods running, waiting for {', '.join(missing)}; the engine "
            "starts once every pod of the group runs and has joined the leader",
        )
    return None


WAITING_FOR_GPUS = "WaitingForGPUs"


def _waiting_for_gpus(ms: ModelServer, problem: Problem) -> Problem:
    """A rollout whose new pod finds no free GPUs: say so plainly, and what would unblock it."""
    advice = (
        "rolloutStrategy Surge starts each new pod before an old one goes, so it needs the GPUs of one more "
        "replica: free some, or set spec.rolloutStrategy to Replace (an old pod goes first and gives its GPUs)"
        if ms.spec.rollout_strategy == RolloutStrategy.SURGE
        else "rolloutStrategy Replace frees an old pod's GPUs first; other pods took them meanwhile"
    )
    return Problem(WAITING_FOR_GPUS, f"the rollout is waiting for GPUs: {advice}. {problem.message}")


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Condition:
    """A condition as of now; `_timed` keeps the previous transition time where the status held."""
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        last_transition_time="",
        observed_generation=generation,
    )


@dataclass(frozen=True)
class Observed:
    """What the cluster showed of one ModelServer this reconcile: its generation and last status,
    its workload (the Deployment, or the LeaderWorkerSet whose replicas are groups) and pods, and
    what the API server answered when its children were applied."""

    generation: int
    workload: dict[str, Any] | None
    pods: list[dict[str, Any]]
    previous: dict[str, Any] | None = None  # keeps lastTransitionTime of unchanged conditions
    apply_error: str | None = None
    missing_pull_secrets: tuple[str, ...] = ()  # looked up only while an image cannot be pulled
    missing_tls_secret: bool = False  # spec.tls's Secret, looked up only while a pod waits for its volumes


@dataclass(frozen=True)
class Reported:
    """What the operator states beside what it observed: the time, the addresses, the autoscaler's
    count and last decision, the key's Secret and the images."""

    now: str
    endpoint: str
    desired: int | None = None  # the autoscaler's replica count (None: min + buffer)
    scaling: Scaling | None = None  # its last decision
    gateway_endpoint: str | None = None
    key_secret: KeySecretStatus | None = None
    versions: Versions | None = None
    upgrade: Upgrade | None = None
    guard: GuardStatus | None = None  # spec.traffic.guard's verdict (traffic_guard.py)
    last_start: LastStart | None = None  # the latest replica start, phase by phase (starts.py)
    prefetch: Any = None  # prefetch.Plan: spec.cache.prefetch's nodes and condition (prefetch.py)
    pool: Any = None  # pools.PoolReport: the namespace's InferencePool, with MODELSERVE_INFERENCE_POOLS


@dataclass(frozen=True)
class _Progress:
    """What every condition and the phase are read from."""

    desired: int
    ready: int
    rolled_out: bool
    problem: Problem | None  # what is wrong: Degraded
    waiting: Problem  # what a replica not ready yet waits for


def compute_status(ms: ModelServer, seen: Observed, reported: Reported) -> dict[str, Any]:
    """The status to write, in wire form."""
    desired = desired_replicas(ms.spec.replicas) if reported.desired is None else reported.desired
    progress = _progress(ms, seen, desired)
    generation = seen.generation
    conditions = [
        _ready_condition(progress, seen.apply_error, reported.scaling, generation),
        _progressing_condition(progress, generation),
        _degraded_condition(progress, generation),
    ]
    if reported.guard is not None:
        conditions.append(_condition(TRAFFIC_GUARD_CONDITION, *guard_condition_parts(reported.guard), generation))
    if reported.prefetch is not None:
        conditions.append(_condition(PREFETCHED_CONDITION, *reported.prefetch.condition, generation))
    if reported.pool is not None:
        conditions.append(_condition(INFERENCE_POOL_CONDITION, *reported.pool.condition, generation))
    status = ModelServerStatus(
        observed_generation=generation,
        phase=_phase(progress, seen.workload),
        replicas=_workload_status(seen.workload).get("replicas", 0),
        ready_replicas=progress.ready,
        endpoint=reported.endpoint,
        gateway_endpoint=reported.gateway_endpoint,
        conditions=_timed(conditions, seen.previous, reported.now),
        key_secret=reported.key_secret,
        desired_replicas=desired,
        scaling=reported.scaling,
        selector=scale_selector(ms),
        versions=reported.versions,
        upgrade=reported.upgrade,
        guard=reported.guard,
        last_start=reported.last_start,
        cache=reported.prefetch.status if reported.prefetch is not None else None,
        inference_pool=reported.pool.status if reported.pool is not None else None,
    )
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _workload_status(workload: dict[str, Any] | None) -> dict[str, Any]:
    return (workload or {}).get("status") or {}


def _rolled_out(workload: dict[str, Any] | None, desired: int) -> bool:
    """The workload controller has seen the latest spec and every replica it keeps is updated and ready."""
    if workload is None:
        return False
    status = _workload_status(workload)
    observed = status.get("observedGeneration", 0) >= workload["metadata"].get("generation", 0)
    return observed and status.get("updatedReplicas", 0) == desired == status.get("replicas", 0) == status.get(
        "readyReplicas", 0
    )


def _progress(ms: ModelServer, seen: Observed, desired: int) -> _Progress:
    # Ready counted from the pods, not the Deployment's readyReplicas: the pods' own Ready reaches the
    # operator first (the Deployment's status waits its turn in the controller-manager, ~100 s
    # behind at 1,000 ModelServers). The same pods the Deployment counts: any revision, not terminating.
    # A LeaderWorkerSet's replicas are groups: ready when all the group's pods are.
    ready = ready_replicas(seen.pods, ms.spec.node_count)
    rolled_out = _rolled_out(seen.workload, desired)
    if seen.apply_error:
        problem: Problem | None = Problem("ApplyFailed", seen.apply_error)
    else:
        problem = first_problem(ms, seen.workload, seen.pods, seen.missing_pull_secrets, seen.missing_tls_secret)
    waiting = _waiting(seen.workload, seen.pods, ms.spec.node_count)
    if problem and problem.reason == "InsufficientGPU" and ready >= desired > 0 and not rolled_out:
        # Every replica still serves: only the rollout's new pod waits (Surge needs spare GPUs).
        waiting, problem = _waiting_for_gpus(ms, problem), None
    return _Progress(desired, ready, rolled_out, problem, waiting)


def _ready_condition(p: _Progress, apply_error: str | None, scaling: Scaling | None, generation: int) -> Condition:
    if apply_error:
        # Ready means a client reaches the model through status.endpoint: not while a child the
        # endpoint needs (the Service, the key Secret, the Deployment as specified) was refused.
        return _condition("Ready", False, "ApplyFailed", apply_error, generation)
    if p.desired == 0:
        why = scaling.message if scaling else "replicas.min + replicas.buffer is 0"
        return _condition("Ready", False, "ScaledToZero", why, generation)
    if p.ready >= p.desired:
        return _condition("Ready", True, "Ready", f"{p.ready}/{p.desired} replicas ready", generation)
    cause = p.problem or p.waiting
    return _condition("Ready", False, cause.reason, cause.message, generation)


def _progressing_condition(p: _Progress, generation: int) -> Condition:
    if p.rolled_out:
        return _condition("Progressing", False, "Complete", f"{p.desired} replicas up to date", generation)
    if p.ready >= p.desired > 0 and p.waiting.reason != WAITING_FOR_GPUS:
        # Every replica serves while the new revision replaces them (unless its new pod waits for GPUs: say so).
        return _condition("Progressing", True, "RollingUpdate", "replacing replicas", generation)
    return _condition("Progressing", True, p.waiting.reason, p.waiting.message, generation)


def _degraded_condition(p: _Progress, generation: int) -> Condition:
    if p.problem:
        return _condition("Degraded", True, p.problem.reason, p.problem.message, generation)
    return _condition("Degraded", False, "AsExpected", "", generation)


def _phase(p: _Progress, workload: dict[str, Any] | None) -> str:
    if p.problem:
        return "Degraded"
    if p.desired == 0:
        return "Idle"
    if workload is None:
        return "Pending"
    if p.ready >= p.desired:
        return "Ready" if p.rolled_out else "Updating"
    return "Loading"


def scale_selector(ms: ModelServer) -> str:
    """The /scale subresource's selector: one pod per replica (a group's leader), as an HPA counts."""
    if ms.spec.multi_node:
        return f"{SELECTOR_LABEL}={ms.name},{LWS_WORKER_INDEX_LABEL}=0"
    return f"{SELECTOR_LABEL}={ms.name}"


def missing_kind_status(
    generation: int, previous: dict[str, Any] | None, now: str, endpoint: str, message: str
) -> dict[str, Any]:
    """The status of a ModelServer whose workload's kind the API server does not serve (a replica
    spanning nodes without the LeaderWorkerSet CRD): nothing runs until it is installed."""
    previous = previous or {}
    reason = "LeaderWorkerSetMissing"
    conditions = [
        _condition(type_, ok, reason, message, generation)
        for type_, ok in (("Ready", False), ("Progressing", False), ("Degraded", True))
    ]
    status = ModelServerStatus(
        observed_generation=generation,
        phase="Degraded",
        replicas=0,
        ready_replicas=0,
        endpoint=endpoint,
        gateway_endpoint=previous.get("gatewayEndpoint"),
        conditions=_timed(conditions, previous, now),
        key_secret=None,
    )
    out = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    if previous.get("keySecret"):
        out["keySecret"] = previous["keySecret"]
    return out


def invalid_spec_status(generation: int, previous: dict[str, Any] | None, now: str, message: str) -> dict[str, Any]:
    """The status of a stored ModelServer the operator cannot read (e.g. written before a stricter
    CRD): nothing is applied, and the conditions say why instead of only the operator's log."""
    previous = previous or {}
    conditions = [
        _condition(type_, ok, "InvalidSpec", message, generation)
        for type_, ok in (("Ready", False), ("Progressing", False), ("Degraded", True))
    ]
    status = ModelServerStatus(
        observed_generation=generation,
        phase="Degraded",
        replicas=previous.get("replicas", 0),
        ready_replicas=previous.get("readyReplicas", 0),
        endpoint=previous.get("endpoint"),
        gateway_endpoint=previous.get("gatewayEndpoint"),
        conditions=_timed(conditions, previous, now),
    )
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _timed(conditions: list[Condition], previous: dict[str, Any] | None, now: str) -> list[Condition]:
    """Conditions with lastTransitionTime kept from `previous` where their status did not change."""
    before = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    timed = []
    for condition in conditions:
        old = before.get(condition.type, {})
        since = old["lastTransitionTime"] if old.get("status") == condition.status else now
        timed.append(condition.model_copy(update={"last_transition_time": since}))
    return timed


def key_secret_status(
    name: str | None, generated_now: bool, previous: dict[str, Any] | None, now: str
) -> KeySecretStatus | None:
    """The generated key's Secret as status shows it: kept from `previous` unless the key was just
    generated, which after the first time means the Secret had been deleted."""
    if name is None:
        return None
    before = (previous or {}).get("keySecret") or {}
    if not generated_now:
        return KeySecretStatus.model_validate({**before, "name": name}) if before.get("name") == name else None
    if before.get("name") == name:
        message = f"Secret {name} was missing; a new API key was generated in it at {now}: the old key is refused"
    else:
        message = f"API key generated in Secret {name}"
    return KeySecretStatus(name=name, generated_at=now, message=message)


def transitions(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[Transition]:
    """Conditions whose status or reason changed, as Events (Warning when something went wrong)."""
    before = {c["type"]: c for c in (previous or {}).get("conditions") or []}
    out = []
    for condition in current.get("conditions", []):
        old = before.get(condition["type"], {})
        if (old.get("status"), old.get("reason")) == (condition["status"], condition["reason"]):
            continue
        warning = (condition["type"], condition["status"]) in (("Degraded", "True"), (TRAFFIC_GUARD_CONDITION, "False"))
        # A prefetch that cannot happen (no node matches, a Job failed) is worth a Warning; one under way not.
        warning |= (condition["type"], condition["status"]) == (PREFETCHED_CONDITION, "False") and condition[
            "reason"
        ] != "Fetching"
        warning |= (condition["type"], condition["status"]) == (INFERENCE_POOL_CONDITION, "False") and condition[
            "reason"
        ] not in POOL_EXPECTED_REASONS
        message = f"{condition['type']} is {condition['status']}"
        if condition["message"]:
            message += f": {condition['message']}"
        out.append(Transition("Warning" if warning else "Normal", condition["reason"], message))
    key, key_before = current.get("keySecret") or {}, (previous or {}).get("keySecret") or {}
    # The key's status changes only when a key is generated: a new one under the same name means the
    # Secret was deleted (compared whole, since generatedAt has one-second resolution).
    if key_before.get("name") == key.get("name") and key != key_before:
        # Clients holding the old key now get 401: say so where users look, not only in the log.
        out.append(Transition("Warning", "APIKeyRegenerated", key["message"]))
    upgrade = current.get("upgrade") or {}
    if upgrade.get("available") == "Yes" and upgrade != (previous or {}).get("upgrade"):
        # An operator upgrade kept this ModelServer's images: say so where `kubectl describe` looks.
        out.append(
            Transition("Normal", "UpgradeAvailable", f"{newer_than_running(upgrade)}: {upgrade.get('message', '')}")
        )
    scaling = current.get("scaling")
    if scaling and scaling != (previous or {}).get("scaling"):
        out.append(Transition("Normal", scaling["reason"], scaling["message"]))
    return out + _adapter_transitions(previous, current)


def _adapter_transitions(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[Transition]:
    """An adapter that turned Loaded or Failed (Warning, with the engine's message)."""
    before = {(a["name"], a["source"]): a["phase"] for a in (previous or {}).get("adapters") or []}
    out = []
    for adapter in current.get("adapters") or []:
        phase = adapter["phase"]
        if phase == "Pending" or before.get((adapter["name"], adapter["source"])) == phase:
            continue
        text = f"adapter {adapter['name']} ({adapter['source']}): {adapter.get('message', '')}"
        out.append(Transition("Warning" if phase == "Failed" else "Normal", f"Adapter{phase}", text))
    return out
