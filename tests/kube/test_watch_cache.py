"""The caches' and the work queue's pure parts: what is kept of an object, which version wins, and
that a key is handled by one worker at a time and queued at most once."""

from __future__ import annotations

import threading
import time

from modelserve.contracts.sidecar import serves_tls
from modelserve.kube.watch_cache import Watched, compact, newer
from modelserve.kube.workqueue import WorkQueue

POD = Watched("v1", "Pod", "serving.modelserve.dev/modelserver")
SECRET = Watched("v1", "Secret", "serving.modelserve.dev/modelserver", metadata_only=True)


def _body(resource_version: str) -> dict:
    return {
        "metadata": {"name": "m-1", "namespace": "ns", "resourceVersion": resource_version, "managedFields": [{}]},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "engine", "image": "x"},
                {"name": "sidecar", "image": "y", "ports": [{"name": "https", "containerPort": 8080}]},
            ],
        },
        "status": {"phase": "Running"},
    }


def test_compact_drops_managed_fields_and_what_status_never_reads() -> None:
    pod = compact(POD, _body("7"))
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "m-1", "namespace": "ns", "resourceVersion": "7"},
        # Of its containers, their ports' names: whether its sidecar serves HTTPS (spec.tls).
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "engine", "ports": []}, {"name": "sidecar", "ports": [{"name": "https"}]}],
        },
        "status": {"phase": "Running"},
    }
    assert serves_tls(pod)
    secret = compact(SECRET, {"metadata": {"name": "k", "resourceVersion": "1"}, "data": {"api-key": "c2VjcmV0"}})
    assert "data" not in secret and secret["kind"] == "Secret"


def test_a_later_resource_version_wins() -> None:
    assert newer(_body("10"), _body("9")) and newer(_body("9"), None)
    assert not newer(_body("9"), _body("10"))


def test_a_key_is_queued_once_and_handled_by_one_worker_at_a_time() -> None:
    handled: list[tuple[str, str]] = []
    running: set[tuple[str, str]] = set()
    overlaps: list[tuple[str, str]] = []
    release = threading.Event()
    guard = threading.Lock()

    def handle(key: tuple[str, str]) -> None:
        with guard:
            if key in running:
                overlaps.append(key)
            running.add(key)
        release.wait(5)
        with guard:
            running.discard(key)
            handled.append(key)

    queue = WorkQueue(workers=3)
    queue.start(handle)
    try:
        queue.add(("ns", "a"))
        deadline = time.monotonic() + 5
        while not running and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(5):  # while "a" is handled: once more after, not five times
            queue.add(("ns", "a"))
        queue.add(("ns", "b"))
        queue.add(("ns", "b"))
        release.set()
        deadline = time.monotonic() + 5
        while len(handled) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # anything queued twice would be handled by now
    finally:
        queue.stop(timeout=5)
    assert sorted(handled) == [("ns", "a"), ("ns", "a"), ("ns", "b")]
    assert not overlaps
