"""Waiting at zero, honestly: a held OpenAI stream gets keep-alive comments before its first token
(and one error event when its model never wakes or its replica refuses it), Ollama's streams wait
silently and keep working, and a client turned away while a model wakes is told to come back when
the gateway's own record of that model's wakes says it should be up.

The gateway runs in this process (its state readable) in front of real sidecar processes before the
replay upstream (vLLM's recorded bytes), and in one test before a real llama.cpp. Judged by what
the clients received and by the gateway's own counters and state, never by a client's clock: each
wait is for a state, with a bound."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from openai._streaming import SSEDecoder

from harness.in_process import serving_gateway_app
from harness.sidecar import (
    API_KEY,
    ENGINE_MODEL,
    Engine,
    SecretDir,
    Sidecar,
    free_ports,
    launch_sidecar,
    metric_value,
    private_sidecar,
    start_replay,
    stop_sidecar,
    wait_ready,
)
from modelserve.gateway.app import Dispatcher
from modelserve.gateway.cold_starts import retry_after_seconds
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.errors import FULL_RETRY_AFTER_SECONDS
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve_sandbox.processes import wait_until

HELLO = [{"role": "user", "content": "hi"}]
HOLD_SECONDS = 10  # long enough for every held request to be woken on a starved machine
KEEPALIVE_SECONDS = 0.2
MAX_HELD = 4
COMMENT = b": waiting for "


@dataclass
class Waking:
    base: str
    discovery: FixedDiscovery
    app: Dispatcher
    public: str  # a public sidecar's address
    private: str  # a private one's (key API_KEY)


def _model(namespace: str, replicas: list[str], public: bool = True, name: str = "tiny") -> Model:
    pods = {address: f"{namespace}-pod-{i}" for i, address in enumerate(replicas)}
    ring = Ring(replicas) if replicas else None
    return Model(namespace, name, public, replicas=tuple(replicas), pods=pods, ring=ring)


@pytest.fixture(scope="module")
def waking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Waking]:
    base = tmp_path_factory.mktemp("waking")
    replay = start_replay()
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    sidecars: list[Sidecar] = []
    try:
        for env in ({"MODELSERVE_AUTH": "public"}, {"MODELSERVE_KEYS_DIR": str(base / "keys")}):
            sidecars.append(launch_sidecar(base / "logs", replay.url, "tiny", env))
        for sidecar in sidecars:
            wait_ready(sidecar)
        public, private = (s.url.removeprefix("http://") for s in sidecars)
        discovery = FixedDiscovery([])
        (port,) = free_ports(1)
        settings = GatewaySettings.from_env(
            {
                "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
                "MODELSERVE_GATEWAY_HOLD_SECONDS": str(HOLD_SECONDS),
                "MODELSERVE_GATEWAY_MAX_HELD": str(MAX_HELD),
                "MODELSERVE_GATEWAY_HOLD_KEEPALIVE_SECONDS": str(KEEPALIVE_SECONDS),
            }
        )
        with serving_gateway_app(settings, discovery) as (url, app):
            yield Waking(url, discovery, app, public, private)
    finally:
        for sidecar in sidecars:
            stop_sidecar(sidecar)
        replay.stop()


class Streamed(threading.Thread):
    """A client reading a streamed answer as it comes: its status, headers and every body byte."""

    def __init__(self, url: str, body: dict[str, Any], key: str | None = API_KEY) -> None:
        super().__init__(daemon=True)
        self.url, self.request = url, body
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.status: int | None = None
        self.answer_headers: dict[str, str] = {}
        self.body = bytearray()
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.request, headers=self.headers, timeout=60) as answer:
                self.status = answer.status_code
                self.answer_headers = dict(answer.headers)
                for chunk in answer.iter_raw():
                    self.body += chunk
        except BaseException as exc:  # the test reads it: a cut stream raises here
            self.error = exc

    def received(self) -> bytes:
        return bytes(self.body)

    def comments(self) -> int:
        return self.received().count(COMMENT)

    def result(self, timeout: float = 60) -> bytes:
        self.join(timeout)
        assert not self.is_alive(), "the stream never ended"
        assert self.error is None, repr(self.error)
        return self.received()


@dataclass
class InThread:
    """A call made in a thread of its own (a client waiting on a held request); `result()` is its value."""

    call: Callable[[], Any]
    value: Any = None
    error: BaseException | None = None
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = self.call()
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float = 60) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.value


def _serve(waking: Waking, model: Model) -> None:
    """Put `model` in the gateway's table and wait until its directory has it (the watches' events
    reach the gateway's loop a moment later)."""
    waking.discovery.update(model)
    wait_until(lambda: waking.app.proxy.directory.models.get(model.key) == model, 10, f"{model.key} in the gateway")


