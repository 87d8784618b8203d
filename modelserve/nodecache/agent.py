"""The node agent: a pull-through cache of the hub's download routes for the pods of one node.

`GET /<repo>/resolve/<revision>/<path>` with the pod's own token:
1. the hub is asked first, every time (a HEAD with that token): its refusal (401, 403, 404) goes back
   as it is, so a cached gated file is never a way around the hub's access check; its answer names
   the file's hash and size;
2. a file held here (named by that hash) is served, hashed as it is read: the last bytes go only once
   the whole matched, so a file corrupted on disk is never served whole (it is deleted, the client
   sees a short answer and asks the hub);
3. else one download per file (single-flight): it writes to a partial file and every requester reads
   that file as it grows, the first as fast as the hub sends; it becomes the file only once its size
   and hash match the hub's, and its last bytes reach the readers only then;
4. a file that does not fit (over the size limit, or no room once models no pod uses are evicted)
   passes through uncached.
`/api/models/<org>/<name>[/revision|tree/...]` passes through to the hub (info and listings, never
cached, bounded in size; no other hub route, no `..`).

While the hub cannot be reached (no connection, no answer within the settings' hub answer timeout,
or a 5xx), a model held whole here that the hub named public (neither gated nor private) when its
record was checked is answered from that record: its info, its tree as recorded, its files, each
answer marked OFFLINE_HEADER. A gated or private model never is: only the hub can say a token opens it, so a
401, 403 or 404 is never treated as an outage, and without the hub such a model's start fails.

`POST /v1/fetched` records a model a fetch found whole here, for the node's labels and eviction,
once the hub (asked with the caller's token) backs the claim. Nothing else: no route changes what is
cached. Answers carry X-Modelserve-Source (node: held here; hub: this request fetched it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, unquote

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from yarl import URL

from modelserve.contracts.nodecache import model_key

from .hub import (
    FETCHED_ROUTE,
    HUB_STATUS_HEADER,
    OFFLINE_HEADER,
    SOURCE_HEADER,
    Digest,
    RepoFile,
    hub_api_path,
    hub_oid,
    hub_size,
    is_commit,
    is_oid,
    next_page,
    path_of,
    safe_path,
    split_model,
    tree_files,
)
from .store import ModelRecord, Store

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
HOLDBACK = 64 * 1024  # the bytes kept back until a file's hash is known to match
STALL_SECONDS = 120.0  # a reader waits this long for a download's next bytes before giving up
HUB_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=15, sock_connect=15, sock_read=120)
# After the hub was found down, public held files are served without asking it for this long, so a
# silent hub costs one timeout per start, not one per file.
HUB_DOWN_SECONDS = 30.0
PASSED_ON = ("Content-Type", "X-Error-Code", "X-Error-Message", "Link")
# A model's info or one page of its tree is kilobytes (the hub pages trees); anything larger is not
# a listing, and is not held in the agent's memory.
API_ANSWER_BYTES = 16 * 1024 * 1024
RECORD_FILES = 10_000  # files one model record may name (a fetch names the files an engine reads)
TREE_PAGES = 100  # pages of a tree read to check a record (the hub's pages are 1,000 entries)
# A record's files in the order records have always been written: by path (then oid, size, lfs).
RECORD_ORDER = attrgetter("path", "oid", "size", "lfs")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.served = Counter(
            "modelserve_nodecache_served_bytes", "Bytes of model files sent to pods, by where they came from",
            ["source"], registry=self.registry,
        )  # fmt: skip
        self.hub = Counter("modelserve_nodecache_hub_bytes", "Bytes downloaded from the hub", registry=self.registry)
        self.uncached = Counter(
            "modelserve_nodecache_uncached_files", "Files passed through without caching, by why",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.corrupt = Counter(
            "modelserve_nodecache_corrupt_files",
            "Files whose bytes did not match the hub's hash",
            registry=self.registry,
        )
        self.refused = Counter(
            "modelserve_nodecache_hub_refusals",
            "Hub refusals passed on to a pod (401, 403, 404)",
            registry=self.registry,
        )
        self.evicted = Counter("modelserve_nodecache_evicted_models", "Models evicted", registry=self.registry)
        self.offline = Counter(
            "modelserve_nodecache_offline_answers",
            "Answers given from the node's records while the hub could not be reached (public models held whole)",
            registry=self.registry,
        )
        self.cut = Counter(
            "modelserve_nodecache_cut_answers",
            "File answers cut because their client read none of them for the send timeout",
            registry=self.registry,
        )
        self.store_bytes = Gauge("modelserve_nodecache_store_bytes", "Bytes held", registry=self.registry)
        self.limit_bytes = Gauge("modelserve_nodecache_limit_bytes", "The store's size limit", registry=self.registry)
        self.models = Gauge("modelserve_nodecache_models", "Models held whole", registry=self.registry)


class Transfer:
    """One file on its way from the hub into the store; readers follow its partial file."""

    def __init__(self, oid: str, size: int, path: Path) -> None:
        self.oid, self.size, self.path = oid, size, path
        self.written = 0
        self.verified = False
        self.failed: str | None = None
        self._changed = asyncio.Event()

    def notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed(self) -> None:
        await asyncio.wait_for(self._changed.wait(), STALL_SECONDS)


class Refused(Exception):
    """The hub's own answer to a file request that is not 200: passed on."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers


class HubDown(Exception):
    """The hub could not be reached, or answered 5xx: an outage, never a refusal."""


class Unusable(Exception):
    """A hub answer the agent cannot serve from (no hash or size, a redirect loop): the agent's own
    502, not a hub refusal, so the fetch asks the hub itself."""


@dataclass(frozen=True)
class FileInfo:
    oid: str
    size: int
    commit: str


class Agent:
    def __init__(
        self,
        store: Store,
        hub: str,
        session: aiohttp.ClientSession,
        in_use: Callable[[], Awaitable[set[str] | None]],
        changed: Callable[[], None] = lambda: None,
        *,
        send_seconds: float,
        hub_answer_seconds: float,
    ) -> None:
        self.store = store
        self.send_seconds = send_seconds  # a client reading none of an answer this long is cut (settings)
        # A file's HEAD and a listing are small: a hub silent this long on one is down (settings).
        self.meta_timeout = aiohttp.ClientTimeout(total=None, connect=15, sock_connect=15, sock_read=hub_answer_seconds)
        self.hub = hub
        self.session = session
        self.in_use = in_use  # the models pods on this node use now (None: unknown)
        self.changed = changed  # what the store holds changed: the node's labels follow
        self.metrics = Metrics()
        self.transfers: dict[str, Transfer] = {}
        self._tasks: set[asyncio.Task] = set()  # downloads outlive their first reader
        self.reading: dict[str, int] = {}  # files being served: never evicted meanwhile
        self.hub_down_until = 0.0  # monotonic: until then public held files are served without the hub
        self.metrics.limit_bytes.set(store.limit)
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.store_bytes.set(self.store.used)
        self.metrics.models.set(len(self.store.held()))

    # --- the hub ------------------------------------------------------------------------
    def _auth(self, request: web.Request) -> dict[str, str]:
        auth = request.headers.get("Authorization")
        return {"Authorization": auth} if auth else {}

    async def file_info(self, repo: str, revision: str, path: str, auth: dict[str, str]) -> FileInfo:
        """The hub's HEAD of the file with the requester's token: its hash, size and commit, or its
        refusal (Refused). A relative redirect (a renamed repository) is followed, as huggingface_hub does."""
        url = f"{self.hub}/{repo}/resolve/{revision}/{path}"
        for _ in range(3):
            try:
                head = self.session.head(url, headers=auth, allow_redirects=False, timeout=self.meta_timeout)
                answer = await head
            except (aiohttp.ClientError, TimeoutError) as error:
                raise HubDown(repr(error)) from None
            async with answer:
                oid, size = hub_oid(answer.headers), hub_size(answer.headers)
                if answer.status >= 500:
                    raise HubDown(f"the hub answered {answer.status}")
                if 300 <= answer.status < 400 and oid is None and answer.headers.get("Location", "").startswith("/"):
                    url = self.hub + answer.headers["Location"]
                    continue
                if answer.status >= 400:
                    # A HEAD has no body: the hub's words are in X-Error-Message.
                    said = (
                        answer.headers.get("X-Error-Message") or f"the hub answered {answer.status} for {repo}/{path}"
                    )
                    headers = {name: answer.headers[name] for name in PASSED_ON if name in answer.headers}
                    raise Refused(answer.status, json.dumps({"error": said}).encode(), headers)
                if oid is None or size is None:
                    raise Unusable(f"the hub named no hash or size for {repo}/{path}")
                commit = answer.headers.get("X-Repo-Commit", "")
                return FileInfo(oid, size, commit)
        raise Unusable(f"the hub redirected {repo}/{path} too often")

    # --- routes -------------------------------------------------------------------------
    async def resolve(self, request: web.Request) -> web.StreamResponse:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        revision, path = request.match_info["revision"], request.match_info["file"]
        if not safe_path(path):
            raise web.HTTPNotFound(text='{"error": "Entry not found"}', content_type="application/json")
        auth = self._auth(request)
        offline = self._held_public(repo, revision, path) if time.monotonic() < self.hub_down_until else None
        try:
            info = offline or await self.file_info(repo, revision, path, auth)
        except Refused as refusal:
            self.metrics.refused.inc()
            headers = {**refusal.headers, HUB_STATUS_HEADER: str(refusal.status)}
            return web.Response(status=refusal.status, body=refusal.body, headers=headers)
        except Unusable as unusable:
            raise web.HTTPBadGateway(text=f"the node cache cannot serve this: {unusable}") from None
        except HubDown as down:
            self._hub_down()
            offline = self._held_public(repo, revision, path)
            if offline is None:
                raise web.HTTPBadGateway(text=f"the hub is unreachable from the node cache: {down}") from None
            info = offline
        headers = {
            "X-Linked-Etag": f'"{info.oid}"',
            "X-Linked-Size": str(info.size),
            "X-Repo-Commit": info.commit,
            "ETag": f'"{info.oid}"',
        }
        if offline is not None:
            self.metrics.offline.inc()
            headers[OFFLINE_HEADER] = "1"
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(info.size)})
        url = f"{self.hub}/{repo}/resolve/{info.commit or revision}/{path}"
        if self.store.has(info.oid, info.size):
            return await self._serve_held(request, info, headers)
        transfer = self.transfers.get(info.oid)
        source = "node"
        if transfer is None:
            reason = await self._no_room(info)
            # Another request may have started it (or finished it) while this one waited.
            transfer = self.transfers.get(info.oid)
            if transfer is None and self.store.has(info.oid, info.size):
                return await self._serve_held(request, info, headers)
            if transfer is None and reason:
                self.metrics.uncached.labels(reason).inc()
                return await self._pass_through(request, url, auth, info, headers)
            if transfer is None:
                transfer = self._start(info, url, auth)
                source = "hub"
        return await self._serve_transfer(request, transfer, headers, source)

    async def api(self, request: web.Request) -> web.Response:
        """A model's info or tree listing, from the hub as it answers (with the requester's token);
        no other route of the hub's, and no answer over API_ANSWER_BYTES held."""
        path = hub_api_path(request.rel_url.raw_path)
        if path is None:
            raise web.HTTPNotFound(text='{"error": "Entry not found"}', content_type="application/json")
        query = request.rel_url.raw_query_string
        # Encoded as received: no URL library decodes or normalises it on the way to the hub.
        url = URL(f"{self.hub}{path}" + (f"?{query}" if query else ""), encoded=True)
        try:
            async with self.session.get(url, headers=self._auth(request), timeout=self.meta_timeout) as answer:
                body = await _read_at_most(answer.content, API_ANSWER_BYTES)
                if body is None:
                    return web.json_response(
                        {"error": f"the hub's answer for {path} is over {API_ANSWER_BYTES} bytes"}, status=502
                    )
                if answer.status < 500:
                    headers = {name: answer.headers[name] for name in PASSED_ON if name in answer.headers}
                    return web.Response(status=answer.status, body=body, headers=headers)
                down = f"the hub answered {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            down = repr(error)
        self._hub_down()
        listing = self._listing_public(path)
        if listing is None:
            raise web.HTTPBadGateway(text=f"the hub is unreachable from the node cache: {down}")
        self.metrics.offline.inc()
        return web.json_response(listing, headers={OFFLINE_HEADER: "1"})

    def _hub_down(self) -> None:
        self.hub_down_until = time.monotonic() + HUB_DOWN_SECONDS

    def _held_public(self, repo: str, revision: str, path: str) -> FileInfo | None:
        """A file of a public model held whole here, as its record lists it (the hub unreachable)."""
        held = self.store.public_files(repo, revision)
        entry = next((f for f in held[1] if f.path == path), None) if held else None
        return None if held is None or entry is None else FileInfo(entry.oid, entry.size, held[0])

    def _listing_public(self, path: str) -> object | None:
        """A public model's info or tree as its record holds them (the hub unreachable), else None:
        `/api/models/<org>/<name>[/revision/<revision>]` and `/api/models/<org>/<name>/tree/<revision>`."""
        segments = [unquote(segment) for segment in path.removeprefix("/api/models/").split("/")]
        repo = "/".join(segments[:2])
        view, revision = (segments[2], "/".join(segments[3:])) if len(segments) > 3 else ("revision", "main")
        held = self.store.public_files(repo, revision)
        if held is None or (view == "tree" and len(segments) != 4):
            return None
        commit, files = held
        if view == "tree":
            return [_tree_entry(f) for f in files]
        siblings = [{"rfilename": f.path} for f in files]
        return {"id": repo, "modelId": repo, "sha": commit, "private": False, "gated": False, "siblings": siblings}

    async def fetched(self, request: web.Request) -> web.Response:
        """A fetch found this model whole here: record it, only if every file is here, as stated, and
        the hub, asked with the caller's own token, lists those files for that model at that commit
        (the revision naming that commit). The caller's word alone wrote records and node labels for
        any model name: a record is a claim the hub backs, so records are bounded by what is held."""
        try:
            body = await request.json()
            files = tuple(sorted({(str(f["oid"]).lower(), int(f["size"])) for f in body["files"]}))
            model, revision, commit = str(body["model"]), str(body.get("revision", "main")), str(body["commit"])
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text="expected {model, revision, commit, files: [{oid, size}]}") from None
        if not files or not all(is_oid(oid) for oid, _ in files):
            raise web.HTTPBadRequest(text="files must name hub hashes")
        repo, _ = split_model(model)
        if len(files) > RECORD_FILES or not is_commit(commit) or not _model_id(repo) or not safe_path(revision):
            raise web.HTTPBadRequest(text=f"a model id, a revision, a 40-hex commit and at most {RECORD_FILES} files")
        if not all(self.store.has(oid, size) for oid, size in files):
            return web.json_response({"recorded": False, "reason": "not every file is held here"}, status=409)
        claimed = set(files)
        why, public, listed = await self._backing(repo, revision, commit, claimed, self._auth(request))
        if why:
            return web.json_response({"recorded": False, "reason": why}, status=409)
        paths = tuple(sorted((f for f in listed if (f.oid, f.size) in claimed), key=RECORD_ORDER))
        record = ModelRecord(model_key(model, revision), model, revision, commit, files, paths, public)
        if not self.store.record(record):
            return web.json_response({"recorded": False}, status=409)
        self.changed()
        self._gauges()
        return web.json_response({"recorded": True, "key": record.key})

    async def _backing(
        self, repo: str, revision: str, commit: str, files: set[tuple[str, int]], auth: dict[str, str]
    ) -> tuple[str, bool, list[RepoFile]]:
        """Why the hub does not back the claim that `files` are `repo` at `commit` (= `revision`), or
        ""; whether it names the model public (neither gated nor private); and its tree's files."""
        try:
            info, _ = await self._hub_page(f"/api/models/{repo}/revision/{quote(revision, safe='')}", auth)
            if not isinstance(info, dict) or info.get("sha") != commit:
                return f"the hub does not name {commit} as {repo}@{revision}", False, []
            listed: list[RepoFile] = []
            path: str | None = f"/api/models/{repo}/tree/{commit}?recursive=true"
            for _ in range(TREE_PAGES):
                if path is None:
                    break
                page, path = await self._hub_page(path, auth)
                listed += tree_files(page if isinstance(page, list) else [])
        except Refused as refusal:
            return f"the hub answered {refusal.status} for {repo}", False, []
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            return f"the hub could not be asked about {repo}: {type(error).__name__}", False, []
        missing = files - {(f.oid, f.size) for f in listed}
        if missing:
            return f"the hub's tree of {repo}@{commit} lists {len(missing)} of these files not", False, []
        return "", info.get("gated") is False and info.get("private") is False, listed

    async def _hub_page(self, path: str, auth: dict[str, str]) -> tuple[object, str | None]:
        """A hub API answer (JSON, at most API_ANSWER_BYTES) and the path of its next page, if any."""
        async with self.session.get(f"{self.hub}{path}", headers=auth, timeout=self.meta_timeout) as answer:
            body = await _read_at_most(answer.content, API_ANSWER_BYTES)
            if answer.status != 200 or body is None:
                raise Refused(answer.status if answer.status != 200 else 502, b"", {})
            following = next_page(answer.headers.get("Link"))
            return json.loads(body), None if following is None else path_of(following)

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics_route(self, _: web.Request) -> web.Response:
        self._gauges()
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

    # --- downloads ------------------------------------------------------------------------
    async def _no_room(self, info: FileInfo) -> str:
        """Why the file cannot be cached ("" when it can, after evicting what no pod uses)."""
        if info.size > self.store.limit:
            return "too_large"
        # The downloads under way will take their whole size: what they have written counts against
        # the limit (partial files are not in the store's `used`: L2), what is left is needed too.
        written = sum(t.written for t in self.transfers.values())
        need = info.size + sum(t.size - t.written for t in self.transfers.values())
        if need <= self.store.room(written):
            return ""
        busy = set(self.transfers) | {oid for oid, readers in self.reading.items() if readers}
        before = set(self.store.models)
        fits = self.store.make_room(need, await self.in_use(), busy, written)
        gone = before - set(self.store.models)
        if gone:
            self.metrics.evicted.inc(len(gone))
            self.changed()
        return "" if fits else "no_room"

    def _start(self, info: FileInfo, url: str, auth: dict[str, str]) -> Transfer:
        transfer = Transfer(info.oid, info.size, self.store.partial(info.oid))
        out = transfer.path.open("wb", buffering=0)  # made now: its readers open it before any byte
        self.transfers[info.oid] = transfer
        task = asyncio.get_running_loop().create_task(self._download(transfer, out, url, auth))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return transfer

    async def _download(self, transfer: Transfer, out: BinaryIO, url: str, auth: dict[str, str]) -> None:
        digest = Digest(transfer.oid, transfer.size)
        try:
            async with self.session.get(url, headers=auth, timeout=HUB_TIMEOUT) as answer:
                if answer.status != 200:
                    raise OSError(f"the hub answered {answer.status}")
                with out:
                    async for chunk in answer.content.iter_chunked(CHUNK):
                        if transfer.written + len(chunk) > transfer.size:  # cut at the declared size
                            self.metrics.corrupt.inc()
                            raise OSError(f"the hub sent more than the {transfer.size} bytes it declared")
                        out.write(chunk)
                        digest.update(chunk)
                        transfer.written += len(chunk)
                        self.metrics.hub.inc(len(chunk))
                        transfer.notify()
            if transfer.written != transfer.size or not digest.matches():
                self.metrics.corrupt.inc()
                raise OSError(f"{transfer.written} bytes from the hub did not match its size {transfer.size} and hash")
            transfer.path = self.store.added(transfer.oid, transfer.path)
            transfer.verified = True
            self.changed()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            transfer.failed = str(error) or repr(error)
            log.warning("download of %s failed: %s", transfer.oid, transfer.failed)
            with contextlib.suppress(OSError):
                transfer.path.unlink()
        finally:
            out.close()
            self.transfers.pop(transfer.oid, None)
            transfer.notify()

    # --- serving --------------------------------------------------------------------------
    async def _send(self, response: web.StreamResponse, chunk: bytes) -> None:
        """`chunk` to the client, or the answer cut if it reads none of it for `send_seconds` (its file
        is no longer pinned, its buffers freed)."""
        try:
            await asyncio.wait_for(response.write(chunk), self.send_seconds)
        except TimeoutError:
            self.metrics.cut.inc()
            raise ConnectionAbortedError(f"the client read nothing for {self.send_seconds:g} s") from None

    async def _prepare(
        self, request: web.Request, headers: dict[str, str], size: int, source: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, SOURCE_HEADER: source})
        response.content_type = "application/octet-stream"
        response.content_length = size
        await response.prepare(request)
        return response

    async def _serve_transfer(
        self, request: web.Request, transfer: Transfer, headers: dict[str, str], source: str
    ) -> web.StreamResponse:
        file = transfer.path.open("rb")  # now, in this tick: the same inode once it is renamed
        self.reading[transfer.oid] = self.reading.get(transfer.oid, 0) + 1
        try:
            response = await self._prepare(request, headers, transfer.size, source)
            sent = 0
            while sent < transfer.size:
                limit = transfer.size if transfer.verified else max(0, min(transfer.written, transfer.size - HOLDBACK))
                if sent < limit:
                    chunk = file.read(min(CHUNK, limit - sent))
                    if not chunk:
                        raise ConnectionAbortedError(f"{transfer.oid} ended early")
                    await self._send(response, chunk)
                    self.metrics.served.labels(source).inc(len(chunk))
                    sent += len(chunk)
                elif transfer.failed is not None:
                    raise ConnectionAbortedError(f"download of {transfer.oid} failed: {transfer.failed}")
                else:
                    await transfer.changed()
            await response.write_eof()
            return response
        finally:
            file.close()
            self._done_reading(transfer.oid)

    async def _serve_held(self, request: web.Request, info: FileInfo, headers: dict[str, str]) -> web.StreamResponse:
        """A file held here, hashed as it is read; its last bytes only once the hash matched."""
        self.reading[info.oid] = self.reading.get(info.oid, 0) + 1
        try:
            response = await self._prepare(request, headers, info.size, "node")
            digest = Digest(info.oid, info.size)
            read = 0
            pending = b""
            with self.store.blob(info.oid).open("rb") as file:
                while chunk := file.read(CHUNK):
                    digest.update(chunk)
                    read += len(chunk)
                    pending += chunk
                    if len(pending) > HOLDBACK:
                        send, pending = pending[:-HOLDBACK], pending[-HOLDBACK:]
                        await self._send(response, send)
                        self.metrics.served.labels("node").inc(len(send))
            if read != info.size or not digest.matches():
                self.metrics.corrupt.inc()
                log.warning("held file %s no longer matches its hash: deleted, the pod fetches it again", info.oid)
                self.store.discard(info.oid)
                self.changed()
                raise ConnectionAbortedError(f"{info.oid} was corrupt")
            await self._send(response, pending)
            self.metrics.served.labels("node").inc(len(pending))
            self.store.touched(info.oid)
            await response.write_eof()
            return response
        finally:
            self._done_reading(info.oid)

    async def _pass_through(
        self, request: web.Request, url: str, auth: dict[str, str], info: FileInfo, headers: dict[str, str]
    ) -> web.StreamResponse:
        async with self.session.get(url, headers=auth, timeout=HUB_TIMEOUT) as answer:
            if answer.status != 200:
                raise web.HTTPBadGateway(text=f"the hub answered {answer.status}")
            response = await self._prepare(request, headers, info.size, "hub")
            async for chunk in answer.content.iter_chunked(CHUNK):
                await self._send(response, chunk)
                self.metrics.hub.inc(len(chunk))
                self.metrics.served.labels("hub").inc(len(chunk))
            await response.write_eof()
            return response

    def _done_reading(self, oid: str) -> None:
        self.reading[oid] -= 1
        if not self.reading[oid]:
            del self.reading[oid]


