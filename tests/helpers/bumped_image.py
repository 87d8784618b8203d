"""A version-bumped copy of our image, made without a container engine: one thin layer on the
built archive (`docker save` format) that rewrites the package's `__version__`, under a new tag."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from pathlib import Path

INIT_SUFFIX = "site-packages/modelserve/__init__.py"


def _package_init(source: tarfile.TarFile, layers: list[str]) -> tuple[tarfile.TarInfo, str]:
    """The package's __init__.py as the image's top layer holding it has it."""
    found: tuple[tarfile.TarInfo, str] | None = None
    for layer in layers:
        with tarfile.open(fileobj=source.extractfile(layer)) as files:
            for member in files:
                if member.isfile() and member.name.endswith(INIT_SUFFIX):
                    found = (member, files.extractfile(member).read().decode())
    if found is None:
        raise ValueError(f"no {INIT_SUFFIX} in the image")
    return found


def _layer(info: tarfile.TarInfo, text: str) -> bytes:
    data = text.encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as layer:
        member = tarfile.TarInfo(info.name)
        member.size, member.mode, member.uid, member.gid = len(data), info.mode, info.uid, info.gid
        member.mtime = int(time.time())  # newer than the image's bytecode: Python reads the source
        layer.addfile(member, io.BytesIO(data))
    return out.getvalue()


def bump(source: Path, target: Path, version: str) -> str:
    """Write `target`, the image of `source` with `__version__` set to `version` and tagged with it;
    return the new image reference."""
    with tarfile.open(source) as archive:
        (entry,) = json.load(archive.extractfile("manifest.json"))
        config = json.load(archive.extractfile(entry["Config"]))
        info, text = _package_init(archive, entry["Layers"])
        bumped_text, count = re.subn(r'^__version__ = ".*"$', f'__version__ = "{version}"', text, flags=re.M)
        assert count == 1, "the package's __version__ line was not found"
        layer = _layer(info, bumped_text)
        layer_digest = hashlib.sha256(layer).hexdigest()
        config["rootfs"]["diff_ids"].append(f"sha256:{layer_digest}")
        config.setdefault("history", []).append({"created_by": f"tests: __version__ = {version}"})
        config["config"].setdefault("Labels", {})["org.opencontainers.image.version"] = version
        config_bytes = json.dumps(config).encode()
        config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
        reference = f"{entry['RepoTags'][0].rsplit(':', 1)[0]}:{version}"
        manifest = [
            {"Config": config_name, "RepoTags": [reference], "Layers": [*entry["Layers"], f"{layer_digest}/layer.tar"]}
        ]
        with tarfile.open(target, "w") as out:
            for member in archive:
                if member.name in ("manifest.json", "repositories", entry["Config"]):
                    continue
                out.addfile(member, archive.extractfile(member) if member.isfile() else None)
            for name, data in (
                (config_name, config_bytes),
                (f"{layer_digest}/layer.tar", layer),
                ("manifest.json", json.dumps(manifest).encode()),
            ):
                member = tarfile.TarInfo(name)
                member.size, member.mtime = len(data), int(time.time())
                out.addfile(member, io.BytesIO(data))
    return reference
