"""The gateway served in the test's own process, as modelserve-gateway serves it (uvicorn, the OpenAI
routes on the protocol's fast lane, the connection bounds its settings give), in front of a fixed
table of models (FixedDiscovery) the tests change as the Kubernetes watches would. Before it stops, its
request pipeline's lifecycle rules are checked (lifecycle.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from harness.lifecycle import assert_rules_kept, ledger_counts
from modelserve.gateway.app import build_app
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.settings import GatewaySettings
from modelserve.http import serve
from modelserve.http.limits import ConnectionLimits
from modelserve_sandbox.processes import wait_until


@contextmanager
def serving_gateway(settings: GatewaySettings, discovery: FixedDiscovery) -> Iterator[str]:
    """The gateway listening on 127.0.0.1 at `settings.listen_port`, ready; its base URL. Stopped on exit."""
    app = build_app(settings, discovery)
    limits = ConnectionLimits.of(settings)
    port = settings.listen_port
    server = uvicorn.Server(serve.config(app, "127.0.0.1", port, 5.0, app.direct_routes(), "warning", limits))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 15, "the gateway to listen")
        yield url
        # Read from the gateway's thread while it serves: plain integers, read whole.
        assert_rules_kept(lambda: ledger_counts(app.proxy.ledger), "the gateway")
    finally:
        server.should_exit = True
        thread.join(10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
