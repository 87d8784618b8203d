"""RBAC proven: the operator, holding only the chart's ServiceAccount token, reconciles an example to
Ready, and `kubectl auth can-i --as` shows what that account cannot do.

Its own control plane: the operator tests keep an admin-credentialed operator running for the whole
session in the shared cluster, and it would reconcile our ModelServer too, proving nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.certificates import CA, other_key
from harness.sidecar import SecretDir
from harness.testdata import CRD_PATH
from modelserve_sandbox.cluster import Cluster
from modelserve_sandbox.processes import free_ports, start_process, stop_process, tail, wait_until
from tests.helpers.chart import CHART, REPO, literal_env

EXAMPLE = REPO / "examples" / "lfm2-1.2b.yaml"  # private auth: the operator must create the key Secret
# A replica spanning two nodes (a LeaderWorkerSet group of two 2-GPU pods), then moved to one node
# (its LeaderWorkerSet deleted for a Deployment): what the chart grants on leaderworkersets.
GROUP = {
    "apiVersion": "serving.modelserve.dev/v1alpha1",
    "kind": "ModelServer",
    "metadata": {"name": "group"},
    "spec": {"model": "LiquidAI/LFM2-24B-A2B", "gpus": 4, "nodes": 2, "auth": {"mode": "public"}},
}
OPERATOR = Path(sys.executable).with_name("modelserve-operator")
MODELSERVERS = "modelservers.serving.modelserve.dev"
# RBAC refusals in the API server's words, and kopf's when it lacks a permission it wanted.
DENIALS = ("is forbidden: User", "Not enough permissions")


@pytest.fixture(scope="module")
def rbac_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Two GPU nodes: a group of the multi-node ModelServer puts one pod on each.
    with Cluster(tmp_path_factory.mktemp("rbac-cluster"), gpu_nodes=2, cpu_nodes=1, real_node=False) as cluster:
        yield cluster


@dataclass(frozen=True)
class Install:
    release: str
    namespace: str  # where the operator's ServiceAccount lives
    watched: tuple[str, ...]  # empty: all namespaces

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.release}"

    @property
    def gateway_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.release}-gateway"


def _install(cluster: Cluster, watched: tuple[str, ...]) -> Install:
    install = Install(f"modelserve-{uuid.uuid4().hex[:6]}", f"op-{uuid.uuid4().hex[:6]}", watched)
    cluster.create_namespace(install.namespace)
    for namespace in watched:
        cluster.create_namespace(namespace)
    sets = ["--set", f"operator.watchNamespaces={{{','.join(watched)}}}"] if watched else []
    # The CRD applied apart, as GitOps would (one release per cluster may own it; two install here).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.wait_established("modelservers.serving.modelserve.dev")
    sets += ["--set", "crds.enabled=false"]
    cluster.helm(
        "install", install.release, str(CHART), "--namespace", install.namespace, *sets, "--wait", "--timeout", "120s"
    )
    return install


def service_account_kubeconfig(cluster: Cluster, install: Install, path: Path, account: str | None = None) -> Path:
    """A kubeconfig holding only a TokenRequest token of one of the chart's ServiceAccounts."""
    account = account or install.release
    token = cluster.kubectl("create", "token", account, "-n", install.namespace, "--duration=1h").stdout.strip()
    admin = json.loads(cluster.kubeconfig.read_text())
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "operator",
                "clusters": admin["clusters"],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [
                    {"name": "operator", "context": {"cluster": admin["clusters"][0]["name"], "user": "operator"}}
                ],
            }
        )
    )
    path.chmod(0o600)
    return path


