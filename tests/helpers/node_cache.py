"""The node cache's real processes for tests: the sandbox's hub mirror (in this process, counting its
bytes), `modelserve-nodecache` on a store of its own, and `modelserve-fetch` runs against them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from modelserve.contracts.nodecache import FetchResult
from modelserve_sandbox.hub_mirror import HubMirror
from modelserve_sandbox.processes import free_ports, start_process, stop_process, tail, wait_until


def script(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@dataclass
class Agent:
    process: subprocess.Popen
    url: str
    root: Path
    log: Path

    def metrics(self) -> dict[str, float]:
        """The agent's own series, by name with labels."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("modelserve_nodecache_")
        }


@contextmanager
def running_agent(hub: str, root: Path, logs: Path, size_limit: str = "1Gi", **settings: str) -> Iterator[Agent]:
    """The agent on `root`, before `hub`; `settings`: more of its MODELSERVE_NODECACHE_* by lower-case name."""
    (port,) = free_ports(1)
    env = {
        **os.environ,
        "MODELSERVE_NODECACHE_ROOT": str(root),
        "MODELSERVE_NODECACHE_PORT": str(port),
        "MODELSERVE_NODECACHE_LISTEN_HOST": "127.0.0.1",
        "MODELSERVE_NODECACHE_HUB": hub,
        "MODELSERVE_NODECACHE_SIZE_LIMIT": size_limit,
        **{f"MODELSERVE_NODECACHE_{name.upper()}": value for name, value in settings.items()},
    }
    process = start_process("modelserve-nodecache", [script("modelserve-nodecache")], logs, env=env)
    agent = Agent(process, f"http://127.0.0.1:{port}", root, logs / "modelserve-nodecache.log")
    try:
        wait_until(
            lambda: process.poll() is not None or _answers(f"{agent.url}/healthz"),
            30,
            "the node agent",
            on_timeout=lambda: "\n" + tail(agent.log),
        )
        assert process.poll() is None, tail(agent.log)
        yield agent
    finally:
        stop_process(process)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Fetched:
    returncode: int
    result: FetchResult | None
    output: str
    cache_dir: Path


def start_fetch(
    model: str, cache_dir: Path, hub: str, node_cache: str = "", token: str = "", **settings: str
) -> tuple[subprocess.Popen, Path]:
    """`modelserve-fetch` started as the operator renders it (MODELSERVE_FETCH_*), its result file beside."""
    result = cache_dir.with_name(cache_dir.name + ".result")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MODELSERVE_", "HF_"))},
        "MODELSERVE_FETCH_MODEL": model,
        "MODELSERVE_FETCH_HUB": hub,
        "MODELSERVE_FETCH_CACHE_DIR": str(cache_dir),
        "MODELSERVE_FETCH_RESULT": str(result),
        **({"MODELSERVE_FETCH_NODE_CACHE": node_cache} if node_cache else {}),
        **({"HF_TOKEN": token} if token else {}),
        **{f"MODELSERVE_FETCH_{name.upper()}": value for name, value in settings.items()},
    }
    process = subprocess.Popen(
        [script("modelserve-fetch")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return process, result


def finish(process: subprocess.Popen, result: Path, cache_dir: Path, timeout: float = 120) -> Fetched:
    output, _ = process.communicate(timeout=timeout)
    parsed = FetchResult.parse(result.read_text()) if result.is_file() else None
    return Fetched(process.returncode, parsed, output, cache_dir)


def run_fetch(model: str, cache_dir: Path, hub: str, node_cache: str = "", token: str = "", **settings: str) -> Fetched:
    process, result = start_fetch(model, cache_dir, hub, node_cache, token, **settings)
    return finish(process, result, cache_dir)


def hub_file_bytes(hub: HubMirror) -> int:
    """Bytes of model files the hub has sent so far, to every client."""
    return sum(client["files"] for client in hub.bytes_by_client().values())


def hub_requests(hub: HubMirror) -> int:
    """Requests the hub has answered so far (files and API), from every client."""
    return sum(client["requests"] for client in hub.bytes_by_client().values())
