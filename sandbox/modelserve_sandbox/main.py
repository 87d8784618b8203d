"""`modelserve-sandbox`: the local sandbox, end to end, in one command.

Starts the real control plane (KWOK plays the GPU nodes, a real node runs CPU pods), installs
the ModelServer CRD, runs the operator and the gateway (host processes), applies the examples,
prints `kubectl get ms` once the examples have settled, and keeps everything running until
interrupted; then stops every process it started and puts the host back as it was.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from .cluster import Cluster
from .host_programs import HostPrograms, host_programs
from .hub_mirror import parse_bandwidth
from .processes import tail, wait_until


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="modelserve-sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--crds", type=Path, default=Path("crds"), help="CRD manifests to install")
    parser.add_argument("--examples", type=Path, default=Path("examples"), help="ModelServer manifests to apply")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the cluster keeps its data and logs (default: a new temp dir)"
    )
    parser.add_argument(
        "--no-real-node",
        action="store_true",
        help="KWOK nodes only: nothing runs for real (no root needed for the node)",
    )
    parser.add_argument(
        "--settle-timeout", type=float, default=300, help="seconds to wait for the examples to settle before printing"
    )
    parser.add_argument(
        "--hub-bandwidth",
        type=parse_bandwidth,
        default=None,
        metavar="RATE",
        help="the model hub's uplink, shared by every download, in bits per second (e.g. 100M, 1G); "
        "default: as fast as this machine serves",
    )
    parser.add_argument(
        "--exit-when-settled", action="store_true", help="stop after printing instead of running until interrupted"
    )
    return parser.parse_args(argv)


def _settled(cluster: Cluster) -> bool:
    """Every ModelServer has said where it stands: Ready, or Degraded with a reason."""
    out = cluster.kubectl("get", "modelservers", "-A", "-o", "json", check=False)
    if out.returncode != 0:
        return False
    items = json.loads(out.stdout)["items"]

    def decided(item: dict) -> bool:
        conditions = {c["type"]: c for c in item.get("status", {}).get("conditions", [])}
        ready = conditions.get("Ready", {}).get("status") == "True"
        degraded = conditions.get("Degraded", {}).get("status") == "True"
        return ready or degraded

    return bool(items) and all(decided(i) for i in items)


@dataclass(frozen=True)
class Examples:
    """Which examples `make dev` applies, and how."""

    chosen: list[Path]  # applied as they are
    on_kwok: list[Path]  # applied with what it takes to land on KWOK's fake nodes (beside the real node)
    left_out: dict[Path, str]  # and why


# What a pod needs to land on KWOK's fake nodes beside the real node (nodes.py: they carry KWOK's taint).
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
KWOK_NODE_SELECTOR = {"type": "kwok"}


def examples_to_apply(directory: Path, hub_repos: set[str] | None) -> Examples:
    """The example manifests to apply (as `kubectl apply -f DIR` reads a directory) and those left
    out with why. Beside a real node (`hub_repos`: what the sandbox's hub serves) an example runs
    for real or not at all: one whose model is not on the hub would take the real node's GPU and
    fail its download, so it is left to a GPU cluster (or to KWOK alone, `--no-real-node`). An
    example whose replicas span nodes cannot run on the one real node at all: it goes to KWOK's two
    GPU nodes, which play a GPU cluster (pods Ready, nothing runs)."""
    chosen: list[Path] = []
    on_kwok: list[Path] = []
    left_out: dict[Path, str] = {}
    for path in sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json")):
        specs = [
            doc["spec"]
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "ModelServer" and "model" in doc.get("spec", {})
        ]
        models = [spec["model"] for spec in specs]
        missing = sorted({m for m in models if hub_repos is not None and m.split(":", 1)[0] not in hub_repos})
        if hub_repos is not None and any(spec.get("nodes", 1) > 1 for spec in specs):
            on_kwok.append(path)
        elif missing:
            left_out[path] = f"{', '.join(missing)} is not on the sandbox's hub"
        else:
            chosen.append(path)
    return Examples(chosen, on_kwok, left_out)


def on_kwok(path: Path) -> list[dict]:
    """The ModelServers of an example file, with KWOK's toleration and node selector added."""
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "ModelServer":
            spec = doc["spec"]
            spec["tolerations"] = [*spec.get("tolerations", []), KWOK_TOLERATION]
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **KWOK_NODE_SELECTOR}
            out.append(doc)
    return out


