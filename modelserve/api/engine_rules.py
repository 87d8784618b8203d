"""The spec's rules made from the engine registry (`modelserve.engines.ENGINES`): each engine's
facts (GPUs, nodes, dtypes, its own fields, tagged model ids, adapters, tool-call parsers, faster
loaders, the flags and variables it refuses) become CEL for the API server and the same test in
Python, so adding an engine adds its rules. Each function takes the registry, by default the real
one (tests pass others).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from modelserve.contracts.adapters import AdapterApi
from modelserve.contracts.choices import Dtype
from modelserve.engines import ENGINES, external
from modelserve.engines.base import Engine, cel_list

from .rules import Rule

Registry = Mapping[str, Engine]  # profile -> engine
EXTERNAL = external.PROFILE  # no engine: the sidecar fronts a server outside the cluster

# The spec's fields only some engines read (an engine lists them in `own_fields`): (wire name,
# attribute, CEL saying it is set).
ENGINE_OWN_FIELDS = (
    ("torchCompile", "torch_compile", "self.torchCompile"),
    ("chunkedPrefillSize", "chunked_prefill_size", "has(self.chunkedPrefillSize)"),
)


# --- the profiles with a fact, and how the rules name them -------------------------------------


def profiles_where(test: Callable[[Engine], bool], engines: Registry = ENGINES) -> tuple[str, ...]:
    """The profiles whose engine passes `test`, in registry order."""
    return tuple(str(profile) for profile, engine in engines.items() if test(engine))


def _is(profiles: Sequence[str]) -> str:
    """CEL: the profile is one of `profiles`."""
    if len(profiles) == 1:
        return f"self.profile == '{profiles[0]}'"
    return f"self.profile in {cel_list(profiles)}"


def _is_not(profiles: Sequence[str]) -> str:
    if len(profiles) == 1:
        return f"self.profile != '{profiles[0]}'"
    return f"!({_is(profiles)})"


def _listed(names: Sequence[str], conjunction: str = "and") -> str:
    """a; a and b; a, b and c."""
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} {conjunction} {names[-1]}"


def named(profiles: Sequence[str], conjunction: str = "and") -> str:
    """profile a; profiles a and b; profile a or b (one of them)."""
    plural = len(profiles) > 1 and conjunction == "and"
    return f"profile{'s' if plural else ''} {_listed(profiles, conjunction)}"


def _gpu_profiles_or_named(profiles: Sequence[str], engines: Registry) -> str:
    """How a message names profiles that take a GPU-only field: "the GPU profiles" when they are."""
    if set(profiles) == set(profiles_where(lambda e: e.on_gpus, engines)):
        return "the GPU profiles"
    return named(profiles)


def profiles_described(engines: Registry = ENGINES) -> str:
    """The spec's `profile` field described: each profile with what it runs."""
    runs = [f"{profile} ({engine.summary})" for profile, engine in engines.items()]
    return _listed([*runs, f"{EXTERNAL} (no engine: the sidecar fronts the server at external.url)"], "or") + "."


# --- capabilities: GPUs, nodes, engine-only fields, dtypes, tagged ids, adapters --------------


def gpu_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """gpus is 0 (or unset) on an engine on CPUs and at least 1 on one on GPUs; a replica spans
    nodes only with an engine that wires a group, and then splits its GPUs evenly between them."""
    cpu = profiles_where(lambda e: not e.on_gpus, engines)
    gpu = profiles_where(lambda e: e.on_gpus, engines)
    groups = profiles_where(lambda e: e.spans_nodes, engines)
    single = tuple(p for p in (*engines, EXTERNAL) if p not in groups)
    rules = []
    if cpu:
        rules.append(
            Rule(
                f"{_is_not(cpu)} || !has(self.gpus) || self.gpus == 0",
                f"gpus must be 0 or unset for {named(cpu)}",
                "gpus",
                lambda s: s.profile not in cpu or not s.gpus,
            )
        )
    if gpu:
        rules.append(
            Rule(
                f"{_is_not(gpu)} || !has(self.gpus) || self.gpus >= 1",
                f"gpus must be at least 1 for the GPU {named(gpu)}",
                "gpus",
                lambda s: s.profile not in gpu or s.gpus is None or s.gpus >= 1,
            )
        )
    rules.append(
        Rule(
            f"!has(self.nodes) || self.nodes == 1 || {_is(groups)}",
            f"nodes above 1 needs a GPU profile ({_listed(groups, 'or')}): {named(single)} "
            f"run{'s' if len(single) == 1 else ''} one pod per replica",
            "nodes",
            lambda s: s.node_count == 1 or s.profile in groups,
        )
    )
    if groups:
        rules.append(
            Rule(
                f"!has(self.nodes) || self.nodes == 1 || {_is_not(groups)} || "
                "(has(self.gpus) && self.gpus % self.nodes == 0)",
                "gpus (GPUs per replica, across its nodes) must be set to a multiple of nodes: each node's pod "
                "gets gpus / nodes",
                "gpus",
                lambda s: (
                    s.node_count == 1 or s.profile not in groups or (s.gpus is not None and s.gpus % s.node_count == 0)
                ),
            )
        )
    return tuple(rules)


