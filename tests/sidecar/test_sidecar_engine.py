"""End to end: the OpenAI SDK -> the sidecar process -> a real llama.cpp server running a real GGUF model
(gemma-3 270M) on this CPU."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from harness.sidecar import (
    API_KEY,
    ENGINE_MODEL,
    Engine,
    Sidecar,
    assert_refused_here,
    free_ports,
    launch_engine,
    metric_value,
    private_sidecar,
    raw_request,
    refused_routes,
    stop_process,
    wait_ready,
    wait_until,
)
from modelserve.contracts.sidecar import OWN_ROUTES
from modelserve.engines import llamacpp

DEFAULT_MAX_TOKENS = 4  # the sidecar's sampling default: short answers keep the tests fast
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
AUTH = {"Authorization": f"Bearer {API_KEY}"}
JSON = {"Content-Type": "application/json"}
# Gemma 3's end tokens (<eos> 1, <end_of_turn> 106) banned, so a generation runs to max_tokens.
NO_END = {"1": -100, "106": -100}


@pytest.fixture(scope="module")
def sidecar(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with private_sidecar(
        engine.url, tmp_path_factory.mktemp("engine-sidecar"), DEFAULT_MAX_TOKENS, MODELSERVE_MAX_BODY_BYTES="65536"
    ) as running:
        yield running


def bearer_client(sidecar: Sidecar) -> openai.OpenAI:
    return openai.OpenAI(base_url=sidecar.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def key_client(sidecar: Sidecar) -> openai.OpenAI:
    # default_headers replace the SDK's own `Authorization: Bearer <api_key>`.
    return openai.OpenAI(
        base_url=sidecar.url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
        default_headers={"Authorization": f"Key {API_KEY}"},
    )


def test_sync_chat_with_a_bearer_key(sidecar: Sidecar) -> None:
    answer = bearer_client(sidecar).chat.completions.create(
        model=ENGINE_MODEL, messages=PROMPT, max_tokens=6, logit_bias=NO_END
    )
    assert answer.model == ENGINE_MODEL and answer.choices[0].message.content
    # The request's own max_tokens wins over the sidecar's default.
    assert answer.usage.completion_tokens == 6 and answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens > 0


def test_sampling_default_reaches_the_engine(sidecar: Sidecar) -> None:
    answer = key_client(sidecar).chat.completions.create(model=ENGINE_MODEL, messages=PROMPT, logit_bias=NO_END)
    assert answer.usage.completion_tokens == DEFAULT_MAX_TOKENS and answer.choices[0].finish_reason == "length"


def test_sync_stream_with_a_key_header(sidecar: Sidecar) -> None:
    stream = key_client(sidecar).chat.completions.create(
        model=ENGINE_MODEL, messages=PROMPT, stream=True, logit_bias=NO_END
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "length"


def test_async_chat_and_stream(sidecar: Sidecar) -> None:
    async def run() -> tuple[str, str]:
        clients = [
            openai.AsyncOpenAI(base_url=sidecar.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120),
            openai.AsyncOpenAI(
                base_url=sidecar.url + "/v1",
                api_key="unused",
                max_retries=0,
                timeout=120,
                default_headers={"Authorization": f"key {API_KEY}"},
            ),
        ]
        try:
            answer = await clients[0].chat.completions.create(model=ENGINE_MODEL, messages=PROMPT, logit_bias=NO_END)
            stream = await clients[1].chat.completions.create(
                model=ENGINE_MODEL, messages=PROMPT, stream=True, logit_bias=NO_END
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return answer.choices[0].message.content, streamed
        finally:
            for client in clients:
                await client.close()

    answered, streamed = asyncio.run(run())
    assert answered
    assert answered == streamed  # temperature 0 (a sampling default): the same tokens either way


def test_completions_and_model_list(sidecar: Sidecar) -> None:
    client = bearer_client(sidecar)
    assert ENGINE_MODEL in [m.id for m in client.models.list()]
    answer = client.completions.create(model=ENGINE_MODEL, prompt="The capital of France is", logit_bias=NO_END)
    assert answer.usage.completion_tokens == DEFAULT_MAX_TOKENS and answer.choices[0].text


def test_wrong_key_is_an_authentication_error(sidecar: Sidecar) -> None:
    client = openai.OpenAI(base_url=sidecar.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model=ENGINE_MODEL, messages=PROMPT)
    assert caught.value.status_code == 401
    assert caught.value.body == {
        "message": "Invalid API key.",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }


def test_image_to_a_text_model_is_a_bad_request(sidecar: Sidecar) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        bearer_client(sidecar).chat.completions.create(
            model=ENGINE_MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg=="}},
                    ],
                }
            ],
        )
    assert caught.value.body["message"] == f"{ENGINE_MODEL} is not a multimodal model"


def test_metrics_count_the_real_engine_traffic(sidecar: Sidecar) -> None:
    before = sidecar.metrics()
    bearer_client(sidecar).chat.completions.create(model=ENGINE_MODEL, messages=PROMPT, logit_bias=NO_END)
    after = sidecar.metrics()
    route = 'route="/v1/chat/completions"'
    assert (
        metric_value(after, f'modelserve_sidecar_requests_total{{{route},status_class="2xx"}}')
        == metric_value(before, f'modelserve_sidecar_requests_total{{{route},status_class="2xx"}}') + 1
    )
    assert (
        metric_value(after, "modelserve_sidecar_completion_tokens_total")
        == metric_value(before, "modelserve_sidecar_completion_tokens_total") + DEFAULT_MAX_TOKENS
    )
    assert metric_value(after, 'modelserve_sidecar_warmup_requests_total{outcome="ok"}') == 1
    assert API_KEY not in after and API_KEY not in sidecar.logs()


def test_load_reports_streams_in_flight_and_arrivals_not_refusals(sidecar: Sidecar) -> None:
    def load() -> dict:
        answer = httpx.get(sidecar.url + "/load", timeout=10)  # no key: the operator's autoscaler reads it
        answer.raise_for_status()
        return answer.json()

    before = load()
    httpx.post(sidecar.url + "/v1/chat/completions", json={"model": ENGINE_MODEL, "messages": PROMPT}, timeout=30)
    assert load()["arrivals"] == before["arrivals"]  # a 401 wakes nothing up
    request = {"model": ENGINE_MODEL, "messages": PROMPT, "max_tokens": 1000, "stream": True, "logit_bias": NO_END}
    with httpx.stream("POST", sidecar.url + "/v1/chat/completions", json=request, headers=AUTH, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        during = load()
        assert during["inFlight"] >= 1 and during["arrivals"] == before["arrivals"] + 1, (before, during)
        assert during["secondsSinceArrival"] is not None and during["secondsSinceArrival"] < 30
    # The sidecar sees the client go on its next read and only then lets the request go.
    wait_until(lambda: load()["inFlight"] == 0, 30, "the closed stream to leave the sidecar's count")


def test_refusals_over_raw_http(sidecar: Sidecar) -> None:
    chat = sidecar.url + "/v1/chat/completions"
    missing = httpx.post(chat, json={"model": ENGINE_MODEL, "messages": PROMPT}, timeout=30)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    assert missing.json()["error"]["code"] == "missing_api_key"
    malformed = httpx.post(chat, content=b'{"model": "x", "messages": [', headers=AUTH, timeout=30)
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    too_big = httpx.post(
        chat,
        json={"model": ENGINE_MODEL, "messages": [{"role": "user", "content": "x" * 70000}]},
        headers=AUTH,
        timeout=30,
    )
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"


def test_client_disconnect_stops_the_generation(engine: Engine, sidecar: Sidecar) -> None:
    request = {"model": ENGINE_MODEL, "messages": PROMPT, "max_tokens": 1000, "stream": True, "logit_bias": NO_END}
    with httpx.stream("POST", sidecar.url + "/v1/chat/completions", json=request, headers=AUTH, timeout=60) as stream:
        assert stream.status_code == 200
        next(stream.iter_raw())  # generation has started; hang up
    # llama-server notices the closed connection at its next token and cancels the task.
    wait_until(lambda: "cancel task" in engine.logs(), 30, "the engine to stop generating")


def test_sigterm_lets_a_real_stream_finish(engine: Engine, start_sidecar: Callable[..., Sidecar]) -> None:
    sidecar = start_sidecar(engine.url, ENGINE_MODEL, MODELSERVE_AUTH="public")
    request = {"model": ENGINE_MODEL, "messages": PROMPT, "max_tokens": 48, "stream": True, "logit_bias": NO_END}
    with httpx.stream("POST", sidecar.url + "/v1/chat/completions", json=request, timeout=60) as stream:
        chunks = stream.iter_raw()
        body = next(chunks)
        sidecar.process.send_signal(signal.SIGTERM)  # 47 tokens still to generate
        body += b"".join(chunks)
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    assert body.rstrip().endswith(b"data: [DONE]") and events[-1]["choices"][0]["finish_reason"] == "length"
    assert sidecar.process.wait(timeout=30) in (0, -signal.SIGTERM)


def test_readyz_follows_a_real_engine_starting(
    gguf_model: Path, tmp_path: Path, start_sidecar: Callable[..., Sidecar]
) -> None:
    (port,) = free_ports(1)
    sidecar = start_sidecar(f"http://127.0.0.1:{port}", ENGINE_MODEL, MODELSERVE_AUTH="public")
    before = httpx.get(sidecar.url + "/readyz", timeout=10)
    assert before.status_code == 503 and before.json()["ready"] is False
    starting = launch_engine(gguf_model, port, tmp_path)
    try:
        starting.wait_serving()
        wait_ready(sidecar)
        assert "warm-up request answered 200" in sidecar.logs()
    finally:
        stop_process(starting.process)
    wait_until(
        lambda: httpx.get(sidecar.url + "/readyz", timeout=10).status_code == 503,
        10,
        "readiness to drop with the engine gone",
    )


# Takes every route of llama-server that needs a body, with one token at most to generate.
ANY_BODY = json.dumps(
    {
        "model": ENGINE_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "prompt": "hi",
        "content": "hi",
        "input": "hi",
        "max_tokens": 1,
        "n_predict": 1,
        "max_output_tokens": 1,
    }
).encode()


def test_llama_cpp_routes_outside_the_allowlist_are_the_sidecars_404(engine: Engine, sidecar: Sidecar) -> None:
    refused = [route for route in refused_routes(f"llama.cpp-b{llamacpp.BUILD}") if route["path"] not in OWN_ROUTES]
    # Straight to the engine, the routes open by default answer: the holes the allowlist closes.
    for route in refused:
        if "enabled" not in route:
            direct = raw_request(engine.url, route["method"], route["path"], JSON, ANY_BODY)
            assert direct.status != 404, (route, direct)
    # llama-server b11434 logs no request any more (its request logger is commented out in
    # tools/server/server-http.cpp), so what arrives is read from its own counters: every refused route
    # that generates (completions, chat, responses, messages, infill, ...) would decode a token of
    # ANY_BODY. That the others never reach an engine the replay engine shows (test_allowlist_replay.py).
    before = _decodes(engine)
    for route in refused:
        answer = raw_request(sidecar.url, route["method"], route["path"], {**AUTH, **JSON}, ANY_BODY)
        assert_refused_here(answer, route["method"], route["path"])
    assert _decodes(engine) == before
    allowed = raw_request(sidecar.url, "POST", "/v1/completions", {**AUTH, **JSON}, ANY_BODY)
    assert allowed.status == 200 and allowed.json()["choices"]
    # The counters move for a request that arrives: they can tell.
    wait_until(lambda: _decodes(engine)["n_decode_total"] > before["n_decode_total"], 30, "the engine's decode count")


def _decodes(engine: Engine) -> dict[str, float]:
    """llama-server's counters of the work requests made it do (its /metrics, --metrics)."""
    wanted = ("n_decode_total", "prompt_tokens_total", "tokens_predicted_total")
    out = {}
    for line in httpx.get(engine.url + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name.removeprefix("llamacpp:") in wanted:
            out[name.removeprefix("llamacpp:")] = float(value)
    assert set(out) == set(wanted), out
    return out
