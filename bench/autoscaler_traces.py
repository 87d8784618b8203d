"""The autoscaler against its peers' rules on the same load traces, with the same cold start.

Rules, each deciding every `period` seconds from the requests in flight or waiting:
  - modelserve: clamp(ceil(demand / target - 10%) + buffer while active, min, max), up at once,
    down to the highest recommendation over the scale-down delay, at most halving per step;
  - fixed: min + buffer replicas, always (today's Deployment), and max replicas (sized for the peak);
  - KubeAI: moving average of in-flight over 10 readings every 10 s, / targetRequests, scaled
    down only after the lower count held for scaleDownDelaySeconds (30 s);
  - HPA: every 15 s, ceil(current x in-flight per replica / target) outside a 10% tolerance,
    down to the highest recommendation of the last 300 s, up at most doubling (or +4) per step.
All with the same replicas (min 1, buffer 1 for ours and the fixed one, max 10), 8 requests in
flight per replica, 10 s per request and a 120 s cold start (the seed's "over 2 minutes"). Prints
replica-minutes (cost), requests that waited for a free slot, the worst wait, and scale events.

    .venv/bin/python -m bench.autoscaler_traces [--cold-start 120]
"""

from __future__ import annotations

import argparse
import math
from collections import deque

from harness.load_traces import TRACES, Rule, autoscaler_rule, simulate
from modelserve.operator.autoscaler import Policy

MIN, BUFFER, MAX, TARGET = 1, 1, 10, 8


def fixed_rule(replicas: int) -> Rule:
    return lambda now, demand, last, current: replicas


def kubeai_rule(interval: int = 10, window: int = 10, scale_down_delay: float = 30) -> Rule:
    readings: deque[float] = deque(maxlen=window)
    lower_since: float | None = None
    decided = MIN

    def rule(now: float, demand: float, last: float | None, current: int) -> int:
        nonlocal lower_since, decided
        if now % interval:
            return decided
        readings.append(demand)
        wanted = max(MIN, min(MAX, math.ceil(sum(readings) / len(readings) / TARGET)))
        if wanted >= current:
            lower_since, decided = None, wanted
        else:
            lower_since = now if lower_since is None else lower_since
            decided = wanted if now - lower_since >= scale_down_delay else current
        return decided

    return rule


def hpa_rule(interval: int = 15, tolerance: float = 0.1, stabilization: float = 300) -> Rule:
    recommendations: deque[tuple[float, int]] = deque()
    decided = MIN

    def rule(now: float, demand: float, last: float | None, current: int) -> int:
        nonlocal decided
        if now % interval:
            return decided
        ratio = demand / (max(current, 1) * TARGET)
        wanted = current if abs(ratio - 1) <= tolerance else math.ceil(max(current, 1) * ratio)
        wanted = max(MIN, min(MAX, wanted, max(2 * current, current + 4)))
        recommendations.append((now, wanted))
        while recommendations[0][0] <= now - stabilization:
            recommendations.popleft()
        decided = wanted if wanted > current else max(r for _, r in recommendations)
        return decided

    return rule


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-start", type=float, default=120.0)
    parser.add_argument("--scale-down-delay", type=float, default=300.0, help="ours")
    parser.add_argument("--idle-window", type=float, default=600.0, help="ours")
    args = parser.parse_args()
    policy = Policy(MIN, BUFFER, MAX, TARGET, args.scale_down_delay, args.idle_window)
    # Each rule with the replicas it starts from (at rest: min + buffer; the fixed one at its size).
    rules = {
        "modelserve": (lambda: autoscaler_rule(policy), MIN + BUFFER),
        "fixed min+buffer": (lambda: fixed_rule(MIN + BUFFER), MIN + BUFFER),
        "fixed at max": (lambda: fixed_rule(MAX), MAX),
        "KubeAI": (kubeai_rule, MIN + BUFFER),
        "HPA": (hpa_rule, MIN + BUFFER),
    }
    print(f"cold start {args.cold_start:g} s; min {MIN}, buffer {BUFFER}, max {MAX}, {TARGET} in flight per replica")
    print(f"{'trace':<16}{'rule':<18}{'replica-min':>12}{'waited':>9}{'worst wait s':>14}{'scale events':>14}")
    for trace_name, make_trace in TRACES.items():
        trace = make_trace()
        for rule_name, (make_rule, start) in rules.items():
            outcome = simulate(trace, make_rule(), start, cold_start=args.cold_start, target=TARGET)
            print(
                f"{trace_name:<16}{rule_name:<18}{outcome.replica_minutes:>12.0f}{outcome.waited:>9}"
                f"{outcome.worst_wait:>14.0f}{outcome.scale_events:>14}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
