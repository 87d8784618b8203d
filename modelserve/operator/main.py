"""`modelserve-operator`: run the operator (kopf, standalone: no kopf peering; with
MODELSERVE_LEADER_ELECTION_LEASE set, replicas elect a leader on that Lease)."""

from __future__ import annotations

import argparse
import logging
import threading

import kopf

from modelserve.contracts.env import settings_or_exit, variables_help
from modelserve.contracts.operator_settings import Settings

from . import handlers  # noqa: F401  (registers the handlers)


def operator_memo(settings: Settings, namespaces: tuple[str, ...] = ()) -> kopf.Memo:
    """What kopf hands the handlers (handlers.start reads these and adds what it starts)."""
    return kopf.Memo(namespaces=namespaces, settings=settings)


def run(
    settings: Settings,
    namespaces: tuple[str, ...] = (),
    liveness_endpoint: str | None = None,
    verbose: bool = False,
    stop_flag: threading.Event | None = None,
) -> None:
    """Run until SIGINT/SIGTERM or until `stop_flag` is set (to run it in a thread)."""
    kopf.configure(verbose=verbose)
    if not verbose:
        # Every watched event would log "Handler succeeded" and every probe an access line;
        # the reconciler logs what it changes.
        for noisy in ("kopf.objects", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness_endpoint,
        memo=operator_memo(settings, namespaces),
        stop_flag=stop_flag,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="modelserve-operator",
        description=f"{__doc__}\nSettings come from the environment (the chart sets them):\n{variables_help(Settings)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace only (repeatable; exact names; default: all namespaces)",
    )
    parser.add_argument("--liveness", metavar="URL", help="serve a liveness probe, e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    # Read before kopf starts (kopf sets up the logging): a bad variable ends the process, named.
    run(settings_or_exit(Settings, "modelserve-operator"), tuple(args.namespace), args.liveness, args.verbose)