def _is_set(value: Any) -> bool:
    return value is not None and value is not False


def own_field_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """A field only some engines read (SGLang's torchCompile) is refused with every other profile."""
    rules = []
    for wire, attribute, is_set in ENGINE_OWN_FIELDS:
        owners = profiles_where(lambda e, wire=wire: wire in e.own_fields, engines)
        rules.append(
            Rule(
                f"!{is_set} || {_is(owners)}",
                f"{wire} only applies to {named(owners)}",
                wire,
                lambda s, attribute=attribute, owners=owners: not _is_set(getattr(s, attribute)) or s.profile in owners,
            )
        )
    return tuple(rules)


def dtype_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """dtype is one its engine takes (llama.cpp reads the GGUF's own types): a rule per engine
    that takes only some, with its reason."""
    rules = []
    for profile, engine in engines.items():
        dtypes = tuple(str(dtype) for dtype in engine.dtypes)
        if set(engine.dtypes) == set(Dtype):
            continue
        takes = f"self.dtype == '{dtypes[0]}'" if len(dtypes) == 1 else f"self.dtype in {cel_list(dtypes)}"
        rules.append(
            Rule(
                f"{_is_not([str(profile)])} || {takes}",
                f"dtype must be {_listed(dtypes, 'or')} for profile {profile}: {engine.why_not('dtype')}",
                "dtype",
                lambda s, profile=profile, dtypes=dtypes: s.profile != profile or s.dtype in dtypes,
            )
        )
    return tuple(rules)


def gpu_memory_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """gpuMemoryUtilization only with an engine on GPUs."""
    cpu = profiles_where(lambda e: not e.on_gpus, engines)
    if not cpu:
        return ()
    gpu = profiles_where(lambda e: e.on_gpus, engines)
    return (
        Rule(
            f"{_is_not(cpu)} || !has(self.gpuMemoryUtilization)",
            f"gpuMemoryUtilization only applies to {_gpu_profiles_or_named(gpu, engines)}",
            "gpuMemoryUtilization",
            lambda s: s.profile not in cpu or s.gpu_memory_utilization is None,
        ),
    )


def tagged_model_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """A hub id's `:<tag>` only with an engine that reads one (llama.cpp's GGUF quantization) or
    profile external (whose server has ids of its own)."""
    tagged = profiles_where(lambda e: bool(e.tagged_models), engines)
    allowed = (*tagged, EXTERNAL)
    what = "; ".join(engines[p].tagged_models for p in tagged)
    return (
        Rule(
            f"{_is(allowed)} || self.model.startsWith('/') || !self.model.contains(':')",
            f"model takes a :<quant> tag only with {named(tagged)} ({what})"
            if tagged
            else "model takes no :<quant> tag with the engine profiles",
            "model",
            lambda s: s.profile in allowed or s.model.startswith("/") or ":" not in s.model,
        ),
    )


def adapter_profiles(engines: Registry = ENGINES) -> tuple[str, ...]:
    """The profiles whose engine loads LoRA adapters at run time (through its adapter API)."""
    return profiles_where(lambda e: e.adapter_api != AdapterApi.NONE, engines)


def adapter_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """adapters only with an engine that loads them at run time."""
    takes = adapter_profiles(engines)
    why = [engine.why_not("adapters") for engine in engines.values() if engine.adapter_api == AdapterApi.NONE]
    return (
        Rule(
            f"!has(self.adapters) || {_is(takes)}",
            f"adapters needs profile {_listed([f'{p} ({engines[p].title})' for p in takes], 'or')}: "
            + ", ".join([*why, "and an external server loads its own"]),
            "adapters",
            lambda s: s.adapters is None or s.profile in takes,
        ),
    )


def _flag_rule(profile: str, engine: Engine, flags: tuple[str, ...], message: str) -> Rule:
    """engineArgs must not set one of `flags` with `profile`, in any spelling its engine's parser reads."""
    return Rule(
        f"self.profile != '{profile}' || !has(self.engineArgs) || "
        f"!{engine.any_sets_flag_cel('self.engineArgs', flags)}",
        message,
        "engineArgs",
        lambda s: s.profile != profile or not any(engine.sets_flag(a, flags) for a in s.engine_args),
    )


def owned_flag_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
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
        for profile, engine in engines.items()
    )


def group_flag_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
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
        for profile, engine in engines.items()
        if engine.group_flags
    )


def admin_flag_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
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
        for profile, engine in engines.items()
        if engine.admin_flags
    )