def _metric(waking: Waking, sample: str) -> float:
    return metric_value(httpx.get(waking.base + "/metrics", timeout=10).text, sample)


def _keepalives(waking: Waking, namespace: str, model: str = "tiny") -> float:
    return _metric(waking, f'modelserve_gateway_hold_keepalives_total{{model="{model}",namespace="{namespace}"}}')


def _held(waking: Waking, namespace: str) -> int:
    held = httpx.get(f"{waking.base}/held", timeout=5).json()["held"]
    return sum(entry["requests"] for entry in held if entry["namespace"] == namespace)


def _chat(waking: Waking, model: str, **extra: object) -> httpx.Response:
    return httpx.post(
        f"{waking.base}/v1/chat/completions",
        json={"model": model, "messages": HELLO, **extra},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )


def _events(body: bytes) -> list[str]:
    """The data of each event in a stream, as the openai SDK's decoder reads it (comments skipped)."""
    return [sse.data for sse in SSEDecoder().iter_bytes(iter([body]))]


def _split_comments(body: bytes) -> tuple[int, bytes]:
    """(how many keep-alive comments open the stream, the rest), checking each is a whole comment."""
    count = 0
    while body.startswith(COMMENT):
        line, _, body = body.partition(b"\n\n")
        assert line.startswith(COMMENT) and line.endswith(b" s so far)") and b"\n" not in line, line
        count += 1
    return count, body


def _ollama_contents(body: bytes) -> str:
    """The text of an Ollama NDJSON stream, checking that every line is JSON (no blank one)."""
    lines = body.split(b"\n")
    assert lines[-1] == b"" and all(lines[:-1]), body[:200]
    return "".join(json.loads(line)["message"]["content"] for line in lines[:-1])


def test_a_held_stream_gets_keepalives_before_its_first_chunk_and_ollama_waits_silently(waking: Waking) -> None:
    _serve(waking, _model("w", []))
    base = waking.base
    try:
        stream = Streamed(f"{base}/v1/chat/completions", {"model": "w/tiny", "messages": HELLO, "stream": True})
        ollama_raw = Streamed(f"{base}/api/chat", {"model": "w/tiny", "messages": HELLO})  # streams by default
        ollama_client = ollama.Client(host=base, headers={"Authorization": f"Bearer {API_KEY}"})

        def ollama_stream() -> str:
            return "".join(p.message.content or "" for p in ollama_client.chat("w/tiny:latest", HELLO, stream=True))

        ollama_parts = InThread(ollama_stream)
        plain = InThread(lambda: _chat(waking, "w/tiny"))
        wait_until(lambda: _held(waking, "w") == 4, 15, "the four requests held")
        seen = stream.comments()
        wait_until(lambda: stream.comments() >= seen + 2, 15, "two more keep-alives at the stream's client")
        # Two keep-alive intervals on, the stream has its head and comments only; Ollama's, nothing.
        assert stream.status == 200 and stream.answer_headers["content-type"].startswith("text/event-stream")
        received = stream.received()
        assert _split_comments(received[: received.rfind(b"\n\n") + 2])[1] == b""  # a whole comment each
        assert ollama_raw.status is None and ollama_raw.received() == b""
        assert _held(waking, "w") == 4
        waking.discovery.update(_model("w", [waking.public]))  # a replica turned Ready
        body = stream.result()
        ollama_body = ollama_raw.result()
        streamed_by_ollama = ollama_parts.result()
        answer = plain.result()
        # The stream: comments, then the model's own events, as an unheld stream gets them.
        comments, rest = _split_comments(body)
        assert comments >= 2 and COMMENT not in rest and rest.startswith(b"data: ")
        assert _keepalives(waking, "w") == comments  # the gateway's count: every one arrived
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={"model": "w/tiny", "messages": HELLO, "stream": True}
        ) as unheld:
            assert _events(b"".join(unheld.iter_raw())) == _events(rest)
        assert _events(rest)[-1] == "[DONE]"
        # Ollama's: every line JSON from the first, and the ollama client's stream as an unheld one's.
        assert ollama_raw.status == 200 and _ollama_contents(ollama_body)
        assert streamed_by_ollama and streamed_by_ollama == ollama_stream()
        # The plain request: held silently, answered whole.
        assert answer.status_code == 200 and answer.headers["x-modelserve-replica"] == "w-pod-0"
        assert answer.json()["choices"]
        assert _held(waking, "w") == 0
    finally:
        waking.discovery.update(("w", "tiny"))


