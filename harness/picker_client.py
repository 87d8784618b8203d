"""A data plane's side of the endpoint picker protocol (gateway/picker.py), as Envoy's ext_proc filter
speaks it in FULL_DUPLEX_STREAMED mode: a real gRPC client built from Envoy's own protos (xds-protos),
one stream per HTTP request, its messages sent one at a time so a test can stop between them."""

from __future__ import annotations

import json
import queue
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = DESTINATION + "-subset"
CALL_SECONDS = 30  # every stream's deadline: a hung picker fails the test instead of hanging it
HELLO = [{"role": "user", "content": "hi"}]


def request_headers(
    path: str = "/v1/chat/completions",
    extra: dict[str, str] | None = None,
    end_of_stream: bool = False,
    subset: list[str] | None = None,
    subset_namespace: str = "envoy.lb.subset_hint",
) -> pb.ProcessingRequest:
    fields = {":method": "POST", ":path": path, ":authority": "gateway", ":scheme": "http", **(extra or {})}
    headers = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in fields.items()])
    message = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=headers, end_of_stream=end_of_stream))
    message.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    message.protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({SUBSET: subset})
        message.metadata_context.filter_metadata[subset_namespace].CopyFrom(hint)
    return message


def body_pieces(body: bytes, pieces: int = 3) -> list[pb.ProcessingRequest]:
    """The body as Envoy streams it: in pieces as they arrive, the last with end_of_stream."""
    size = -(-len(body) // pieces) or 1
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    return [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=part, end_of_stream=i == len(parts) - 1))
        for i, part in enumerate(parts)
    ]


def chat(model: str = "chat", **fields: Any) -> bytes:
    return json.dumps({"model": model, "messages": HELLO, **fields}).encode()


class Stream:
    """One ext_proc stream, its messages sent one at a time as a data plane sends them."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.Queue[pb.ProcessingRequest | None] = queue.Queue()
        self.responses = pb_grpc.ExternalProcessorStub(self.channel).Process(
            iter(self.outbox.get, None), timeout=CALL_SECONDS
        )

    def send(self, *messages: pb.ProcessingRequest) -> None:
        for message in messages:
            self.outbox.put(message)

    def next(self) -> pb.ProcessingResponse:
        return next(self.responses)

    def request(self, body: bytes, **headers: Any) -> pb.ProcessingResponse:
        """Send a request; the first answer (the pick's headers response, or an ImmediateResponse)."""
        self.send(request_headers(**headers), *body_pieces(body))
        return self.next()

    def body_back(self) -> bytes:
        """The request body as streamed back, up to its end_of_stream."""
        received = b""
        while True:
            response = self.next()
            streamed = response.request_body.response.body_mutation.streamed_response
            received += streamed.body
            if streamed.end_of_stream:
                return received

    def respond(self, status: int = 200, body: bytes = b'{"ok": true}') -> list[pb.ProcessingResponse]:
        """The replica's answer passed through: headers, then its body; the picker's answers."""
        headers = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())])
        self.send(
            pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=headers)),
            pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=True)),
        )
        return [self.next(), self.next()]

    def close(self) -> None:
        """The data plane is done with the stream (half-close); the picker ends it."""
        self.outbox.put(None)
        for _ in self.responses:
            pass
        self.channel.close()

    def cancel(self) -> None:
        """The request went (its client hung up): the data plane resets the stream."""
        self.responses.cancel()
        self.outbox.put(None)
        self.channel.close()


def picked(response: pb.ProcessingResponse) -> str:
    """The endpoint a pick names, checked to be the same in the header and the dynamic metadata."""
    assert response.WhichOneof("response") == "request_headers", response
    mutation = response.request_headers.response.header_mutation
    values = [o.header.raw_value.decode() for o in mutation.set_headers if o.header.key == DESTINATION]
    assert len(values) == 1, mutation
    metadata = response.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value
    assert metadata == values[0]
    return metadata


def refused(response: pb.ProcessingResponse) -> tuple[int, dict[str, Any], dict[str, str]]:
    """An ImmediateResponse: its status, its OpenAI-shaped error and its headers."""
    assert response.WhichOneof("response") == "immediate_response", response
    immediate = response.immediate_response
    headers = {o.header.key: o.header.raw_value.decode() for o in immediate.headers.set_headers}
    return int(immediate.status.code), json.loads(immediate.body)["error"], headers
