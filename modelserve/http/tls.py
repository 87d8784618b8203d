"""Serving HTTPS from a certificate and key on disk (a mounted `kubernetes.io/tls` Secret: `tls.crt`,
the chain, leaf first; `tls.key`, its private key), following their renewals while serving.

The server listens with one context whose SNI callback (called for every handshake, whether or not
the client names a server) hands the handshake the context of the pair served now: a renewed pair is
read into a context of its own, checked whole, and only then becomes the one served, so a handshake
never meets a half-loaded chain, and a pair that fails its checks (a key that does not match its
certificate, an expired certificate, a file missing or unreadable) leaves the one served before in
place. A thread polls the two files' identity (device, inode, size, modification time: two stat calls
a poll, through the kubelet's `..data` symlink, which it swaps for each update) every `POLL_SECONDS`.

Only the standard library's ssl module: a certificate's dates are read from its DER here (a few
fields of the fixed start of an X.509 structure), without a crypto library in the image.
"""

from __future__ import annotations

import binascii
import logging
import os
import re
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
# A renewal is served within about this long of the kubelet's swap (the kubelet itself takes up to
# its sync period, about a minute, to swap a changed Secret in).
POLL_SECONDS = 1.0
# What a reload tells the server's metrics (http/metrics.py TLSSeries).
LOADED = "loaded"
REFUSED = "refused"
OUTCOMES = (LOADED, REFUSED)
# The one protocol the servers speak, told in ALPN.
ALPN = ["http/1.1"]

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.DOTALL)

# Each file's (device, inode, size, mtime in ns), or None when it cannot be stat'ed.
Identity = tuple[tuple[int, int, int, int] | None, ...]


class PairError(Exception):
    """A certificate and key that cannot be served; the message names the file at fault."""


@dataclass(frozen=True)
class Pair:
    """A certificate chain and its key, checked, in a server context of their own."""

    context: ssl.SSLContext
    serial: int  # the leaf's
    not_after: datetime  # the leaf's

    def describe(self) -> str:
        return f"serial {self.serial:x}, valid until {self.not_after:%Y-%m-%dT%H:%M:%SZ}"


# (outcome or None for the pair served from the start, the pair served after it)
Changed = Callable[[str | None, Pair], None]


def identity(paths: tuple[Path, ...]) -> Identity:
    out: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # through the symlinks: the file the kubelet's ..data points at now
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def server_context() -> ssl.SSLContext:
    """A server context as every pair gets it: TLS 1.2 and later, the ssl module's default ciphers
    (forward-secret AEAD suites first), no compression, HTTP/1.1 in ALPN."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    return context


def starting_pair(directory: Path, refused: Callable[[str], NoReturn]) -> Pair:
    """The pair in `directory`, checked before a program starts serving it (logged); one it cannot
    serve goes to `refused` with the reason, naming the file, which ends the program."""
    try:
        pair = load_pair(directory)
    except PairError as exc:
        refused(str(exc))
    log.info("serving HTTPS: %s (%s)", directory / CERT_FILE, pair.describe())
    return pair


def load_pair(directory: Path, now: datetime | None = None) -> Pair:
    """The pair in `directory`, checked: every certificate of the chain in date (none expired), the
    key readable, not encrypted, and the leaf's. PairError, naming the file, for any other."""
    cert, key = directory / CERT_FILE, directory / KEY_FILE
    # The files the symlinks point at now: read together from one of the kubelet's generations.
    cert_real, key_real = Path(os.path.realpath(cert)), Path(os.path.realpath(key))
    try:
        pem = cert_real.read_bytes()
    except OSError as exc:
        raise PairError(f"{cert}: cannot be read ({exc.strerror or exc})") from None
    blocks = _PEM.findall(pem)
    if not blocks:
        raise PairError(f"{cert}: no PEM certificate in it")
    now = now or datetime.now(UTC)
    leaf: tuple[int, datetime] | None = None
    for index, block in enumerate(blocks):
        try:
            serial, _, not_after = certificate_dates(binascii.a2b_base64(block))
        except (ValueError, binascii.Error) as exc:
            raise PairError(f"{cert}: certificate {index + 1} is not a readable X.509 certificate ({exc})") from None
        if not_after <= now:
            which = "the certificate" if index == 0 else f"certificate {index + 1} of the chain"
            raise PairError(f"{cert}: {which} (serial {serial:x}) expired at {not_after:%Y-%m-%dT%H:%M:%SZ}")
        leaf = leaf or (serial, not_after)
    assert leaf is not None
    if not os.path.exists(key_real):
        raise PairError(f"{key}: cannot be read (No such file or directory)")
    context = server_context()
    try:
        context.load_cert_chain(cert_real, key_real, password=_no_password)
    except _Encrypted:
        raise PairError(f"{key}: the key is encrypted (a kubernetes.io/tls Secret's key is not)") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise PairError(f"{key}: does not match the certificate in {cert}") from None
        raise PairError(f"{key}: not a private key OpenSSL can read ({exc.reason or exc})") from None
    except OSError as exc:
        raise PairError(f"{key}: cannot be read ({exc.strerror or exc})") from None
    return Pair(context, *leaf)