def test_the_openai_sdk_streams_through_a_hold(waking: Waking) -> None:
    _serve(waking, _model("s", []))
    client = openai.OpenAI(base_url=waking.base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)

    def tokens() -> list[str | None]:
        stream = client.chat.completions.create(model="s/tiny", messages=HELLO, stream=True)
        return [chunk.choices[0].delta.content for chunk in stream if chunk.choices]

    try:
        held = InThread(tokens)
        wait_until(lambda: _keepalives(waking, "s") >= 3, 15, "keep-alives sent to the SDK's stream")
        assert _held(waking, "s") == 1
        waking.discovery.update(_model("s", [waking.public]))
        streamed = held.result()
        assert streamed == tokens() and "".join(t or "" for t in streamed)
    finally:
        waking.discovery.update(("s", "tiny"))


def test_a_held_stream_whose_model_never_wakes_ends_with_an_error_event(waking: Waking) -> None:
    """The head went out with the first keep-alive: the hold's 503 comes as an event in OpenAI's
    error shape, and the stream ends (no [DONE]); the openai SDK raises it."""
    _serve(waking, _model("t", []))
    base = waking.base
    timeouts = 'modelserve_gateway_hold_seconds_count{model="tiny",namespace="t",outcome="timeout"}'
    errors = 'modelserve_gateway_requests_total{model="tiny",namespace="t",status_class="5xx"}'
    before = (_metric(waking, timeouts), _metric(waking, errors))
    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)

    def sdk() -> list[Any]:
        return list(client.chat.completions.create(model="t/tiny", messages=HELLO, stream=True))

    try:
        chat = Streamed(f"{base}/v1/chat/completions", {"model": "t/tiny", "messages": HELLO, "stream": True})
        completion = Streamed(f"{base}/v1/completions", {"model": "t/tiny", "prompt": "hi", "stream": True})
        by_sdk = InThread(sdk)
        for stream in (chat, completion):
            comments, rest = _split_comments(stream.result(HOLD_SECONDS + 30))
            assert stream.status == 200 and comments >= 1
            (event,) = _events(rest)
            error = json.loads(event)["error"]
            assert (error["code"], error["type"]) == ("model_starting", "server_error")
            assert error["message"].startswith("No replica of 'tiny' became ready within 10 s")
            assert error["message"].endswith("Retry in 30 s.")  # its Retry-After: no wake of it seen
        with pytest.raises(openai.APIError) as raised:
            by_sdk.result(HOLD_SECONDS + 30)
        assert raised.value.message.startswith("No replica of 'tiny'") and raised.value.code == "model_starting"
        after = (_metric(waking, timeouts), _metric(waking, errors))
        assert (after[0] - before[0], after[1] - before[1]) == (3, 3)  # the status the gateway counts: 503
    finally:
        waking.discovery.update(("t", "tiny"))


def test_a_held_stream_its_replica_refuses_gets_the_refusal_as_its_error_event(waking: Waking) -> None:
    """Once its head was sent, a 401 (a made-up key a replica refuses) or an engine's 400 comes as
    the stream's error event, the replica's own error object."""
    _serve(waking, _model("p", [], public=False))
    refused = 'modelserve_gateway_requests_total{model="tiny",namespace="p",status_class="4xx"}'
    before = _metric(waking, refused)
    url = f"{waking.base}/v1/chat/completions"
    try:
        made_up = Streamed(url, {"model": "p/tiny", "messages": HELLO, "stream": True}, "sk-" + secrets.token_hex(8))
        too_long = Streamed(url, {"model": "p/tiny", "messages": HELLO, "stream": True, "max_tokens": 100000})
        wait_until(lambda: made_up.comments() and too_long.comments(), 15, "a keep-alive at each client")
        waking.discovery.update(_model("p", [waking.private], public=False))
        for stream, code, param in ((made_up, "invalid_api_key", None), (too_long, 400, "max_tokens")):
            comments, rest = _split_comments(stream.result())
            assert stream.status == 200 and comments >= 1
            (event,) = _events(rest)
            error = json.loads(event)["error"]
            assert (error["code"], error["param"]) == (code, param), error
        assert _metric(waking, refused) - before == 2
    finally:
        waking.discovery.update(("p", "tiny"))


