"""Cold starts on the sandbox's real node: what a replica start costs with the node's model cache, without
it (today's behaviour, the baseline) and with the model placed on the node by hand (the floor), at a
hub uplink of a given bandwidth. A benchmark, not a test: it prints figures, it asserts nothing but the
scenarios' hard checks (hub bytes), which it reports.

A cell is one engine at one bandwidth; it starts a sandbox of its own (the real node: root needed, and
`flock /tmp/modelserve-realnode.lock`), runs each mode's scenarios `--runs` times and prints, per
scenario and mode, the median and max of: seconds from the action to the pod Ready (S4: to the held
request's first answer byte), the model bytes the hub sent, and one start's phases (status.lastStart):

    S1  first replica on a node            (the node's cache emptied first)
    S2  second replica, same node          (min 1 -> 2)
    S3  pod deleted and recreated
    S4  wake from zero through the gateway (a second ModelServer of the same model, min 0)
    S5  0 -> 3 replicas at once on one node (llama.cpp; vLLM: 2, what the node's GPUs hold)

Modes: `baseline` (the operator without the node cache: the engine downloads as it starts), `cache`
(the node cache), `floor` (the node cache's pods, the model already in a volume on the node: a
PersistentVolume of this machine's disk, filled before the pod starts). Beside them, the plain
download of the same files at that bandwidth (the fetch, straight from the hub, on the host): S1's
reference. Usage:

    flock /tmp/modelserve-realnode.lock .venv/bin/python -m bench.cold_start \\
        --engine llamacpp --bandwidth 100M --modes baseline,cache,floor --scenarios S1,S2,S3,S4 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from harness.pod_states import container_states, restart_counts
from modelserve.contracts.nodecache import FetchResult
from modelserve.operator.starts import fetch_result
from modelserve_sandbox.cluster import NODE_CACHE_NAMESPACE, Cluster
from modelserve_sandbox.host_programs import host_programs
from modelserve_sandbox.hub_mirror import parse_bandwidth
from modelserve_sandbox.processes import wait_until

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "llamacpp": REPO / "examples" / "smollm2-135m-cpu.yaml",
    "vllm": REPO / "examples" / "smollm2-135m-vllm.yaml",
}
LAYOUT = {"llamacpp": "gguf", "vllm": "safetensors"}
READY_SECONDS = {"llamacpp": 300, "vllm": 900}
SELECTOR = "serving.modelserve.dev/modelserver"
POLL = 0.25


@dataclass
class Sample:
    seconds: float
    hub_bytes: int
    phases: dict[str, float] = field(default_factory=dict)
    fetched: FetchResult | None = None


def kubectl_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    out = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def hub_bytes(cluster: Cluster) -> int:
    assert cluster.hub is not None
    return sum(client["files"] for client in cluster.hub.bytes_by_client().values())


def pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    found = kubectl_json(cluster, "pods", "-n", namespace, "-l", f"{SELECTOR}={name}").get("items", [])
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def wait(condition: Callable[[], Any], seconds: float, what: str, on_timeout: Callable[[], str] | None = None) -> None:
    wait_until(lambda: bool(condition()), seconds, what, interval=POLL, on_timeout=on_timeout)


def answers(url: str) -> bool:
    """True once `url` answers 200; a program still starting refuses the connection."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def manifest(engine: str, name: str, replicas: dict[str, int], claim: str | None) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLES[engine].read_text())
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec["auth"] = {"mode": "public"}
    spec["replicas"] = replicas
    spec.pop("samplingDefaults", None)
    if engine == "llamacpp":  # three fit the node's two cores for S5
        spec["resources"] = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    if claim:
        spec["cache"] = {"claimName": claim}
    return body


