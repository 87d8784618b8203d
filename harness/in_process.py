"""A proxy served in the test's own process, as the programs serve it (uvicorn in a thread, the direct
protocol's fast lane, connection bounds), so a test can read its state: the gateway in front of a
fixed table of models (FixedDiscovery) the tests change as the Kubernetes watches would, or any ASGI
app; HTTPS when given a certificate directory, followed as the programs follow it (http/tls.py).
Before it stops, the request pipeline's lifecycle rules are checked (harness/lifecycle.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from harness.lifecycle import assert_rules_kept, ledger_counts
from modelserve.contracts.gateway import OWN_ROUTES
from modelserve.gateway.app import Dispatcher, build_app
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.settings import GatewaySettings
from modelserve.http import serve
from modelserve.http.direct import DirectRoutes
from modelserve.http.limits import ConnectionLimits
from modelserve.http.pipeline import Ledger
from modelserve_sandbox.processes import wait_until


@contextmanager
def serving(
    app: Any,
    port: int,
    direct: DirectRoutes,
    ledger: Ledger,
    ready: Callable[[str], bool],
    what: str,
    limits: ConnectionLimits | None = None,
    tls: Path | None = None,
) -> Iterator[str]:
    """`app` listening on 127.0.0.1:`port` in a thread, once `ready(url)`; its base URL (https:// with
    the certificate in `tls`). Stopped on exit, after checking `ledger`'s lifecycle rules (read from
    the server's thread while it serves: plain integers, read whole)."""
    served = serve.certificate(tls, app) if tls is not None else None
    context = served.listener if served is not None else None
    limits = limits or ConnectionLimits()
    server = serve.Server(
        serve.config(app, "127.0.0.1", port, 5.0, direct, "warning", limits, context), app, limits.head_seconds
    )
    thread = threading.Thread(target=server.run, daemon=True)
    with served.following() if served is not None else contextlib.nullcontext():
        thread.start()
        url = f"{'http' if tls is None else 'https'}://127.0.0.1:{port}"
        try:
            wait_until(lambda: ready(url), 15, f"{what} to listen")
            yield url
            assert_rules_kept(lambda: ledger_counts(ledger), what)
        finally:
            server.should_exit = True
            thread.join(10)


@contextmanager
def serving_gateway(settings: GatewaySettings, discovery: FixedDiscovery) -> Iterator[str]:
    """The gateway listening on 127.0.0.1 at `settings.listen_port`, ready; its base URL. Stopped on exit."""
    with serving_gateway_app(settings, discovery) as (url, _):
        yield url


@contextmanager
def serving_gateway_app(settings: GatewaySettings, discovery: FixedDiscovery) -> Iterator[tuple[str, Dispatcher]]:
    """`serving_gateway`, and the app, whose state the test reads (from its own thread: plain values)."""
    app = build_app(settings, discovery)
    limits = ConnectionLimits.of(settings, OWN_ROUTES)
    with serving(
        app,
        settings.listen_port,
        app.direct_routes(),
        app.proxy.ledger,
        _ready,
        "the gateway",
        limits,
        settings.tls_dir,
    ) as url:
        yield url, app


def _ready(url: str) -> bool:
    try:
        # Whether it listens, whatever its certificate: the tests check that one themselves.
        return httpx.get(url + "/readyz", timeout=1, verify=False).status_code == 200
    except httpx.TransportError:
        return False
