"""The gateway's endpoint picker (MODELSERVE_GATEWAY_PICKER_PORT, gateway/picker.py), driven as a data
plane drives it: a real gRPC client built from Envoy's own protos (xds-protos) opens one ext_proc
stream per request, sends the request headers and the body in FULL_DUPLEX_STREAMED pieces, and reads
the pick (header mutation and dynamic metadata), the body streamed back, and the answers to the
response's messages.

The gateway runs in this process (its state readable) before a fixed table of models (FixedDiscovery)
the tests change as the watches would. Most replicas are addresses where nothing needs to answer: the
picker only picks. One test sends the request to the picked endpoint itself, a real sidecar before
the replay engine, as the data plane would. Judged by the gateway's own counters and states, each
waited for with a bound, never by a client's clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.in_process import serving_gateway_app
from harness.picker_client import (
    CALL_SECONDS,
    DESTINATION,
    HELLO,
    SUBSET,
    Stream,
    body_pieces,
    chat,
    picked,
    refused,
    request_headers,
)
from harness.sidecar import free_ports, launch_sidecar, metric_value, start_replay, stop_sidecar, wait_ready
from modelserve.gateway.app import Dispatcher
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.picker import SERVICE_NAME
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve.gateway.versions import Guard
from modelserve_sandbox.processes import wait_until

WAIT_SECONDS = 15
# Addresses nothing listens on: the picker only names them.
A, B, C = "127.0.0.1:9", "127.0.0.2:9", "127.0.0.3:9"


def _model(name: str, replicas: list[str], namespace: str = "team", **fields: Any) -> Model:
    pods = {address: f"{name}-pod-{i}" for i, address in enumerate(replicas)}
    ring = Ring(replicas) if replicas else None
    return Model(namespace, name, True, replicas=tuple(replicas), pods=pods, ring=ring, **fields)


@dataclass
class Gateway:
    url: str
    picker: str  # host:port of the ext_proc service
    app: Dispatcher
    discovery: FixedDiscovery

    def held(self, namespace: str, name: str) -> int:
        return self.app.proxy.holding.count((namespace, name))

    def in_flight(self, replica: str) -> int:
        return self.app.proxy.in_flight.get(replica, 0)

    def picks(self) -> int:
        assert self.app.picker is not None
        return self.app.picker.picker.picks

    def metric(self, sample: str) -> float:
        return metric_value(httpx.get(self.url + "/metrics", timeout=10).text, sample)


@contextmanager
def gateway(models: list[Model], **env: str) -> Iterator[Gateway]:
    listen, picker = free_ports(2)
    discovery = FixedDiscovery(models)
    settings = GatewaySettings.from_env(
        {
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(listen),
            "MODELSERVE_GATEWAY_PICKER_PORT": str(picker),
            "MODELSERVE_GATEWAY_HOLD_SECONDS": "20",
            **env,
        }
    )
    with serving_gateway_app(settings, discovery) as (url, app):
        assert app.picker is not None
        yield Gateway(url, f"127.0.0.1:{picker}", app, discovery)
    assert app.picker is None  # stopped with the app


@pytest.fixture(scope="module")
def served() -> Iterator[Gateway]:
    """One gateway for the tests that change no model: two replicas, one of them a sidecar serving
    TLS, a served name with two versions, and one model at zero that nothing wakes."""
    models = [
        _model("chat", [A, B]),
        _model("secure", ["https://127.0.0.4:8443"]),
        _model("v1", [C], served_as="assistant", weight=100),
        _model("v2", [A], served_as="assistant", weight=0),
    ]
    with gateway(models) as started:
        yield started


def pick_once(gateway: Gateway, body: bytes, **headers: Any) -> str:
    """A whole request through the picker: picked, body back, answered, closed; the endpoint."""
    stream = Stream(gateway.picker)
    try:
        endpoint = picked(stream.request(body, **headers))
        stream.body_back()
        stream.respond()
    finally:
        stream.close()
    return endpoint


def settled(gateway: Gateway) -> None:
    """Every pick given back: nothing in flight through the picker."""
    wait_until(lambda: gateway.picks() == 0 and not gateway.app.proxy.in_flight, WAIT_SECONDS, "picks released")


# --- the pick ---------------------------------------------------------------------------------------


def test_a_pick_names_one_replica_in_header_and_metadata_and_streams_the_body_back(served: Gateway) -> None:
    body = chat(temperature=0.5, padding="x" * 200_000)  # several chunks back (64 KiB each at most)
    stream = Stream(served.picker)
    try:
        first = stream.request(body)
        endpoint = picked(first)
        assert endpoint in (A, B)
        mutation = first.request_headers.response.header_mutation
        assert set(mutation.remove_headers) >= {DESTINATION, SUBSET, DESTINATION + "-served"}
        assert stream.body_back() == body  # unchanged: the replica serves the name the client sent
        assert served.in_flight(endpoint) == 1 and served.picks() == 1
        headers_answer, body_answer = stream.respond(body=b"data: done\n\n")
        assert headers_answer.WhichOneof("response") == "response_headers"
        echoed = body_answer.response_body.response.body_mutation.streamed_response
        assert (echoed.body, echoed.end_of_stream) == (b"data: done\n\n", True)
        # The answer is complete: its replica has one request fewer, before the stream even ends.
        wait_until(lambda: served.in_flight(endpoint) == 0, WAIT_SECONDS, "the pick released")
    finally:
        stream.close()
    settled(served)
    assert served.metric('modelserve_gateway_picker_streams_total{outcome="picked"}') >= 1
    assert (
        served.metric(
            'modelserve_gateway_routing_decisions_total{decision="least_in_flight",model="chat",namespace="team"}'
        )
        >= 1
    )


def test_a_clients_own_destination_header_is_removed_and_never_decides(served: Gateway) -> None:
    for _ in range(4):
        stream = Stream(served.picker)
        try:
            first = stream.request(chat(), extra={DESTINATION: "10.9.9.9:80", SUBSET: "10.9.9.9:80"})
            endpoint = picked(first)
            assert endpoint in (A, B)
            mutation = first.request_headers.response.header_mutation
            assert DESTINATION in mutation.remove_headers and SUBSET in mutation.remove_headers
            assert "10.9.9.9" not in str(first)
            stream.body_back()
        finally:
            stream.close()
    settled(served)


def test_a_tls_replica_is_named_by_its_address_alone(served: Gateway) -> None:
    assert pick_once(served, chat("secure")) == "127.0.0.4:8443"


def test_versions_pick_by_weight_and_the_body_names_the_version(served: Gateway) -> None:
    stream = Stream(served.picker)
    try:
        first = stream.request(chat("assistant"))
        assert picked(first) == C  # v1 has all the weight
        assert "content-length" in first.request_headers.response.header_mutation.remove_headers
        assert json.loads(stream.body_back())["model"] == "v1"  # the replica serves its own name
    finally:
        stream.close()
    settled(served)


def test_a_versions_answers_passed_back_by_the_data_plane_trip_its_guard() -> None:
    """The statuses the data plane passes back are judged for a version's rollback guard as the
    gateway's own answers are: two 500s trip a guard of 10% over 10, and its served name then takes
    no new request through the picker (the stable version has no weight: 503 no_version_available)."""
    canary = _model("v2", [A], served_as="assistant", weight=100, guard=Guard(window=10, max_error_rate=0.1))
    with gateway([_model("v1", [C], served_as="assistant", weight=0), canary]) as served:
        for status in (200, 500, 500):
            stream = Stream(served.picker)
            try:
                assert picked(stream.request(chat("assistant"))) == A
                stream.body_back()
                stream.respond(status=status)
            finally:
                stream.close()
        settled(served)
        assert served.metric('modelserve_gateway_traffic_guard_trips_total{model="v2",namespace="team"}') == 1
        stream = Stream(served.picker)
        try:
            status, error, _ = refused(stream.request(chat("assistant")))
        finally:
            stream.close()
        assert (status, error["code"]) == (503, "no_version_available")
        assert httpx.get(served.url + "/guards", timeout=10).json()["guards"][0]["name"] == "v2"


def test_a_body_of_very_many_values_is_read_and_renamed_off_the_loop(served: Gateway) -> None:
    """Past json_body.MANY_VALUES the proxy reads a body in its helper process, and renames it there."""
    body = chat("assistant", logit_bias=dict.fromkeys(map(str, range(30_000)), 1))
    stream = Stream(served.picker)
    try:
        assert picked(stream.request(body)) == C
        back = stream.body_back()
    finally:
        stream.close()
    assert json.loads(back) == {**json.loads(body), "model": "v1"}
    assert served.metric('modelserve_gateway_bodies_read_off_loop_total{outcome="read"}') >= 1
    settled(served)


def test_the_subset_hint_is_honoured_and_none_fitting_is_503(served: Gateway) -> None:
    for namespace in ("envoy.lb.subset_hint", "envoy.lb"):
        for _ in range(3):
            assert pick_once(served, chat(), subset=[B], subset_namespace=namespace) == B
    for subset in (["10.1.1.1:8000"], [], ["127.0.0.4:8443"]):
        stream = Stream(served.picker)
        try:
            status, error, headers = refused(stream.request(chat(), subset=subset))
        finally:
            stream.close()
        assert status == 503 and error["code"] == "no_endpoint_in_subset"
        assert headers["content-type"] == "application/json" and "retry-after" in headers
    settled(served)
    assert served.metric('modelserve_gateway_picker_streams_total{outcome="no_endpoint_in_subset"}') >= 3


KEY = {"authorization": "Bearer sk-some-key"}


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (json.dumps({"messages": HELLO}).encode(), {}, 400, "missing_model"),
        (b"{not json", {}, 400, "invalid_json"),
        (b"[1, 2]", {}, 400, "invalid_json"),
        (chat("nobody-serves-this"), KEY, 404, "model_not_found"),
        # As the gateway's proxy answers: without a key, which private models exist stays unsaid.
        (chat("nobody-serves-this"), {}, 401, "missing_api_key"),
    ],
)
def test_a_request_the_gateway_cannot_route_is_answered_in_the_openai_shape(
    served: Gateway, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    stream = Stream(served.picker)
    try:
        answer_status, error, _ = refused(stream.request(body, extra=headers))
    finally:
        stream.close()
    assert (answer_status, error["code"]) == (status, code)
    assert served.metric(f'modelserve_gateway_picker_streams_total{{outcome="{code}"}}') >= 1


def test_a_request_with_no_body_is_400_as_the_gateway_answers_it(served: Gateway) -> None:
    stream = Stream(served.picker)
    try:
        stream.send(request_headers(end_of_stream=True))
        status, error, _ = refused(stream.next())
    finally:
        stream.close()
    assert (status, error["code"]) == (400, "invalid_json")  # the proxy's answer to an empty body


def test_a_body_past_the_gateways_limit_is_413() -> None:
    with gateway([_model("chat", [A])], MODELSERVE_GATEWAY_MAX_BODY_BYTES="1000") as small:
        stream = Stream(small.picker)
        try:
            status, error, _ = refused(stream.request(chat(padding="x" * 2000)))
        finally:
            stream.close()
        assert (status, error["code"]) == (413, "body_too_large")


# --- least in flight, and the count's exactness -------------------------------------------------------


def test_least_in_flight_spreads_open_streams_and_refills_the_freed_replica() -> None:
    with gateway([_model("chat", [A, B])]) as gw:
        first, second = Stream(gw.picker), Stream(gw.picker)
        try:
            one = picked(first.request(chat()))
            first.body_back()
            two = picked(second.request(chat()))
            second.body_back()
            assert {one, two} == {A, B}
            assert gw.in_flight(A) == gw.in_flight(B) == 1
            first.respond()
            first.close()
            wait_until(lambda: gw.in_flight(one) == 0, WAIT_SECONDS, "the first pick released")
            third = Stream(gw.picker)
            try:
                assert picked(third.request(chat())) == one  # the freed replica, the other still busy
            finally:
                third.cancel()
        finally:
            second.cancel()
        settled(gw)
        # A stream reset mid-request (its client gone) released its pick too.
        assert gw.in_flight(A) == gw.in_flight(B) == 0


# --- holding at zero ----------------------------------------------------------------------------------


def test_a_model_at_zero_is_held_then_picked_when_a_replica_is_ready() -> None:
    with gateway([_model("sleepy", [])]) as gw:
        stream = Stream(gw.picker)
        try:
            stream.send(request_headers(), *body_pieces(chat("sleepy")))
            wait_until(lambda: gw.held("team", "sleepy") == 1, WAIT_SECONDS, "the stream held")
            # The demand the operator reads to wake it.
            entries = httpx.get(gw.url + "/held", timeout=10).json()["held"]
            assert [(e["name"], e["requests"]) for e in entries] == [("sleepy", 1)]
            gw.discovery.update(_model("sleepy", [B]))  # a replica turned Ready
            assert picked(stream.next()) == B
            assert stream.body_back() == chat("sleepy")
            assert gw.held("team", "sleepy") == 0
        finally:
            stream.close()
        settled(gw)


def test_a_hold_that_times_out_is_503_model_starting() -> None:
    with gateway([_model("sleepy", [])], MODELSERVE_GATEWAY_HOLD_SECONDS="0.5") as gw:
        stream = Stream(gw.picker)
        try:
            status, error, headers = refused(stream.request(chat("sleepy")))
        finally:
            stream.close()
        assert (status, error["code"]) == (503, "model_starting") and "retry-after" in headers
        assert gw.held("team", "sleepy") == 0
        assert gw.metric('modelserve_gateway_picker_streams_total{outcome="model_starting"}') == 1


def test_a_full_hold_queue_is_429_and_a_held_client_that_goes_leaves_it() -> None:
    with gateway([_model("sleepy", [])], MODELSERVE_GATEWAY_MAX_HELD="1") as gw:
        waiting = Stream(gw.picker)
        try:
            waiting.send(request_headers(), *body_pieces(chat("sleepy")))
            wait_until(lambda: gw.held("team", "sleepy") == 1, WAIT_SECONDS, "the first stream held")
            stream = Stream(gw.picker)
            try:
                status, error, headers = refused(stream.request(chat("sleepy")))
            finally:
                stream.close()
            assert (status, error["code"]) == (429, "hold_queue_full") and "retry-after" in headers
        finally:
            waiting.cancel()
        wait_until(lambda: gw.held("team", "sleepy") == 0, WAIT_SECONDS, "the gone stream unheld")
        wait_until(
            lambda: gw.metric('modelserve_gateway_picker_streams_total{outcome="client_gone"}') == 1,
            WAIT_SECONDS,
            "the gone stream counted",
        )


# --- health, and streams out of order ---------------------------------------------------------------


def test_the_health_service_answers_serving(served: Gateway) -> None:
    with grpc.insecure_channel(served.picker) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def serving(service: str) -> bool:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            return answer.status == health_pb2.HealthCheckResponse.SERVING

        for service in ("", "liveness", "readiness", SERVICE_NAME):
            wait_until(lambda service=service: serving(service), WAIT_SECONDS, f"{service or 'overall'} SERVING")


@pytest.mark.parametrize(
    "messages",
    [
        [pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))],  # no headers first
        [request_headers(), pb.ProcessingRequest(response_headers=pb.HttpHeaders())],  # a response before any pick
        [pb.ProcessingRequest(response_body=pb.HttpBody(body=b"\xff\x00garbage", end_of_stream=True))],
        [pb.ProcessingRequest()],  # nothing in it
        [request_headers(), request_headers()],
    ],
)
def test_a_stream_out_of_order_is_ended_and_the_next_one_is_served(
    served: Gateway, messages: list[pb.ProcessingRequest]
) -> None:
    stream = Stream(served.picker)
    stream.send(*messages)
    with pytest.raises(grpc.RpcError) as raised:
        stream.close()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert pick_once(served, chat()) in (A, B)
    settled(served)


def test_bytes_that_are_no_message_do_not_stop_the_picker(served: Gateway) -> None:
    with grpc.insecure_channel(served.picker) as channel:
        raw = channel.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError):
            list(raw(iter([b"\xff\xff\xff\xff not a protobuf"]), timeout=CALL_SECONDS))
    assert pick_once(served, chat()) in (A, B)
    settled(served)


def test_a_stream_cut_before_its_body_ended_holds_nothing(served: Gateway) -> None:
    stream = Stream(served.picker)
    stream.send(request_headers(), body_pieces(chat(), 3)[0])
    wait_until(
        lambda: served.app.picker is not None and served.app.picker.picker.buffered > 0, WAIT_SECONDS, "a piece held"
    )
    stream.cancel()
    assert served.app.picker is not None
    wait_until(lambda: served.app.picker.picker.buffered == 0, WAIT_SECONDS, "its bytes given back")  # type: ignore[union-attr]
    settled(served)


# --- a real replica -------------------------------------------------------------------------------------


def test_the_picked_endpoint_is_a_sidecar_that_answers(tmp_path: Any) -> None:
    replay = start_replay()
    sidecar = launch_sidecar(tmp_path / "logs", replay.url, "tiny", {"MODELSERVE_AUTH": "public"})
    try:
        wait_ready(sidecar)
        address = sidecar.url.removeprefix("http://")
        with gateway([_model("tiny", [address])]) as gw:
            stream = Stream(gw.picker)
            try:
                endpoint = picked(stream.request(chat("tiny")))
                body = stream.body_back()
                # The data plane's part: the request to the endpoint named, its answer through the stream.
                answer = httpx.post(f"http://{endpoint}/v1/chat/completions", content=body, timeout=30)
                assert answer.status_code == 200 and answer.json()["choices"]
                _, body_answer = stream.respond(answer.status_code, answer.content)
                assert body_answer.response_body.response.body_mutation.streamed_response.body == answer.content
            finally:
                stream.close()
            settled(gw)
    finally:
        stop_sidecar(sidecar)
        replay.stop()


def test_without_the_setting_nothing_listens() -> None:
    (listen,) = free_ports(1)
    settings = GatewaySettings.from_env({"MODELSERVE_GATEWAY_LISTEN_PORT": str(listen)})
    assert settings.picker_port == 0
    with serving_gateway_app(settings, FixedDiscovery([])) as (_, app):
        assert app.picker is None
