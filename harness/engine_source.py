"""What each pinned engine's own source says the allowlist depends on, derived instead of transcribed:
the HTTP routes its server registers, the flags and variables in the conditions around each
registration, every flag and variable the engine reads, and its tool-call parser names.

The engine tables (modelserve/contracts/engine_routes.py, modelserve/engines/*.py) are written by
hand; tests/engines/test_engine_source.py holds them against what this module reads from the source
the set-up fetches (engine_sources.py says where), so a new release's new route or flag shows as a
failing test that names it. `python -m harness.engine_source ENGINE` prints what it derives.

How, per engine family:
- Python servers (vLLM, SGLang), with `ast`: every FastAPI/Starlette registration in the package
  (decorators such as `@router.post("/x")` and `@app.api_route(..., methods=[...])`, calls to
  `add_api_route`, `mount`, `Mount`, `include_router`, and the documentation routes a `FastAPI(...)`
  call adds unless told not to); the server's routes are those reached from its entry modules by
  following calls and `include_router` through the package, each with the conditions (`if`s, early
  returns) on the way. Names in those conditions become gates: `envs.X`, string constants naming a
  variable, and attributes of the parsed arguments (`args.x`, `server_args.x`, `get_serving().x`)
  that are flags of the engine (`--x`).
- llama.cpp (C++), with regular expressions and brace matching: `ctx_http.get/post/del("...")` in
  tools/server/*.cpp with the `if (...)` blocks around them; common/arg.cpp's `common_arg` blocks map
  each `params.<field>` to its flags and variable, so `if (params.ui_mcp_proxy)` gates by
  `--ui-mcp-proxy`, `--webui-mcp-proxy` and `LLAMA_ARG_UI_MCP_PROXY`.

Over-approximate on purpose (a condition's polarity is not tracked: `if not x: return` gates by x as
much as `if x:` does): a gate or route found that the tables do not know is for a person to read.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

HTTP_METHODS = ("get", "post", "put", "delete", "patch", "head", "options")
# Variable names as the engines spell them: upper case, at least one underscore.
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")
FLAG = re.compile(r"^--?[a-zA-Z][a-zA-Z0-9-]*$")


@dataclass(frozen=True)
class Route:
    """One registration: `method` is an HTTP method, WS (a WebSocket) or * (a mount: any method,
    any path below); `path` as registered, its parameters included (`{id}`, `:id_slot`)."""

    method: str
    path: str
    source: str  # file:line, relative to the engine's source root
    gates: frozenset[str] = frozenset()  # flags (--x) and variables (X_Y) in the conditions around it
    conditions: tuple[str, ...] = ()  # those conditions as written, for people

    def describe(self) -> str:
        gates = f" [{', '.join(sorted(self.gates))}]" if self.gates else ""
        return f"{self.method} {self.path} ({self.source}){gates}"

    def matches(self, method: str, path: str) -> bool:
        """Whether a request `method path` reaches this registration (a mount: anything below it)."""
        if self.method == "*":
            return path == self.path or path.startswith(self.path.rstrip("/") + "/") or self.path == "/"
        wanted = "GET" if self.method == "WS" else self.method
        return method == wanted and re.fullmatch(path_pattern(self.path), path) is not None


@dataclass(frozen=True)
class Facts:
    """What one engine version's source says."""

    engine: str
    version: str
    routes: tuple[Route, ...]  # the server's
    # Registered somewhere in the source but not reached from the server's entry points: other
    # servers (a disaggregation encoder's, a launcher's) unless the analysis missed a path.
    unreached: tuple[Route, ...]
    dynamic: tuple[str, ...]  # "file: expression" of registrations whose path is not a literal
    flags: frozenset[str]  # every flag spelling the engine defines
    env: frozenset[str]  # every variable name the source mentions
    tool_call_parsers: tuple[str, ...]
    # Each option's names: its flag spellings and, for llama.cpp, its variable.
    options: tuple[frozenset[str], ...] = ()

    def gates(self) -> dict[str, list[Route]]:
        """Each flag or variable that gates a route, with the routes it gates."""
        out: dict[str, list[Route]] = {}
        for route in self.routes:
            for gate in route.gates:
                out.setdefault(gate, []).append(route)
        return out


def path_pattern(path: str) -> str:
    """A regular expression of the paths a registered path serves: `{x}`, `{x:path}`, `:x`."""
    out, pos = "", 0
    for match in re.finditer(r"\{(\w+)(:path)?\}|:(\w+)", path):
        out += re.escape(path[pos : match.start()]) + (".+" if match.group(2) else "[^/]+")
        pos = match.end()
    return out + re.escape(path[pos:])


