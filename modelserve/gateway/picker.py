"""The endpoint picker (MODELSERVE_GATEWAY_PICKER_PORT): the Gateway API Inference Extension's endpoint
picker protocol (v1) served from the gateway's own routing, on the gateway's own event loop.

A Gateway API data plane (Envoy's ext_proc filter, request and response bodies FULL_DUPLEX_STREAMED)
opens one external processing stream (`envoy.service.ext_proc.v3.ExternalProcessor/Process`) per HTTP
request and sends it the request's headers and body. The picker takes them through the gateway
proxy's own steps (proxy.py), so a request gets the same replica either way:

- `plan`: the body's `model` (served names, adapters, `namespace/name`, versions by weight and their
  guards), the affinity prefix; the gateway's 400, 401 and 404 in the OpenAI shape;
- `wait`: a model with no ready replica holds the stream within the gateway's bounds (429 when its
  queue is full, 503 when the hold times out), counted on /held, the demand that wakes it;
- `pick`: least in flight, or prefix affinity with bounded loads, among the endpoints of the data
  plane's subset hint when it sends one (none of them ready: 503); counted in flight until the stream
  ends (the response completed, or the request went), with the proxy's own requests.

The pick is answered as the protocol says: the request headers' response sets
`x-gateway-destination-endpoint: podIP:port` (after removing any such header the client sent, and its
`-subset` and `-served`: a client never decides where a request goes) and the same value as the
dynamic metadata `envoy.lb` / `x-gateway-destination-endpoint`; the body is then streamed back as it
came (renamed only where the proxy would rename it: the replica serves its own name), and the
response's headers, body and trailers pass back unchanged. Any refusal is an ImmediateResponse
carrying the gateway's own error (status, headers, OpenAI-shaped body).

A replica serving HTTPS (spec.tls) is named by its `podIP:port` too: the data plane must then speak
TLS to it (its sidecar serves nothing else on that port).

The picker never connects to a replica: the data plane sends the request. So the upstream errors and
retries, what answers prove of keys, the request series and the versions' guards stay the proxy's own
traffic's; the picker counts its outcomes (modelserve_gateway_picker_streams_total), its picks in the
routing decisions and in flight. The gRPC health service answers on the same port: overall, `liveness`,
and `readiness` and the ext_proc service once the gateway's watches have listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from modelserve.http import errors
from modelserve.http.downstream import Exchange, Headers

from . import errors as gateway_errors
from .directory import endpoint_of
from .proxy import GatewayProxy, ReplicaPlan
from .settings import GatewaySettings

log = logging.getLogger(__name__)

SERVICE_NAME = ext_proc.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
# The health services the protocol names, beside the overall one ("").
LIVENESS, READINESS = "liveness", "readiness"
DESTINATION = "x-gateway-destination-endpoint"
SUBSET = f"{DESTINATION}-subset"
SERVED = f"{DESTINATION}-served"
# The data plane's own headers: whatever a client sent under these names is removed before the pick's.
REMOVED = (DESTINATION, SUBSET, SERVED)
LB_NAMESPACE = "envoy.lb"  # the dynamic metadata's namespace the pick goes in
# Where a data plane puts its subset hint: the protocol's namespace, and `envoy.lb` as some send it.
SUBSET_NAMESPACES = ("envoy.lb.subset_hint", LB_NAMESPACE)
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"  # the key of the attributes Envoy sends
SOURCE_ADDRESS = "source.address"  # the client's address, when the filter's request_attributes name it
CHUNK_BYTES = 64 * 1024  # the largest body piece sent back (the protocol's recommendation)
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
READY_POLL_SECONDS = 0.2  # how often readiness is looked at until the watches have listed

# Outcomes (modelserve_gateway_picker_streams_total) besides the error codes answered.
PICKED = "picked"
CLIENT_GONE = "client_gone"
PROTOCOL_ERROR = "protocol_error"


class ProtocolError(Exception):
    """A stream the picker cannot follow: messages out of the protocol's order, or a mode it does not
    serve. It is ended with INVALID_ARGUMENT (the data plane's doing, not its client's)."""


class Held:
    """The Downstream the proxy's `wait` answers through while a stream is held: its error is kept for
    the ImmediateResponse (nothing else is ever sent: a picker's plan gets no keep-alives), and it is
    gone when the stream is (the data plane resets it when its client goes)."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.answer: tuple[int, Headers, bytes] | None = None
        self._gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        context.add_done_callback(lambda _: self._gone.done() or self._gone.set_result(None))

    def gone(self) -> asyncio.Future[None]:
        return self._gone

    async def whole(self, status: int, headers: Headers, body: bytes) -> None:
        self.answer = (status, headers, body)

    async def read_body(self, limit: int) -> bytes | None:
        raise NotImplementedError

    async def start(self, status: int, headers: Headers) -> None:
        raise NotImplementedError

    async def write(self, chunk: bytes) -> None:
        raise NotImplementedError

    async def end(self, chunk: bytes = b"") -> None:
        raise NotImplementedError

    def cancel_on_disconnect(self, exchange: Exchange) -> None:
        raise NotImplementedError


class Picker(ext_proc_grpc.ExternalProcessorServicer):
    """The ext_proc service: one `Stream` per HTTP request."""

    def __init__(self, proxy: GatewayProxy) -> None:
        self.proxy = proxy
        self.budget = proxy.settings.body_budget_bytes  # body bytes all streams may hold at once
        self.buffered = 0  # body bytes held now (read, not yet sent back)
        self.streams = 0  # streams open now
        self.picks = 0  # streams holding a pick now (counted in the proxy's in flight)

    async def Process(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        stream = Stream(self, context)
        self.streams += 1
        try:
            await stream.run()
        except ProtocolError as error:
            stream.outcome(PROTOCOL_ERROR)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"modelserve endpoint picker: {error}")
        finally:
            self.streams -= 1
            stream.close()


class Stream:
    """One HTTP request's external processing stream: its request until the pick (or the answer given
    instead), then its response passed back."""

    def __init__(self, picker: Picker, context: grpc.aio.ServicerContext) -> None:
        self.picker = picker
        self.proxy = picker.proxy
        self.context = context
        self.start = perf_counter()
        self.headers: Headers = []
        self.subset: frozenset[str] | None = None
        self.peer = _host(context.peer())
        self.chunks: list[bytes] = []
        self.size = 0  # body bytes held, counted in the picker's budget
        self.plan: ReplicaPlan | None = None  # the pick, until released
        self.echo_bodies = True  # response bodies streamed back (FULL_DUPLEX_STREAMED), else left as they are
        self.counted = False
        # The picked replica's answer as the data plane passes it back: its status, and when its first
        # byte came (since the stream began), for the version's guard and what the key opens.
        self.status: int | None = None
        self.ttfb: float | None = None

    async def run(self) -> None:
        if await self._request():
            await self._response()

    def outcome(self, outcome: str) -> None:
        if not self.counted:
            self.counted = True
            self.proxy.metrics.picker.labels(outcome).inc()

    def close(self) -> None:
        """The stream ended, however: its pick and its body bytes given back."""
        self._release()
        self._drop_body()
        if not self.counted:
            self.outcome(CLIENT_GONE)

    # --- the request: headers, body, the pick -------------------------------------------------------

    async def _request(self) -> bool:
        """Until the pick (True), or the answer given instead or the stream's end (False)."""
        message = await self._read()
        if message is None:
            return False
        if message.WhichOneof("request") != "request_headers":
            raise ProtocolError("a stream begins with the request headers")
        head = message.request_headers
        self.headers = _headers(head.headers)
        if head.end_of_stream:  # no body: no model to route by
            return await self._pick(trailers=False)
        while True:
            message = await self._read()
            if message is None:
                return False
            kind = message.WhichOneof("request")
            if kind == "request_body":
                refusal = self._take(message.request_body.body)
                if refusal is not None:
                    return await self._refuse(refusal)
                if message.request_body.end_of_stream:
                    return await self._pick(trailers=False)
            elif kind == "request_trailers":  # they end a body that came without end_of_stream
                return await self._pick(trailers=True)
            else:
                raise ProtocolError(f"{kind} before the request's body ended")

    async def _pick(self, trailers: bool) -> bool:
        """The request is in: plan, hold while its model has no ready replica, pick, and send the pick
        and the body back (then the trailers' answer, when they ended it)."""
        proxy = self.proxy
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        method, path = _pseudo(self.headers, b":method"), _pseudo(self.headers, b":path").partition("?")[0]
        route = proxy.table.get((method, path))
        if route is None:
            return await self._refuse(errors.unknown_route(method, path))
        exchange = Exchange(self.start)
        owner = proxy.owner(self.headers, self.peer, None)
        if proxy.reads_off_loop(body, owner):
            read = await proxy.read(route, body, owner)
            if isinstance(read, errors.ErrorResponse):
                return await self._refuse(read)
            exchange.read = read
        plan = proxy.plan(route, self.headers, body, exchange)
        if isinstance(plan, errors.ErrorResponse):
            return await self._refuse(plan)
        plan.sse = False  # nothing reaches the client before the pick: no keep-alives
        plan.subset = self.subset
        if not proxy.ready(plan):
            held = Held(self.context)
            if not await proxy.wait(plan, held, exchange, self.peer):
                if held.answer is None:  # its client went while it was held
                    return False
                status, headers, answer = held.answer
                code = _code(answer)
                await self._write(_immediate(status, headers, answer, code))
                self.outcome(code)
                return False
        if proxy.pick(plan, 0) is None:
            return await self._refuse(gateway_errors.no_endpoint_in_subset(plan.model.name))
        self.plan = plan
        self.picker.picks += 1
        assert plan.replica is not None
        endpoint = endpoint_of(plan.replica)
        removed = [*REMOVED, "content-length"] if plan.body is not body else list(REMOVED)
        await self._write(
            ext_proc.ProcessingResponse(
                request_headers=ext_proc.HeadersResponse(
                    response=ext_proc.CommonResponse(
                        header_mutation=ext_proc.HeaderMutation(
                            # Envoy applies the removals first: the client's value goes, the pick's is set.
                            remove_headers=removed,
                            set_headers=[_header(DESTINATION, endpoint.encode(), OVERWRITE)],
                        )
                    )
                ),
                dynamic_metadata=struct_pb2.Struct(fields={LB_NAMESPACE: _struct({DESTINATION: endpoint})}),
            )
        )
        self.outcome(PICKED)
        sent = plan.body
        for offset in range(0, max(len(sent), 1), CHUNK_BYTES):
            last = offset + CHUNK_BYTES >= len(sent)
            await self._write(
                _body(
                    ext_proc.ProcessingResponse,
                    "request_body",
                    sent[offset : offset + CHUNK_BYTES],
                    last and not trailers,
                )
            )
        self._drop_body()
        if trailers:
            await self._write(ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse()))
        return True

    def _take(self, chunk: bytes) -> errors.ErrorResponse | None:
        """A body chunk held, or the refusal: past the gateway's body limit, or the picker's budget."""
        if self.size + len(chunk) > self.proxy.max_body_bytes:
            return errors.body_too_large(self.proxy.max_body_bytes)
        if self.picker.buffered + len(chunk) > self.picker.budget:
            return errors.server_busy("The gateway holds as many request bodies as it may; retry shortly.")
        self.chunks.append(chunk)
        self.size += len(chunk)
        self.picker.buffered += len(chunk)
        return None

    def _drop_body(self) -> None:
        self.picker.buffered -= self.size
        self.size = 0
        self.chunks = []

    async def _refuse(self, error: errors.ErrorResponse) -> bool:
        body = error.body()
        await self._write(_immediate(error.status, error.headers(body), body, error.code))
        self.outcome(error.code)
        return False

    # --- the response: passed back as it comes -----------------------------------------------------

    async def _response(self) -> None:
        while (message := await self._read()) is not None:
            kind = message.WhichOneof("request")
            if kind == "response_headers":
                await self._write(ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse()))
                self._answered(_pseudo(_headers(message.response_headers.headers), b":status"))
                ended = message.response_headers.end_of_stream
                if ended:
                    self.ttfb = perf_counter() - self.start
            elif kind == "response_body":
                chunk = message.response_body
                if self.ttfb is None:
                    self.ttfb = perf_counter() - self.start
                if self.echo_bodies:
                    await self._write(
                        _body(ext_proc.ProcessingResponse, "response_body", chunk.body, chunk.end_of_stream)
                    )
                else:
                    await self._write(ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse()))
                ended = chunk.end_of_stream
            elif kind == "response_trailers":
                await self._write(ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse()))
                ended = True
            else:
                raise ProtocolError(f"{kind} after the request was sent")
            if ended:  # the answer is complete: its replica has one request fewer
                self._release()

    def _answered(self, status: str) -> None:
        """The replica's status: what it says of the request's key (as the proxy learns from its own)."""
        self.status = int(status) if status.isdigit() else None
        if self.plan is not None and self.status is not None:
            self.proxy.learn(self.plan, self.status)

    def _release(self) -> None:
        plan, self.plan = self.plan, None
        if plan is not None:
            self.picker.picks -= 1
            # A version's answer judged for its guard, as the proxy judges its own. Only an answer the
            # data plane passed back (its own 503 for a replica it could not reach is one): a stream
            # that ends before any is most often its client gone, which the proxy does not judge either.
            if plan.versions and self.status is not None:
                self.proxy.judge(plan, self.status, self.ttfb)
            self.proxy.release(plan)

    # --- the stream ---------------------------------------------------------------------------------

    async def _read(self) -> ext_proc.ProcessingRequest | None:
        """The next message, its metadata and attributes taken in; None at the stream's end."""
        message = await self.context.read()
        if message is grpc.aio.EOF:
            return None
        if message.observability_mode:
            raise ProtocolError("observability mode: a picker must answer")
        if message.HasField("protocol_config"):
            config = message.protocol_config
            if config.request_body_mode != FULL_DUPLEX:
                raise ProtocolError("the request body must be sent FULL_DUPLEX_STREAMED")
            self.echo_bodies = config.response_body_mode == FULL_DUPLEX
        if self.plan is None:
            self._hint(message)
        return message

    def _hint(self, message: ext_proc.ProcessingRequest) -> None:
        """The data plane's subset hint (filter metadata) and the client's address (attributes)."""
        filter_metadata = message.metadata_context.filter_metadata
        for namespace in SUBSET_NAMESPACES:
            if namespace in filter_metadata and SUBSET in filter_metadata[namespace].fields:
                self.subset = _endpoints(filter_metadata[namespace].fields[SUBSET])
                break
        attributes = message.attributes.get(EXT_PROC_ATTRIBUTES)
        if attributes is not None and SOURCE_ADDRESS in attributes.fields:
            address = attributes.fields[SOURCE_ADDRESS].string_value
            if address:
                self.peer = _host(address)

    async def _write(self, response: ext_proc.ProcessingResponse) -> None:
        await self.context.write(response)


