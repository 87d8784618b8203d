"""The gateway serving HTTPS (MODELSERVE_GATEWAY_TLS_DIR): a CA and server certificates made here,
written as a mounted kubernetes.io/tls Secret (harness/sidecar.py SecretDir: the kubelet's `..data`
symlink swapped for each update), the gateway in this process (as the program serves it) in front of
a real private sidecar before the replay engine, and as its program with two workers. The real
openai SDK trusting the CA gets its answers, streams too; a client that does not trust it fails its
handshake, and plain HTTP on the port is never answered; a renewed pair is served to new connections
within a bounded wait, a bad one refused with the one before it kept, and a bad pair at the start
ends the program with one line naming the file. Asserted on what the gateway serves (the
certificate a new handshake gets) and its own metrics."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openai
import pytest

from harness.certificates import CA, Issued, other_key, served_certificate
from harness.in_process import serving_gateway_app
from harness.sidecar import (
    API_KEY,
    SecretDir,
    Sidecar,
    free_ports,
    launch_sidecar,
    metric_value,
    start_replay,
    stop_sidecar,
    wait_ready,
)
from modelserve.gateway.app import Dispatcher
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve.http.workers import sibling_address
from modelserve.operator.autoscaling import gateway_addresses, read_guards, read_held
from modelserve_sandbox.processes import start_process, stop_process, tail, wait_until

SERVE = Path(__file__).resolve().parents[1] / "fixtures" / "gateway_workers" / "serve.py"
GATEWAY_BIN = Path(sys.executable).parent / "modelserve-gateway"
HELLO = [{"role": "user", "content": "hi"}]
CHATS = 'modelserve_gateway_requests_total{model="tiny",namespace="a",status_class="2xx"}'
LOADED = 'modelserve_gateway_tls_reloads_total{outcome="loaded"}'
REFUSED = 'modelserve_gateway_tls_reloads_total{outcome="refused"}'
EXPIRY = "modelserve_gateway_tls_certificate_expiry_timestamp_seconds"
# A bound, not a wait: the gateway polls every second; a starved machine may take a few.
RENEWAL_SECONDS = 20
# The request head's deadline, the TLS handshake's too (asyncio's own would be 60 s).
HEAD_SECONDS = 4


@dataclass
class Backend:
    ca: CA
    ca_file: Path
    sidecar: Sidecar
    base: Path


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    base = tmp_path_factory.mktemp("gateway-tls")
    replay = start_replay()
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    sidecar: Sidecar | None = None
    try:
        sidecar = launch_sidecar(base / "logs", replay.url, "tiny", {"MODELSERVE_KEYS_DIR": str(base / "keys")})
        wait_ready(sidecar)
        ca = CA()
        yield Backend(ca, ca.write(base / "ca.crt"), sidecar, base)
    finally:
        if sidecar is not None:
            stop_sidecar(sidecar)
        replay.stop()


@dataclass
class Gateway:
    url: str
    port: int
    secret: SecretDir
    first: Issued
    app: Dispatcher | None  # None: the program's own process
    backend: Backend
    pid: int = 0  # the program's, with workers
    discovery: FixedDiscovery | None = None  # the in-process gateway's table of models

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(verify=trusting(self.backend.ca_file), timeout=30, **options)  # type: ignore[arg-type]

    def metric(self, sample: str) -> float:
        with self.client() as client:
            return metric_value(client.get(self.url + "/metrics").text, sample)

    def serial(self) -> int:
        return served_certificate(self.port, self.backend.ca_file).serial_number

    def renew(self, files: dict[str, str]) -> None:
        self.secret.write(files)


def trusting(ca_file: Path) -> ssl.SSLContext:
    """A client's context that trusts the test's CA alone (httpx's `verify=`)."""
    return ssl.create_default_context(cafile=str(ca_file))


def _address(sidecar: Sidecar) -> str:
    return sidecar.url.removeprefix("http://")


@pytest.fixture
def gateway(backend: Backend, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway of each test's own (its certificate is the test's to renew), in this process."""
    secret = SecretDir(tmp_path / "tls")
    first = backend.ca.issue()
    secret.write(first.files())
    address = _address(backend.sidecar)
    model = Model("a", "tiny", False, replicas=(address,), pods={address: "a-pod-0"}, ring=Ring([address]))
    sleepy = Model("a", "sleepy", True, replicas=(), pods={}, ring=None)  # at zero: its requests are held
    discovery = FixedDiscovery([model, sleepy])
    (port,) = free_ports(1)
    settings = GatewaySettings.from_env(
        {
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
            "MODELSERVE_GATEWAY_TLS_DIR": str(secret.path),
            "MODELSERVE_GATEWAY_HEAD_TIMEOUT_SECONDS": str(HEAD_SECONDS),
        }
    )
    with serving_gateway_app(settings, discovery) as (url, app):
        assert url == f"https://127.0.0.1:{port}"
        yield Gateway(url, port, secret, first, app, backend, discovery=discovery)


def _openai(gateway: Gateway, http_client: httpx.Client) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=API_KEY, http_client=http_client, max_retries=0)


def test_the_openai_sdk_trusting_the_ca_gets_its_answers_over_https(gateway: Gateway) -> None:
    assert gateway.serial() == gateway.first.serial
    with gateway.client() as http_client:
        sdk = _openai(gateway, http_client)
        answer = sdk.chat.completions.create(model="tiny", messages=HELLO)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        chunks = list(sdk.chat.completions.create(model="tiny", messages=HELLO, stream=True))  # type: ignore[arg-type]
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed
        assert sorted(m.id for m in sdk.models.list()) == ["sleepy", "tiny"]  # sleepy: public
    assert gateway.metric(CHATS) == 2  # both on the fast lane (the model list is the gateway's own)
    assert gateway.metric(EXPIRY) == gateway.first.not_after.timestamp()
    assert gateway.metric(LOADED) == gateway.metric(REFUSED) == 0


def test_the_fast_lane_streams_and_reads_large_bodies_over_tls(gateway: Gateway) -> None:
    """A stream far larger than the TLS transport's write buffer (its pauses are the flow control's),
    and a body larger than the read buffer (read on as the proxy asks), whole through TLS."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 300_000}]}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with gateway.client() as client:
        answer = client.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        stream = {"model": "tiny", "messages": HELLO, "stream": True}
        with client.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json=stream,
            headers={**headers, "x-replay-repeat": "3000"},
        ) as streamed:
            data = b"".join(streamed.iter_raw())
    assert streamed.status_code == 200
    events = [line for line in data.split(b"\n\n") if line.startswith(b"data: ")]
    assert len(data) > 1_000_000 and events[-1] == b"data: [DONE]"
    assert all(json.loads(event[6:])["object"] == "chat.completion.chunk" for event in events[:-1])