def _gateway_models(base: str) -> str:
    """GET /v1/models through the gateway, anonymously: the public models, or why not."""
    try:
        with urllib.request.urlopen(f"{base}/models", timeout=10) as answer:
            return ", ".join(model["id"] for model in json.loads(answer.read())["data"]) or "none"
    except (OSError, ValueError, KeyError) as error:
        return f"unreachable ({error})"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="modelserve-sandbox-"))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    print(f"starting the control plane in {workdir} ...", flush=True)
    started = time.monotonic()
    with Cluster(workdir, real_node=False if args.no_real_node else None, hub_bandwidth=args.hub_bandwidth) as cluster:
        print(f"control plane up in {time.monotonic() - started:.1f}s: {cluster.server}", flush=True)
        if not cluster.has_real_node:
            print(
                f"no real node ({cluster.real_node_problem}): KWOK plays every node, so pods turn "
                "Ready but nothing runs",
                flush=True,
            )
        print(cluster.kubectl("get", "nodes", "-L", "type", "-o", "wide").stdout, flush=True)
        cluster.kubectl("apply", "--server-side", "-f", str(args.crds))
        cluster.wait_established()
        try:
            with host_programs(cluster) as programs:
                return _serve(args, cluster, programs, stop)
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir / "etcd", ignore_errors=True)


def _serve(args: argparse.Namespace, cluster: Cluster, programs: HostPrograms, stop: threading.Event) -> int:
    """Apply the examples, say where they stand, then run until interrupted (or one program exits)."""
    operator, gateway, gateway_url = programs.operator, programs.gateway, programs.gateway_url
    hub_repos = {f.repo for f in cluster.hub_files} if cluster.has_real_node else None
    examples = examples_to_apply(args.examples, hub_repos)
    for path, why in examples.left_out.items():
        print(f"not applied beside the real node: {path} ({why}; it needs a GPU cluster)", flush=True)
    cluster.kubectl("apply", *(arg for path in examples.chosen for arg in ("-f", str(path))))
    for path in examples.on_kwok:
        # Said, not hidden: the file stays what a user applies to a GPU cluster.
        print(
            f"applied on KWOK's GPU nodes: {path} (its replicas span nodes, more than the one real node; "
            f"the sandbox adds the toleration {KWOK_TOLERATION['key']} and nodeSelector type=kwok; "
            "its pods turn Ready, nothing runs)",
            flush=True,
        )
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": on_kwok(path)})
        )
    try:
        wait_until(
            lambda: operator.poll() is not None or _settled(cluster),
            args.settle_timeout,
            "the examples to become Ready or Degraded",
            interval=1.0,
        )
    except TimeoutError as error:
        print(f"warning: {error}", flush=True)
    if operator.poll() is not None:
        print(
            f"the operator exited with {operator.returncode}:\n{tail(cluster.log_dir / 'modelserve-operator.log')}",
            flush=True,
        )
        return 1
    print(cluster.kubectl("get", "ms", "-A").stdout, flush=True)
    print(cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout, flush=True)
    print(
        cluster.kubectl(
            "get",
            "ms",
            "-A",
            "-o",
            "custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type=='Ready')].reason,"
            "WHY:.status.conditions[?(@.type=='Degraded')].message",
        ).stdout,
        flush=True,
    )
    print(f"gateway: {gateway_url} (one base URL for every model)", flush=True)
    print(f"models the gateway lists without a key: {_gateway_models(gateway_url)}", flush=True)
    if args.exit_when_settled:
        return 0
    print(
        f"sandbox running; use it with:\n  export KUBECONFIG={cluster.kubeconfig} "
        f"PATH={cluster.bin_dir}:$PATH\nlogs: {cluster.log_dir}\nCtrl-C stops it.",
        flush=True,
    )
    while not stop.wait(1.0):
        for name, process in (("operator", operator), ("gateway", gateway)):
            if process.poll() is not None:
                print(f"the {name} exited; see its log", flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
