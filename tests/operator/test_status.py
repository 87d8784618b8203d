"""Status is a pure function of (spec, Deployment, pods): every phase and reason from plain dicts."""

from __future__ import annotations

from typing import Any

import pytest

from harness.testdata import model_server
from modelserve.api.spec import ModelServer
from modelserve.api.status import Upgrade
from modelserve.api.validation import explain
from modelserve.operator.status import (
    Observed,
    Reported,
    compute_status,
    group_waiting,
    invalid_spec_status,
    key_secret_status,
    missing_kind_status,
    mounts_waiting,
    pulls_failing,
    scheduler_causes,
    transitions,
    unschedulable_reason,
)

ENDPOINT = "http://m.ns.svc.cluster.local/v1"
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
SCHEDULER_MESSAGE = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
    "3 No preemption victims found for incoming pod."
)


def _deployment(
    replicas: int = 1, ready: int = 0, updated: int | None = None, generation: int = 1, observed: int = 1
) -> dict[str, Any]:
    status = {
        "observedGeneration": observed,
        "replicas": replicas,
        "updatedReplicas": replicas if updated is None else updated,
    }
    if ready:
        status["readyReplicas"] = ready
    return {"metadata": {"name": "m", "generation": generation}, "status": status}


READY = [{"type": "Ready", "status": "True"}]


def _pod(name: str = "m-1", node: str | None = None, **status: Any) -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def _status(
    ms: ModelServer,
    deployment: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    previous: dict[str, Any] | None = None,
    now: str = T0,
    **kw: Any,
) -> dict[str, Any]:
    if deployment and not pods:  # the ready pods the Deployment counts
        count = deployment["status"].get("readyReplicas", 0)
        pods = [_pod(f"m-{i}", "n", conditions=READY) for i in range(count)]
    apply_error = kw.pop("apply_error", None)
    return compute_status(ms, Observed(3, deployment, pods, previous, apply_error), Reported(now, ENDPOINT, **kw))


def _unschedulable(message: str = SCHEDULER_MESSAGE) -> list[dict[str, str]]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]


def _waiting(reason: str, message: str = "", **container: Any) -> list[dict[str, Any]]:
    return [{"name": "engine", "state": {"waiting": {"reason": reason, "message": message}}, **container}]


def _degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_before_the_deployment_exists_it_is_pending() -> None:
    status = _status(model_server(), None, [])
    assert status["phase"] == "Pending" and status["observedGeneration"] == 3
    assert status["endpoint"] == ENDPOINT and (status["replicas"], status["readyReplicas"]) == (0, 0)
    assert _conditions(status) == {
        "Ready": ("False", "Creating"),
        "Progressing": ("True", "Creating"),
        "Degraded": ("False", "AsExpected"),
    }


def test_a_scheduled_pod_that_is_not_ready_is_loading_the_model() -> None:
    status = _status(model_server(), _deployment(), [_pod(node="gpu-0", phase="Running")])
    assert status["phase"] == "Loading"
    assert _conditions(status)["Ready"] == ("False", "ModelLoading")


def test_all_replicas_ready_and_rolled_out_is_ready() -> None:
    status = _status(model_server(), _deployment(ready=1), [_pod(node="gpu-0", conditions=READY)])
    assert status["phase"] == "Ready" and status["readyReplicas"] == 1
    assert _conditions(status) == {
        "Ready": ("True", "Ready"),
        "Progressing": ("False", "Complete"),
        "Degraded": ("False", "AsExpected"),
    }


def test_serving_while_a_new_revision_rolls_out_is_updating() -> None:
    status = _status(model_server(), _deployment(replicas=2, ready=1, updated=1, generation=2, observed=2), [])
    assert status["phase"] == "Updating"
    assert _conditions(status)["Progressing"] == ("True", "RollingUpdate")
    assert _conditions(status)["Ready"] == ("True", "Ready")


def test_a_deployment_spec_not_yet_observed_is_not_rolled_out() -> None:
    status = _status(model_server(), _deployment(ready=1, generation=2, observed=1), [])
    assert status["phase"] == "Updating"