class Cell:
    """One engine at one bandwidth: a sandbox, its host programs per mode, the scenarios."""

    def __init__(self, cluster: Cluster, engine: str, workdir: Path) -> None:
        self.cluster = cluster
        self.engine = engine
        self.workdir = workdir
        example = yaml.safe_load(EXAMPLES[engine].read_text())
        self.model = example["spec"]["model"]
        self.namespaces = 0

    # --- the node's cache and the floor's volume ----------------------------------------------
    def empty_node_cache(self) -> None:
        """The node's cache as on a new node: its store emptied, its agent restarted."""
        for child in self.cluster.node_cache_dir.iterdir() if self.cluster.node_cache_dir.exists() else ():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        self.cluster.kubectl("delete", "pods", "-n", NODE_CACHE_NAMESPACE, "--all", "--wait=true", "--timeout=60s")
        wait(self.cluster.node_cache_ready, 120, "the node agent back")

    def plain_download(self) -> float:
        """The same files at the same bandwidth, straight from the hub, by the fetch on the host."""
        target = Path(tempfile.mkdtemp(prefix="plain-", dir=self.workdir))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("MODELSERVE_", "HF_"))},
            "MODELSERVE_FETCH_MODEL": self.model,
            "MODELSERVE_FETCH_LAYOUT": LAYOUT[self.engine],
            "MODELSERVE_FETCH_HUB": self.cluster.hub_endpoint or "",
            "MODELSERVE_FETCH_CACHE_DIR": str(target / "hub"),
            "MODELSERVE_FETCH_RESULT": str(target / "result"),
        }
        subprocess.run(
            [str(Path(sys.executable).with_name("modelserve-fetch"))], env=env, check=True, capture_output=True
        )
        result = FetchResult.parse((target / "result").read_text())
        assert result is not None
        return result.seconds

    def floor_volume(self, namespace: str) -> str:
        """A claim bound to a volume of this machine's disk that holds the model already (the floor)."""
        directory = self.workdir / f"floor-{namespace}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("MODELSERVE_", "HF_"))},
            "MODELSERVE_FETCH_MODEL": self.model,
            "MODELSERVE_FETCH_LAYOUT": LAYOUT[self.engine],
            "MODELSERVE_FETCH_HUB": self.cluster.hub_endpoint or "",
            "MODELSERVE_FETCH_CACHE_DIR": str(directory / "hub"),
            "MODELSERVE_FETCH_RESULT": str(self.workdir / f"floor-{namespace}.result"),
        }
        subprocess.run(
            [str(Path(sys.executable).with_name("modelserve-fetch"))], env=env, check=True, capture_output=True
        )
        subprocess.run(["chown", "-R", "65532:65532", str(directory)], check=True)
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"floor-{namespace}"},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "floor",
                "hostPath": {"path": str(directory)},
                "claimRef": {"namespace": namespace, "name": "floor"},
            },
        }
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "floor", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "floor",
                "resources": {"requests": {"storage": "10Gi"}},
                "volumeName": f"floor-{namespace}",
            },
        }
        self.cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [volume, claim]})
        )
        return "floor"

    # --- the scenarios ------------------------------------------------------------------------------
    def new_namespace(self) -> str:
        self.namespaces += 1
        namespace = f"cold-{self.namespaces}"
        self.cluster.create_namespace(namespace)
        return namespace

    def force_away(self, namespace: str, *selector: str) -> None:
        """A bench's teardown, not a scenario: once no ReplicaSet is left to replace them, the pods go at
        once rather than after the engine's preStop (the sidecar's whole drain budget, 65 s, each time),
        so that the next scenario starts on an idle node."""
        wait(lambda: not kubectl_json(self.cluster, "rs", "-n", namespace).get("items"), 120, "the ReplicaSets gone")
        what = [*selector] if selector else ["--all"]
        self.cluster.kubectl(
            "delete", "pods", "-n", namespace, *what, "--grace-period=0", "--force", "--wait=false", check=False
        )

    def remove(self, namespace: str) -> None:
        self.cluster.kubectl("delete", "ms", "--all", "-n", namespace, "--wait=true", "--timeout=300s", check=False)
        with contextlib.suppress(TimeoutError):
            self.force_away(namespace)
        self.cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=300s", check=False)
        self.cluster.kubectl("delete", "pv", f"floor-{namespace}", "--ignore-not-found", check=False)

    def started(self, namespace: str, name: str, known: set[str], count: int, began: float, hub_before: int) -> Sample:
        """Wait for `count` Ready pods; the sample of the newest one not in `known`."""
        wait(
            lambda: sum(1 for p in pods(self.cluster, namespace, name) if ready(p)) >= count,
            READY_SECONDS[self.engine],
            f"{count} of {name} Ready",
            on_timeout=lambda: "\n" + self.engine_state(namespace, name),
        )
        seconds = time.monotonic() - began
        new = [p for p in pods(self.cluster, namespace, name) if p["metadata"]["name"] not in known and ready(p)]
        pod = max(new, key=lambda p: p["metadata"]["creationTimestamp"]) if new else None
        return self._sample(namespace, name, pod, seconds, hub_before)

    def _sample(self, namespace: str, name: str, pod: dict[str, Any] | None, seconds: float, hub_before: int) -> Sample:
        phases: dict[str, float] = {}
        # The status' lastStart follows the operator's next reconcile: read it once it names the pod.
        if pod is not None:

            def reported() -> dict[str, Any] | None:
                last = (kubectl_json(self.cluster, "ms", name, "-n", namespace).get("status") or {}).get(
                    "lastStart"
                ) or {}
                return last if last.get("pod") == pod["metadata"]["name"] else None

            try:
                wait(reported, 30, "the start in the status")
                phases = (reported() or {}).get("phases", {})
            except TimeoutError:
                pass
        return Sample(seconds, hub_bytes(self.cluster) - hub_before, phases, fetch_result(pod) if pod else None)

    def run(self, scenarios: list[str], claim_for: Callable[[str], str | None], gateway: str) -> dict[str, Sample]:
        namespace = self.new_namespace()
        claim = claim_for(namespace)
        name = "cold"
        out: dict[str, Sample] = {}
        try:
            before, began = hub_bytes(self.cluster), time.monotonic()
            self.cluster.kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                input=json.dumps(manifest(self.engine, name, {"min": 1, "max": 3}, claim)),
            )
            out["S1"] = self.started(namespace, name, set(), 1, began, before)
            if "S2" in scenarios or "S3" in scenarios:
                known = {p["metadata"]["name"] for p in pods(self.cluster, namespace, name)}
                before, began = hub_bytes(self.cluster), time.monotonic()
                patch = {"spec": {"replicas": {"min": 2, "max": 3}}}
                self.cluster.kubectl("patch", "ms", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
                out["S2"] = self.started(namespace, name, known, 2, began, before)
            if "S3" in scenarios:
                victim = max(pods(self.cluster, namespace, name), key=lambda p: p["metadata"]["creationTimestamp"])
                known = {p["metadata"]["name"] for p in pods(self.cluster, namespace, name)}
                before, began = hub_bytes(self.cluster), time.monotonic()
                self.cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace, "--wait=false")
                out["S3"] = self.started(namespace, name, known, 2, began, before)
            if "S4" in scenarios:
                # Its replicas go first: the node's two GPUs are what a vLLM wake needs.
                self.cluster.kubectl("delete", "ms", name, "-n", namespace, "--wait=true", "--timeout=300s")
                selector = f"{SELECTOR}={name}"
                self.force_away(namespace, "-l", selector)
                wait(
                    lambda: not kubectl_json(self.cluster, "pods", "-n", namespace, "-l", selector).get("items"),
                    300,
                    f"{name}'s pods gone",
                )
                out["S4"] = self.wake(namespace, claim, gateway)
        finally:
            self.remove(namespace)
        return out

    def together(self, claim_for: Callable[[str], str | None]) -> Sample:
        """S5: 0 -> N replicas at once on the node (N = 3 for llama.cpp; 2 for vLLM, the node's GPUs)."""
        namespace = self.new_namespace()
        claim = claim_for(namespace)
        count = 3 if self.engine == "llamacpp" else 2
        try:
            before, began = hub_bytes(self.cluster), time.monotonic()
            body = manifest(self.engine, "together", {"min": count, "max": count}, claim)
            self.cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
            return self.started(namespace, "together", set(), count, began, before)
        finally:
            self.remove(namespace)

    def compile_cache(self) -> tuple[float, float, str]:
        """S6 (vLLM): the engine phase compiling (no --enforce-eager) with an empty cache, then again
        after the engine container restarts on the same pod (its ~/.cache volume kept): (cold, warm,
        what vLLM left in ~/.cache/vllm)."""
        namespace, name = self.new_namespace(), "compiled"
        body = manifest(self.engine, name, {"min": 1, "max": 1}, None)
        body["spec"]["engineArgs"] = [a for a in body["spec"].get("engineArgs", []) if a != "--enforce-eager"]
        try:
            self.cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
            cold = self.started(namespace, name, set(), 1, time.monotonic(), hub_bytes(self.cluster))
            (pod,) = pods(self.cluster, namespace, name)
            exec_engine = ["exec", "-n", namespace, pod["metadata"]["name"], "-c", "engine", "--"]
            look = "du -sh /root/.cache/vllm /tmp/torchinductor_*; find /root/.cache/vllm -maxdepth 4 | head -20"
            listing = self.cluster.kubectl(*exec_engine, "sh", "-c", look, check=False)
            # The shell's kill: the engine's image has no kill program (procps).
            self.cluster.kubectl(*exec_engine, "sh", "-c", "kill -TERM 1")

            def engine_of(pod: dict[str, Any]) -> dict[str, Any]:
                return next(c for c in pod["status"]["containerStatuses"] if c["name"] == "engine")

            def restarted() -> dict[str, Any] | None:
                (now,) = pods(self.cluster, namespace, name)
                return (
                    now if restart_counts(now).get("engine", 0) >= 1 and "running" in engine_of(now)["state"] else None
                )

            # The pod stays Ready until the sidecar's probe fails (period 5 s, threshold 3): wait for it
            # to turn not Ready before waiting for Ready again, or the warm figure is the old Ready.
            wait(restarted, 120, "the engine restarted")
            wait(lambda: not ready(restarted() or {}), 120, "the pod not Ready after the engine's restart")
            wait(lambda: ready(restarted() or {}), READY_SECONDS[self.engine], "the engine restarted and Ready")
            now = restarted() or {}
            ready_at = next(c for c in now["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
            warm = _stamp(ready_at) - _stamp(engine_of(now)["state"]["running"]["startedAt"])
            logs = [self.engine_log(namespace, pod["metadata"]["name"], previous) for previous in (True, False)]
            said = [line for log in logs for line in log.splitlines() if "init engine" in line or "AOT" in line]
            words = "\n--- the engine's own words, cold then warm:\n" + "\n".join(said)
            return cold.phases.get("engine", float("nan")), warm, listing.stdout + listing.stderr + words
        finally:
            self.remove(namespace)

    def engine_state(self, namespace: str, name: str) -> str:
        """Why a pod is not Ready, read before its namespace goes: its containers' states and restarts,
        and the last lines of the engine's log (the previous run's too, after a restart)."""
        lines = []
        for pod in pods(self.cluster, namespace, name):
            pod_name = pod["metadata"]["name"]
            lines.append(f"{pod_name}: {container_states(pod)}; restarts {restart_counts(pod)}")
            for previous in (True, False):
                log = self.engine_log(namespace, pod_name, previous, "--tail=25")
                if log.strip():
                    lines.append(f"--- engine log{' (previous run)' if previous else ''}:\n{log.rstrip()}")
        return "\n".join(lines) or "no pod"

    def engine_log(self, namespace: str, pod_name: str, previous: bool, *flags: str) -> str:
        """The engine container's log (its run before the last restart: `previous`); empty if none."""
        logs = self.cluster.kubectl(
            "logs", "-n", namespace, pod_name, "-c", "engine", *flags, *(["--previous"] if previous else []),
            check=False,
        )  # fmt: skip
        return logs.stdout if logs.returncode == 0 else ""

    def wake(self, namespace: str, claim: str | None, gateway: str) -> Sample:
        """A second ModelServer of the same model at zero; a streamed request held at the gateway wakes
        it: seconds to the first answer byte (past the gateway's keep-alive comments)."""
        name = "sleeper"
        at_zero = {"min": 0, "max": 1, "scaleDownDelaySeconds": 600, "idleWindowSeconds": 600}
        self.cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(manifest(self.engine, name, at_zero, claim))
        )
        wait(
            lambda: (
                (kubectl_json(self.cluster, "ms", name, "-n", namespace).get("status") or {}).get("phase") == "Idle"
            ),
            120,
            "the sleeper Idle",
        )
        before, began = hub_bytes(self.cluster), time.monotonic()
        body = {"model": name, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "stream": True}
        first = None
        with httpx.stream(
            "POST", f"{gateway}/chat/completions", json=body, timeout=READY_SECONDS[self.engine]
        ) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {") and first is None:
                    first = time.monotonic() - began
        assert first is not None, "no answer"
        (pod,) = [p for p in pods(self.cluster, namespace, name) if ready(p)] or [None]
        sample = self._sample(namespace, name, pod, first, before)
        return sample


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@contextmanager
def cluster_for(bandwidth: float | None) -> Iterator[tuple[Cluster, Path]]:
    with tempfile.TemporaryDirectory(prefix="cold-start-bench-") as tmp:
        workdir = Path(tmp)
        with Cluster(workdir / "sandbox", gpu_nodes=1, real_node=True, hub_bandwidth=bandwidth) as cluster:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            cluster.wait_established()
            yield cluster, workdir


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} {max(values):7.2f}" if values else "      -       -"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(EXAMPLES), default="llamacpp")
    parser.add_argument("--bandwidth", default="100M", help="the hub's uplink (100M, 1G) or none")
    parser.add_argument("--modes", default="baseline,cache,floor")
    parser.add_argument("--scenarios", default="S1,S2,S3,S4")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bandwidth = None if args.bandwidth == "none" else parse_bandwidth(args.bandwidth)
    scenarios = args.scenarios.split(",")
    samples: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    plain: list[float] = []
    compiled: list[tuple[float, float, str]] = []
    with cluster_for(bandwidth) as (cluster, workdir):
        cell = Cell(cluster, args.engine, workdir)
        for mode in args.modes.split(","):
            operator_env = {} if mode != "baseline" else {"MODELSERVE_NODE_CACHE_URL": ""}
            with host_programs(cluster, operator_env) as programs:
                wait(lambda: answers(f"http://{programs.gateway_address}/healthz"), 60, "the gateway")
                for run in range(args.runs):
                    if mode == "cache":
                        cell.empty_node_cache()
                    if mode == "cache":  # each run's, so that S1's ratio is against a download of its own time
                        plain.append(cell.plain_download())
                    claim_for = cell.floor_volume if mode == "floor" else (lambda _: None)
                    if "S6" in scenarios and mode == "cache":
                        try:
                            cold, warm, listing = cell.compile_cache()
                            compiled.append((cold, warm, listing))
                            print(f"S6 run {run}: engine phase cold {cold:.1f} s, warm {warm:.1f} s")
                        except TimeoutError as error:  # one scenario's failure is a figure, not the run's end
                            print(f"S6 run {run}: not measured: {error}", flush=True)
                    wanted = set(scenarios) - {"S5", "S6"}
                    found = cell.run(scenarios, claim_for, programs.gateway_url) if wanted else {}
                    if "S5" in scenarios:
                        if mode == "cache":
                            cell.empty_node_cache()
                        found["S5"] = cell.together(claim_for)
                    for scenario, sample in found.items():
                        samples[(scenario, mode)].append(sample)
                        print(
                            f"{args.engine} {args.bandwidth} {mode:8} run {run} {scenario}: {sample.seconds:6.2f} s, "
                            f"hub {sample.hub_bytes / 1e6:7.1f} MB, phases {sample.phases}",
                            flush=True,
                        )
    print(f"\n{args.engine} at {args.bandwidth}: median and max of {args.runs} runs (seconds; hub MB as sent)")
    print(f"{'scenario':10} {'mode':9} {'seconds (med, max)':>18} {'hub MB (med, max)':>18}  phases of one start")
    for (scenario, mode), found in sorted(samples.items()):
        seconds = [s.seconds for s in found]
        mb = [s.hub_bytes / 1e6 for s in found]
        one = next((s.phases for s in reversed(found) if s.phases), {})
        print(f"{scenario:10} {mode:9} {summary(seconds):>18} {summary(mb):>18}  {one}")
    if plain:
        print(f"{'plain download of the same files at that bandwidth (host, from the hub)':<72} {summary(plain)}")
        firsts = [s.phases.get("weights") for s in samples.get(("S1", "cache"), [])]
        ratios = [w / p for w, p in zip(firsts, plain, strict=False) if w and p]  # a run against its own
        if ratios:
            print(f"{'S1 weights phase / the plain download of the same run':<72} {summary(ratios)}")
    if compiled:
        print(f"S6 engine phase, compile cache empty:  {summary([c[0] for c in compiled])}")
        print(f"S6 engine phase, compile cache kept:   {summary([c[1] for c in compiled])}")
        print(f"what vLLM keeps in ~/.cache/vllm:\n{compiled[-1][2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
