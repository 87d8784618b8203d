"""Hostile clients: what they cost the sidecar and the gateway (issue 32: without a key; issue 45: the
pools one client, key or address could fill for everyone).

    .venv/bin/python -m bench.hostile_bench                                 # both proxies, every attack
    .venv/bin/python -m bench.hostile_bench --proxy sidecar --attack headers incomplete-idle
    .venv/bin/python -m bench.hostile_bench --src /tmp/ms-before            # the proxies of another checkout
    .venv/bin/python -m bench.hostile_bench --before-src /tmp/ms-before     # before (it), after (this): side by side

(`git worktree add /tmp/ms-before <commit>`, or `git archive <commit> | tar -x -C /tmp/ms-before`, makes
such a checkout: its proxies run with PYTHONPATH=<it>, this script, the fake engine and the sandbox's
helpers from here.)

The proxy under test is its real program, each time fresh for one attack: `modelserve-sidecar`
(private, one key in a Secret-like directory) in front of bench/sidecar_bench.py's fake engine, or
`modelserve-gateway` (its own main, the Kubernetes discovery swapped for a fixed table) in front of
one such sidecar: the private model `fake` with that sidecar as its ready replica, and the private
model `zero` with none (held requests). The proxy is pinned to one core (PROXY_CPU); the engine,
the sidecar behind the gateway and this script float.

The attacks, on raw sockets (no HTTP client), none with a key; each stops by itself (its own
bounds of count, bytes and time, and the --rss-cap-mib safety stop), every socket closed at its end:
  headers          headers-endless: one request line, then header lines for ever (up to --endless-mib);
                   headers-many: requests with --many-fields small header fields; header-name:
                   requests with a --header-name-kib header name (both repeated on --repeat-conns
                   connections for --repeat-seconds)
  incomplete       --conns connections each sending nothing (incomplete-idle), half a request line
                   (-line), half a header section (-headers), or 10 of 1,000 body bytes (-body), held
                   --incomplete-seconds; the proxy starts with an open-file soft limit of --nofile
  bodies           bodies-held: connections each declaring a body and sending all but its last byte, held
                   (sidecar: --sidecar-bodies of 64 KiB; gateway: --gateway-bodies of 10 MiB);
                   bodies-rounds: --rounds rounds of that, closed in between, does the memory come back?
  zero             zero-held (gateway): --zero-held keyless requests for the model at zero, then a
                   keyed one for it (held, or refused?) and what GET /held counts
  pools            (issue 45) budget-fill (N1): stalled 10 MiB bodies that fill the 64 MiB body budget,
                   sent again as the proxy cuts them, for --pool-seconds; from a key limited to 2 in
                   flight and 5 a minute (sidecar), with a key nobody issued (gateway: it holds no keys);
                   pipelined-heads (N2): --head-conns connections each sending GET /healthz and, in the
                   same write, the start of a request whose head is --pipelined-head-kib KiB, held;
                   cap-in-flight (N4): a key without limits keeps the connection cap (--cap-conns, the
                   proxy's MODELSERVE[_GATEWAY]_MAX_CONNECTIONS for this attack) + 12 slow streams in
                   flight
During each, on new connections: GET /healthz and a keyed chat completion (the key, model `fake`),
one after the other every second. Figures of the proxy's process: RSS (VmRSS) before, at the
attack's peak (polled every 0.1 s; HWM: the kernel's VmHWM) and after the attacker's sockets closed
(once steady, at most --settle-seconds), its open descriptors (/proc/<pid>/fd), its CPU seconds,
and its open-file soft limit during the attack. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.operator_scale import cpu_seconds, peak_rss_mib, rss_mib
from bench.sidecar_bench import KEY, MODEL, PROXY_CPU, wait_http
from harness.sidecar import SecretDir, launch_sidecar, wait_ready
from modelserve.http.limits import ConnectionLimits
from modelserve_sandbox.processes import free_ports, start_process, stop_process

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MiB = 1024 * 1024
NAMESPACE = "bench"
ZERO = "zero"  # the gateway's private model with no replica
# The sidecar's keys besides the probes' (KEY): a key limited as the issue's N1 attacker's was, and one
# without limits (N4); the gateway's attacker sends one nobody issued, which it cannot tell from a real one.
LIMITED_KEY = "sk-bench-limited"
FLOOD_KEY = "sk-bench-flood"
MADE_UP_KEY = "sk-nobody-issued"
CHAT = b"/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
PROBE_GAP = 1.0  # seconds between two rounds of probes
HEALTH_TIMEOUT = 3.0
CHAT_TIMEOUT = 5.0
CONNECT_TIMEOUT = 3.0
DRAIN_SECONDS = "2"  # the proxies' drain on SIGTERM: the bench stops them after each attack


# --- the requests --------------------------------------------------------------------------------


def chat_body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": HELLO, "max_tokens": 8}).encode()


def request_head(length: int | None, extra: bytes = b"", close: bool = False) -> bytes:
    """A chat completion's request line and headers, without a key unless in `extra`."""
    head = b"POST %b HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n" % (CHAT, HOST.encode())
    if length is not None:
        head += b"Content-Length: %d\r\n" % length
    if close:
        head += b"Connection: close\r\n"
    return head + extra + b"\r\n"


