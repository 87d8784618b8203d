"""Keys benchmark: one key's time to first byte while another key floods, and what the admission step
costs.

    .venv/bin/python -m bench.keys_bench

An engine with 4 slots (its own process: each stream holds a slot about 1 s, 20 SSE events 50 ms
apart, then usage; requests beyond 4 wait in the engine, first come first served, as llama.cpp's and
vLLM's queues do) behind two sidecars in the same run:

- "one queue": the sidecar as it was before keys had names (no engine bound: every request reaches
  the engine and waits in its queue);
- "fair share": MODELSERVE_ENGINE_CONCURRENCY=4 (a ModelServer's replicas.targetPerReplica), the
  requests beyond it waiting in the sidecar per key and served in turn.

Key team-b's time to first byte is measured alone, then while team-a keeps 32 streams open. Then the
admission step's CPU: small non-streaming requests through the sidecar, its CPU time per request with
keys that have no limits, against hashed keys with limits, and with the fair share too (8 requests at
once for 4 slots: half of them wait their turn, in a task). With --workers N, each sidecar runs N
workers sharing the pod's counts (sidecar/pod_counts.py): the same figures, across processes. Not
part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.sidecar_bench import Target
from modelserve.contracts.key_entries import hash_key
from modelserve_sandbox.processes import free_ports, start_process, stop_process, wait_until

SLOTS = 4
EVENTS = 20
GAP_SECONDS = 0.05
FLOOD = 32
KEY_A, KEY_B = "key-of-team-a", "key-of-team-b"
MODEL = "bench"
USAGE = {"prompt_tokens": 10, "completion_tokens": EVENTS, "total_tokens": 10 + EVENTS}


# --- the engine ----------------------------------------------------------------------------------


def serve_engine(port: int) -> None:
    slots = asyncio.Semaphore(SLOTS)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}], "usage": USAGE}
            return web.json_response(answer)
        async with slots:
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            for i in range(EVENTS):
                if i:
                    await asyncio.sleep(GAP_SECONDS)
                delta = {"choices": [{"index": 0, "delta": {"content": "tok"}}]}
                await response.write(b"data: " + json.dumps(delta).encode() + b"\n\n")
            await response.write(b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            return response

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# --- the sidecars --------------------------------------------------------------------------------


def start_sidecar(workdir: Path, name: str, engine_url: str, keys: dict[str, str], env: dict[str, str]) -> Target:
    (port,) = free_ports(1)
    secret = workdir / f"{name}-keys"
    secret.mkdir()
    for entry, text in keys.items():
        (secret / entry).write_text(text)
    process = start_process(
        name,
        [str(Path(sys.executable).parent / "modelserve-sidecar")],
        workdir,
        {
            **os.environ,
            "MODELSERVE_LISTEN_HOST": "127.0.0.1",
            "MODELSERVE_LISTEN_PORT": str(port),
            "MODELSERVE_UPSTREAM_URL": engine_url,
            "MODELSERVE_SERVED_MODEL": MODEL,
            "MODELSERVE_KEYS_DIR": str(secret),
            "MODELSERVE_ENGINE_METRICS": "false",
            **env,
        },
    )
    target = Target(name, f"http://127.0.0.1:{port}", process)
    wait_until(lambda: _ready(target.url), 30, f"{name} to be ready")
    return target


def _ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/readyz", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


# --- the load ------------------------------------------------------------------------------------


async def first_byte(session: aiohttp.ClientSession, url: str, key: str) -> float:
    """Seconds to the first body byte of one streamed chat (read to its end)."""
    start = time.perf_counter()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with session.post(url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}) as r:
        assert r.status == 200, r.status
        await r.content.readany()
        ttfb = time.perf_counter() - start
        await r.read()
    return ttfb


async def flood_and_measure(url: str, samples: int) -> tuple[list[float], list[float]]:
    """team-b's first bytes alone, then while team-a keeps FLOOD streams open."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        alone = [await first_byte(session, url, KEY_B) for _ in range(samples)]
        stop = asyncio.Event()

        async def keep_one_open() -> None:
            while not stop.is_set():
                await first_byte(session, url, KEY_A)

        flood = [asyncio.create_task(keep_one_open()) for _ in range(FLOOD)]
        await asyncio.sleep(2 * EVENTS * GAP_SECONDS)  # the engine's queue fills
        loaded = [await first_byte(session, url, KEY_B) for _ in range(samples)]
        stop.set()
        await asyncio.gather(*flood)
    return alone, loaded


