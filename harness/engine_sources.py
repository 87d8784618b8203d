"""Where each pinned engine's source is, and how engine_source.py reads it: the version is the
engine module's pin (modelserve/engines/), the files are what the set-up already fetches into the
cache (hack/install-vllm-cli.sh, hack/install-sglang-cli.sh, hack/build-llama-server.sh). A missing
source fails the caller, saying which script fetches it; it never skips."""

from __future__ import annotations

import re
from pathlib import Path

from modelserve.engines import llamacpp, sglang, vllm
from modelserve_sandbox.cluster import default_cache

from .engine_source import (
    Facts,
    PythonSource,
    cpp_args,
    cpp_routes,
    dict_keys,
    list_items,
    mentioned_env,
    python_options,
)


def source_root(engine: str) -> Path:
    """The directory the pinned version's source is unpacked in."""
    cache = default_cache()
    root, script = {
        "vllm": (cache / "vllm-cli" / vllm.VERSION / "site", "hack/install-vllm-cli.sh"),
        "sglang": (cache / "sglang-cli" / sglang.VERSION / "site", "hack/install-sglang-cli.sh"),
        "llamacpp": (cache / "llama.cpp" / f"b{llamacpp.BUILD}" / "source", "hack/build-llama-server.sh"),
    }[engine]
    if not root.is_dir():
        raise FileNotFoundError(f"{root} missing: `bash {script}` fetches it (hack/setup.sh runs it)")
    return root


