"""The sandbox's real node: start and stop times, apply -> Ready of an example, and memory.

Starts its own sandbox with the real node (root needed) and the operator as a host process, then
for each run applies an example (`examples/smollm2-135m-cpu.yaml`, or `--example`, e.g. the vLLM
one) in a fresh namespace and reports, from `kubectl apply`:
  - the Deployment created (the operator),
  - the pod's engine container started (scheduler, kubelet, containerd, image unpack),
  - the ModelServer Ready (the model downloaded from the sandbox hub and loaded, the sidecar's
    readiness probe passed, the status written),
  - the first answer to a chat request through the Service (kube-proxy, sidecar, engine);
and, as baselines from the same run:
  - a bare pod of the pause image -> Ready (what the node alone takes to start a pod),
  - for the cpu example, llama-server started on the host with the model file -> `/v1/models`
    answers (the engine's own load time, no Kubernetes).
Then the resident memory of kubelet, containerd, kube-proxy and the serving pod (its cgroup),
and the time the sandbox takes to stop and put the host back. Usage:

    .venv/bin/python -m bench.real_node [--runs 3] [--example examples/smollm2-135m-vllm.yaml]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from modelserve_sandbox.cluster import SMOLLM2_REPO, Cluster, hub_files
from modelserve_sandbox.hoststate import kubepods_cgroups
from modelserve_sandbox.llama_server import llama_server_binary
from modelserve_sandbox.processes import free_ports, start_process, stop_process, wait_until

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "smollm2-135m-cpu.yaml"
TIMEOUT_SECONDS = 600
POLL_SECONDS = 0.1


def first_time(condition: Callable[[], bool], started: float, what: str) -> float:
    wait_until(condition, TIMEOUT_SECONDS, what, interval=POLL_SECONDS)
    return time.monotonic() - started


def kubectl_json(cluster: Cluster, *args: str) -> dict:
    out = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def engine_started(cluster: Cluster, namespace: str) -> bool:
    pods = kubectl_json(cluster, "pods", "-n", namespace).get("items", [])
    return any(
        "running" in s.get("state", {})
        for p in pods
        for s in p.get("status", {}).get("containerStatuses", [])
        if s["name"] == "engine"
    )


def ms_ready(cluster: Cluster, namespace: str, name: str) -> bool:
    status = kubectl_json(cluster, "ms", name, "-n", namespace).get("status", {})
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def first_answer(cluster: Cluster, namespace: str, name: str) -> None:
    """One short chat completion through the Service, with the generated key if there is one."""
    ip = kubectl_json(cluster, "service", name, "-n", namespace)["spec"]["clusterIP"]
    secret = kubectl_json(cluster, "secret", f"{name}-api-keys", "-n", namespace).get("data", {})
    headers = {"Content-Type": "application/json"}
    if "api-key" in secret:
        import base64

        headers["Authorization"] = f"Key {base64.b64decode(secret['api-key']).decode()}"
    body = {"model": name, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}
    request = urllib.request.Request(
        f"http://{ip}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()


def measure_example(cluster: Cluster, namespace: str, example: Path, name: str) -> tuple[float, ...]:
    cluster.create_namespace(namespace)
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    created = first_time(
        lambda: bool(kubectl_json(cluster, "deployment", name, "-n", namespace)), started, "the Deployment"
    )
    running = first_time(lambda: engine_started(cluster, namespace), started, "the engine container")
    ready = first_time(lambda: ms_ready(cluster, namespace, name), started, "the ModelServer Ready")
    first_answer(cluster, namespace, name)
    return created, running, ready, time.monotonic() - started


def measure_pause_pod(cluster: Cluster, namespace: str) -> float:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pause", "namespace": namespace},
        "spec": {
            "nodeSelector": {"type": "real"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def ready() -> bool:
        conditions = kubectl_json(cluster, "pod", "pause", "-n", namespace).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    return first_time(ready, started, "the pause pod Ready")


def measure_engine_alone(workdir: Path, name: str) -> float:
    (model,) = [f.path for f in hub_files(workdir) if f.repo == SMOLLM2_REPO]
    port = free_ports(1)[0]
    argv = [
        str(llama_server_binary()),
        "-m",
        str(model),
        "-c",
        "4096",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--alias",
        name,
    ]
    started = time.monotonic()
    process = start_process("llama-server-alone", argv, workdir)
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        return first_time(answers, started, "llama-server on the host")
    finally:
        stop_process(process)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pids_of(executable: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
            except OSError:
                continue
            if Path(argv0).name == executable:
                found.append(int(proc.name))
    return found


def pod_memory_mib(cluster: Cluster, namespace: str, name: str) -> float:
    """Memory of the serving pod's cgroup (both containers and the pause), page cache included."""
    (pod,) = kubectl_json(cluster, "pods", "-n", namespace, "-l", f"serving.modelserve.dev/modelserver={name}")["items"]
    uid = pod["metadata"]["uid"]
    for root in kubepods_cgroups():
        # cgroup v2 names it memory.current, v1 (these VMs) memory.usage_in_bytes.
        for counter in ("memory.current", "memory.usage_in_bytes"):
            for path in root.glob(f"**/pod{uid}/{counter}"):
                return int(path.read_text()) / 2**20
    return float("nan")


