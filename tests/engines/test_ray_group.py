"""The scripts a vLLM group's pods run, run for real: /bin/sh (dash, as in Debian-based engine images),
real Python for the checks, a real socket on loopback standing in for the Ray head's port. No Ray
here (vLLM's CPU image lacks it), so a worker that got past its wait ends in `exec ray`: not found."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelserve.engines import ray_group
from modelserve.engines.ray_group import GROUP_JOINED, HEAD_ANSWERS, worker_script

SH = "/bin/sh"
# Bounds for a whole run: the scripts below poll every second and give up after a few.
RUN_SECONDS = 60


@pytest.fixture
def path(tmp_path: Path) -> str:
    """PATH with this Python as python3, the system's sleep, and neither ray nor vllm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    search = f"{bin_dir}:/usr/bin:/bin"
    assert shutil.which("ray", path=search) is None and shutil.which("vllm", path=search) is None
    return search


def _env(path: str, **group: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LWS_")}
    return {**env, "PATH": path, **group}


def _run(script: str, name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SH, "-c", script, name, *args], env=env, capture_output=True, text=True, timeout=RUN_SECONDS, check=False
    )


@pytest.fixture
def free_port() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield port


def test_the_checks_are_python_without_a_single_quote_that_would_end_the_shells_string() -> None:
    for code in (HEAD_ANSWERS, GROUP_JOINED):
        assert "'" not in code
        compile(code, "<check>", "exec")


def test_the_generated_scripts_are_posix_shell_with_the_named_bounds() -> None:
    for script in (ray_group.WORKER_SCRIPT, ray_group.LEADER_SCRIPT):
        subprocess.run([SH, "-n", "-c", script], check=True, timeout=RUN_SECONDS)
        assert f'[ "$waited" -ge {ray_group.WAIT_SECONDS} ]' in script and f"sleep {ray_group.POLL_SECONDS};" in script
    assert '--address="$head"' in ray_group.WORKER_SCRIPT and f':{ray_group.RAY_PORT}"' in ray_group.WORKER_SCRIPT
    assert f"ray start --head --port={ray_group.RAY_PORT} " in ray_group.LEADER_SCRIPT
    assert ray_group.LEADER_SCRIPT.endswith('exec vllm serve "$@"\n')
    assert ray_group.WORKER_SCRIPT.endswith('exec ray start --address="$head" --block --disable-usage-stats\n')


def test_a_worker_waits_for_the_head_that_comes_up_later_then_joins_it(path: str, free_port: int) -> None:
    script = worker_script(free_port, wait_seconds=RUN_SECONDS // 2, poll_seconds=1)
    env = _env(path, LWS_LEADER_ADDRESS="127.0.0.1")
    worker = subprocess.Popen([SH, "-c", script, "vllm-worker"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        # The head is not up: the worker says so, and waits.
        first = worker.stderr.readline()
        assert f"the Ray head at 127.0.0.1:{free_port} does not answer yet" in first and "refused" in first
        assert worker.poll() is None
        started = time.monotonic()
        with socket.create_server(("127.0.0.1", free_port)):
            rest = worker.communicate(timeout=RUN_SECONDS)[1]
        # Within a poll of the head's port opening, the worker went on to join it: `exec ray start`.
        assert time.monotonic() - started < RUN_SECONDS // 2
        assert worker.returncode == 127 and rest.strip().endswith("ray: not found"), rest
        assert "gave up" not in rest
    finally:
        worker.kill()
        worker.wait()


def test_a_worker_gives_up_after_its_bound_and_says_what_it_waited_for(path: str, free_port: int) -> None:
    script = worker_script(free_port, wait_seconds=2, poll_seconds=1)
    started = time.monotonic()
    run = _run(script, "vllm-worker", _env(path, LWS_LEADER_ADDRESS="127.0.0.1"))
    assert run.returncode == 1
    assert time.monotonic() - started < RUN_SECONDS
    lines = run.stderr.strip().splitlines()
    assert len([line for line in lines if "does not answer yet" in line]) == 3  # at 0, 1 and 2 s
    # The last line is the container's termination message (FallbackToLogsOnError).
    assert lines[-1] == (
        f"modelserve: gave up after 2 s waiting for the Ray head at 127.0.0.1:{free_port} (the leader's pod "
        "running, its name in cluster DNS); exiting, so that LeaderWorkerSet recreates the group"
    )


def test_a_worker_waits_through_a_leader_name_that_does_not_resolve_yet(path: str) -> None:
    script = worker_script(wait_seconds=1, poll_seconds=1)
    run = _run(script, "vllm-worker", _env(path, LWS_LEADER_ADDRESS="m-0.m-0.ns.invalid"))
    lines = run.stderr.strip().splitlines()
    # A lookup failure is one more reason to wait, not to stop: it looked twice, then gave up.
    assert run.returncode == 1 and len([line for line in lines if "does not answer yet" in line]) == 2, lines
    assert "m-0.m-0.ns.invalid:6379" in lines[0] and "gave up after 1 s" in lines[-1]


def test_a_pod_outside_a_leader_worker_set_stops_at_once(path: str) -> None:
    worker = _run(ray_group.WORKER_SCRIPT, "vllm-worker", _env(path))
    assert worker.returncode != 0 and "LWS_LEADER_ADDRESS" in worker.stderr and "webhook" in worker.stderr
    leader = _run(ray_group.LEADER_SCRIPT, "vllm-leader", _env(path), "model")
    assert leader.returncode != 0 and "LWS_GROUP_SIZE" in leader.stderr and "ray" not in leader.stderr


def test_a_leader_whose_ray_head_fails_stops_before_vllm(path: str) -> None:
    leader = _run(ray_group.LEADER_SCRIPT, "vllm-leader", _env(path, LWS_GROUP_SIZE="2"), "model")
    assert leader.returncode == 127 and leader.stderr.strip().endswith("ray: not found"), leader.stderr
    assert "vllm" not in leader.stderr.replace("vllm-leader", "")