def test_a_client_that_does_not_trust_the_ca_fails_its_handshake_and_plain_http_is_never_answered(
    gateway: Gateway,
) -> None:
    with httpx.Client(timeout=10) as untrusting:  # the system's roots (certifi's): not the test's CA
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.get(gateway.url + "/healthz")
        with pytest.raises(openai.APIConnectionError):
            _openai(gateway, untrusting).chat.completions.create(model="tiny", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(httpx.TransportError):  # the bytes of a plain request are no TLS handshake
        httpx.post(
            f"http://127.0.0.1:{gateway.port}/v1/chat/completions",
            json={"model": "tiny", "messages": HELLO},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=10,
        )
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):  # a name it was not issued for
        served_certificate(gateway.port, gateway.backend.ca_file, host="gateway.example")
    assert gateway.metric(CHATS) == 0  # nothing reached a model


def _wait_for_serial(gateway: Gateway, serial: int) -> float:
    """Seconds until a new connection is served the certificate `serial`, within RENEWAL_SECONDS."""
    start = time.monotonic()
    wait_until(lambda: gateway.serial() == serial, RENEWAL_SECONDS, f"the gateway to serve serial {serial:x}")
    return time.monotonic() - start


def test_a_renewed_pair_is_served_to_new_connections_and_open_ones_go_on(gateway: Gateway) -> None:
    with gateway.client() as before:  # a connection made before the renewal
        assert before.get(gateway.url + "/healthz").status_code == 200
        renewed = gateway.backend.ca.issue(with_root=True)  # cert-manager's chain may carry its CA
        gateway.renew(renewed.files())
        seconds = _wait_for_serial(gateway, renewed.serial)
        print(f"\nrenewal served to a new connection {seconds:.2f} s after the Secret's swap")
        assert before.get(gateway.url + "/healthz").status_code == 200  # kept alive, its session as it was
    assert gateway.metric(LOADED) == 1 and gateway.metric(REFUSED) == 0
    assert gateway.metric(EXPIRY) == renewed.not_after.timestamp()
    with gateway.client() as after:
        answer = _openai(gateway, after).chat.completions.create(model="tiny", messages=HELLO)  # type: ignore[arg-type]
        assert answer.choices[0].message.content