def summary(label: str, values: list[float]) -> str:
    return (
        f"{label:<58} median {statistics.median(values):6.2f} s   "
        f"min {min(values):6.2f}   max {max(values):6.2f}   (n={len(values)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--example", type=Path, default=EXAMPLE, help="the ModelServer manifest to apply")
    args = parser.parse_args()
    manifest = yaml.safe_load(args.example.read_text())
    name, profile = manifest["metadata"]["name"], manifest["spec"]["profile"]
    with tempfile.TemporaryDirectory(prefix="real-node-bench-") as tmp:
        workdir = Path(tmp)
        started = time.monotonic()
        cluster = Cluster(workdir, gpu_nodes=1, real_node=True).start()
        start_seconds = time.monotonic() - started
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            argv = [str(Path(sys.executable).with_name("modelserve-operator"))]
            operator = start_process("modelserve-operator", argv, cluster.log_dir, env=cluster.env)
            created, running, readied, answered, pause, alone = [], [], [], [], [], []
            memory: dict[str, float] = {}
            try:
                for run in range(args.runs):
                    namespace = f"bench-{run}"
                    to_deployment, to_running, to_ready, to_answer = measure_example(
                        cluster, namespace, args.example, name
                    )
                    created.append(to_deployment)
                    running.append(to_running)
                    readied.append(to_ready)
                    answered.append(to_answer)
                    pause.append(measure_pause_pod(cluster, namespace))
                    if profile == "cpu":
                        alone.append(measure_engine_alone(workdir, name))
                    if run == args.runs - 1:
                        time.sleep(5)  # the sidecar's warm-up request is done
                        for process in ("kubelet", "containerd", "kube-proxy"):
                            memory[process] = sum(rss_mib(pid) for pid in pids_of(process))
                        memory["serving pod (its memory cgroup)"] = pod_memory_mib(cluster, namespace, name)
                    cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")
            finally:
                stop_process(operator)
        finally:
            started = time.monotonic()
            cluster.stop()
            stop_seconds = time.monotonic() - started
    print(f"{'sandbox start (control plane + real node, images imported)':<58} {start_seconds:6.2f} s")
    print(summary(f"apply {name} -> Deployment created", created))
    print(summary(f"apply {name} -> engine container running", running))
    print(summary(f"apply {name} -> ModelServer Ready", readied))
    print(summary(f"apply {name} -> first answer", answered))
    print(summary("baseline: apply pause pod -> Ready", pause))
    if alone:
        print(summary("baseline: llama-server on the host -> /v1/models", alone))
    for what, mib in memory.items():
        print(f"{'RSS ' + what:<58} {mib:6.0f} MiB")
    print(f"{'sandbox stop (host put back)':<58} {stop_seconds:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
