"""Starting as the sidecar and the gateway both do: settings read from the environment (a bad one
ends the process naming its variable), then the ASGI app served with uvloop and httptools, no
access log (the metrics count every request; a log line each would cost more than the proxying),
no Server or Date header of uvicorn's own (the upstream's pass through), and a drain on SIGTERM."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, TypeVar

import uvicorn

from .contract import ConfigError, read_env

T = TypeVar("T")


def variables_help(settings: type) -> str:
    """The MODELSERVE_* variables of a settings dataclass, one per line, for --help."""
    return "\n".join(f"  {field.metadata['env']}" for field in dataclasses.fields(settings))


def settings_or_exit(settings: type[T], prog: str) -> T:
    """The settings from this process's environment; a bad one ends it with status 2, naming it."""
    try:
        return read_env(settings, os.environ)
    except ConfigError as exc:
        print(f"{prog}: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def serve(app: Any, host: str, port: int, drain_seconds: float, log_level: str = "info") -> None:
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
        log_level=log_level,
        # On SIGTERM uvicorn stops accepting, lets in-flight requests (streams) finish up to this
        # deadline, then cancels them and runs the lifespan shutdown.
        timeout_graceful_shutdown=drain_seconds,
    )