# --- Python servers -------------------------------------------------------------------------------

ROUTE_DECORATORS = {*HTTP_METHODS, "api_route", "websocket", "route"}
ROUTE_CALLS = {"add_api_route": "GET", "add_route": "GET", "add_websocket_route": "WS", "mount": "*"}
ROUTE_CLASSES = {"Mount": "*", "Route": "GET", "APIRoute": "GET", "WebSocketRoute": "WS"}
# FastAPI(...) serves these unless its keyword is None (fastapi/applications.py).
FASTAPI_DOCS = {
    "openapi_url": "/openapi.json",
    "docs_url": "/docs",
    "redoc_url": "/redoc",
    "swagger_ui_oauth2_redirect_url": "/docs/oauth2-redirect",
}
# Attribute bases whose attributes are parsed arguments, i.e. flags.
ARG_BASES = {"args", "server_args", "parsed_args", "params"}
ROUTE_TOKENS = ("APIRouter", "FastAPI(", "add_api_route", "include_router", ".mount(", "Mount(", "@app.")


@dataclass
class _Module:
    name: str
    path: str  # relative to the root
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    functions: dict[str, ast.AST] = field(default_factory=dict)
    routers: dict[str, str] = field(default_factory=dict)  # module-level APIRouter name -> its prefix
    apps: set[str] = field(default_factory=set)  # module-level FastAPI() names
    star: list[str] = field(default_factory=list)  # modules it imports * from


@dataclass
class _Scope:
    """What running one function (or importing one module) does: routes it registers itself, and
    the functions and routers it reaches, each under the conditions on the way."""

    routes: list[Route] = field(default_factory=list)
    calls: list[tuple[str, tuple[ast.expr, ...]]] = field(default_factory=list)


