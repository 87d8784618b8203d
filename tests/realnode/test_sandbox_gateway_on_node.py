"""The sandbox's own wiring, as `make dev` runs it: the gateway and the operator as host processes
(started by the sandbox's host_programs, as its main does), a `min: 0` cpu ModelServer on the real
node, and one request held at that host gateway waking it. The chart's in-cluster gateway is
tested in test_gateway_on_node.py; this one is found by address (MODELSERVE_GATEWAY_ADDRESSES).
The model is placed on the node before any pod needs it (spec.cache.prefetch), so the wake reads
no byte from the hub.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai

from harness.pod_states import container_states
from modelserve.operator.starts import fetch_result
from modelserve_sandbox import realnode
from modelserve_sandbox.host_programs import HostPrograms
from tests.helpers.node_view import NodeView, Timeline, cpu_server, hub_file_bytes

HELLO = [{"role": "user", "content": "Say hello"}]
WAKE_SECONDS_AT_MOST = 240
AT_ZERO = {"min": 0, "max": 1, "buffer": 0, "scaleDownDelaySeconds": 600, "idleWindowSeconds": 600}


def test_the_host_gateway_wakes_a_model_at_zero(sandbox: HostPrograms, view: NodeView) -> None:
    prefetch = {"prefetch": {"nodeSelector": {"type": realnode.NODE_LABELS["type"]}}}
    view.apply(cpu_server("sleeper", public=True, replicas=AT_ZERO, cache=prefetch))
    idle = view.wait_phase("sleeper", "Idle")
    assert idle["status"]["replicas"] == 0 and not view.pods("sleeper")
    assert idle["status"]["gatewayEndpoint"] == sandbox.gateway_url
    view.wait(
        lambda: view.condition("sleeper", "Prefetched").get("status") == "True",
        "the real node's cache holds the model (Prefetched)",
        180,
    )
    cache = (view.get("modelserver", "sleeper") or {})["status"]["cache"]
    held = [{"node": realnode.NODE_NAME, "state": "Held"}]
    assert cache["warm"] == "1/1" and cache["nodes"] == held and "message" not in cache, cache
    hub_before = hub_file_bytes(view.cluster)
    client = openai.OpenAI(base_url=sandbox.gateway_url, api_key="none", timeout=WAKE_SECONDS_AT_MOST, max_retries=0)
    answer: dict[str, str] = {}
    timeline = Timeline()

    def ask() -> None:
        try:
            reply = client.chat.completions.create(model="sleeper", messages=HELLO, max_tokens=16)
            answer["content"] = reply.choices[0].message.content or ""
        except openai.APIError as error:
            answer["error"] = repr(error)

    asking = threading.Thread(target=ask)
    asking.start()
    held_seen: list[int] = []
    deadline = time.monotonic() + WAKE_SECONDS_AT_MOST
    while asking.is_alive() and time.monotonic() < deadline:
        held = httpx.get(f"http://{sandbox.gateway_address}/held", timeout=5).json()["held"]
        held_seen += [entry["requests"] for entry in held if entry["name"] == "sleeper"]
        pods = view.pods("sleeper")
        timeline.add(f"held {held_seen[-1:] or [0]}, pods {[container_states(pod) for pod in pods]}")
        time.sleep(0.5)
    asking.join(timeout=10)
    assert max(held_seen, default=0) == 1, f"the host gateway's /held showed {held_seen}\n{timeline}"
    assert answer.get("content"), f"{answer}\n{timeline}\n{view.get('modelserver', 'sleeper')}"
    # The gateway routes on the pod's readiness, the status follows on the operator's next reconcile.
    view.wait(
        lambda: ((view.get("modelserver", "sleeper") or {}).get("status") or {}).get("readyReplicas") == 1,
        "readyReplicas 1 in the status",
        60,
    )
    scaled = view.get("modelserver", "sleeper") or {}
    assert "held" in scaled["status"]["scaling"]["message"], scaled["status"]["scaling"]
    # The wake read the model from the node it was placed on: no byte from the hub.
    (pod,) = view.ready_pods("sleeper")
    result = fetch_result(pod)
    assert result and (result.hub_bytes, result.source) == (0, "node"), result
    assert hub_file_bytes(view.cluster) == hub_before
    view.wait(lambda: ((view.get("modelserver", "sleeper") or {}).get("status") or {}).get("lastStart"), "lastStart")
