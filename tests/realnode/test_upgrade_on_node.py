"""`helm upgrade` to a version-bumped image on the real node: the chart's two operator pods are
replaced, the models keep running (pod UIDs and restart counts unchanged) and their status shows the
pending upgrade; opting in rolls that ModelServer only, onto the new sidecar, which then serves.
Then the leader's pod is deleted: the standby takes over (time printed)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from modelserve import __version__
from modelserve_sandbox.cluster import Cluster, default_cache
from modelserve_sandbox.realnode import image_archives
from tests.helpers.bumped_image import bump
from tests.helpers.node_view import CHART, REAL_WAIT_SECONDS, NodeView, cpu_server, install_chart

SIDECAR = "sidecar"


def _pods(view: NodeView, name: str) -> dict[str, tuple[str, int]]:
    """uid -> (sidecar image, restarts) of the ModelServer's pods that are not terminating."""
    out = {}
    for pod in view.pods(name):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        image = next(c["image"] for c in pod["spec"]["containers"] if c["name"] == SIDECAR)
        restarts = sum(s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses", []))
        out[pod["metadata"]["uid"]] = (image, restarts)
    return out


def _operator_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component=operator"
    items = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)["items"]
    return [pod for pod in items if not pod["metadata"].get("deletionTimestamp")]


def test_helm_upgrade_restarts_no_model_and_opting_in_rolls_one(node_cluster: Cluster, tmp_path: Path) -> None:
    release, system, apps = "modelserve", f"ms-system-{uuid.uuid4().hex[:6]}", f"apps-{uuid.uuid4().hex[:6]}"
    node_cluster.create_namespace(apps)
    install_chart(node_cluster, release, system)
    view = NodeView(node_cluster, apps, tmp_path / "no-host-operator.log")
    try:
        for name in ("kept", "opted"):
            view.apply(cpu_server(name, public=True))
        for name in ("kept", "opted"):
            view.wait_phase(name, "Ready")
        before = {name: _pods(view, name) for name in ("kept", "opted")}
        old_sidecar = next(iter(before["kept"].values()))[0]

        # The next release's image: ours with one layer more, its own version and tag.
        (archive,) = [p for p in image_archives(default_cache()) if p.name.startswith("modelserve-")]
        bumped = bump(archive, tmp_path / "bumped.tar", f"{__version__}-bumped")
        node_cluster.import_image(tmp_path / "bumped.tar")
        started = time.monotonic()
        node_cluster.helm(
            "upgrade", release, str(CHART), "-n", system, "--reuse-values",
            "--set", f"image.tag={__version__}-bumped", "--wait", "--timeout", "180s",
        )  # fmt: skip
        view.wait(
            lambda: {p["spec"]["containers"][0]["image"] for p in _operator_pods(node_cluster, system)} == {bumped},
            "the old operator pods gone",
        )
        for name in ("kept", "opted"):
            view.wait(
                lambda name=name: (
                    (view.get("modelserver", name) or {}).get("status", {}).get("upgrade", {}).get("available") == "Yes"
                ),
                f"{name}'s status to show the pending upgrade",
            )
        print(f"\nhelm upgrade -> both operator pods replaced, upgrade in status: {time.monotonic() - started:.1f} s")
        time.sleep(5)  # a few of the new operator's reconciles
        for name, pods in before.items():
            assert _pods(view, name) == pods, f"{name}'s pods were replaced or restarted by the upgrade"
        kept = view.get("modelserver", "kept") or {}
        assert kept["status"]["versions"]["sidecar"] == old_sidecar and kept["status"]["upgrade"]["sidecar"] == bumped

        # The owner opts in: that ModelServer rolls onto the bumped sidecar, which serves; the other stays.
        view.kubectl(
            "patch", "ms", "opted", "--type", "merge", "-p", json.dumps({"spec": {"upgradePolicy": "Automatic"}})
        )
        view.wait(
            lambda: (
                {image for image, _ in _pods(view, "opted").values()} == {bumped}
                and len(view.ready_pods("opted")) == 1
                and (view.get("modelserver", "opted") or {}).get("status", {}).get("phase") == "Ready"
            ),
            "opted rolled onto the bumped sidecar and Ready",
            REAL_WAIT_SECONDS,
        )
        assert not set(_pods(view, "opted")) & set(before["opted"])
        assert _pods(view, "kept") == before["kept"]

        # Failover: the leader's pod goes (its container stops, releasing the Lease); the standby leads.
        (deployment,) = json.loads(
            node_cluster.kubectl(
                "get", "deployment", "-n", system, "-l", "app.kubernetes.io/component=operator", "-o", "json"
            ).stdout
        )["items"]
        env = {v["name"]: v.get("value") for v in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        lease_namespace, lease_name = env["MODELSERVE_LEADER_ELECTION_LEASE"].split("/")
        lease = json.loads(node_cluster.kubectl("get", "lease", lease_name, "-n", lease_namespace, "-o", "json").stdout)
        holder = lease["spec"]["holderIdentity"]
        (leader,) = [p for p in _operator_pods(node_cluster, system) if holder.startswith(f"{p['metadata']['name']}_")]
        node_cluster.kubectl("delete", "pod", leader["metadata"]["name"], "-n", system, "--wait=false")
        deleted = time.monotonic()
        view.apply(cpu_server("after-failover", public=True))
        view.wait(lambda: view.get("deployment", "after-failover"), "the new leader to create a Deployment")
        print(f"leader pod deleted -> new ModelServer's Deployment: {time.monotonic() - deleted:.1f} s")
    finally:
        node_cluster.kubectl("delete", "namespace", apps, "--wait=false", check=False)
        node_cluster.kubectl("delete", "pods", "--all", "-n", apps, "--grace-period=1", "--wait=false", check=False)
        node_cluster.helm("uninstall", release, "--namespace", system, "--wait", "--timeout", "120s")
