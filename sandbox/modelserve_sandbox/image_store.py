"""The real node's images, imported once per machine: a containerd root kept in the cache.

Importing the node's image archives (about 7.5 GB, the vLLM image most of it) took minutes at every
sandbox start, twice a test run. Instead the first start imports them into a containerd root of its
own under the cache, named by the archives (their names carry their inputs' hashes), and every start
works on a copy of that root made of hard links: seconds, no bytes written. When the archives change
(a new project image with every change to `modelserve/`), the new root starts as a linked copy of the
last one and imports only the archives it lacks.

Why hard links are safe: containerd never changes a committed file in place. Content blobs are
written once; an image layer's snapshot is an overlay lower directory, which the kernel only reads
(a container's writes go to its own upper directory, a new one). What containerd rewrites, its bolt
databases, is copied for real. A node's deletes (garbage collection, `ctr images rm`) unlink the
copy's names only; the kept root keeps its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

# Files containerd opens for writing in a root it runs on: each plugin's bolt database, at the top of
# the plugin's own directory (io.containerd.metadata.v1.bolt/meta.db, the snapshotter's metadata.db).
WRITTEN_IN_PLACE = "*/*.db"


def store_key(archives: list[Path], containerd_version: str) -> str:
    """The kept root's name: the archives it holds (by name: each carries its inputs' hash) and the
    containerd that wrote it (another version may lay its root out otherwise)."""
    digest = hashlib.sha256(containerd_version.encode())
    for archive in archives:
        digest.update(b"\0" + archive.name.encode())
    return digest.hexdigest()[:16]


def containerd_version() -> str:
    result = subprocess.run(["containerd", "--version"], capture_output=True, text=True, timeout=30, check=True)
    return result.stdout.strip()


def kept_root(store: Path, archives: list[Path], version: str, fill: Callable[[Path, list[Path]], None]) -> Path:
    """The containerd root holding `archives` for containerd `version`. The first time, `fill(root,
    missing)` (a containerd on that root importing them) makes it: on a linked copy of the last kept
    root of the same containerd, with only the archives that one lacks (a change to `modelserve/`
    rebuilds the project image alone: its 0.4 GB are imported, not the vLLM image's 6 GB), else from
    nothing. Only the newest root is kept (each is gigabytes)."""
    key = store_key(archives, version)
    root = store / key
    if root.is_dir():
        return root
    store.mkdir(parents=True, exist_ok=True)
    base, held = _last_kept(store, version)
    partial = store / f"{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # a fill that died
    if base is not None:
        linked_copy(base, partial)
    fill(partial, [archive for archive in archives if archive.name not in held])
    os.rename(partial, root)  # whole or absent: a fill that died leaves only ".partial"
    manifest = {"containerd": version, "archives": [archive.name for archive in archives]}
    (store / f"{key}.json").write_text(json.dumps(manifest))
    for other in store.iterdir():
        if other.name not in (key, f"{key}.json"):
            shutil.rmtree(other) if other.is_dir() else other.unlink()
    return root


def _last_kept(store: Path, version: str) -> tuple[Path | None, set[str]]:
    """The kept root a new one can start from (its containerd's, named in its manifest), and the
    archives it holds; (None, empty) when there is none."""
    for manifest in sorted(store.glob("*.json"), key=lambda path: path.stat().st_mtime, reverse=True):
        root = manifest.with_suffix("")
        try:
            held = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if root.is_dir() and isinstance(held, dict) and held.get("containerd") == version:
            return root, set(held.get("archives") or ())
    return None, set()


def linked_copy(root: Path, target: Path) -> None:
    """`target` as a copy of `root` that shares its files (hard links), its databases copied."""
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # cp keeps what overlay layers need: whiteouts (character devices), opaque directories
    # (trusted.* extended attributes, kept for root), owners and modes.
    subprocess.run(["cp", "-a", "--link", str(root), str(target)], check=True, capture_output=True, timeout=600)
    for linked in target.glob(WRITTEN_IN_PLACE):
        if linked.is_file():
            linked.unlink()
            shutil.copy2(root / linked.relative_to(target), linked)