def derive(engine: str) -> Facts:
    return {"vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}[engine](source_root(engine))


def _python(
    engine: str,
    version: str,
    root: Path,
    package: str,
    entries: list[str],
    options: list[frozenset[str]],
    parsers: tuple[str, ...],
) -> Facts:
    flags = frozenset(name for option in options for name in option)
    source = PythonSource(root, package, flags)
    routes = source.routes(entries)
    served = {(r.method, r.path, r.source) for r in routes}
    everywhere = source.all_registrations(sorted((root / package).rglob("*.py")))
    unreached = sorted(
        {r for r in everywhere if (r.method, r.path, r.source) not in served}, key=lambda r: (r.source, r.path)
    )
    env = mentioned_env(sorted((root / package).rglob("*.py")))
    return Facts(
        engine, version, tuple(routes), tuple(unreached), tuple(source.dynamic), flags, env, parsers, tuple(options)
    )


def _vllm(root: Path) -> Facts:
    # vLLM's flags: EngineArgs.add_cli_args's add_argument calls, and one per field of the
    # frontend's dataclasses (FrontendArgs.add_cli_args adds a flag for each).
    files = [root / "vllm/engine/arg_utils.py", *sorted((root / "vllm/entrypoints").rglob("*.py"))]
    options = python_options(files, re.compile(r"(Base)?FrontendArgs|(Async)?EngineArgs"))
    parsers = dict_keys(root / "vllm/tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER")
    # `vllm serve` builds its app in build_app (launchers/app.py), which registers every router.
    entries = ["vllm.entrypoints.launchers.app.build_app"]
    return _python("vllm", vllm.VERSION, root, "vllm", entries, options, parsers)


def _sglang(root: Path) -> Facts:
    # SGLang's flags: server_args.py's add_argument calls and one per field of the argument groups
    # (arg_groups/fields/, added by add_cli_args_from_dataclass), with the aliases each names.
    srt = root / "sglang/srt"
    options = python_options([srt / "server_args.py"], re.compile("ServerArgs"))
    options += python_options(sorted((srt / "arg_groups").rglob("*.py")), re.compile(r"\w+"))
    parsers = dict_keys(srt / "function_call/function_call_parser.py", "ToolCallParserEnum")
    # The server is http_server.py's module-level `app`; its lifespan and helpers add the rest.
    entries = ["sglang.srt.entrypoints.http_server.*"]
    return _python("sglang", sglang.VERSION, root, "sglang", entries, options, parsers)


def _llamacpp(root: Path) -> Facts:
    args = cpp_args(root / "common/arg.cpp")
    server = root / "tools/server"
    routes, dynamic = cpp_routes(server, args, sorted(path.name for path in server.glob("*.cpp")))
    flags = frozenset(flag for arg in args for flag in arg.flags)
    env = frozenset(arg.env for arg in args if arg.env) | mentioned_env(server.glob("*.cpp"))
    return Facts(
        "llamacpp",
        f"b{llamacpp.BUILD}",
        tuple(sorted(routes, key=lambda r: (r.path, r.method))),
        (),
        tuple(dynamic),
        flags,
        env,
        (),
        tuple(frozenset({*arg.flags, *([arg.env] if arg.env else [])}) for arg in args if arg.flags),
    )


def exported_metrics(engine: str) -> frozenset[str]:
    """The Prometheus series names the pinned version exports, as written in its source: vLLM's and
    SGLang's `"vllm:<name>"` literals; llama.cpp's metric table (tools/server/server-task.cpp and
    server-context.cpp: a name, then its description), which /metrics prints under `llamacpp:`."""
    root = source_root(engine)
    if engine == "llamacpp":
        text = "".join(path.read_text() for path in sorted((root / "tools/server").glob("server-*.cpp")))
        names = re.findall(r'\{\s*"([a-z_]+)",\s*\n\s*"', text) + re.findall(r'\{"name",\s*"([a-z_]+)"\}', text)
        return frozenset(f"llamacpp:{name}" for name in names)
    prefix = {"vllm": "vllm", "sglang": "sglang"}[engine]
    out: set[str] = set()
    for path in (root / prefix).rglob("*.py"):
        text = path.read_text(errors="replace")
        if f'"{prefix}:' in text:
            out |= set(re.findall(rf'"({prefix}:[a-z_]+)"', text))
    return frozenset(out)


def default_batch(engine: str) -> int:
    """How many requests the pinned version runs at once when no flag says, at most, as its source
    writes it: vLLM's largest `max_num_seqs` default for the API server (EngineArgs.get_batch_defaults,
    by GPU), SGLang's upper clamp of the requests its KV cache holds (resolve_max_num_reqs),
    llama-server's slots for `--parallel` auto."""
    root = source_root(engine)
    if engine == "vllm":
        text = (root / "vllm/engine/arg_utils.py").read_text()
        body = text.split("def get_batch_defaults", 1)[1].split("\n    def ", 1)[0]
        seqs = re.findall(r"default_max_num_seqs = \{[^}]*UsageContext\.OPENAI_API_SERVER: (\d+)", body)
        return max(map(int, seqs))
    if engine == "sglang":
        text = (root / "sglang/srt/mem_cache/kv_cache_configurator.py").read_text()
        body = text.split("def resolve_max_num_reqs", 1)[1]
        return int(re.search(r"max\(min\(estimated, (\d+)\), \d+\)", body).group(1))  # type: ignore[union-attr]
    text = (root / "tools/server/server.cpp").read_text()
    auto = text.split("params.n_parallel < 0", 1)[1]
    return int(re.search(r"params\.n_parallel = (\d+);", auto).group(1))  # type: ignore[union-attr]


# Where each Python engine lists the names `--load-format` takes: vLLM's loader table, which refuses
# any other name at start (its parser takes any string), SGLang's argparse choices.
LOAD_FORMAT_SOURCES = {
    "vllm": ("vllm/model_executor/model_loader/__init__.py", "_LOAD_FORMAT_TO_MODEL_LOADER"),
    "sglang": ("sglang/srt/arg_groups/choices.py", "LOAD_FORMAT_CHOICES"),
}


def load_format_choices(engine: str) -> tuple[str, tuple[str, ...]]:
    """(source file, the names the pinned version's `--load-format` takes), read from that file."""
    file, name = LOAD_FORMAT_SOURCES[engine]
    path = source_root(engine) / file
    read = dict_keys if engine == "vllm" else list_items
    return file, read(path, name)
