"""The sandbox's hub mirror answers the Hub routes engines download through, with the real hashes."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import httpx
import pytest

from modelserve_sandbox.hub_mirror import HubFile, HubMirror, TokenBucket, parse_bandwidth
from modelserve_sandbox.processes import free_ports

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


def test_it_counts_the_bytes_it_sends_per_client_files_and_api_apart(mirror) -> None:
    hub, weights = mirror
    with httpx.Client(base_url=hub.url, timeout=10) as client:
        client.get(f"/api/models/{REPO}/refs")
        assert client.get(f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf").content == weights.read_bytes()
        client.get(f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf", headers={"Range": "bytes=4-"})
        client.head(f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf")
        counted = client.get("/_mirror/bytes").json()
    size = weights.stat().st_size
    assert counted["127.0.0.1"]["files"] == size + size - 4  # a HEAD sends no body
    assert counted["127.0.0.1"]["api"] > 0
    assert counted == hub.bytes_by_client()


def test_a_gated_repository_answers_its_files_only_to_its_tokens(tmp_path: Path) -> None:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"GGUF" * 100)
    (port,) = free_ports(1)
    hub = HubMirror(
        [HubFile(REPO, "w.gguf", weights)], "127.0.0.1", port, gated={REPO: frozenset({"hf_granted"})}
    ).start()
    try:
        with httpx.Client(base_url=hub.url, timeout=10) as client:
            path = f"/{REPO}/resolve/main/w.gguf"
            anonymous = client.head(path)
            assert anonymous.status_code == 401 and anonymous.headers["x-error-code"] == "GatedRepo"
            assert client.get(path, headers={"Authorization": "Bearer hf_other"}).status_code == 403
            granted = client.get(path, headers={"Authorization": "Bearer hf_granted"})
            assert granted.status_code == 200 and granted.content == weights.read_bytes()
            # As on the hub, the listing stays readable: only the files are gated.
            assert client.get(f"/api/models/{REPO}").json()["gated"] == "manual"
            assert client.get(f"/api/models/{REPO}/tree/main").status_code == 200
    finally:
        hub.stop()


def test_bandwidth_reads_as_links_are_rated() -> None:
    assert parse_bandwidth("100M") == 100e6
    assert parse_bandwidth("1G") == 1e9
    assert parse_bandwidth("1.5g") == 1.5e9
    assert parse_bandwidth("800k") == 800e3
    for bad in ("0", "-1M", "fast"):
        with pytest.raises(ValueError):
            parse_bandwidth(bad)


def test_the_token_bucket_makes_every_sender_wait_for_the_shared_rate() -> None:
    bucket = TokenBucket(8e6, burst_bytes=1000)  # 1 MB/s
    assert bucket.debit(1000, now=0.0) == 0.0  # the burst goes at once
    assert bucket.debit(500_000, now=0.0) == pytest.approx(0.5)  # then half a second per 500 kB
    # A second sender asking at the same moment queues behind the first's debt: one uplink.
    assert bucket.debit(500_000, now=0.0) == pytest.approx(1.0)
    assert bucket.debit(0, now=1.0) == 0.0  # paid back