class PickerServer:
    """The gRPC server on the picker's port: the ext_proc service and the health service."""

    def __init__(self, proxy: GatewayProxy, settings: GatewaySettings, ready: Callable[[], bool]) -> None:
        self.settings = settings
        self.ready = ready
        self.picker = Picker(proxy)
        self.health = health.aio.HealthServicer()
        # No SO_REUSEPORT: a port another socket holds (the gateway's own, a second gateway's) is an error.
        self.server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0)], maximum_concurrent_rpcs=settings.max_connections
        )
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(self.picker, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._readiness: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        host = self.settings.listen_host
        address = f"[{host}]:{self.settings.picker_port}" if ":" in host else f"{host}:{self.settings.picker_port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise RuntimeError(f"the endpoint picker cannot listen on {address}: {exc}") from exc
        await self.server.start()
        for service in ("", LIVENESS):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        for service in (READINESS, SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._readiness = asyncio.get_running_loop().create_task(self._serving_once_ready())
        log.info("endpoint picker (ext_proc, gRPC health) on %s", address)

    async def _serving_once_ready(self) -> None:
        while not self.ready():
            await asyncio.sleep(READY_POLL_SECONDS)
        for service in (READINESS, SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        """Not serving, then the streams in progress get `grace` seconds before they are cut."""
        if self._readiness is not None:
            self._readiness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._readiness
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


# --- messages -------------------------------------------------------------------------------------


def _headers(header_map: base_pb2.HeaderMap) -> Headers:
    """Envoy's header map as the proxy reads headers: lower-case names, raw bytes."""
    return [
        (header.key.lower().encode("latin-1"), header.raw_value or header.value.encode("latin-1"))
        for header in header_map.headers
    ]


def _pseudo(headers: Headers, name: bytes) -> str:
    return next((value.decode("latin-1") for key, value in headers if key == name), "")


def _header(key: str, value: bytes, action: int = OVERWRITE) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value), append_action=action)


def _struct(values: dict[str, str]) -> struct_pb2.Value:
    return struct_pb2.Value(
        struct_value=struct_pb2.Struct(fields={k: struct_pb2.Value(string_value=v) for k, v in values.items()})
    )


def _body(response: Any, field: str, chunk: bytes, end_of_stream: bool) -> ext_proc.ProcessingResponse:
    """A body piece streamed back (FULL_DUPLEX_STREAMED), as the request's or the response's."""
    streamed = ext_proc.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
    mutation = ext_proc.BodyMutation(streamed_response=streamed)
    return response(**{field: ext_proc.BodyResponse(response=ext_proc.CommonResponse(body_mutation=mutation))})


def _immediate(status: int, headers: Headers, body: bytes, code: str) -> ext_proc.ProcessingResponse:
    """The gateway's own answer instead of a pick, its error `code` in the details (Envoy sets the
    length of the body)."""
    kept = [_header(k.decode("latin-1"), v) for k, v in headers if k != b"content-length"]
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),  # type: ignore[arg-type]
            headers=ext_proc.HeaderMutation(set_headers=kept),
            body=body,
            details=f"modelserve_picker_{code}",
        )
    )


def _code(body: bytes) -> str:
    """The `code` of one of the gateway's own OpenAI-shaped errors (a bounded set: a metric label)."""
    with contextlib.suppress(ValueError, LookupError, TypeError):
        return str(json.loads(body)["error"]["code"])
    return "error"


def _endpoints(value: struct_pb2.Value) -> frozenset[str]:
    """A subset hint's endpoints: a list of `ip:port` strings, or one comma-separated string."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        parts = [item.string_value for item in value.list_value.values]
    elif kind == "string_value":
        parts = value.string_value.split(",")
    else:
        parts = []
    return frozenset(part.strip() for part in parts if part.strip())


def _host(address: str) -> str:
    """A client's host from gRPC's peer (`ipv4:1.2.3.4:5678`, `ipv6:[::1]:5678`) or Envoy's `1.2.3.4:5678`."""
    for scheme in ("ipv4:", "ipv6:"):
        address = address.removeprefix(scheme)
    if address.startswith("["):
        return address[1:].partition("]")[0]
    host, colon, port = address.rpartition(":")
    return host if colon and port.isdigit() and ":" not in host else address
