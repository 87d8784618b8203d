"""`modelserve-operator` as a host process against a sandbox cluster, up once its liveness answers."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .processes import free_ports, start_process, stop_process, tail, wait_until


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def running_operator(
    env: dict[str, str], log_dir: Path, resync_seconds: float | None = None, program: list[str] | None = None
) -> Iterator[tuple[subprocess.Popen, Path]]:
    """The operator with `env` (a cluster's), logging into `log_dir`; yields (process, log); stopped after.
    `program`: what to run instead of the `modelserve-operator` script (e.g. under a profiler)."""
    liveness = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
    if resync_seconds is not None:
        env = {**env, "MODELSERVE_RESYNC_SECONDS": f"{resync_seconds:g}"}
    argv = [*(program or [str(Path(sys.executable).with_name("modelserve-operator"))]), "--liveness", liveness]
    process = start_process("modelserve-operator", argv, log_dir, env=env)
    log = log_dir / "modelserve-operator.log"
    try:
        wait_until(
            lambda: process.poll() is not None or _healthy(liveness),
            60,
            "the operator's liveness endpoint",
            on_timeout=lambda: "\n" + tail(log),
        )
        assert process.poll() is None, f"the operator exited with {process.returncode}:\n{tail(log)}"
        yield process, log
    finally:
        stop_process(process, grace_seconds=20)
