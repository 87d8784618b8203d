"""The spec's rules made from the engine registry (`modelserve.engines.ENGINES`): each engine's
facts become CEL for the API server and the same test in Python, so adding an engine adds its rules."""

from __future__ import annotations

from modelserve.contracts.choices import Profile
from modelserve.engines import ENGINES
from modelserve.engines.base import Engine, cel_list

from .rules import Rule


def _flag_rule(profile: Profile, engine: Engine, flags: tuple[str, ...], message: str) -> Rule:
    """engineArgs must not set one of `flags` with `profile`, in any spelling its engine's parser reads."""
    return Rule(
        f"self.profile != '{profile}' || !has(self.engineArgs) || "
        f"!{engine.any_sets_flag_cel('self.engineArgs', flags)}",
        message,
        "engineArgs",
        lambda s: s.profile != profile or not any(engine.sets_flag(a, flags) for a in s.engine_args),
    )


def owned_flag_rules() -> tuple[Rule, ...]:
    """engineArgs must not set a flag the pod's wiring owns (the engine listens on 127.0.0.1 behind
    the sidecar, which checks keys itself and probes the engine under the ModelServer's name)."""
    return tuple(
        _flag_rule(
            profile,
            engine,
            engine.owned_flags,
            f"engineArgs must not set {', '.join(engine.owned_flags)} with profile {profile} ({engine.title}; "
            f"{engine.spelling}): the operator wires them to the sidecar",
        )
        for profile, engine in ENGINES.items()
    )


def group_flag_rules() -> tuple[Rule, ...]:
    """With nodes above 1, engineArgs must not set the flags that size and wire the group (tensor and
    pipeline sizes, node ranks, the rendezvous address): the operator derives them from gpus, nodes
    and acrossNodes, and one pod of a group disagreeing with the others hangs the whole group."""
    return tuple(
        Rule(
            f"!has(self.nodes) || self.nodes == 1 || self.profile != '{profile}' || !has(self.engineArgs) || "
            f"!{engine.any_sets_flag_cel('self.engineArgs', engine.group_flags)}",
            f"engineArgs must not set {', '.join(engine.group_flags)} with nodes above 1 and profile {profile} "
            f"({engine.title}; {engine.spelling}): the operator sizes the group from gpus, nodes and acrossNodes",
            "engineArgs",
            lambda s, profile=profile, engine=engine: (
                s.node_count == 1
                or s.profile != profile
                or not any(engine.sets_flag(a, engine.group_flags) for a in s.engine_args)
            ),
        )
        for profile, engine in ENGINES.items()
        if engine.group_flags
    )


def admin_flag_rules() -> tuple[Rule, ...]:
    """engineArgs must not turn on an engine's administration routes: only the sidecar's allowlist
    would then stand between them and every key holder. From each engine's own table."""
    return tuple(
        _flag_rule(
            profile,
            engine,
            tuple(switch.name for switch in engine.admin_flags),
            f"engineArgs must not set these {engine.title} {engine.version} flags with profile {profile} "
            f"({engine.spelling}), which open routes no API key holder may reach: "
            + "; ".join(switch.describe() for switch in engine.admin_flags),
        )
        for profile, engine in ENGINES.items()
        if engine.admin_flags
    )


def admin_env_rules() -> tuple[Rule, ...]:
    """env must not name a variable that turns on an engine's administration routes. Refused with
    every profile, not only the engine's own: another engine ignores the name, so nobody needs it,
    and one rule per engine is simpler than a matrix (and survives an `image` of another engine)."""
    return tuple(
        Rule(
            f"!has(self.env) || !self.env.exists(e, e.name in {cel_list(s.name for s in engine.admin_env)})",
            f"env must not name these {engine.title} {engine.version} variables, which open routes no API "
            "key holder may reach: " + "; ".join(switch.describe() for switch in engine.admin_env),
            "env",
            lambda s, names={switch.name for switch in engine.admin_env}: not any(var.name in names for var in s.env),
        )
        for engine in ENGINES.values()
        if engine.admin_env
    )


def tool_call_parser_rules() -> tuple[Rule, ...]:
    """toolCallParser must be a name the profile's pinned engine knows: the engines spell the same
    parser differently (vLLM llama3_json, SGLang llama3), and a wrong name only shows when the
    engine exits at start. One rule per engine that takes a parser name, from the engine's own list."""
    rules = []
    for profile, engine in ENGINES.items():
        parsers = engine.tool_call_parsers
        if not parsers:
            continue
        rules.append(
            Rule(
                f"self.profile != '{profile}' || !has(self.toolCallParser) || "
                f"self.toolCallParser in {cel_list(parsers)}",
                f"toolCallParser must be a parser {engine.title} {engine.version} knows for profile {profile}: "
                + ", ".join(parsers),
                "toolCallParser",
                lambda s, profile=profile, parsers=parsers: (
                    s.profile != profile or s.tool_call_parser is None or s.tool_call_parser in parsers
                ),
            )
        )
    return tuple(rules)