def test_unschedulable_for_gpus_is_insufficient_gpu_with_the_schedulers_words() -> None:
    status = _status(model_server(gpus=16), _deployment(), [_pod(phase="Pending", conditions=_unschedulable())])
    assert status["phase"] == "Degraded"
    degraded = _degraded(status)
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientGPU")
    assert SCHEDULER_MESSAGE in degraded["message"] and "16" in degraded["message"]
    assert _conditions(status)["Ready"] == ("False", "InsufficientGPU")


NOT_HELPFUL = "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
CPU_SHORT = (
    "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) had untolerated taint {nvidia.com/gpu: present}. "
    "preemption: 0/4 nodes are available: 1 No preemption victims found for incoming pod, 3 Preemption is not "
    "helpful for scheduling."
)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (SCHEDULER_MESSAGE, "InsufficientGPU"),
        # The issue's: a cpu pod, the one node it tolerates full, the GPU nodes tainted.
        (CPU_SHORT, "InsufficientCPU"),
        (
            "0/4 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 2 node(s) had untolerated taint "
            "{node.kubernetes.io/not-ready: }. preemption: 0/4 nodes are available: 2 No preemption victims found "
            "for incoming pod, 2 Preemption is not helpful for scheduling.",
            "InsufficientCPU",  # a tie: cpu before memory
        ),
        (
            "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
            "2 Insufficient memory. preemption: 0/3 nodes are available: 1 Preemption is not helpful for "
            "scheduling, 2 No preemption victims found for incoming pod.",
            "InsufficientMemory",
        ),
        (
            "0/4 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint "
            "{node-role.kubernetes.io/control-plane: }, 3 Insufficient nvidia.com/gpu. " + NOT_HELPFUL,
            "InsufficientGPU",  # most nodes lack GPUs
        ),
        (
            "0/4 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
            "3 node(s) didn't match Pod's node affinity/selector. " + NOT_HELPFUL,
            "NoMatchingNode",
        ),
        ("0/1 nodes are available: 1 node(s) didn't match the requested node name. " + NOT_HELPFUL, "NoMatchingNode"),
        (
            "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: inference}. " + NOT_HELPFUL,
            "UntoleratedTaint",
        ),
        # Before Kubernetes 1.25.
        (
            "0/3 nodes are available: 3 node(s) had taint {node-role.kubernetes.io/master: }, that the pod didn't "
            "tolerate.",
            "UntoleratedTaint",
        ),
        ("0/3 nodes are available: 3 node(s) were unschedulable. " + NOT_HELPFUL, "Unschedulable"),
        ("0/3 nodes are available: 3 Too many pods. " + NOT_HELPFUL, "Unschedulable"),
        ("0/2 nodes are available: 2 Insufficient ephemeral-storage. " + NOT_HELPFUL, "Unschedulable"),
        (
            "0/4 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/4 nodes are "
            "available: 4 Preemption is not helpful for scheduling.",
            "Unschedulable",
        ),
        ("", "Unschedulable"),
    ],
)
def test_an_unschedulable_reason_names_what_is_short(message: str, reason: str) -> None:
    assert unschedulable_reason(message) == reason


def test_the_schedulers_causes_are_counted_without_preemptions_verdict() -> None:
    assert scheduler_causes(CPU_SHORT) == {
        "Insufficient cpu": 1,
        "node(s) had untolerated taint {nvidia.com/gpu: present}": 3,
    }


def test_a_cpu_pod_short_of_cpu_is_insufficient_cpu_not_gpu() -> None:
    status = _status(
        model_server(profile="cpu"), _deployment(), [_pod(phase="Pending", conditions=_unschedulable(CPU_SHORT))]
    )
    assert status["phase"] == "Degraded"
    assert _conditions(status)["Ready"] == ("False", "InsufficientCPU")
    degraded = _degraded(status)
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientCPU")
    assert degraded["message"] == f"no node has the cpu pod m-1 requests free: {CPU_SHORT}"


