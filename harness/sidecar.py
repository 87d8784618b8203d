"""Helpers of the sidecar tests: sidecar processes, a real llama.cpp engine process, and a replay
upstream that answers with the recorded bytes of a real vLLM server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from aiohttp import web

from harness.lifecycle import assert_rules_kept, counts_in
from modelserve.contracts import routes
from modelserve.contracts.key_entries import is_hash, parse_entry
from modelserve.sidecar.keys import key_files
from modelserve_sandbox.llama_server import llama_server_binary
from modelserve_sandbox.processes import (
    free_ports,
    start_process,
    stop_process,
    tail,
    wait_until,
)

REPO = Path(__file__).resolve().parents[1]
VLLM_FIXTURES = REPO / "tests" / "fixtures" / "vllm-0.32.0-cpu"  # how they were recorded: its README.md
ENGINE_ROUTES = REPO / "tests" / "fixtures" / "engine_routes"  # one table per pinned engine
# A test's requests carry it to the replay engine, which tells them from the sidecar's own probes.
MARK_HEADER = "x-test-mark"
# One table per pinned engine: `<title>-<version>` (tests/engines/test_engine_source.py derives each).
ENGINE_TABLES = ("vllm-0.33.0", "sglang-0.5.23", "llama.cpp-b11434")
SIDECAR_BIN = str(Path(sys.executable).parent / "modelserve-sidecar")
API_KEY = "sk-test-3f9a1c"  # what the tests' Secret holds
ENGINE_MODEL = "gemma-3-270m"  # the served name of the real engine
# A user turn with an image part (a text-only ModelServer refuses it before the engine).
IMAGE_MESSAGES = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg=="}},
        ],
    }
]


def hostile_json() -> dict[str, bytes]:
    """Request bodies that make Python's json module raise something other than JSONDecodeError (issue
    32): nesting past the recursion limit (RecursionError), an integer past the digit limit (ValueError)."""
    return {
        "nested_lists": b"[" * 100_000,
        "nested_objects": b'{"a":' * 1_000_000,
        "long_integer": b'{"model": "tiny", "n": ' + b"1" * 5000 + b"}",
    }


def nested_object(depth: int) -> bytes:
    """`{"a": {"a": ... 1}}` as JSON, `depth` objects deep (written out: json.dumps would recurse)."""
    return b'{"a":' * depth + b"1" + b"}" * depth


# --- the pinned engines' HTTP routes, read from their source (tests/fixtures/engine_routes) ---------


def engine_routes(table: str) -> list[dict]:
    """Each route of an engine's table: method, path, source (file:line), class, maybe `enabled`."""
    return json.loads((ENGINE_ROUTES / f"{table}.json").read_text())["routes"]


def refused_routes(table: str) -> list[dict]:
    """The routes of a table a consumer does not get."""
    return [route for route in engine_routes(table) if route["class"] != "consumer"]


