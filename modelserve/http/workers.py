"""Several processes serving one port (SO_REUSEPORT), so a proxy uses the cores its pod is given:
one Python process relays about 40k token events/s on one core, a pod fed by fast GPUs needs more.

The parent forks the workers and only supervises them: it forwards SIGTERM (each worker drains as
one process would), starts a worker again if one dies, and exits when they have all stopped. Each
worker has its own listening socket on the port, so the kernel spreads connections over them, and
one more on an abstract unix socket (no file: the container's root is read-only) where its siblings
ask it for its own share of the pod's state (worker_views.py)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# A worker that dies this often this fast is broken, not unlucky: the container restarts instead.
MAX_RESTARTS = 5
RESTART_WINDOW_SECONDS = 60.0
STARTUP_FAILURE = 3  # uvicorn's exit code when the port is taken or the app cannot start


def die_with_parent(signum: int) -> None:
    """This process gets `signum` when the thread that started it ends (Linux: PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)


def share(limit: int, among: int) -> int:
    """One process's (or replica's) part of a limit: rounded up, so nothing is refused everywhere
    below the limit (together they allow at most `among` - 1 more than it)."""
    return -(-limit // max(1, among))


def sibling_address(parent: int, index: int) -> str:
    """Worker `index`'s unix socket (abstract: the leading NUL), unique to its parent process."""
    return f"\0modelserve-{parent}-worker-{index}"


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket on host:port that the other workers' sockets share (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def unix_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address)
    return sock


Worker = Callable[[int, list[socket.socket]], None]


def _run_child(index: int, host: str, port: int, parent: int, worker: Worker) -> int:
    """In the forked child: die with the parent, bind, serve until stopped; the exit code."""
    try:
        die_with_parent(signal.SIGTERM)
        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the parent only, which stops each worker once
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        try:
            sockets = [listening_socket(host, port), unix_socket(sibling_address(parent, index))]
        except OSError as exc:
            log.error("worker %d cannot listen on %s:%d: %s", index, host, port, exc)
            return STARTUP_FAILURE
        worker(index, sockets)
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("worker %d failed", index)
        return 1


class Supervisor:
    """Forks `count` workers and keeps them running until SIGTERM or SIGINT."""

    def __init__(self, count: int, host: str, port: int, worker: Worker) -> None:
        self.count = count
        self.host = host
        self.port = port
        self.worker = worker
        self.pids: dict[int, int] = {}  # pid -> worker index
        self.stopping = False
        self.failed = 0  # the exit code to end with, when a worker could not start
        self.restarts: list[float] = []

    def spawn(self, index: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_run_child(index, self.host, self.port, os.getppid(), self.worker))
        self.pids[pid] = index

    def stop(self, *_: object) -> None:
        """Each worker told once: a second SIGTERM would make uvicorn cut its drain short."""
        if self.stopping:
            return
        self.stopping = True
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):  # exited, not reaped yet
                os.kill(pid, signal.SIGTERM)

    def reaped(self, pid: int, status: int) -> None:
        index = self.pids.pop(pid, None)
        if index is None or self.stopping:
            return
        code = os.waitstatus_to_exitcode(status)
        now = time.monotonic()
        self.restarts = [at for at in self.restarts if now - at < RESTART_WINDOW_SECONDS] + [now]
        if code == STARTUP_FAILURE or len(self.restarts) > MAX_RESTARTS:
            log.error("worker %d exited (%d): stopping every worker", index, code)
            self.failed = code or 1
            self.stop()
            return
        log.warning("worker %d exited (%d): starting it again", index, code)
        self.spawn(index)

    def run(self) -> int:
        """Until every worker has stopped: 0, or the code of the failure that stopped them."""
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        for index in range(self.count):
            self.spawn(index)
        log.info("%d workers serving %s:%d", self.count, self.host, self.port)
        while self.pids:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            self.reaped(pid, status)
        return self.failed
