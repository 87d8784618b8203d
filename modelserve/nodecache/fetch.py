"""`modelserve-fetch`: a model pod's init container. It puts the model (and its LoRA adapters) into the
pod's hub cache volume in huggingface_hub's layout, through the node agent when there is one, so the
engine then starts with the files already there (vLLM and SGLang with HF_HUB_OFFLINE, llama.cpp with
--offline by its variable, LLAMA_ARG_OFFLINE: neither touches the network for them).

Every file is checked end to end: written beside its place, renamed only once its size and hash match
the hub's listing. When the node agent cannot be reached (a short connect timeout: the Service's
internalTrafficPolicy Local drops packets when the node has none) or fails on a file, that file comes
from the hub directly, and the result says why the node's cache was not used. A refusal from the hub
(an unknown repository, a gated one the token does not open) ends the fetch: the hub would say the same.
While the hub cannot be reached, the agent answers a public model it holds whole from its records
(nodecache/agent.py); the result then says the start went without the hub (`hub_unreachable`).

What it did goes to its termination message (contracts.nodecache.FetchResult), where the operator
reads the weights phase and the bytes by source.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import aiohttp

from modelserve import __version__
from modelserve.contracts.nodecache import FetchResult, FetchSettings, Layout

from .hub import (
    FETCHED_ROUTE,
    HUB_STATUS_HEADER,
    OFFLINE_HEADER,
    RAW_BYTES,
    SOURCE_HEADER,
    Digest,
    RepoFile,
    next_page,
    path_of,
    repo_folder,
    select,
    split_model,
    tree_files,
)

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
USER_AGENT = f"modelserve-fetch/{__version__}"


class HubRefused(Exception):
    """The hub's own refusal (through the agent or not): the fetch ends with it."""


class HubUnreachable(HubRefused):
    """No answer from the hub, or a 5xx: not a refusal, so a copy the pod's own volume holds may serve."""