def test_unschedulable_for_other_reasons_is_named_so() -> None:
    selector = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. " + NOT_HELPFUL
    degraded = _degraded(_status(model_server(), _deployment(), [_pod(conditions=_unschedulable(selector))]))
    assert degraded["reason"] == "NoMatchingNode" and degraded["message"].endswith(selector)
    cordoned = "0/3 nodes are available: 3 node(s) were unschedulable. " + NOT_HELPFUL
    degraded = _degraded(_status(model_server(), _deployment(), [_pod(conditions=_unschedulable(cordoned))]))
    assert (degraded["reason"], degraded["message"]) == ("Unschedulable", f"pod m-1: {cordoned}")


def test_image_pull_and_crash_loop_come_from_container_statuses() -> None:
    pull = _pod(node="gpu-0", containerStatuses=_waiting("ImagePullBackOff", "Back-off pulling image"))
    last = {"terminated": {"reason": "Error", "exitCode": 1}}
    crash = _pod(node="gpu-0", containerStatuses=_waiting("CrashLoopBackOff", restartCount=4, lastState=last))
    assert _conditions(_status(model_server(), _deployment(), [pull]))["Degraded"] == ("True", "ImagePullError")
    degraded = _degraded(_status(model_server(), _deployment(), [crash]))
    assert degraded["reason"] == "CrashLoop" and "restarted 4 times, last Error with code 1" in degraded["message"]


def test_a_crash_loop_carries_the_engines_last_words() -> None:
    said = "usage: vllm serve [model_tag] [options]\nvllm: error: unrecognized arguments: --no-such-flag\n\n"
    last = {"terminated": {"reason": "Error", "exitCode": 2, "message": said}}
    crash = _pod(node="gpu-0", containerStatuses=_waiting("CrashLoopBackOff", restartCount=1, lastState=last))
    degraded = _degraded(_status(model_server(), _deployment(), [crash]))
    assert degraded["message"].endswith("last Error with code 2: vllm: error: unrecognized arguments: --no-such-flag")


def test_a_missing_secret_is_a_container_config_error() -> None:
    pod = _pod(node="gpu-0", containerStatuses=_waiting("CreateContainerConfigError", 'secret "hf" not found'))
    degraded = _degraded(_status(model_server(), _deployment(), [pod]))
    assert degraded["reason"] == "ContainerConfigError" and 'secret "hf" not found' in degraded["message"]


def test_terminating_pods_are_not_blamed() -> None:
    pod = _pod(conditions=_unschedulable())
    pod["metadata"]["deletionTimestamp"] = T0
    assert _conditions(_status(model_server(), _deployment(), [pod]))["Degraded"] == ("False", "AsExpected")


def test_refused_apply_is_degraded_with_the_api_servers_message() -> None:
    status = _status(model_server(), None, [], apply_error="Deployment.apps is invalid: spec.template...")
    assert status["phase"] == "Degraded" and _conditions(status)["Degraded"] == ("True", "ApplyFailed")


def test_ready_pods_behind_a_refused_service_are_not_ready() -> None:
    # The pods answer, but no Service gives status.endpoint an address: a client cannot reach them.
    refused = "Service m was refused: failed to allocate a serviceIP: range is full"
    status = _status(model_server(), _deployment(replicas=1, ready=1), [_pod(conditions=READY)], apply_error=refused)
    assert _conditions(status)["Ready"] == ("False", "ApplyFailed")
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["message"] == refused
    assert status["phase"] == "Degraded" and status["readyReplicas"] == 1


def test_zero_replicas_is_idle() -> None:
    status = _status(model_server(replicas={"min": 0, "buffer": 0, "max": 2}), _deployment(replicas=0), [])
    assert status["phase"] == "Idle" and _conditions(status)["Ready"] == ("False", "ScaledToZero")


