"""The real node's kept image root (image_store.py): what a linked copy shares and what it does not.

The real node's own start through it (a kept root filled by a real containerd, then a copy the
node runs on) is the real-node suite's fixture: every tests/realnode module stands on it."""

from __future__ import annotations

import os
from pathlib import Path

from modelserve_sandbox.image_store import kept_root, linked_copy

WHITEOUT_XATTR = "trusted.overlay.opaque"


def _containerd_like_root(root: Path) -> None:
    blobs = root / "io.containerd.content.v1.content" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / "abc").write_bytes(b"layer bytes")
    layer = root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "1" / "fs"
    (layer / "etc").mkdir(parents=True)
    (layer / "etc" / "os-release").write_text("bookworm")
    os.mknod(layer / "etc" / "removed", 0o600 | 0o020000, os.makedev(0, 0))  # an overlay whiteout
    os.setxattr(layer / "etc", WHITEOUT_XATTR, b"y")  # an opaque directory
    (root / "io.containerd.metadata.v1.bolt").mkdir()
    (root / "io.containerd.metadata.v1.bolt" / "meta.db").write_bytes(b"bolt")
    (root / "io.containerd.snapshotter.v1.overlayfs" / "metadata.db").write_bytes(b"bolt")


def test_a_linked_copy_shares_the_layers_and_copies_the_databases(tmp_path: Path) -> None:
    kept, copy = tmp_path / "kept", tmp_path / "node" / "root"
    _containerd_like_root(kept)
    linked_copy(kept, copy)
    blob = "io.containerd.content.v1.content/blobs/sha256/abc"
    layer = "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/etc"
    assert os.stat(kept / blob).st_ino == os.stat(copy / blob).st_ino  # no byte written
    assert os.stat(kept / layer / "os-release").st_ino == os.stat(copy / layer / "os-release").st_ino
    # What overlay reads from a layer survives: the whiteout device and the opaque directory's xattr.
    assert os.stat(copy / layer / "removed").st_rdev == os.makedev(0, 0)
    assert os.getxattr(copy / layer, WHITEOUT_XATTR) == b"y"
    # The databases containerd rewrites are copies: the node's writes never reach the kept root.
    for db in ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db"):
        assert os.stat(kept / db).st_ino != os.stat(copy / db).st_ino
        (copy / db).write_bytes(b"the node wrote this")
        assert (kept / db).read_bytes() == b"bolt"
    # A node's delete unlinks its own names only.
    (copy / blob).unlink()
    assert (kept / blob).read_bytes() == b"layer bytes"
    linked_copy(kept, copy)  # the next start's copy replaces what the last one left
    assert (copy / blob).is_file() and (copy / "io.containerd.metadata.v1.bolt" / "meta.db").read_bytes() == b"bolt"


def test_the_kept_root_is_filled_once_and_a_changed_archive_alone_is_imported_again(tmp_path: Path) -> None:
    store, fills = tmp_path / "store", []

    def fill(root: Path, archives: list[Path]) -> None:
        fills.append((root.name, [a.name for a in archives]))
        if not root.exists():
            _containerd_like_root(root)
        for archive in archives:  # what an import adds: a blob of its own
            (root / "io.containerd.content.v1.content" / "blobs" / "sha256" / archive.name).write_text(archive.name)

    first = [tmp_path / "modelserve-aaa.tar", tmp_path / "vllm-bbb.tar"]
    root = kept_root(store, first, "containerd 1.6", fill)
    assert kept_root(store, first, "containerd 1.6", fill) == root and len(fills) == 1  # a second start: nothing
    assert fills[0] == (f"{root.name}.partial", ["modelserve-aaa.tar", "vllm-bbb.tar"])  # filled aside, renamed
    # modelserve/ changed: a new project image, the vLLM image as it was. Only the new one is imported,
    # into a linked copy of the last root (its vLLM layers shared, not written again).
    rebuilt = [tmp_path / "modelserve-ccc.tar", tmp_path / "vllm-bbb.tar"]
    vllm = "io.containerd.content.v1.content/blobs/sha256/vllm-bbb.tar"
    inode = os.stat(root / vllm).st_ino
    second = kept_root(store, rebuilt, "containerd 1.6", fill)
    assert second != root and fills[1] == (f"{second.name}.partial", ["modelserve-ccc.tar"])
    assert os.stat(second / vllm).st_ino == inode
    assert sorted(p.name for p in store.iterdir()) == sorted([second.name, f"{second.name}.json"])  # the old went
    # Another containerd lays its root out its own way: everything again, from nothing.
    third = kept_root(store, rebuilt, "containerd 1.7", fill)
    assert third != second and fills[2][1] == ["modelserve-ccc.tar", "vllm-bbb.tar"]
    assert not (third / vllm).exists() or os.stat(third / vllm).st_ino != inode
