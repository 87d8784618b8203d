"""Each owner's share of the event loop for reading bodies (http/loop_share.py), on a clock the test
moves: within its share a body is read on the loop, past it off the loop, and the share refills; and
the pipeline's choice from it and the threshold of values (pipeline.reads_off_loop)."""

from __future__ import annotations

from modelserve.http import loop_share
from modelserve.http.json_body import MANY_VALUES, value_count
from modelserve.http.loop_share import LoopShare
from modelserve.http.pipeline import Pipeline


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_owner_within_its_share_reads_on_the_loop_and_past_it_off_the_loop() -> None:
    share = LoopShare(10_000, Clock())
    assert share.take("a", 6_000)
    assert not share.take("a", 6_000)  # 4,000 left: this one is read off the loop, the share untouched
    assert share.take("a", 4_000)
    assert not share.take("a", 1)


def test_a_body_larger_than_the_whole_share_is_always_read_off_the_loop() -> None:
    clock = Clock()
    share = LoopShare(10_000, clock)
    for _ in range(3):
        assert not share.take("a", 10_001)
        clock.now += 60
    assert share.take("a", 10_000)


def test_a_share_refills_at_its_rate_up_to_one_seconds_worth() -> None:
    clock = Clock()
    share = LoopShare(10_000, clock)
    assert share.take("a", 10_000)
    clock.now += 0.5
    assert not share.take("a", 5_001)
    assert share.take("a", 5_000)
    clock.now += 3600  # an hour idle gives one second's share, not an hour's
    assert share.take("a", 10_000)
    assert not share.take("a", 1)


def test_each_owner_has_a_share_of_its_own() -> None:
    share = LoopShare(10_000, Clock())
    assert share.take(("key", "k1"), 10_000)
    assert not share.take(("key", "k1"), 1)
    assert share.take(("key", "k2"), 10_000)
    assert share.take(("client", "10.0.0.1"), 10_000)


def test_owners_whose_share_refilled_are_forgotten_past_the_bound() -> None:
    clock = Clock()
    share = LoopShare(10_000, clock)
    for number in range(loop_share.MAX_OWNERS):
        share.take(number, 1)
    assert share.owners() == loop_share.MAX_OWNERS
    clock.now += 1  # every one of them refilled whole: nothing is lost by forgetting it
    assert share.take("busy", 10_000)
    assert share.owners() == 1
    assert not share.take("busy", 1)  # the owner that spent its share is remembered


def test_the_pipeline_counts_a_body_once_for_the_threshold_and_the_share() -> None:
    pipeline = Pipeline({}, 1 << 20)
    many = b"[" + b"1," * MANY_VALUES + b"1]"
    few = b"[" + b"1," * 9_999 + b"1]"
    assert value_count(many) > MANY_VALUES and value_count(few) == 10_001
    assert not pipeline.reads_off_loop(many, "a")  # no share: a proxy without one reads none off the loop
    pipeline.loop_share = share = LoopShare(100_000, Clock())
    assert pipeline.reads_off_loop(many, "a")  # too many values for the loop: its share untouched
    # Each body spends its values once: nine fit in the share whole, the tenth is read off the loop.
    assert [pipeline.reads_off_loop(few, "a") for _ in range(10)] == [False] * 9 + [True]
    assert not pipeline.reads_off_loop(few, "b")  # another owner's share is its own
    assert not pipeline.reads_off_loop(b"", "c") and share.owners() == 2  # no body: nothing counted