class CacheProblem(Exception):
    """The node agent could not serve this: the hub is asked directly instead. `unreachable`: it did
    not answer at all, so it is not asked again for the other files."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass
class Tally:
    hub: int = 0
    node: int = 0
    local: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)
    offline: bool = False  # the agent answered from its records: the hub could not be reached

    def problem(self, what: str) -> None:
        log.warning("node cache: %s", what)
        if what not in self.problems:
            self.problems.append(what)


def snapshot_link(path: str, oid: str) -> str:
    """The relative target of snapshots/<commit>/<path> -> blobs/<oid> (pure)."""
    depth = len(PurePosixPath(path).parts) - 1
    return "../" * (depth + 2) + f"blobs/{oid}"


class Fetcher:
    def __init__(self, settings: FetchSettings, token: str, session: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.session = session
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.use_agent = bool(settings.node_cache)
        self.tally = Tally()
        self.agent_timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_seconds, sock_connect=settings.connect_seconds, sock_read=120
        )
        self.hub_timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
        # A listing is small: a hub silent this long is down (huggingface_hub gives metadata 10 s).
        self.listing_timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=20)

    # --- requests, through the agent first ---------------------------------------------------
    def _give_up_agent(self, why: str) -> None:
        self.tally.problem(why)
        self.use_agent = False

    async def _json(self, path: str) -> tuple[object, str | None]:
        """A hub API answer (and its next page's path), from the agent, else the hub."""
        if self.use_agent:
            try:
                return await self._json_from(self.settings.node_cache, path, self.agent_timeout, agent=True)
            except CacheProblem as problem:
                self._give_up_agent(str(problem))
        return await self._json_from(self.settings.hub, path, self.listing_timeout, agent=False)

    async def _json_from(
        self, base: str, path: str, timeout: aiohttp.ClientTimeout, agent: bool
    ) -> tuple[object, str | None]:
        try:
            async with self.session.get(base + path, headers=self.auth, timeout=timeout) as answer:
                body = await answer.read()
                if answer.status == 200:
                    self.tally.offline |= agent and OFFLINE_HEADER in answer.headers
                    page = next_page(answer.headers.get("Link"))
                    return json.loads(body), (path_of(page) if page else None)
                if agent and HUB_STATUS_HEADER not in answer.headers and answer.status >= 500:
                    raise CacheProblem(f"the node cache answered {answer.status}: {body[:200]!r}")
                said = f"the hub answered {answer.status} for {path}: {body[:300].decode(errors='replace')}"
                raise HubUnreachable(said) if answer.status >= 500 else HubRefused(said)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            if agent:
                raise CacheProblem(f"the node cache is unreachable: {error!r}", unreachable=True) from None
            raise HubUnreachable(f"the hub is unreachable at {base}: {error!r}") from None

    async def listing(self, repo: str, revision: str) -> tuple[str, list[RepoFile]]:
        """(commit, files) of a repository at a revision."""
        info, _ = await self._json(f"/api/models/{repo}/revision/{revision}")
        commit = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(commit, str) or len(commit) != 40:
            raise HubRefused(f"the hub named no commit for {repo}@{revision}")
        files: list[RepoFile] = []
        path: str | None = f"/api/models/{repo}/tree/{commit}?recursive=true"
        for _ in range(1000):  # pages of a very large repository, bounded
            if path is None:
                break
            page, path = await self._json(path)
            files += tree_files(page if isinstance(page, list) else [])
        return commit, files

    # --- files ----------------------------------------------------------------------------
    async def file(self, repo: str, commit: str, f: RepoFile, target: Path | None) -> None:
        """One file into `target` (None: read through the agent only, to warm the node's cache)."""
        if target is not None and target.is_file() and target.stat().st_size == f.size:
            self.tally.local += f.size
            return
        url_path = f"/{repo}/resolve/{commit}/{f.path}"
        if self.use_agent:
            try:
                source, size = await self._stream(self.settings.node_cache + url_path, f, target, self.agent_timeout)
                if source == "node":
                    self.tally.node += size
                else:
                    self.tally.hub += size
                return
            except CacheProblem as problem:
                if self.settings.warm_only:
                    raise HubRefused(f"the node cache could not be warmed: {problem}") from None
                self.tally.problem(str(problem))
                if problem.unreachable:
                    self.use_agent = False
        _, size = await self._stream(self.settings.hub + url_path, f, target, self.hub_timeout, agent=False)
        self.tally.hub += size

    async def _stream(
        self, url: str, f: RepoFile, target: Path | None, timeout: aiohttp.ClientTimeout, agent: bool = True
    ) -> tuple[str, int]:
        """GET one file, hashed as it comes, into `target` once whole and matching: (source, bytes)."""
        partial = target.with_name(target.name + ".incomplete") if target else None
        digest = Digest(f.oid, f.size)
        received = 0
        try:
            async with self.session.get(url, headers=self.auth, timeout=timeout) as answer:
                if answer.status != 200:
                    body = (await answer.read())[:300].decode(errors="replace")
                    if agent and HUB_STATUS_HEADER not in answer.headers:
                        raise CacheProblem(f"the node cache answered {answer.status} for {f.path}: {body}")
                    raise HubRefused(f"the hub answered {answer.status} for {f.path}: {body}")
                source = answer.headers.get(SOURCE_HEADER, "hub") if agent else "hub"
                self.tally.offline |= agent and OFFLINE_HEADER in answer.headers
                if partial is not None:
                    partial.parent.mkdir(parents=True, exist_ok=True)
                with partial.open("wb") if partial else contextlib.nullcontext() as out:
                    async for chunk in answer.content.iter_chunked(CHUNK):
                        received += len(chunk)
                        if received > f.size:  # cut at the listed size, never written past it
                            break
                        digest.update(chunk)
                        if out is not None:
                            out.write(chunk)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            _remove(partial)
            what = f"{f.path}: {error!r}"
            if agent:
                reached = bool(received) or isinstance(error, aiohttp.ClientPayloadError)
                if reached:
                    raise CacheProblem(f"the node cache failed on {what}") from None
                raise CacheProblem(f"the node cache is unreachable: {error!r}", unreachable=True) from None
            raise HubRefused(f"the download from the hub failed on {what}") from None
        if received != f.size or not digest.matches():
            _remove(partial)
            what = f"{f.path}: {received} bytes that do not match the hub's size {f.size} and hash {f.oid}"
            if agent:
                raise CacheProblem(f"the node cache sent {what}")
            raise HubRefused(f"the hub sent {what}")
        if partial is not None and target is not None:
            os.replace(partial, target)
        return source, received

    # --- a repository -------------------------------------------------------------------------
    async def repository(self, model: str, layout: Layout, revision: str = "main") -> None:
        repo, tag = split_model(model)
        folder = self.settings.cache_dir / repo_folder(repo)
        try:
            commit, listed = await self.listing(repo, revision)
        except HubUnreachable:
            # The pod's own volume (its spec.cache claim) holds the revision whole: start from it, as
            # huggingface_hub does from its cached snapshot. Never on a refusal: the hub said no.
            held = None if self.settings.warm_only else own_snapshot(folder, revision)
            if held is None or not select(held[1], layout, tag):
                raise
            commit, listed = held
            self.tally.offline = True
            log.warning("the hub could not be reached: %s starts from the pod's own cache volume", repo)
        chosen = select(listed, layout, tag)
        if not chosen:
            what = f"no GGUF file for the tag {tag!r}" if layout == Layout.GGUF else "no files"
            raise HubRefused(f"{repo} at {commit[:12]} has {what} (files: {', '.join(f.path for f in listed[:20])})")
        through_agent = self.use_agent
        for f in chosen:
            target = None if self.settings.warm_only else folder / "blobs" / f.oid
            await self.file(repo, commit, f, target)
            self.tally.files += 1
            if target is not None:
                link = folder / "snapshots" / commit / f.path
                link.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
                link.symlink_to(snapshot_link(f.path, f.oid))
        if not self.settings.warm_only and revision != commit:
            (folder / "refs").mkdir(parents=True, exist_ok=True)
            (folder / "refs" / revision).write_text(commit)
        if through_agent and self.use_agent:
            await self._record(model, revision, commit, chosen)

    async def _record(self, model: str, revision: str, commit: str, files: list[RepoFile]) -> None:
        """Tell the agent the model is whole on the node (for its labels and eviction); best effort."""
        body = {"model": model, "revision": revision, "commit": commit}
        body["files"] = [{"oid": f.oid, "size": f.size} for f in files]  # type: ignore[assignment]
        try:
            async with self.session.post(
                self.settings.node_cache + FETCHED_ROUTE, json=body, timeout=self.agent_timeout
            ) as answer:
                if answer.status != 200:
                    log.info("the node cache did not record %s: %s", model, answer.status)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.info("the node cache did not record %s: %r", model, error)


def own_snapshot(folder: Path, revision: str) -> tuple[str, list[RepoFile]] | None:
    """(commit, files) of `revision` as a pod's hub cache volume holds it (huggingface_hub's layout:
    refs/<revision> names the commit, snapshots/<commit>/<path> links to blobs/<oid>), only files
    whose blob is there; None when the volume does not name the revision."""
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = folder / "snapshots" / commit
    if len(commit) != 40 or not snapshot.is_dir():
        return None
    files = []
    for link in sorted(snapshot.rglob("*")):
        blob = link.resolve()
        if link.is_symlink() and blob.is_file() and blob.parent == (folder / "blobs").resolve():
            files.append(
                RepoFile(link.relative_to(snapshot).as_posix(), blob.stat().st_size, blob.name, len(blob.name) == 64)
            )
    return (commit, files) if files else None


def _remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


async def fetch(settings: FetchSettings, token: str) -> FetchResult:
    """Fetch the model and its adapters; the result says what came from where (or what failed)."""
    started = time.monotonic()
    headers = {"User-Agent": USER_AGENT, **RAW_BYTES}
    async with aiohttp.ClientSession(headers=headers, auto_decompress=False) as session:
        fetcher = Fetcher(settings, token, session)
        error = ""
        try:
            await fetcher.repository(settings.model, settings.layout)
        except HubRefused as refusal:
            error = str(refusal)
        except OSError as failure:  # the pod's volume: full, or not writable
            error = f"writing the model into the pod's volume failed: {failure}"
        for adapter in settings.adapters if not error else ():
            try:
                await fetcher.repository(adapter, Layout.ALL)
            except HubRefused as refusal:
                # Not the pod's end: the engine tries it itself, and its refusal shows on the adapter.
                log.warning("adapter %s not fetched: %s", adapter, refusal)
    tally = fetcher.tally
    return FetchResult(
        model=settings.model,
        seconds=time.monotonic() - started,
        hub_bytes=tally.hub,
        node_bytes=tally.node,
        local_bytes=tally.local,
        files=tally.files,
        node_cache="; ".join(tally.problems),
        error=error,
        hub_unreachable=tally.offline,
    )
