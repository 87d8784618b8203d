"""The upstream clients of a process: the pool the proxied requests go through (upstream_pool.py), and
one aiohttp session for everything else (the sidecar's probes and scrapes of its engine, the
gateway's model lists)."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from .upstream_pool import KEEPALIVE_SECONDS, Pool

# aiohttp adds these unless told not to; a transparent proxy sends only what the client sent.
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# A scrape of the engine's metrics must answer fast or is left out of the sidecar's /metrics.
METRICS_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


def open_session(max_connections: int, timeout_seconds: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=max_connections,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_SECONDS,
    )
    return aiohttp.ClientSession(
        connector=connector,
        # A timeout is the engine staying silent this long (like nginx's proxy_read_timeout): a long
        # generation that keeps streaming is healthy and must not be cut.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout_seconds, sock_read=timeout_seconds),
        auto_decompress=False,  # bytes pass through as the engine encoded them
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=SKIP_AUTO_HEADERS,
    )


def open_pool(
    max_connections: int,
    timeout_seconds: float,
    tls: ssl.SSLContext | None = None,
    server_names: Mapping[str, str] | None = None,
) -> Pool:
    # A timeout is the upstream staying silent this long (like nginx's proxy_read_timeout): a long
    # generation that keeps streaming is healthy and must not be cut.
    return Pool(max_connections, timeout_seconds, timeout_seconds, tls, server_names)


def trusting(ca_file: Path | None) -> ssl.SSLContext:
    """A client context that checks servers' certificates against `ca_file` (PEM; None: the
    system's trust store) and their names, TLS 1.2 and later."""
    context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
