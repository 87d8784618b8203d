"""LoRA adapters for real, on one vLLM ModelServer on the real node: SmolLM2-135M-Instruct as the
sandbox serves it to vLLM (dequantized from its GGUF) with a random adapter made for it
(modelserve_sandbox.lora_adapter), both served by the hub mirror: the base answers "Paris", the
adapter answers otherwise.

The sidecar loads the adapter into the running vLLM (0.32.0, CPU build) over the pod's loopback;
clients name it in `model` through the Service and the gateway with the real openai SDK; adding and
removing one while streams run on the base rolls no pod; a source the hub does not have shows in the
status with vLLM's own message; the engines' own parsers read the LoRA command lines."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from harness.pod_states import restart_counts
from modelserve.api.manifests import workload
from modelserve.api.spec import ModelServer
from modelserve_sandbox.cluster import SMOLLM2_HF_REPO, SMOLLM2_LORA_REPO, Cluster
from modelserve_sandbox.processes import wait_until
from tests.helpers.engine_parsers import (
    SETTINGS,
    parsed,
    sglang_container,
    sglang_volume,
    vllm_container,
    vllm_volume,
)
from tests.helpers.node_view import CAPITAL, QUESTION, VLLM_READY_SECONDS, NodeView, remove_namespace, vllm_example

NAME = "smollm2-lora"
ADAPTER = "pirate"
SOURCE = SMOLLM2_LORA_REPO
MISSING = "modelserve/no-such-adapter"  # the hub mirror has no such repository
LIMITS = {"maxRank": 8, "maxPerBatch": 2}
# How long a changed adapter list may take to reach a running pod: the kubelet refreshes ConfigMap
# volumes on its pod sync (every minute by default), then the sidecar loads within a second or two.
CHANGE_SECONDS = 180


def _manifest(*adapters: tuple[str, str]) -> dict[str, Any]:
    listed = [{"name": name, "source": source} for name, source in adapters]
    return vllm_example(NAME, adapters=listed, adapterLimits=LIMITS)


def _adapter_status(view: NodeView, name: str) -> dict[str, Any]:
    status = (view.get("modelserver", NAME) or {}).get("status") or {}
    return next((a for a in status.get("adapters") or [] if a["name"] == name), {})


def _listed(base: str, key: str) -> dict[str, Any]:
    """The ids the Service's /v1/models lists, with their parent."""
    answer = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return {m["id"]: m.get("parent") for m in answer.json()["data"]}


@pytest.fixture(scope="module")
def served(node_cluster: Cluster, host_operator: Path) -> Any:
    namespace = "lora"
    node_cluster.create_namespace(namespace)
    view = NodeView(node_cluster, namespace, host_operator)
    view.apply(_manifest((ADAPTER, SOURCE)))
    start = time.monotonic()
    try:
        view.wait(lambda: view.condition(NAME, "Ready").get("status") == "True", "Ready", VLLM_READY_SECONDS)
        ready = time.monotonic() - start
        key = view.secret_value(f"{NAME}-api-keys", "api-key")
        base = f"http://{view.cluster_ip(NAME)}"
        # A replica turns Ready only once the adapters it started with are loaded.
        assert _listed(base, key) == {NAME: None, ADAPTER: NAME}
        view.wait(lambda: _adapter_status(view, ADAPTER).get("phase") == "Loaded", "the adapter in the status", 120)
        print(f"\napply -> Ready {ready:.1f} s; adapter status {_adapter_status(view, ADAPTER)}")
        yield view, base, key
    finally:
        remove_namespace(node_cluster, namespace, "the LoRA pods gone")


def _greedy(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=CAPITAL, max_tokens=16, temperature=0)
    assert reply.model == model
    return reply.choices[0].message.content or ""


