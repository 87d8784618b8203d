"""The pod's view across its workers (workers.py): what each sibling says of itself, asked over its
unix socket, and the merges that make one answer of them (pure): Prometheus series summed (counters,
histograms, counts in flight), a few taken at their lowest or highest."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from .shared_rows import SharedRows
from .workers import sibling_address

log = logging.getLogger(__name__)

ASK_TIMEOUT_SECONDS = 5.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024

# Samples that are not amounts: the earliest start (and certificate expiry), the highest ceiling;
# every other sample is summed.
LOWEST = ("_start_time_seconds", "_created", "_expiry_timestamp_seconds")
HIGHEST = ("_max_fds", "_warmup_duration_seconds")


class Siblings:
    """The other workers of this process's parent, asked over their unix sockets; `index` is this one's.
    `rows`: the counts they share, when the program asked for some (shared_rows.py)."""

    def __init__(self, parent: int, count: int, own: int, rows: SharedRows | None = None) -> None:
        self.index = own
        self.rows = rows
        self.primary = sibling_address(parent, 0)
        self.addresses = [sibling_address(parent, index) for index in range(count) if index != own]

    async def ask_all(self, path: str, headers: Sequence[tuple[str, str]] = ()) -> list[bytes]:
        """Each sibling's answer body to GET `path` (a sibling that does not answer 200 is left out)."""
        answers = await asyncio.gather(*(ask(a, path, headers) for a in self.addresses), return_exceptions=True)
        bodies = []
        for address, answer in zip(self.addresses, answers, strict=True):
            if isinstance(answer, Answer) and answer.status == 200:
                bodies.append(answer.body)
            else:  # stopping, or restarting: its share is missing from this answer only
                log.warning("worker %s did not answer %s: %s", address.rsplit("-", 1)[-1], path, answer)
        return bodies


def for_the_pod(siblings: Siblings | None, scope: Mapping[str, Any]) -> Siblings | None:
    """The siblings to ask when a request answers for the pod (its workers together): one that came
    on the port. On a worker's unix socket (no server address in the scope) it answers for that
    worker alone; without workers there is nobody to ask."""
    return siblings if siblings is not None and scope.get("server") is not None else None


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


async def ask(address: str, path: str, headers: Sequence[tuple[str, str]] = ()) -> Answer:
    """GET `path` from the worker at `address`."""
    reader, writer = await asyncio.wait_for(_connect(address), ASK_TIMEOUT_SECONDS)
    try:
        head = f"GET {path} HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers)
        writer.write((head + "\r\n").encode("latin-1"))
        answer = await asyncio.wait_for(_read_to_end(reader), ASK_TIMEOUT_SECONDS)
    finally:
        writer.close()
    return parse_answer(answer)


async def _connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    # Connected here: uvloop refuses an abstract address (the leading NUL) as a path.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_unix_connection(sock=sock)


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    parts, size = [], 0
    while part := await reader.read(65536):
        parts.append(part)
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            raise ValueError(f"answer over {MAX_ANSWER_BYTES} bytes")
    return b"".join(parts)


def parse_answer(answer: bytes) -> Answer:
    """A whole HTTP/1.1 answer read to its close (its body Content-Length framed or chunked)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or not status[1].isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:40]!r}")
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines[1:])}
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _unchunk(body)
    elif b"content-length" in fields:
        body = body[: int(fields[b"content-length"])]
    return Answer(int(status[1]), fields.get(b"content-type", b"").decode("latin-1"), body)


def _unchunk(body: bytes) -> bytes:
    parts, at = [], 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end].split(b";")[0], 16)
        if size == 0:
            return b"".join(parts)
        parts.append(body[line_end + 2 : line_end + 2 + size])
        at = line_end + 2 + size + 2


def merge_metrics(texts: Iterable[str]) -> bytes:
    """One exposition of several processes' series: samples with the same name and labels combined
    (summed, or LOWEST / HIGHEST as their names say), families in the order first seen."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = samples.get(key)
                samples[key] = sample.value if before is None else _combine(sample.name, before, sample.value)
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))  # type: ignore[arg-type]  # no describe()
    return generate_latest(registry)


def _combine(name: str, a: float, b: float) -> float:
    if name.endswith(LOWEST):
        return min(a, b)
    if name.endswith(HIGHEST):
        return max(a, b)
    return a + b


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families