def _ready(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    ms = json.loads(cluster.kubectl("get", "modelserver", name, "-n", namespace, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in ms.get("status", {}).get("conditions", [])}
    return ms if conditions.get("Ready") == "True" else None


def run_operator_to_ready(cluster: Cluster, install: Install, app_namespace: str, workdir: Path) -> dict[str, Any]:
    """Start the operator with the ServiceAccount's kubeconfig, apply the example, wait for Ready."""
    kubeconfig = service_account_kubeconfig(cluster, install, workdir / "operator.kubeconfig")
    # The same arguments the chart gives the operator in its Deployment.
    rendered = cluster.helm("get", "manifest", install.release, "-n", install.namespace).stdout
    deployment = next(
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    # Its liveness endpoint on a free loopback port instead of the pod's 0.0.0.0:8080.
    liveness = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
    args = [f"--liveness={liveness}" if arg.startswith("--liveness=") else arg for arg in args]
    # It leads only once it holds the chart's Lease: the Role for it is exercised too.
    (lease,) = [var for var in container["env"] if var["name"] == "MODELSERVE_LEADER_ELECTION_LEASE"]
    env = {**cluster.env, "KUBECONFIG": str(kubeconfig), lease["name"]: lease["value"]}
    process = start_process("operator", [str(OPERATOR), *args], workdir, env=env)
    log = workdir / "operator.log"
    try:
        cluster.kubectl("apply", "-n", app_namespace, "-f", str(EXAMPLE))
        name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
        found: dict[str, Any] = {}

        def ready_or_exited() -> bool:
            found["ms"] = _ready(cluster, app_namespace, name)
            return process.poll() is not None or found["ms"] is not None

        wait_until(
            ready_or_exited, 120, f"ModelServer {name} Ready", interval=0.5, on_timeout=lambda: "\n" + tail(log, 40)
        )
        assert process.poll() is None, f"the operator exited:\n{tail(log)}"
        run_group_to_ready_and_back(cluster, app_namespace, process, log)
    finally:
        stop_process(process, grace_seconds=20)
    text = log.read_text()
    assert not [line for line in text.splitlines() if any(d in line for d in DENIALS)], tail(log, 60)
    return found["ms"]


def run_group_to_ready_and_back(cluster: Cluster, namespace: str, process: Any, log: Path) -> None:
    """GROUP Ready as a LeaderWorkerSet, then on one node: its LeaderWorkerSet goes."""

    def kubectl_get(kind: str) -> dict[str, Any] | None:
        out = cluster.kubectl("get", kind, "group", "-n", namespace, "-o", "json", "--ignore-not-found").stdout
        return json.loads(out) if out.strip() else None

    def ready_or_exited() -> bool:
        return process.poll() is not None or _ready(cluster, namespace, "group") is not None

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(GROUP))
    wait_until(ready_or_exited, 120, "ModelServer group Ready", interval=0.5, on_timeout=lambda: "\n" + tail(log, 40))
    assert process.poll() is None, f"the operator exited:\n{tail(log)}"
    assert (kubectl_get("leaderworkerset") or {})["spec"]["leaderWorkerTemplate"]["size"] == 2
    one_node = {**GROUP, "spec": {**GROUP["spec"], "gpus": 2, "nodes": 1}}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(one_node))
    wait_until(
        lambda: process.poll() is not None or (kubectl_get("leaderworkerset") is None and kubectl_get("deployment")),
        120,
        "the LeaderWorkerSet replaced by a Deployment",
        interval=0.5,
        on_timeout=lambda: "\n" + tail(log, 40),
    )
    assert process.poll() is None, f"the operator exited:\n{tail(log)}"


def run_gateway_and_route(cluster: Cluster, install: Install, app: str, ms: dict[str, Any], workdir: Path) -> None:
    """`modelserve-gateway` with only its ServiceAccount's token and the chart's environment: it
    lists and watches (ready), knows the ModelServer (its KWOK pods run nothing, so it holds a keyed
    request, then 503 model_starting, not 404), refuses a model nobody serves, and a request without
    a key for either; its log shows no refusal."""
    import httpx

    kubeconfig = service_account_kubeconfig(
        cluster, install, workdir / "gateway.kubeconfig", f"{install.release}-gateway"
    )
    rendered = cluster.helm("get", "manifest", install.release, "-n", install.namespace).stdout
    deployment = next(
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    )
    env = literal_env(deployment["spec"]["template"]["spec"]["containers"][0])
    (port,) = free_ports(1)
    env |= {"MODELSERVE_GATEWAY_LISTEN_HOST": "127.0.0.1", "MODELSERVE_GATEWAY_LISTEN_PORT": str(port)}
    env |= {"MODELSERVE_GATEWAY_HOLD_SECONDS": "1"}
    gateway = start_process(
        "gateway",
        [str(OPERATOR.with_name("modelserve-gateway"))],
        workdir,
        env={**cluster.env, **env, "KUBECONFIG": str(kubeconfig)},
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 60, "the gateway ready", interval=0.5, on_timeout=lambda: tail(workdir / "gateway.log", 40))
        request = {"model": ms["metadata"]["name"], "messages": [{"role": "user", "content": "hi"}]}
        # The example is private: with a key (one the gateway has not seen: only a replica can check
        # it) the request is held; without one it is the sidecar's 401 at once, as for a model nobody
        # serves, so that no keyless caller learns which private models exist.
        keyed = {"Authorization": "Bearer not-seen-before"}
        known = httpx.post(f"{base}/v1/chat/completions", json=request, headers=keyed, timeout=30)
        assert known.status_code == 503 and known.json()["error"]["code"] == "model_starting", known.text
        unknown = httpx.post(
            f"{base}/v1/chat/completions", json={**request, "model": "nobody"}, headers=keyed, timeout=30
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
        for model in (request["model"], "nobody"):
            keyless = httpx.post(f"{base}/v1/chat/completions", json={**request, "model": model}, timeout=30)
            assert keyless.status_code == 401 and keyless.json()["error"]["code"] == "missing_api_key", keyless.text
    finally:
        stop_process(gateway, grace_seconds=10)
    text = (workdir / "gateway.log").read_text()
    assert not [line for line in text.splitlines() if any(d in line for d in DENIALS)], tail(
        workdir / "gateway.log", 60
    )


def refused_certificate_is_an_event(cluster: Cluster, install: Install, workdir: Path) -> None:
    """`modelserve-gateway` with only its ServiceAccount's token, a key that does not match its
    certificate and the pod names the chart gives it from the downward API: it exits 2 with one line
    naming the key file, and that line is a Warning Event on its pod (its Role allows exactly that)."""
    kubeconfig = service_account_kubeconfig(
        cluster, install, workdir / "gateway-events.kubeconfig", f"{install.release}-gateway"
    )
    tls_dir = workdir / "gateway-tls"
    SecretDir(tls_dir).write(CA().issue().files(other_key()))
    pod = f"{install.release}-gateway-{uuid.uuid4().hex[:6]}"
    (port,) = free_ports(1)
    env = {
        **cluster.env,
        "KUBECONFIG": str(kubeconfig),
        "MODELSERVE_GATEWAY_LISTEN_PORT": str(port),
        "MODELSERVE_GATEWAY_TLS_DIR": str(tls_dir),
        "MODELSERVE_GATEWAY_OWN_POD": pod,
        "MODELSERVE_GATEWAY_OWN_NAMESPACE": install.namespace,
    }
    gateway = OPERATOR.with_name("modelserve-gateway")
    ended = subprocess.run([str(gateway)], env=env, capture_output=True, text=True, timeout=120)
    assert ended.returncode == 2, ended.stderr
    line = ended.stderr.strip().splitlines()[-1]
    assert line.startswith(f"modelserve-gateway: cannot serve TLS: {tls_dir / 'tls.key'}: does not match"), ended.stderr
    assert not [d for d in DENIALS if d in ended.stderr], ended.stderr
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", install.namespace, "--field-selector", f"involvedObject.name={pod}", "-o", "json"
        ).stdout
    )["items"]
    assert [(e["type"], e["reason"], e["message"]) for e in events] == [("Warning", "TLSCertificateRefused", line)]
    assert events[0]["involvedObject"]["kind"] == "Pod"


