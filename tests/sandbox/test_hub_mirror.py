"""The sandbox's hub mirror answers the Hub routes engines download through, with the real hashes."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import httpx
import pytest

from modelserve_sandbox.hub_mirror import HubFile, HubMirror

REPO = "acme/tiny-GGUF"


@pytest.fixture()
def mirror(tmp_path: Path):
    weights = tmp_path / "tiny-Q4_K_M.gguf"
    weights.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hub = HubMirror([HubFile(REPO, "tiny-Q4_K_M.gguf", weights)], "127.0.0.1", port).start()
    try:
        yield hub, weights
    finally:
        hub.stop()


def test_refs_tree_and_resolve_agree(mirror) -> None:
    hub, weights = mirror
    sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
    with httpx.Client(base_url=hub.url, timeout=10) as client:
        refs = client.get(f"/api/models/{REPO}/refs").json()
        commit = refs["branches"][0]["targetCommit"]
        assert refs["branches"][0]["name"] == "main" and len(commit) == 40
        (entry,) = client.get(f"/api/models/{REPO}/tree/{commit}").json()
        assert entry["path"] == "tiny-Q4_K_M.gguf"
        assert entry["lfs"] == {"oid": sha256, "size": weights.stat().st_size, "pointerSize": 134}
        body = client.get(f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf")
        assert body.content == weights.read_bytes()
        assert body.headers["x-linked-etag"] == f'"{sha256}"' and body.headers["x-repo-commit"] == commit
        head = client.head(f"/{REPO}/resolve/{commit}/tiny-Q4_K_M.gguf")
        assert head.status_code == 200 and int(head.headers["content-length"]) == weights.stat().st_size
        ranged = client.get(f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf", headers={"Range": "bytes=0-3"})
        assert ranged.status_code == 206 and ranged.content == b"GGUF"  # resumed downloads


def test_unknown_repos_files_and_revisions_are_404(mirror) -> None:
    hub, _ = mirror
    with httpx.Client(base_url=hub.url, timeout=10) as client:
        assert client.get("/api/models/acme/other/refs").status_code == 404
        assert client.get(f"/api/models/{REPO}/tree/{'0' * 40}").status_code == 404
        assert client.get(f"/{REPO}/resolve/main/missing.gguf").status_code == 404
        assert client.get(f"/{REPO}/resolve/{'0' * 40}/tiny-Q4_K_M.gguf").status_code == 404


def test_model_info_lists_the_files_at_the_commit(mirror) -> None:
    # huggingface_hub's snapshot_download (vLLM's download) reads this before any file.
    hub, _ = mirror
    with httpx.Client(base_url=hub.url, timeout=10) as client:
        commit = client.get(f"/api/models/{REPO}/refs").json()["branches"][0]["targetCommit"]
        for path in (
            f"/api/models/{REPO}",
            f"/api/models/{REPO}/revision/main",
            f"/api/models/{REPO}/revision/{commit}",
        ):
            info = client.get(path).json()
            assert info["id"] == REPO and info["sha"] == commit, path
            assert info["siblings"] == [{"rfilename": "tiny-Q4_K_M.gguf"}], path
        assert client.get(f"/api/models/{REPO}/revision/{'0' * 40}").status_code == 404
        assert client.get("/api/models/acme/other").status_code == 404
