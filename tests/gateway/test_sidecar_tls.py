"""A ModelServer's pods serving HTTPS (spec.tls: MODELSERVE_TLS_DIR, a mounted kubernetes.io/tls
Secret), so keys never cross the network in clear: the real sidecar before the replay engine, its
certificate made by a test CA for its Service's name; the gateway in this process in front of it.

The openai SDK trusting the CA gets its answers from the sidecar itself, plain HTTP on its port is
never answered; the gateway checks the sidecar's certificate against its upstream CA
(MODELSERVE_GATEWAY_UPSTREAM_CA_FILE) for the Service's name before any key goes to it, so a
gateway that does not trust the CA, or a certificate naming another Service, sends nothing and counts
a `tls` upstream error; a pair the sidecar cannot serve ends it at the start with one line naming
the file. Asserted on answers and on the programs' own metrics."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from harness.certificates import CA, other_key, served_certificate
from harness.in_process import serving_gateway_app
from harness.sidecar import API_KEY, SecretDir, Sidecar, free_ports, launch_sidecar, metric_value, start_replay
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve_sandbox.processes import stop_process, tail, wait_until

SIDECAR_BIN = Path(sys.executable).parent / "modelserve-sidecar"
HELLO = [{"role": "user", "content": "hi"}]
SERVICE = "tiny.a.svc"  # the name the gateway checks a replica of ModelServer a/tiny for
EXPIRY = "modelserve_sidecar_tls_certificate_expiry_timestamp_seconds"
CHATS = 'modelserve_sidecar_requests_total{route="/v1/chat/completions",status_class="2xx"}'


@dataclass
class TLSSidecar:
    ca: CA
    ca_file: Path
    sidecar: Sidecar
    port: int
    not_after: float

    @property
    def replica(self) -> str:
        """What the gateway's directory names it: a replica serving HTTPS."""
        return f"https://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(verify=ssl.create_default_context(cafile=str(self.ca_file)), timeout=30)


@pytest.fixture(scope="module")
def tls_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSSidecar]:
    base = tmp_path_factory.mktemp("sidecar-tls")
    ca = CA()
    # As cert-manager issues it for a Service: its DNS names (and here the loopback address the
    # tests reach it on directly).
    issued = ca.issue(hosts=(SERVICE, f"{SERVICE}.cluster.local", "127.0.0.1"))
    SecretDir(base / "tls").write(issued.files())
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    replay = start_replay()
    sidecar: Sidecar | None = None
    try:
        env = {"MODELSERVE_KEYS_DIR": str(base / "keys"), "MODELSERVE_TLS_DIR": str(base / "tls")}
        sidecar = launch_sidecar(base / "logs", replay.url, "tiny", env)
        assert sidecar.url.startswith("https://")
        port = int(sidecar.url.rsplit(":", 1)[1])
        served = TLSSidecar(ca, ca.write(base / "ca.crt"), sidecar, port, issued.not_after.timestamp())

        def ready() -> bool:
            with served.client() as client:
                try:
                    return client.get(f"{served.replica}/readyz").status_code == 200
                except httpx.TransportError:
                    return False

        wait_until(ready, 90, "the sidecar to be ready over HTTPS", on_timeout=lambda: "\n" + tail(sidecar.log))
        yield served
    finally:
        if sidecar is not None:
            stop_process(sidecar.process)
        replay.stop()


def test_the_sidecar_serves_https_to_a_client_that_trusts_its_ca_and_never_plain_http(
    tls_sidecar: TLSSidecar,
) -> None:
    assert served_certificate(tls_sidecar.port, tls_sidecar.ca_file, host=SERVICE).subject.rfc4514_string() == (
        f"CN={SERVICE}"
    )
    with tls_sidecar.client() as http_client:
        sdk = openai.OpenAI(
            base_url=f"{tls_sidecar.replica}/v1", api_key=API_KEY, http_client=http_client, max_retries=0
        )
        answer = sdk.chat.completions.create(model="tiny", messages=HELLO)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        metrics = http_client.get(f"{tls_sidecar.replica}/metrics").text
    assert metric_value(metrics, EXPIRY) == tls_sidecar.not_after
    with pytest.raises(httpx.TransportError):  # a plain request's bytes are no TLS handshake
        httpx.post(
            f"http://127.0.0.1:{tls_sidecar.port}/v1/chat/completions",
            json={"model": "tiny", "messages": HELLO},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=10,
        )


