"""Keys with names, through a real sidecar process in front of the replay engine: a flooding key waits
its turn behind the others' at a full engine (the fair share), limits answer 429 in OpenAI's shape
with the reason and a Retry-After, an expired key is refused, a hashed entry is a key, and usage is
counted by key name (never for an unknown key). Asserted on the sidecar's own series."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.sidecar import ReplayEngine, SecretDir, Sidecar, launch_sidecar, stop_sidecar, wait_ready
from modelserve.contracts.key_entries import hash_key
from modelserve_sandbox.processes import wait_until

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
KEYS = {
    "team-a": "key-of-team-a",
    "team-b": "key-of-team-b",
    "capped": "key-of-capped",
    "expired": "key-of-expired",
}
FLOOD = 10
SECRETS: dict[str, SecretDir] = {}  # the module's key Secret mount, as the fixture wrote it


@pytest.fixture(scope="module")
def keyed_sidecar(replay: ReplayEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar whose engine takes 2 requests at once, with named keys: team-a in plaintext (as
    every Secret so far), team-b hashed with weight 1, capped with limits, expired."""
    base = tmp_path_factory.mktemp("keyed-sidecar")
    secret = SECRETS["keys"] = SecretDir(base / "keys")
    secret.write(
        {
            "team-a": KEYS["team-a"] + "\n",
            "team-b": json.dumps({"keys": [hash_key(KEYS["team-b"])]}),
            "capped": json.dumps({"keys": [hash_key(KEYS["capped"])], "maxInFlight": 1, "requestsPerMinute": 3}),
            "expired": json.dumps({"keys": [hash_key(KEYS["expired"])], "expires": "2020-01-01T00:00:00Z"}),
        }
    )
    env = {"MODELSERVE_KEYS_DIR": str(base / "keys"), "MODELSERVE_ENGINE_CONCURRENCY": "2"}
    sidecar = launch_sidecar(base / "logs", replay.url, "tiny", env)
    try:
        wait_ready(sidecar)  # the flood's first requests must not find it starting
        yield sidecar
    finally:
        stop_sidecar(sidecar)


def chat(sidecar: Sidecar, key: str, **headers: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **headers}
    return httpx.post(sidecar.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=60)


def series(sidecar: Sidecar, name: str, **labels: str) -> float:
    """One series' value in the sidecar's /metrics (0 when it is not there)."""
    text = httpx.get(sidecar.url + "/metrics", timeout=10).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def test_a_flooding_key_delays_itself_not_the_others(keyed_sidecar: Sidecar) -> None:
    """team-a sends FLOOD slow requests at an engine that takes 2; while most of them wait, team-b's
    one request is served in its turn: when its answer is in, team-a still has requests waiting.
    In one queue for all (first come, first served) team-b's would come after all of team-a's."""
    slow = {"x-replay-stall": "1.0"}
    with ThreadPoolExecutor(FLOOD) as pool:
        flood = [pool.submit(chat, keyed_sidecar, KEYS["team-a"], **slow) for _ in range(FLOOD)]
        waiting = lambda: series(keyed_sidecar, "modelserve_sidecar_key_waiting_requests", key="team-a", model="tiny")  # noqa: E731
        wait_until(lambda: waiting() >= FLOOD - 3, 30, "team-a's requests to wait their turn")
        answer = chat(keyed_sidecar, KEYS["team-b"], **slow)
        still_waiting = waiting()
        assert answer.status_code == 200
        assert all(f.result().status_code == 200 for f in flood)
    assert still_waiting >= 1, "team-b's request was served only after all of team-a's"
    requests = "modelserve_sidecar_key_requests_total"
    assert series(keyed_sidecar, requests, key="team-a", model="tiny") >= FLOOD
    assert series(keyed_sidecar, requests, key="team-b", model="tiny") >= 1
    # The engine's usage (28 prompt, 8 completion tokens per answer), counted by name.
    prompt = series(keyed_sidecar, "modelserve_sidecar_key_tokens_total", key="team-b", model="tiny", kind="prompt")
    assert prompt >= 28 and prompt % 28 == 0


