"""End to end: the Ollama Python client -> the sidecar's /api routes -> a real llama.cpp server running a
real GGUF model (gemma-3 270M) on this CPU."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import ollama
import openai
import pytest

from harness.sidecar import (
    API_KEY,
    ENGINE_MODEL,
    Engine,
    Sidecar,
    metric_value,
    private_sidecar,
    wait_until,
)

DEFAULT_MAX_TOKENS = 4  # the sidecar's sampling default, as in test_sidecar_engine.py
PROMPT = "Write a long story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": PROMPT}]
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()


@pytest.fixture(scope="module")
def sidecar(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with private_sidecar(
        engine.url, tmp_path_factory.mktemp("ollama-sidecar"), DEFAULT_MAX_TOKENS, MODELSERVE_MAX_BODY_BYTES="65536"
    ) as running:
        yield running


def client(sidecar: Sidecar, key: str | None = API_KEY) -> ollama.Client:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return ollama.Client(host=sidecar.url, headers=headers, timeout=120)


def test_chat_without_streaming_uses_the_sampling_defaults(sidecar: Sidecar) -> None:
    answer = client(sidecar).chat(model=ENGINE_MODEL, messages=MESSAGES, stream=False)
    assert answer.model == ENGINE_MODEL and answer.message.role == "assistant" and answer.message.content
    assert answer.done and answer.done_reason == "length"
    assert answer.eval_count == DEFAULT_MAX_TOKENS and answer.prompt_eval_count > 0
    assert answer.total_duration > 0 and answer.eval_duration > 0 and answer.load_duration == 0
    assert answer.created_at.endswith("Z")


def test_chat_stream_gives_the_same_text_as_one_answer_and_as_v1(sidecar: Sidecar) -> None:
    chunks = list(client(sidecar).chat(model=ENGINE_MODEL + ":latest", messages=MESSAGES, stream=True))
    assert len(chunks) > 1 and all(not c.done for c in chunks[:-1])
    last = chunks[-1]
    assert last.done and last.done_reason == "length" and last.eval_count == DEFAULT_MAX_TOKENS
    assert last.model == ENGINE_MODEL + ":latest"
    streamed = "".join(c.message.content for c in chunks)
    whole = client(sidecar).chat(model=ENGINE_MODEL, messages=MESSAGES, stream=False).message.content
    v1 = openai.OpenAI(base_url=sidecar.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    direct = v1.chat.completions.create(model=ENGINE_MODEL, messages=MESSAGES).choices[0].message.content
    assert streamed == whole == direct  # temperature 0 (a sampling default): the same tokens every way


def test_generate_with_and_without_streaming(sidecar: Sidecar) -> None:
    options = {"num_predict": 6, "temperature": 0, "seed": 1}
    whole = client(sidecar).generate(
        model=ENGINE_MODEL, prompt=PROMPT, system="Be brief.", options=options, stream=False
    )
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 6 and whole.response
    chunks = list(
        client(sidecar).generate(model=ENGINE_MODEL, prompt=PROMPT, system="Be brief.", options=options, stream=True)
    )
    assert "".join(c.response for c in chunks) == whole.response
    assert chunks[-1].done and chunks[-1].eval_count == 6 and chunks[-1].prompt_eval_count == whole.prompt_eval_count


def test_options_reach_the_engine(sidecar: Sidecar) -> None:
    c = client(sidecar)
    assert c.generate(model=ENGINE_MODEL, prompt=PROMPT, options={"num_predict": 9}, stream=False).eval_count == 9
    # -1 is Ollama's "unlimited": the request leaves max_tokens out and the sidecar's default applies.
    unlimited = c.generate(model=ENGINE_MODEL, prompt=PROMPT, options={"num_predict": -1}, stream=False)
    assert unlimited.eval_count == DEFAULT_MAX_TOKENS
    hot = {"temperature": 1.5, "top_k": 1000, "top_p": 1.0, "num_predict": 24}
    samples = {
        c.generate(model=ENGINE_MODEL, prompt=PROMPT, options=hot | {"seed": s}, stream=False).response
        for s in range(4)
    }
    assert len(samples) > 1  # the temperature reached the engine: not the default 0 any more
    seeded = {
        c.generate(model=ENGINE_MODEL, prompt=PROMPT, options=hot | {"seed": 7}, stream=False).response
        for _ in range(2)
    }
    assert len(seeded) == 1  # and so did the seed


def test_format_schema_constrains_the_answer(sidecar: Sidecar) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    answer = client(sidecar).chat(
        model=ENGINE_MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object with a name."}],
        format=schema,
        options={"num_predict": 64},
        stream=False,
    )
    assert answer.done_reason == "stop"
    assert isinstance(json.loads(answer.message.content)["name"], str)


def test_an_empty_generate_only_loads_the_model(sidecar: Sidecar) -> None:
    answer = client(sidecar).generate(model=ENGINE_MODEL, stream=False)
    assert answer.done and answer.done_reason == "load" and answer.response == ""


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("sk-wrong", "Invalid API key."),
        (None, "Missing API key: send 'Authorization: Bearer <key>' or 'Authorization: Key <key>'."),
    ],
)
def test_a_refused_key_is_a_response_error_401(sidecar: Sidecar, key: str | None, message: str) -> None:
    for call in (
        lambda c: c.chat(model=ENGINE_MODEL, messages=MESSAGES, stream=False),
        lambda c: list(c.generate(model=ENGINE_MODEL, prompt=PROMPT, stream=True)),
        lambda c: c.list(),
        lambda c: c.show("not-even-a-served-model"),  # 401 first: a stranger learns nothing of the model
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            call(client(sidecar, key))
        assert caught.value.status_code == 401 and caught.value.error == message


def test_tags_show_and_version(sidecar: Sidecar) -> None:
    c = client(sidecar)
    (listed,) = c.list().models
    assert listed.model == ENGINE_MODEL + ":latest" and listed.size > 0
    assert listed.details.parameter_size.endswith("M") and listed.details.format == "gguf"
    shown = c.show(ENGINE_MODEL)
    assert shown.capabilities == ["completion"] and shown.modelinfo["general.parameter_count"] > 0
    version = httpx.get(sidecar.url + "/api/version", headers=AUTH, timeout=30)
    assert version.status_code == 200 and version.json()["version"].startswith("0.6.0+modelserve.")
    (running,) = c.ps().models  # the one model, always loaded
    assert (running.model, running.size, running.size_vram) == (listed.model, listed.size, listed.size)
    assert running.expires_at is not None and running.expires_at.year == 2318


def test_an_unknown_model_is_not_found(sidecar: Sidecar) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client(sidecar).chat(model="llama3", messages=MESSAGES, stream=False)
    assert caught.value.status_code == 404 and caught.value.error == 'model "llama3" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as caught:
        client(sidecar).show("llama3")
    assert caught.value.status_code == 404 and caught.value.error == "model 'llama3' not found"


def test_images_to_a_text_model_are_refused(sidecar: Sidecar) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client(sidecar).chat(
            model=ENGINE_MODEL, messages=[{"role": "user", "content": "what is this", "images": [PNG]}], stream=False
        )
    assert caught.value.status_code == 400 and caught.value.error == f"{ENGINE_MODEL} is not a multimodal model"
    with pytest.raises(ollama.ResponseError) as caught:
        client(sidecar).generate(model=ENGINE_MODEL, prompt="what is this", images=[PNG], stream=False)
    assert caught.value.status_code == 400


def test_refusals_over_raw_http(sidecar: Sidecar) -> None:
    chat = sidecar.url + "/api/chat"
    too_big = httpx.post(
        chat,
        json={"model": ENGINE_MODEL, "messages": [{"role": "user", "content": "x" * 70000}]},
        headers=AUTH,
        timeout=30,
    )
    assert too_big.status_code == 413 and too_big.json() == {
        "error": "Request body is larger than the limit of 65536 bytes."
    }
    malformed = httpx.post(chat, content=b'{"model": ', headers=AUTH, timeout=30)
    assert malformed.status_code == 400 and "invalid JSON" in malformed.json()["error"]
    raw = httpx.post(
        sidecar.url + "/api/generate",
        json={"model": ENGINE_MODEL, "prompt": "x", "raw": True},
        headers=AUTH,
        timeout=30,
    )
    assert raw.status_code == 400 and raw.json()["error"].startswith("raw is not supported")
    # Outside the allowlist, as Ollama's own server answers it: 404, in Ollama's shape.
    wrong_method = httpx.get(chat, headers=AUTH, timeout=30)
    assert wrong_method.status_code == 404 and wrong_method.json() == {
        "error": "Invalid URL (GET /api/chat): not an inference route of this model."
    }
    pull = httpx.post(sidecar.url + "/api/pull", json={"model": ENGINE_MODEL}, headers=AUTH, timeout=30)
    assert pull.status_code == 404 and isinstance(pull.json()["error"], str)
    unauthenticated = httpx.post(chat, content=b'{"model": ', timeout=30)  # 401 before the body is looked at
    assert unauthenticated.status_code == 401 and unauthenticated.headers["www-authenticate"].startswith("Bearer")
    # No "stream" field: Ollama streams by default (its Python client always sends one).
    stream = httpx.post(chat, json={"model": ENGINE_MODEL, "messages": MESSAGES}, headers=AUTH, timeout=60)
    assert stream.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in stream.text.splitlines()]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]


def test_metrics_count_api_traffic(sidecar: Sidecar) -> None:
    def requests(text: str, route: str, status: str) -> float:
        return metric_value(text, f'modelserve_sidecar_requests_total{{route="{route}",status_class="{status}"}}')

    before = sidecar.metrics()
    client(sidecar).chat(model=ENGINE_MODEL, messages=MESSAGES, stream=False)
    list(client(sidecar).generate(model=ENGINE_MODEL, prompt=PROMPT, stream=True))
    with pytest.raises(ollama.ResponseError):
        client(sidecar, "sk-wrong").list()
    with pytest.raises(ollama.ResponseError):
        client(sidecar).chat(model="llama3", messages=MESSAGES, stream=False)
    after = sidecar.metrics()
    assert requests(after, "/api/chat", "2xx") == requests(before, "/api/chat", "2xx") + 1
    assert requests(after, "/api/generate", "2xx") == requests(before, "/api/generate", "2xx") + 1
    assert requests(after, "/api/tags", "4xx") == requests(before, "/api/tags", "4xx") + 1
    assert requests(after, "/api/chat", "4xx") == requests(before, "/api/chat", "4xx") + 1
    invalid = 'modelserve_sidecar_auth_failures_total{reason="invalid"}'
    assert metric_value(after, invalid) == metric_value(before, invalid) + 1
    tokens = "modelserve_sidecar_completion_tokens_total"
    assert metric_value(after, tokens) == metric_value(before, tokens) + 2 * DEFAULT_MAX_TOKENS  # usage of both


def test_load_counts_api_streams_in_flight(sidecar: Sidecar) -> None:
    def load() -> dict:
        answer = httpx.get(sidecar.url + "/load", timeout=10)
        answer.raise_for_status()
        return answer.json()

    before = load()
    request = {"model": ENGINE_MODEL, "messages": MESSAGES, "options": {"num_predict": 1000}}
    with httpx.stream("POST", sidecar.url + "/api/chat", json=request, headers=AUTH, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
        assert json.loads(next(lines))["done"] is False
        during = load()
        assert during["inFlight"] >= 1 and during["arrivals"] == before["arrivals"] + 1, (before, during)
    wait_until(lambda: load()["inFlight"] == 0, 30, "the stream to end")


def test_client_disconnect_stops_the_generation(engine: Engine, sidecar: Sidecar) -> None:
    cancelled = engine.logs().count("cancel task")
    request = {"model": ENGINE_MODEL, "prompt": PROMPT, "options": {"num_predict": 1000}}
    with httpx.stream("POST", sidecar.url + "/api/generate", json=request, headers=AUTH, timeout=60) as stream:
        assert stream.status_code == 200
        next(stream.iter_raw())  # generation has started; hang up
    # llama-server notices the closed connection at its next token and cancels the task.
    wait_until(lambda: engine.logs().count("cancel task") > cancelled, 30, "the engine to stop generating")