def test_transition_times_change_only_with_the_status() -> None:
    ms = model_server()
    first = _status(ms, _deployment(), [_pod(node="gpu-0")], now=T0)
    same = _status(ms, _deployment(), [_pod(node="gpu-0")], previous=first, now=T1)
    assert same == first  # nothing changed: the operator writes nothing
    ready = _status(ms, _deployment(ready=1), [_pod(node="gpu-0", conditions=READY)], previous=first, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times == {"Ready": T1, "Progressing": T1, "Degraded": T0}


def test_transitions_become_events_warning_only_for_degraded() -> None:
    ms = model_server(gpus=16)
    loading = _status(ms, _deployment(), [_pod(node="gpu-0")])
    degraded = _status(ms, _deployment(), [_pod(conditions=_unschedulable())], previous=loading, now=T1)
    events = transitions(loading, degraded)
    assert [(e.type, e.reason) for e in events] == [
        ("Normal", "InsufficientGPU"),
        ("Normal", "Scheduling"),
        ("Warning", "InsufficientGPU"),
    ]
    assert transitions(degraded, degraded) == []
    assert len(transitions(None, loading)) == 3


def test_a_stored_spec_the_model_refuses_is_reported_in_conditions_without_its_values() -> None:
    secret_value = "sk-live-do-not-leak"
    try:
        model_server(profile="no-such-profile", env=[{"name": "TOKEN", "value": secret_value}])
    except ValueError as error:
        message = explain(error)
    else:
        raise AssertionError("the model accepted an unknown profile")
    assert message.startswith("spec.profile: ")
    previous = compute_status(
        model_server(), Observed(1, _deployment(1, 1, 1), [_pod(conditions=READY)]), Reported(T0, ENDPOINT)
    )
    status = invalid_spec_status(2, previous, T1, message)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Degraded" and status["observedGeneration"] == 2
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "InvalidSpec")
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "InvalidSpec")
    assert conditions["Degraded"]["message"] == message
    assert status["endpoint"] == ENDPOINT and status["readyReplicas"] == 1
    assert secret_value not in str(status)
    assert [t.reason for t in transitions(previous, status)] == ["InvalidSpec"] * 3


def test_a_regenerated_key_is_shown_and_warned_about() -> None:
    first = key_secret_status("m-api-keys", True, {}, T0)
    assert first and (first.name, first.generated_at) == ("m-api-keys", T0)
    before = _status(model_server(), _deployment(ready=1), [], key_secret=first)
    assert before["keySecret"]["message"] == "API key generated in Secret m-api-keys"
    assert not [
        t for t in transitions({}, before) if t.reason == "APIKeyRegenerated"
    ]  # the first key is news to nobody

    kept = key_secret_status("m-api-keys", False, before, T1)
    assert (
        _status(model_server(), _deployment(ready=1), [], previous=before, key_secret=kept)["keySecret"]
        == before["keySecret"]
    )

    again = key_secret_status("m-api-keys", True, before, T1)  # created again: it had been deleted
    after = _status(model_server(), _deployment(ready=1), [], previous=before, key_secret=again)
    assert after["keySecret"]["generatedAt"] == T1 and "was missing" in after["keySecret"]["message"]
    (warning,) = [t for t in transitions(before, after) if t.reason == "APIKeyRegenerated"]
    assert warning.type == "Warning" and "m-api-keys" in warning.message and "old key is refused" in warning.message


def test_a_key_regenerated_within_the_same_second_is_warned_about() -> None:
    before = _status(model_server(), _deployment(ready=1), [], key_secret=key_secret_status("m-api-keys", True, {}, T0))
    again = key_secret_status("m-api-keys", True, before, T0)  # deleted and created again at once
    after = _status(model_server(), _deployment(ready=1), [], previous=before, key_secret=again)
    assert after["keySecret"]["generatedAt"] == before["keySecret"]["generatedAt"]
    assert [t.reason for t in transitions(before, after) if t.reason == "APIKeyRegenerated"] == ["APIKeyRegenerated"]