def keyed_chat(model: str) -> bytes:
    body = chat_body(model)
    return request_head(len(body), b"Authorization: Bearer %b\r\n" % KEY.encode(), close=True) + body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode()


def status_of(line: bytes) -> str:
    """'401' from 'HTTP/1.1 401 Unauthorized'; the line itself if it is not a status line."""
    parts = line.split()
    return parts[1].decode("latin-1") if len(parts) > 1 and line.startswith(b"HTTP/") else line[:40].decode("latin-1")


def failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError):
        return "RST"
    if isinstance(exc, (BrokenPipeError, asyncio.IncompleteReadError)):
        return "closed"
    return type(exc).__name__


async def exchange(port: int, request: bytes, timeout: float) -> tuple[str, str]:
    """One request on a new connection: ('status', its code) or ('failed', how), and its head's bytes."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(request)
            await writer.drain()
            line = await reader.readline()
            if not line:
                return "failed", "closed"
            return "status", status_of(line)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        return "failed", failure(exc)
    finally:
        if writer is not None:
            writer.transport.abort()


async def probe(port: int, request: bytes, timeout: float) -> str:
    """'ok' for a 200, else what came instead."""
    kind, what = await exchange(port, request, timeout)
    return "ok" if (kind, what) == ("status", "200") else what


# --- the proxy's process -------------------------------------------------------------------------


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def file_limit_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return line.split()[3]
    return "?"


@contextmanager
def inherited_file_limit(soft: int | None) -> Iterator[None]:
    """Processes started inside get this open-file soft limit (rlimits pass through fork and exec, as
    a preexec_fn's setrlimit would set it; the sandbox's start_process has a preexec_fn of its own).
    The bench holds no attack socket while it is lowered."""
    if soft is None:
        yield
        return
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, old[1]), old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def pin(pid: int, cpu: str) -> None:
    """Every thread of `pid` to `cpu` (taskset for a process someone else started)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), {int(cpu)})


def source_env(src: Path | None) -> dict[str, str]:
    """The proxies' modules from `src` (a checkout with modelserve/ at its root), else this one's."""
    return {"PYTHONPATH": str(src)} if src else {}


def modelserve_location(src: Path | None) -> str:
    """Where a proxy started with source_env(src) imports modelserve from (checked, not assumed)."""
    code = "import modelserve, os; print(os.path.dirname(os.path.dirname(modelserve.__file__)))"
    env = {**os.environ, **source_env(src)}
    found = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, check=True)
    return found.stdout.strip()


def serve_gateway(spec: str) -> None:
    """modelserve-gateway's own main with its Kubernetes discovery swapped for a fixed table of private
    models. Runs in the gateway's process from its source (inspect.getsource, `python -P -c`): it
    imports nothing but modelserve, from the checkout under test."""
    import json

    from modelserve.gateway import main as gateway_main
    from modelserve.gateway.directory import Model
    from modelserve.gateway.discovery import FixedDiscovery
    from modelserve.gateway.routing import Ring

    table = json.loads(spec)
    models = []
    for name, addresses in table["models"].items():
        replicas = tuple(addresses)
        pods = {address: f"{name}-{i}" for i, address in enumerate(replicas)}
        ring = Ring(replicas) if replicas else None
        models.append(Model(table["namespace"], name, public=False, replicas=replicas, pods=pods, ring=ring))
    assert hasattr(gateway_main, "KubeDiscovery"), "modelserve/gateway/main.py no longer names KubeDiscovery"
    gateway_main.KubeDiscovery = lambda namespaces: FixedDiscovery(models)
    gateway_main.main([])


