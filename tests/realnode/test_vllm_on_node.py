"""vLLM for real: the high-throughput example's pod, exactly as the operator generates it, lands on
the real node (it advertises `nvidia.com/gpu`) and runs the sandbox's vLLM image (realnode.VLLM_IMAGE:
vLLM's CPU build from PyPI at its own release, in place of the CUDA release the operator pins), whose
fetch init container puts SmolLM2-135M-Instruct into the hub-cache volume through the node's cache
(from the hub mirror the first time), where vLLM reads it offline: the 4-bit GGUF the cpu example
serves, dequantized by the sandbox (modelserve_sandbox.gguf_to_hf), so vLLM answers like an instruct
model. Callers reach it through
the Service and the gateway with the real openai SDK; it answers "Paris" at temperature 0 and stops
where asked; the sidecar serves vLLM's own metrics; the spec's chat template, sampling defaults and
tool-call parser reach vLLM and change its answers as configured; a deleted pod finishes its stream,
and its replacement reads the weights from the node, no byte from the hub.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from modelserve.operator.starts import fetch_result
from modelserve_sandbox import realnode
from modelserve_sandbox.cluster import SMOLLM2_HF_REPO, Cluster
from modelserve_sandbox.processes import wait_until
from tests.helpers.node_view import (
    CAPITAL,
    EXAMPLES,
    PROMPT,
    QUESTION,
    VLLM_READY_SECONDS,
    NodeView,
    Timeline,
    hub_file_bytes,
    hub_model_size,
    remove_namespace,
    vllm_example,
)

EXAMPLE = EXAMPLES / "smollm2-135m-vllm.yaml"
NAME = "smollm2-135m-vllm"
# Asked from inside the pod (the engine listens on the pod's loopback only): /health and /v1/models.
ENGINE_PROBE = """
import urllib.error, urllib.request
def code(path):
    try:
        return urllib.request.urlopen("http://127.0.0.1:8000" + path, timeout=3).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return "closed"
print("health", code("/health"), "models", code("/v1/models"))
"""


def in_pod(view: NodeView, pod: str, container: str, *command: str) -> subprocess.CompletedProcess:
    """`kubectl exec` (the namespace before `--`, where kubectl reads it)."""
    return view.cluster.kubectl("exec", "-n", view.namespace, pod, "-c", container, "--", *command, check=False)


def metric(text: str, name: str, model: str) -> float:
    """One vLLM series' value for `model` (summed over its other labels)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    assert seen, f"no {name} for {model} in the sidecar's /metrics"
    return total


@pytest.fixture(scope="module")
def served(node_cluster: Cluster, host_operator: Path) -> Iterator[tuple[NodeView, Timeline]]:
    """The example applied as it is, watched from apply to Ready: the ModelServer's condition, the
    pod's node, and the engine's port, /health and /v1/models asked from inside the pod."""
    namespace = "vllm-example"
    node_cluster.create_namespace(namespace)
    view = NodeView(node_cluster, namespace, host_operator)
    timeline = Timeline()
    view.kubectl("apply", "-f", str(EXAMPLE))
    deadline = time.monotonic() + VLLM_READY_SECONDS
    try:
        while time.monotonic() < deadline:
            ready = view.condition(NAME, "Ready")
            timeline.add(f"ms Ready={ready.get('status')} reason={ready.get('reason')}")
            # Asked once more when Ready is seen: the engine may come up between two rounds.
            _probe_engine(view, timeline)
            if ready.get("status") == "True":
                break
            time.sleep(1)
        print(f"\nvLLM example, apply -> Ready:\n{timeline}")
        assert timeline.first("ms Ready=True reason=Ready") is not None, f"never Ready:\n{timeline}"
        yield view, timeline
    finally:
        remove_namespace(node_cluster, namespace, "the example's pods gone")


def _probe_engine(view: NodeView, timeline: Timeline) -> None:
    """The engine's port, /health and /v1/models, asked from inside each pod whose two containers run."""
    for pod in view.pods(NAME):
        running = {
            c["name"] for c in pod.get("status", {}).get("containerStatuses", []) if "running" in c.get("state", {})
        }
        if "sidecar" in running and "engine" in running:
            probe = in_pod(view, pod["metadata"]["name"], "sidecar", "python", "-c", ENGINE_PROBE)
            if probe.returncode == 0:
                timeline.add(f"engine {probe.stdout.strip()}")


