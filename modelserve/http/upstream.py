"""The one aiohttp client session per process that talks upstream: the sidecar's to its engine, the
gateway's to the replicas' sidecars."""

from __future__ import annotations

import aiohttp

# Below the engines' own keep-alive (uvicorn's default 5 s, which vLLM keeps), so the sidecar never
# reuses a connection the engine is closing at that moment (it would look like a dead engine).
KEEPALIVE_SECONDS = 3.0
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
