"""Serving as the sidecar and the gateway both do: the ASGI app served with uvloop and httptools, no
access log (the metrics count every request; a log line each would cost more than the proxying),
no Server or Date header of uvicorn's own (the upstream's pass through), and a drain on SIGTERM."""

from __future__ import annotations

import gc
from typing import Any

import uvicorn


def serve(app: Any, host: str, port: int, drain_seconds: float, log_level: str = "info") -> None:
    # Everything loaded so far (the frameworks, the app) lives as long as the process: out of the
    # collector's sight, a full collection no longer walks it while requests allocate.
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
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
    )
