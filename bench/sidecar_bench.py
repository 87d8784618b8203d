"""Sidecar benchmark: direct vs sidecar vs nginx in front of the same fast fake engine.

    .venv/bin/python -m bench.sidecar_bench             # one run, prints its table
    .venv/bin/python -m bench.sidecar_bench --runs 3    # three runs, then the medians and the targets

The fake engine (aiohttp, its own process) answers a chat completion with a small JSON body, or
streams 128 SSE chunks with a fixed gap (0 or 1 ms). The sidecar and nginx each run pinned to one
core (taskset), nginx with one worker, `proxy_buffering off` and the same Key check (a `map`).
Levels: concurrency 1, 16, 64 non-streaming; 1, 64, 256 streaming, each gap. "Added" figures are the
proxy's minus direct's at the same level in the same run. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from modelserve_sandbox.processes import (
    free_ports,
    start_process,
    stop_process,
    tail,
    wait_until,
)

KEY = "bench-key-0123456789"
MODEL = "fake"
CHUNKS = 128
PROXY_CPU = "1"  # the core the proxy under test is pinned to (the engine and the load float)
NON_STREAMING = (1, 16, 64)
STREAMING = (1, 64, 256)
GAPS_MS = (0, 1)
HELLO = [{"role": "user", "content": "hello"}]
REQUEST = json.dumps({"model": MODEL, "messages": HELLO, "max_tokens": 8}).encode()
STREAM_REQUEST = json.dumps({"model": MODEL, "messages": HELLO, "stream": True}).encode()


# --- the fake engine -----------------------------------------------------------------------------

ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": " 2 2 2 2 2 2 2 2"}, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 28, "total_tokens": 36, "completion_tokens": 8},
    }
).encode()
EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"fake",'
    b'"choices":[{"index":0,"delta":{"content":" 2"},"logprobs":null,"finish_reason":null}]}\n\n'
)
DONE = b"data: [DONE]\n\n"


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=ANSWER, content_type="application/json")
    gap = float(request.headers.get("x-gap-ms", "0")) / 1000
    response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for _ in range(CHUNKS):
        await response.write(EVENT)
        if gap:
            await asyncio.sleep(gap)
    await response.write(DONE)
    await response.write_eof()
    return response


async def _models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def _health(_: web.Request) -> web.Response:
    return web.Response()


def serve_engine(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# --- the proxies ---------------------------------------------------------------------------------

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  map $http_authorization $key_ok {{
    default 0;
    "~*^(bearer|key) {key}$" 1;
  }}
  upstream engine {{
    server 127.0.0.1:{engine_port};
    keepalive 1024;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      if ($key_ok = 0) {{ return 401; }}
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


def ensure_nginx() -> str:
    found = shutil.which("nginx") or (shutil.which("nginx", path="/usr/sbin:/sbin"))
    if found:
        return found
    print("installing nginx (Debian package)...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True, env=env)
    found = shutil.which("nginx", path="/usr/sbin:/sbin")
    if not found:
        raise SystemExit("nginx did not install")
    return found


def start_sidecar(
    workdir: Path,
    port: int,
    engine_url: str,
    name: str = "sidecar",
    profile: Path | None = None,
    workers: int = 1,
    cpus: str = PROXY_CPU,
    settings: dict[str, str] | None = None,
) -> subprocess.Popen:
    """modelserve-sidecar with `workers` pinned to `cpus`, private: the key KEY in `workdir`/keys;
    under cProfile, writing to `profile` when it stops, if given; `settings`: more of its variables
    (its address, engine, model, keys and workers stay these)."""
    keys = workdir / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "api-key").write_text(KEY + "\n")
    sidecar_bin = str(Path(sys.executable).parent / "modelserve-sidecar")
    env = {
        **os.environ,
        **(settings or {}),
        "MODELSERVE_LISTEN_HOST": "127.0.0.1",
        "MODELSERVE_LISTEN_PORT": str(port),
        "MODELSERVE_UPSTREAM_URL": engine_url,
        "MODELSERVE_SERVED_MODEL": MODEL,
        "MODELSERVE_KEYS_DIR": str(keys),
        "MODELSERVE_WORKERS": str(workers),
    }
    command = [sidecar_bin]
    if profile is not None:
        command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "modelserve.sidecar.main"]
    return start_process(name, ["taskset", "-c", cpus, *command], workdir, env)


def start_nginx(nginx: str, workdir: Path, conf: str, name: str = "nginx") -> subprocess.Popen:
    """nginx with `conf` (one worker) pinned to PROXY_CPU, its files under `workdir`/`name`."""
    home = workdir / name
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    (home / "nginx.conf").write_text(conf)
    return start_process(
        name, ["taskset", "-c", PROXY_CPU, nginx, "-p", str(home), "-c", str(home / "nginx.conf")], workdir
    )


@dataclass
class Target:
    name: str
    url: str
    process: subprocess.Popen | None = None
    tls: ssl.SSLContext | None = None  # the client's, for an https:// target
    # More processes whose CPU is the proxy's too (Envoy's endpoint picker beside Envoy).
    also: tuple[subprocess.Popen, ...] = ()

    def cpu_seconds(self) -> float:
        """CPU time of the proxy's process trees (nginx's worker is a child of its master)."""
        pids = {str(process.pid) for process in (self.process, *self.also) if process is not None}
        if not pids:
            return 0.0
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            # fields: state ppid ... utime (11) stime (12); the process itself or its children
            if stat.parent.name in pids or fields[1] in pids:
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")


def wait_http(url: str, what: str, log: Path, tls: ssl.SSLContext | None = None) -> None:
    import urllib.request

    def up() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1, context=tls):
                return True
        except OSError:
            return False

    wait_until(up, 30, what, on_timeout=lambda: "\n" + tail(log))


# --- the load ------------------------------------------------------------------------------------


@dataclass
class Result:
    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    seconds: float = 0.0
    cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def p(self, q: float, values: list[float] | None = None) -> float:
        values = sorted(self.latencies if values is None else values)
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


async def load(
    url: str, concurrency: int, seconds: float, stream: bool, gap_ms: int, tls: ssl.SSLContext | None = None
) -> Result:
    result = Result()
    headers = {"Authorization": f"Key {KEY}", "Content-Type": "application/json", "x-gap-ms": str(gap_ms)}
    body = STREAM_REQUEST if stream else REQUEST
    connector = aiohttp.TCPConnector(limit=0, force_close=False, ssl=tls if tls is not None else True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                try:
                    async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as answer:
                        first = await answer.content.readany()
                        ttfb = time.perf_counter() - start
                        rest = await answer.read()
                        ok = answer.status == 200 and (not stream or (first + rest).endswith(DONE))
                except (TimeoutError, aiohttp.ClientError):
                    ok, ttfb = False, 0.0
                if ok:
                    result.latencies.append(time.perf_counter() - start)
                    result.ttfbs.append(ttfb)
                    result.requests += 1
                else:
                    result.errors += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - began
    return result


# --- one run -------------------------------------------------------------------------------------

LEVELS = [("plain", c, 0) for c in NON_STREAMING] + [("stream", c, g) for g in GAPS_MS for c in STREAMING]


def level_name(kind: str, concurrency: int, gap: int) -> str:
    return f"c={concurrency}" if kind == "plain" else f"stream c={concurrency} gap={gap}ms"


def run_once(targets: list[Target], seconds: float) -> dict[tuple, dict[str, Result]]:
    results: dict[tuple, dict[str, Result]] = {}
    for target in targets:  # warm every path (connections, caches) before measuring
        asyncio.run(load(target.url, 8, 0.5, False, 0, target.tls))
    for level in LEVELS:
        kind, concurrency, gap = level
        results[level] = {}
        for target in targets:  # interleaved, so drift in the machine's load hits all alike
            cpu = target.cpu_seconds()
            result = asyncio.run(load(target.url, concurrency, seconds, kind == "stream", gap, target.tls))
            result.cpu = target.cpu_seconds() - cpu
            results[level][target.name] = result
    return results


COLUMNS = ("req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "+ttfb ms", "cpu ms/req", "errors")
Table = dict[tuple[tuple, str], tuple[float, ...]]  # (level, target) -> one value per column


def summarize(results: dict[tuple, dict[str, Result]]) -> Table:
    table: Table = {}
    for level, by_target in results.items():
        direct = by_target["direct"]
        for name, r in by_target.items():
            added = name != "direct"
            nan = float("nan")
            table[level, name] = (
                r.rate,
                r.p(0.5),
                r.p(0.99),
                r.p(0.5) - direct.p(0.5) if added else nan,
                r.p(0.99) - direct.p(0.99) if added else nan,
                r.p(0.5, r.ttfbs) - direct.p(0.5, direct.ttfbs) if added else nan,
                r.cpu / max(r.requests, 1) * 1000 if added else nan,
                float(r.errors),
            )
    return table


def print_table(table: Table) -> None:
    print(f"{'level':<26}{'target':<12}" + "".join(f"{c:>11}" for c in COLUMNS))
    for (level, name), values in table.items():
        cells = "".join(
            "          -" if math.isnan(v) else f"{v:>11.3f}" if i else f"{v:>11.1f}" for i, v in enumerate(values)
        )
        print(f"{level_name(*level):<26}{name:<12}{cells}")
    print(flush=True)


def median_table(tables: list[Table]) -> Table:
    return {key: tuple(statistics.median(t[key][i] for t in tables) for i in range(len(COLUMNS))) for key in tables[0]}


def target_ratios(table: Table, ours: str) -> dict[str, float]:
    """Issue 26's targets for the proxy path `ours` against nginx's in the same run: added p50 at
    c=1, CPU per request and requests/s at c=64, streams/s at c=64 (each streaming level at c=64 the
    bench measures), errors."""
    column = {name: i for i, name in enumerate(COLUMNS)}

    def ratio(level: tuple, name: str) -> float:
        # Undefined (nan) when noise puts nginx at or below direct: no ratio to a zero cost.
        nginx = table[level, "nginx"][column[name]]
        return table[level, ours][column[name]] / nginx if nginx > 0 else float("nan")

    values = {
        f"added p50 c=1 {ours}/nginx (<= 2)": ratio(("plain", 1, 0), "+p50 ms"),
        f"cpu ms/req c=64 {ours}/nginx (<= 3)": ratio(("plain", 64, 0), "cpu ms/req"),
        f"req/s c=64 {ours}/nginx (>= 0.8)": ratio(("plain", 64, 0), "req/s"),
    }
    for kind, concurrency, gap in sorted({level for level, _ in table}):
        if kind == "stream" and concurrency == 64:
            values[f"streams/s c=64 {gap}ms {ours}/nginx (>= 0.9)"] = ratio((kind, concurrency, gap), "req/s")
    values["errors, all levels and targets (== 0)"] = sum(v[column["errors"]] for v in table.values())
    return values


def ratios(table: Table) -> dict[str, float]:
    return target_ratios(table, "sidecar")


def median_of_defined(values: list[float]) -> float:
    defined = [v for v in values if not math.isnan(v)]
    return statistics.median(defined) if defined else float("nan")


def print_ratios(values: dict[str, float]) -> None:
    for name, value in values.items():
        print(f"  {name:<50} {value:8.3f}")
    print(flush=True)


def run_and_report(
    targets: list[Target],
    seconds: float,
    runs: int,
    ratios_of: Callable[[Table], dict[str, float]] = ratios,
    label: str = "",
) -> None:
    """Measure every level against every target `runs` times, printing each run's table and ratios,
    then (several runs) the medians."""
    tables, all_ratios = [], []
    for run in range(1, runs + 1):
        print(f"run {run}/{runs} ({seconds:g} s per level and target{label})", flush=True)
        tables.append(summarize(run_once(targets, seconds)))
        all_ratios.append(ratios_of(tables[-1]))
        print_table(tables[-1])
        print_ratios(all_ratios[-1])
    if runs > 1:
        print(f"medians over {runs} runs (each ratio from its own run, then the median):")
        print_table(median_table(tables))
        print_ratios({name: median_of_defined([r[name] for r in all_ratios]) for name in all_ratios[0]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per level and target")
    parser.add_argument("--serve-engine", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engine:
        serve_engine(args.serve_engine)
        return

    nginx = ensure_nginx()
    workdir = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    engine_port, sidecar_port, nginx_port = free_ports(3)
    processes = []
    try:
        engine = start_process("engine", [sys.executable, __file__, "--serve-engine", str(engine_port)], workdir)
        processes.append(engine)
        engine_url = f"http://127.0.0.1:{engine_port}"
        wait_http(engine_url + "/health", "the fake engine", workdir / "engine.log")

        sidecar = start_sidecar(workdir, sidecar_port, engine_url)
        processes.append(sidecar)
        sidecar_url = f"http://127.0.0.1:{sidecar_port}"
        wait_http(sidecar_url + "/readyz", "the sidecar to be ready", workdir / "sidecar.log")

        conf = NGINX_CONF.format(dir=workdir / "nginx", key=KEY, engine_port=engine_port, port=nginx_port)
        proxy = start_nginx(nginx, workdir, conf)
        processes.append(proxy)
        nginx_url = f"http://127.0.0.1:{nginx_port}"
        wait_until(
            lambda: asyncio.run(load(nginx_url, 1, 0.05, False, 0)).requests > 0,
            30,
            "nginx",
            on_timeout=lambda: "\n" + tail(workdir / "nginx.log") + tail(workdir / "nginx" / "nginx-error.log"),
        )

        targets = [
            Target("direct", engine_url),
            Target("sidecar", sidecar_url, sidecar),
            Target("nginx", nginx_url, proxy),
        ]
        run_and_report(targets, args.seconds, args.runs)
    finally:
        for process in reversed(processes):
            stop_process(process)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
