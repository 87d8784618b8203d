"""http/tls.py on real files and real handshakes: the pair's checks (each bad pair named by its file),
the dates read from a certificate's DER against the `cryptography` package's reading, and a
Certificate following a Secret directory swapped as the kubelet swaps it."""

from __future__ import annotations

import socket
import ssl
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry

from harness.certificates import CA, other_key, served_certificate
from harness.sidecar import SecretDir
from modelserve.http import tls
from modelserve.http.metrics import TLSSeries


@pytest.fixture(scope="module")
def ca() -> CA:
    return CA()


def _der(pem: str) -> bytes:
    """The first certificate of a PEM chain, as DER."""
    first = pem[: pem.index("-----END CERTIFICATE-----")] + "-----END CERTIFICATE-----\n"
    return ssl.PEM_cert_to_DER_cert(first)


@pytest.mark.parametrize(
    ("serial", "not_after"),
    [
        (1, datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC)),  # UTCTime, the last year it spells
        (2**159 - 1, datetime(2050, 1, 1, tzinfo=UTC)),  # GeneralizedTime from 2050 (RFC 5280), a 20-byte serial
        (0x80, datetime.now(UTC).replace(microsecond=0) + timedelta(days=90)),  # a serial with a leading 0 byte
    ],
)
def test_a_certificates_serial_and_dates_are_read_as_cryptography_reads_them(
    ca: CA, serial: int, not_after: datetime
) -> None:
    issued = ca.issue(serial=serial, not_after=not_after)
    got = tls.certificate_dates(_der(issued.chain_pem))
    certificate = issued.certificate
    assert got == (serial, certificate.not_valid_before_utc, certificate.not_valid_after_utc)
    assert got[2] == not_after


def test_a_der_that_is_not_a_certificate_is_an_error() -> None:
    for der in (b"", b"\x30", b"\x30\x82\xff\xff", b"\x04\x00", b"\x30\x03\x02\x01\x01"):
        with pytest.raises(ValueError):
            tls.certificate_dates(der)


def test_a_good_pair_loads_with_its_chain(ca: CA, tmp_path: Path) -> None:
    issued = ca.issue(with_root=True)
    SecretDir(tmp_path).write(issued.files())
    pair = tls.load_pair(tmp_path)
    assert (pair.serial, pair.not_after) == (issued.serial, issued.not_after)
    assert pair.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert f"serial {issued.serial:x}" in pair.describe()


def _encrypted(issued: object) -> str:
    return issued.key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    ).decode()


@pytest.mark.parametrize(
    "case",
    ["no-dir", "no-key", "not-pem", "mismatch", "expired", "expired-in-chain", "garbage-key", "encrypted-key"],
)
def test_a_bad_pair_is_refused_naming_its_file(ca: CA, tmp_path: Path, case: str) -> None:
    directory = tmp_path / "tls"
    good = ca.issue()
    crt, key = str(directory / "tls.crt"), str(directory / "tls.key")
    files = good.files()
    expected = {
        "no-dir": (crt, "cannot be read"),
        "no-key": (key, "cannot be read"),
        "not-pem": (crt, "no PEM certificate"),
        "mismatch": (key, f"does not match the certificate in {crt}"),
        "expired": (crt, "the certificate (serial"),
        "expired-in-chain": (crt, "certificate 2 of the chain"),
        "garbage-key": (key, "not a private key"),
        "encrypted-key": (key, "encrypted"),
    }[case]
    if case == "no-key":
        del files["tls.key"]
    elif case == "not-pem":
        files["tls.crt"] = "hello\n"
    elif case == "mismatch":
        files = good.files(other_key())
    elif case == "expired":
        files = ca.issue(not_after=datetime.now(UTC) - timedelta(minutes=1)).files()
    elif case == "expired-in-chain":
        old = CA()
        old_pem = old.certificate.public_bytes(serialization.Encoding.PEM).decode()
        gone = ca.issue(not_after=datetime.now(UTC) - timedelta(days=1))
        files["tls.crt"] = good.chain_pem + gone.chain_pem + old_pem
    elif case == "garbage-key":
        files["tls.key"] = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    elif case == "encrypted-key":
        files["tls.key"] = _encrypted(good)
    if case != "no-dir":
        SecretDir(directory).write(files)
    with pytest.raises(tls.PairError) as refused:
        tls.load_pair(directory)
    message = str(refused.value)
    assert message.startswith(expected[0] + ":"), message
    assert expected[1] in message
    assert "\n" not in message


def _serial_served(port: int, ca_file: Path) -> int:
    return served_certificate(port, ca_file).serial_number


def test_a_certificate_follows_the_secret_and_keeps_its_pair_when_a_renewal_is_bad(ca: CA, tmp_path: Path) -> None:
    """A real TLS server (the standard library's, in a thread) on a Certificate's listener context,
    polled by hand (`check`): a renewal is served from the next handshake, a mismatched or expired
    one is refused and the pair before it served, and the metrics say so."""
    secret = SecretDir(tmp_path / "tls")
    first = ca.issue()
    secret.write(first.files())
    registry = CollectorRegistry()
    series = TLSSeries("t", registry)
    certificate = tls.Certificate(secret.path, series.changed)
    assert registry.get_sample_value("t_tls_certificate_expiry_timestamp_seconds") == first.not_after.timestamp()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with certificate.listener.wrap_socket(sock, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ca_file = ca.write(tmp_path / "ca.crt")
    try:
        assert _serial_served(port, ca_file) == first.serial
        assert certificate.check() is None  # nothing changed: nothing read
        second = ca.issue()
        secret.write(second.files())
        assert certificate.check() == tls.LOADED
        assert _serial_served(port, ca_file) == second.serial
        assert certificate.check() is None
        secret.write(ca.issue().files(other_key()))
        assert certificate.check() == tls.REFUSED
        assert certificate.check() is None  # told once, not every poll
        secret.write(ca.issue(not_after=datetime.now(UTC) - timedelta(seconds=1)).files())
        assert certificate.check() == tls.REFUSED
        assert _serial_served(port, ca_file) == second.serial
        loaded = registry.get_sample_value("t_tls_reloads_total", {"outcome": "loaded"})
        refused = registry.get_sample_value("t_tls_reloads_total", {"outcome": "refused"})
        assert (loaded, refused) == (1, 2)
        assert registry.get_sample_value("t_tls_certificate_expiry_timestamp_seconds") == second.not_after.timestamp()
    finally:
        stop.set()
        thread.join(5)
        listener.close()
