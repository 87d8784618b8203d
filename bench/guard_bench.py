"""Rollback guard benchmark: how fast a version's traffic guard (spec.traffic.guard) stops sending a
version requests once it turns slow or failing, in requests and seconds.

    .venv/bin/python -m bench.guard_bench

The real gateway (in this process, on uvicorn) in front of two real sidecar processes, each before
its own replay engine (vLLM's recorded answers) that answers after a fixed stall: the stable
version 50 ms, the guarded one 50 ms until the switch, then 500 ms (slow) or no engine at all
(failing). Four clients send requests with distinct conversations. Printed per guard window and
weight: trips while both were healthy (noise alone: false ones), then the guarded version's answers
after the switch until it tripped, the requests the service took meanwhile, the seconds from its
first bad answer to the trip, and the new requests that reached it afterwards (there must be
none). Not part of `make test`.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from harness.in_process import serving_gateway
from harness.sidecar import ReplayEngine, Sidecar, launch_sidecar, start_replay, stop_sidecar, wait_ready
from modelserve.gateway.directory import Model
from modelserve.gateway.discovery import FixedDiscovery
from modelserve.gateway.routing import Ring
from modelserve.gateway.settings import GatewaySettings
from modelserve.gateway.versions import Guard
from modelserve_sandbox.processes import free_ports, wait_until

FAST, SLOW = 0.05, 0.5
CLIENTS = 4
CASES = [("slow", 20, 10), ("slow", 50, 10), ("slow", 100, 10), ("slow", 50, 50), ("failing", 50, 10)]
conversations = itertools.count()


def version(name: str, replica: str, weight: int, guard: Guard | None, reset: str) -> Model:
    return Model(
        "bench",
        name,
        True,
        replicas=(replica,),
        pods={replica: name},
        ring=Ring([replica]),
        served_as="bot",
        weight=weight,
        guard=guard,
        guard_reset=reset,
    )


def send(base: str, count: int) -> None:
    def one(_: int) -> None:
        messages = [{"role": "user", "content": f"conversation {next(conversations)}"}]
        httpx.post(f"{base}/v1/chat/completions", json={"model": "bot", "messages": messages}, timeout=30)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one, range(count)))


def tripped(base: str) -> bool:
    return bool(httpx.get(f"{base}/guards", timeout=10).json()["guards"])


def run_case(
    base: str,
    discovery: FixedDiscovery,
    engines: dict[str, ReplayEngine],
    replicas: dict[str, str],
    case: tuple[str, int, int],
) -> str:
    kind, window, weight = case
    reset = f"{kind}-{window}-{weight}"
    guard = Guard(window=window, max_error_rate=0.1, max_ttft_ratio=2.0)
    engines["v2"].stall = FAST
    discovery.update(version("v1", replicas["v1"], 100 - weight, None, reset))
    discovery.update(version("v2", replicas["v2"], weight, guard, reset))
    # Healthy first: enough requests for two full windows of the guarded version. A trip now is a
    # false one (noise alone), counted and reset.
    false_trips = 0
    for _ in range(max(1, window * 2 * 100 // weight // 40)):
        send(base, 40)
        if tripped(base):
            false_trips += 1
            reset += "+"
            discovery.update(version("v2", replicas["v2"], weight, guard, reset))
            wait_until(lambda: not tripped(base), 10, "the reset")
    seen = len(engines["v2"].received)
    if kind == "slow":
        engines["v2"].stall = SLOW
    else:
        discovery.update(version("v2", "127.0.0.1:9", weight, guard, reset))  # refused: every answer fails
    sent, start = 0, time.monotonic()
    first_bad: float | None = None
    while not tripped(base) and sent < 2000:
        send(base, CLIENTS)
        sent += CLIENTS
        if first_bad is None and (kind == "failing" or len(engines["v2"].received) > seen):
            first_bad = time.monotonic()
    if not tripped(base):
        return f"| {kind} | {window} | {weight}% | {false_trips} | not tripped after {sent} requests | | |"
    reaction = time.monotonic() - (first_bad or start)
    bad_answers = len(engines["v2"].received) - seen if kind == "slow" else "-"
    after = len(engines["v2"].received)
    send(base, 200)
    leaked = len(engines["v2"].received) - after
    discovery.update(version("v2", replicas["v2"], weight, guard, reset + "-done"))
    wait_until(lambda: not tripped(base), 10, "the reset")
    return f"| {kind} | {window} | {weight}% | {false_trips} | {bad_answers} | {sent} | {reaction:.2f} s | {leaked} |"


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="guard-bench-"))
    engines = {"v1": start_replay(), "v2": start_replay()}
    engines["v1"].stall = FAST
    sidecars: list[Sidecar] = []
    try:
        for name in ("v1", "v2"):
            env = {"MODELSERVE_AUTH": "public", "MODELSERVE_UPSTREAM_MODEL": "tiny"}
            sidecars.append(launch_sidecar(work / "logs", engines[name].url, name, env))
        for sidecar in sidecars:
            wait_ready(sidecar)
        replicas = {name: s.url.removeprefix("http://") for name, s in zip(("v1", "v2"), sidecars, strict=True)}
        discovery = FixedDiscovery(
            [version("v1", replicas["v1"], 90, None, ""), version("v2", replicas["v2"], 10, None, "")]
        )
        (port,) = free_ports(1)
        settings = GatewaySettings.from_env({"MODELSERVE_GATEWAY_LISTEN_PORT": str(port)})
        with serving_gateway(settings, discovery) as base:
            print(
                f"stable answers after {FAST * 1000:.0f} ms; the guarded version after {SLOW * 1000:.0f} ms once slow,"
            )
            print("or refused once failing; guard: maxTimeToFirstTokenRatio 2, maxErrorRate 0.1\n")
            print(
                "| turned | window | weight | false trips while healthy | its bad answers to trip "
                "| requests sent meanwhile | first bad answer -> trip | requests to it after |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for case in CASES:
                print(run_case(base, discovery, engines, replicas, case), flush=True)
    finally:
        for sidecar in sidecars:
            stop_sidecar(sidecar)
        for engine in engines.values():
            engine.stop()


if __name__ == "__main__":
    main()
