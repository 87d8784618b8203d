"""The chart against the real API server: server-side dry run of its output, install and uninstall."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from modelserve_sandbox.cluster import Cluster, default_cache
from modelserve_sandbox.processes import wait_until
from tests.helpers.chart import CHART, REPO, by_kind, objects, template_args

CRD_NAME = "modelservers.serving.modelserve.dev"
CRD_FILE = "crds/modelserver.yaml"


def server_version(cluster: Cluster) -> str:
    return json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]


@pytest.mark.parametrize("scope", ["all-namespaces", "watched-namespaces"])
def test_api_server_accepts_the_rendered_chart(cluster: Cluster, namespace: str, scope: str) -> None:
    # Everything but the ServiceMonitor, whose CRD (Prometheus Operator's) the sandbox lacks.
    sets = [
        "dashboard.enabled=true",
        "podAnnotations.team=ml",
        "nodeSelector.kubernetes\\.io/os=linux",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "operator.extraEnv[0].name=HTTPS_PROXY",
        "operator.extraEnv[0].value=http://proxy:3128",
        "networkPolicy.enabled=true",
        "networkPolicy.allowedNamespaces={default}",
    ]
    if scope == "watched-namespaces":
        sets.append(f"operator.watchNamespaces={{{namespace},default}}")
    else:
        sets.append(f"networkPolicy.namespaces={{{namespace}}}")
    rendered = cluster.helm(
        *template_args("dry", namespace, *sets, kube_version=server_version(cluster)),
        "--include-crds",
        "--api-versions",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",  # the API server compiles its CEL
    ).stdout
    kinds = sorted({doc["kind"] for doc in objects(rendered)})
    expected = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "CustomResourceDefinition",
        "DaemonSet",  # the node cache's agents
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",  # the operator's two pods
        "Role",  # leader election's, in the release namespace
        "RoleBinding",
        "Service",  # the gateway's, the node cache's
        "ServiceAccount",
        "ValidatingAdmissionPolicy",  # the node cache agent changes only its labels of a node
        "ValidatingAdmissionPolicyBinding",
    }
    assert set(kinds) == expected
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr
    # Per watched namespace, the operator's Role and the gateway's (the release's namespace is
    # watched, so the operator needs no extra Role there to read the gateway's pods); leader election's;
    # and the gateway's Events on its own pod.
    assert len(by_kind(rendered, "Role")) == (6 if scope == "watched-namespaces" else 2)
    # The model pods' per namespace, and the node agents' own.
    assert len(by_kind(rendered, "NetworkPolicy")) == (2 if scope == "watched-namespaces" else 1) + 1


def test_install_and_uninstall(cluster: Cluster, crd_installed: None, namespace: str) -> None:
    release = f"modelserve-{uuid.uuid4().hex[:6]}"  # contains the chart name: objects are named after it
    # The session's CRD is applied apart (as GitOps would): this release does not own it.
    installed = cluster.helm(
        "install", release, str(CHART), "--namespace", namespace, "--set", "crds.enabled=false",
        "--wait", "--timeout", "120s",
    )  # fmt: skip
    assert "STATUS: deployed" in installed.stdout
    assert "kubectl get ms -n default -w" in installed.stdout  # NOTES.txt tells what to do next
    try:
        deployment = json.loads(cluster.kubectl("get", "deployment", release, "-n", namespace, "-o", "json").stdout)
        assert deployment["status"]["readyReplicas"] == 2  # KWOK ran the pods; --wait saw them Ready
        for kind in ("clusterrole", "clusterrolebinding"):
            cluster.kubectl("get", kind, release)
        # The node cache's agent may patch nodes (RBAC cannot say which labels), and its policy holds
        # it to its own models.serving.modelserve.dev/ labels, as the API server enforces it.
        agent = f"--as=system:serviceaccount:{namespace}:{release}-nodecache"
        said: list[str] = []

        def refused() -> bool:  # once the policy's binding is in force (the API server loads it)
            attempt = cluster.kubectl("label", "node", "cpu-0", "team=ml", agent, check=False)
            if attempt.returncode == 0:
                cluster.kubectl("label", "node", "cpu-0", "team-")
                return False
            said.append(attempt.stderr)
            return True

        wait_until(refused, 30, "the node cache agent refused another label of a node")
        assert "may change only a node's models.serving.modelserve.dev/ labels" in said[-1], said[-1]
        ours = "models.serving.modelserve.dev/m-0123456789abcdef0123456789abcdef"
        cluster.kubectl("label", "node", "cpu-0", f"{ours}=true", agent)
        cluster.kubectl("label", "node", "cpu-0", f"{ours}-")
        # It reads a pod's ModelServer by name (issue 57 L7), and lists no tenant's (kubectl answers "no"
        # for a resource the API server does not serve: hence the CRD here).
        modelservers = "modelservers.serving.modelserve.dev"
        for verb, allowed in (("get", "yes"), ("list", "no"), ("watch", "no"), ("patch", "no")):
            said_verb = cluster.kubectl("auth", "can-i", verb, modelservers, "-A", agent, check=False).stdout.strip()
            assert said_verb == allowed, (verb, said_verb)
    finally:
        uninstalled = cluster.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
    assert f'release "{release}" uninstalled' in uninstalled.stdout
    for kind, ns in (
        ("clusterrole", None),
        ("clusterrolebinding", None),
        ("serviceaccount", namespace),
        ("deployment", namespace),
    ):
        scope = ["-n", ns] if ns else []
        gone = cluster.kubectl("get", kind, release, *scope, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, f"{kind} {release} survived the uninstall"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=60).stdout


def previous_crd_commit() -> str:
    """The last commit whose chart kept the CRD in crds/ (0.1.0's layout, which Helm installs once and
    never owns): the release a user upgrades from, by the documented adoption."""
    removed = _git("log", "-1", "--format=%H", "--", "charts/modelserve/crds/modelserver.yaml").strip()
    assert removed, "no commit touched charts/modelserve/crds/: is the clone shallow?"
    return f"{removed}^"


def test_helm_upgrade_from_the_previous_crd_brings_the_new_schema_and_uninstall_keeps_it(
    cluster: Cluster, crd_installed: None, namespace: str, tmp_path: Path
) -> None:
    """The chart of the last commit that changed the CRD (its CRD in crds/, which Helm installs once),
    then `helm upgrade` to this one, as docs/how-to/upgrading.md says: a manifest with a new field,
    refused by the old schema, is accepted and kept by the new; `helm uninstall` keeps the CRD."""
    old = previous_crd_commit()
    archive = subprocess.run(["git", "archive", old, "charts/modelserve", CRD_FILE], cwd=REPO, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True, timeout=60)
    release = f"modelserve-{uuid.uuid4().hex[:6]}"
    # A cluster where the old release put its CRD (Helm skips crds/ when the CRD exists).
    cluster.kubectl("replace", "-f", str(tmp_path / CRD_FILE))
    manifest = {
        "apiVersion": "serving.modelserve.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "pulled", "namespace": namespace},
        "spec": {"model": "LiquidAI/LFM2-1.2B", "imagePullSecrets": [{"name": "regcred"}]},
    }
    try:
        cluster.helm("install", release, str(tmp_path / "charts" / "modelserve"), "--namespace", namespace)
        refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert refused.returncode != 0 and "imagePullSecrets" in refused.stderr, refused
        # Once, from a release whose CRD sat in crds/: Helm takes over only what names its release.
        cluster.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm", "--overwrite")
        cluster.kubectl(
            "annotate", "crd", CRD_NAME, f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}", "--overwrite",
        )  # fmt: skip
        upgraded = cluster.helm("upgrade", release, str(CHART), "--namespace", namespace)
        assert "has been upgraded" in upgraded.stdout, upgraded.stdout
        cluster.wait_established(CRD_NAME)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        kept = json.loads(cluster.kubectl("get", "ms", "pulled", "-n", namespace, "-o", "json").stdout)
        assert kept["spec"]["imagePullSecrets"] == [{"name": "regcred"}]  # not pruned by an old schema
        served = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
        wanted = yaml.safe_load((REPO / CRD_FILE).read_text())["spec"]["versions"]
        assert [v["schema"] for v in served["spec"]["versions"]] == [v["schema"] for v in wanted]
        uninstalled = cluster.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
        assert "kept due to the resource policy" in uninstalled.stdout, uninstalled.stdout
        assert json.loads(cluster.kubectl("get", "ms", "pulled", "-n", namespace, "-o", "json").stdout)["spec"]
    finally:
        cluster.helm("uninstall", release, "--namespace", namespace, check=False)
        cluster.kubectl("delete", "ms", "pulled", "-n", namespace, "--ignore-not-found", "--wait=false")
        # Back as the session's fixture applied it: this tree's CRD, owned by no release.
        cluster.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by-", check=False)
        release_annotations = ("meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-")
        cluster.kubectl("annotate", "crd", CRD_NAME, *release_annotations, "helm.sh/resource-policy-", check=False)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_FILE))
        cluster.wait_established(CRD_NAME)


def test_the_api_server_accepts_the_gateways_ingress_and_httproute_and_refuses_a_bad_hostname(
    cluster: Cluster, namespace: str
) -> None:
    """Against the real Gateway API CRDs (hack/fetch-gateway-api.sh) and the networking API: the
    chart's Ingress and HTTPRoute pass the API server's own validation, and the CRD's refuses a
    hostname it does not allow, naming the field."""
    crds = default_cache() / "gateway-api"
    assert (crds / "gateway.networking.k8s.io_httproutes.yaml").is_file(), "run hack/fetch-gateway-api.sh"
    cluster.kubectl("apply", "--server-side", "-f", str(crds / "gateway.networking.k8s.io_httproutes.yaml"))
    cluster.wait_established("httproutes.gateway.networking.k8s.io")
    parents = f"gateway-system-{uuid.uuid4().hex[:6]}"  # the platform's Gateway's namespace
    sets = [
        "gateway.ingress.enabled=true",
        "gateway.ingress.hosts={models.example.com}",
        "gateway.ingress.tls[0].secretName=models-tls",
        "gateway.httpRoute.enabled=true",
        "gateway.httpRoute.parentRefs[0].name=platform",
        f"gateway.httpRoute.parentRefs[0].namespace={parents}",
        "gateway.httpRoute.hostnames={models.example.com}",
    ]
    kube = server_version(cluster)
    show = ("--show-only", "templates/gateway-routes.yaml")
    rendered = cluster.helm(*template_args("exposed", namespace, *sets, kube_version=kube), *show).stdout
    assert {doc["kind"] for doc in objects(rendered)} == {"Ingress", "HTTPRoute"}
    accepted = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=rendered, check=False)
    assert accepted.returncode == 0, accepted.stderr
    bad = [*sets[:-1], "gateway.httpRoute.hostnames={Models_Example}"]
    route = cluster.helm(*template_args("exposed", namespace, *bad, kube_version=kube), *show).stdout
    refused = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=route, check=False)
    assert refused.returncode != 0 and "spec.hostnames[0]" in refused.stderr, refused.stderr
    # A parent the cluster lacks is accepted by the API server: the install's notes say so, first
    # without the Gateway kind, then without the Gateway, and say nothing once it exists.
    notes = _dry_run_notes(cluster, namespace, sets)
    assert f"WARNING: gateway.httpRoute's parent Gateway {parents}/platform: this cluster serves no" in notes, notes
    cluster.kubectl("apply", "--server-side", "-f", str(crds / "gateway.networking.k8s.io_gateways.yaml"))
    cluster.wait_established("gateways.gateway.networking.k8s.io")
    wait_until(
        lambda: "does not exist (yet)" in _dry_run_notes(cluster, namespace, sets),
        60,
        "the notes to name the missing Gateway once the kind is served",
    )
    cluster.create_namespace(parents)
    platform = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "platform", "namespace": parents},
        "spec": {"gatewayClassName": "platform", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(platform))
    assert "WARNING" not in _dry_run_notes(cluster, namespace, sets)


def _dry_run_notes(cluster: Cluster, namespace: str, sets: list[str]) -> str:
    """`helm install --dry-run=server` with `sets`: what the install would print, its notes read
    against the cluster (Helm's lookup)."""
    return cluster.helm(
        "install", "exposed", str(CHART), "--namespace", namespace, "--dry-run=server",
        "--set", "crds.enabled=false", *(arg for s in sets for arg in ("--set", s)),
    ).stdout  # fmt: skip