def test_no_key_secret_without_a_generated_key() -> None:
    assert key_secret_status(None, False, {"keySecret": {"name": "m-api-keys"}}, T0) is None


def test_ready_counts_the_pods_not_the_deployments_lagging_status() -> None:
    # The pod is Ready; the Deployment's status has not caught up: Ready already.
    status = _status(model_server(), _deployment(ready=0), [_pod(node="gpu-0", conditions=READY)])
    assert _conditions(status)["Ready"] == ("True", "Ready") and status["readyReplicas"] == 1
    # A terminating pod no longer counts, whatever the Deployment still says.
    leaving = _pod(node="gpu-0", conditions=READY)
    leaving["metadata"]["deletionTimestamp"] = T0
    status = _status(model_server(), _deployment(ready=1), [leaving])
    assert _conditions(status)["Ready"][0] == "False" and status["readyReplicas"] == 0


def _group_pod(group: int, worker: int, ready: bool = True, **status: Any) -> dict[str, Any]:
    labels = {
        "leaderworkerset.sigs.k8s.io/group-index": str(group),
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
    }
    name = f"m-{group}" if worker == 0 else f"m-{group}-{worker}"
    conditions = READY if ready else [{"type": "Ready", "status": "False"}]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "n"},
        "status": {"conditions": conditions, **status},
    }


def test_a_group_is_one_replica_ready_only_when_every_pod_of_it_is() -> None:
    ms = model_server(gpus=16, nodes=2, replicas={"min": 2, "max": 2})
    lws = {**_deployment(2, 1), "kind": "LeaderWorkerSet"}
    pods = [_group_pod(0, 0), _group_pod(0, 1), _group_pod(1, 0), _group_pod(1, 1, ready=False)]
    status = _status(ms, lws, pods)
    assert (status["replicas"], status["readyReplicas"], status["phase"]) == (2, 1, "Loading")
    assert status["selector"] == "serving.modelserve.dev/modelserver=m,leaderworkerset.sigs.k8s.io/worker-index=0"
    pods[-1] = _group_pod(1, 1)
    lws = {**_deployment(2, 2), "kind": "LeaderWorkerSet"}
    assert _status(ms, lws, pods)["phase"] == "Ready"


def test_a_group_that_cannot_be_placed_says_how_many_gpus_each_pod_needs() -> None:
    ms = model_server(gpus=32, nodes=2)
    pods = [_group_pod(0, 0, ready=False, conditions=_unschedulable())]
    pods += [_group_pod(0, 1, ready=False, conditions=_unschedulable())]
    status = _status(ms, {**_deployment(1), "kind": "LeaderWorkerSet"}, pods)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InsufficientGPU" and "no node has 16 free nvidia.com/gpu" in degraded["message"]


PULLING = _waiting("ContainerCreating")


def test_a_group_whose_worker_is_still_pulling_its_image_is_waiting_for_the_group() -> None:
    ms = model_server(gpus=16, nodes=2)
    lws = {**_deployment(1), "kind": "LeaderWorkerSet"}
    leader = _group_pod(0, 0, ready=False, phase="Running")
    worker = _group_pod(0, 1, ready=False, phase="Pending", containerStatuses=PULLING)
    status = _status(ms, lws, [leader, worker])
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Loading"
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "WaitingForGroup")
    assert (conditions["Progressing"]["status"], conditions["Progressing"]["reason"]) == ("True", "WaitingForGroup")
    assert conditions["Degraded"]["status"] == "False"
    assert conditions["Ready"]["message"] == (
        "group 0: 1 of 2 pods running, waiting for m-0-1 (ContainerCreating on n); the engine starts once every "
        "pod of the group runs and has joined the leader"
    )
    # Once every pod runs, the engine loads the model across them.
    running = [leader, _group_pod(0, 1, phase="Running")]
    assert _conditions(_status(ms, lws, running))["Ready"] == ("False", "ModelLoading")


