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


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


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
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=modelserve-sandbox-ca",
        "-keyout",
        str(pki.ca_key),
        "-out",
        str(pki.ca_cert),
        cwd=directory,
    )
    ext = directory / "serving.ext"
    ext.write_text(
        f"subjectAltName={','.join(f'IP:{ip}' for ip in ('127.0.0.1', *server_ips))},DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    csr = directory / "apiserver.csr"
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=kube-apiserver",
        "-keyout",
        str(pki.serving_key),
        "-out",
        str(csr),
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki.ca_cert),
        "-CAkey",
        str(pki.ca_key),
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        str(ext),
        "-out",
        str(pki.serving_cert),
        cwd=directory,
    )
    client_ext = directory / "client.ext"
    client_ext.write_text("extendedKeyUsage=clientAuth\n")
    client_csr = directory / "apiserver-kubelet-client.csr"
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        "-keyout",
        str(pki.kubelet_client_key),
        "-out",
        str(client_csr),
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(client_csr),
        "-CA",
        str(pki.ca_cert),
        "-CAkey",
        str(pki.ca_key),
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        str(client_ext),
        "-out",
        str(pki.kubelet_client_cert),
        cwd=directory,
    )
    _openssl("genrsa", "-out", str(pki.service_account_key), "2048", cwd=directory)
    _openssl("rsa", "-in", str(pki.service_account_key), "-pubout", "-out", str(pki.service_account_pub), cwd=directory)
    return pki