def test_limits_answer_429_with_the_reason_and_unknown_keys_count_nothing(keyed_sidecar: Sidecar) -> None:
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(chat, keyed_sidecar, KEYS["capped"], **{"x-replay-stall": "2.0"})
        in_flight = "modelserve_sidecar_key_in_flight_requests"
        wait_until(lambda: series(keyed_sidecar, in_flight, key="capped", model="tiny") == 1, 20, "capped in flight")
        second = chat(keyed_sidecar, KEYS["capped"])
        assert held.result().status_code == 200
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "in_flight" and "capped" in second.json()["error"]["message"]
    assert KEYS["capped"] not in second.text
    # Two more fill its 3 requests a minute; the next is told when to come back.
    assert [chat(keyed_sidecar, KEYS["capped"]).status_code for _ in range(2)] == [200, 200]
    over = chat(keyed_sidecar, KEYS["capped"])
    assert over.status_code == 429 and over.json()["error"]["code"] == "requests_per_minute"
    assert 1 <= int(over.headers["retry-after"]) <= 60

    expired = chat(keyed_sidecar, KEYS["expired"])
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "expired_api_key"
    assert chat(keyed_sidecar, "a-key-nobody-issued").status_code == 401

    refusals = "modelserve_sidecar_key_refusals_total"
    assert series(keyed_sidecar, refusals, key="capped", model="tiny", reason="in_flight") == 1
    assert series(keyed_sidecar, refusals, key="capped", model="tiny", reason="requests_per_minute") == 1
    assert series(keyed_sidecar, refusals, key="expired", model="tiny", reason="expired") == 1
    text = httpx.get(keyed_sidecar.url + "/metrics", timeout=10).text
    names = set(re.findall(r'key="([^"]*)"', text))
    assert names <= set(KEYS), names  # names only: no key value, nothing for the unknown key
    assert not any(value in text for value in [*KEYS.values(), "a-key-nobody-issued"])


def test_an_entry_changed_in_the_secret_takes_effect_without_a_restart(keyed_sidecar: Sidecar) -> None:
    """Revoking a key is deleting its entry: the sidecar re-reads the mount within a second."""
    keys_dir = SECRETS["keys"]
    entries = {p.name: p.read_text() for p in keys_dir.path.iterdir() if not p.name.startswith(".")}
    assert chat(keyed_sidecar, KEYS["team-b"]).status_code == 200
    keys_dir.write({name: text for name, text in entries.items() if name != "team-b"})
    wait_until(lambda: chat(keyed_sidecar, KEYS["team-b"]).status_code == 401, 10, "team-b to be revoked")
    assert chat(keyed_sidecar, KEYS["team-a"]).status_code == 200
    keys_dir.write(entries)
    wait_until(lambda: chat(keyed_sidecar, KEYS["team-b"]).status_code == 200, 10, "team-b to be back")


def test_two_replicas_share_a_key_limit(replay: ReplayEngine, tmp_path: Path) -> None:
    """Two sidecars, each told (as the operator tells each pod) that 2 replicas are ready: a key
    limited to 2 requests in flight gets 1 at each, 2 in all; told 1, each admits 2."""
    secret = SecretDir(tmp_path / "keys")
    secret.write({"shared": json.dumps({"keys": [hash_key("key-shared")], "maxInFlight": 2})})
    count = tmp_path / "replicas" / "count"
    count.parent.mkdir()
    count.write_text("2")
    env = {"MODELSERVE_KEYS_DIR": str(secret.path), "MODELSERVE_REPLICAS_FILE": str(count)}
    sidecars = [launch_sidecar(tmp_path / f"logs-{i}", replay.url, "tiny", env) for i in range(2)]
    # Long enough that both held requests are still in flight when a busy machine's polls see them
    # (2 s was not: one had finished before the other sidecar's count was read).
    slow = {"x-replay-stall": "15.0"}
    in_flight = "modelserve_sidecar_key_in_flight_requests"
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(chat, sidecar, "key-shared", **slow) for sidecar in sidecars]
            wait_until(
                lambda: all(series(s, in_flight, key="shared", model="tiny") == 1 for s in sidecars), 20, "one each"
            )
            refused = [chat(sidecar, "key-shared").status_code for sidecar in sidecars]
            assert [h.result().status_code for h in held] == [200, 200]
        assert refused == [429, 429]

        count.write_text("1")  # one replica left: it alone carries the whole limit
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(chat, sidecars[0], "key-shared", **slow)
            wait_until(lambda: series(sidecars[0], in_flight, key="shared", model="tiny") == 1, 20, "one in flight")
            wait_until(lambda: chat(sidecars[0], "key-shared").status_code == 200, 10, "the whole limit at one replica")
            assert first.result().status_code == 200
    finally:
        for sidecar in sidecars:
            stop_sidecar(sidecar)
