"""The sandbox's private registry (hack/registry, built by hack/build-registry.sh): go-containerregistry's
registry behind basic auth, on loopback, for the real node's containerd to pull from as a user's
cluster pulls from a private registry: with an imagePullSecret's credentials, over the network.

It is plain HTTP on 127.0.0.1: the node's containerd is told so in a hosts.toml of the registry's
host (realnode.RealNode.registry_hosts), as a user would for an HTTP mirror, and removed on stop.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .processes import free_ports, start_process, stop_process, tail, wait_until

USER = "modelserve-sandbox"


@dataclass(frozen=True)
class Registry:
    address: str  # host:port, the images' and the chart's registry
    user: str
    password: str
    journal_path: Path

    def docker_config(self) -> dict:
        """A `docker login`'s config.json for this registry: what crane and helm read, and a
        `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson`."""
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return {"auths": {self.address: {"username": self.user, "password": self.password, "auth": auth}}}

    def journal(self) -> list[dict]:
        """Every request answered so far, oldest first: {method, path, status, bytes, user}."""
        if not self.journal_path.exists():
            return []
        return [json.loads(line) for line in self.journal_path.read_text().splitlines() if line.strip()]


def hosts_toml(address: str) -> str:
    """containerd's hosts.toml for a plain-HTTP registry at `address`: pull and resolve from it."""
    return f'server = "http://{address}"\n\n[host."http://{address}"]\n  capabilities = ["pull", "resolve"]\n'


def _challenged(address: str) -> bool:
    """Whether the registry answers, with its 401 (it refuses every request without credentials)."""
    try:
        urllib.request.urlopen(f"http://{address}/v2/", timeout=2)  # loopback only
    except urllib.error.HTTPError as error:
        return error.code == 401
    except OSError:
        return False
    return False


@contextmanager
def private_registry(bin_dir: Path, workdir: Path, log_dir: Path, node_hosts: Path) -> Iterator[Registry]:
    """The registry on a free loopback port, its blobs under `workdir`, and the node's containerd told
    of it in `node_hosts`; stopped, and the node's hosts entry removed, on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    password_file = workdir / "password"
    password = secrets.token_hex(16)
    password_file.write_text(password)
    password_file.chmod(0o600)
    journal = workdir / "requests.jsonl"
    process = start_process(
        "registry",
        [
            str(bin_dir / "registry"),
            f"-address={address}",
            f"-dir={workdir / 'blobs'}",
            f"-user={USER}",
            f"-password-file={password_file}",
            f"-log={journal}",
        ],
        log_dir,
    )
    host_dir = node_hosts / address
    try:
        wait_until(
            lambda: _challenged(address) or process.poll() is not None,
            30,
            f"the registry on {address}",
            on_timeout=lambda: "\n" + tail(log_dir / "registry.log"),
        )
        if process.poll() is not None:
            raise RuntimeError(f"the registry exited {process.returncode}:\n{tail(log_dir / 'registry.log')}")
        host_dir.mkdir(parents=True, exist_ok=True)
        (host_dir / "hosts.toml").write_text(hosts_toml(address))
        yield Registry(address, USER, password, journal)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
        stop_process(process)
