"""`modelserve-gateway`: read the settings, watch the cluster, serve until SIGTERM, drain, exit."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import NoReturn

from modelserve.contracts.env import settings_or_exit, variables_help
from modelserve.contracts.gateway import OWN_ROUTES
from modelserve.http import tls
from modelserve.http.limits import ConnectionLimits
from modelserve.http.serve import serve_workers
from modelserve.kube.events import post_pod_event

from .app import Discovery, build_app
from .discovery import KubeDiscovery
from .holding import SHARED_WIDTH
from .settings import GatewaySettings

log = logging.getLogger("modelserve.gateway")
PROGRAM = "modelserve-gateway"
# The Event's reason when the certificate at the start cannot be served.
CERTIFICATE_REFUSED = "TLSCertificateRefused"


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
    settings = settings_or_exit(GatewaySettings, PROGRAM)
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
    certificate that cannot be served ends it first, with status 2, one line naming the file, and
    the same as a Warning Event on the gateway's pod (refused_certificate)."""
    if settings.tls_dir is not None:
        tls.starting_pair(settings.tls_dir, lambda why: refused_certificate(settings, why))
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


def refused_certificate(settings: GatewaySettings, why: str) -> NoReturn:
    """Ends the program for a certificate it cannot serve: a Warning Event on its pod (what
    `kubectl describe pod` shows beside the crash loop), then the one line, which the chart's
    `terminationMessagePolicy` also puts in the pod's status, and status 2."""
    line = f"{PROGRAM}: cannot serve TLS: {why}"
    not_posted = post_pod_event(
        settings.pod_namespace, settings.pod_name, "Warning", CERTIFICATE_REFUSED, line, PROGRAM
    )
    if not_posted:
        log.warning("no %s Event: %s", CERTIFICATE_REFUSED, not_posted)
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
