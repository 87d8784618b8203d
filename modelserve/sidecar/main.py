"""`modelserve-sidecar`: read the settings, serve until SIGTERM, drain, exit."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from modelserve.contracts.env import settings_or_exit, variables_help
from modelserve.contracts.sidecar import OWN_ROUTES, Settings
from modelserve.http import tls
from modelserve.http.limits import ConnectionLimits
from modelserve.http.serve import serve_workers

from .app import build_app
from .pod_counts import WIDTH

log = logging.getLogger("modelserve.sidecar")
PROGRAM = "modelserve-sidecar"


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
    settings = settings_or_exit(Settings, PROGRAM)
    log.info(
        "serving %r (upstream %r) from %s on %s:%d (%s); auth %s, vision %s, sampling defaults %s, body limit %d bytes",
        settings.served_model,
        settings.engine_model,
        settings.upstream_url,
        settings.listen_host,
        settings.listen_port,
        "HTTP" if settings.tls_dir is None else f"HTTPS, the certificate in {settings.tls_dir}",
        "public" if settings.auth_public else f"private (keys in {settings.keys_dir})",
        settings.vision,
        dict(settings.sampling_defaults),
        settings.max_body_bytes,
    )
    if settings.tls_dir is not None:
        tls.starting_pair(settings.tls_dir, refused_certificate)
    serve_workers(
        lambda siblings: build_app(settings, siblings),
        settings.workers,
        settings.listen_host,
        settings.listen_port,
        settings.drain_seconds,
        ConnectionLimits.of(settings, OWN_ROUTES),
        WIDTH,
        settings.tls_dir,
    )


def refused_certificate(why: str) -> NoReturn:
    """Ends the program for a certificate it cannot serve: the one line, which the pod's
    terminationMessagePolicy puts in its status, where the operator's CrashLoop condition quotes it."""
    print(f"{PROGRAM}: cannot serve TLS: {why}", file=sys.stderr, flush=True)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
