"""The request pipeline's lifecycle rules (modelserve/http/pipeline.py), checked after a test's traffic:
every request ended (none left open), every upstream pick released, no rule seen broken. The sidecar
and gateway fixtures run this before they stop a proxy, so every test of a proxy checks the rules for
whatever its requests did (streams, refusals, hang-ups, retries, drains)."""

from __future__ import annotations

import time
from collections.abc import Callable

from modelserve.http.pipeline import Ledger

# The pipeline's counts: requests open, upstreams held, and each broken rule's count.
Counts = tuple[float, float, dict[str, float]]
# How long a request answered to its client may still take to end in the proxy (its task's last
# line runs after the client read the answer), on a busy machine.
SETTLE_SECONDS = 15.0


def counts_in(text: str, prefix: str) -> Counts:
    """The counts from a Prometheus scrape of a proxy whose series start with `prefix`."""
    opened = held = 0.0
    broken: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{prefix}_pipeline_requests_open "):
            opened = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{prefix}_pipeline_upstreams_held "):
            held = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f'{prefix}_pipeline_rules_broken_total{{rule="'):
            rule = line.split('"')[1]
            broken[rule] = float(line.rsplit(" ", 1)[1])
    return opened, held, broken


def ledger_counts(ledger: Ledger) -> Counts:
    return float(ledger.in_flight), float(ledger.held), {rule: float(n) for rule, n in ledger.broken.items()}


def assert_rules_kept(read: Callable[[], Counts], what: str) -> None:
    """Wait (bounded) until nothing is open or held, then assert that no rule was seen broken."""
    deadline = time.monotonic() + SETTLE_SECONDS
    opened, held, broken = read()
    while (opened or held) and time.monotonic() < deadline:
        time.sleep(0.1)
        opened, held, broken = read()
    assert not broken, f"{what}: request lifecycle rules broken: {broken}"
    assert (opened, held) == (0, 0), (
        f"{what}: {opened:g} requests never ended, {held:g} upstream picks never released, "
        f"{SETTLE_SECONDS:g} s after the test's traffic"
    )
