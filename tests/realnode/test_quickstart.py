"""The quickstart (docs/getting-started/quickstart.md) on the real node: the operator's pods run, the engine
serves the real SmolLM2-135M-Instruct from the sandbox's model hub, and callers reach it the ways a user does."""

from __future__ import annotations

import re
import subprocess
import textwrap
import time
from pathlib import Path

import httpx
import openai
import pytest

from modelserve_sandbox import realnode
from tests.helpers.node_view import NO_END, PROMPT, NodeView, Timeline, cpu_server

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "quickstart.md"
NAME = "my-first-model"


def quickstart_manifest() -> str:
    """Step 2 of the quickstart, verbatim."""
    text = QUICKSTART.read_text()
    match = re.search(r"kubectl apply -f - <<'YAML'\n(.*?)\n\s*YAML", text, re.S)
    assert match, "the quickstart's manifest"
    return textwrap.dedent(match.group(1))


def test_quickstart_serves_the_real_model(node: NodeView, port_forward) -> None:
    timeline = Timeline()
    node.kubectl("apply", "-f", "-", input=quickstart_manifest())
    # Honest readiness: the ModelServer says ModelLoading until the engine answers, then Ready.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ms = node.get("modelserver", NAME) or {}
        ready = next((c for c in ms.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
        timeline.add(f"ms Ready={ready.get('status')} reason={ready.get('reason')}")
        pods = node.pods(NAME)
        for pod in pods:
            statuses = {c["name"]: c for c in pod.get("status", {}).get("containerStatuses", [])}
            timeline.add(
                f"pod engine running={'running' in statuses.get('engine', {}).get('state', {})} "
                f"sidecar ready={statuses.get('sidecar', {}).get('ready')}"
            )
        if ready.get("status") == "True":
            break
        time.sleep(0.25)
    assert timeline.first("ms Ready=True reason=Ready") is not None, f"never Ready:\n{timeline}"
    loading = timeline.first("ms Ready=False reason=ModelLoading")
    assert loading is not None and loading < timeline.first("ms Ready=True reason=Ready"), str(timeline)
    # The operator writes the status, then the Event: wait for the Ready one.
    node.wait(lambda: "Ready" in [e["reason"] for e in node.events(NAME)], "the Ready Event", 30)
    events = [e["reason"] for e in sorted(node.events(NAME), key=lambda e: e["firstTimestamp"])]
    assert "ModelLoading" in events and events.index("ModelLoading") < events.index("Ready"), events

    # The pod turned Ready only after the engine could answer: its sidecar's readiness is the
    # engine's model list, and the engine logged that it serves before the pod was Ready.
    pod = node.ready_pods(NAME)[0]
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    ready_at = next(c["lastTransitionTime"] for c in pod["status"]["conditions"] if c["type"] == "Ready")
    engine_log = node.kubectl("logs", pod["metadata"]["name"], "-c", "engine", "--timestamps").stdout
    # "main: server is listening on http://..." until b9093, "llama_server: listening on http://..." since.
    listening = next(line.split()[0] for line in engine_log.splitlines() if "listening on http" in line)
    assert listening[:19] <= ready_at[:19], (listening, ready_at)

    # Steps 4 and 5: the generated key, a port-forward to the Service, curl-like calls and the SDK.
    key = node.secret_value(f"{NAME}-api-keys", "api-key")
    base = port_forward(node.namespace, f"svc/{NAME}", 80)
    request = {"model": NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 16}
    with_key = httpx.post(
        f"{base}/v1/chat/completions", json=request, timeout=60, headers={"Authorization": f"Key {key}"}
    )
    assert with_key.status_code == 200, with_key.text
    assert with_key.json()["choices"][0]["message"]["content"]
    missing = httpx.post(f"{base}/v1/chat/completions", json=request, timeout=60)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"

    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=NAME, messages=request["messages"], max_tokens=16)
    assert reply.choices[0].message.content and reply.model == NAME
    # An instruct model under its own name answers like one (the base model served before did not).
    asked = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    answer = client.chat.completions.create(model=NAME, messages=asked, max_tokens=32, temperature=0)
    assert "Paris" in (answer.choices[0].message.content or ""), answer.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0).models.list()

    # A stream arrives as it is generated, not in one piece at the end.
    arrivals: list[float] = []
    started = time.monotonic()
    stream = client.chat.completions.create(
        model=NAME, messages=PROMPT, max_tokens=64, stream=True, logit_bias=NO_END, temperature=0
    )
    text = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - started)
            text += chunk.choices[0].delta.content
    assert len(arrivals) >= 32, text
    spread = arrivals[-1] - arrivals[0]
    assert spread > 0.3 * arrivals[-1], f"chunks arrived at {arrivals}"

    # Step 5 from inside the cluster, as the quickstart writes it: `kubectl run` of the client image,
    # `status.endpoint` verbatim as the base URL, which only the cluster's DNS resolves.
    kubectl = f'set -e\nkubectl() {{ "{node.cluster.bin_dir / "kubectl"}" -n {node.namespace} "$@"; }}\n'
    ran = subprocess.run(
        ["bash", "-c", kubectl + quickstart_in_cluster_call()],
        env={**node.cluster.env, "KEY": key},
        capture_output=True,
        text=True,
        timeout=420,
    )
    if ran.returncode != 0:  # what the client pod did, for the failure's message (it may be gone)
        for look in (("get", "pod", "ask", "-o", "jsonpath={.status}"), ("logs", "ask")):
            seen = node.kubectl(*look, check=False)
            ran.stderr += f"\nkubectl {' '.join(look)}: {seen.stdout[-2000:]}{seen.stderr[-500:]}"
        node.kubectl("delete", "pod", "ask", "--wait=false", check=False)
    assert ran.returncode == 0 and "Paris" in ran.stdout, ran.stdout + ran.stderr


def quickstart_in_cluster_call() -> str:
    """Step 5's `kubectl run` of the in-cluster client, verbatim (its lines indented as the list item)."""
    match = re.search(r"^( *)(kubectl run ask .*?kubectl delete pod ask)\n", QUICKSTART.read_text(), re.S | re.M)
    assert match, "the quickstart's in-cluster call"
    return textwrap.dedent(match.group(1) + match.group(2))


def test_service_through_kube_proxy_reaches_the_sidecar(node: NodeView) -> None:
    node.apply(cpu_server("via-service", public=True))
    node.wait_phase("via-service", "Ready")
    ip = node.cluster_ip("via-service")  # kube-proxy's rules take the host to a pod on the bridge
    models = httpx.get(f"http://{ip}/v1/models", timeout=30)
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["via-service"]
    metrics = httpx.get(f"http://{ip}/metrics", timeout=30).text
    assert "modelserve_sidecar_requests_total" in metrics and "llamacpp:" in metrics
