"""The engine interface: what every engine container shares; each engine module adds its facts and flags."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from modelserve.contracts.adapters import AdapterApi
from modelserve.contracts.choices import Dtype
from modelserve.contracts.engine_routes import EngineRoutes
from modelserve.contracts.nodecache import Layout
from modelserve.contracts.operator_settings import ENGINE_IMAGE_PREFIX
from modelserve.contracts.sidecar import DRAINED_ROUTE

from . import token_rates, view
from .view import ServedModel, SpecView

CONTAINER_NAME = "engine"
LOOPBACK = "127.0.0.1"  # engines listen here only: every request goes through the sidecar
SHM_VOLUME = "dshm"
CACHE_VOLUME = "hub-cache"
GPU_RESOURCE = "nvidia.com/gpu"
CHAT_TEMPLATE_VOLUME = "chat-template"
CHAT_TEMPLATE_DIR = "/etc/modelserve/chat-template"
# SGLang reads a --chat-template file as Jinja only by this suffix (else as its JSON format).
CHAT_TEMPLATE_KEY = "chat_template.jinja"
CHAT_TEMPLATE_PATH = f"{CHAT_TEMPLATE_DIR}/{CHAT_TEMPLATE_KEY}"
# A non-root engine's writable paths, on emptyDirs (its root filesystem is read-only or root's). HOME stays
# /root, where the hub cache is mounted: the volume over it makes that directory (0700 root in
# the images) reachable and writable for the engine's user.
HOME_VOLUME, HOME_PATH = "engine-home", "/root"
TMP_VOLUME, TMP_PATH = "engine-tmp", "/tmp"
HUB_CACHE_PATH = f"{HOME_PATH}/.cache/huggingface"
# ~/.cache on an emptyDir of its own, for an engine that keeps caches there (`user_caches`): the hub
# cache's mount point inside HOME is made by the container runtime, root's and 0755, so on the HOME
# volume alone ~/.cache would take no directory of the engine's user.
CACHE_HOME_VOLUME, CACHE_HOME_PATH = "engine-cache", f"{HOME_PATH}/.cache"
# A non-root engine's UID and GID: an account in no image (distroless's "nonroot", as the sidecar's).
NONROOT_UID = 65532
# USER for that UID, which has no passwd entry: getpass.getuser(), which torch calls to name its caches,
# reads USER before the passwd file, where it would fail (KeyError).
NONROOT_USER = "modelserve"
# What LeaderWorkerSet's pod webhook puts in every container of a group's pods; Kubernetes expands
# $(NAME) in a container's args from its environment.
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"  # <lws>-<group>.<lws>.<namespace>: the leader pod's DNS name
GROUP_SIZE = "$(LWS_GROUP_SIZE)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"  # 0 on the leader


class Role(StrEnum):
    """Which pod an engine container runs in: a replica of its own, or a LeaderWorkerSet group's
    leader (the one serving HTTP, beside the sidecar) or one of its workers."""

    SINGLE = "single"
    LEADER = "leader"
    WORKER = "worker"


@dataclass(frozen=True)
class Switch:
    """A flag or variable that makes an engine serve routes no key holder may reach, and what it
    opens (or, for a real need, the better way): one row of an engine module's table of facts."""

    name: str
    opens: str
    # Set when the pinned version no longer reads the name: the version that dropped it. Still
    # refused, for a ModelServer pinned to an older image.
    before: str = ""

    def describe(self) -> str:
        """The name, with what it opens (or, for a removed flag, what replaced it) when there is any."""
        return f"{self.name} ({self.opens})" if self.opens else self.name


