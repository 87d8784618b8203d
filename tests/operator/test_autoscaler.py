"""The autoscaler's pure decision, sample by sample and over load traces (replicas follow the
decision at once here; the simulator with cold starts is in the benchmark)."""

from __future__ import annotations

import itertools

from harness.load_traces import (
    autoscaler_rule,
    burst,
    diurnal,
    flapping_bait,
    ramp,
    simulate,
    spike_then_idle,
)
from modelserve.api.replicas import autoscaled, desired_replicas
from modelserve.api.spec import Replicas
from modelserve.kube.pods import readable
from modelserve.operator.autoscaler import History, Load, Policy, decide, recommendation
from modelserve.operator.status import transitions

POLICY = Policy(min=1, buffer=1, max=10, target=8, scale_down_delay=300, idle_window=600)
TO_ZERO = Policy(min=0, buffer=1, max=10, target=8, scale_down_delay=300, idle_window=600)


def test_the_worked_example() -> None:
    # (in flight, held, seconds since the last request) -> replicas, min 1, buffer 1, max 10, 8 each
    table = [
        (0, 0, None, 1),  # never used: min
        (0, 0, 30, 1),  # active, nothing in flight: 0 needed + 1 buffer = min
        (5, 0, 0, 2),  # 1 needed + 1 buffer
        (8.8, 0, 0, 2),  # 10% over one replica's target is tolerated
        (9, 0, 0, 3),
        (40, 0, 0, 6),
        (400, 0, 0, 10),  # max
    ]
    for in_flight, held, ago, replicas in table:
        load = Load(1000.0, in_flight, held, None if ago is None else 1000.0 - ago)
        assert recommendation(POLICY, load) == replicas, (in_flight, held, ago)
    # min 0: idle past the window is zero; the buffer does not keep it awake, a held request wakes it
    assert recommendation(TO_ZERO, Load(1000.0, 0, 0, 1000.0 - 601)) == 0
    assert recommendation(TO_ZERO, Load(1000.0, 0, 0, 1000.0 - 30)) == 1
    assert recommendation(TO_ZERO, Load(1000.0, 0, 1, None)) == 2


def test_the_idle_window_keeps_the_last_replica_of_a_min_zero_model() -> None:
    # min 0, buffer 0, no delay: a model woken by one request stays up for the idle window, and
    # goes to zero only once no request arrived for that long (it went 1 -> 0 a second after answering).
    policy = Policy(min=0, buffer=0, max=4, target=4, scale_down_delay=0, idle_window=30)
    answered_at = 100.0
    history, current = History(0.0), 1
    for at in (101.0, 110.0, 129.0):
        decision, history = decide(policy, history, Load(at, 0, 0, answered_at), current)
        assert (decision.replicas, decision.reason) == (1, "Steady"), (at, decision)
    decision, _ = decide(policy, history, Load(131.0, 0, 0, answered_at), current)
    assert (decision.replicas, decision.reason) == (0, "ScaleDown"), decision
    # The floor of one is for min 0 alone: min 1 with a buffer keeps what it kept (min, not min + 1).
    assert recommendation(POLICY, Load(1000.0, 0, 0, 1000.0 - 30)) == 1


def _run(policy: Policy, loads: list[tuple[float, float]], current: int, since: float = 0.0) -> list[int]:
    """Replicas after each (time, in flight) sample, each decision followed at once."""
    history, seen = History(since), []
    for at, in_flight in loads:
        decision, history = decide(policy, history, Load(at, in_flight, 0, at if in_flight else None), current)
        current = decision.replicas
        seen.append(current)
    return seen