def test_the_waiting_group_says_which_pods_are_missing_and_where_they_are() -> None:
    leader = _group_pod(0, 0, ready=False, phase="Running")
    unscheduled = _group_pod(0, 2, ready=False, phase="Pending")
    del unscheduled["spec"]["nodeName"]
    pods = [_group_pod(0, 3, ready=False, phase="Pending", containerStatuses=PULLING), unscheduled, leader]
    problem = group_waiting(pods, 4)
    assert problem is not None and problem.reason == "WaitingForGroup"
    # By worker index; a pod the LeaderWorkerSet has not made yet counts as missing too.
    assert problem.message.startswith(
        "group 0: 1 of 4 pods running, waiting for m-0-2 (not scheduled yet), m-0-3 (ContainerCreating on n), "
        "1 not created yet;"
    )


def test_the_first_group_by_index_that_waits_is_named_and_deployments_never_wait_for_a_group() -> None:
    pods = [_group_pod(0, 0), _group_pod(0, 1)]  # ready
    pods += [_group_pod(10, 0, ready=False, phase="Pending", containerStatuses=PULLING)]
    pods += [_group_pod(9, 0, ready=False, phase="Running"), _group_pod(9, 1, ready=False, phase="Running")]
    pods += [_group_pod(2, 0, ready=False, phase="Running")]
    problem = group_waiting(pods, 2)
    assert problem is not None and problem.message.startswith("group 2: 1 of 2 pods running, waiting for 1 not")
    leaving = _group_pod(2, 1, phase="Running")
    leaving["metadata"]["deletionTimestamp"] = T0  # a terminating pod runs for nobody
    assert group_waiting([*pods, leaving], 2) == problem
    assert group_waiting([_pod("m-1", "n", phase="Pending")], 1) is None
    # Every group's pods run: none waits (the engines load).
    assert group_waiting([_group_pod(0, 0, ready=False, phase="Running"), _group_pod(0, 1, phase="Running")], 2) is None


def test_waiting_for_the_group_is_one_event_however_its_counts_move() -> None:
    ms = model_server(gpus=24, nodes=3)
    lws = {**_deployment(1), "kind": "LeaderWorkerSet"}
    leader = _group_pod(0, 0, ready=False, phase="Running")
    pulling = [_group_pod(0, worker, ready=False, phase="Pending", containerStatuses=PULLING) for worker in (1, 2)]
    first = _status(ms, lws, [leader, *pulling])
    second = _status(ms, lws, [leader, _group_pod(0, 1, phase="Running"), pulling[1]], previous=first, now=T1)
    assert [t.reason for t in transitions(None, first)] == ["WaitingForGroup", "WaitingForGroup", "AsExpected"]
    assert "1 of 3 pods running" in transitions(None, first)[0].message
    assert transitions(first, second) == []  # 2 of 3 now: the message moves, no new Event
    assert "2 of 3 pods running" in _conditions_messages(second)["Ready"]
    loading = _status(ms, lws, [leader, *(_group_pod(0, w, phase="Running") for w in (1, 2))], previous=second)
    assert [(t.type, t.reason) for t in transitions(second, loading)] == [
        ("Normal", "ModelLoading"),
        ("Normal", "ModelLoading"),
    ]


def _conditions_messages(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["message"] for c in status["conditions"]}


def test_without_the_leader_worker_set_crd_the_model_is_degraded_and_says_what_to_install() -> None:
    status = missing_kind_status(3, None, T0, ENDPOINT, "install the LeaderWorkerSet release")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "Ready": ("False", "LeaderWorkerSetMissing"),
        "Progressing": ("False", "LeaderWorkerSetMissing"),
        "Degraded": ("True", "LeaderWorkerSetMissing"),
    }
    assert status["phase"] == "Degraded" and status["endpoint"] == ENDPOINT
    (warning,) = [t for t in transitions(None, status) if t.type == "Warning"]
    assert warning.reason == "LeaderWorkerSetMissing" and "install the LeaderWorkerSet release" in warning.message