@dataclass(frozen=True)
class Engine:
    """One engine: every fact the operator, the sidecar's settings, the CRD's rules and the chart
    take from it, and the container it runs for a ModelServer. Each engine module makes one,
    overriding `args` (and `env` where the engine needs variables, `launch` where it spans nodes),
    and the registry (engines/__init__.py) lists it."""

    name: str  # also the pods' app.kubernetes.io/component label and the chart's engines.<name> key
    title: str  # how people write it, e.g. vLLM
    profile: str  # the spec's `profile` value that chooses this engine, e.g. high-throughput
    summary: str  # what the profile runs, for the CRD's description of `profile`, e.g. "vLLM on GPUs"
    version: str  # the pinned version every fact below was read from
    image: str  # pinned; the operator's setting `image_env` may name another
    command: tuple[str, ...]  # set explicitly so an `image` override runs the same program
    port: int  # on 127.0.0.1
    health_path: str  # answers 200 once the model is loaded
    metrics_path: str  # Prometheus text, appended to the sidecar's /metrics
    metric_prefix: str  # the engine's own series in that text, e.g. "vllm:"
    shm_size: str  # /dev/shm default; tensor parallelism exchanges through it
    # Runs on GPUs: spec.gpus defaults to 1 and must be at least 1; else it must be 0 (or unset).
    on_gpus: bool
    # Its alias and administration routes, which the proxies refuse and classify: in contracts/
    # (engine_routes.py) because the proxies read them and must not import the engines.
    routes: EngineRoutes
    # How long the sidecar lets a live engine take to answer health_path and /v1/models before it
    # calls the engine unreachable. vLLM's and llama.cpp's health routes only look at a flag, so
    # only a busy event loop delays them; the sidecar answers the kubelet meanwhile.
    probe_timeout_seconds: float = 5.0
    # The names this version's --tool-call-parser accepts; empty: the engine takes no parser name.
    tool_call_parsers: tuple[str, ...] = ()
    # The faster weight loaders spec.loadFormat offers (`--load-format`), each one this version's own
    # loader table takes; empty: the engine has no such flag, and spec.loadFormat is refused.
    load_formats: tuple[str, ...] = ()
    # Every spelling of the flags the operator sets for the pod's wiring (address, port, key, served
    # name): engineArgs may not set them, or the engine would answer where the sidecar does not look.
    owned_flags: tuple[str, ...] = ("--host", "--port", "--api-key", "--served-model-name")
    # (OpenAI name, the engine's name) of sampling fields it reads only under its own name: the
    # sidecar copies a request's (or the samplingDefaults') value across.
    sampling_aliases: tuple[tuple[str, str], ...] = ()
    # How the engine's command-line parser reads a flag: argparse (vLLM, SGLang) also takes any
    # unambiguous prefix of a long flag; vLLM's and llama.cpp's read `_` as `-`. The refusals below cover
    # both.
    abbreviated_flags: bool = False
    underscored_flags: bool = False
    # Spans nodes: with spec.nodes above 1 its `launch` wires a LeaderWorkerSet group's leader and
    # workers; else nodes must be 1.
    spans_nodes: bool = False
    # Every spelling of the flags that size and wire a group across nodes: engineArgs may not set
    # them with nodes above 1 (the operator does, the same on every pod of the group).
    group_flags: tuple[str, ...] = ()
    # engineArgs flags and spec.env names that open administration routes (engine-routes tables).
    admin_flags: tuple[Switch, ...] = ()
    admin_env: tuple[Switch, ...] = ()
    # Flags the version pinned before had and this one lacks (`opens`: what replaced each, if any):
    # with the pinned image the engine would exit at start on them, so engineArgs may not set them
    # unless spec.image names another image (an older release that has them).
    removed_flags: tuple[Switch, ...] = ()
    previous_version: str = ""  # the version pinned before, which had removed_flags
    unknown_flag_error: str = ""  # how its parser refuses a flag it lacks, for the refusal's message
    # Which administration API loads LoRA adapters at run time (the sidecar calls it); NONE: the
    # engine takes no adapters from this project.
    adapter_api: AdapterApi = AdapterApi.NONE
    # How many requests the engine runs at once (its batch): every spelling of the flag that sets it,
    # the variable that sets it too (the flag wins), and the pinned version's own default when neither
    # does. The sidecar lets this many reach the engine (`batch_size`); more wait their turn by key.
    batch_flags: tuple[str, ...] = ()
    batch_env: str = ""
    default_batch: int = 0
    # Requests in flight one replica serves at full speed, the autoscaler's default target
    # (spec.replicas.targetPerReplica unset), at most the batch; 0: the batch (a llama.cpp server's
    # few slots).
    default_target: int = 0
    # The spec.dtype values the engine takes.
    dtypes: tuple[Dtype, ...] = tuple(Dtype)
    # Spec fields (wire names) only some engines read, e.g. SGLang's torchCompile: refused with
    # every profile whose engine does not list them (api/engine_rules.py knows each field's test).
    own_fields: tuple[str, ...] = ()
    # What a model id's `:<tag>` names for this engine (a hub id `<org>/<repo>:<tag>`); empty: the
    # engine takes hub ids without one.
    tagged_models: str = ""
    # (spec field, why this engine takes none of it or only some values) for each field it refuses
    # (dtype, toolCallParser, adapters): the reason ends the refusal's message.
    refusals: tuple[tuple[str, str], ...] = ()
    # The engine's user: None keeps the image's own (root) and its writable root filesystem;
    # a UID runs it non-root with HOME and /tmp on emptyDirs, on a read-only root filesystem unless
    # read_only_root says otherwise.
    run_as_user: int | None = None
    # With run_as_user: whether the container's root filesystem is read-only. False leaves it writable
    # for the container runtime's hooks, not for the engine: its user owns nothing there. GPU engines
    # need that: on GPU nodes the NVIDIA container toolkit's createContainer hooks write into the
    # container's root filesystem as it is made (update-ldcache), and fail on a read-only one.
    read_only_root: bool = True
    # Which files of a model's repository the engine reads: what the node cache's fetch downloads.
    model_layout: Layout = Layout.SAFETENSORS
    # With run_as_user: the engine keeps caches of its own under ~/.cache and names some after its
    # user (vLLM and SGLang, through torch, Triton and FlashInfer): ~/.cache gets an emptyDir of its
    # own, and USER, XDG_CACHE_HOME and TMPDIR are set.
    user_caches: bool = False

    def args(self, ms: ServedModel) -> list[str]:
        """The engine's arguments for a ModelServer (before the spec's own engineArgs)."""
        raise NotImplementedError

    def env(self, ms: ServedModel) -> list[dict[str, Any]]:
        """Variables this engine needs besides the common ones."""
        return []

    def fetched_env(self, ms: ServedModel) -> list[dict[str, Any]]:
        """Variables for an engine whose model the fetch init container put in the hub cache: read it
        from there without asking the hub (huggingface_hub's offline mode, for vLLM and SGLang). With
        adapters it stays online: an adapter added to a running pod is downloaded by the engine."""
        if ms.spec.adapters is not None:
            return []
        return [{"name": "HF_HUB_OFFLINE", "value": "1"}]

    def launch(self, ms: ServedModel, role: Role) -> tuple[list[str], list[str]]:
        """The container's command and args for a pod of `role`: by default the engine's program with
        its arguments and the spec's engineArgs last (an engine that spans nodes overrides it)."""
        if role != Role.SINGLE:
            raise ValueError(f"{self.title} does not run across nodes")
        if view.multi_node(ms.spec):
            raise ValueError(f"{ms.name} spans {view.node_count(ms.spec)} nodes: its pods are a leader and workers")
        return list(self.command), [*self.args(ms), *ms.spec.engine_args]

    @property
    def image_env(self) -> str:
        """The operator's setting that replaces `image` (the chart's engines.<name>.image sets it)."""
        return ENGINE_IMAGE_PREFIX + self.name.upper()

    def why_not(self, field: str) -> str:
        """Why this engine refuses a spec field (or some of its values), from `refusals`."""
        reasons = dict(self.refusals)
        if field not in reasons:
            raise ValueError(f"engine {self.name} refuses {field} and its refusals do not say why")
        return reasons[field]

    def batch_size(self, spec: SpecView) -> int:
        """How many requests the engine runs at once for this spec: the batch flag's value in
        engineArgs, else the batch variable's in env, else the version's default. A value the engine
        would refuse (it then stops at start, saying why) or take as "auto" counts as the default."""
        given = positive_int(self.flag_value(spec.engine_args, self.batch_flags))
        if given is None and self.batch_env:
            given = positive_int(env_value(spec, self.batch_env))
        return given or self.default_batch

    def target_per_replica(self, spec: SpecView) -> int:
        """The autoscaler's target when the spec leaves it unset: never above the batch, which is all a
        replica runs at once."""
        batch = self.batch_size(spec)
        return min(self.default_target, batch) if self.default_target else batch

    def token_events(self, spec: SpecView) -> int:
        """Streamed tokens/s a replica's GPUs may send at full batch (0 on CPUs), by the model's size."""
        return self.gpu_count(spec) * token_rates.tokens_per_gpu(spec.model) if self.on_gpus else 0

    def flag_value(self, args: Sequence[str], flags: tuple[str, ...]) -> str | None:
        """The value the engine's parser takes for one of `flags` from `args`: the last one given
        (argparse and llama.cpp alike keep the last), as `--flag value` or `--flag=value`."""
        value = None
        for index, arg in enumerate(args):
            if self.sets_flag(arg, flags):
                if "=" in arg:
                    value = arg.split("=", 1)[1]
                elif index + 1 < len(args):
                    value = args[index + 1]
        return value

    def gpu_count(self, spec: SpecView) -> int:
        """GPUs per replica, with this engine's default."""
        return view.gpu_count(spec, self.on_gpus)

    def gpus_per_node(self, spec: SpecView) -> int:
        return view.gpus_per_node(spec, self.on_gpus)

    def split(self, spec: SpecView) -> tuple[int, int]:
        """(tensor, pipeline) parallel sizes of a replica."""
        return view.split(spec, self.on_gpus)

    def sets_flag(self, arg: str, flags: tuple[str, ...]) -> bool:
        """Whether one engineArgs item sets one of `flags` (all long, or short for llama.cpp) as this
        engine's parser reads it: alone, as `--flag=value`, and (per the parser) with `_` for `-` or
        abbreviated to a prefix longer than `--`."""
        name = arg.split("=", 1)[0]
        if self.underscored_flags:
            name = name.replace("_", "-")
        if name in flags:
            return True
        return self.abbreviated_flags and len(name) > 2 and any(flag.startswith(name) for flag in flags)

    def any_sets_flag_cel(self, args: str, flags: tuple[str, ...]) -> str:
        """`sets_flag` for any item of the list `args`, in CEL."""
        name = "a.split('=')[0]" + (".replace('_', '-')" if self.underscored_flags else "")
        listed = cel_list(flags)
        test = f"n in {listed}"
        if self.abbreviated_flags:
            test += f" || (n.size() > 2 && {listed}.exists(f, f.startsWith(n)))"
        return f"{args}.map(a, {name}).exists(n, {test})"

    @property
    def spelling(self) -> str:
        """How the flags may be spelt, for refusal messages."""
        ways = ["alone or as --flag=value"]
        if self.underscored_flags:
            ways.append("with _ for -")
        if self.abbreviated_flags:
            ways.append("or abbreviated")
        return ", ".join(ways)

    def security_context(self) -> dict[str, Any]:
        """Every engine, root or not: no way to gain privileges, no capabilities (not even NET_RAW),
        the runtime's default seccomp filter; a non-root one its user, and a read-only root filesystem
        where read_only_root."""
        hardened = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        if self.run_as_user is None:
            return hardened
        uid = self.run_as_user
        user: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}
        if self.read_only_root:
            user["readOnlyRootFilesystem"] = True
        return {**user, **hardened}

    def upstream_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def container(
        self,
        ms: ServedModel,
        image: str,
        drain_seconds: int,
        hub_endpoint: str = "",
        role: Role = Role.SINGLE,
        fetched: bool = False,
        sidecar_port: int | None = None,
        sidecar_tls: bool = False,
    ) -> dict[str, Any]:
        """The engine container: no ports (nothing outside the pod may reach it), no probes (the
        sidecar's readiness covers the engine), and a preStop so it keeps answering while the sidecar
        drains: with `sidecar_port` (the sidecar is in this pod), a GET of its DRAINED_ROUTE, which
        answers once the sidecar is done (bounded by `drain_seconds` after its stop; `sidecar_tls`: that
        port serves HTTPS); without, a sleep of `drain_seconds`. A group's workers get the same image,
        environment and volumes as its leader (each loads its part of the weights). `fetched`: the
        model is in the hub cache already (the node cache's init container put it there)."""
        spec = ms.spec
        command, args = self.launch(ms, role)
        ours = [*_common_env(spec, hub_endpoint), *self._home_env(), *self.env(ms)]
        if fetched:
            ours = merge_env(ours, self.fetched_env(ms))
        container: dict[str, Any] = {
            "name": CONTAINER_NAME,
            "image": spec.image or image,
            "command": command,
            "args": args,
            "env": merge_env(ours, [var.to_wire() for var in spec.env]),
        }
        resources = _resources(spec, self.gpus_per_node(spec))
        if resources:
            container["resources"] = resources
        container["volumeMounts"] = [
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            *self.writable_mounts(),
            {"name": CACHE_VOLUME, "mountPath": HUB_CACHE_PATH},
        ]
        if spec.chat_template is not None:
            container["volumeMounts"].append(
                {"name": CHAT_TEMPLATE_VOLUME, "mountPath": CHAT_TEMPLATE_DIR, "readOnly": True}
            )
        # The sidecar's one port speaks HTTPS with spec.tls: so does this GET (unverified, as every probe).
        scheme = {"scheme": "HTTPS"} if sidecar_tls else {}
        drained = {"httpGet": {"path": DRAINED_ROUTE, "port": sidecar_port, **scheme}} if sidecar_port else None
        container["lifecycle"] = {"preStop": drained or {"sleep": {"seconds": drain_seconds}}}
        container["securityContext"] = self.security_context()
        # An engine that refuses its arguments says why on its last log line: keep it in the
        # container's status, where the operator's CrashLoop condition reads it.
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
        return container

    def _home_env(self) -> list[dict[str, Any]]:
        # A UID of no account gets HOME=/ from the runtime: point it at the writable volume.
        if self.run_as_user is None:
            return []
        env = [{"name": "HOME", "value": HOME_PATH}]
        if self.user_caches:
            # The cache and temporary directories said outright, on their volumes: an image that sets
            # its own would send them to its root filesystem, where the engine's user writes nothing.
            env += [
                {"name": "USER", "value": NONROOT_USER},
                {"name": "XDG_CACHE_HOME", "value": CACHE_HOME_PATH},
                {"name": "TMPDIR", "value": TMP_PATH},
            ]
        return env

    def pod_security_context(self) -> dict[str, Any]:
        """The pod's part: the hub cache volume (a claim too) writable by a non-root engine's group;
        its ownership changes only when the volume's root does not match, not file by file each start."""
        if self.run_as_user is None:
            return {}
        return {"fsGroup": self.run_as_user, "fsGroupChangePolicy": "OnRootMismatch"}

    def writable_mounts(self) -> list[dict[str, str]]:
        """HOME (with user_caches ~/.cache too) and /tmp on emptyDirs, for a non-root engine; the hub
        cache mounts inside them after them."""
        if self.run_as_user is None:
            return []
        mounts = [{"name": HOME_VOLUME, "mountPath": HOME_PATH}]
        if self.user_caches:
            mounts.append({"name": CACHE_HOME_VOLUME, "mountPath": CACHE_HOME_PATH})
        return [*mounts, {"name": TMP_VOLUME, "mountPath": TMP_PATH}]


