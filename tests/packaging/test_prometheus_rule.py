"""The chart's PrometheusRule, without a Prometheus: every series its alerts name is one a program
exports (their registries, as docs/reference/metrics.md is generated from them) or Prometheus's own
`up`; Prometheus's own rule checks pass on it and refuse a broken rule; and its alerts fire, in
promtool's rule unit tests, on series named and labelled as the programs export them and as the
chart's ServiceMonitors scrape them.

rulecheck (hack/build-rulecheck.sh) is `promtool check rules` and `promtool test rules` built from the
pinned Prometheus module: its model/rulefmt, its promql parser and promtool's own unittest.go.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.docgen.metrics import PROGRAMS, families
from modelserve_sandbox.cluster import default_bin_dir
from tests.helpers.chart import Helm, by_kind, template_args

RELEASE, NAMESPACE = "ms", "modelserve-system"
ON = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true")
# Prometheus's own series of a target, not a program's.
PROMETHEUS_SERIES = {"up"}
ALERTS = {
    "ModelserveSidecarUpstreamErrors",
    "ModelserveKeyRefusals",
    "ModelserveModelUnavailable",
    "ModelserveHeldRequestsFailed",
    "ModelserveGatewayDown",
    "ModelserveGatewayCertificateExpiring",
    "ModelserveGatewayCertificateRefused",
    "ModelserveOperatorDown",
    "ModelserveOperatorNotReconciling",
    "ModelserveNodeCacheUnavailable",
    "ModelserveNodeCacheAgentDown",
    "ModelserveNodeCacheCorruptFiles",
}
SUFFIXES = {"counter": ("",), "histogram": ("_bucket", "_sum", "_count")}  # counters' names end in _total

Rulecheck = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="module")
def rulecheck() -> Rulecheck:
    binary = default_bin_dir() / "rulecheck"
    assert binary.exists(), f"{binary} is missing: run hack/build-rulecheck.sh (hack/setup.sh does)"

    def run(*args: str | Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=120)

    return run


@functools.cache
def declared() -> dict[str, tuple[str, ...]]:
    """Every sample name the programs export, with its family's label names."""
    out: dict[str, tuple[str, ...]] = {}
    for _, _, registry in PROGRAMS:
        reg = registry()
        for name, kind, labels, _ in families(reg):
            for suffix in SUFFIXES.get(kind, ("",)):
                out[name + suffix] = labels + (("le",) if suffix == "_bucket" else ())
        # The standard process series (ProcessCollector) the proxies add.
        for family in reg.collect():
            for sample in family.samples:
                out.setdefault(sample.name, tuple(sample.labels))
    return out


def rendered_rule(helm: Helm, *sets: str) -> dict[str, Any]:
    (rule,) = by_kind(helm(*template_args(RELEASE, NAMESPACE, *ON, *sets)).stdout, "PrometheusRule")
    return rule


def write_rules(rule: dict[str, Any], path: Path) -> Path:
    """The PrometheusRule's groups as the rule file Prometheus loads (what the Prometheus Operator writes)."""
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def alerts(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_every_series_an_alert_names_is_exported(helm: Helm, rulecheck: Rulecheck, tmp_path: Path) -> None:
    rule = rendered_rule(helm)
    assert set(alerts(rule)) == ALERTS
    result = rulecheck("names", write_rules(rule, tmp_path / "rules.yaml"))
    assert result.returncode == 0, result.stderr
    named = {entry["rule"]: set(entry["names"]) for entry in map(json.loads, result.stdout.splitlines())}
    assert set(named) == ALERTS
    exported = declared()
    for alert, names in named.items():
        assert names, alert
        unknown = names - exported.keys() - PROMETHEUS_SERIES
        assert not unknown, f"{alert} names series no program exports: {unknown}"
    used = set().union(*named.values())
    # Each program's series are alerted on (the gateway's, the operator's, the agents', the sidecars').
    for _, prefix, _ in PROGRAMS:
        assert any(name.startswith(prefix + "_") for name in used), prefix


def test_the_extraction_sees_every_selector(rulecheck: Rulecheck, tmp_path: Path) -> None:
    """`names` reads Prometheus's parse tree: selectors inside functions, aggregations, binary operators
    and subqueries, and a selector by __name__ alone as "" (which the test above refuses)."""
    rules = tmp_path / "rules.yaml"
    expr = (
        'sum(rate(a_total[5m])) / on (x) group_left () max_over_time(b[10m:1m]) > 0 unless absent(up) or {__name__="c"}'
    )
    rules.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": expr}]}]}))
    result = rulecheck("names", rules)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"rule": "A", "names": ["a_total", "b", "up", ""]}


