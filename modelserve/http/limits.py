"""What one client may take of a proxy before any check: the bounds every connection of the sidecar
and the gateway gets from the server's protocol (direct.py), whichever lane serves its requests.

Why here, below the proxies: a request's key, model and body are checked only once its head (and
for most routes its body) is in, and until then nothing else bounded what a connection could hold:
a header section sent forever was buffered whole, a connection that sent half a request stayed open
for good, and enough of those exhausted the process's file descriptors (the kubelet's probes
included). These bounds hold for every connection, with or without a key:

- the request head (request line and headers, trailers too) in bytes and in fields: 431 and close;
- a deadline for the head, from the connection's start or the first byte of the request, and one
  for the body, from the end of the head: 408 and close (nothing at all sent: closed silently);
- connections per process: at the cap a new connection takes the place of the oldest one that has
  no complete request being served (a slow or idle one), so a flood of idle connections never locks
  out a new one, the kubelet's probes included; with none to take (every connection serving a
  request: a key holder's slow requests), it is one of RESERVED_CONNECTIONS past the cap that may ask
  the server's own routes only (health, readiness, load, metrics): the probes' answers never depend
  on what clients hold; past those, 503 and close;
- request bodies being received, process-wide: a budget no client can hold for the others. When a
  body's bytes would cross it, the client (`client_bucket`: its address) holding the most of it gives
  way: its body whose last bytes came longest ago is cut (503 and close), again until the arriving
  bytes fit. So stalled bodies, with or without a key, give way to a request that is being sent, and
  a client keeping many bodies fresh (issue 57 N14: touching each just before it sends more) cuts its
  own, never another client's smaller upload. Clients behind one address share one part.
"""

from __future__ import annotations

import ipaddress
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from . import errors, ollama

# Descriptors kept for everything but client connections: the upstream's connections are counted
# apart (one per client connection at most), plus files, the key reload, the probes' own sessions,
# and the connections past the cap kept for the server's own routes.
RESERVED_DESCRIPTORS = 128
# Connections past the cap for the server's own routes (the kubelet's probes, the autoscaler's load,
# a scrape), when every connection within it serves a request.
RESERVED_CONNECTIONS = 32


class LimitSettings(Protocol):
    """The fields both programs' settings have (the sidecar's contract, the gateway's settings)."""

    max_head_bytes: int
    max_header_fields: int
    head_timeout_seconds: float
    body_timeout_seconds: float
    max_connections: int
    body_budget_bytes: int
    send_timeout_seconds: float


@dataclass(frozen=True)
class ConnectionLimits:
    max_head_bytes: int = 32 * 1024  # nginx's large_client_header_buffers hold 4 x 8 KiB
    max_header_fields: int = 100
    head_seconds: float = 15.0
    body_seconds: float = 60.0
    max_connections: int = 4096
    body_budget_bytes: int = 64 * 1024 * 1024
    own_paths: frozenset[bytes] = frozenset()  # the server's own GET routes (health, load, metrics)
    # An answer waiting on a client that does not read (the transport's buffer over its high-water
    # mark, nothing taken) this long: the connection is cut (nginx's send_timeout, also 60 s).
    send_seconds: float = 60.0

    @classmethod
    def of(cls, settings: LimitSettings, own_routes: Iterable[str] = ()) -> ConnectionLimits:
        return cls(
            settings.max_head_bytes,
            settings.max_header_fields,
            settings.head_timeout_seconds,
            settings.body_timeout_seconds,
            settings.max_connections,
            settings.body_budget_bytes,
            frozenset(route.encode() for route in own_routes),
            settings.send_timeout_seconds,
        )


# Client connections a bound cut, by reason, in this process: tallied in plain numbers (the refusals
# of a flood cost no lock each), read by the proxies' metrics when scraped (http/metrics.py).
CUT_REASONS = (
    "head_too_large",
    "too_many_fields",
    "head_timeout",
    "body_timeout",
    "no_request",
    "body_budget",
    "too_many_connections",
    "evicted",
    "too_many_pipelined",
    "send_timeout",
)
CUT: dict[str, int] = dict.fromkeys(CUT_REASONS, 0)


def cut(reason: str) -> None:
    CUT[reason] += 1


IPV6_CLIENT_PREFIX = 64  # one host's usual share of IPv6: an address per request costs nothing there


def client_bucket(host: str | None) -> str:
    """Whom a per-client limit counts: the client's address, an IPv6 one by its /64."""
    if not host:
        return ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)


class BodyBudget:
    """The bytes of request bodies being received by one process (not yet complete), the connections
    holding them (the protocol's, direct.py) and each client's bytes (`client_bucket`): when it is
    full, the client holding the most gives way, its stalest body first."""

    __slots__ = ("by_client", "holders", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.holders: dict[Any, None] = {}
        self.by_client: dict[str, int] = {}

    def add(self, client: str, size: int) -> None:
        self.used += size
        self.by_client[client] = self.by_client.get(client, 0) + size

    def remove(self, client: str, size: int) -> None:
        self.used -= size
        left = self.by_client.get(client, 0) - size
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)

    def heaviest(self) -> str:
        """The client holding the most bytes (the budget holds some)."""
        return max(self.by_client, key=self.by_client.__getitem__)


def raise_file_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (as Go programs do at start:
    a container's 1024 is a common default); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(configured: int, file_limit: int) -> int:
    """Client connections at most: the configured cap, within what the file limit leaves for them
    and one upstream connection each (pure)."""
    return max(16, min(configured, (file_limit - RESERVED_DESCRIPTORS) // 2))


def refusal(status: int, message: str, code: str, ollama_shape: bool) -> bytes:
    """A whole answer of the server's own, closing the connection: the proxies' OpenAI error object
    (errors.py), or Ollama's `{"error": ...}` for a path under /api/ (pure)."""
    if ollama_shape:
        body = ollama.error_body(message)
    else:
        kind = errors.SERVER_ERROR if status >= 500 else errors.INVALID_REQUEST_ERROR
        body = errors.ErrorResponse(status, message, kind, code).body()
    retry = b"retry-after: 1\r\n" if status == 503 else b""
    return b"".join(
        (
            STATUS_LINE[status],
            b"content-type: application/json\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n",
            retry,
            b"connection: close\r\n\r\n",
            body,
        )
    )
