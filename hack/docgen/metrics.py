"""docs/reference/metrics.md: every series each program exports, read from its Prometheus registry as
the program builds it (the request pipeline of the sidecar and of the gateway registers some of them)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics import MetricWrapperBase

from modelserve.contracts import sidecar
from modelserve.gateway.directory import Directory
from modelserve.gateway.holding import Holding
from modelserve.gateway.metrics import GatewayMetrics
from modelserve.gateway.proxy import GatewayProxy
from modelserve.gateway.settings import GatewaySettings
from modelserve.nodecache.agent import Metrics as NodeCacheMetrics
from modelserve.operator import metrics as operator_metrics
from modelserve.sidecar.metrics import SidecarMetrics
from modelserve.sidecar.proxy import Proxy

from .markdown import code, generated_by, table

INTRO = """\
Every pod's sidecar serves `/metrics` on the port `http`: its own series (all its workers', merged)
followed by the engine's, so one scrape target per pod covers both, without a key. The gateway
serves its own on its port (`/metrics`, no key), the operator on `operator.metricsPort` when it is
set, and the node cache's agent on its port (`nodeCache.port`, `/metrics`). The chart's optional
ServiceMonitors scrape all four, its PrometheusRule alerts on them and its Grafana dashboard charts
the sidecars' and engines' ([Monitoring](../operations/monitoring.md)).

The engines' own series follow the sidecar's: vLLM `vllm:*` (e.g. `vllm:kv_cache_usage_perc`,
`vllm:num_requests_waiting`), SGLang `sglang:*` (`sglang:token_usage`, `sglang:num_queue_reqs`),
llama.cpp `llamacpp:*` (`llamacpp:requests_processing`, `llamacpp:requests_deferred`; llama.cpp
exports no KV-cache gauge). `tests/engines/test_engine_source.py` holds every engine series the
dashboard and this page name to the pinned release's source.

A counter's series end in `_total`; a histogram's are `_bucket`, `_sum` and `_count`. Usage by
key: [Keys](../concepts/keys.md); the connection bounds' cuts:
[Hostile clients](../operations/security.md#hostile-clients)."""


def sidecar_registry() -> CollectorRegistry:
    metrics = SidecarMetrics()
    Proxy(sidecar.Settings(upstream_url="http://127.0.0.1:8000", served_model="model"), None, metrics)
    return metrics.registry


def gateway_registry() -> CollectorRegistry:
    metrics = GatewayMetrics()
    GatewayProxy(GatewaySettings(), Directory(), Holding(1), metrics)
    return metrics.registry


PROGRAMS = (
    ("The sidecar", "modelserve_sidecar", sidecar_registry),
    ("The gateway", "modelserve_gateway", gateway_registry),
    ("The operator", "modelserve_operator", lambda: operator_metrics.REGISTRY),
    ("The node cache's agent", "modelserve_nodecache", lambda: NodeCacheMetrics().registry),
)


def families(registry: CollectorRegistry) -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """(name, type, label names, help) of every family, in registration order, but the process
    collector's standard series. The label names are read from the metric objects (a labelled metric
    shows none in a scrape until it has a child), hence prometheus_client's private attributes."""
    for collector in list(registry._collector_to_names):
        if isinstance(collector, ProcessCollector):
            continue
        for family in collector.collect():
            if isinstance(collector, MetricWrapperBase):
                labels = tuple(collector._labelnames)
            else:
                labels = tuple(getattr(family, "_labelnames", ()))
            suffix = "_total" if family.type == "counter" else ""
            yield family.name + suffix, family.type, labels, family.documentation


def page() -> str:
    lines = ["# Metrics", "", *generated_by("hack/docgen/metrics.py", "each program's Prometheus registry"), INTRO, ""]
    for title, prefix, registry in PROGRAMS:
        rows = [
            (code(name), kind, ", ".join(code(label) for label in labels), help_)
            for name, kind, labels, help_ in families(registry())
        ]
        lines += [f"## {title}", ""]
        lines += [*table(("series", "type", "labels", "meaning"), rows), ""]
        if prefix in ("modelserve_sidecar", "modelserve_gateway"):
            lines += [
                f"Besides, the standard process series under `{prefix}_process_*` (CPU seconds, resident and",
                "virtual memory, open and maximum file descriptors, start time).",
                "",
            ]
    return "\n".join(lines)
