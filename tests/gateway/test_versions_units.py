"""Versions of one served name (gateway/versions.py, directory.py): the weighted choice, a
conversation kept on one version, the guard's verdicts, and the directory listing the name once."""

from __future__ import annotations

import random
from collections import Counter

from modelserve.contracts.gateway import GuardReport, guards_from_json, guards_to_json
from modelserve.gateway.directory import Directory, Model, model_of
from modelserve.gateway.versions import Guard, Guards, Outcome, choose, judge, p95, tripped_in_status


def version(name: str, weight: int = 100, guard: Guard | None = None, reset: str = "", served: str = "bot") -> Model:
    return Model(
        "ns", name, True, replicas=("10.0.0.1:8080",), served_as=served, weight=weight, guard=guard, guard_reset=reset
    )


def test_a_weighted_draw_follows_the_weights() -> None:
    rng = random.Random(7)
    versions = [version("v1", 90), version("v2", 10)]
    counts = Counter(choose(versions, None, rng).name for _ in range(10_000))
    assert 8_700 < counts["v1"] < 9_300 and counts["v1"] + counts["v2"] == 10_000


def test_a_conversation_stays_on_one_version_and_conversations_split_by_weight() -> None:
    rng = random.Random(0)
    versions = [version("v1", 75), version("v2", 25)]
    prefixes = [f"user\x1fquestion {i}".encode() for i in range(4_000)]
    first = [choose(versions, p, rng).name for p in prefixes]
    assert first == [choose(versions, p, rng).name for p in prefixes]  # the same prefix, the same version
    assert 2_800 < first.count("v1") < 3_200
    # Moving weight moves only conversations to the version that gained it.
    moved = [choose([version("v1", 50), version("v2", 50)], p, rng).name for p in prefixes]
    assert not [i for i, (a, b) in enumerate(zip(first, moved, strict=True)) if a == "v2" and b == "v1"]


def test_weight_zero_takes_nothing_and_no_weight_left_is_none() -> None:
    rng = random.Random(1)
    assert {choose([version("v1", 0), version("v2", 100)], b"p", rng).name for _ in range(50)} == {"v2"}
    assert choose([version("v1", 0)], b"p", rng) is None
    assert choose([], None, rng) is None


def outcomes(ttfbs: list[float], failed: int = 0, start: float = 0.0) -> list[Outcome]:
    out = [Outcome(start + i, t, False) for i, t in enumerate(ttfbs)]
    return out + [Outcome(start + len(out) + i, None, True) for i in range(failed)]


def test_the_guard_trips_on_the_error_rate_as_soon_as_a_window_could_not_hold_it() -> None:
    guard = Guard(window=10, max_error_rate=0.1, max_ttft_ratio=2.0)
    assert judge(guard, outcomes([0.1] * 9, failed=1), outcomes([0.1] * 10)) is None  # 10%: at the limit
    report = judge(guard, outcomes([0.1] * 8, failed=2), outcomes([0.1] * 10))
    assert report is not None and report.error_rate == 0.2 and "2 of its last 10 requests failed" in report.message
    # A version failing from its start: stopped at its second failure, not after a window.
    assert judge(guard, outcomes([], failed=1), []) is None
    early = judge(guard, outcomes([], failed=2), [])
    assert early is not None and early.requests == 2 and "more than 10% of a window of 10" in early.message


def test_the_time_to_first_byte_is_judged_on_full_windows_only() -> None:
    guard = Guard(window=10, max_error_rate=0.1, max_ttft_ratio=2.0)
    assert judge(guard, outcomes([5.0] * 9), outcomes([0.1] * 10)) is None
    assert judge(guard, outcomes([5.0] * 10), outcomes([0.1] * 10)) is not None