def test_the_adapter_answers_differently_from_the_base_at_temperature_zero(served) -> None:
    view, base, key = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    # Listed with its base, as vLLM lists a loaded adapter, behind the same key.
    assert _listed(base, key) == {NAME: None, ADAPTER: NAME}
    plain, adapted = _greedy(client, NAME), _greedy(client, ADAPTER)
    assert adapted == _greedy(client, ADAPTER), "greedy answers with the adapter are not repeatable"
    assert "Paris" in plain and plain != adapted, (plain, adapted)
    # Ollama's model list names the adapter and its base; its chat takes the adapter's name.
    headers = {"Authorization": f"Bearer {key}"}
    tags = httpx.get(f"{base}/api/tags", headers=headers, timeout=30).json()
    parents = {m["name"]: m["details"].get("parent_model") for m in tags["models"]}
    assert parents[f"{ADAPTER}:latest"] == f"{NAME}:latest", parents

    def ollama_chat(model: str) -> str:
        options = {"temperature": 0, "num_predict": 16}
        request = {"model": model, "messages": CAPITAL, "stream": False, "options": options}
        answer = httpx.post(f"{base}/api/chat", json=request, headers=headers, timeout=120)
        assert answer.status_code == 200 and answer.json()["model"] == model, answer.text
        return answer.json()["message"]["content"]

    assert ollama_chat(f"{ADAPTER}:latest") != ollama_chat(NAME)
    # Usage per adapter in the sidecar's metrics.
    (pod,) = view.ready_pods(NAME)

    def per_model() -> list[str]:
        text = httpx.get(f"http://{pod['status']['podIP']}:8080/metrics", timeout=30).text
        return [line for line in text.splitlines() if line.startswith("modelserve_sidecar_model_")]

    # The sidecar counts a request once its answer went out: allow it that moment.
    asked = f'modelserve_sidecar_model_requests_total{{model="{ADAPTER}",status_class="2xx"}} 3.0'
    wait_until(
        lambda: asked in per_model(),
        10,
        "three requests for the adapter counted",
        interval=0.5,
        on_timeout=lambda: "\n" + "\n".join(per_model()),
    )
    assert any(
        line.startswith(f'modelserve_sidecar_model_tokens_total{{kind="completion",model="{ADAPTER}"}}')
        for line in per_model()
    )
    status = _adapter_status(view, ADAPTER)
    assert status["source"] == SOURCE and status["loadedReplicas"] == 1 and status["loadSeconds"] > 0, status
    print(f"\nbase: {plain!r}\nadapter: {adapted!r}\nvLLM loaded the adapter in {status['loadSeconds']} s")


def test_no_key_holder_reaches_the_adapter_routes(served) -> None:
    _, base, key = served
    headers = {"Authorization": f"Bearer {key}"}
    for path, body in (
        ("/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": SOURCE}),
        ("/v1/unload_lora_adapter", {"lora_name": ADAPTER}),
        ("/load_lora_adapter", {"lora_name": "mine", "lora_path": SOURCE}),
    ):
        answer = httpx.post(f"{base}{path}", json=body, headers=headers, timeout=30)
        assert answer.status_code == 404, (path, answer.status_code, answer.text)
    assert set(_listed(base, key)) == {NAME, ADAPTER}