@dataclass(frozen=True)
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def raw_request(
    base: str, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> RawAnswer:
    """One HTTP/1.1 exchange with the request target sent byte for byte (HTTP clients normalise dot
    segments and encodings; a proxy must be tried with what an attacker can send)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    answer_headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in header_lines)}
    if answer_headers.get("transfer-encoding") == "chunked":
        rest = dechunk(rest)
    return RawAnswer(int(status_line.split()[1]), answer_headers, rest)


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


# --- refusals and path spellings, for the sidecar's and the gateway's allowlist tests ------------


def assert_refused_here(answer: RawAnswer, method: str, path: str) -> None:
    """The allowlist's 404, in the protocol's shape (HEAD: the status alone)."""
    assert answer.status == 404, (method, path, answer)
    if method == "HEAD":
        return
    body = answer.json()
    if routes.error_shape(path) == routes.OLLAMA:
        assert set(body) == {"error"} and isinstance(body["error"], str), (path, body)
        assert body["error"].startswith(f"Invalid URL ({method} ")
    else:
        assert body["error"]["code"] == "unknown_route" and body["error"]["type"] == "invalid_request_error", body
        assert set(body["error"]) == {"message", "type", "param", "code"}


def refused_counts(metrics_text: str, program: str = "sidecar") -> Counter[str]:
    """The refusal counter of the sidecar's or the gateway's metrics, by route class."""
    sample = f'modelserve_{program}_refused_requests_total{{{{route_class="{{}}"}}}}'
    return Counter({c: int(metric_value(metrics_text, sample.format(c))) for c in routes.REFUSAL_CLASSES})


def spellings(path: str) -> list[str]:
    """Other spellings of a path: a table of the usual tricks, and each letter percent-encoded."""
    head, _, tail = path[1:].partition("/")
    tricks = [
        path + "/",
        "/" + path,
        path.replace("/", "//"),
        path.upper(),
        path.title(),
        f"/{head}/./{tail}",
        f"/{head}/x/../{tail}",
        f"/{head}/%2e/{tail}",
        f"/{head}/x/%2e%2e/{tail}",
        path + "/.",
        path + "/..",
        path + "%2F",
        path + "%00",
        path + "%20",
        path + ";x",
        path + "\\",
        "/" + path[1:].replace("/", "%2F"),
        "/" + path[1:].replace("/", "%2f"),
        "/" + path[1:].replace("/", "%252F"),
        "/" + path[1:].replace("/", "\\"),
        path + "%2F..%2F..%2Fslots",
        path + "/../../slots",
        f"/{head}/%2E%2E/%2E%2E/update_weights_from_disk",
        path + "?x=1",
    ]
    encoded = [path[:i] + f"%{ord(c):02X}" + path[i + 1 :] for i, c in enumerate(path) if c.isalpha()]
    return tricks + encoded


# Every allowed path in every other spelling (a few hundred request targets).
SPELLED = sorted({target for path in routes.ALLOWED_PATHS for target in spellings(path)})
METHODS = ("GET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH", "POST", "TRACE")


# --- a Kubernetes Secret volume, as the kubelet writes it ----------------------------------------


class SecretDir:
    """A directory laid out like a mounted Secret: visible names are symlinks into `..data`, which
    points at a timestamped directory; an update swaps `..data` atomically (AtomicWriter)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._generation = 0
        path.mkdir(parents=True, exist_ok=True)

    def write(self, files: dict[str, str]) -> None:
        self._generation += 1
        new = self.path / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self._generation}"
        new.mkdir()
        for name, content in files.items():
            (new / name).write_text(content)
        old = (self.path / "..data").resolve() if (self.path / "..data").exists() else None
        tmp = self.path / "..data_tmp"
        tmp.symlink_to(new.name)
        tmp.rename(self.path / "..data")
        for entry in self.path.iterdir():
            if not entry.name.startswith(".") and entry.name not in files:
                entry.unlink()
        for name in files:
            if not (self.path / name).is_symlink():
                (self.path / name).symlink_to(f"..data/{name}")
        if old is not None:
            shutil.rmtree(old)


# --- sidecar processes ----------------------------------------------------------------------------


@dataclass
class Sidecar:
    process: subprocess.Popen
    url: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # the settings it was started with

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self, headers: dict[str, str] | None = None) -> str:
        answer = httpx.get(self.url + "/metrics", headers=headers, timeout=10)
        answer.raise_for_status()
        return answer.text