@dataclass
class Target:
    """The proxy under test, ready: where it listens, its process, and what else was started for it."""

    kind: str
    port: int
    process: subprocess.Popen
    others: list[subprocess.Popen] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Place:
    """What every proxy of one source run shares: the directory, the engine, the key, the source."""

    workdir: Path
    engine_url: str
    src: Path | None

    def sidecar(self, nofile: int | None = None, extra: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
        keys = self.workdir / "keys"
        if not keys.exists():
            limited = json.dumps({"keys": [LIMITED_KEY], "maxInFlight": 2, "requestsPerMinute": 5})
            SecretDir(keys).write({"api-key": KEY + "\n", "limited": limited, "flood": FLOOD_KEY + "\n"})
        env = {"MODELSERVE_KEYS_DIR": str(keys), "MODELSERVE_DRAIN_SECONDS": DRAIN_SECONDS, **source_env(self.src)}
        env.update(extra or {})
        with inherited_file_limit(nofile):
            sidecar = launch_sidecar(self.workdir / "logs", self.engine_url, MODEL, env)
        try:
            wait_ready(sidecar)
        except BaseException:
            stop_process(sidecar.process)
            raise
        return sidecar.process, int(sidecar.url.rsplit(":", 1)[1])

    def gateway(
        self, replica: str, nofile: int | None, extra: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, int]:
        (port,) = free_ports(1)
        spec = json.dumps({"namespace": NAMESPACE, "models": {MODEL: [replica], ZERO: []}})
        code = "from __future__ import annotations\n" + textwrap.dedent(inspect.getsource(serve_gateway))
        code += "\nimport sys\nserve_gateway(sys.argv[1])\n"
        env = {
            **os.environ,
            "MODELSERVE_GATEWAY_LISTEN_HOST": HOST,
            "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
            "MODELSERVE_GATEWAY_DRAIN_SECONDS": DRAIN_SECONDS,
            **source_env(self.src),
            **(extra or {}),
        }
        argv = ["taskset", "-c", PROXY_CPU, sys.executable, "-P", "-c", code, spec]
        with inherited_file_limit(nofile):
            process = start_process(f"gateway-{port}", argv, self.workdir / "logs", env)
        try:
            wait_http(f"http://{HOST}:{port}/readyz", "the gateway", self.workdir / "logs" / f"gateway-{port}.log")
        except BaseException:
            stop_process(process)
            raise
        return process, port

    @contextmanager
    def proxy(self, kind: str, nofile: int | None, extra: dict[str, str] | None = None) -> Iterator[Target]:
        started: list[subprocess.Popen] = []
        try:
            if kind == "sidecar":
                process, port = self.sidecar(nofile, extra)
                started.append(process)
                pin(process.pid, PROXY_CPU)
                target = Target(kind, port, process)
            else:
                behind, sidecar_port = self.sidecar()
                started.append(behind)
                process, port = self.gateway(f"{HOST}:{sidecar_port}", nofile, extra)
                started.append(process)
                target = Target(kind, port, process, [behind])
            yield target
        finally:
            for process in reversed(started):
                stop_process(process)


# --- one attack's run: its connections, the probes, the proxy's figures --------------------------


@dataclass(eq=False)
class Conn:
    """An attacker's connection, and what it saw: the answer's status, or how the proxy ended it."""

    writer: asyncio.StreamWriter
    status: str | None = None
    ended: str | None = None
    at: float = 0.0  # seconds from the attack's start to the answer or the end
    watcher: asyncio.Task[None] | None = None

    def saw(self) -> str:
        return self.status or (f"{self.ended}, no answer" if self.ended else "no answer (open)")


class Monitor:
    """The proxy's RSS and descriptors every 0.1 s; `capped` once its RSS passed the safety cap."""

    def __init__(self, pid: int, cap_mib: float) -> None:
        self.pid = pid
        self.cap_mib = cap_mib
        self.peak_rss = 0.0
        self.peak_fds = 0
        self.capped = False
        self.died = False
        self.task: asyncio.Task[None] | None = None

    def sample(self) -> tuple[float, int]:
        rss, fds = rss_mib(self.pid), fd_count(self.pid)
        self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)
        self.capped = self.capped or rss > self.cap_mib
        return rss, fds

    async def run(self) -> None:
        while True:
            try:
                self.sample()
            except (FileNotFoundError, ProcessLookupError):
                self.died = True
                return
            await asyncio.sleep(0.1)


@dataclass
class Knobs:
    endless_mib: float
    header_line_bytes: int
    many_fields: int
    header_name_kib: int
    repeat_conns: int
    repeat_seconds: float
    repeat_mib: float
    conns: int
    nofile: int
    incomplete_seconds: float
    sidecar_bodies: int
    sidecar_body_bytes: int
    gateway_bodies: int
    gateway_body_mib: float
    rounds: int
    sidecar_round_conns: int
    gateway_round_conns: int
    zero_held: int
    pool_seconds: float
    head_conns: int
    pipelined_head_kib: int
    cap_conns: int
    hold_seconds: float
    attack_seconds: float
    settle_seconds: float
    rss_cap_mib: float