def test_the_generated_pod_runs_on_the_real_node_and_turns_ready_honestly(served) -> None:
    view, timeline = served
    (pod,) = view.ready_pods(NAME)
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    # The sandbox's vLLM: the CPU build, tagged as such, which its operators are told to use.
    assert engine["image"] == realnode.VLLM_IMAGE and engine["command"] == ["vllm", "serve"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # Honest readiness: nothing listens while vLLM loads, then /health and /v1/models answer, and
    # only then does the ModelServer (from the sidecar's readiness) say Ready.
    closed = timeline.first("engine health closed models closed")
    serving = timeline.first("engine health 200 models 200")
    loading = timeline.first("ms Ready=False reason=ModelLoading")
    ready = timeline.first("ms Ready=True reason=Ready")
    assert closed is not None and serving is not None and loading is not None, str(timeline)
    # Ready only once the engine serves: the port was closed while it loaded, and it answers when
    # Ready is first seen (the round that sees Ready asks the engine right after).
    assert loading < ready and closed < serving and closed < ready, str(timeline)
    assert timeline.entries[-1][1] == "engine health 200 models 200", str(timeline)
    # The model came from the hub mirror into the hub-cache volume, as from the hub.
    listing = in_pod(view, pod["metadata"]["name"], "engine", "ls", "/root/.cache/huggingface/hub").stdout.split()
    assert "models--modelserve--SmolLM2-135M-Instruct-Q4_1-dequantized" in listing, listing


def test_openai_sdk_through_the_service_with_key_and_bearer(served) -> None:
    view, _ = served
    base = f"http://{view.cluster_ip(NAME)}"
    key = view.secret_value(f"{NAME}-api-keys", "api-key")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)  # Bearer
    assert [m.id for m in client.models.list().data] == [NAME]
    reply = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=8)
    assert reply.model == NAME and reply.usage.completion_tokens <= 8 and reply.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=8, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
    with_key = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": NAME, "messages": QUESTION, "max_tokens": 4},
        headers={"Authorization": f"Key {key}"},
        timeout=120,
    )
    assert with_key.status_code == 200 and with_key.json()["usage"]["completion_tokens"] <= 4, with_key.text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_the_instruct_model_answers_and_stops_where_asked(served) -> None:
    view, _ = served
    key = view.secret_value(f"{NAME}-api-keys", "api-key")
    client = openai.OpenAI(base_url=f"http://{view.cluster_ip(NAME)}/v1", api_key=key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=NAME, messages=CAPITAL, max_tokens=32, temperature=0)
    text = answer.choices[0].message.content or ""
    assert "Paris" in text and answer.choices[0].finish_reason == "stop", answer
    # A stop string ends the generation where it first appears, and is left out of the answer.
    cut = client.chat.completions.create(model=NAME, messages=CAPITAL, max_tokens=32, temperature=0, stop=["Paris"])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == text[: text.index("Paris")]
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=NAME, messages=CAPITAL, max_tokens=32, temperature=0, stop=[" of"], stream=True
        )
        if chunk.choices
    )
    assert streamed == text[: text.index(" of")], (streamed, text)
    # What one replica generates on two shared cores (measured, not asserted): 128 tokens streamed.
    started = time.monotonic()
    arrivals: list[float] = []
    tokens = 0
    for chunk in client.chat.completions.create(
        model=NAME,
        messages=PROMPT,
        max_tokens=128,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},  # vLLM's own field: the stream runs to max_tokens
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - started)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    assert tokens == 128 and len(arrivals) > 1
    rate = (tokens - 1) / (arrivals[-1] - arrivals[0])
    print(f"\n{NAME} at temperature 0: {text!r}; first token {arrivals[0]:.2f} s, then {rate:.1f} tokens/s")


