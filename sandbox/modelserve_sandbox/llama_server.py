"""Where hack/build-llama-server.sh puts llama.cpp's real `llama-server`, built from source.

The same binary runs on the host in the sidecar's engine tests and in the sandbox's llama.cpp
image (ghcr.io/ggml-org/llama.cpp:server-b<LLAMA_BUILD>, the operator's pinned cpu engine).
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

from .cluster import default_cache

LLAMA_BUILD = 11434  # keep in step with hack/build-llama-server.sh and the cpu engine's image tag


def llama_server_binary() -> Path:
    path = default_cache() / "llama.cpp" / f"b{LLAMA_BUILD}" / "llama-server"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing; build it with `bash hack/build-llama-server.sh` (or `make test`)")
    return path


@cache
def llama_server_help() -> str:
    """What `llama-server --help` prints: every flag, and the variable that sets it. hack/setup.sh
    builds the binary before any test runs: a missing one fails the caller, never skips it."""
    return subprocess.run([str(llama_server_binary()), "--help"], capture_output=True, text=True, timeout=60).stdout