def _gateway_settings(ca_file: Path | None) -> GatewaySettings:
    (port,) = free_ports(1)
    env = {"MODELSERVE_GATEWAY_LISTEN_PORT": str(port)}
    if ca_file is not None:
        env["MODELSERVE_GATEWAY_UPSTREAM_CA_FILE"] = str(ca_file)
    return GatewaySettings.from_env(env)


def _model(name: str, replica: str) -> Model:
    return Model("a", name, False, replicas=(replica,), pods={replica: f"{name}-pod-0"}, ring=Ring([replica]))


def _errors(url: str, name: str, kind: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return metric_value(text, f'modelserve_gateway_upstream_errors_total{{kind="{kind}",model="{name}",namespace="a"}}')


def test_the_gateway_reaches_a_sidecar_over_https_checking_its_certificate_for_the_services_name(
    tls_sidecar: TLSSidecar,
) -> None:
    discovery = FixedDiscovery([_model("tiny", tls_sidecar.replica)])
    with serving_gateway_app(_gateway_settings(tls_sidecar.ca_file), discovery) as (url, _):
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=30)
        answer = sdk.chat.completions.create(model="tiny", messages=HELLO)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        chunks = list(sdk.chat.completions.create(model="tiny", messages=HELLO, stream=True))  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # The model list asks the sidecar (over TLS, with the caller's key) whether the key opens it.
        assert [m.id for m in sdk.models.list()] == ["tiny"]
        assert _errors(url, "tiny", "tls") == 0


@pytest.mark.parametrize("case", ["untrusted", "other-name"])
def test_a_sidecar_whose_certificate_the_gateway_cannot_check_gets_no_request(
    tls_sidecar: TLSSidecar, case: str
) -> None:
    """`untrusted`: a gateway without the upstream CA (the system's trust store); `other-name`: a
    ModelServer whose Service the certificate does not name (another's pod at that address)."""
    name = "tiny" if case == "untrusted" else "other"
    ca_file = None if case == "untrusted" else tls_sidecar.ca_file
    before = metric_value(_sidecar_metrics(tls_sidecar), CHATS)
    with serving_gateway_app(_gateway_settings(ca_file), FixedDiscovery([_model(name, tls_sidecar.replica)])) as (
        url,
        _,
    ):
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": name, "messages": HELLO},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=30,
        )
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "replica_unavailable", answer.text
        assert _errors(url, name, "tls") >= 1
    after = metric_value(_sidecar_metrics(tls_sidecar), CHATS)
    assert after == before  # nothing reached it


def _sidecar_metrics(tls_sidecar: TLSSidecar) -> str:
    with tls_sidecar.client() as client:
        return client.get(f"{tls_sidecar.replica}/metrics").text


@pytest.mark.parametrize("case", ["missing", "mismatch"])
def test_a_pair_the_sidecar_cannot_serve_ends_it_at_the_start_with_one_line_naming_the_file(
    tls_sidecar: TLSSidecar, tmp_path: Path, case: str
) -> None:
    directory = tmp_path / "tls"
    if case == "mismatch":
        SecretDir(directory).write(tls_sidecar.ca.issue(hosts=(SERVICE,)).files(other_key()))
    (port,) = free_ports(1)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "MODELSERVE_LISTEN_PORT": str(port),
        "MODELSERVE_UPSTREAM_URL": "http://127.0.0.1:1",
        "MODELSERVE_SERVED_MODEL": "tiny",
        "MODELSERVE_AUTH": "public",
        "MODELSERVE_TLS_DIR": str(directory),
    }
    ended = subprocess.run([str(SIDECAR_BIN)], env=env, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 2, ended.stderr
    assert "Traceback" not in ended.stderr
    last = ended.stderr.strip().splitlines()[-1]
    named = {"missing": directory / "tls.crt", "mismatch": directory / "tls.key"}[case]
    assert last.startswith(f"modelserve-sidecar: cannot serve TLS: {named}: "), ended.stderr