def test_up_at_once_down_only_after_the_delay_and_at_most_halving() -> None:
    replicas = _run(POLICY, [(t, 60.0) for t in range(0, 10, 2)], current=1)
    assert replicas[0] == 9  # ceil(60 / 8) + 1 buffer, on the first sample
    quiet = [(t, 0.0) for t in range(10, 1400, 2)]
    down = _run(POLICY, quiet, current=9)
    first_drop = next(i for i, r in enumerate(down) if r < 9)
    assert quiet[first_drop][0] >= 300  # the burst's recommendation holds for the whole delay
    assert down[-1] == 1 and all(after >= before // 2 for before, after in itertools.pairwise([9, *down]))
    assert len(set(down)) > 3  # it took steps


def test_after_a_restart_nothing_is_scaled_down_before_a_whole_delay_is_seen() -> None:
    # A new process at t=5000 sees 8 replicas and no load: it has not seen the last 300 s.
    replicas = _run(POLICY, [(t, 0.0) for t in range(5000, 5290, 2)], current=8, since=5000.0)
    assert set(replicas) == {8}


def test_loading_pods_count_as_capacity() -> None:
    # The same burst, sampled while the new pods load: no second scale-up.
    assert _run(POLICY, [(t, 30.0) for t in range(0, 240, 2)], current=1) == [5] * 120


def test_a_loading_replica_is_never_the_reason_to_scale_down() -> None:
    quiet = Load(1000.0, 0, 0, None, loading=1)
    decision, _ = decide(POLICY, History(0.0), quiet, current=4)
    assert decision.replicas == 4
    decision, _ = decide(POLICY, History(0.0), Load(1000.0, 0, 0, None), current=4)
    assert (decision.replicas, decision.reason) == (2, "ScaleDown")


def test_scale_from_zero_within_one_decision() -> None:
    decision, _ = decide(TO_ZERO, History(0.0), Load(10.0, 0, 1, 10.0), current=0)
    assert (decision.replicas, decision.reason) == (2, "ScaleUp")


def test_a_lowered_max_applies_at_once() -> None:
    decision, _ = decide(POLICY, History(0.0), Load(10.0, 200, 0, 10.0), current=12)
    assert (decision.replicas, decision.reason) == (10, "ScaleDown")


def test_traces_flapping_bait_does_not_flap() -> None:
    outcome = simulate(flapping_bait(), autoscaler_rule(POLICY), start_replicas=2)
    settled = [replicas for at, replicas, _ in outcome.timeline if at >= 600]  # after the first load arrives
    changes = sum(1 for before, after in itertools.pairwise(settled) if before != after)
    assert changes == 0, outcome.timeline[300:360]


def test_traces_spike_then_idle_reaches_zero_and_only_after_the_idle_window() -> None:
    outcome = simulate(spike_then_idle(), autoscaler_rule(TO_ZERO), start_replicas=0)
    at_zero = [at for at, replicas, _ in outcome.timeline if replicas == 0 and at > 60]
    assert at_zero, outcome.timeline[-5:]
    assert at_zero[0] >= 60 + 600  # no request for the idle window, and the delay passed
    assert outcome.timeline[-1][1] == 0


def test_traces_a_burst_is_answered_at_once() -> None:
    outcome = simulate(burst(), autoscaler_rule(POLICY), start_replicas=2)
    up = next(at for at, replicas, _ in outcome.timeline if replicas > 2)
    assert 900 <= up <= 904  # the burst starts at 900 s; one or two decisions later


def _pod(container_id: str | None, ip: str | None = "10.88.0.5") -> dict:
    sidecar = {"name": "sidecar", "state": {"running": {}}, **({"containerID": container_id} if container_id else {})}
    return {"metadata": {"name": "m-1"}, "status": {"podIP": ip, "containerStatuses": [sidecar]}}


def test_only_pods_a_runtime_started_are_read() -> None:
    assert readable(_pod("containerd://abc"))
    assert not readable(_pod(None))  # a KWOK pod: nothing listens at its address
    assert not readable(_pod("containerd://abc", ip=None))
    leaving = _pod("containerd://abc")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not readable(leaving)


def test_a_count_from_the_scale_subresource_turns_the_autoscaler_off() -> None:
    assert autoscaled(Replicas(min=1, max=4)) and not autoscaled(Replicas(min=2, max=2))
    fixed = Replicas(min=1, max=4, count=3)
    assert not autoscaled(fixed) and desired_replicas(fixed) == 3
    assert desired_replicas(Replicas(min=1, buffer=1, max=4)) == 2


def test_each_scaling_decision_is_an_event() -> None:
    before = {"conditions": [], "scaling": {"reason": "ScaleUp", "message": "1 -> 3 replicas", "time": "t0"}}
    after = {**before, "scaling": {"reason": "ScaleDown", "message": "3 -> 2 replicas", "time": "t1"}}
    assert [(t.type, t.reason, t.message) for t in transitions(before, after)] == [
        ("Normal", "ScaleDown", "3 -> 2 replicas")
    ]
    assert transitions(after, after) == []


def test_traces_a_ramp_is_followed_up_and_down_within_the_bounds() -> None:
    outcome = simulate(ramp(), autoscaler_rule(POLICY), start_replicas=2)
    counts = [replicas for _, replicas, _ in outcome.timeline]
    peak = counts.index(max(counts))
    assert max(counts) <= POLICY.max and min(counts) >= POLICY.min
    assert counts[:peak] == sorted(counts[:peak])  # never down on the way up
    assert counts[peak:] == sorted(counts[peak:], reverse=True)  # never up on the way down
    assert counts[-1] < max(counts)


def test_traces_a_day_scales_with_it_and_serves_it() -> None:
    outcome = simulate(diurnal(), autoscaler_rule(POLICY), start_replicas=2)
    counts = [replicas for _, replicas, _ in outcome.timeline]
    assert counts[len(counts) // 2] > counts[0] and counts[-1] < max(counts)
    assert outcome.waited == 0  # the buffer absorbs the afternoon's growth while replicas start
    assert outcome.scale_events <= 12
