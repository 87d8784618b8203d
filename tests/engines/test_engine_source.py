"""Each pinned engine's hand-kept tables against the engine's own source (the wheel or sdist the set-up
fetches): the routes its server registers, the flags and variables in the conditions around them, the
flags it defines, its tool-call parser names and the names its --load-format takes, derived by
harness/engine_source.py and engine_sources.py. A new release's new route, route-opening flag or parser
shows here as a failure that names it, where to add it, and the source line that registers it
(docs/architecture.md: "Bumping an engine")."""

from __future__ import annotations

import json
import re
import types
from functools import cache

import pytest

from harness.engine_source import Facts, fixture_rows
from harness.engine_sources import LOAD_FORMAT_SOURCES, default_batch, derive, exported_metrics, load_format_choices
from modelserve.api.spec import LORA_RANKS
from modelserve.contracts import routes
from modelserve.engines import REGISTRY, llamacpp, sglang, vllm
from modelserve.engines.base import Engine
from tests.helpers.chart import REPO

MODULES: dict[str, types.ModuleType] = {"vllm": vllm, "sglang": sglang, "llamacpp": llamacpp}
ENGINES = [engine.name for engine in REGISTRY if engine.name in MODULES]
FIXTURES = REPO / "tests" / "fixtures" / "engine_routes"


@cache
def facts(name: str) -> Facts:
    return derive(name)


def engine(name: str) -> Engine:
    return next(e for e in REGISTRY if e.name == name)


def fixture(name: str) -> tuple[str, list[dict]]:
    e = engine(name)
    path = FIXTURES / f"{e.title.lower()}-{e.version}.json"
    return path.name, json.loads(path.read_text())["routes"]


def version(name: str) -> str:
    return f"{engine(name).title} {engine(name).version}"


def test_every_engine_of_the_registry_is_derived() -> None:
    assert set(ENGINES) == {e.name for e in REGISTRY if e.name != "external"}


@pytest.mark.parametrize("name", ENGINES)
def test_the_fixture_has_every_route_the_source_registers_and_no_other(name: str) -> None:
    """The fixture (which the allowlist tests replay) row for row against the derived routes: method,
    path, the source line and the flags and variables that gate it."""
    file, rows = fixture(name)
    derived = {(r["method"], r["path"]): r for r in fixture_rows(facts(name))}
    kept = {(r["method"], r["path"]): r for r in rows if "external" not in r and "computed" not in r}
    wrong = [
        f"{version(name)} registers {m} {p} ({r['source']}; gates: {r['gates'] or 'none'}): not in {file}"
        for (m, p), r in derived.items()
        if (m, p) not in kept
    ]
    wrong += [
        f"{file} lists {m} {p} ({r['source']}): {version(name)} does not register it"
        for (m, p), r in kept.items()
        if (m, p) not in derived
    ]
    for key in derived.keys() & kept.keys():
        want, have = derived[key], kept[key]
        if (want["source"], want["gates"]) != (have["source"], have.get("gates", [])):
            wrong.append(
                f"{file}: {key[0]} {key[1]} is at {want['source']} gated by {want['gates'] or 'nothing'} in "
                f"{version(name)}, not at {have['source']} gated by {have.get('gates') or 'nothing'}"
            )
    computed = {expression for expression, _ in MODULES[name].COMPUTED_PATHS}
    for row in rows:
        if "computed" in row and row["computed"] not in computed:
            wrong.append(f"{file}: {row['path']} comes from {row['computed']!r}, no computed path of {version(name)}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", ENGINES)
def test_every_route_is_allowed_or_in_the_engines_route_table(name: str) -> None:
    """What the proxies refuse is refused whatever the tables say; they name a refusal's class by them."""
    table = engine(name).routes
    wrong = []
    for route in facts(name).routes:
        if route.path.startswith("<"):
            continue
        path = route.path.split("{")[0].split(":")[0] if "{" in route.path or ":" in route.path else route.path
        method = "GET" if route.method in ("WS", "*") else route.method
        if routes.allowed(method, route.path):
            continue
        known = path in table.aliases | table.admin or path.startswith(table.alias_prefixes + table.admin_prefixes)
        if not known:
            wrong.append(
                f"{version(name)} registers {route.describe()}: not in engine_routes.{name.upper()}'s aliases or "
                "admin (modelserve/contracts/engine_routes.py)"
            )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", ENGINES)
def test_every_route_table_entry_is_a_route_of_the_pinned_version(name: str) -> None:
    table = engine(name).routes
    _, rows = fixture(name)
    served = [route.path.split("{")[0] for route in facts(name).routes] + [r["path"] for r in rows]
    stale = [p for p in sorted(table.aliases | table.admin) if p not in served]
    stale += [p for p in table.alias_prefixes + table.admin_prefixes if not any(s.startswith(p) for s in served)]
    assert not stale, f"engine_routes.{name.upper()} lists what {version(name)} does not serve: {stale}"


def _named(name: str) -> dict[str, str]:
    """Every flag and variable the engine's tables name, and which table."""
    e, module = engine(name), MODULES[name]
    out = {s.name: "admin_flags" for s in e.admin_flags} | {s.name: "admin_env" for s in e.admin_env}
    return out | {s.name: "QUIET_SWITCHES" for s in module.QUIET_SWITCHES}