def test_a_renewal_whose_key_does_not_match_or_that_expired_is_refused_and_the_old_pair_served(
    gateway: Gateway,
) -> None:
    mismatched = gateway.backend.ca.issue()
    gateway.renew(mismatched.files(other_key()))
    wait_until(lambda: gateway.metric(REFUSED) == 1, RENEWAL_SECONDS, "the mismatched pair to be refused")
    assert gateway.serial() == gateway.first.serial
    expired = gateway.backend.ca.issue(not_after=datetime.now(UTC) - timedelta(minutes=5))
    gateway.renew(expired.files())
    wait_until(lambda: gateway.metric(REFUSED) == 2, RENEWAL_SECONDS, "the expired pair to be refused")
    assert gateway.serial() == gateway.first.serial
    assert gateway.metric(LOADED) == 0
    assert gateway.metric(EXPIRY) == gateway.first.not_after.timestamp()
    with gateway.client() as client:
        answer = _openai(gateway, client).chat.completions.create(model="tiny", messages=HELLO)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
    fixed = gateway.backend.ca.issue()  # and the next good renewal is served
    gateway.renew(fixed.files())
    _wait_for_serial(gateway, fixed.serial)
    assert (gateway.metric(LOADED), gateway.metric(REFUSED)) == (1, 2)


def _closed_within(sock: socket.socket | ssl.SSLSocket, seconds: float) -> bool:
    """Whether the server closed the connection within `seconds` (its end read: b"" or a reset)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, ssl.SSLEOFError):
        return True
    except TimeoutError:
        return False


def test_the_connection_bounds_hold_over_tls(gateway: Gateway) -> None:
    """A connection that never begins its handshake, and one that completes it and sends nothing,
    are closed by the head's deadline (well before asyncio's 60 s for a handshake); a head over
    the bound gets its 431 whole on the TLS connection, which then closes."""
    bound = HEAD_SECONDS + 8  # the deadline, and room for a starved machine
    cut = 'modelserve_gateway_connections_cut_total{reason="%s"}'
    before = {reason: gateway.metric(cut % reason) for reason in ("head_too_large", "no_request")}
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as silent:
        assert _closed_within(silent, bound), "a connection that never began its handshake was left open"
    context = trusting(gateway.backend.ca_file)
    with (
        socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as idle,
    ):
        assert _closed_within(idle, bound), "an idle TLS connection was left open"
    with gateway.client() as client:
        big = client.get(gateway.url + "/healthz", headers={"x-filler": "a" * 100_000})
    assert big.status_code == 431 and big.json()["error"]["code"] == "request_header_fields_too_large"
    assert big.headers["connection"] == "close"
    after = {reason: gateway.metric(cut % reason) - count for reason, count in before.items()}
    assert after == {"head_too_large": 1, "no_request": 1}  # the one before its handshake was TLS's to close


def test_the_operator_reads_what_a_tls_gateway_holds(gateway: Gateway) -> None:
    """The autoscaler's reads (operator/autoscaling.py) of a gateway pod whose port is named https:
    over TLS, by the pod's address (which the certificate does not name), as demand for a model at zero."""
    pod = {
        "metadata": {"name": "g"},
        "spec": {"containers": [{"name": "gateway", "ports": [{"name": "https", "containerPort": 8080}]}]},
        "status": {
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "gateway", "containerID": "cri://1", "state": {"running": {}}}],
        },
    }
    (address,) = gateway_addresses([pod])
    assert address == "https://127.0.0.1:8080"
    address = f"https://127.0.0.1:{gateway.port}"  # this gateway's port
    assert read_held(address) == {} and read_guards(address) == {}
    assert gateway.discovery is not None
    with ThreadPoolExecutor(1) as pool, gateway.client() as client:
        held = pool.submit(
            client.post, gateway.url + "/v1/chat/completions", json={"model": "sleepy", "messages": HELLO}
        )
        wait_until(
            lambda: read_held(address) == {("a", "sleepy"): 1}, 15, "the held request, read as the operator reads"
        )
        gateway.discovery.update(("a", "sleepy"))  # deleted while held: its request answered 404
        assert held.result(timeout=30).status_code == 404
    assert read_held(f"127.0.0.1:{gateway.port}") == {}  # in plain HTTP: no answer, nothing counted


