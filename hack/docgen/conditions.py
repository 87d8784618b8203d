"""docs/reference/conditions.md: the status fields, the condition types and every reason the operator
writes, read from the status code (modelserve/operator/status.py: its `Problem(...)` and `_condition(...)`
calls, the reasons of unschedulable pods; operator/traffic_guard.py for TrafficGuard), with what each
means from the Troubleshooting page, or else the message the code writes with it."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from modelserve.api import crd, spec_table
from modelserve.api.status import GuardStatus
from modelserve.operator import pools, prefetch, status, traffic_guard

from .markdown import cell, code, generated_by, table

REPO = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = REPO / "docs" / "operations" / "troubleshooting.md"

# What each condition type says when True; a type the code writes and this lacks fails the docs test.
CONDITION_TYPES = {
    "Ready": "clients reach the model through `status.endpoint`: the wanted replicas are ready "
    "(`readyReplicas` of `desiredReplicas`)",
    "Progressing": "the workload is changing: pods being made, scheduled, loaded or replaced",
    "Degraded": "something is wrong that will not fix itself: its reason names it, its message says what",
    "TrafficGuard": "with `spec.traffic.guard` only: the version gets new requests by its weight; False once the "
    "guard tripped ([Rolling out a new model version](../how-to/roll-out-a-version.md))",
    "Prefetched": "with `spec.cache.prefetch` only: every node it selects holds the model in its node cache "
    "(`status.cache`; [Cold start and caches](../how-to/cold-start.md))",
    "InferencePool": "with the operator's `MODELSERVE_INFERENCE_POOLS` only: the pods serve in the namespace's "
    "InferencePool `modelserve`, and its picker has ready endpoints (`status.inferencePool`; "
    "[InferencePools](../how-to/inference-pools.md))",
}


@dataclass
class Reason:
    name: str
    states: set[str] = field(default_factory=set)  # "Ready=True", ... where the code writes it literally
    messages: list[str] = field(default_factory=list)  # the operator's own words, when they are fixed
    problem: bool = False  # comes with a message about what is wrong or awaited: Troubleshooting has it


def _text(node: ast.expr) -> str | None:
    """A message as the code writes it: a string, or an f-string with <name> for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                assert isinstance(value, ast.FormattedValue)
                parts.append(f"<{ast.unparse(value.value).rsplit('.', 1)[-1]}>")
        return "".join(parts)
    return None


def _value(module: ModuleType, node: ast.expr) -> object:
    """A literal, or a module-level name's value; None when neither."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and not node.id.islower():
        return getattr(module, node.id, None)
    return None


def reasons() -> dict[str, Reason]:
    """Every reason the operator writes into a condition, by name."""
    found: dict[str, Reason] = {}

    def add(name: object) -> Reason:
        assert isinstance(name, str), name
        return found.setdefault(name, Reason(name))

    tree = ast.parse(inspect.getsource(status))
    for node in ast.walk(tree):
        # reason = "...", then _condition(..., reason, ...): a reason with a message of what is wrong.
        is_reason = isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["reason"]
        if is_reason and isinstance(name := _value(status, node.value), str):
            add(name).problem = True
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or not node.args:
            continue
        if node.func.id == "Problem" and isinstance(name := _value(status, node.args[0]), str):
            add(name).problem = True
        elif node.func.id == "_condition" and isinstance(name := _value(status, node.args[2]), str):
            reason = add(name)
            kind, ok = _value(status, node.args[0]), _value(status, node.args[1])
            message = _text(node.args[3])
            if isinstance(kind, str) and isinstance(ok, bool):
                reason.states.add(f"{kind}={ok}")
            if message is None:
                reason.problem = True  # the message is what went wrong, in someone's words
            else:
                reason.messages.append(message)
    for name in status.UNSCHEDULABLE_REASONS:
        add(name).problem = True
    # The guard's verdict, as the operator writes it for a guard holding and a tripped one.
    for tripped in (False, True):
        ok, name, message = traffic_guard.guard_condition_parts(GuardStatus(tripped=tripped, message="<figures>"))
        reason = add(name)
        reason.states.add(f"{status.TRAFFIC_GUARD_CONDITION}={ok}")
        reason.messages.append(message)
    # spec.cache.prefetch's verdict (operator/prefetch.py).
    for name, (ok, message) in prefetch.REASONS.items():
        reason = add(name)
        reason.states.add(f"{status.PREFETCHED_CONDITION}={ok}")
        reason.messages.append(message)
        reason.problem = not ok and name != "Fetching"
    # The namespace's InferencePool (operator/pools.py).
    for name, (ok, message) in pools.REASONS.items():
        reason = add(name)
        reason.states.add(f"{status.INFERENCE_POOL_CONDITION}={ok}")
        reason.messages.append(message)
        reason.problem = not ok and name != pools.SERVES_HTTPS
    return found


def condition_types() -> list[str]:
    """The condition types the operator writes, in the order of the status code."""
    tree = ast.parse(inspect.getsource(status))
    kinds: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_condition":
            kind = _value(status, node.args[0])
            if isinstance(kind, str) and kind not in kinds:
                kinds.append(kind)
    return kinds


def troubleshooting_rows() -> dict[str, tuple[str, str]]:
    """reason -> (conditions, what it means), from the Troubleshooting table (a row may name several)."""
    rows = {}
    for line in TROUBLESHOOTING.read_text().splitlines():
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        if len(cells) != 4 or not cells[0].strip().startswith("`"):
            continue
        for name in re.findall(r"`(\w+)`", cells[0]):
            rows[name] = (cells[1].strip(), cells[2].strip())
    return rows


def page() -> str:
    lines = ["# Status conditions and reasons", ""]
    lines += generated_by("hack/docgen/conditions.py", "modelserve/operator/status.py and the CRD's status schema")
    lines += [
        "`kubectl get ms` shows the Ready condition's reason; `kubectl describe ms NAME` every condition",
        "with its message, and an Event for each transition. What to do about each reason:",
        "[Troubleshooting](../operations/troubleshooting.md).",
        "",
        "## Conditions",
        "",
        *table(("type", "True means"), ((code(kind), CONDITION_TYPES[kind]) for kind in condition_types())),
        "",
        "## Reasons",
        "",
    ]
    known = troubleshooting_rows()
    rows = []
    for reason in sorted(reasons().values(), key=lambda r: r.name):
        if reason.name in known:
            conditions, meaning = known[reason.name]
            meaning += " ([what to do](../operations/troubleshooting.md))"
        else:
            conditions = ", ".join(sorted(reason.states))
            meaning = "; ".join(
                f"message: {cell(code(message) if message else '(none)')}" for message in reason.messages
            )
        rows.append((code(reason.name), conditions, meaning))
    # The rows' cells are Markdown already (the Troubleshooting page's, or code spans).
    lines += [f"| {' | '.join(row)} |" for row in [("reason", "conditions", "meaning"), ("---", "---", "---"), *rows]]
    status_schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    lines += [
        "",
        "## Status fields",
        "",
        "Written by the operator only (the status subresource); `kubectl get ms NAME -o yaml` shows them.",
        "",
        *table(("field", "type", "meaning"), ((r[0], r[1], r[4]) for r in spec_table.rows(status_schema, "status"))),
        "",
    ]
    return "\n".join(lines)