def can_i(
    cluster: Cluster, install: Install, verb: str, resource: str, namespace: str | None, user: str | None = None
) -> bool:
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    resource, _, subresource = resource.partition("/")
    sub = [f"--subresource={subresource}"] if subresource else []
    as_user = user or install.user
    result = cluster.kubectl("auth", "can-i", verb, resource, *sub, *scope, f"--as={as_user}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


# What the operator needs, wherever it serves ModelServers.
NEEDED = [
    ("get", "modelservers.serving.modelserve.dev"),
    ("list", "modelservers.serving.modelserve.dev"),
    ("watch", "modelservers.serving.modelserve.dev"),
    ("patch", "modelservers.serving.modelserve.dev/status"),
    ("update", "modelservers.serving.modelserve.dev/finalizers"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("update", "deployments.apps"),
    ("watch", "deployments.apps"),
    # The old workload goes when a ModelServer moves between one node and several.
    ("delete", "deployments.apps"),
    ("create", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("patch", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("update", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("list", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("watch", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("delete", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("create", "services"),
    ("patch", "services"),
    ("update", "services"),
    ("create", "persistentvolumeclaims"),
    ("update", "persistentvolumeclaims"),
    ("create", "configmaps"),
    ("patch", "configmaps"),
    ("watch", "configmaps"),
    ("create", "secrets"),
    ("list", "secrets"),
    ("watch", "secrets"),
    ("list", "pods"),
    ("watch", "pods"),
    ("patch", "pods"),
    ("create", "events"),
    # spec.cache.prefetch: a Job per selected node fetches the model into that node's cache.
    ("create", "jobs.batch"),
    ("watch", "jobs.batch"),
]
# What it must never do, in a namespace it serves or anywhere else.
NEVER = [
    ("get", "secrets"),
    ("update", "secrets"),
    ("patch", "secrets"),
    ("delete", "secrets"),
    ("patch", "modelservers.serving.modelserve.dev"),
    ("delete", "modelservers.serving.modelserve.dev"),
    ("patch", "leaderworkersets.leaderworkerset.x-k8s.io/status"),
    ("delete", "services"),
    ("delete", "persistentvolumeclaims"),
    ("delete", "configmaps"),
    ("create", "pods"),
    ("delete", "pods"),
    ("create", "pods/exec"),
    ("get", "serviceaccounts"),
    ("create", "daemonsets.apps"),
    ("create", "statefulsets.apps"),
    ("delete", "jobs.batch"),  # a prefetch Job goes with its ModelServer (owner references)
    ("create", "cronjobs.batch"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("create", "serviceaccounts/token"),
    ("create", "poddisruptionbudgets.policy"),
]
# Cluster-scoped: never.
NEVER_CLUSTER = [
    ("get", "nodes"),
    ("patch", "nodes"),
    ("delete", "namespaces"),
    ("create", "namespaces"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("bind", "clusterroles.rbac.authorization.k8s.io"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("impersonate", "users"),
]


# The gateway reads ModelServers and their pods where it routes, and nothing else: keys stay with
# the sidecars, so it cannot read (or even list) a Secret anywhere.
GATEWAY_NEEDED = [
    ("list", "modelservers.serving.modelserve.dev"),
    ("watch", "modelservers.serving.modelserve.dev"),
    ("list", "pods"),
    ("watch", "pods"),
]
GATEWAY_NEVER = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("watch", "secrets"),
    ("patch", "modelservers.serving.modelserve.dev"),
    ("patch", "modelservers.serving.modelserve.dev/status"),
    ("create", "pods"),
    ("patch", "pods"),
    ("delete", "pods"),
    ("create", "pods/exec"),
    ("create", "pods/portforward"),
    ("patch", "deployments.apps"),
    ("create", "services"),
    ("get", "configmaps"),
    ("create", "events"),
    ("create", "serviceaccounts/token"),
]


def _assert_matrix(
    cluster: Cluster,
    install: Install,
    namespaces: list[str | None],
    expected: dict[tuple[str, str], bool],
    user: str | None = None,
) -> None:
    wrong = [
        f"{'can' if not want else 'cannot'} {verb} {resource} in {ns or 'all namespaces'}"
        for ns in namespaces
        for (verb, resource), want in expected.items()
        if can_i(cluster, install, verb, resource, ns, user) != want
    ]
    assert not wrong, f"{user or install.user}: " + "; ".join(wrong)


def _contained(rendered: Any, live: Any, path: str = "") -> list[str]:
    """Where `rendered` is not part of `live` (the API server only adds defaults to what was applied)."""
    if isinstance(rendered, dict) and isinstance(live, dict):
        return [miss for key, value in rendered.items() for miss in _contained(value, live.get(key), f"{path}.{key}")]
    if isinstance(rendered, list) and isinstance(live, list) and len(rendered) == len(live):
        pairs = enumerate(zip(rendered, live, strict=True))
        return [miss for i, (r, v) in pairs for miss in _contained(r, v, f"{path}[{i}]")]
    return [] if rendered == live else [f"{path}: rendered {rendered!r}, applied {live!r}"]


def assert_render_is_what_was_applied(cluster: Cluster, ms: dict[str, Any]) -> None:
    """`modelserve render` of the live ModelServer (its uid, its namespace) gives the applied children."""
    manifest = {key: ms[key] for key in ("apiVersion", "kind", "metadata", "spec")}
    result = subprocess.run(
        [str(OPERATOR.with_name("modelserve")), "render", "-"],
        input=json.dumps(manifest),
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
    )
    assert result.returncode == 0, result.stderr
    for rendered in yaml.safe_load_all(result.stdout):
        if rendered["kind"] == "Secret":
            continue  # rendered with a placeholder key
        meta = rendered["metadata"]
        live = json.loads(
            cluster.kubectl("get", rendered["kind"], meta["name"], "-n", meta["namespace"], "-o", "json").stdout
        )
        assert not _contained(rendered, live), _contained(rendered, live)


# A person bound to the cluster's `view` or `edit` role in a namespace, through the chart's
# aggregated ClusterRoles: ModelServers join what those roles already grant.
VIEWER_CAN = [("get", MODELSERVERS), ("list", MODELSERVERS), ("watch", MODELSERVERS), ("get", f"{MODELSERVERS}/status")]
EDITOR_CAN = [
    *VIEWER_CAN,
    ("create", MODELSERVERS),
    ("patch", MODELSERVERS),
    ("update", MODELSERVERS),
    ("delete", MODELSERVERS),
    ("update", f"{MODELSERVERS}/scale"),
]
NOBODY_CAN = [("patch", f"{MODELSERVERS}/status")]  # the operator's alone


def assert_default_roles_reach_modelservers(cluster: Cluster, install: Install, namespace: str) -> None:
    people = {"view": f"viewer-{namespace}", "edit": f"editor-{namespace}"}
    for role, user in people.items():
        cluster.kubectl("create", "rolebinding", user, f"--clusterrole={role}", f"--user={user}", "-n", namespace)

    def editor_can_create() -> bool:
        return can_i(cluster, install, "create", MODELSERVERS, namespace, people["edit"])

    # The controller-manager aggregates the chart's ClusterRoles into view and edit a moment later.
    wait_until(editor_can_create, 60, "the edit role to include ModelServers")
    editor = {**dict.fromkeys(EDITOR_CAN, True), **dict.fromkeys(NOBODY_CAN, False)}
    viewer = {**dict.fromkeys(VIEWER_CAN, True), **dict.fromkeys(EDITOR_CAN[len(VIEWER_CAN) :] + NOBODY_CAN, False)}
    _assert_matrix(cluster, install, [namespace], editor, people["edit"])
    _assert_matrix(cluster, install, [namespace], viewer, people["view"])
    # Only where bound: elsewhere neither reaches a ModelServer.
    _assert_matrix(cluster, install, ["default"], dict.fromkeys(EDITOR_CAN, False), people["edit"])


def test_all_namespaces_install(rbac_cluster: Cluster, tmp_path: Path) -> None:
    cluster = rbac_cluster
    install = _install(cluster, ())
    app = f"app-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(app)
    ms = run_operator_to_ready(cluster, install, app, tmp_path)
    assert ms["status"]["readyReplicas"] == 2
    secret = json.loads(
        cluster.kubectl("get", "secret", f"{ms['metadata']['name']}-api-keys", "-n", app, "-o", "json").stdout
    )
    assert secret["metadata"]["ownerReferences"][0]["uid"] == ms["metadata"]["uid"]  # the operator made it
    assert_render_is_what_was_applied(cluster, ms)

    _assert_matrix(cluster, install, [app, None], {**dict.fromkeys(NEEDED, True), **dict.fromkeys(NEVER, False)})
    _assert_matrix(cluster, install, [None], dict.fromkeys(NEVER_CLUSTER, False))
    # Even serving every namespace, no Secret is fetched by name (its own are watched as metadata only).
    assert not can_i(cluster, install, "get", "secrets", "kube-system")

    gateway = {**dict.fromkeys(GATEWAY_NEEDED, True), **dict.fromkeys(GATEWAY_NEVER, False)}
    _assert_matrix(cluster, install, [app, None], gateway, install.gateway_user)
    _assert_matrix(cluster, install, [None], dict.fromkeys(NEVER_CLUSTER, False), install.gateway_user)
    # Events on its own pod, in its own namespace only.
    assert can_i(cluster, install, "create", "events", install.namespace, install.gateway_user)
    assert not can_i(cluster, install, "create", "events", app, install.gateway_user)
    assert_default_roles_reach_modelservers(cluster, install, app)
    run_gateway_and_route(cluster, install, app, ms, tmp_path)
    refused_certificate_is_an_event(cluster, install, tmp_path)


def test_watched_namespaces_install(rbac_cluster: Cluster, tmp_path: Path) -> None:
    cluster = rbac_cluster
    app = f"app-{uuid.uuid4().hex[:6]}"
    install = _install(cluster, (app,))
    ms = run_operator_to_ready(cluster, install, app, tmp_path)
    assert ms["status"]["readyReplicas"] == 2

    _assert_matrix(cluster, install, [app], {**dict.fromkeys(NEEDED, True), **dict.fromkeys(NEVER, False)})
    # Outside the served namespace, even what it needs inside is refused: no Secret of another
    # namespace can be read, not even its own namespace's or kube-system's.
    elsewhere = ["kube-system", "default", None]
    _assert_matrix(cluster, install, elsewhere, dict.fromkeys(NEEDED + NEVER, False))
    # Its own namespace: only the gateway's pods, listed and watched to read the requests they hold.
    own = dict.fromkeys(NEEDED + NEVER, False) | {("list", "pods"): True, ("watch", "pods"): True}
    _assert_matrix(cluster, install, [install.namespace], own)
    _assert_matrix(cluster, install, [None], dict.fromkeys(NEVER_CLUSTER, False))
    # Cluster-scoped reads kopf uses: CRDs and namespace names; and the nodes' labels a prefetch selects
    # by (listed and watched, never one read by name); nothing else.
    assert can_i(cluster, install, "watch", "customresourcedefinitions.apiextensions.k8s.io", None)
    assert can_i(cluster, install, "list", "namespaces", None)
    assert can_i(cluster, install, "list", "nodes", None) and can_i(cluster, install, "watch", "nodes", None)
    assert not can_i(cluster, install, "get", "customresourcedefinitions.apiextensions.k8s.io", None)

    gateway = {**dict.fromkeys(GATEWAY_NEEDED, True), **dict.fromkeys(GATEWAY_NEVER, False)}
    _assert_matrix(cluster, install, [app], gateway, install.gateway_user)
    _assert_matrix(
        cluster, install, [*elsewhere, install.namespace], dict.fromkeys(GATEWAY_NEEDED, False), install.gateway_user
    )
    run_gateway_and_route(cluster, install, app, ms, tmp_path)