def cel_list(names: Iterable[str]) -> str:
    """Names as a CEL list of string literals (names hold no quote)."""
    return "[" + ", ".join(f"'{name}'" for name in names) + "]"


def positive_int(value: str | None) -> int | None:
    """A flag's or variable's value as a count, or None when it is not one (pure)."""
    value = (value or "").strip()
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None


def env_value(spec: SpecView, name: str) -> str | None:
    """A variable's literal value in spec.env (None: unset, or set from a Secret or field)."""
    for var in spec.env:
        if var.name == name:
            return var.to_wire().get("value")
    return None


def _common_env(spec: SpecView, hub_endpoint: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": HUB_CACHE_PATH}]
    if hub_endpoint:
        # huggingface_hub (vLLM, SGLang) reads HF_ENDPOINT; llama.cpp reads MODEL_ENDPOINT first.
        env += [{"name": "HF_ENDPOINT", "value": hub_endpoint}, {"name": "MODEL_ENDPOINT", "value": hub_endpoint}]
    if spec.hf_token_secret_ref:
        ref = spec.hf_token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def merge_env(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`theirs` wins by name and keeps our order; new names go last in their order."""
    by_name = {var["name"]: var for var in theirs}
    merged = [by_name.pop(var["name"], var) for var in ours]
    return merged + [var for var in theirs if var["name"] in by_name]


def _resources(spec: SpecView, gpus_per_node: int) -> dict[str, Any]:
    resources = spec.resources.to_wire() if spec.resources else {}
    if gpus_per_node:
        # Extended resources take limits only; the request defaults to the limit. Per pod: a replica
        # spanning nodes has gpus / nodes on each of its pods.
        resources["limits"] = {**resources.get("limits", {}), GPU_RESOURCE: str(gpus_per_node)}
    return resources


def command_line(container: dict[str, Any]) -> str:
    """The container's program and arguments as one shell-quoted line (for humans and reports)."""
    return shlex.join([*container.get("command", []), *container.get("args", [])])