def metric_value(text: str, sample: str) -> float:
    """The value of one exposition line `sample` (name with its labels exactly as printed), 0 if absent."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


SIDECAR_START_SECONDS = 90


def launch_sidecar(
    log_dir: Path, upstream_url: str, served_model: str, env: dict[str, str], argv_prefix: tuple[str, ...] = ()
) -> Sidecar:
    """A sidecar process on a free port; `argv_prefix`: a command it runs under (prlimit)."""
    (port,) = free_ports(1)
    full_env = {
        **os.environ,
        "MODELSERVE_LISTEN_HOST": "127.0.0.1",
        "MODELSERVE_LISTEN_PORT": str(port),
        "MODELSERVE_UPSTREAM_URL": upstream_url,
        "MODELSERVE_SERVED_MODEL": served_model,
        **env,
    }
    process = start_process(f"sidecar-{port}", [*argv_prefix, SIDECAR_BIN], log_dir, full_env)
    scheme = "https" if env.get("MODELSERVE_TLS_DIR") else "http"  # spec.tls: its one port serves HTTPS
    sidecar = Sidecar(process, f"{scheme}://127.0.0.1:{port}", log_dir / f"sidecar-{port}.log", env)

    def alive() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"sidecar exited with {process.returncode}:\n{tail(sidecar.log)}")
        try:
            # Whether it listens, whatever its certificate: a TLS test checks that itself.
            return httpx.get(sidecar.url + "/healthz", timeout=1, verify=False).status_code == 200
        except httpx.TransportError:
            return False

    try:
        # A bound, not a wait: on two cores busy with the real-node half's vLLM a sidecar once took 30 s
        # to import and bind (its "serving" line came at 29.9 s).
        wait_until(alive, SIDECAR_START_SECONDS, "the sidecar to listen", on_timeout=lambda: "\n" + tail(sidecar.log))
    except BaseException:
        stop_process(process)
        raise
    return sidecar


def stop_sidecar(sidecar: Sidecar) -> None:
    """Stop a sidecar, first checking its request pipeline's lifecycle rules (lifecycle.py) if it still
    runs and its metrics can be read (public, or with a key its Secret holds now)."""
    try:
        if sidecar.process.poll() is None:
            text = _scrape(sidecar)
            if text is not None:
                assert_rules_kept(lambda: counts_in(_scrape(sidecar) or "", "modelserve_sidecar"), "the sidecar")
    finally:
        stop_process(sidecar.process)


def _scrape(sidecar: Sidecar) -> str | None:
    keys_dir = sidecar.env.get("MODELSERVE_KEYS_DIR")
    # The plaintext keys (a hashed one cannot be sent).
    entries = [parse_entry(p.name, p.read_text()) for p in key_files(Path(keys_dir))] if keys_dir else []
    keys = sorted(k for entry in entries for k in entry.credentials if not is_hash(k))
    for headers in [{}, *({"Authorization": f"Bearer {key}"} for key in keys)]:
        try:
            answer = httpx.get(sidecar.url + "/metrics", headers=headers, timeout=10)
        except httpx.TransportError:
            return None
        if answer.status_code == 200:
            return answer.text
    return None


@contextmanager
def private_sidecar(engine_url: str, base: Path, max_tokens: int, **env: str) -> Iterator[Sidecar]:
    """A ready private sidecar (key API_KEY) in front of the engine at `engine_url`, temperature 0
    and `max_tokens` by default; stopped on exit."""
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    defaults = json.dumps({"max_tokens": max_tokens, "temperature": 0})
    settings = {"MODELSERVE_KEYS_DIR": str(base / "keys"), "MODELSERVE_SAMPLING_DEFAULTS": defaults, **env}
    running = launch_sidecar(base / "logs", engine_url, ENGINE_MODEL, settings)
    try:
        wait_ready(running)
        yield running
    finally:
        stop_sidecar(running)


def wait_ready(sidecar: Sidecar, timeout: float = 60) -> None:
    wait_until(
        lambda: httpx.get(sidecar.url + "/readyz", timeout=5).status_code == 200,
        timeout,
        "the sidecar to be ready",
        on_timeout=lambda: "\n" + tail(sidecar.log),
    )


# --- the replay upstream: a real server answering with the recorded bytes of vLLM ------------------


@dataclass(frozen=True)
class Recording:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def read_recording(name: str) -> Recording:
    """A `curl -si` capture: status line, headers, blank line, body (streams de-chunked)."""
    head, _, body = (VLLM_FIXTURES / name).read_bytes().partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = [(k, v) for k, v in (line.split(": ", 1) for line in header_lines)]
    return Recording(int(status_line.split()[1]), headers, body)


# Headers the replay server sets itself rather than copying (framing, and its own clock).
_OWN_HEADERS = {"content-length", "transfer-encoding", "date", "server"}
HOLD_SECONDS = 60  # the longest an x-replay-hold stream waits for its release


def recording_for_chat(request: dict) -> str:
    """Which recording answers a chat request, by the request that produced it (requests.sh)."""
    if request.get("model") != "tiny":
        return "err_unknown_model.http"
    if request.get("messages") == []:
        return "err_empty_messages.http"
    if request.get("max_tokens") == 100000:
        return "err_max_tokens.http"
    if request.get("tool_choice") == "auto":
        return "err_tools_not_enabled.http"
    if request.get("stream"):
        if (request.get("stream_options") or {}).get("include_usage"):
            return "chat_stream_usage.http"
        return "chat_stream.http"
    return "chat.http"


@dataclass
class ReplayEngine:
    """Serves vLLM's recorded answers on 127.0.0.1 from a thread of the test process.

    Test-only knobs, sent as request headers through the sidecar: `x-replay-gap` (seconds between
    SSE events, to make a stream last), `x-replay-stall` (seconds before answering) and
    `x-replay-drop-once: <id>` (close the connection instead of answering, the first time),
    `x-replay-drop-reused` (close a connection that served before instead of answering, as llama.cpp
    leaves its kept-alive connections after a stream), `x-replay-repeat: <n>` (a stream's events n
    times over, [DONE] once at its end), `x-replay-hold: <name>` (a stream's first event, then nothing
    more until the test calls `release(name)`, at most HOLD_SECONDS); and
    as attributes: `healthy`, `health_delay` (seconds /health takes, as a busy SGLang's does) and
    `stall` (seconds every answer waits: a slower engine)."""

    port: int
    received: list[dict] = field(default_factory=list)  # JSON bodies of the POSTs that arrived
    # (method, raw path, x-test-mark header) of every request, the sidecar's own probes included
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)  # "complete" or "client_gone", per stream
    sent: int = 0  # bytes of stream events written, all streams (how far a held stream got)
    # x-test-mark -> the header names (lower-cased) each request with that mark arrived with
    header_names: dict[str, list[set[str]]] = field(default_factory=dict)
    healthy: bool = True
    health_delay: float = 0.0
    stall: float = 0.0  # seconds before answering a request without x-replay-stall (a slow engine)

    def __post_init__(self) -> None:
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._dropped: set[str] = set()
        # The connections that have answered: weakly held, so a new one never passes for an old one
        # whose id it was given.
        self._served: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()
        self._holds: dict[str, asyncio.Event] = {}

    def release(self, name: str) -> None:
        """Lets the stream held by `x-replay-hold: <name>` write the rest of its events."""
        self._loop.call_soon_threadsafe(self._hold(name).set)

    def _hold(self, name: str) -> asyncio.Event:
        return self._holds.setdefault(name, asyncio.Event())

    def start(self) -> ReplayEngine:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        # Bodies as large as the proxies take (10 MiB as deployed), not aiohttp's 1 MiB.
        app = web.Application(middlewares=[self._record], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._fixed("models.http"))
        app.router.add_get("/version", self._fixed("version.http"))
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        # Any other method and path answers 200, as an open engine route does: a request that
        # got here shows, whatever it asked for.
        app.router.add_route("*", "/{anything:.*}", self._reached)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    @web.middleware
    async def _record(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        mark = request.headers.get(MARK_HEADER, "")
        self.seen.append((request.method, request.raw_path, mark))
        if mark:
            self.header_names.setdefault(mark, []).append({name.lower() for name in request.headers})
        return await handler(request)

    async def _reached(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.content_type == "application/json" and body:
            self.received.append(json.loads(body))
        return web.json_response({"reached": "engine", "path": request.raw_path})

    def marked(self, mark: str) -> list[tuple[str, str]]:
        """(method, raw path) of the requests that arrived with the test's mark."""
        return [(method, path) for method, path, seen_mark in self.seen if seen_mark == mark]

    def _fixed(self, name: str) -> Callable[[web.Request], object]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self._replay(request, read_recording(name))

        return handler

    async def _health(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(self.health_delay)
        if not self.healthy:  # what a vLLM whose engine died answers
            return web.Response(status=503)
        return await self._replay(request, read_recording("health.http"))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=(VLLM_FIXTURES / "metrics.txt").read_bytes(),
            headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        drop = request.headers.get("x-replay-drop-once")
        reused = request.transport in self._served
        self._served.add(request.transport)
        # Hang up without answering, as a dying server does, or as llama.cpp's kept-alive connection
        # is by the time it is reused.
        if (drop and drop not in self._dropped) or (reused and "x-replay-drop-reused" in request.headers):
            if drop:
                self._dropped.add(drop)
            request.transport.close()
            return web.Response()
        return await self._replay(request, read_recording(recording_for_chat(body)))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.received.append(await request.json())
        return await self._replay(request, read_recording("completions.http"))

    async def _replay(self, request: web.Request, recording: Recording) -> web.StreamResponse:
        await asyncio.sleep(float(request.headers.get("x-replay-stall", self.stall)))
        headers = [(k, v) for k, v in recording.headers if k.lower() not in _OWN_HEADERS]
        if not recording.body.startswith(b"data: "):
            return web.Response(status=recording.status, body=recording.body, headers=headers)
        # A stream: write it event by event, as the engine produced it.
        response = web.StreamResponse(status=recording.status, headers=headers)
        response.enable_chunked_encoding()
        await response.prepare(request)
        gap = float(request.headers.get("x-replay-gap", 0))
        hold = request.headers.get("x-replay-hold")
        events = recording.body.split(b"\n\n")[:-1]
        # A long stream: every event but the last ([DONE]) that many times over.
        events = events[:-1] * int(request.headers.get("x-replay-repeat", 1)) + events[-1:]
        try:
            for i, event in enumerate(events):
                if i and gap:
                    await asyncio.sleep(gap)
                if i == 1 and hold:
                    # A bound, not a wait: a test that never releases still ends.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hold(hold).wait(), HOLD_SECONDS)
                await response.write(event + b"\n\n")
                self.sent += len(event) + 2
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.streams.append("client_gone")
            raise
        self.streams.append("complete")
        return response


def start_replay() -> ReplayEngine:
    (port,) = free_ports(1)
    return ReplayEngine(port).start()


# --- the real engine: llama.cpp's llama-server (built from source) with a real GGUF model ----------


@dataclass
class Engine:
    """A llama-server process serving the GGUF model as ENGINE_MODEL: the cpu profile's engine."""

    url: str
    log: Path
    process: subprocess.Popen

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_serving(self, timeout: float = 180) -> None:
        def up() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"engine exited with {self.process.returncode}:\n{tail(self.log)}")
            try:
                return httpx.get(self.url + "/v1/models", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout, "the llama.cpp engine to serve", interval=0.5, on_timeout=lambda: "\n" + tail(self.log))


def launch_engine(
    model: Path,
    port: int,
    log_dir: Path,
    host: str = "127.0.0.1",
    alias: str = ENGINE_MODEL,
    context: int = 2048,
    extra: tuple[str, ...] = (),
) -> Engine:
    """llama-server with the flags the operator gives the cpu profile's engine, a local model file,
    listening on `host` only; `extra`: more flags (e.g. a chat template file)."""
    argv = [str(llama_server_binary()), "-m", str(model), "--alias", alias, "--host", host, "--port", str(port)]
    argv += ["-c", str(context), "--metrics", "--jinja", *extra]
    process = start_process(f"engine-{port}", argv, log_dir)
    return Engine(f"http://{host}:{port}", log_dir / f"engine-{port}.log", process)