def _allowed(observed: list[float], since: float, until: float, fallback: float) -> set[int]:
    """Every Retry-After the rule gives while the wake had lasted between `since` and `until` s."""
    return {retry_after_seconds(observed, since + (until - since) * i / 200, fallback) for i in range(201)}


def test_retry_after_comes_from_the_wakes_the_gateway_saw(waking: Waking) -> None:
    key = ("r", "tiny")
    cold_starts = waking.app.proxy.holding.cold_starts
    wakes = 'modelserve_gateway_wake_seconds_{}{{model="tiny",namespace="r"}}'
    _serve(waking, _model("r", []))
    pool = ThreadPoolExecutor(8)
    try:
        # No wake seen yet: the fixed value.
        stream = Streamed(f"{waking.base}/v1/chat/completions", {"model": "r/tiny", "messages": HELLO, "stream": True})
        held = [pool.submit(_chat, waking, "r/tiny") for _ in range(MAX_HELD - 1)]
        wait_until(lambda: _held(waking, "r") == MAX_HELD, 15, "the queue full")
        full = _chat(waking, "r/tiny")
        assert (full.status_code, full.headers["retry-after"]) == (429, str(FULL_RETRY_AFTER_SECONDS))
        # A wake of at least 15 keep-alive intervals, by the gateway's count, then a replica.
        wait_until(lambda: _keepalives(waking, "r") >= 15, 30, "15 keep-alives while the model wakes")
        waking.discovery.update(_model("r", [waking.public]))
        assert [f.result(60).status_code for f in held] == [200] * (MAX_HELD - 1)
        assert _events(_split_comments(stream.result())[1])[-1] == "[DONE]"
        (first,) = cold_starts.observed(key)
        assert first > 14 * KEEPALIVE_SECONDS
        assert _metric(waking, wakes.format("count")) == 1
        assert _metric(waking, wakes.format("sum")) == pytest.approx(first)
        # At zero again: a client turned away while it wakes is told the rest of a typical wake.
        _serve(waking, _model("r", []))
        held = [pool.submit(_chat, waking, "r/tiny") for _ in range(MAX_HELD)]
        wait_until(lambda: _held(waking, "r") == MAX_HELD, 15, "the queue full again")
        since = cold_starts.waking_for(key, time.monotonic())  # the gateway's clock (this process's)
        full = _chat(waking, "r/tiny")
        until = cold_starts.waking_for(key, time.monotonic())
        assert since is not None and until is not None
        assert full.status_code == 429
        assert int(full.headers["retry-after"]) in _allowed([first], since, until, FULL_RETRY_AFTER_SECONDS)
        waking.discovery.update(_model("r", [waking.public]))
        assert [f.result(60).status_code for f in held] == [200] * MAX_HELD
        assert len(cold_starts.observed(key)) == 2 and _metric(waking, wakes.format("count")) == 2
    finally:
        pool.shutdown(wait=True)
        waking.discovery.update(key)
    wait_until(lambda: cold_starts.observed(key) == [], 10, "a deleted model's wakes to go with it")


def test_a_real_engine_streams_a_completion_through_a_hold(waking: Waking, engine: Engine, tmp_path: Path) -> None:
    """The openai SDK's completion stream, held, then answered by llama.cpp (gemma-3 270M)."""
    key = ("e", ENGINE_MODEL)
    client = openai.OpenAI(base_url=waking.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def texts() -> list[str]:
        stream = client.completions.create(
            model=f"e/{ENGINE_MODEL}", prompt="The lighthouse keeper", max_tokens=8, stream=True
        )
        return [chunk.choices[0].text for chunk in stream if chunk.choices]

    with private_sidecar(engine.url, tmp_path, 8) as sidecar:
        _serve(waking, _model("e", [], public=False, name=ENGINE_MODEL))
        try:
            held = InThread(texts)
            wait_until(lambda: _keepalives(waking, *key) >= 3, 15, "keep-alives sent to the SDK's stream")
            waking.discovery.update(_model("e", [sidecar.url.removeprefix("http://")], public=False, name=ENGINE_MODEL))
            streamed = held.result(120)
            assert "".join(streamed) and streamed == texts()  # temperature 0: the same tokens
        finally:
            waking.discovery.update(key)
