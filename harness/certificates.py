"""Certificates made for a test: a CA of its own and server certificates it issues, written as the
files of a `kubernetes.io/tls` Secret (tls.crt, tls.key), and what a server serves read back over TLS.
Made with the `cryptography` package (the test extra); the servers themselves need only `ssl`."""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The names a test's server answers on: its certificates name them.
HOSTS = ("localhost", "127.0.0.1")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # P-256, as cert-manager's ECDSA default


def key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@dataclass(frozen=True)
class Issued:
    """A server certificate, its private key, and the chain a tls.crt holds (leaf first)."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    chain_pem: str

    @property
    def serial(self) -> int:
        return self.certificate.serial_number

    @property
    def not_after(self) -> datetime:
        return self.certificate.not_valid_after_utc

    def files(self, key: ec.EllipticCurvePrivateKey | None = None) -> dict[str, str]:
        """The Secret's files; with `key`, another key than the certificate's (a mismatched pair)."""
        return {"tls.crt": self.chain_pem, "tls.key": key_pem(key or self.key)}


class CA:
    """A self-signed root that issues server certificates for HOSTS."""

    def __init__(self, name: str = "modelserve test CA") -> None:
        self.key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def write(self, path: Path) -> Path:
        """The CA's certificate as a PEM file a client trusts (httpx's `verify=`); `path`."""
        path.write_text(self.pem)
        return path

    def issue(
        self,
        serial: int | None = None,
        not_after: datetime | None = None,
        not_before: datetime | None = None,
        hosts: tuple[str, ...] = HOSTS,
        with_root: bool = False,
    ) -> Issued:
        """A server certificate for `hosts`, valid a week unless told (an expired one when
        `not_after` is past); its chain the leaf alone, or the leaf and this root."""
        key = _key()
        now = datetime.now(UTC)
        not_after = not_after or now + timedelta(days=7)
        not_before = not_before or min(now - timedelta(hours=1), not_after - timedelta(days=1))
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(serial or x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        chain = certificate.public_bytes(serialization.Encoding.PEM).decode()
        return Issued(certificate, key, chain + (self.pem if with_root else ""))


def other_key() -> ec.EllipticCurvePrivateKey:
    """A key no certificate was issued for."""
    return _key()


def served_certificate(
    port: int, ca_file: Path, host: str = "127.0.0.1", address: str = "127.0.0.1"
) -> x509.Certificate:
    """The certificate a server on `address`:`port` presents to a new connection that trusts
    `ca_file` (and checks the name `host`): a handshake of its own, no HTTP."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection((address, port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=host) as connection,
    ):
        der = connection.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)