def test_openai_sdk_through_the_gateway_with_key_and_bearer(served, host_gateway: str) -> None:
    view, _ = served
    key = view.secret_value(f"{NAME}-api-keys", "api-key")
    client = openai.OpenAI(base_url=f"{host_gateway}/v1", api_key=key, max_retries=0, timeout=120)
    wait_until(lambda: NAME in [m.id for m in client.models.list().data], 60, "the gateway lists the model")
    reply = client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=8)
    assert reply.model == NAME and reply.usage.completion_tokens <= 8
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(model=NAME, messages=QUESTION, max_tokens=8, stream=True)
        if chunk.choices
    )
    assert isinstance(text, str)
    with httpx.stream(
        "POST",
        f"{host_gateway}/v1/chat/completions",
        json={"model": NAME, "messages": QUESTION, "max_tokens": 4, "stream": True},
        headers={"Authorization": f"Key {key}"},
        timeout=120,
    ) as answer:
        body = b"".join(answer.iter_raw())
    assert answer.status_code == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-300:]


def test_sidecar_metrics_carry_vllms_series_and_sampling_defaults_reach_vllm(served) -> None:
    view, _ = served
    (pod,) = view.ready_pods(NAME)
    metrics_url = f"http://{pod['status']['podIP']}:8080/metrics"
    key = view.secret_value(f"{NAME}-api-keys", "api-key")
    before = httpx.get(metrics_url, timeout=30).text
    for series in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        metric(before, series, NAME)
    # No max_tokens in the request: the spec's samplingDefaults.maxTokens (64) is what vLLM gets.
    answer = httpx.post(
        f"http://{view.cluster_ip(NAME)}/v1/chat/completions",
        json={"model": NAME, "messages": QUESTION},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] <= 64
    after = httpx.get(metrics_url, timeout=30).text
    asked = metric(after, "vllm:request_params_max_tokens_sum", NAME) - metric(
        before, "vllm:request_params_max_tokens_sum", NAME
    )
    assert asked == 64, asked
    assert metric(after, "vllm:prompt_tokens_total", NAME) > metric(before, "vllm:prompt_tokens_total", NAME)
    assert "modelserve_sidecar_requests_total" in after


def test_deleting_the_pod_mid_stream_finishes_the_stream(served) -> None:
    view, _ = served
    (pod,) = view.ready_pods(NAME)
    key = view.secret_value(f"{NAME}-api-keys", "api-key")
    request = {
        "model": NAME,
        "messages": QUESTION,
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,  # vLLM's own field: the stream runs to max_tokens
    }
    outcome: dict[str, Any] = {}
    first_chunk = threading.Event()

    def stream() -> None:
        try:
            with httpx.stream(
                "POST",
                f"http://{pod['status']['podIP']}:8080/v1/chat/completions",
                json=request,
                headers={"Authorization": f"Key {key}"},
                timeout=300,
            ) as answer:
                parts = []
                for part in answer.iter_raw():
                    parts.append(part)
                    first_chunk.set()
                outcome.update(status=answer.status_code, body=b"".join(parts))
        except httpx.HTTPError as error:
            outcome["error"] = repr(error)
        finally:
            first_chunk.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert first_chunk.wait(120), "the stream never started"
    view.kubectl("delete", "pod", pod["metadata"]["name"], "--wait=false")
    thread.join(timeout=300)
    assert "error" not in outcome and outcome.get("status") == 200, outcome
    events = [line for line in outcome["body"].split(b"\n\n") if line.startswith(b"data: {")]
    assert outcome["body"].rstrip().endswith(b"data: [DONE]"), outcome["body"][-300:]
    last = json.loads(events[-1][len(b"data: ") :])
    assert last["choices"][0]["finish_reason"] == "length", last
    # The Deployment replaces the pod; the example serves again, its weights from the node's cache.
    hub_before = hub_file_bytes(view.cluster)
    view.wait(lambda: len(view.ready_pods(NAME)) == 1, "a replacement pod Ready", VLLM_READY_SECONDS)
    (replacement,) = view.ready_pods(NAME)
    result = fetch_result(replacement)
    assert result and (result.hub_bytes, result.source) == (0, "node"), result
    assert result.node_bytes == hub_model_size(view.cluster, SMOLLM2_HF_REPO), result
    assert hub_file_bytes(view.cluster) == hub_before