@pytest.mark.parametrize("name", ENGINES)
def test_every_flag_and_variable_that_registers_routes_is_in_a_table(name: str) -> None:
    """A gate the tables do not name could open a route no one read: it must be refused (admin) or
    known to open nothing a key holder may use (QUIET_SWITCHES)."""
    named = _named(name)
    wrong = [
        f"{version(name)}'s {gate} registers {', '.join(sorted({r.path for r in gated}))} ({gated[0].source}): "
        f"not in its admin_flags, admin_env or QUIET_SWITCHES (modelserve/engines/{name}.py)"
        for gate, gated in sorted(facts(name).gates().items())
        if gate not in named
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", ENGINES)
def test_each_refused_option_is_refused_in_every_spelling(name: str) -> None:
    """An option with two spellings (llama.cpp's --ui and --webui, its variable) is no more closed
    than its least refused one."""
    refused = {n for n, table in _named(name).items() if table != "QUIET_SWITCHES"}
    wrong = []
    for option in facts(name).options:
        if option & refused:
            positive = {n for n in option if not n.startswith(("--no-", "-no-"))}
            if missing := sorted(positive - refused):
                wrong.append(f"{version(name)} spells {sorted(option & refused)} also {missing}: refuse those too")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", ENGINES)
def test_every_flag_and_variable_the_tables_name_is_one_the_version_reads(name: str) -> None:
    e, module, found = engine(name), MODULES[name], facts(name)
    switches = [*e.admin_flags, *e.admin_env, *module.QUIET_SWITCHES]
    flags = [s.name for s in switches if s.name.startswith("-") and not s.before]
    flags += [*e.owned_flags, *e.group_flags, *e.batch_flags]
    env = [s.name for s in switches if not s.name.startswith("-") and not s.before]
    env += [e.batch_env] if e.batch_env else []
    stale = [f for f in flags if f not in found.flags] + [v for v in env if v not in found.env]
    assert not stale, f"{version(name)} reads none of {stale} (modelserve/engines/{name}.py)"
    # A name kept for older images only is one the pinned version indeed dropped.
    kept = [s.name for s in switches if s.before and (s.name in found.flags or s.name in found.env)]
    assert not kept, f"{version(name)} still reads {kept}: drop their `before`"


@pytest.mark.parametrize("name", ENGINES)
def test_the_removed_flags_are_gone_from_the_version(name: str) -> None:
    """What engineArgs may not set with the pinned image because the pinned version lacks it; each
    replacement it names is one of its flags."""
    found = facts(name)
    back = [s.name for s in engine(name).removed_flags if s.name in found.flags]
    assert not back, f"{version(name)} has {back} again: drop them from its REMOVED_FLAGS"
    named = {w.strip(":,;()") for s in engine(name).removed_flags for w in s.opens.split() if w.startswith("--")}
    assert named <= found.flags, f"{version(name)} has no {sorted(named - found.flags)}"


@pytest.mark.parametrize("name", ENGINES)
def test_the_default_batch_is_the_versions(name: str) -> None:
    # What the sidecar lets reach the engine at once when neither engineArgs nor env sets the batch.
    assert engine(name).default_batch == default_batch(name), f"{version(name)} batches {default_batch(name)}"


@pytest.mark.parametrize("name", ENGINES)
def test_the_tool_call_parsers_are_the_versions(name: str) -> None:
    have, want = set(engine(name).tool_call_parsers), set(facts(name).tool_call_parsers)
    assert have == want, f"{version(name)} adds {sorted(want - have)} and drops {sorted(have - want)}"


@pytest.mark.parametrize("name", ENGINES)
def test_every_offered_load_format_is_one_the_version_takes(name: str) -> None:
    """spec.loadFormat's values (the CRD's rules) are names the pinned engine's --load-format takes; an
    engine without the flag offers none."""
    offered = engine(name).load_formats
    if name not in LOAD_FORMAT_SOURCES:
        assert not offered, f"{version(name)} has no --load-format (modelserve/engines/{name}.py)"
        return
    file, takes = load_format_choices(name)
    assert offered and len(set(offered)) == len(offered)
    unknown = [f for f in offered if f not in takes]
    assert not unknown, f"{version(name)} takes no --load-format {unknown} ({file}: {', '.join(takes)})"


@pytest.mark.parametrize("name", ENGINES)
def test_computed_paths_and_other_servers_are_known(name: str) -> None:
    module, found = MODULES[name], facts(name)
    computed = {expression for expression, _ in module.COMPUTED_PATHS}
    seen = {entry.split(": ", 1)[1] for entry in found.dynamic}
    assert seen == computed, (
        f"{version(name)} computes paths {sorted(seen - computed)}; gone: {sorted(computed - seen)}"
    )
    others = tuple(prefix for prefix, _ in getattr(module, "OTHER_SERVERS", ()))
    elsewhere = [route.describe() for route in found.unreached if not route.source.startswith(others)]
    assert not elsewhere, f"{version(name)} registers routes the analysis did not reach from its server:\n" + "\n".join(
        elsewhere
    )


def test_vllms_lora_ranks_are_the_versions() -> None:
    from harness.engine_sources import source_root

    text = (source_root("vllm") / "vllm/config/lora.py").read_text()
    literal = text.split("MaxLoRARanks = Literal[", 1)[1].split("]", 1)[0]
    assert tuple(int(rank) for rank in literal.split(",")) == LORA_RANKS


def test_every_engine_series_the_dashboard_and_the_metrics_page_name_is_one_the_pinned_version_exports() -> None:
    dashboard = json.loads((REPO / "charts" / "modelserve" / "dashboards" / "modelserve.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs.append((REPO / "docs" / "reference" / "metrics.md").read_text())
    wrong = []
    for name in ENGINES:
        prefix = engine(name).metric_prefix
        used = {series for expr in exprs for series in re.findall(rf"\b({re.escape(prefix)}\w+)", expr)}
        assert used, f"the dashboard reads no {prefix} series"
        wrong += [f"{version(name)} exports no {series}" for series in sorted(used - exported_metrics(name))]
    assert not wrong, "\n".join(wrong)