class PythonSource:
    """A Python engine's package, analysed lazily: modules are parsed as the walk reaches them."""

    def __init__(self, root: Path, package: str, flags: frozenset[str]) -> None:
        self.root, self.package, self.flags = root, package, flags
        self.modules: dict[str, _Module | None] = {}
        self.scopes: dict[str, _Scope] = {}
        self.dynamic: list[str] = []
        self._local: dict[str, ast.expr] = {}

    # modules
    def module(self, name: str) -> _Module | None:
        if name not in self.modules:
            self.modules[name] = self._load(name)
        return self.modules[name]

    def _load(self, name: str) -> _Module | None:
        base = self.root / name.replace(".", "/")
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not path.is_file():
            return None
        tree = ast.parse(path.read_text(), str(path))
        module = _Module(name, str(path.relative_to(self.root)), tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(name, is_package, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        module.star.append(source)
                    else:
                        module.imports[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    # `import a.b` binds a (the package), `import a.b as c` binds c to a.b.
                    module.imports[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in _top_level(tree.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = node
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                kind = _call_name(node.value.func)
                for target in node.targets:
                    if isinstance(target, ast.Name) and kind == "APIRouter":
                        module.routers[target.id] = _keyword_str(node.value, "prefix") or ""
                    elif isinstance(target, ast.Name) and kind == "FastAPI":
                        module.apps.add(target.id)
        return module

    def resolve(self, module: _Module, expr: ast.expr) -> str | None:
        """The qualified name of a function or router `expr` names, if it is in the package."""
        if isinstance(expr, ast.Name):
            if expr.id in module.functions or expr.id in module.routers:
                return f"{module.name}.{expr.id}"
            target = module.imports.get(expr.id)
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            base = module.imports.get(expr.value.id)
            target = f"{base}.{expr.attr}" if base else None
        else:
            return None
        return target if target and target.startswith(self.package + ".") else None

    def split(self, qualified: str) -> tuple[_Module, str] | None:
        """(module, name) of a qualified function or router name; a package's re-export followed."""
        for _ in range(5):
            module_name, _, name = qualified.rpartition(".")
            module = self.module(module_name)
            if module is None:
                return None
            if name in module.functions or name in module.routers:
                return module, name
            target = module.imports.get(name)
            if not target:
                star = [self.split(f"{source}.{name}") for source in module.star]
                return next((found for found in star if found), None)
            if target == qualified:
                return None
            qualified = target
        return None

    # scopes
    def scope(self, key: str) -> _Scope:
        """What running function `module.name` (or `module:` for an import, `router:module.name` for
        a router's own routes) registers and reaches."""
        if key not in self.scopes:
            self.scopes[key] = _Scope()  # first: a recursive call finds it
            self.scopes[key] = self._scan(key)
        return self.scopes[key]

    def _scan(self, key: str) -> _Scope:
        scope = _Scope()
        if key.startswith("router:"):
            found = self.split(key.removeprefix("router:"))
            if found:
                module, name = found
                self._walk(module, module.tree.body, (), scope, router=name)
            return scope
        if key.endswith(":"):
            module = self.module(key[:-1])
            if module:
                self._walk(module, module.tree.body, (), scope, router=None, local=_assignments(module.tree, top=True))
            return scope
        found = self.split(key)
        if found:
            module, name = found
            function = module.functions[name]
            self._walk(module, function.body, (), scope, router=None, local={"": function, **_assignments(function)})
        return scope

    def _walk(
        self,
        module: _Module,
        body: list[ast.stmt],
        conditions: tuple[ast.expr, ...],
        scope: _Scope,
        router: str | None,
        local: dict[str, ast.expr] | None = None,
    ) -> None:
        """Registrations in `body` under `conditions`. With `router`, only routes decorated on that
        module-level router (its own routes); else everything else the statements do."""
        local = local or {}
        self._local = local  # for paths computed from assigned names (_route)
        for statement in body:
            if isinstance(statement, ast.If):
                test = _traced(statement.test, local)
                self._walk(module, statement.body, (*conditions, test), scope, router, local)
                self._walk(module, statement.orelse, (*conditions, test), scope, router, local)
                if _ends(statement.body) and not statement.orelse:
                    conditions = (*conditions, test)  # an early return: the rest runs under it
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                for decorator in statement.decorator_list:
                    self._decorator(module, decorator, conditions, scope, router, "" in local)
            elif isinstance(statement, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
                self._walk(
                    module, [*statement.body, *getattr(statement, "orelse", [])], conditions, scope, router, local
                )
            elif isinstance(statement, ast.Try):
                inner = [*statement.body, *statement.orelse, *statement.finalbody]
                for handler in statement.handlers:
                    inner += handler.body
                self._walk(module, inner, conditions, scope, router, local)
            else:
                for node in _calls(statement):
                    if router is None:
                        self._call(module, node, conditions, scope)
                    elif isinstance(node.func, ast.Attribute) and _is_name(node.func.value, router):
                        name = _call_name(node.func)
                        if name == "include_router" and node.args:
                            inner_router = self.resolve(module, node.args[0])
                            if inner_router:
                                scope.calls.append((f"router:{inner_router}", conditions))
                        elif name in ROUTE_CALLS:
                            methods = _methods(node, name) if ROUTE_CALLS[name] == "GET" else (ROUTE_CALLS[name],)
                            self._route(module, node, methods, conditions, scope, module.routers.get(router, ""))

    def _decorator(
        self,
        module: _Module,
        decorator: ast.expr,
        conditions: tuple[ast.expr, ...],
        scope: _Scope,
        router: str | None,
        in_function: bool,
    ) -> None:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
            return
        kind, owner = decorator.func.attr, decorator.func.value
        if kind not in ROUTE_DECORATORS:
            return
        owner_name = owner.id if isinstance(owner, ast.Name) else None
        on_router = owner_name in module.routers
        if router is not None and owner_name != router:
            return
        if router is None and on_router and not in_function:
            return  # the router's own routes: registered where it is included
        prefix = module.routers.get(owner_name or "", "")
        methods = _methods(decorator, kind)
        self._route(module, decorator, methods, conditions, scope, prefix)

    def _call(self, module: _Module, node: ast.Call, conditions: tuple[ast.expr, ...], scope: _Scope) -> None:
        name = _call_name(node.func)
        if name == "FastAPI":
            self._fastapi(module, node, conditions, scope)
            return
        if name == "include_router" and node.args:
            target = self.resolve(module, node.args[0])
            if target:
                scope.calls.append((f"router:{target}", conditions))
            return
        if (name in ROUTE_CALLS and isinstance(node.func, ast.Attribute)) or name in ROUTE_CLASSES:
            method = ROUTE_CALLS.get(name) or ROUTE_CLASSES[name]
            methods = _methods(node, name) if method == "GET" else (method,)
            self._route(module, node, methods, conditions, scope, "")
            return
        target = self.resolve(module, node.func)
        if target:
            scope.calls.append((target, conditions))

    def _fastapi(self, module: _Module, node: ast.Call, conditions: tuple[ast.expr, ...], scope: _Scope) -> None:
        """The documentation routes `FastAPI(...)` adds: /openapi.json unless openapi_url is None, and
        the pages that read it (/docs and its OAuth2 redirect, /redoc) unless theirs is too."""
        given = {k.arg: k.value for k in node.keywords if k.arg}
        openapi = self._docs_route(module, node, given, "openapi_url", conditions, scope)
        if openapi is None:
            return
        docs = self._docs_route(module, node, given, "docs_url", openapi, scope)
        if docs is not None:
            self._docs_route(module, node, given, "swagger_ui_oauth2_redirect_url", docs, scope)
        self._docs_route(module, node, given, "redoc_url", openapi, scope)

    def _docs_route(
        self,
        module: _Module,
        node: ast.Call,
        given: dict[str, ast.expr],
        keyword: str,
        conditions: tuple[ast.expr, ...],
        scope: _Scope,
    ) -> tuple[ast.expr, ...] | None:
        """Registers one documentation route; the conditions it is served under, None if never."""
        value = given.get(keyword)
        if isinstance(value, ast.IfExp):  # `None if X else "/openapi.json"`
            conditions = (*conditions, value.test)
            value = value.orelse if _is_none(value.body) else value.body
        if value is not None and _is_none(value):
            return None
        path = (
            value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else FASTAPI_DOCS[keyword]
        )
        scope.routes.append(Route("GET", path, f"{module.path}:{node.lineno}", *self._gates(conditions)))
        return conditions

    def _route(
        self,
        module: _Module,
        node: ast.Call,
        methods: tuple[str, ...],
        conditions: tuple[ast.expr, ...],
        scope: _Scope,
        prefix: str,
    ) -> None:
        path_arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "path"), None)
        where = f"{module.path}:{node.lineno}"
        if not (isinstance(path_arg, ast.Constant) and isinstance(path_arg.value, str)):
            # A path computed at run time: known to the tables by its expression; the variables it
            # reads (`os.environ.get("SGLANG_OLLAMA_CHAT_ROUTE", "/api/chat")`) gate it.
            expression = ast.unparse(path_arg) if path_arg else "?"
            self.dynamic.append(f"{module.path}: {expression}")
            traced = _traced(path_arg, self._local) if path_arg else None
            gates, texts = self._gates([*conditions, *([traced] if traced is not None else [])])
            for method in methods:
                scope.routes.append(Route(method, f"<{expression}>", where, gates, texts))
            default = _environ_default(path_arg)
            if default:  # `os.environ.get("X", "/api/chat")`: served there unless X says otherwise
                path_arg = ast.Constant(default)
            else:
                return
        for method in methods:
            scope.routes.append(Route(method, prefix + path_arg.value, where, *self._gates(conditions)))

    def _gates(self, conditions: Iterable[ast.expr]) -> tuple[frozenset[str], tuple[str, ...]]:
        gates: set[str] = set()
        texts = []
        for condition in conditions:
            texts.append(ast.unparse(condition))
            gates |= _gate_names(condition, self.flags)
        return frozenset(gates), tuple(texts)

    # the walk
    def routes(self, entries: Iterable[str]) -> list[Route]:
        """Every route registered by running `entries` (qualified functions, or `module:` for an
        import), each with the gates of every condition on its way."""
        found: dict[tuple[str, str, str], Route] = {}
        keys = []
        for entry in entries:  # `module.*`: importing it, and running each of its functions
            module = self.module(entry[:-2]) if entry.endswith(".*") else None
            keys += [f"{module.name}:", *(f"{module.name}.{f}" for f in module.functions)] if module else [entry]
        pending = [(key, frozenset[str](), ()) for key in keys]
        seen: set[tuple[str, frozenset[str]]] = set()
        while pending and len(seen) < 20_000:
            key, gates, texts = pending.pop()
            if (key, gates) in seen:
                continue
            seen.add((key, gates))
            scope = self.scope(key)
            for route in scope.routes:
                merged = Route(route.method, route.path, route.source, route.gates | gates, (*texts, *route.conditions))
                previous = found.get((route.method, route.path, route.source))
                if previous is None or len(merged.gates) < len(previous.gates):
                    found[(route.method, route.path, route.source)] = merged  # the least gated way in
            for target, conditions in scope.calls:
                more, more_texts = self._gates(conditions)
                pending.append((target, gates | more, (*texts, *more_texts)))
        return sorted(found.values(), key=lambda r: (r.path, r.method))

    def all_registrations(self, files: Iterable[Path]) -> list[Route]:
        """Every route registered anywhere in `files`, on any router or app (no gates)."""
        out = []
        for path in files:
            text = path.read_text(errors="replace")
            if not any(token in text for token in ROUTE_TOKENS):
                continue
            relative = path.relative_to(self.root).with_suffix("")
            name = ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)
            module = self.module(name)
            if module is None:
                continue
            for node in ast.walk(module.tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    for decorator in node.decorator_list:
                        if (
                            isinstance(decorator, ast.Call)
                            and isinstance(decorator.func, ast.Attribute)
                            and decorator.func.attr in ROUTE_DECORATORS
                            and decorator.args
                            and isinstance(decorator.args[0], ast.Constant)
                            and isinstance(decorator.args[0].value, str)
                            and decorator.args[0].value.startswith("/")
                        ):
                            owner = decorator.func.value
                            prefix = module.routers.get(owner.id, "") if isinstance(owner, ast.Name) else ""
                            for method in _methods(decorator, decorator.func.attr):
                                where = f"{module.path}:{decorator.lineno}"
                                out.append(Route(method, prefix + decorator.args[0].value, where))
                elif isinstance(node, ast.Call):
                    name = _call_name(node.func)
                    if (name in ROUTE_CALLS and isinstance(node.func, ast.Attribute)) or name in ROUTE_CLASSES:
                        arg = node.args[0] if node.args else None
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("/"):
                            method = ROUTE_CALLS.get(name) or ROUTE_CLASSES[name]
                            for m in _methods(node, name) if method == "GET" else (method,):
                                out.append(Route(m, arg.value, f"{module.path}:{node.lineno}"))
        return out


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements, those under its module-level `if`, `try` and `with` included (an
    optional dependency's router is defined under `if _SDK_AVAILABLE:`)."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.If | ast.With):
            yield from _top_level([*statement.body, *getattr(statement, "orelse", [])])
        elif isinstance(statement, ast.Try):
            inner = [*statement.body, *statement.orelse, *statement.finalbody]
            for handler in statement.handlers:
                inner += handler.body
            yield from _top_level(inner)


def _absolute(module: str, is_package: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, target] if target else base)


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _keyword_str(node: ast.Call, name: str) -> str | None:
    for keyword in node.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
            return keyword.value.value
    return None


def _environ_default(node: ast.expr | None) -> str | None:
    """The default of `os.environ.get(NAME, "/path")` or `os.getenv(NAME, "/path")`."""
    if (
        isinstance(node, ast.Call)
        and _call_name(node.func) in ("get", "getenv")
        and len(node.args) == 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _methods(node: ast.Call, kind: str) -> tuple[str, ...]:
    if kind in HTTP_METHODS:
        return (kind.upper(),)
    if kind in ("websocket", "add_websocket_route", "WebSocketRoute"):
        return ("WS",)
    given = next((k.value for k in node.keywords if k.arg == "methods"), None)
    if isinstance(given, ast.List | ast.Tuple | ast.Set):
        return tuple(sorted(e.value.upper() for e in given.elts if isinstance(e, ast.Constant)))
    if given is not None:
        return ("?",)
    return ("GET",)


def _ends(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return | ast.Raise)


def _calls(statement: ast.stmt) -> Iterator[ast.Call]:
    """The calls a statement makes itself (not those in functions or lambdas it defines)."""
    pending: list[ast.AST] = [statement]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            yield node
        pending.extend(ast.iter_child_nodes(node))


def _assignments(scope: ast.AST, top: bool = False) -> dict[str, ast.expr]:
    """A function's (or with `top`, a module's own) assigned names, for conditions and paths that
    read them (`if enabled:`, `@app.get(_ollama_root_route)`)."""
    out: dict[str, ast.expr] = {}
    for node in _top_level(scope.body) if top else ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _traced(test: ast.expr, local: dict[str, ast.expr]) -> ast.expr:
    """A condition with the local names it tests joined by what they were assigned."""
    names = [n.id for n in ast.walk(test) if isinstance(n, ast.Name) and n.id in local]
    if not names:
        return test
    return ast.BoolOp(op=ast.And(), values=[test, *(local[name] for name in names)])


def _gate_names(condition: ast.expr, flags: frozenset[str]) -> set[str]:
    """The flags and variables a condition reads."""
    out: set[str] = set()
    for node in ast.walk(condition):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_NAME.match(node.value):
            out.add(node.value)
        elif isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id == "envs" and ENV_NAME.match(node.attr):
                out.add(node.attr)
            elif _arguments(base):
                flag = "--" + node.attr.replace("_", "-")
                if flag in flags:
                    out.add(flag)
        elif (
            isinstance(node, ast.Call)
            and _call_name(node.func) == "getattr"
            and len(node.args) >= 2
            and _arguments(node.args[0])
            and isinstance(node.args[1], ast.Constant)
        ):
            flag = "--" + str(node.args[1].value).replace("_", "-")
            if flag in flags:
                out.add(flag)
    return out


def _arguments(base: ast.expr) -> bool:
    """Whether `base` holds parsed arguments: args, server_args, x.server_args, get_serving()."""
    if isinstance(base, ast.Name):
        return base.id in ARG_BASES
    if isinstance(base, ast.Attribute):
        return base.attr in ARG_BASES
    if isinstance(base, ast.Call) and not base.args:
        return _call_name(base.func).startswith("get_")
    return False


def python_options(files: Iterable[Path], arg_classes: re.Pattern[str]) -> list[frozenset[str]]:
    """Every option a Python engine defines, by its flag spellings: the literals of each `add_argument`
    call, and for each field of the dataclasses whose fields become flags (`arg_classes`, by class
    name) `--field-name` with the spellings its annotation names (SGLang's `Arg(aliases=[...])`)."""
    out: list[frozenset[str]] = []
    for path in files:
        text = path.read_text(errors="replace")
        if "add_argument" not in text and not arg_classes.search(text):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and _call_name(node.func) == "add_argument":
                names = {a.value for a in node.args if isinstance(a, ast.Constant) and FLAG.match(str(a.value))}
                if names:
                    out.append(frozenset(names))
            elif isinstance(node, ast.ClassDef) and arg_classes.fullmatch(node.name):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        named = {
                            c.value
                            for c in ast.walk(item.annotation)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str) and FLAG.match(c.value)
                        }
                        out.append(frozenset(named | {"--" + item.target.id.replace("_", "-")}))
    return out


def mentioned_env(files: Iterable[Path]) -> frozenset[str]:
    """Every variable-like name the source mentions (string or attribute): what `stale` checks use."""
    out: set[str] = set()
    for path in files:
        out |= set(re.findall(r"\b([A-Z][A-Z0-9]*_[A-Z0-9_]+)\b", path.read_text(errors="replace")))
    return frozenset(out)


def _assigned(path: Path, name: str) -> Iterator[ast.expr]:
    """The values assigned to `name` (module or class level) in `path`."""
    for node in ast.walk(ast.parse(path.read_text())):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:  # type: ignore[union-attr]
            yield node.value  # type: ignore[union-attr]


def _strings(nodes: Iterable[ast.expr | None]) -> tuple[str, ...]:
    return tuple(n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str))


def dict_keys(path: Path, name: str) -> tuple[str, ...]:
    """The string keys of the dict literal assigned to `name` (module or class level) in `path`."""
    for value in _assigned(path, name):
        if isinstance(value, ast.Dict):
            return _strings(value.keys)
    raise LookupError(f"no dict literal {name} in {path}")


def list_items(path: Path, name: str) -> tuple[str, ...]:
    """The strings of the list or tuple literal assigned to `name` (module or class level) in `path`."""
    for value in _assigned(path, name):
        if isinstance(value, (ast.List, ast.Tuple)):
            return _strings(value.elts)
    raise LookupError(f"no list literal {name} in {path}")


# --- llama.cpp --------------------------------------------------------------------------------------

CPP_ROUTE = re.compile(r"\bctx_http\.(get|post|put|del|patch)\s*\(\s*")
# server_http_context's own methods register with bare calls: `post(gcp.path_predict, ...)`.
CPP_BARE_ROUTE = re.compile(r"^[ \t]*(get|post|put|del)\s*\(\s*", re.M)
CPP_RAW_ROUTE = re.compile(r"\b(?:srv|svr)->(Get|Post|Put|Delete|Patch|Options|set_mount_point)\s*\(\s*")


@dataclass(frozen=True)
class CppArg:
    """One `common_arg` of common/arg.cpp: its flag spellings, variable and the params it sets."""

    flags: tuple[str, ...]
    env: str
    fields: frozenset[str]


def _mask(text: str) -> str:
    """`text` with comments blanked and string contents replaced by spaces (same length), so that
    braces and parentheses can be counted."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [c if c == "\n" else " " for c in text[i:j]]
            i = j
        elif text.startswith('R"(', i):
            j = text.find(')"', i + 3)
            j = n if j < 0 else j + 2
            out[i + 1 : j - 1] = [c if c == "\n" else " " for c in text[i + 1 : j - 1]]
            i = j
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            out[i + 1 : j] = " " * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _closing(masked: str, start: int, opening: str = "(", closing: str = ")") -> int:
    """The index of the bracket closing the one at `start`."""
    depth = 0
    for i in range(start, len(masked)):
        if masked[i] == opening:
            depth += 1
        elif masked[i] == closing:
            depth -= 1
            if depth == 0:
                return i
    return len(masked) - 1


def cpp_args(arg_cpp: Path) -> list[CppArg]:
    text = arg_cpp.read_text()
    masked = _mask(text)
    out = []
    for match in re.finditer(r"\badd_opt\s*\(", masked):
        end = _closing(masked, match.end() - 1)
        block, raw = masked[match.start() : end], text[match.start() : end]
        first = block.find("{")
        literals = re.findall(r'"((?:[^"\\]|\\.)*)"', raw[: _closing(block, first, "{", "}") + 1] if first >= 0 else "")
        flags = [s for s in literals if FLAG.match(s)]
        second = block.find("{", _closing(block, first, "{", "}") + 1) if first >= 0 else -1
        if second >= 0 and block[_closing(block, first, "{", "}") + 1 : second].strip() in (",", ""):
            flags += [
                s
                for s in re.findall(r'"([^"]*)"', raw[second : _closing(block, second, "{", "}") + 1])
                if FLAG.match(s)
            ]
        env = re.search(r'set_env\s*\(\s*"([A-Z0-9_]+)"', raw)
        fields = frozenset(re.findall(r"\bparams\.([a-z_][a-z0-9_]*)", raw))
        out.append(CppArg(tuple(flags), env.group(1) if env else "", fields))
    return out


def cpp_routes(server_dir: Path, args: list[CppArg], files: Iterable[str]) -> tuple[list[Route], list[str]]:
    """The routes `ctx_http.<method>("...")` registers in `files` of tools/server/, each gated by the
    flags and variables of the params its enclosing `if`s read; and the registrations whose path is
    not a literal."""
    by_field: dict[str, set[str]] = {}
    for arg in args:
        for name in arg.fields:
            by_field.setdefault(name, set()).update(arg.flags)
            if arg.env:
                by_field[name].add(arg.env)
    routes, dynamic = [], []
    for name in files:
        text = (server_dir / name).read_text()
        masked = _mask(text)
        blocks = _if_blocks(text, masked)
        patterns = (CPP_ROUTE, CPP_RAW_ROUTE, CPP_BARE_ROUTE) if name == "server-http.cpp" else (CPP_ROUTE,)
        for pattern in patterns:
            for match in pattern.finditer(masked):
                end = _closing(masked, match.end() - 1)
                first = text[match.end() : end].split(",")[0].strip()
                line = text.count("\n", 0, match.start()) + 1
                conditions = tuple(cond for start, stop, cond in blocks if start <= match.start() < stop)
                fields = {n for cond in conditions for n in re.findall(r"\bparams\.(\w+)", cond)}
                gates = frozenset(gate for n in fields for gate in by_field.get(n, ()))
                method = {"del": "DELETE", "set_mount_point": "*"}.get(match.group(1), match.group(1).upper())
                where = f"tools/server/{name}:{line}"
                if re.fullmatch(r'"[^"]*"', first):
                    routes.append(Route(method, first[1:-1], where, gates, conditions))
                else:  # a path computed at run time: the tables know it by its expression
                    dynamic.append(f"tools/server/{name}: {first}")
                    routes.append(Route(method, f"<{first}>", where, gates, conditions))
    return routes, dynamic


def _if_blocks(text: str, masked: str) -> list[tuple[int, int, str]]:
    """(start, end, condition) of every `if (...) {...}` and its `else` blocks."""
    out = []
    for match in re.finditer(r"\bif\s*\(", masked):
        close = _closing(masked, match.end() - 1)
        condition = text[match.end() : close]
        rest = masked[close + 1 :]
        brace = len(rest) - len(rest.lstrip())
        if rest[brace : brace + 1] != "{":
            continue
        start = close + 1 + brace
        end = _closing(masked, start, "{", "}")
        out.append((start, end, condition))
        after = masked[end + 1 :]
        gap = len(after) - len(after.lstrip())
        if after[gap : gap + 4] == "else":
            tail = after[gap + 4 :]
            skip = len(tail) - len(tail.lstrip())
            if tail[skip : skip + 1] == "{":
                else_start = end + 1 + gap + 4 + skip
                out.append((else_start, _closing(masked, else_start, "{", "}"), condition))
    return out


# --- the fixture's rows -----------------------------------------------------------------------------


def example_path(path: str) -> str:
    """A path a request can name for a registered one: parameters filled in."""
    path = re.sub(r"\{\w+:path\}", "some/path", path)
    return re.sub(r"\{\w+\}|:\w+", "sample", path)


def fixture_rows(facts: Facts) -> list[dict[str, object]]:
    """The routes as tests/fixtures/engine_routes/ keeps them, less `class` and `enabled` (a person's):
    one row per method and requestable path (a mount also by a path below it), its sources merged."""
    rows: dict[tuple[str, str], dict[str, object]] = {}
    for route in facts.routes:
        if route.path.startswith("<"):
            continue  # computed at run time: the fixture has its default, if any, by hand
        method = "GET" if route.method in ("WS", "*") else route.method
        paths = [route.path, route.path.rstrip("/") + "/anything"] if route.method == "*" else [route.path]
        for path in map(example_path, paths):
            row = rows.setdefault((method, path), {"method": method, "path": path, "source": [], "gates": set()})
            row["source"].append(route.source)  # type: ignore[union-attr]
            row["gates"] |= route.gates  # type: ignore[operator]
    out = []
    for row in rows.values():
        row["source"] = ", ".join(sorted(set(row["source"])))  # type: ignore[arg-type]
        row["gates"] = sorted(row["gates"])  # type: ignore[arg-type]
        out.append(row)
    return sorted(out, key=lambda r: (str(r["path"]), str(r["method"])))


# --- the command line -------------------------------------------------------------------------------


def merged_fixture(facts: Facts, previous: dict[str, object], header: dict[str, str]) -> str:
    """A new version's fixture: the derived rows, each classed by the current tables (as the proxies
    class a refusal), with the previous version's notes (`enabled`) for a route it had, and its rows
    that no literal registration gives (`external`: another package's; `computed`: a path computed
    at run time) kept. What a person then reads and corrects: every class and note."""
    import json

    from modelserve.contracts import routes

    old = {(r["method"], r["path"]): r for r in previous["routes"]}  # type: ignore[index,union-attr]
    rows = []
    for row in fixture_rows(facts):
        method, path = str(row["method"]), str(row["path"])
        kind = "consumer" if routes.allowed(method, path) else routes.refusal_class(path)
        out: dict[str, object] = {"method": method, "path": path, "source": row["source"], "class": kind}
        if row["gates"]:
            out["gates"] = row["gates"]
        note = old.get((method, path), {}).get("enabled")
        if note:
            out["enabled"] = note
        rows.append(out)
    rows += [r for r in previous["routes"] if "external" in r or "computed" in r]  # type: ignore[union-attr]
    lines = ",\n".join("    " + json.dumps(row) for row in rows)
    head = "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
    return "{\n" + head + '  "routes": [\n' + lines + "\n  ]\n}\n"


def main(argv: list[str]) -> int:
    from harness.engine_sources import derive

    facts = derive(argv[0])
    if len(argv) == 3 and argv[1] == "--fixture":  # ENGINE --fixture PREVIOUS.json: the new fixture
        import json

        previous = json.loads(Path(argv[2]).read_text())
        header = {k: v for k, v in previous.items() if k != "routes"}
        print(merged_fixture(facts, previous, header), end="")
        return 0
    print(f"{facts.engine} {facts.version}: {len(facts.routes)} routes, {len(facts.flags)} flags")
    for route in facts.routes:
        print("  " + route.describe())
    print("gates:")
    for gate, routes in sorted(facts.gates().items()):
        print(f"  {gate}: {', '.join(sorted({r.path for r in routes}))}")
    print("unreached (other servers?):")
    for route in facts.unreached:
        print("  " + route.describe())
    print("dynamic:", *facts.dynamic, sep="\n  ")
    print("tool-call parsers:", " ".join(facts.tool_call_parsers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
