"""`modelserve-sidecar`: read the settings, serve until SIGTERM, drain, exit."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from modelserve.contracts.env import settings_or_exit, variables_help
from modelserve.contracts.sidecar import Settings
from modelserve.http.limits import ConnectionLimits
from modelserve.http.serve import serve
from modelserve.http.worker_views import Siblings
from modelserve.http.workers import Supervisor

from .app import build_app

log = logging.getLogger("modelserve.sidecar")


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="modelserve-sidecar",
        description="Serve the engine's OpenAI-compatible API behind API keys, with metrics and readiness.\n"
        "Every setting comes from the environment (the operator sets them all):\n" + variables_help(Settings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> None:
    _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_or_exit(Settings, "modelserve-sidecar")
    log.info(
        "serving %r (upstream %r) from %s on %s:%d; auth %s, vision %s, sampling defaults %s, body limit %d bytes",
        settings.served_model,
        settings.engine_model,
        settings.upstream_url,
        settings.listen_host,
        settings.listen_port,
        "public" if settings.auth_public else f"private (keys in {settings.keys_dir})",
        settings.vision,
        dict(settings.sampling_defaults),
        settings.max_body_bytes,
    )
    if settings.workers > 1:
        log.info("%d workers on the port", settings.workers)
    limits = ConnectionLimits.of(settings)
    if settings.workers == 1:
        app = build_app(settings)
        serve(
            app, settings.listen_host, settings.listen_port, settings.drain_seconds, app.direct_routes(), limits=limits
        )
        return

    def worker(index: int, sockets: list[socket.socket]) -> None:
        app = build_app(settings, Siblings(os.getppid(), settings.workers, index))
        host, port = settings.listen_host, settings.listen_port
        serve(app, host, port, settings.drain_seconds, app.direct_routes(), limits=limits, sockets=sockets)

    sys.exit(Supervisor(settings.workers, settings.listen_host, settings.listen_port, worker).run())


if __name__ == "__main__":
    main()
