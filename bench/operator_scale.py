"""The operator at scale in the sandbox: N ModelServers on KWOK GPU nodes sized to hold them.

For each N (default 100 and 1000) it starts a control plane of its own and the operator, applies N
ModelServers at once and prints:
  - time from the apply to all N Deployments, and to all N ModelServers Ready;
  - status lag: per ModelServer, its Ready condition's transition time minus its last pod's
    (p50 and p99; the API server keeps whole seconds);
  - the operator's CPU seconds from the apply to all Ready, and its peak RSS (VmHWM);
  - the operator's API requests per minute at idle (watches left out), from the API server's audit
    log of the operator's own user, and what they were;
  - apply -> Deployment for one more ModelServer with the N present;
  - with `--churn-seconds S`: S seconds of churn (every 10 s, 5% of the ModelServers edited, which
    rolls their pods, and 1% deleted and applied again), the operator's RSS before, at most, and after.

`--tracemalloc` runs the operator under tracemalloc and prints the top
allocation sites at each N once all are Ready (tracing slows it: time and CPU figures of such a run are not
comparable). `--operator-src DIR` runs the operator from another checkout (e.g. a `git worktree` of the
previous commit) with this script and this sandbox, for a before/after in the same session:

    .venv/bin/python -m bench.operator_scale [--sizes 100 1000] [--idle-seconds 60] [--operator-src DIR]
        [--churn-seconds 0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from modelserve.contracts.names import API_VERSION, KIND
from modelserve.kube.apply import Kube
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.operator_process import running_operator
from modelserve_sandbox.processes import wait_until

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "default"
SELECTOR = "serving.modelserve.dev/modelserver"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PODS_PER_NODE = 300
CHURN_ROUND_SECONDS = 10


def model_server(name: str) -> dict[str, Any]:
    spec = {"model": "LiquidAI/LFM2-350M", "maxModelLen": 2048}  # private: a key Secret each
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def operator_requests(cluster: Cluster, seconds: float) -> tuple[float, Counter[str]]:
    """The operator's requests over the next `seconds`, per minute, and what they were (verb and
    resource), from the audit log of its user; watches left out (they are one long request)."""
    started = datetime.now(UTC)
    time.sleep(seconds)
    ended = datetime.now(UTC)
    seen: Counter[str] = Counter()
    for event in cluster.operator_requests():
        if event["verb"] != "watch" and started < datetime.fromisoformat(event["stageTimestamp"]) <= ended:
            seen[f"{event['verb']} {event.get('objectRef', {}).get('resource', '?')}"] += 1
    return seen.total() * 60 / seconds, seen


def churn(cluster: Cluster, size: int, pid: int, seconds: float) -> tuple[float, float, float]:
    """Edit and re-create ModelServers for `seconds`; the operator's RSS (MiB) before, at most, after."""
    before = peak = rss_mib(pid)
    deadline = time.monotonic() + seconds
    round_ = 0
    while time.monotonic() < deadline:
        round_ += 1
        edited = [model_server(f"ms-{i:05d}") for i in range(round_ % 20, size, 20)]
        for ms in edited:
            ms["spec"]["maxModelLen"] = 2048 + 1024 * (round_ % 2)
        cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": edited}))
        gone = [f"ms-{i:05d}" for i in range(round_ % 100, size, 100)]
        cluster.kubectl("delete", "modelserver", *gone, "--wait=false")
        cluster.kubectl("wait", "--for=delete", *(f"modelserver/{name}" for name in gone), "--timeout=120s")
        again = [model_server(name) for name in gone]
        cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": again}))
        time.sleep(CHURN_ROUND_SECONDS)
        peak = max(peak, rss_mib(pid))
    time.sleep(30)  # the last rollouts settle
    return before, peak, rss_mib(pid)


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _ready_since(conditions: list[dict[str, Any]]) -> float | None:
    for condition in conditions:
        if condition["type"] == "Ready" and condition["status"] == "True":
            return _time(condition["lastTransitionTime"])
    return None


def status_lags(kube: Kube) -> list[float]:
    """Per ModelServer: Ready's transition time minus the time its last pod turned Ready."""
    pods_ready: dict[str, float] = {}
    for pod in kube.list("v1", "Pod", NAMESPACE, SELECTOR):
        since = _ready_since(pod.get("status", {}).get("conditions", []))
        name = pod["metadata"]["labels"][SELECTOR]
        if since is not None:
            pods_ready[name] = max(pods_ready.get(name, since), since)
    lags = []
    for ms in kube.list(API_VERSION, KIND, NAMESPACE):
        since = _ready_since(ms.get("status", {}).get("conditions", []))
        name = ms["metadata"]["name"]
        if since is not None and name in pods_ready:
            lags.append(since - pods_ready[name])
    return lags


def count_settled(kube: Kube) -> int:
    """ModelServers whose rollout is complete (phase Ready: the Deployment's own status caught up)."""
    return sum(ms.get("status", {}).get("phase") == "Ready" for ms in kube.list(API_VERSION, KIND, NAMESPACE))


def count_ready(kube: Kube) -> int:
    return sum(
        _ready_since(ms.get("status", {}).get("conditions", [])) is not None
        for ms in kube.list(API_VERSION, KIND, NAMESPACE)
    )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else float("nan")


