"""Starting, waiting for and stopping the control plane's processes."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux only: the child gets SIGTERM when the test process dies, so a killed test run
    # never leaves an API server or etcd behind.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# Every port free_ports has handed out in this process: a caller binds its port later (a child
# process starts), so without this two calls could both hand out a port nobody holds yet. CI once
# gave the operator's metrics and liveness the same port, and the operator died at start.
_HANDED_OUT: set[int] = set()
_DRAWS_PER_PORT = 50


def _below_ephemeral() -> range:
    """Ports the kernel never hands a client socket (those come from ip_local_port_range): a port drawn
    from here and bound moments later cannot have been taken meanwhile by one of the thousands of
    connections the tests open. A CI run lost its whole real-node half when a port drawn from the
    ephemeral range (54709) was some connection's by the time the LeaderWorkerSet controller bound it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(low, 10001))


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1, below the ephemeral range, none handed out before by this
    process (all held open together while drawn, so none repeats)."""
    candidates = _below_ephemeral()
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count * _DRAWS_PER_PORT):
            if len(ports) == count:
                break
            port = random.choice(candidates)
            if port in _HANDED_OUT or port in ports:
                continue
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # some process holds it
                continue
            ports.append(port)
        if len(ports) < count:
            raise RuntimeError(f"found {len(ports)} of {count} free ports not handed out before")
        _HANDED_OUT.update(ports)
        return ports


def start_process(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - sets PDEATHSIG only
        )
    finally:
        log.close()


def ended(pid: int) -> bool:
    """Whether process `pid` has ended: no such process, or only its exit status left for a parent to
    reap (a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stop_process(process: subprocess.Popen, grace_seconds: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace_seconds)


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.2,
    on_timeout: Callable[[], str] | None = None,
) -> None:
    """Poll `condition` until it holds; raise TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    detail = on_timeout() if on_timeout else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def environ_with_path(bin_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env