class _Encrypted(Exception):
    pass


def _no_password() -> bytes:
    """Asked for only when the key is encrypted: never a prompt on a terminal."""
    raise _Encrypted


class Certificate:
    """The context a server listens with (`listener`), serving the pair in `directory` and the
    renewals that pass `load_pair`'s checks once `following`. `changed` hears of the pair served
    from the start (outcome None) and of every change seen: LOADED, or REFUSED (the pair before it
    still served); it is called from the polling thread."""

    def __init__(self, directory: Path, changed: Changed | None = None, poll_seconds: float = POLL_SECONDS) -> None:
        self.directory = directory
        self.poll_seconds = poll_seconds
        self._paths = (directory / CERT_FILE, directory / KEY_FILE)
        self._changed = changed or _unheard
        self._seen = identity(self._paths)
        self.pair = load_pair(directory)  # PairError at the start: the caller ends the program
        self.listener = self.pair.context
        self.listener.sni_callback = self._select
        self._changed(None, self.pair)

    def _select(self, connection: ssl.SSLObject, _name: str | None, _context: ssl.SSLContext) -> None:
        """Each handshake (on the loop): the context of the pair served now."""
        served = self.pair.context
        if served is not self.listener:
            connection.context = served

    def check(self) -> str | None:
        """One poll: None when the files are as last seen (or changed while being read: the next
        poll reads them again), else what became of the new pair."""
        seen = identity(self._paths)
        if seen == self._seen:
            return None
        try:
            pair = load_pair(self.directory)
        except PairError as exc:
            if identity(self._paths) != seen:
                return None
            self._seen = seen
            log.error("TLS: refused the renewed pair: %s; still serving %s", exc, self.pair.describe())
            self._changed(REFUSED, self.pair)
            return REFUSED
        if identity(self._paths) != seen:
            return None
        self._seen = seen
        self.pair = pair  # from the next handshake on (`_select`)
        log.info("TLS: serving the renewed %s (%s)", self._paths[0], pair.describe())
        self._changed(LOADED, pair)
        return LOADED

    @contextmanager
    def following(self) -> Iterator[None]:
        """Poll the files in a thread of their own while the context is open."""
        stop = threading.Event()
        thread = threading.Thread(target=self._follow, args=(stop,), name="tls-certificate", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)

    def _follow(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_seconds):
            try:
                self.check()
            except Exception:  # never the end of the polling: the next round tries again
                log.exception("TLS: checking %s failed", self.directory)


def _unheard(_outcome: str | None, _pair: Pair) -> None:
    pass


# --- a certificate's serial number and dates, from its DER -------------------------------------------


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """The DER element at `at`: its tag, and where its content starts and ends."""
    if at + 2 > len(der):
        raise ValueError("truncated")
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        size = length & 0x7F
        if not 1 <= size <= 4 or at + size > len(der):
            raise ValueError("bad length")
        length = int.from_bytes(der[at : at + size], "big")
        at += size
    if at + length > len(der):
        raise ValueError("truncated")
    return tag, at, at + length


_SEQUENCE, _INTEGER, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0x02, 0xA0, 0x17, 0x18


def certificate_dates(der: bytes) -> tuple[int, datetime, datetime]:
    """(serial number, notBefore, notAfter) of an X.509 certificate (RFC 5280 4.1: Certificate ->
    tbsCertificate -> [0] version, serialNumber, signature, issuer, validity)."""
    tag, start, _ = _element(der, 0)
    if tag != _SEQUENCE:
        raise ValueError("not a certificate")
    tag, at, _ = _element(der, start)
    if tag != _SEQUENCE:
        raise ValueError("not a certificate")
    tag, start, end = _element(der, at)
    if tag == _VERSION:
        tag, start, end = _element(der, end)
    if tag != _INTEGER:
        raise ValueError("no serial number")
    serial = int.from_bytes(der[start:end], "big", signed=True)
    _, _, end = _element(der, end)  # the signature algorithm
    _, _, end = _element(der, end)  # the issuer
    tag, start, _ = _element(der, end)
    if tag != _SEQUENCE:
        raise ValueError("no validity")
    before_tag, before_start, before_end = _element(der, start)
    after_tag, after_start, after_end = _element(der, before_end)
    return (
        serial,
        _time(before_tag, der[before_start:before_end]),
        _time(after_tag, der[after_start:after_end]),
    )


def _time(tag: int, value: bytes) -> datetime:
    text = value.decode("ascii")
    if tag == _UTC_TIME:  # YYMMDDHHMMSSZ: 1950-2049 (RFC 5280 4.1.2.5.1)
        parsed = datetime.strptime(text, "%y%m%d%H%M%SZ")
        year = parsed.year if parsed.year < 2050 else parsed.year - 100
        return parsed.replace(year=year, tzinfo=UTC)
    if tag == _GENERALIZED_TIME:
        return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)
    raise ValueError("not a time")