# The model's ChatML with a fixed system turn first: what vLLM counts as the prompt shows it used it.
PREAMBLE = "<|im_start|>system\nYou keep a lighthouse. Answer in one line.<|im_end|>\n"
CUSTOM_TEMPLATE = (
    "{{ '" + PREAMBLE.replace("\n", "\\n") + "' }}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# The second ModelServer: the model with that template, hermes tool calls, and sampling defaults of
# its own (greedy, and a stop string) in place of the example's.
CUSTOM = "smollm2-custom"
CUSTOM_DEFAULTS = {"temperature": 0, "maxTokens": 48, "stop": ["Paris"]}


def _prompt_tokens(cluster: Cluster, text: str) -> int:
    """How many tokens the served model's own tokenizer (the hub mirror's file) makes of `text`."""
    from tokenizers import Tokenizer

    (path,) = (f.path for f in cluster.hub_files if f.repo == SMOLLM2_HF_REPO and f.name == "tokenizer.json")
    return len(Tokenizer.from_file(str(path)).encode(text).ids)


@pytest.fixture(scope="module")
def custom(served) -> Iterator[openai.OpenAI]:
    """The example as CUSTOM (public), Ready; a client of its Service. Deleted after the module's tests."""
    view, _ = served
    spec = {"chatTemplate": CUSTOM_TEMPLATE, "toolCallParser": "hermes", "samplingDefaults": CUSTOM_DEFAULTS}
    view.apply(vllm_example(CUSTOM, auth={"mode": "public"}, **spec))
    try:
        view.wait_phase(CUSTOM, "Ready", VLLM_READY_SECONDS)
        base = f"http://{view.cluster_ip(CUSTOM)}/v1"
        yield openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
    finally:
        view.kubectl("delete", "modelserver", CUSTOM, "--wait=false")
        # Past the engine's preStop (65 s) and its stop on busy cores.
        view.wait(lambda: not view.pods(CUSTOM), f"{CUSTOM}'s pods gone", 240)


def test_chat_template_and_tool_call_parser_reach_vllm(custom: openai.OpenAI, node_cluster: Cluster) -> None:
    reply = custom.chat.completions.create(model=CUSTOM, messages=QUESTION, max_tokens=4)
    question = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    # SmolLM2's own template opens with its default system turn when the messages have none.
    own_system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    custom_count = _prompt_tokens(node_cluster, PREAMBLE + question)
    default_count = _prompt_tokens(node_cluster, own_system + question)
    assert custom_count != default_count
    assert reply.usage.prompt_tokens == custom_count, (reply.usage.prompt_tokens, custom_count, default_count)
    # vLLM refuses tool_choice "auto" unless started with --enable-auto-tool-choice and a parser.
    tooled = custom.chat.completions.create(
        model=CUSTOM, messages=QUESTION, max_tokens=8, tools=[WEATHER_TOOL], tool_choice="auto"
    )
    assert tooled.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_sampling_defaults_change_the_answer_as_configured(custom: openai.OpenAI) -> None:
    # No sampling fields in the request: the spec's defaults decide, greedy and cut before "Paris".
    cut = custom.chat.completions.create(model=CUSTOM, messages=CAPITAL)
    text = cut.choices[0].message.content or ""
    assert cut.choices[0].finish_reason == "stop" and text and "Paris" not in text, cut
    assert custom.chat.completions.create(model=CUSTOM, messages=CAPITAL).choices[0].message.content == text
    # A request's own values win: no stop string (an empty list replaces the default), a token budget.
    whole = custom.chat.completions.create(model=CUSTOM, messages=CAPITAL, stop=[]).choices[0].message.content or ""
    assert whole.startswith(text + "Paris"), (text, whole)
    short = custom.chat.completions.create(model=CUSTOM, messages=CAPITAL, max_tokens=2)
    assert short.usage.completion_tokens == 2 and short.choices[0].finish_reason == "length", short
    print(f"\nwith the spec's sampling defaults: {text!r}; with the request's own: {whole!r}")