def measure(
    size: int, idle_seconds: float, operator_src: Path | None, timeout: float, traced: bool, churn_seconds: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        workdir = Path(tmp)
        # A KWOK node's 32 CPUs hold 320 sidecars (100m each): as many nodes as that takes.
        nodes = size // PODS_PER_NODE + 1
        with Cluster(
            workdir, nodes, PODS_PER_NODE, cpu_nodes=0, real_node=False, pods_per_node=PODS_PER_NODE
        ) as cluster:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "modelserver.yaml"))
            cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            kube = Kube(cluster.api_client())
            env = dict(cluster.operator_env)
            if operator_src:
                # A checkout of the one-package layout: modelserve/ at its root.
                env["PYTHONPATH"] = os.pathsep.join([str(operator_src), str(operator_src / "sandbox")])
            manifests = workdir / "modelservers.json"
            items = [model_server(f"ms-{i:05d}") for i in range(size)]
            manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
            program = None
            if traced:
                env["MODELSERVE_TRACEMALLOC_OUT"] = str(workdir / "tracemalloc.txt")
                program = [sys.executable, str(REPO / "bench" / "traced_operator.py")]
            with running_operator(env, workdir / "operator-logs", program=program) as (operator, _):
                cpu_before = cpu_seconds(operator.pid)
                started = time.monotonic()
                cluster.kubectl("apply", "--server-side", "-f", str(manifests), timeout=timeout)
                wait_until(
                    lambda: len(kube.list("apps/v1", "Deployment", NAMESPACE, SELECTOR)) >= size,
                    timeout,
                    f"{size} Deployments",
                    interval=1.0,
                )
                to_deployments = time.monotonic() - started
                wait_until(lambda: count_ready(kube) >= size, timeout, f"{size} ModelServers Ready", interval=1.0)
                to_ready = time.monotonic() - started
                cpu = cpu_seconds(operator.pid) - cpu_before
                if traced:
                    operator.send_signal(signal.SIGUSR1)
                    out = workdir / "tracemalloc.txt"
                    wait_until(out.exists, 900, "the tracemalloc dump", interval=1.0)  # slow on a large heap
                    print(f"operator memory at {size} ModelServers, all Ready:\n{out.read_text()}", flush=True)
                lags = status_lags(kube)
                one = time.monotonic()
                cluster.kubectl("apply", "-f", "-", input=json.dumps(model_server("one-more")))
                wait_until(
                    lambda: kube.get("apps/v1", "Deployment", NAMESPACE, "one-more") is not None,
                    timeout,
                    "one more Deployment",
                    interval=0.02,
                )
                one_more = time.monotonic() - one
                # Idle means nothing left to report: every Deployment's status has caught up.
                wait_until(lambda: count_settled(kube) >= size + 1, timeout, "all rollouts complete", interval=1.0)
                time.sleep(10)  # let the last status writes and their echoes pass
                idle, idle_kinds = operator_requests(cluster, idle_seconds)
                rss = peak_rss_mib(operator.pid)
                churned = churn(cluster, size, operator.pid, churn_seconds) if churn_seconds else (float("nan"),) * 3
    return {
        "to_deployments": to_deployments,
        "to_ready": to_ready,
        "lag_p50": percentile(lags, 0.5),
        "lag_p99": percentile(lags, 0.99),
        "cpu": cpu,
        "rss": rss,
        "idle_operator": idle,
        "idle_kinds": ", ".join(f"{kind} {count}" for kind, count in idle_kinds.most_common(6)) or "none",
        "one_more": one_more,
        "churn_rss_before": churned[0],
        "churn_rss_peak": churned[1],
        "churn_rss_after": churned[2],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--operator-src", type=Path, help="a checkout whose operator to run instead of this one")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds each phase may take")
    parser.add_argument("--tracemalloc", action="store_true", help="print where the operator's memory goes")
    parser.add_argument("--churn-seconds", type=float, default=0.0, help="then churn this long, watching RSS")
    args = parser.parse_args()
    rows = {
        size: measure(size, args.idle_seconds, args.operator_src, args.timeout, args.tracemalloc, args.churn_seconds)
        for size in args.sizes
    }
    columns = [
        ("apply -> all Deployments (s)", "to_deployments", "{:.1f}"),
        ("apply -> all Ready (s)", "to_ready", "{:.1f}"),
        ("status lag p50 (s)", "lag_p50", "{:.0f}"),
        ("status lag p99 (s)", "lag_p99", "{:.0f}"),
        ("operator CPU, apply -> Ready (s)", "cpu", "{:.1f}"),
        ("operator peak RSS (MiB)", "rss", "{:.0f}"),
        ("idle: operator's API requests/min", "idle_operator", "{:.0f}"),
        ("one more: apply -> Deployment (s)", "one_more", "{:.2f}"),
    ]
    if args.churn_seconds:
        columns += [
            (f"churn {args.churn_seconds:g} s: RSS before (MiB)", "churn_rss_before", "{:.0f}"),
            ("churn: RSS at most (MiB)", "churn_rss_peak", "{:.0f}"),
            ("churn: RSS after (MiB)", "churn_rss_after", "{:.0f}"),
        ]
    source = f"operator from {args.operator_src}" if args.operator_src else "operator from this checkout"
    print(f"{source}; idle window {args.idle_seconds:g} s")
    print(f"{'ModelServers':<38}" + "".join(f"{size:>10}" for size in args.sizes))
    for label, key, fmt in columns:
        print(f"{label:<38}" + "".join(f"{fmt.format(rows[size][key]):>10}" for size in args.sizes))
    for size in args.sizes:
        print(f"idle requests at {size} over {args.idle_seconds:g} s: {rows[size]['idle_kinds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
