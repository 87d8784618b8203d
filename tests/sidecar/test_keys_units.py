"""Named keys (contracts/key_entries.py), hashed entries in the key store, each key's limits
(sidecar/key_limits.py) and the fair share of a busy engine (sidecar/fair_share.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.sidecar import SecretDir
from modelserve.contracts.key_entries import (
    EntryError,
    KeyEntry,
    KeyLimits,
    hash_key,
    parse_entry,
    parse_time,
    render_entry,
)
from modelserve.sidecar.auth import identify
from modelserve.sidecar.fair_share import FairShare
from modelserve.sidecar.key_limits import (
    IN_FLIGHT,
    IN_FLIGHT_RETRY_SECONDS,
    REQUESTS_PER_MINUTE,
    TOKENS_PER_MINUTE,
    KeyLimiter,
)
from modelserve.sidecar.keys import KeyStore
from modelserve.sidecar.replica_share import read_count


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


# --- entries ------------------------------------------------------------------------------------


def test_an_entry_of_lines_is_one_name_with_every_line_a_credential() -> None:
    entry = parse_entry("team-a", "  one \n\n\ttwo\t\n" + hash_key("three") + "\n")
    assert entry == KeyEntry("team-a", ("one", "two", hash_key("three")), KeyLimits())


def test_a_json_entry_reads_back_as_written() -> None:
    entry = KeyEntry(
        "app.prod",
        (hash_key("k"),),
        KeyLimits(max_in_flight=4, requests_per_minute=60, tokens_per_minute=20000, expires=1798761600.0, weight=3),
    )
    text = render_entry(entry)
    assert json.loads(text)["expires"] == "2027-01-01T00:00:00Z" and "k" not in json.loads(text)["keys"]
    assert parse_entry("app.prod", text) == entry


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"keys": "abc"}', "keys"),
        ('{"keys": ["sha256:abc"]}', "keys"),
        ('{"keys": ["k"], "maxInFlight": 0}', "maxInFlight"),
        ('{"keys": ["k"], "requestsPerMinute": "5"}', "requestsPerMinute"),
        ('{"keys": ["k"], "tokensPerMinute": true}', "tokensPerMinute"),
        ('{"keys": ["k"], "expires": "tomorrow"}', "expires"),
        ('{"keys": ["k"], "expires": "2027-01-01T00:00:00"}', "expires"),
        ('{"keys": ["k"], "maxInflight": 2}', "maxInflight"),
        ('{"keys": ["k"]', "not JSON"),
        ('{"keys": ["k"], "weight": 0}', "weight"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(EntryError, match=field):
        parse_entry("team-a", text)


def test_the_store_accepts_plaintext_and_hashed_credentials_and_skips_bad_entries(tmp_path: Path) -> None:
    secret = SecretDir(tmp_path / "keys")
    hashed = json.dumps({"keys": [hash_key("hashed-key")], "maxInFlight": 1})
    secret.write({"legacy": "plain-key\nold-key\n", "team-b": hashed, "broken": '{"keys": 1}'})
    store = KeyStore(secret.path)
    assert len(store) == 3 and [p.split(":")[0] for p in store.problems] == ["broken"]
    legacy = store.identify(b"old-key")
    assert legacy is not None and legacy.name == "legacy"
    team_b = store.identify(b"hashed-key")
    assert team_b is not None and team_b.name == "team-b" and team_b.limits.max_in_flight == 1
    # The hash itself is not a key: whoever reads the Secret cannot use it.
    assert store.identify(hash_key("hashed-key").encode()) is None
    assert store.identify(b"") is None and store.identify(b"plain") is None


def test_an_expired_key_is_refused_by_name(tmp_path: Path) -> None:
    secret = SecretDir(tmp_path / "keys")
    secret.write({"temp": json.dumps({"keys": ["temp-key"], "expires": "2027-01-01T00:00:00Z"})})
    store = KeyStore(secret.path)
    moment = parse_time("2027-01-01T00:00:00Z")
    entry, reason = identify(bearer("temp-key"), store, moment - 1)
    assert entry is not None and reason is None
    entry, reason = identify(bearer("temp-key"), store, moment)
    assert entry is not None and entry.name == "temp" and reason == "expired"
    assert identify(bearer("other"), store, moment) == (None, "invalid")


# --- limits -------------------------------------------------------------------------------------


def entry(**limits: int) -> KeyEntry:
    return KeyEntry("a", ("k",), KeyLimits(**limits))


def test_requests_in_flight_are_capped_until_one_ends() -> None:
    limiter, key = KeyLimiter(), entry(max_in_flight=2)
    for _ in range(2):
        assert limiter.refusal(key, 100.0) is None
        limiter.started("a", 100.0)
    assert limiter.refusal(key, 100.0) == (IN_FLIGHT, IN_FLIGHT_RETRY_SECONDS)
    limiter.finished("a", 0, 101.0)
    assert limiter.refusal(key, 101.0) is None


def test_requests_per_minute_slide_and_say_when_there_is_room() -> None:
    limiter, key = KeyLimiter(), entry(requests_per_minute=3)
    for second in (100.0, 110.0, 120.5):
        limiter.started("a", second)
        limiter.finished("a", 0, second)
    assert limiter.refusal(key, 130.0) == (REQUESTS_PER_MINUTE, 30.0)  # the one at 100 leaves at 160
    assert limiter.refusal(key, 160.0) is None


def test_tokens_per_minute_count_what_ended() -> None:
    limiter, key = KeyLimiter(), entry(tokens_per_minute=1000)
    limiter.started("a", 10.0)
    assert limiter.refusal(key, 10.0) is None  # a stream's tokens count once it ends
    limiter.finished("a", 600, 10.0)
    limiter.started("a", 40.0)
    limiter.finished("a", 500, 40.0)
    over = limiter.refusal(key, 45.0)
    assert over is not None and over[0] == TOKENS_PER_MINUTE and over[1] == pytest.approx(25.0)
    assert limiter.refusal(key, 70.0) is None  # the 600 left the window at 70


def test_only_configured_names_keep_state() -> None:
    limiter = KeyLimiter()
    limiter.started("a", 1.0)
    limiter.started("b", 1.0)
    limiter.finished("b", 0, 1.0)
    limiter.keep_only(["c"])
    assert set(limiter.uses) == {"a"}  # b forgotten; a still has a request in flight


# --- the fair share -----------------------------------------------------------------------------


def test_a_flooding_key_waits_behind_one_turn_of_the_others() -> None:
    """Capacity 1: A queues 5 requests, then B and C one each; slots go A, B, C, A, A, A, A."""

    async def run() -> list[str]:
        fair = FairShare(1)
        assert fair.take_now("x", 1)
        order: list[str] = []
        gone = asyncio.get_running_loop().create_future()

        async def one(name: str) -> None:
            assert await fair.take(name, 1, gone, 10)
            order.append(name)

        tasks = [asyncio.create_task(one("A")) for _ in range(5)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(one("B")), asyncio.create_task(one("C"))]
        await asyncio.sleep(0)
        assert fair.waiting == 7 and fair.waiting_for("A") == 5
        for _ in range(7):
            fair.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert fair.busy == 1 and fair.waiting == 0
        return order

    assert asyncio.run(run()) == ["A", "B", "C", "A", "A", "A", "A"]


def test_a_heavier_key_takes_its_weight_per_turn() -> None:
    async def run() -> list[str]:
        fair = FairShare(1)
        assert fair.take_now("x", 1)
        order: list[str] = []
        gone = asyncio.get_running_loop().create_future()

        async def one(name: str, weight: int) -> None:
            assert await fair.take(name, weight, gone, 10)
            order.append(name)

        tasks = [asyncio.create_task(one("A", 1)) for _ in range(3)]
        tasks += [asyncio.create_task(one("B", 2)) for _ in range(4)]
        await asyncio.sleep(0)
        for _ in range(7):
            fair.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["A", "B", "B", "A", "B", "B", "A"]


def test_a_waiter_whose_client_goes_or_whose_time_runs_out_holds_no_slot() -> None:
    async def run() -> None:
        fair = FairShare(1)
        assert fair.take_now("x", 1) and not fair.take_now("x", 1)
        gone = asyncio.get_running_loop().create_future()
        waiter = asyncio.create_task(fair.take("A", 1, gone, 10))
        await asyncio.sleep(0)
        gone.set_result(None)
        assert await waiter is False
        never = asyncio.get_running_loop().create_future()
        assert await fair.take("B", 1, never, 0.01) is False
        assert fair.waiting == 0 and fair.busy == 1
        fair.release()
        assert fair.busy == 0 and fair.take_now("x", 1)

    asyncio.run(run())


def test_no_capacity_means_no_queue() -> None:
    fair = FairShare(0)
    assert all(fair.take_now("x", 1) for _ in range(1000)) and fair.waiting == 0


def test_a_line_spelt_as_a_hash_must_be_one_and_a_dot_name_is_no_name() -> None:
    with pytest.raises(EntryError, match="sha256"):
        parse_entry("legacy", "sha256:abc\n")
    with pytest.raises(EntryError, match="data key"):
        parse_entry(".team", "key\n")


def test_a_slot_freed_between_the_refusal_and_the_wait_is_not_lost() -> None:
    """The express lane hands a request that found no slot to a task, which starts later: the slots
    freed meanwhile go to it when it starts waiting, not at some later release."""

    async def run() -> None:
        fair = FairShare(1)
        assert fair.take_now("x", 1) and not fair.take_now("x", 1)
        fair.release()  # before the refused request's task waits
        never = asyncio.get_running_loop().create_future()
        assert await fair.take("A", 1, never, 5) is True
        assert fair.busy == 1 and fair.waiting == 0

    asyncio.run(run())


def test_a_waiter_cancelled_as_it_is_granted_gives_the_slot_back() -> None:
    async def run() -> None:
        fair = FairShare(1)
        assert fair.take_now("x", 1)
        never = asyncio.get_running_loop().create_future()
        waiter = asyncio.create_task(fair.take("A", 1, never, 5))
        await asyncio.sleep(0)
        fair.release()  # granted to the waiter...
        waiter.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert fair.busy == 0 and fair.waiting == 0 and fair.take_now("x", 1)

    asyncio.run(run())


def test_each_replica_enforces_its_share_rounded_up(tmp_path: Path) -> None:
    limiter, key = KeyLimiter(), entry(max_in_flight=3, requests_per_minute=10)
    limiter.started("a", 1.0)
    limiter.started("a", 1.0)
    assert limiter.refusal(key, 1.0, replicas=2) == (IN_FLIGHT, IN_FLIGHT_RETRY_SECONDS)  # 2 of ceil(3/2)
    assert limiter.refusal(key, 1.0, replicas=1) is None
    limiter.finished("a", 0, 1.0)
    limiter.finished("a", 0, 1.0)
    for _ in range(3):
        limiter.started("a", 2.0)
        limiter.finished("a", 0, 2.0)
    # 5 requests this minute: over ceil(10/2) = 5 each of 2 replicas, under ceil(10/1).
    assert limiter.refusal(key, 2.0, replicas=2) is not None
    assert limiter.refusal(key, 2.0, replicas=1) is None


def test_the_replica_count_file_reads_as_one_unless_it_says_more(tmp_path: Path) -> None:
    count = tmp_path / "count"
    assert read_count(count) == 1  # not mounted, or outside Kubernetes
    for text, expected in (("", 1), ("3", 3), ("0", 1), ("x", 1), ("2\n", 2)):
        count.write_text(text)
        assert read_count(count) == expected