class Run:
    """One attack on one fresh proxy: the attacker's connections, and the probes once it is loaded."""

    def __init__(self, target: Target, knobs: Knobs, monitor: Monitor) -> None:
        self.target = target
        self.port = target.port
        self.knobs = knobs
        self.monitor = monitor
        self.started = time.monotonic()
        self.conns: list[Conn] = []
        self.connect_failures: Counter[str] = Counter()
        self.health: list[str] = []
        self.chat: list[str] = []
        self.round_rss: list[float] = []
        self._stop = asyncio.Event()
        self._probes: asyncio.Task[None] | None = None

    @property
    def capped(self) -> bool:
        return self.monitor.capped or self.monitor.died

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # --- the probes ---------------------------------------------------------------------------

    def loaded(self) -> None:
        """The attack is on: probe from now until the end."""
        if self._probes is None:
            self._probes = asyncio.create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while True:
            self.health.append(await probe(self.port, get("/healthz"), HEALTH_TIMEOUT))
            self.chat.append(await probe(self.port, keyed_chat(MODEL), CHAT_TIMEOUT))
            if self._stop.is_set():
                return
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), PROBE_GAP)

    async def hold(self, seconds: float) -> None:
        """Keep the attack's connections as they are for `seconds`, probing."""
        self.loaded()
        await asyncio.sleep(seconds)

    # --- the attacker's connections ---------------------------------------------------------------

    async def connect(self, count: int, first: bytes = b"") -> list[Conn]:
        """`count` new connections, each sending `first`; the ones that connected."""
        gate = asyncio.Semaphore(64)

        async def one() -> Conn | None:
            async with gate:
                try:
                    async with asyncio.timeout(CONNECT_TIMEOUT):
                        reader, writer = await asyncio.open_connection(HOST, self.port)
                except (OSError, TimeoutError) as exc:
                    self.connect_failures[f"connect {failure(exc)}"] += 1
                    return None
                conn = Conn(writer)
                conn.watcher = asyncio.create_task(self._watch(conn, reader))
                if first:
                    await self.send(conn, first)
                return conn

        conns = [conn for conn in await asyncio.gather(*(one() for _ in range(count))) if conn is not None]
        self.conns += conns
        return conns

    async def send(self, conn: Conn, data: bytes) -> bool:
        """Write and wait until the proxy has taken it (flow control); False once it cannot."""
        if conn.ended or conn.writer.is_closing():
            return False
        try:
            conn.writer.write(data)
            await conn.writer.drain()
        except (OSError, RuntimeError):
            return False
        return True

    async def _watch(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        try:
            line = await reader.readline()
            if line:
                conn.status, conn.at = status_of(line), self.elapsed()
            while await reader.read(65536):  # until the proxy ends it
                pass
            conn.ended = "closed"
        except (OSError, ValueError) as exc:
            conn.ended = failure(exc)
        if not conn.status:
            conn.at = self.elapsed()

    async def drop(self, conns: list[Conn]) -> None:
        """Close these connections at once (RST), their watchers first (it is not the proxy's doing)."""
        for conn in conns:
            if conn.watcher is not None:
                conn.watcher.cancel()
            conn.writer.transport.abort()
        await asyncio.sleep(0)

    async def close(self) -> None:
        self._stop.set()
        if self._probes is not None:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._probes, HEALTH_TIMEOUT + CHAT_TIMEOUT + 1)
        await self.drop(self.conns)

    # --- what the attacker saw ------------------------------------------------------------------

    def seen(self) -> str:
        """Each thing the attacker's connections saw, how many times and (median) when."""
        outcomes: dict[str, list[float]] = {}
        for conn in self.conns:
            outcomes.setdefault(conn.saw(), []).append(conn.at)
        parts = []
        for what, times in sorted(outcomes.items(), key=lambda item: -len(item[1])):
            when = f" at {statistics.median(times):.1f}s" if what != "no answer (open)" else ""
            parts.append(f"{len(times)}x {what}{when}")
        parts += [f"{count}x {what}" for what, count in self.connect_failures.items()]
        return ", ".join(parts) or "nothing"


# --- the attacks ----------------------------------------------------------------------------------


