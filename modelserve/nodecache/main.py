"""The node cache's two commands: `modelserve-nodecache` (the agent, a DaemonSet) and `modelserve-fetch`
(a model pod's init container)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import aiohttp
from aiohttp import web

from modelserve.contracts.env import ConfigError, settings_or_exit, variables_help
from modelserve.contracts.nodecache import RESULT_LIMIT, FetchSettings

from .agent import Agent, build_app, sync_forever
from .fetch import fetch
from .hub import RAW_BYTES
from .node import NodeApi
from .settings import Settings
from .store import Store

log = logging.getLogger("modelserve.nodecache")


def agent_main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="modelserve-nodecache",
        description="A node's model cache: the hub's download routes for the pods of this node, each "
        "model's bytes fetched once.\nEvery setting comes from the environment (the chart sets them):\n"
        + variables_help(Settings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_or_exit(Settings, "modelserve-nodecache")
    asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> None:
    store = Store(settings.root, settings.size_limit).open()
    changed = asyncio.Event()
    async with aiohttp.ClientSession(headers=RAW_BYTES, auto_decompress=False) as session:
        node = (
            NodeApi.from_service_account(settings.node_name, session)
            if settings.node_name and NodeApi.in_cluster()
            else None
        )

        async def in_use() -> set[str] | None:
            return await node.models_in_use() if node else set()

        agent = Agent(
            store,
            settings.hub,
            session,
            in_use,
            changed.set,
            send_seconds=settings.send_timeout_seconds,
            hub_answer_seconds=settings.hub_answer_timeout_seconds,
        )
        runner = web.AppRunner(build_app(agent), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, settings.listen_host, settings.listen_port).start()
        log.info(
            "serving the hub %s from %s (%d of %d bytes held, %d models) on %s:%d; node %s",
            settings.hub, settings.root, store.used, store.limit, len(store.held()),
            settings.listen_host, settings.listen_port, settings.node_name or "(none: no labels)",
        )  # fmt: skip
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (15, 2):
            loop.add_signal_handler(signum, stop.set)
        sync = loop.create_task(sync_forever(agent, node.label, changed, settings.sync_seconds)) if node else None
        await stop.wait()
        if sync:
            sync.cancel()
        await runner.cleanup()


def fetch_main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="modelserve-fetch",
        description="Put a model (and its adapters) into the pod's hub cache, through the node's cache when "
        "there is one.\nEvery setting comes from the environment (the operator sets them), the token from "
        "HF_TOKEN:\n" + variables_help(FetchSettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = FetchSettings.from_env(dict(os.environ))
    except ConfigError as error:
        print(f"modelserve-fetch: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    result = asyncio.run(fetch(settings, os.environ.get("HF_TOKEN", "")))
    text = result.to_json()
    try:
        settings.result_path.write_text(text[:RESULT_LIMIT])
    except OSError as error:
        log.warning("could not write the result to %s: %r", settings.result_path, error)
    print(text, flush=True)
    if result.error:
        log.error("%s", result.error)
        raise SystemExit(1)