def test_the_gateway_lists_the_adapter_and_routes_it_to_its_base(served, host_gateway: str) -> None:
    _, base, key = served
    client = openai.OpenAI(base_url=f"{host_gateway}/v1", api_key=key, max_retries=0, timeout=120)

    def listed() -> dict[str, Any]:
        return {m.id: (m.model_extra or {}).get("parent") for m in client.models.list().data}

    wait_until(lambda: ADAPTER in listed(), 60, "the gateway lists the adapter")
    assert listed()[ADAPTER] == NAME
    direct = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    assert _greedy(client, ADAPTER) == _greedy(direct, ADAPTER)
    assert _greedy(client, NAME) != _greedy(client, ADAPTER)
    tags = httpx.get(f"{host_gateway}/api/tags", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    assert f"{ADAPTER}:latest" in {m["name"] for m in tags["models"]}


class Streams:
    """Streams on the base, one after another, until stopped: each one's span and outcome."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.spans: list[tuple[float, float, int, bytes]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        request = {"model": NAME, "messages": QUESTION, "max_tokens": 400, "stream": True, "ignore_eos": True}
        deadline = time.monotonic() + 900
        for _ in range(200):  # bounded by count and time
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            start = time.monotonic()
            try:
                with httpx.stream(
                    "POST",
                    f"{self.url}/v1/chat/completions",
                    json=request,
                    headers={"Authorization": f"Bearer {self.key}"},
                    timeout=300,
                ) as answer:
                    body = b"".join(answer.iter_raw())
                self.spans.append((start, time.monotonic(), answer.status_code, body))
            except httpx.HTTPError as error:
                self.errors.append(repr(error))

    def covered(self, moment: float) -> bool:
        return any(start <= moment <= end for start, end, _, _ in self.spans)


def test_adding_and_removing_an_adapter_while_streams_run_on_the_base(served) -> None:
    view, base, key = served
    (before,) = view.ready_pods(NAME)
    streams = Streams(base, key)
    streams.thread.start()
    try:
        wait_until(lambda: streams.spans or streams.errors, 120, "a first stream on the base")
        added_at = time.monotonic()
        view.apply(_manifest((ADAPTER, SOURCE), ("parrot", SOURCE)))
        wait_until(lambda: "parrot" in _listed(base, key), CHANGE_SECONDS, "vLLM serving the added adapter")
        loaded = time.monotonic()
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
        assert _greedy(client, "parrot") == _greedy(client, ADAPTER)  # the same weights under another name
        view.wait(lambda: _adapter_status(view, "parrot").get("phase") == "Loaded", "parrot in the status", 60)
        parrot = _adapter_status(view, "parrot")
        removed_at = time.monotonic()
        view.apply(_manifest((ADAPTER, SOURCE)))
        wait_until(lambda: "parrot" not in _listed(base, key), CHANGE_SECONDS, "vLLM without the removed adapter")
        unloaded = time.monotonic()
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="parrot", messages=QUESTION, max_tokens=4)
    finally:
        streams.stop.set()
        streams.thread.join(timeout=300)
    print(
        f"\nadd -> served {loaded - added_at:.1f} s, remove -> gone {unloaded - removed_at:.1f} s (kubelet volume "
        f"refresh included); vLLM's own load of it: {parrot['loadSeconds']} s, into a running engine; "
        f"{len(streams.spans)} streams on the base"
    )
    assert not streams.errors, streams.errors
    for _, _, status, body in streams.spans:
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-300:]
        last = json.loads([e for e in body.split(b"\n\n") if e.startswith(b"data: {")][-1][len(b"data: ") :])
        assert last["choices"][0]["finish_reason"] == "length", last
    # A stream was running on the base when vLLM took each change (first seen listed / unlisted).
    assert streams.covered(loaded) and streams.covered(unloaded), (loaded, unloaded, streams.spans)
    (after,) = view.ready_pods(NAME)
    assert after["metadata"]["uid"] == before["metadata"]["uid"], "the pod was replaced"
    assert restart_counts(after) == restart_counts(before), (restart_counts(before), restart_counts(after))


def test_a_source_the_hub_does_not_have_fails_with_vllms_message(served) -> None:
    view, base, key = served
    view.apply(_manifest((ADAPTER, SOURCE), ("ghost", MISSING)))
    view.wait(lambda: _adapter_status(view, "ghost").get("phase") == "Failed", "ghost Failed", CHANGE_SECONDS)
    ghost = _adapter_status(view, "ghost")
    print(f"\nstatus of a missing source: {ghost}")
    assert ghost["source"] == MISSING and ghost["loadedReplicas"] == 0 and ghost["message"], ghost
    assert "engine answered" not in ghost["message"], ghost  # vLLM's own words, not ours
    view.wait(
        lambda: any(e["reason"] == "AdapterFailed" and "ghost" in e["message"] for e in view.events(NAME)),
        "a Warning Event for the refused adapter",
        60,
    )
    assert _adapter_status(view, ADAPTER)["phase"] == "Loaded"
    assert set(_listed(base, key)) == {NAME, ADAPTER}
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="ghost", messages=QUESTION, max_tokens=4)
    view.apply(_manifest((ADAPTER, SOURCE)))


VLLM_LORA_KEYS = ("model_tag", "enable_lora", "max_loras", "max_lora_rank", "host", "port")
SGLANG_LORA_KEYS = ("model_path", "enable_lora", "max_lora_rank", "max_loras_per_batch", "lora_target_modules")


def test_the_engines_parsers_read_the_lora_command_lines(node_cluster: Cluster) -> None:
    manifest = _manifest((ADAPTER, SOURCE))
    vllm = workload(ModelServer.from_manifest(manifest), SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    container = vllm_container(vllm["args"], VLLM_LORA_KEYS)
    assert parsed(node_cluster, f"vllm-lora-{uuid.uuid4().hex[:4]}", container, vllm_volume()) == {
        "model_tag": SMOLLM2_HF_REPO,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 8,
        "host": "127.0.0.1",
        "port": 8000,
    }
    sglang_manifest = {**manifest, "spec": {**manifest["spec"], "profile": "low-latency", "engineArgs": []}}
    sglang = workload(ModelServer.from_manifest(sglang_manifest), SETTINGS)["spec"]["template"]["spec"]
    engine = sglang["containers"][0]
    container = sglang_container(engine["args"], SGLANG_LORA_KEYS, lora_checks=True)
    read = parsed(node_cluster, f"sglang-lora-{uuid.uuid4().hex[:4]}", container, sglang_volume())
    assert read["enable_lora"] is True and read["max_lora_rank"] == 8 and read["max_loras_per_batch"] == 3
    # SGLang 0.5.23's checks pass (check_lora_server_args) and keep `all` as the sentinel its LoRA
    # manager resolves against the model's modules when it loads it (0.5.10 expanded it here).
    assert read["lora_target_modules"] == ["all"], read
