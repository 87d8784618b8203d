"""Certificates and keys for a local control plane, made with the openssl command line.

The API server gets a serving certificate for 127.0.0.1/localhost signed by our own CA, so
kubectl, helm and the Python client verify TLS instead of skipping it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    service_account_key: Path
    service_account_pub: Path
    kubelet_client_cert: Path  # the API server's identity towards kubelets (logs, exec, port-forward)
    kubelet_client_key: Path


KUBERNETES_NAMES = (
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


def _signed(pki: Pki, subject: str, key: Path, cert: Path, extensions: str) -> None:
    """A new key and a certificate for it signed by the CA, with these x509 extensions."""
    directory = cert.parent
    ext, csr = cert.with_suffix(".ext"), cert.with_suffix(".csr")
    ext.write_text(extensions)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr), cwd=directory
    )
    ca = ["-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key), "-CAcreateserial"]
    _openssl(
        "x509", "-req", "-in", str(csr), *ca, "-days", "30", "-extfile", str(ext), "-out", str(cert), cwd=directory
    )


def serving_cert(pki: Pki, directory: Path, name: str) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 signed by the sandbox CA, as `directory`/tls.crt and
    tls.key (the names controller-runtime's webhook server reads): for a host process the API server
    calls, e.g. a webhook."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    _signed(
        pki,
        f"/CN={name}",
        key,
        cert,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    return cert, key


def make_pki(directory: Path, server_ips: tuple[str, ...] = ()) -> Pki:
    """`server_ips`: addresses besides 127.0.0.1 the API server is reached at (the `kubernetes`
    Service's ClusterIP, the real node's bridge)."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
        kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        kubelet_client_key=directory / "apiserver-kubelet-client.key",
    )
    ca = "req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=modelserve-sandbox-ca".split()
    _openssl(*ca, "-keyout", str(pki.ca_key), "-out", str(pki.ca_cert), cwd=directory)
    san = ",".join([*(f"IP:{ip}" for ip in ("127.0.0.1", *server_ips)), "DNS:localhost", *KUBERNETES_NAMES])
    _signed(
        pki,
        "/CN=kube-apiserver",
        pki.serving_key,
        pki.serving_cert,
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n",
    )
    _signed(
        pki,
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        pki.kubelet_client_key,
        pki.kubelet_client_cert,
        "extendedKeyUsage=clientAuth\n",
    )
    _openssl("genrsa", "-out", str(pki.service_account_key), "2048", cwd=directory)
    _openssl("rsa", "-in", str(pki.service_account_key), "-pubout", "-out", str(pki.service_account_pub), cwd=directory)
    return pki
