"""The node agent's store on the node's disk: verified files by their hub hash, the models that are made
of them, and what to evict when a new file needs room.

    <root>/blobs/<oid>          a file whose size and hash matched the hub's, named by that hash
    <root>/partial/<oid>.<n>    a download in progress (removed at start: never served whole)
    <root>/models/<key>.json    a model held whole: its files (with their paths, as the hub listed
                                them) and whether the hub opens it to anyone (public)

A file's modification time is when it was last served (the agent touches it), so least-recently used
survives a restart. Eviction takes whole models, never one a pod on the node uses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .hub import RepoFile, split_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRecord:
    key: str  # contracts.nodecache.model_key of the model as the spec names it
    model: str
    revision: str
    commit: str
    files: tuple[tuple[str, int], ...]  # (oid, size)
    # The files as the hub's tree listed them when the record was checked, by path. With `public`
    # (the hub named the model neither gated nor private), what the agent answers from while the hub
    # cannot be reached. A record written before either was kept has neither.
    paths: tuple[RepoFile, ...] = ()
    public: bool = False

    @property
    def oids(self) -> frozenset[str]:
        return frozenset(oid for oid, _ in self.files)

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)

    def to_json(self) -> str:
        files = [{"oid": oid, "size": size} for oid, size in self.files]
        body = {"key": self.key, "model": self.model, "revision": self.revision, "commit": self.commit, "files": files}
        # By name, as records have always been written (records already on disk read back the same).
        body["paths"] = [{"path": f.path, "oid": f.oid, "size": f.size, "lfs": f.lfs} for f in self.paths]
        body["public"] = self.public
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> ModelRecord:
        body = json.loads(text)
        files = tuple((str(f["oid"]), int(f["size"])) for f in body["files"])
        paths = tuple(
            RepoFile(str(f["path"]), int(f["size"]), str(f["oid"]), bool(f["lfs"])) for f in body.get("paths", ())
        )
        head = (str(body["key"]), str(body["model"]), str(body["revision"]), str(body["commit"]), files)
        return cls(*head, paths, body.get("public") is True)


@dataclass(frozen=True)
class Eviction:
    models: tuple[str, ...]  # keys of the models given up
    oids: tuple[str, ...]  # the files deleted
    freed: int


def plan_eviction(
    blobs: dict[str, tuple[int, float]],
    models: dict[str, ModelRecord],
    in_use: set[str] | None,
    busy: set[str],
    need: int,
    room: int,
) -> Eviction | None:
    """What to delete so that `need` more bytes fit in `room` (pure). `blobs`: oid -> (size, last used);
    `in_use`: the model keys pods on the node use (None: unknown, so all are); `busy`: files being
    served or written. Files no model claims go first, oldest first; then whole models no pod uses,
    least recently used first (a model's last use is its files' latest), each with its files no kept
    model shares. None when even that leaves too little room: the new file is not cached."""
    if need <= room:
        return Eviction((), (), 0)
    if in_use is None:
        return None
    kept_models = {key for key in models if key in in_use}
    protected = set(busy).union(*(models[key].oids for key in kept_models))
    claimed = set().union(*(record.oids for record in models.values())) if models else set()
    units: list[tuple[int, float, str | None, list[str]]] = []  # (orphan first, last used, model key, oids)
    for oid, (_, used) in blobs.items():
        if oid not in claimed and oid not in protected:
            units.append((0, used, None, [oid]))
    for key, record in models.items():
        if key in kept_models:
            continue
        oids = [oid for oid in record.oids if oid in blobs and oid not in protected]
        used = max((blobs[oid][1] for oid in record.oids if oid in blobs), default=0.0)
        units.append((1, used, key, oids))
    units.sort(key=lambda unit: (unit[0], unit[1], unit[2] or ""))
    chosen_models: list[str] = []
    candidates: list[str] = []

    def deletable() -> list[str]:
        """The candidates no model left standing claims (a file two models share goes with the last)."""
        standing = [models[k].oids for k in models if k not in chosen_models]
        claimed_still = set().union(*standing) if standing else set()
        return [oid for oid in candidates if oid not in claimed_still]

    for _, _, key, oids in units:
        if need <= room + sum(blobs[oid][0] for oid in deletable()):
            break
        if key is not None:
            chosen_models.append(key)
        candidates += [oid for oid in oids if oid not in candidates]
    chosen = deletable()
    freed = sum(blobs[oid][0] for oid in chosen)
    if need > room + freed:
        return None
    return Eviction(tuple(chosen_models), tuple(chosen), freed)


@dataclass
class Store:
    """The store under `root`, at most `limit` bytes of files."""

    root: Path
    limit: int
    blobs: dict[str, tuple[int, float]] = field(default_factory=dict)  # oid -> (size, last used)
    models: dict[str, ModelRecord] = field(default_factory=dict)
    _partials: int = 0

    def open(self) -> Store:
        """Read what a previous run left: verified files and model records; partial files removed."""
        for name in ("blobs", "partial", "models"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.root / "partial", ignore_errors=True)
        (self.root / "partial").mkdir(exist_ok=True)
        for path in (self.root / "blobs").iterdir():
            stat = path.stat()
            self.blobs[path.name] = (stat.st_size, stat.st_mtime)
        for path in (self.root / "models").glob("*.json"):
            try:
                record = ModelRecord.parse(path.read_text())
            except (ValueError, KeyError, TypeError, OSError):
                path.unlink(missing_ok=True)
                continue
            self.models[record.key] = record
        return self

    @property
    def used(self) -> int:
        return sum(size for size, _ in self.blobs.values())

    def room(self, partial: int = 0) -> int:
        """Bytes a new file may take: under the limit with `partial` (what downloads under way have
        written so far, not yet in `used`) counted too, and within the disk's free space (which
        counts them already)."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = 0
        return max(0, min(self.limit - self.used - partial, free))

    def blob(self, oid: str) -> Path:
        return self.root / "blobs" / oid

    def has(self, oid: str, size: int) -> bool:
        return self.blobs.get(oid, (-1, 0.0))[0] == size

    def partial(self, oid: str) -> Path:
        self._partials += 1
        return self.root / "partial" / f"{oid}.{self._partials}"

    def added(self, oid: str, partial: Path) -> Path:
        """A verified download: moved into place (the same inode: its readers keep reading)."""
        final = self.blob(oid)
        os.replace(partial, final)
        self.blobs[oid] = (final.stat().st_size, time.time())
        return final

    def touched(self, oid: str) -> None:
        """`oid` was served: it is used now (its modification time keeps that across restarts)."""
        if oid in self.blobs:
            now = time.time()
            self.blobs[oid] = (self.blobs[oid][0], now)
            with contextlib.suppress(OSError):
                os.utime(self.blob(oid), (now, now))

    def discard(self, oid: str) -> None:
        """A file found corrupt or evicted: gone, and every model made of it with it."""
        self.blobs.pop(oid, None)
        self.blob(oid).unlink(missing_ok=True)
        for key in [key for key, record in self.models.items() if oid in record.oids]:
            self.forget(key)

    def forget(self, key: str) -> None:
        self.models.pop(key, None)
        (self.root / "models" / f"{key}.json").unlink(missing_ok=True)

    def record(self, record: ModelRecord) -> bool:
        """A model a fetch found whole here; False (nothing recorded) unless every file is."""
        if not all(self.has(oid, size) for oid, size in record.files):
            return False
        path = self.root / "models" / f"{record.key}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(record.to_json())
        os.replace(temporary, path)
        self.models[record.key] = record
        return True

    def public_files(self, repo: str, revision: str) -> tuple[str, tuple[RepoFile, ...]] | None:
        """What the node holds whole of a public model `repo` at `revision` (a branch or tag as
        recorded, or its commit): (commit, its recorded files), for answering while the hub cannot be
        reached; None when it holds none. Records of one repository (its quantizations) at one
        commit are answered together."""
        commit, paths = None, {}
        for record in self.models.values():
            answers = record.public and record.paths and revision in (record.revision, record.commit)
            if not answers or split_model(record.model)[0] != repo or commit not in (None, record.commit):
                continue
            if all(self.has(oid, size) for oid, size in record.files):
                commit = record.commit
                paths.update({f.path: f for f in record.paths})
        return None if commit is None else (commit, tuple(paths[path] for path in sorted(paths)))

    def held(self) -> set[str]:
        """Keys of the models whose every file is here."""
        return {key for key, record in self.models.items() if all(self.has(o, s) for o, s in record.files)}

    def make_room(self, need: int, in_use: set[str] | None, busy: set[str], partial: int = 0) -> bool:
        """Evict to fit `need` more bytes (`partial`: as in `room`); False when they cannot fit (the
        file is then not cached)."""
        plan = plan_eviction(self.blobs, self.models, in_use, busy, need, self.room(partial))
        if plan is None:
            return False
        for key in plan.models:
            log.info("evicting model %s (%s): no pod on this node uses it", key, self.models[key].model)
            self.forget(key)
        for oid in plan.oids:
            self.discard(oid)
        return need <= self.room(partial)