def removed_flag_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """engineArgs must not set a flag the pinned version removed (or renamed) when the ModelServer runs
    the pinned image: the engine would exit at start, in a CrashLoop. Matched as written (or
    --flag=value), not abbreviated: a prefix of a removed flag may abbreviate a current one. With
    spec.image (an older release that has them) they pass."""
    rules = []
    for profile, engine in engines.items():
        if not engine.removed_flags:
            continue
        names = tuple(switch.name for switch in engine.removed_flags)
        rules.append(
            Rule(
                f"has(self.image) || self.profile != '{profile}' || !has(self.engineArgs) || "
                f"!self.engineArgs.map(a, a.split('=')[0]).exists(n, n in {cel_list(names)})",
                f"engineArgs must not set these flags with profile {profile} and the pinned image: "
                f"{engine.title} {engine.version} no longer has them (it would exit at start: "
                f"`{engine.unknown_flag_error}`), "
                f"{engine.previous_version} had them (with spec.image of such a release they pass): "
                + "; ".join(switch.describe() for switch in engine.removed_flags),
                "engineArgs",
                lambda s, profile=profile, names=set(names): (
                    s.image is not None
                    or s.profile != profile
                    or not any(a.split("=", 1)[0] in names for a in s.engine_args)
                ),
            )
        )
    return tuple(rules)


def admin_env_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
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
        for engine in engines.values()
        if engine.admin_env
    )


def tool_call_parser_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """toolCallParser only with an engine that takes a parser name, and then a name the profile's
    pinned engine knows: the engines spell the same parser differently (vLLM llama3_json, SGLang
    llama3), and a wrong name only shows when the engine exits at start. From each engine's own list."""
    takes = profiles_where(lambda e: bool(e.tool_call_parsers), engines)
    rules = [
        Rule(
            f"{_is_not([str(profile)])} || !has(self.toolCallParser)",
            f"toolCallParser only applies to {_gpu_profiles_or_named(takes, engines)}: "
            f"{engine.why_not('toolCallParser')}",
            "toolCallParser",
            lambda s, profile=profile: s.profile != profile or s.tool_call_parser is None,
        )
        for profile, engine in engines.items()
        if not engine.tool_call_parsers
    ]
    for profile, engine in engines.items():
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


LOAD_FORMAT_FLAGS = ("--load-format",)


def load_formats_taken(engines: Registry = ENGINES) -> str:
    """Each profile whose engine offers faster loaders, with its pinned version and their names: what
    spec.loadFormat takes, for its description and the refusals."""
    return _listed(
        [
            f"{_listed(engine.load_formats, 'or')} with profile {profile} ({engine.title} {engine.version})"
            for profile, engine in engines.items()
            if engine.load_formats
        ]
    )


def load_format_rules(engines: Registry = ENGINES) -> tuple[Rule, ...]:
    """loadFormat only with an engine that offers faster loaders, then one of them (each a name the
    pinned version's --load-format takes), and never beside --load-format in engineArgs, which would
    make the engine read two loaders and keep the last. A wrong name only shows when the engine exits
    at start. Profile external refuses the field with every engine field (spec.py)."""
    taken = load_formats_taken(engines)
    rules = [
        Rule(
            f"{_is_not([str(profile)])} || !has(self.loadFormat)",
            f"loadFormat does not apply to profile {profile}: {engine.why_not('loadFormat')} (loadFormat takes "
            f"{taken})",
            "loadFormat",
            lambda s, profile=profile: s.profile != profile or s.load_format is None,
        )
        for profile, engine in engines.items()
        if not engine.load_formats
    ]
    for profile, engine in engines.items():
        formats = engine.load_formats
        if not formats:
            continue
        rules.append(
            Rule(
                f"self.profile != '{profile}' || !has(self.loadFormat) || self.loadFormat in {cel_list(formats)}",
                f"loadFormat must be {_listed(formats, 'or')} for profile {profile}: the faster loaders offered, "
                f"each one {engine.title} {engine.version}'s --load-format takes",
                "loadFormat",
                lambda s, profile=profile, formats=formats: (
                    s.profile != profile or s.load_format is None or s.load_format in formats
                ),
            )
        )
        rules.append(
            Rule(
                f"self.profile != '{profile}' || !has(self.loadFormat) || !has(self.engineArgs) || "
                f"!{engine.any_sets_flag_cel('self.engineArgs', LOAD_FORMAT_FLAGS)}",
                f"loadFormat and --load-format in engineArgs must not both be set with profile {profile} "
                f"({engine.title}; {engine.spelling}): loadFormat passes --load-format itself",
                "loadFormat",
                lambda s, profile=profile, engine=engine: (
                    s.profile != profile
                    or s.load_format is None
                    or not any(engine.sets_flag(a, LOAD_FORMAT_FLAGS) for a in s.engine_args)
                ),
            )
        )
    return tuple(rules)
