"""Both hops benchmark: what a request pays for crossing the gateway and the sidecar, against two
nginx hops in the same places.

    .venv/bin/python -m bench.two_hops_bench             # one run, prints its table
    .venv/bin/python -m bench.two_hops_bench --quick     # 1 s per level and target instead of 3
    .venv/bin/python -m bench.two_hops_bench --runs 3    # three runs, then the medians

The same fast fake engine, load generator and table as bench/sidecar_bench.py (imported from it).
Three ways to the engine:
  direct   client -> engine (the baseline: the "+" columns are the others minus it)
  gw+sc    client -> modelserve-gateway -> modelserve-sidecar (private: it checks the key) -> engine
  nginx    client -> nginx -> nginx (the same Key check, as sidecar_bench's) -> engine
Each of the four proxies is its own process pinned to the same core (taskset), one nginx worker
each; the engine and the load float. "cpu ms/req" is the CPU time of both proxies of a path per
request. Levels: concurrency 1, 16, 64 non-streaming; 1, 64 streaming (128 chunks, no gap). Not part
of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import gateway_bench, sidecar_bench
from bench.sidecar_bench import MODEL, PROXY_CPU, Target, ensure_nginx, load, run_and_report, start_nginx, wait_http
from modelserve.gateway.settings import LEAST_IN_FLIGHT
from modelserve_sandbox.processes import free_ports, start_process, stop_process, tail, wait_until

LEVELS = gateway_bench.LEVELS
OURS = "gw+sc"


@dataclass
class Hops(Target):
    """A path through two proxy processes: its CPU is both of theirs."""

    second: subprocess.Popen | None = None

    def cpu_seconds(self) -> float:
        return super().cpu_seconds() + Target(self.name, self.url, self.second).cpu_seconds()


def ratios(table: sidecar_bench.Table) -> dict[str, float]:
    return sidecar_bench.target_ratios(table, OURS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 s per level and target instead of 3")
    args = parser.parse_args()
    seconds = 1.0 if args.quick else 3.0
    sidecar_bench.LEVELS = LEVELS  # run_once measures these

    nginx = ensure_nginx()
    workdir = Path(tempfile.mkdtemp(prefix="two-hops-bench-"))
    engine_port, sidecar_port, gateway_port, back_port, front_port = free_ports(5)
    processes: list[subprocess.Popen] = []
    try:
        engine_argv = [sys.executable, sidecar_bench.__file__, "--serve-engine", str(engine_port)]
        processes.append(start_process("engine", engine_argv, workdir))
        engine_url = f"http://127.0.0.1:{engine_port}"
        wait_http(engine_url + "/health", "the fake engine", workdir / "engine.log")

        sidecar = sidecar_bench.start_sidecar(workdir, sidecar_port, engine_url)
        processes.append(sidecar)
        wait_http(f"http://127.0.0.1:{sidecar_port}/readyz", "the sidecar to be ready", workdir / "sidecar.log")
        gateway = gateway_bench.start_gateway(
            workdir, gateway_port, MODEL, [f"127.0.0.1:{sidecar_port}"], LEAST_IN_FLIGHT, PROXY_CPU
        )
        processes.append(gateway)

        # The sidecar's place: nginx with the key check; the gateway's: nginx passing Authorization on.
        back_conf = sidecar_bench.NGINX_CONF.format(
            dir=workdir / "nginx-back", key=sidecar_bench.KEY, engine_port=engine_port, port=back_port
        )
        back = start_nginx(nginx, workdir, back_conf, "nginx-back")
        processes.append(back)
        front_conf = gateway_bench.NGINX_CONF.format(
            dir=workdir / "nginx-front", key=sidecar_bench.KEY, engine_port=back_port, port=front_port
        )
        front = start_nginx(nginx, workdir, front_conf, "nginx-front")
        processes.append(front)
        nginx_url = f"http://127.0.0.1:{front_port}"
        wait_until(
            lambda: asyncio.run(load(nginx_url, 1, 0.05, False, 0)).requests > 0,
            30,
            "both nginx",
            on_timeout=lambda: "\n" + tail(workdir / "nginx-front" / "nginx-error.log"),
        )

        targets = [
            Target("direct", engine_url),
            Hops(OURS, f"http://127.0.0.1:{gateway_port}", gateway, sidecar),
            Hops("nginx", nginx_url, front, back),
        ]
        run_and_report(targets, seconds, args.runs, ratios, ", both hops")
    finally:
        for process in reversed(processes):
            stop_process(process)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