def _tree_entry(f: RepoFile) -> dict[str, object]:
    """A file as the hub's tree lists it (what hub.tree_files reads back)."""
    entry: dict[str, object] = {"type": "file", "path": f.path, "size": f.size, "oid": f.oid}
    if f.lfs:
        entry["lfs"] = {"oid": f.oid, "size": f.size}
    return entry


def _model_id(repo: str) -> bool:
    """`<org>/<name>` as the hub spells a model id (no path of the hub's in disguise)."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", repo)) and safe_path(repo)


async def _read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, or None once it passes `limit` bytes (what came so far is dropped)."""
    chunks, size = [], 0
    async for chunk in content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(agent: Agent) -> web.Application:
    app = web.Application()
    app.router.add_get("/healthz", agent.health)
    app.router.add_get("/metrics", agent.metrics_route)
    app.router.add_post(FETCHED_ROUTE, agent.fetched)
    app.router.add_get("/api/models/{tail:.+}", agent.api)
    app.router.add_get("/{org}/{name}/resolve/{revision}/{file:.+}", agent.resolve)  # GET also answers HEAD
    return app


async def sync_forever(
    agent: Agent, label: Callable[[set[str]], Awaitable[None]], changed: asyncio.Event, every: float
) -> None:
    """Keep the node's labels on what the store holds whole: at once after a change, and every
    `every` seconds (a label someone removed comes back)."""
    while True:
        changed.clear()
        await label(agent.store.held())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), every)