def test_job_selectors_name_the_chart_servicemonitors(helm: Helm) -> None:
    """The `up` alerts' jobs are the Services the chart's ServiceMonitors select (a target's job is its
    Service's name, the Prometheus Operator's default), in the release namespace."""
    rendered = helm(*template_args(RELEASE, NAMESPACE, *ON)).stdout
    services = {s["metadata"]["name"]: s for s in by_kind(rendered, "Service")}
    monitored = set()
    for monitor in by_kind(rendered, "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        for name, service in services.items():
            if selector.items() <= service["metadata"]["labels"].items():
                ports = [port["name"] for port in service["spec"]["ports"]]
                assert all(endpoint["port"] in ports for endpoint in monitor["spec"]["endpoints"]), name
                assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
                monitored.add(name)
    assert monitored == {"ms-modelserve-gateway", "ms-modelserve-metrics", "ms-modelserve-nodecache"}
    exprs = " ".join(r["expr"] for r in alerts(rendered_rule(helm)).values())
    for job in monitored:
        assert f'up{{job="{job}", namespace="{NAMESPACE}"}}' in exprs, job


def test_rules_follow_the_programs_installed(helm: Helm) -> None:
    everything = set(alerts(rendered_rule(helm)))
    without = {
        "gateway.enabled=false": {
            "ModelserveModelUnavailable",
            "ModelserveHeldRequestsFailed",
            "ModelserveGatewayDown",
            "ModelserveGatewayCertificateExpiring",
            "ModelserveGatewayCertificateRefused",
        },
        "operator.metricsPort=0": {
            "ModelserveOperatorDown",
            "ModelserveOperatorNotReconciling",
            "ModelserveNodeCacheUnavailable",
        },
        "nodeCache.enabled=false": {
            "ModelserveNodeCacheUnavailable",
            "ModelserveNodeCacheAgentDown",
            "ModelserveNodeCacheCorruptFiles",
        },
    }
    for value, gone in without.items():
        assert set(alerts(rendered_rule(helm, value))) == everything - gone, value


def test_rule_needs_the_servicemonitors(helm: Helm) -> None:
    result = helm(*template_args(RELEASE, NAMESPACE, "prometheusRule.enabled=true"), check=False)
    assert result.returncode != 0
    assert "prometheusRule.enabled needs serviceMonitor.enabled" in result.stderr


def test_alert_labels_and_rule_labels(helm: Helm) -> None:
    rule = rendered_rule(helm, "prometheusRule.labels.release=kube-prometheus", "prometheusRule.alertLabels.team=ml")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    for alert, body in alerts(rule).items():
        assert body["labels"]["team"] == "ml", alert
        assert body["labels"]["severity"] in {"info", "warning", "critical"}, alert


def test_prometheus_accepts_the_rules(helm: Helm, rulecheck: Rulecheck, tmp_path: Path) -> None:
    for sets in ((), ("operator.watchNamespaces={team-a}", "gateway.holdSeconds=1800")):
        result = rulecheck("check", write_rules(rendered_rule(helm, *sets), tmp_path / "rules.yaml"))
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


@pytest.mark.parametrize(
    ("where", "broken", "complaint"),
    [
        ("expr", "sum by (namespace (rate(modelserve_sidecar_requests_total[5m]))", "parse error"),
        ("expr", "rate(modelserve_sidecar_requests_total)", "expected type range vector"),
        ("summary", "{{ $labels.namespace ", "template"),
        ("for", "ten minutes", "not a valid duration"),
        ("duplicate", None, "duplicate rules"),
    ],
    ids=["unbalanced", "wrong-type", "annotation-template", "duration", "duplicate"],
)
def test_a_broken_rule_is_refused(
    helm: Helm, rulecheck: Rulecheck, tmp_path: Path, where: str, broken: str | None, complaint: str
) -> None:
    rule = rendered_rule(helm)
    rules = rule["spec"]["groups"][0]["rules"]
    if where == "duplicate":
        rules.append(dict(rules[0]))
    elif where == "summary":
        rules[0]["annotations"]["summary"] = broken
    else:
        rules[0][where] = broken
    result = rulecheck("check", write_rules(rule, tmp_path / "rules.yaml"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert complaint in result.stderr


# --- the alerts firing, in promtool's rule unit tests --------------------------------------------

# The labels a ServiceMonitor's target gives every series it scrapes (the Prometheus Operator's:
# job is the Service's name), per program, as the chart's ServiceMonitors make them.
GATEWAY = {"job": "ms-modelserve-gateway", "namespace": NAMESPACE, "pod": "ms-modelserve-gateway-7d9f-x1"}
# Two more gateway pods: one serving plain HTTP (its expiry gauge 0), one with renewals.
GATEWAY_PLAIN = {**GATEWAY, "pod": "ms-modelserve-gateway-7d9f-x2"}
GATEWAY_RENEWED = {**GATEWAY, "pod": "ms-modelserve-gateway-7d9f-x3"}
OPERATOR = {"job": "ms-modelserve-metrics", "namespace": NAMESPACE, "pod": "ms-modelserve-5c6b-a1"}
NODECACHE = {
    "job": "ms-modelserve-nodecache",
    "namespace": NAMESPACE,
    "pod": "ms-modelserve-nodecache-q2",
    "node": "gpu-1",
}
MODEL_POD = {"job": "llama", "namespace": "team-a", "pod": "llama-6f7-z9", "modelserver": "llama"}


def series(name: str, target: dict[str, str], honor: bool = False, **labels: str) -> str:
    """A series as Prometheus stores it: an exported name with exactly its family's labels, plus the
    target's (on a clash, honorLabels keeps the exported one, else Prometheus renames it exported_*)."""
    if name in PROMETHEUS_SERIES:
        assert not labels
    else:
        assert name in declared(), name
        assert set(labels) == set(declared()[name]), (name, declared()[name])
        assert honor or not set(labels) & set(target), "the scrape would rename these exported_*"
    merged = {**target, **labels} if honor else {**labels, **target}
    return name + "{" + ", ".join(f'{key}="{value}"' for key, value in sorted(merged.items())) + "}"


def unit_tests(rule: dict[str, Any]) -> dict[str, Any]:
    described = {name: body["annotations"]["description"] for name, body in alerts(rule).items()}

    def expected(alert: str, summary: str, **labels: str) -> dict[str, Any]:
        return {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": described[alert]}}

    return {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "a model at zero holds requests and never wakes; one beside it has a ready replica",
                "interval": "1m",
                "input_series": [
                    {
                        "series": series(
                            "modelserve_gateway_held_requests", GATEWAY, True, namespace="team-a", model="llama"
                        ),
                        "values": "3x30",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_ready_replicas", GATEWAY, True, namespace="team-a", model="llama"
                        ),
                        "values": "0x30",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_held_requests", GATEWAY, True, namespace="team-a", model="qwen"
                        ),
                        "values": "2x30",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_ready_replicas", GATEWAY, True, namespace="team-a", model="qwen"
                        ),
                        "values": "1x30",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "ModelserveModelUnavailable", "exp_alerts": []},
                    {
                        "eval_time": "11m",
                        "alertname": "ModelserveModelUnavailable",
                        "exp_alerts": [
                            expected(
                                "ModelserveModelUnavailable",
                                "team-a/llama: 3 requests held with no ready replica",
                                severity="critical",
                                namespace="team-a",
                                model="llama",
                            )
                        ],
                    },
                ],
            },
            {
                "name": "half of a model's requests fail at its engine",
                "interval": "1m",
                "input_series": [
                    {
                        "series": series(
                            "modelserve_sidecar_requests_total",
                            MODEL_POD,
                            route="/v1/chat/completions",
                            status_class="2xx",
                        ),
                        "values": "0+60x30",
                    },
                    {
                        "series": series("modelserve_sidecar_upstream_errors_total", MODEL_POD, kind="connect"),
                        "values": "0+30x30",
                    },
                    {
                        "series": series("modelserve_sidecar_upstream_errors_total", MODEL_POD, kind="metrics"),
                        "values": "0+600x30",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "8m", "alertname": "ModelserveSidecarUpstreamErrors", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "ModelserveSidecarUpstreamErrors",
                        "exp_alerts": [
                            expected(
                                "ModelserveSidecarUpstreamErrors",
                                "team-a/llama: 50% of requests failed at the engine",
                                severity="warning",
                                namespace="team-a",
                                modelserver="llama",
                            )
                        ],
                    },
                ],
            },
            {
                "name": "a key refused every request (it has no admitted series); another admitted, never refused",
                "interval": "1m",
                "input_series": [
                    {
                        "series": series(
                            "modelserve_sidecar_key_refusals_total",
                            MODEL_POD,
                            key="batch",
                            model="llama",
                            reason="requests_per_minute",
                        ),
                        "values": "0+5x40",
                    },
                    {
                        "series": series("modelserve_sidecar_key_requests_total", MODEL_POD, key="app", model="llama"),
                        "values": "0+100x40",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "30m",
                        "alertname": "ModelserveKeyRefusals",
                        "exp_alerts": [
                            expected(
                                "ModelserveKeyRefusals",
                                "team-a/llama: key batch refused (requests_per_minute) for 100% of its requests",
                                severity="info",
                                namespace="team-a",
                                modelserver="llama",
                                key="batch",
                                reason="requests_per_minute",
                            )
                        ],
                    },
                ],
            },
            {
                "name": "the operator's queue never empties, then every operator pod stops answering",
                "interval": "1m",
                "input_series": [
                    {"series": series("modelserve_operator_work_queue_depth", OPERATOR), "values": "0x4 3x40"},
                    {"series": series("up", OPERATOR), "values": "1x30 0x20"},
                ],
                "alert_rule_test": [
                    {"eval_time": "12m", "alertname": "ModelserveOperatorNotReconciling", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "ModelserveOperatorNotReconciling",
                        "exp_alerts": [
                            expected(
                                "ModelserveOperatorNotReconciling",
                                f"operator pod {OPERATOR['pod']}: 3 ModelServers waiting for a reconcile"
                                " for 15 minutes",
                                severity="critical",
                                **OPERATOR,
                            )
                        ],
                    },
                    {"eval_time": "25m", "alertname": "ModelserveOperatorDown", "exp_alerts": []},
                    {
                        "eval_time": "40m",
                        "alertname": "ModelserveOperatorDown",
                        "exp_alerts": [
                            expected(
                                "ModelserveOperatorDown",
                                f"no modelserve operator pod answers in {NAMESPACE}",
                                severity="critical",
                                job=OPERATOR["job"],
                                namespace=NAMESPACE,
                            )
                        ],
                    },
                ],
            },
            {
                "name": "no operator pod is found at all (no target: the Deployment is gone or at zero)",
                "interval": "1m",
                "input_series": [{"series": series("up", NODECACHE), "values": "1x10"}],
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "ModelserveOperatorDown",
                        "exp_alerts": [
                            expected(
                                "ModelserveOperatorDown",
                                f"no modelserve operator pod answers in {NAMESPACE}",
                                severity="critical",
                                job=OPERATOR["job"],
                                namespace=NAMESPACE,
                            )
                        ],
                    },
                    {"eval_time": "6m", "alertname": "ModelserveNodeCacheAgentDown", "exp_alerts": []},
                ],
            },
            {
                "name": "a node's agent is down and another's files are corrupt",
                "interval": "1m",
                "input_series": [
                    {"series": series("up", NODECACHE), "values": "1x3 0x20"},
                    {
                        "series": series(
                            "modelserve_nodecache_corrupt_files_total",
                            {**NODECACHE, "pod": "ms-modelserve-nodecache-r7", "node": "gpu-2"},
                        ),
                        "values": "0x5 1x20",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "ModelserveNodeCacheAgentDown",
                        "exp_alerts": [
                            expected(
                                "ModelserveNodeCacheAgentDown",
                                f"node cache agent {NODECACHE['pod']} on gpu-1 does not answer",
                                severity="warning",
                                **NODECACHE,
                            )
                        ],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "ModelserveNodeCacheCorruptFiles",
                        "exp_alerts": [
                            expected(
                                "ModelserveNodeCacheCorruptFiles",
                                "node cache on gpu-2: files whose bytes did not match their hash",
                                severity="warning",
                                node="gpu-2",
                                pod="ms-modelserve-nodecache-r7",
                            )
                        ],
                    },
                ],
            },
            {
                "name": "one gateway pod serves a certificate a day from its end, one refused a renewal",
                "interval": "1m",
                # Unit tests start at Unix time 0: a day after it is a day from the start.
                "input_series": [
                    {
                        "series": series("modelserve_gateway_tls_certificate_expiry_timestamp_seconds", GATEWAY, True),
                        "values": "86400x120",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_tls_certificate_expiry_timestamp_seconds", GATEWAY_PLAIN, True
                        ),
                        "values": "0x120",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_tls_certificate_expiry_timestamp_seconds", GATEWAY_RENEWED, True
                        ),
                        "values": "8640000x120",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_tls_reloads_total", GATEWAY_RENEWED, True, outcome="refused"
                        ),
                        "values": "0x10 1x110",
                    },
                    {
                        "series": series(
                            "modelserve_gateway_tls_reloads_total", GATEWAY_RENEWED, True, outcome="loaded"
                        ),
                        "values": "0x10 3x110",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "ModelserveGatewayCertificateExpiring", "exp_alerts": []},
                    {
                        "eval_time": "70m",
                        "alertname": "ModelserveGatewayCertificateExpiring",
                        "exp_alerts": [
                            expected(
                                "ModelserveGatewayCertificateExpiring",
                                f"gateway pod {GATEWAY['pod']}: the certificate it serves expires in 22h 50m 0s",
                                severity="warning",
                                namespace=NAMESPACE,
                                pod=GATEWAY["pod"],
                            )
                        ],
                    },
                    {"eval_time": "5m", "alertname": "ModelserveGatewayCertificateRefused", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "ModelserveGatewayCertificateRefused",
                        "exp_alerts": [
                            expected(
                                "ModelserveGatewayCertificateRefused",
                                f"gateway pod {GATEWAY_RENEWED['pod']} refused a renewed certificate",
                                severity="warning",
                                namespace=NAMESPACE,
                                pod=GATEWAY_RENEWED["pod"],
                            )
                        ],
                    },
                ],
            },
        ],
    }


def test_alerts_fire_on_the_exported_series(helm: Helm, rulecheck: Rulecheck, tmp_path: Path) -> None:
    rule = rendered_rule(helm)
    write_rules(rule, tmp_path / "rules.yaml")
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump(unit_tests(rule), sort_keys=False))
    result = rulecheck("test", tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_missed_alert_fails_the_unit_tests(helm: Helm, rulecheck: Rulecheck, tmp_path: Path) -> None:
    """The unit tests can fail: the model beside, which has a ready replica, is expected to alert too."""
    rule = rendered_rule(helm)
    write_rules(rule, tmp_path / "rules.yaml")
    plan = unit_tests(rule)
    fired = plan["tests"][0]["alert_rule_test"][1]["exp_alerts"]
    fired.append({**fired[0], "exp_labels": {**fired[0]["exp_labels"], "model": "qwen"}})
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump(plan, sort_keys=False))
    result = rulecheck("test", tests)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ModelserveModelUnavailable" in result.stdout + result.stderr
