"""A replica start's phases, read from the pod as the kubelet reports it (operator/starts.py), and a
fetch that keeps failing as the ModelServer's Degraded reason."""

from __future__ import annotations

from typing import Any

from modelserve.contracts.nodecache import FetchResult
from modelserve.operator.starts import new_starts, pod_start
from modelserve.operator.status import pod_problem

FETCHED = FetchResult("acme/m:Q4_1", 2.345, hub_bytes=0, node_bytes=98_500_000, files=1)


def _pod(ready: bool = True, fetch: FetchResult | None = FETCHED, uid: str = "u1") -> dict[str, Any]:
    init = []
    if fetch is not None:
        terminated = {
            "exitCode": 0,
            "startedAt": "2026-01-01T00:00:03Z",
            "finishedAt": "2026-01-01T00:00:06Z",
            "message": fetch.to_json(),
        }
        init = [{"name": "fetch", "state": {"terminated": terminated}}]
    return {
        "metadata": {"name": "m-abc", "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "real-0"},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": "2026-01-01T00:00:20Z"},
            ],
            "initContainerStatuses": init,
            "containerStatuses": [
                {"name": "engine", "state": {"running": {"startedAt": "2026-01-01T00:00:08Z"}}},
                {"name": "sidecar", "state": {"running": {"startedAt": "2026-01-01T00:00:08Z"}}},
            ],
        },
    }


def test_a_start_splits_into_schedule_image_weights_and_engine() -> None:
    start = pod_start(_pod())
    assert start is not None
    # image: scheduled 1 s -> fetch 3 s, and fetch done 6 s -> engine 8 s; weights: the fetch's own time.
    assert start.phases == {"schedule": 1.0, "image": 4.0, "weights": 2.345, "engine": 12.0}
    assert start.seconds == 20.0 and start.node == "real-0"
    assert start.describe() == (
        "Started pod m-abc on real-0 in 20.0 s: schedule 1.0 s, image 4.0 s, "
        "weights 2.3 s (0 B from the hub, 98.5 MB from the node), engine 12.0 s"
    )
    status = start.status()
    assert (status.source, status.node_bytes, status.hub_bytes) == ("node", 98_500_000, 0)


def test_without_the_fetch_the_weights_are_part_of_the_engines_start() -> None:
    start = pod_start(_pod(fetch=None))
    assert start is not None and start.phases == {"schedule": 1.0, "image": 7.0, "engine": 12.0}


def test_a_pod_not_ready_has_no_start_yet_and_each_start_is_reported_once() -> None:
    assert pod_start(_pod(ready=False)) is None
    seen: set[str] = set()
    (start,) = new_starts([_pod()], seen, None)
    seen.add(start.uid)
    assert new_starts([_pod()], seen, None) == []
    # A restarted operator: the status already reports a start at or after this one.
    assert new_starts([_pod(uid="u2")], set(), "2026-01-01T00:00:20Z") == []
    assert len(new_starts([_pod(uid="u3")], set(), "2026-01-01T00:00:19Z")) == 1


def test_a_fetch_the_hub_refuses_again_and_again_is_the_reason_the_modelserver_is_degraded() -> None:
    refused = FetchResult(
        "acme/gated", 0.2, error="the hub answered 403 for m.gguf: Access to model acme/gated is restricted"
    )
    pod = _pod(ready=False, fetch=None)
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "fetch",
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "message": refused.to_json()}},
        }
    ]
    problem = pod_problem(pod, gpus=0)
    assert problem is not None and problem.reason == "FetchFailed"
    assert "tried 3 times" in problem.message and "answered 403" in problem.message
