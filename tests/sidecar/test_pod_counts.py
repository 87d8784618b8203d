"""The counts a sidecar's workers share (http/shared_rows.py, sidecar/pod_counts.py): a key's limits
and the engine's slots are the pod's, whichever worker a request reaches. Two workers' views of one
mapping, in one process (the real process tree is tests/sidecar/test_sidecar_workers.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from modelserve.contracts.key_entries import KeyEntry, KeyLimits
from modelserve.http.shared_rows import SharedRows, name_hash
from modelserve.sidecar.fair_share import FairShare
from modelserve.sidecar.key_limits import (
    IN_FLIGHT,
    IN_FLIGHT_RETRY_SECONDS,
    REQUESTS_PER_MINUTE,
    TOKENS_PER_MINUTE,
    KeyLimiter,
)
from modelserve.sidecar.pod_counts import MAX_NAMES, WIDTH, KeyCounts, PodCounts


def two_workers() -> tuple[PodCounts, PodCounts]:
    rows = SharedRows(2, WIDTH)
    return PodCounts(rows, 0), PodCounts(rows, 1)


def entry(**limits: int) -> KeyEntry:
    return KeyEntry("a", ("k",), KeyLimits(**limits))


def test_a_keys_requests_in_flight_are_the_pods_whichever_worker_holds_them() -> None:
    first, second = two_workers()
    one, other = KeyLimiter(first, 2), KeyLimiter(second, 2)
    key = entry(max_in_flight=2)
    one.started("a", 100.0)
    assert other.refusal(key, 100.0) is None
    other.started("a", 100.0)
    assert one.refusal(key, 100.0) == (IN_FLIGHT, IN_FLIGHT_RETRY_SECONDS)
    assert other.refusal(key, 100.0) == (IN_FLIGHT, IN_FLIGHT_RETRY_SECONDS)
    one.finished("a", 0, 101.0)
    assert other.refusal(key, 101.0) is None
    assert second.elsewhere("a") == KeyCounts(0, 1, 0)


def test_the_minute_counts_add_up_across_workers_and_leave_as_they_expire() -> None:
    first, second = two_workers()
    one, other = KeyLimiter(first, 2), KeyLimiter(second, 2)
    for second_ in (100.0, 110.0):
        one.started("a", second_)
        one.finished("a", 700, second_)
    other.started("a", 120.0)
    other.finished("a", 0, 120.0)
    # When the other worker's requests leave is not known here: no Retry-After rather than a guess.
    assert other.refusal(entry(requests_per_minute=3), 130.0) == (REQUESTS_PER_MINUTE, None)
    assert one.refusal(entry(requests_per_minute=3), 130.0) == (REQUESTS_PER_MINUTE, None)
    assert one.refusal(entry(requests_per_minute=2), 130.0) == (REQUESTS_PER_MINUTE, None)
    over = other.refusal(entry(tokens_per_minute=1000), 130.0)
    assert over is not None and over[0] == TOKENS_PER_MINUTE
    # Where this worker's requests alone fill the window, it knows when one leaves it.
    one.started("b", 100.0)
    one.finished("b", 0, 100.0)
    assert one.refusal(KeyEntry("b", ("k",), KeyLimits(requests_per_minute=1)), 130.0) == (REQUESTS_PER_MINUTE, 30.0)
    one.publish_all(171.0)  # both of its requests left the minute
    assert second.elsewhere("a") == KeyCounts(0, 0, 0)
    assert other.refusal(entry(requests_per_minute=2, tokens_per_minute=1000), 171.0) is None


def test_a_forgotten_names_entry_is_reused_and_the_names_after_it_are_still_found() -> None:
    first, second = two_workers()
    # Three names on one probe (the same first entry), found by the other worker in order.
    names: list[str] = []
    start = name_hash("n0") % MAX_NAMES
    for number in range(200000):
        if name_hash(name := f"n{number}") % MAX_NAMES == start:
            names.append(name)
            if len(names) == 3:
                break
    assert len(names) == 3
    for index, name in enumerate(names):
        assert first.publish(name, KeyCounts(index + 1, 0, 0))
    first.forget(names[0])
    assert [second.elsewhere(name) for name in names] == [KeyCounts(0, 0, 0), KeyCounts(2, 0, 0), KeyCounts(3, 0, 0)]
    assert first.publish("newcomer", KeyCounts(5, 0, 0))
    assert second.elsewhere("newcomer") == KeyCounts(5, 0, 0)
    assert second.elsewhere(names[2]) == KeyCounts(3, 0, 0)


def test_past_the_rows_room_a_name_takes_this_workers_share_of_its_limit() -> None:
    first, _ = two_workers()
    for number in range(MAX_NAMES):
        assert first.publish(f"n{number}", KeyCounts(0, 0, 0))
    assert not first.publish("one-too-many", KeyCounts(1, 0, 0))
    limiter = KeyLimiter(first, 2)
    key = KeyEntry("one-too-many", ("k",), KeyLimits(max_in_flight=4))
    limiter.started("one-too-many", 1.0)
    assert limiter.refusal(key, 1.0) is None
    limiter.started("one-too-many", 1.0)
    assert limiter.refusal(key, 1.0) == (IN_FLIGHT, IN_FLIGHT_RETRY_SECONDS)  # 2 of 4, as with split limits


def test_a_worker_cleared_as_it_starts_gives_back_what_its_predecessor_held() -> None:
    rows = SharedRows(2, WIDTH)
    first, second = PodCounts(rows, 0), PodCounts(rows, 1)
    second.publish("a", KeyCounts(3, 3, 0))
    second.hold(2, 5, (7, 9))
    assert first.elsewhere("a") == KeyCounts(3, 3, 0) and first.slots_elsewhere() == 2
    assert first.head_elsewhere() == (7, 9) and first.virtual_elsewhere() == 5
    rows.clear(1)
    assert first.elsewhere("a") == KeyCounts(0, 0, 0) and first.slots_elsewhere() == 0
    assert first.head_elsewhere() is None and first.virtual_elsewhere() == 0


def test_the_rows_are_shared_with_a_forked_worker() -> None:
    rows = SharedRows(2, WIDTH)
    pid = os.fork()
    if pid == 0:
        PodCounts(rows, 1).publish("a", KeyCounts(7, 0, 0))
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert PodCounts(rows, 0).elsewhere("a") == KeyCounts(7, 0, 0)


def test_the_engines_slots_are_the_pods_and_the_longest_waiting_request_takes_a_freed_one() -> None:
    """Capacity 2: worker A holds both; B's request waits, then A's; A frees one slot: B's request,
    waiting longer, takes it (B sees it on its next look), and A's the next one."""

    async def run() -> list[str]:
        first, second = two_workers()
        a, b = FairShare(2, first), FairShare(2, second)
        assert a.take_now("x", 1) and a.take_now("x", 1)
        assert not b.take_now("x", 1)
        gone = asyncio.get_running_loop().create_future()
        order: list[str] = []

        async def one(fair: FairShare, label: str) -> None:
            assert await fair.take("k", 1, gone, 10)
            order.append(label)

        waiting_b = asyncio.create_task(one(b, "B"))
        await asyncio.sleep(0.002)  # a later arrival (monotonic ns apart)
        waiting_a = asyncio.create_task(one(a, "A"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert a.take_now("x", 1) is False and order == []
        a.release()
        await asyncio.wait_for(waiting_b, 5)
        assert order == ["B"] and not waiting_a.done()  # A's own freed slot went to B's older request
        a.release()
        await asyncio.wait_for(waiting_a, 5)
        assert order == ["B", "A"] and a.busy == 1 and b.busy == 1
        b.release()
        assert a.take_now("x", 1)  # nobody waits anywhere: a free slot is taken at once
        return order

    assert asyncio.run(run()) == ["B", "A"]


def test_a_flooding_key_at_one_worker_waits_behind_one_turn_of_a_key_at_another() -> None:
    """Capacity 1, held at worker A; A's `flood` queues 4 requests, then B's `b` one: the slots go
    flood, b, flood, flood, flood, as in one process (the turns are the pod's)."""

    async def run() -> list[str]:
        first, second = two_workers()
        a, b = FairShare(1, first), FairShare(1, second)
        assert a.take_now("x", 1)
        gone = asyncio.get_running_loop().create_future()
        order: list[str] = []

        async def one(fair: FairShare, name: str) -> None:
            assert await fair.take(name, 1, gone, 10)
            order.append(name)

        tasks = [asyncio.create_task(one(a, "flood")) for _ in range(4)]
        await asyncio.sleep(0.002)
        tasks.append(asyncio.create_task(one(b, "b")))
        await asyncio.sleep(0.002)
        for served in range(5):
            holder = a if a.busy else b
            holder.release()
            await asyncio.wait_for(_until(lambda served=served: len(order) == served + 1), 5)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["flood", "b", "flood", "flood", "flood"]


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_an_unbounded_engine_shares_nothing() -> None:
    first, second = two_workers()
    fair = FairShare(0, first)
    assert fair.pod is None and all(fair.take_now("x", 1) for _ in range(5))
    assert second.slots_elsewhere() == 0
