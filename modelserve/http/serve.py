"""Serving as the sidecar and the gateway both do: the ASGI app served by uvicorn with uvloop and
httptools, the proxied consumer routes on the protocol's fast lane (direct.py), no access log (the
metrics count every request; a log line each would cost more than the proxying), no Server or Date
header of uvicorn's own (the upstream's pass through), and a drain on SIGTERM. Given a certificate
directory, HTTPS (tls.py), the fast lane on the TLS transport as on a plain one."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from .direct import DirectRoutes, protocol_for
from .limits import ConnectionLimits, connection_cap, raise_file_limit
from .shared_rows import SharedRows
from .tls import Certificate, PairError
from .worker_views import Siblings
from .workers import Supervisor

log = logging.getLogger(__name__)


def config(
    app: Any,
    host: str,
    port: int,
    drain_seconds: float,
    direct: DirectRoutes,
    log_level: str = "info",
    limits: ConnectionLimits | None = None,
    tls: ssl.SSLContext | None = None,
) -> uvicorn.Config:
    """uvicorn's configuration; every connection held to `limits` (limits.py), its connection cap
    within this process's file limit (raised to its hard limit first); with `tls`, HTTPS with that
    context (a Certificate's `listener`: uvicorn's `config.ssl` as `config.load()` sets it)."""
    limits = limits or ConnectionLimits()
    cap = connection_cap(limits.max_connections, raise_file_limit())
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_for(direct, limits, cap),
        lifespan="on",
        access_log=False,
        server_header=False,
        date_header=False,
        # Nothing reads the client's address or scheme: no X-Forwarded-* rewriting layer per request.
        proxy_headers=False,
        log_level=log_level,
        # On SIGTERM uvicorn stops accepting, lets in-flight requests (streams) finish up to this
        # deadline, then cancels them and runs the lifespan shutdown.
        timeout_graceful_shutdown=drain_seconds,
        ssl_context_factory=None if tls is None else (lambda _config, _default: tls),
    )


def certificate(directory: Path, app: Any) -> Certificate:
    """The certificate in `directory` for serving `app`, its changes told to the app's
    `certificate_changed` (tls.Changed) when it has one; a bad pair ends the process, one line logged."""
    try:
        return Certificate(directory, getattr(app, "certificate_changed", None))
    except PairError as exc:
        log.error("cannot serve TLS: %s", exc)
        sys.exit(STARTUP_FAILURE)


class Server(uvicorn.Server):
    """uvicorn's server, telling the app (its `told_to_stop()`, when it has one) that a signal told it
    to stop: the sidecar's `/drained` waits for that (sidecar/drained.py). With TLS it makes the
    listening servers itself: a TLS handshake must end within `handshake_seconds` (the request
    head's deadline: uvicorn would give it asyncio's 60 s, and a connection still in its handshake
    is not yet one the connection cap counts), and a worker's unix socket, where its siblings ask it
    in plain HTTP (worker_views.py), is served without TLS (uvicorn serves every socket it is given
    with `config.ssl`)."""

    def __init__(self, config: uvicorn.Config, app: Any, handshake_seconds: float | None = None) -> None:
        super().__init__(config)
        self._stop = getattr(app, "told_to_stop", None)
        self._handshake_seconds = handshake_seconds or ConnectionLimits.head_seconds

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        if self._stop is not None:
            self._stop()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        if config.ssl is None:
            await super().startup(sockets)
            return
        await super().startup([])  # the lifespan's start, and no listener: they are made below
        loop = asyncio.get_running_loop()
        handshake = {"ssl": config.ssl, "ssl_handshake_timeout": self._handshake_seconds}
        try:
            if sockets is None:
                where = {"host": config.host, "port": config.port, "backlog": config.backlog}
                self.servers.append(await loop.create_server(self._connection, **where, **handshake))
                log.info("serving HTTPS on %s:%d", config.host, config.port)
            for sock in sockets or ():
                tls = handshake if sock.family != socket.AF_UNIX else {}
                self.servers.append(
                    await loop.create_server(self._connection, sock=sock, backlog=config.backlog, **tls)
                )
        except OSError as exc:  # as uvicorn's: the port taken
            log.error("%s", exc)
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)

    def _connection(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's startup makes it."""
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )


def serve(
    app: Any,
    host: str,
    port: int,
    drain_seconds: float,
    direct: DirectRoutes,
    log_level: str = "info",
    limits: ConnectionLimits | None = None,
    sockets: list[socket.socket] | None = None,
    tls: Path | None = None,
) -> None:
    """Serve until SIGTERM; on `sockets` already listening (a worker's, workers.py) if given; HTTPS
    with the certificate in `tls` (tls.py), followed while serving, if given."""
    served = certificate(tls, app) if tls is not None else None
    # Everything loaded so far (the frameworks, the app) lives as long as the process: out of the
    # collector's sight, a full collection no longer walks it while requests allocate.
    gc.collect()
    gc.freeze()
    context = served.listener if served is not None else None
    limits = limits or ConnectionLimits()
    server = Server(
        config(app, host, port, drain_seconds, direct, log_level, limits, context), app, limits.head_seconds
    )
    with served.following() if served is not None else contextlib.nullcontext():
        server.run(sockets=sockets)
    if not server.started:  # as uvicorn.run: the port was taken, or the lifespan's start failed
        sys.exit(STARTUP_FAILURE)


def serve_workers(
    make_app: Callable[[Siblings | None], Any],
    workers: int,
    host: str,
    port: int,
    drain_seconds: float,
    limits: ConnectionLimits,
    shared_width: int = 0,
    tls: Path | None = None,
) -> None:
    """`serve` the app `make_app` makes, in this process, or in each of `workers` (workers.py), each
    making its own after the fork (its loop, watches and connections are its alone, and its own
    following of the certificate in `tls`, when given); with `shared_width`, the workers share a row
    of that many counts each (shared_rows.py)."""
    if workers == 1:
        app = make_app(None)
        serve(app, host, port, drain_seconds, app.direct_routes(), limits=limits, tls=tls)
        return

    rows = SharedRows(workers, shared_width) if shared_width else None  # before the fork: every worker's

    def worker(index: int, sockets: list[socket.socket]) -> None:
        if rows is not None:
            rows.clear(index)  # what this worker's predecessor held, if it died, is free again
            # A sibling may signal this worker (a nudge) once it listens: harmless until then.
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        app = make_app(Siblings(os.getppid(), workers, index, rows))
        serve(app, host, port, drain_seconds, app.direct_routes(), limits=limits, sockets=sockets, tls=tls)

    sys.exit(Supervisor(workers, host, port, worker).run())