async def headers_endless(run: Run) -> str:
    """One request line, then header lines as fast as the proxy reads them, up to --endless-mib."""
    knobs = run.knobs
    (conn,) = await run.connect(1, b"POST %b HTTP/1.1\r\nHost: %b\r\n" % (CHAT, HOST.encode()))
    run.loaded()
    line = b"X-Filler: " + b"a" * max(1, knobs.header_line_bytes - 12) + b"\r\n"
    chunk = line * max(1, 65536 // len(line))
    limit, sent, deadline = knobs.endless_mib * MiB, 0, time.monotonic() + knobs.attack_seconds
    stop = "sent all"
    while sent < limit:
        if run.capped:
            stop = "stopped at the RSS cap"
            break
        if time.monotonic() > deadline:
            stop = "time limit"
            break
        if conn.status or not await run.send(conn, chunk):
            stop = "the proxy ended it"
            break
        sent += len(chunk)
    await run.hold(knobs.hold_seconds)
    return f"{run.seen()}; {sent / MiB:.0f} MiB sent ({stop})"


async def repeated(run: Run, request: bytes) -> str:
    """`request` again and again on --repeat-conns connections, one request per new connection."""
    knobs = run.knobs
    run.loaded()
    answers: Counter[str] = Counter()
    times: list[float] = []
    deadline = time.monotonic() + knobs.repeat_seconds
    budget = {"bytes": knobs.repeat_mib * MiB}

    async def worker() -> None:
        while time.monotonic() < deadline and budget["bytes"] >= len(request) and not run.capped:
            budget["bytes"] -= len(request)
            began = time.monotonic()
            _, what = await exchange(run.port, request, 15)
            answers[what] += 1
            times.append(time.monotonic() - began)

    await asyncio.gather(*(worker() for _ in range(knobs.repeat_conns)))
    seen = ", ".join(f"{count}x {what}" for what, count in answers.most_common())
    median = statistics.median(times) * 1000 if times else float("nan")
    return f"{seen} ({len(request) / 1024:.0f} KiB each, median {median:.0f} ms)"


async def headers_many(run: Run) -> str:
    fields = b"".join(b"X-H%d: v\r\n" % i for i in range(run.knobs.many_fields))
    body = chat_body(MODEL)
    return await repeated(run, request_head(len(body), fields, close=True) + body)


async def header_name(run: Run) -> str:
    name = b"X" * (run.knobs.header_name_kib * 1024)
    body = chat_body(MODEL)
    return await repeated(run, request_head(len(body), name + b": v\r\n", close=True) + body)


def incomplete(first: bytes) -> Callable[[Run], Awaitable[str]]:
    async def attack(run: Run) -> str:
        await run.connect(run.knobs.conns, first)
        await run.hold(run.knobs.incomplete_seconds)
        return run.seen()

    return attack


FULL_HEAD = request_head(1000)
INCOMPLETE = {
    "incomplete-idle": b"",
    "incomplete-line": b"POST /v1/chat/comp",
    "incomplete-headers": FULL_HEAD[: len(FULL_HEAD) // 2],
    "incomplete-body": FULL_HEAD + b'{"model": ',  # 10 of its 1,000 bytes
}


def body_sizes(run: Run) -> tuple[int, int]:
    """(connections, declared body bytes) of the bodies attacks on this proxy."""
    knobs = run.knobs
    if run.target.kind == "sidecar":
        return knobs.sidecar_bodies, knobs.sidecar_body_bytes
    return knobs.gateway_bodies, int(knobs.gateway_body_mib * MiB)


async def send_bodies(run: Run, count: int, declared: int) -> tuple[list[Conn], int]:
    """`count` connections each declaring `declared` body bytes and sending all but the last one."""
    conns = await run.connect(count, request_head(declared))
    opening = b'{"model": "fake", "messages": [{"role": "user", "content": "'
    piece = (opening + b"a" * (256 * 1024))[: 256 * 1024]
    filler = b"a" * len(piece)
    sent = 0
    deadline = time.monotonic() + run.knobs.attack_seconds
    gate = asyncio.Semaphore(64)

    async def fill(conn: Conn) -> None:
        nonlocal sent
        left = declared - 1
        first = True
        async with gate:
            while left and not run.capped and time.monotonic() < deadline:
                size = min(left, len(piece))
                data = (piece if first else filler)[:size]
                first = False
                if not await run.send(conn, data):
                    return
                left -= size
                sent += size

    await asyncio.gather(*(fill(conn) for conn in conns))
    return conns, sent


async def bodies_held(run: Run) -> str:
    count, declared = body_sizes(run)
    _, sent = await send_bodies(run, count, declared)
    await run.hold(run.knobs.hold_seconds)
    capped = " (stopped at the RSS cap)" if run.capped else ""
    return f"{run.seen()}; {sent / MiB:.0f} MiB sent{capped}"


async def bodies_rounds(run: Run) -> str:
    knobs = run.knobs
    _, declared = body_sizes(run)
    count = knobs.sidecar_round_conns if run.target.kind == "sidecar" else knobs.gateway_round_conns
    run.loaded()
    for _ in range(knobs.rounds):
        conns, _ = await send_bodies(run, count, declared)
        await asyncio.sleep(1)
        await run.drop(conns)
        run.round_rss.append((await settle(run.target.pid, None, knobs.settle_seconds))[0])
    after = " / ".join(f"{rss:.0f}" for rss in run.round_rss)
    return f"{knobs.rounds} rounds of {count}: {run.seen()}; RSS after each round {after} MiB"


async def zero_held(run: Run) -> str:
    """Keyless requests for the model at zero, then a keyed one: held, or refused? And GET /held."""
    body = chat_body(ZERO)
    await run.connect(run.knobs.zero_held, request_head(len(body)) + body)
    await asyncio.sleep(1)
    run.loaded()
    keyed = await run.connect(1, keyed_chat(ZERO))
    failed = ", ".join(run.connect_failures)
    for conn in keyed:
        run.conns.remove(conn)  # not the attacker's
    await asyncio.sleep(3)
    keyed_saw = keyed[0].saw() if keyed else failed
    if keyed_saw == "no answer (open)":
        keyed_saw = "held (no answer in 3 s)"
    _, held = await fetch(run.port, "/held")
    await run.hold(run.knobs.hold_seconds)
    await run.drop(keyed)
    return f"{run.seen()}; then a keyed one for {ZERO}: {keyed_saw}; GET /held: {held}"


async def fetch(port: int, path: str) -> tuple[str, str]:
    """GET `path`: (status, body), raw."""
    try:
        async with asyncio.timeout(5):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                writer.write(get(path))
                data = await reader.read()
            finally:
                writer.transport.abort()
    except (OSError, TimeoutError) as exc:
        return failure(exc), ""
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = b"".join(body.split(b"\r\n")[1::2])
    return status_of(head.split(b"\r\n")[0]), body.decode(errors="replace").strip()


def keyed_head(length: int, key: str, extra: bytes = b"") -> bytes:
    return request_head(length, b"Authorization: Bearer %b\r\n" % key.encode() + extra)


async def fill(run: Run, conn: Conn, size: int) -> int:
    """Send `size` body bytes on `conn` as fast as the proxy takes them; the bytes it took."""
    piece = b" " * (256 * 1024)
    sent = 0
    while sent < size and not run.capped:
        data = piece[: min(len(piece), size - sent)]
        if not await run.send(conn, data):
            break
        sent += len(data)
    return sent


async def budget_fill(run: Run) -> str:
    """N1: stalled bodies that fill the budget to its last byte (the issue's six of 10 MiB and "the
    rest"), each sent again once the proxy cut it, until --pool-seconds are over: any request with a
    body then crosses it."""
    key = LIMITED_KEY if run.target.kind == "sidecar" else MADE_UP_KEY
    declared = 10 * MiB
    budget = ConnectionLimits().body_budget_bytes  # both proxies' default
    sizes = [declared - 1] * (budget // (declared - 1))
    sizes.append(budget - sum(sizes) - 1)
    deadline = time.monotonic() + run.knobs.pool_seconds
    run.loaded()
    held = [0]

    async def keep_one(size: int) -> None:
        while time.monotonic() < deadline and not run.capped:
            conns = await run.connect(1, keyed_head(declared, key))
            if not conns:
                await asyncio.sleep(0.2)
                continue
            conn = conns[0]
            if await fill(run, conn, size) == size:
                held[0] += 1
            while not (conn.ended or conn.status) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)

    await asyncio.gather(*(keep_one(size) for size in sizes))
    return f"{run.seen()}; {held[0]} bodies sent as far as they were meant to stall"


async def pipelined_heads(run: Run) -> str:
    """N2: a request the proxy answers, and in the same write a head of --pipelined-head-kib KiB begun
    behind it, never finished, on --head-conns connections."""
    big = b"X-Big: " + b"v" * (run.knobs.pipelined_head_kib * 1024) + b"\r\n"
    first = f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode() + request_head(1000, big)[:-2]
    await run.connect(run.knobs.head_conns, first)
    await run.hold(run.knobs.hold_seconds)
    return run.seen()


async def cap_in_flight(run: Run) -> str:
    """N4: a key without limits keeps the cap + 12 streams in flight at an engine sending a token every 3 s."""
    body = json.dumps({"model": MODEL, "messages": HELLO, "stream": True}).encode()
    request = keyed_head(len(body), FLOOD_KEY, b"x-gap-ms: 3000\r\n") + body
    await run.connect(run.knobs.cap_conns + 12, request)
    await run.hold(run.knobs.hold_seconds)
    return run.seen()


def cap_env(knobs: Knobs, kind: str) -> dict[str, str]:
    variable = "MODELSERVE_MAX_CONNECTIONS" if kind == "sidecar" else "MODELSERVE_GATEWAY_MAX_CONNECTIONS"
    return {variable: str(knobs.cap_conns)}


@dataclass(frozen=True)
class Attack:
    name: str
    group: str
    run: Callable[[Run], Awaitable[str]]
    proxies: tuple[str, ...] = ("sidecar", "gateway")
    env: Callable[[Knobs, str], dict[str, str]] | None = None  # the proxy's own settings for it


ATTACKS = [
    Attack("headers-endless", "headers", headers_endless),
    Attack("headers-many", "headers", headers_many),
    Attack("header-name", "headers", header_name),
    *(Attack(name, "incomplete", incomplete(first)) for name, first in INCOMPLETE.items()),
    Attack("bodies-held", "bodies", bodies_held),
    Attack("bodies-rounds", "bodies", bodies_rounds),
    Attack("zero-held", "zero", zero_held, ("gateway",)),
    Attack("budget-fill", "pools", budget_fill),
    Attack("pipelined-heads", "pools", pipelined_heads),
    Attack("cap-in-flight", "pools", cap_in_flight, env=cap_env),
]
GROUPS = sorted({attack.group for attack in ATTACKS})


# --- measuring one attack ---------------------------------------------------------------------------


@dataclass
class Row:
    proxy: str
    attack: str
    nofile: str = "?"
    rss_before: float = float("nan")
    rss_peak: float = float("nan")
    rss_after: float = float("nan")
    hwm: float = float("nan")
    fds_before: int = 0
    fds_peak: int = 0
    fds_after: int = 0
    cpu: float = float("nan")
    health: str = ""
    chat: str = ""
    saw: str = ""


async def settle(pid: int, fds_before: int | None, seconds: float) -> tuple[float, int]:
    """The proxy's RSS and descriptors once steady (its descriptors back to `fds_before` + 2 and its
    RSS within 0.5 MiB over 0.5 s), or after `seconds`."""
    deadline = time.monotonic() + seconds
    last = None
    while True:
        rss, fds = rss_mib(pid), fd_count(pid)
        fds_back = fds_before is None or fds <= fds_before + 2
        if (fds_back and last is not None and abs(rss - last) < 0.5) or time.monotonic() > deadline:
            return rss, fds
        last = rss
        await asyncio.sleep(0.5)


def tally(results: list[str]) -> str:
    if not results:
        return "-"
    ok = results.count("ok")
    failed = Counter(result for result in results if result != "ok")
    return f"{ok}/{len(results)}" + (f" {failed.most_common(1)[0][0]}" if failed else "")


async def measure(target: Target, attack: Attack, knobs: Knobs) -> Row:
    pid = target.pid
    row = Row(target.kind, attack.name, file_limit_of(pid))
    await asyncio.sleep(0.5)  # the start's own allocations settled
    row.rss_before, row.fds_before = rss_mib(pid), fd_count(pid)
    cpu_before = cpu_seconds(pid)
    monitor = Monitor(pid, knobs.rss_cap_mib)
    monitor.task = asyncio.create_task(monitor.run())
    run = Run(target, knobs, monitor)
    budget = knobs.attack_seconds + max(knobs.hold_seconds, knobs.incomplete_seconds, knobs.pool_seconds) + 30
    try:
        async with asyncio.timeout(budget):
            row.saw = await attack.run(run)
    except TimeoutError:
        row.saw = f"{run.seen()} (the bench's {budget:.0f} s limit)"
    except Exception as exc:  # the bench's own failure: shown in the row, the other attacks go on
        row.saw = f"{run.seen()}; THE BENCH FAILED: {exc!r}"
    finally:
        await run.close()
    row.health, row.chat = tally(run.health), tally(run.chat)
    if target.process.poll() is not None or monitor.died:
        row.saw += f"; THE PROXY EXITED ({target.process.poll()})"
        monitor.task.cancel()
        return row
    row.hwm = peak_rss_mib(pid)
    row.cpu = cpu_seconds(pid) - cpu_before
    row.rss_after, row.fds_after = await settle(pid, row.fds_before, knobs.settle_seconds)
    monitor.task.cancel()
    row.rss_peak, row.fds_peak = max(monitor.peak_rss, row.rss_after), max(monitor.peak_fds, row.fds_after)
    return row


# --- the table ------------------------------------------------------------------------------------

COLUMNS = (
    ("proxy", 8),
    ("attack", 19),
    ("nofile", 7),
    ("RSS MiB before", 15),
    ("peak", 8),
    ("after", 7),
    ("HWM", 7),
    ("fds peak", 9),
    ("after", 6),
    ("cpu s", 6),
    ("healthz", 14),
    ("keyed chat", 14),
)


def mib(value: float, limit: float | None = None) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.0f}" + ("!" if limit is not None and value > limit else "")


def print_rows(rows: list[Row], limits: dict[str, float]) -> None:
    print("".join(f"{name:>{width}}" if i > 1 else f"{name:<{width}}" for i, (name, width) in enumerate(COLUMNS)))
    for row in rows:
        limit = limits[row.proxy]
        cells = (
            row.proxy,
            row.attack,
            row.nofile,
            mib(row.rss_before),
            mib(row.rss_peak, limit),
            mib(row.rss_after, limit),
            mib(row.hwm, limit),
            str(row.fds_peak),
            str(row.fds_after),
            "-" if math.isnan(row.cpu) else f"{row.cpu:.1f}",
            row.health,
            row.chat,
        )
        print(
            "".join(
                f"{c:>{w}}" if i > 1 else f"{c:<{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS, strict=True))
            )
        )
    print("what the attacker saw:")
    for row in rows:
        print(f"  {row.proxy:<8}{row.attack:<19} {row.saw}")
    print(flush=True)


def print_side_by_side(before: list[Row], after: list[Row], limits: dict[str, float]) -> None:
    print("before -> after")
    header = f"{'proxy':<8}{'attack':<19}{'peak MiB':>14}{'after MiB':>14}{'fds peak':>14}"
    print(header + f"{'healthz':>26}{'keyed chat':>26}")
    paired = {(row.proxy, row.attack): row for row in after}
    for old in before:
        new = paired.get((old.proxy, old.attack))
        if new is None:
            continue
        limit = limits[old.proxy]

        def both(a: str, b: str, width: int) -> str:
            return f"{a + ' -> ' + b:>{width}}"

        print(
            f"{old.proxy:<8}{old.attack:<19}"
            + both(mib(old.rss_peak, limit), mib(new.rss_peak, limit), 14)
            + both(mib(old.rss_after, limit), mib(new.rss_after, limit), 14)
            + both(str(old.fds_peak), str(new.fds_peak), 14)
            + both(old.health, new.health, 26)
            + both(old.chat, new.chat, 26)
        )
    print("what the attacker saw, before | after:")
    for old in before:
        new = paired.get((old.proxy, old.attack))
        if new is not None:
            print(f"  {old.proxy:<8}{old.attack:<19} {old.saw}\n  {'':<27} | {new.saw}")
    print(flush=True)


# --- the runs -------------------------------------------------------------------------------------


def memory_limits() -> dict[str, float]:
    """The containers' memory limits (MiB) of this checkout's manifests: the sidecar's from the
    operator's pod template, the gateway's from the chart's values."""
    from harness.testdata import model_server
    from modelserve.api.manifests import sidecar_container
    from modelserve.contracts.operator_settings import Settings

    units = {"Mi": 1, "Gi": 1024}

    def parse(quantity: str) -> float:
        number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
        return float(number) * units[unit]

    one_worker = model_server(sidecar={"workers": 1})  # the sidecar under test runs one
    sidecar = sidecar_container(one_worker, Settings.from_env({}))["resources"]["limits"]["memory"]
    values = yaml.safe_load((REPO / "charts" / "modelserve" / "values.yaml").read_text())
    return {"sidecar": parse(sidecar), "gateway": parse(values["gateway"]["resources"]["limits"]["memory"])}


def run_all(
    place: Place, proxies: list[str], attacks: list[Attack], knobs: Knobs, limits: dict[str, float]
) -> list[Row]:
    print(
        f"proxies from {modelserve_location(place.src)}; container memory limits: "
        f"sidecar {limits['sidecar']:.0f} MiB, gateway {limits['gateway']:.0f} MiB "
        "(! marks a figure over it: the container would be OOM-killed)",
        flush=True,
    )
    rows = []
    for kind in proxies:
        for attack in attacks:
            if kind not in attack.proxies:
                continue
            nofile = knobs.nofile if attack.group == "incomplete" else None
            extra = attack.env(knobs, kind) if attack.env else None
            with place.proxy(kind, nofile, extra) as target:
                row = asyncio.run(measure(target, attack, knobs))
            rows.append(row)
            print(f"  {kind} {attack.name}: peak {mib(row.rss_peak)} MiB, {row.fds_peak} fds; {row.saw}", flush=True)
    return rows


def selected(names: list[str]) -> list[Attack]:
    chosen = set()
    for name in names:
        if name == "all":
            chosen |= {attack.name for attack in ATTACKS}
        elif name in GROUPS:
            chosen |= {attack.name for attack in ATTACKS if attack.group == name}
        else:
            chosen.add(name)
    return [attack for attack in ATTACKS if attack.name in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = ["all", *GROUPS, *(attack.name for attack in ATTACKS)]
    parser.add_argument("--proxy", choices=("sidecar", "gateway", "both"), default="both")
    parser.add_argument("--attack", nargs="+", choices=names, default=["all"], metavar="NAME", help=", ".join(names))
    parser.add_argument("--src", type=Path, help="run the proxies of this checkout (default: this one)")
    parser.add_argument("--before-src", type=Path, help="first run this checkout's, then --src's; side by side")
    size = parser.add_argument_group("sizes and times")
    size.add_argument("--endless-mib", type=float, default=200, help="headers-endless: bytes at most")
    size.add_argument("--header-line-bytes", type=int, default=64, help="headers-endless: bytes per header line")
    size.add_argument("--many-fields", type=int, default=10_000, help="headers-many: header fields per request")
    size.add_argument("--header-name-kib", type=int, default=1024, help="header-name: the name's size")
    size.add_argument("--repeat-conns", type=int, default=4, help="headers-many, header-name: at once")
    size.add_argument("--repeat-seconds", type=float, default=5, help="headers-many, header-name: for so long")
    size.add_argument("--repeat-mib", type=float, default=200, help="headers-many, header-name: bytes at most")
    size.add_argument("--conns", type=int, default=1100, help="incomplete-*: connections")
    size.add_argument("--nofile", type=int, default=1024, help="incomplete-*: the proxy's open-file soft limit")
    size.add_argument("--incomplete-seconds", type=float, default=18, help="incomplete-*: held so long")
    size.add_argument("--sidecar-bodies", type=int, default=2000, help="bodies-held: the sidecar's connections")
    size.add_argument("--sidecar-body-bytes", type=int, default=65536, help="bodies-*: the sidecar's declared body")
    size.add_argument("--gateway-bodies", type=int, default=40, help="bodies-held: the gateway's connections")
    size.add_argument("--gateway-body-mib", type=float, default=10, help="bodies-*: the gateway's declared body")
    size.add_argument("--rounds", type=int, default=3, help="bodies-rounds: rounds")
    size.add_argument("--sidecar-round-conns", type=int, default=1000, help="bodies-rounds: sidecar, per round")
    size.add_argument("--gateway-round-conns", type=int, default=20, help="bodies-rounds: gateway, per round")
    size.add_argument("--zero-held", type=int, default=60, help="zero-held: keyless requests for the model at zero")
    size.add_argument("--pool-seconds", type=float, default=20, help="budget-fill: bodies sent again for so long")
    size.add_argument("--head-conns", type=int, default=4000, help="pipelined-heads: connections")
    size.add_argument("--pipelined-head-kib", type=int, default=120, help="pipelined-heads: the held head's size")
    size.add_argument("--cap-conns", type=int, default=512, help="cap-in-flight: the proxy's connection cap")
    size.add_argument("--hold-seconds", type=float, default=6, help="how long a loaded attack is held, probing")
    size.add_argument("--attack-seconds", type=float, default=20, help="how long an attack may take to load")
    size.add_argument("--settle-seconds", type=float, default=5, help="after: wait so long at most for steady RSS")
    size.add_argument("--rss-cap-mib", type=float, default=1024, help="stop sending once the proxy's RSS passes it")
    args = parser.parse_args()
    knobs = Knobs(**{name: getattr(args, name) for name in Knobs.__dataclass_fields__})
    proxies = ["sidecar", "gateway"] if args.proxy == "both" else [args.proxy]
    attacks = selected(args.attack)

    # The attacker holds thousands of sockets: this process's soft limit up to its hard one.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    needed = max(args.conns, args.sidecar_bodies, args.sidecar_round_conns, args.head_conns) + 200
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(f"the open-file hard limit {hard} is below the {needed} this run needs")
    limits = memory_limits()
    print(
        f"hostile clients without a key; the proxy pinned to CPU {PROXY_CPU}; open-file soft limit {args.nofile} "
        f"for the incomplete attacks (set before exec), else inherited ({hard}); RSS cap {args.rss_cap_mib:g} MiB",
        flush=True,
    )

    workdir = Path(tempfile.mkdtemp(prefix="hostile-bench-"))
    (engine_port,) = free_ports(1)
    engine = None
    try:
        engine_argv = [sys.executable, str(REPO / "bench" / "sidecar_bench.py"), "--serve-engine", str(engine_port)]
        engine = start_process("engine", engine_argv, workdir)
        engine_url = f"http://{HOST}:{engine_port}"
        wait_http(engine_url + "/health", "the fake engine", workdir / "engine.log")
        if args.before_src:
            before = run_all(Place(workdir / "before", engine_url, args.before_src), proxies, attacks, knobs, limits)
            after = run_all(Place(workdir / "after", engine_url, args.src), proxies, attacks, knobs, limits)
            print(f"\nbefore: {args.before_src}")
            print_rows(before, limits)
            print(f"after: {args.src or REPO}")
            print_rows(after, limits)
            print_side_by_side(before, after, limits)
        else:
            rows = run_all(Place(workdir, engine_url, args.src), proxies, attacks, knobs, limits)
            print()
            print_rows(rows, limits)
    finally:
        if engine is not None:
            stop_process(engine)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