# --- the program: a bad pair at the start, and two workers ------------------------------------------


@pytest.mark.parametrize("case", ["missing", "mismatch", "expired"])
def test_a_bad_pair_at_the_start_ends_the_program_with_one_line_naming_the_file(
    backend: Backend, tmp_path: Path, case: str
) -> None:
    directory = tmp_path / "tls"
    good = backend.ca.issue()
    if case == "mismatch":
        SecretDir(directory).write(good.files(other_key()))
    elif case == "expired":
        SecretDir(directory).write(backend.ca.issue(not_after=datetime.now(UTC) - timedelta(days=1)).files())
    (port,) = free_ports(1)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
        "MODELSERVE_GATEWAY_TLS_DIR": str(directory),
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),  # never read: it ends before any watch
    }
    ended = subprocess.run([str(GATEWAY_BIN)], env=env, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 2, ended.stderr
    assert "Traceback" not in ended.stderr
    last = ended.stderr.strip().splitlines()[-1]
    named = {"missing": directory / "tls.crt", "mismatch": directory / "tls.key", "expired": directory / "tls.crt"}
    assert last.startswith(f"modelserve-gateway: cannot serve TLS: {named[case]}: "), ended.stderr
    assert {"missing": "cannot be read", "mismatch": "does not match", "expired": "expired at"}[case] in last


@pytest.fixture
def workers(backend: Backend, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway as its program runs it with two workers, serving HTTPS."""
    secret = SecretDir(tmp_path / "tls")
    first = backend.ca.issue()
    secret.write(first.files())
    (port,) = free_ports(1)
    env = {
        "MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1",
        "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
        "MODELSERVE_GATEWAY_WORKERS": "2",
        "MODELSERVE_GATEWAY_TLS_DIR": str(secret.path),
    }
    logs = tmp_path / "logs"
    process = start_process("gateway", [sys.executable, str(SERVE), _address(backend.sidecar)], logs, env)
    gateway = Gateway(f"https://127.0.0.1:{port}", port, secret, first, None, backend, process.pid)

    def ready() -> bool:
        assert process.poll() is None, tail(logs / "gateway.log")
        try:
            with gateway.client() as client:
                return client.get(gateway.url + "/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, 60, "the gateway's workers")
        yield gateway
    finally:
        stop_process(process)
    assert process.returncode == 0, tail(logs / "gateway.log")


def _worker_metrics(gateway: Gateway, index: int) -> str:
    """One worker's own series, asked on its unix socket in plain HTTP, as its siblings ask."""
    transport = httpx.HTTPTransport(uds=sibling_address(gateway.pid, index))
    with httpx.Client(transport=transport, base_url="http://worker", timeout=30) as client:
        return client.get("/metrics").text


def test_two_workers_serve_https_answer_for_the_pod_and_each_follows_a_renewal(workers: Gateway) -> None:
    requests = 16
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for _ in range(requests):  # a connection (and a handshake) each: the kernel picks a worker per connection
        with workers.client() as client:
            answer = client.post(
                workers.url + "/v1/chat/completions", json={"model": "tiny", "messages": HELLO}, headers=headers
            )
            assert answer.status_code == 200, answer.text
    own = [metric_value(_worker_metrics(workers, index), CHATS) for index in range(2)]
    assert sum(own) == requests
    assert workers.metric(CHATS) == requests  # the pod's, whichever worker answered the scrape
    renewed = workers.backend.ca.issue()
    workers.renew(renewed.files())
    wait_until(
        lambda: all(metric_value(_worker_metrics(workers, i), LOADED) == 1 for i in range(2)),
        RENEWAL_SECONDS,
        "both workers to serve the renewal",
    )
    assert {workers.serial() for _ in range(12)} == {renewed.serial}  # whichever worker a handshake reaches
    assert workers.metric(LOADED) == 2  # one per worker
    assert workers.metric(EXPIRY) == renewed.not_after.timestamp()
