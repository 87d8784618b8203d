"""Where hack/install-checkov.sh puts checkov, the manifest scanner the security tests run, in a
virtual environment of its own (its pinned dependencies stay out of the project's)."""

from __future__ import annotations

from pathlib import Path

from .cluster import default_cache

CHECKOV_VERSION = "3.3.30"  # keep in step with hack/install-checkov.sh


def checkov_binary() -> Path:
    path = default_cache() / f"checkov-{CHECKOV_VERSION}" / "bin" / "checkov"
    if not (path.parent.parent / ".installed").is_file():
        raise FileNotFoundError(f"{path} missing; install it with `bash hack/install-checkov.sh` (or `make test`)")
    return path