def test_a_surge_pod_without_gpus_while_every_replica_serves_says_the_rollout_waits_for_gpus() -> None:
    # One replica ready on the old template; the rollout's new pod finds no free GPU.
    deployment = _deployment(replicas=2, ready=1, updated=1)
    pods = [_pod("m-old", "n", conditions=READY), _pod("m-new", phase="Pending", conditions=_unschedulable())]
    status = _status(model_server(), deployment, pods, desired=1)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Updating"
    assert (conditions["Progressing"]["status"], conditions["Progressing"]["reason"]) == ("True", "WaitingForGPUs")
    assert "waiting for GPUs" in conditions["Progressing"]["message"]
    assert "rolloutStrategy to Replace" in conditions["Progressing"]["message"]
    assert SCHEDULER_MESSAGE in conditions["Progressing"]["message"]
    assert conditions["Degraded"]["status"] == "False" and conditions["Ready"]["status"] == "True"
    replace = _status(model_server(rolloutStrategy="Replace"), deployment, pods, desired=1)
    waiting = next(c for c in replace["conditions"] if c["type"] == "Progressing")
    assert waiting["reason"] == "WaitingForGPUs" and "Replace frees an old pod's GPUs" in waiting["message"]


def test_a_kept_back_upgrade_is_an_event_once() -> None:
    upgrade = Upgrade(available="Yes", sidecar="ghcr.io/modelserve/modelserve:0.2.0", message="kept back")
    before = _status(model_server(), _deployment(1, 1), [])
    after = _status(model_server(), _deployment(1, 1), [], previous=before, upgrade=upgrade)
    assert [(e.reason, e.message) for e in transitions(before, after)] == [
        ("UpgradeAvailable", "ghcr.io/modelserve/modelserve:0.2.0: kept back")
    ]
    assert transitions(after, after) == []
    done = _status(model_server(), _deployment(1, 1), [], previous=after, upgrade=Upgrade(available="No"))
    assert transitions(after, done) == []
    workers = Upgrade(available="Yes", sidecar_workers=3, message="kept back")
    kept = _status(model_server(), _deployment(1, 1), [], previous=done, upgrade=workers)
    assert [(e.reason, e.message) for e in transitions(done, kept)] == [
        ("UpgradeAvailable", "3 sidecar workers: kept back")
    ]


def test_an_image_that_cannot_be_pulled_names_the_pull_secrets_its_namespace_lacks() -> None:
    pull = _pod(node="gpu-0", containerStatuses=_waiting("ErrImagePull", "401 Unauthorized"))
    pull["metadata"]["namespace"] = "team-a"
    seen = Observed(3, _deployment(), [pull], None, None, ("regcred",))
    degraded = _degraded(compute_status(model_server(), seen, Reported(T0, ENDPOINT)))
    assert (degraded["status"], degraded["reason"]) == ("True", "ImagePullError")
    assert degraded["message"] == (
        "pod m-1 container engine: 401 Unauthorized; imagePullSecrets not found in namespace team-a: regcred"
    )
    assert pulls_failing([pull]) and not pulls_failing([_pod(node="gpu-0", conditions=READY)])


def test_a_pod_waiting_for_its_volumes_names_the_missing_tls_secret() -> None:
    ms = model_server(tls={"secretName": "model-tls"})
    creating = _pod(node="gpu-0", containerStatuses=_waiting("ContainerCreating"))
    assert mounts_waiting([creating]) and not mounts_waiting([_pod(node="gpu-0", conditions=READY)])
    seen = Observed(3, _deployment(), [creating], None, None, (), True)
    degraded = _degraded(compute_status(ms, seen, Reported(T0, ENDPOINT)))
    assert (degraded["status"], degraded["reason"]) == ("True", "TLSSecretMissing")
    assert degraded["message"].startswith(f"spec.tls.secretName model-tls not found in namespace {ms.namespace}: ")
    # Found (or not looked up): still only waiting for the pod.
    seen = Observed(3, _deployment(), [creating], None, None, (), False)
    assert _degraded(compute_status(ms, seen, Reported(T0, ENDPOINT)))["status"] == "False"
