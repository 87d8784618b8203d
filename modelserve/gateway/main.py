"""`modelserve-gateway`: read the settings, watch the cluster, serve until SIGTERM, drain, exit."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from modelserve.contracts.env import settings_or_exit, variables_help
from modelserve.contracts.gateway import OWN_ROUTES
from modelserve.http import tls
from modelserve.http.limits import ConnectionLimits
from modelserve.http.serve import serve_workers

from .app import Discovery, build_app
from .discovery import KubeDiscovery
from .holding import SHARED_WIDTH
from .settings import GatewaySettings

log = logging.getLogger("modelserve.gateway")


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="modelserve-gateway",
        description="One OpenAI-compatible endpoint for the ModelServers of the watched namespaces: routes by the "
        "request's model, holds requests while a model scales from zero.\n"
        "Settings come from the environment (the chart sets them); Kubernetes access from the pod's "
        "service account or $KUBECONFIG:\n" + variables_help(GatewaySettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> None:
    _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_or_exit(GatewaySettings, "modelserve-gateway")
    log.info(
        "routing (%s) the ModelServers of %s on %s:%d (%s); holding up to %d requests per model for %g s",
        settings.routing,
        ", ".join(settings.namespaces) or "every namespace",
        settings.listen_host,
        settings.listen_port,
        "HTTP" if settings.tls_dir is None else f"HTTPS, the certificate in {settings.tls_dir}",
        settings.max_held,
        settings.hold_seconds,
    )
    run(settings, lambda: KubeDiscovery(settings.namespaces))


def run(settings: GatewaySettings, discovery: Callable[[], Discovery]) -> None:
    """Serve until SIGTERM, in `settings.workers` processes, each with its own `discovery()`. A
    certificate that cannot be served ends it first, with status 2 and one line naming the file."""
    if settings.tls_dir is not None:
        pair = tls.check_or_exit(settings.tls_dir, "modelserve-gateway")
        log.info("serving HTTPS: %s (%s)", settings.tls_dir / tls.CERT_FILE, pair.describe())
    serve_workers(
        lambda siblings: build_app(settings, discovery(), siblings=siblings),
        settings.workers,
        settings.listen_host,
        settings.listen_port,
        settings.drain_seconds,
        ConnectionLimits.of(settings, OWN_ROUTES),
        SHARED_WIDTH,
        settings.tls_dir,
    )


if __name__ == "__main__":
    main()