def test_the_guard_trips_on_the_p95_time_to_first_byte_against_the_stable_versions() -> None:
    guard = Guard(window=20, max_error_rate=0.5, max_ttft_ratio=2.0)
    stable = outcomes([0.1] * 19 + [0.2])
    assert p95([o.ttfb for o in stable]) == 0.1
    assert judge(guard, outcomes([0.19] * 20), stable) is None
    report = judge(guard, outcomes([0.1] * 18 + [0.5, 0.5]), stable)  # two slow of twenty: the p95
    assert report is not None and report.p95_seconds == 0.5 and report.stable_p95_seconds == 0.1
    assert "5.0x the stable versions' 0.10 s" in report.message
    # 5x, but 40 ms slower only: below the slowdown that counts (scheduling noise on short answers).
    short = outcomes([0.01] * 19 + [0.02])
    assert judge(guard, outcomes([0.01] * 18 + [0.05, 0.05]), short) is None
    assert judge(Guard(window=20, max_ttft_ratio=2.0, min_slowdown=0.0), outcomes([0.01] * 18 + [0.05, 0.05]), short)
    # Without a full window of the stable versions there is nothing to compare with.
    assert judge(guard, outcomes([0.5] * 20), outcomes([0.1] * 19)) is None


def test_guards_stop_a_version_until_its_reset_annotation_changes() -> None:
    clock = iter(range(10_000))
    guards = Guards(clock=lambda: float(next(clock)))
    stable = version("v1")
    canary = version("v2", guard=Guard(window=10, max_error_rate=0.1))
    both = [stable, canary]
    for _ in range(10):
        assert guards.record(stable, both, 0.1, False) is None
    reports = [guards.record(canary, both, None, True) for _ in range(2)]
    assert reports[0] is None and reports[1] is not None
    assert guards.tripped(canary) and not guards.tripped(stable)
    assert guards.reports() == {("ns", "v2"): ("", reports[1])}
    assert guards.tripped(canary)  # the same reset value: still tripped
    assert not guards.tripped(version("v2", guard=canary.guard, reset="2026-11-26T20:00:00Z"))
    assert guards.reports() == {}


def test_the_status_trip_holds_under_its_reset_value_only() -> None:
    status = {"guard": {"tripped": True, "reset": "a", "message": "m"}}
    assert tripped_in_status(status, "a") and not tripped_in_status(status, "b")
    assert not tripped_in_status({"guard": {"tripped": False, "reset": "a"}}, "a")
    assert not tripped_in_status({}, "")


def test_guard_reports_round_trip_through_json() -> None:
    report = GuardReport("why", 10, 0.2, 0.5, None)
    assert guards_from_json(guards_to_json({("ns", "v2"): ("r", report)})) == {("ns", "v2"): ("r", report)}


def test_versions_of_a_served_name_resolve_together_and_list_once() -> None:
    directory = Directory()
    body = {
        "metadata": {"namespace": "ns", "name": "bot-v2", "annotations": {"serving.modelserve.dev/guard-reset": "x"}},
        "spec": {"traffic": {"servedName": "bot", "weight": 10, "guard": {"window": 20}}},
        "status": {"guard": {"tripped": True, "reset": "x"}},
    }
    v2 = model_of(body, [])
    assert (v2.served, v2.weight, v2.guard, v2.guard_reset, v2.tripped_in_status) == (
        "bot",
        10,
        Guard(window=20, max_error_rate=0.1, max_ttft_ratio=2.0, min_slowdown=0.2),
        "x",
        True,
    )
    v1 = model_of({"metadata": {"namespace": "ns", "name": "bot-v1"}, "spec": {"traffic": {"servedName": "bot"}}}, [])
    directory.put(v1)
    directory.put(v2)
    assert [m.name for m in directory.versions("bot")] == ["bot-v1", "bot-v2"]
    assert directory.versions("ns/bot:latest") == directory.versions("bot")
    assert directory.versions("bot-v1") == ()  # a version is served under the name it is a version of
    assert directory.listed_name(v1) == directory.listed_name(v2) == "bot"
    directory.remove(v1.key)
    assert [m.name for m in directory.versions("bot")] == ["bot-v2"]
    directory.remove(v2.key)
    assert directory.versions("bot") == ()