async def small_requests(url: str, count: int, concurrency: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {KEY_B}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker(n: int) -> None:
            for _ in range(n):
                async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200, r.status
                    await r.read()

        await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))


def cpu_per_request(target: Target, count: int) -> float:
    asyncio.run(small_requests(target.url, 200, 8))  # warm
    before = target.cpu_seconds()
    asyncio.run(small_requests(target.url, count, 8))
    return (target.cpu_seconds() - before) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5, help="team-b's streams measured, alone and loaded")
    parser.add_argument("--requests", type=int, default=4000, help="small requests for the admission's CPU")
    parser.add_argument("--workers", type=int, default=1, help="each sidecar's workers (MODELSERVE_WORKERS)")
    args = parser.parse_args()
    workers = {"MODELSERVE_WORKERS": str(args.workers)}
    plain = {"team-a": KEY_A + "\n", "team-b": KEY_B + "\n"}
    limited = {
        name: json.dumps({"keys": [hash_key(key)], "maxInFlight": 1000, "requestsPerMinute": 10**6})
        for name, key in (("team-a", KEY_A), ("team-b", KEY_B))
    }
    with tempfile.TemporaryDirectory(prefix="keys-bench-") as tmp:
        work = Path(tmp)
        (engine_port,) = free_ports(1)
        engine = start_process(
            "engine",
            [sys.executable, "-c", f"from bench.keys_bench import serve_engine; serve_engine({engine_port})"],
            work,
        )
        engine_url = f"http://127.0.0.1:{engine_port}"
        targets: list[Target] = []
        try:
            wait_until(lambda: _ready_engine(engine_url), 30, "the engine")
            one_queue = start_sidecar(work, "one-queue", engine_url, plain, workers)
            fair = start_sidecar(
                work, "fair-share", engine_url, limited, {**workers, "MODELSERVE_ENGINE_CONCURRENCY": str(SLOTS)}
            )
            limits_only = start_sidecar(work, "limits-only", engine_url, limited, workers)
            targets = [one_queue, fair, limits_only]
            print(f"engine: {SLOTS} slots, streams of ~{EVENTS * GAP_SECONDS:.1f} s; team-a keeps {FLOOD} open")
            print(f"each sidecar: {args.workers} worker(s)")
            print(f"{'sidecar':12} {'b alone p50':>12} {'b alone max':>12} {'b flooded p50':>14} {'b flooded max':>14}")
            for target in (one_queue, fair):
                alone, loaded = asyncio.run(flood_and_measure(target.url, args.samples))
                print(
                    f"{target.name:12} {statistics.median(alone):11.2f}s {max(alone):11.2f}s "
                    f"{statistics.median(loaded):13.2f}s {max(loaded):13.2f}s"
                )
            print(f"\nadmission CPU per small request ({args.requests} at concurrency 8):")
            print(f"  keys without limits, no engine bound    {cpu_per_request(one_queue, args.requests):7.1f} us")
            print(f"  keys with limits (hashed), no bound     {cpu_per_request(limits_only, args.requests):7.1f} us")
            print(f"  keys with limits, fair share at {SLOTS}       {cpu_per_request(fair, args.requests):7.1f} us")
        finally:
            for target in targets:
                assert target.process is not None
                stop_process(target.process)
            stop_process(engine)


def _ready_engine(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=1):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
