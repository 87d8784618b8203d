"""The merges that make one pod's answer of its workers' (http/worker_views.py), and the sibling answer
parser: pure functions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from modelserve.contracts.sidecar import PodLoad
from modelserve.http.worker_views import merge_metrics, parse_answer


def worker_series(requests: int, in_flight: int, started: float, latency: float) -> str:
    registry = CollectorRegistry()
    counter = Counter("x_requests", "Requests.", ["route"], registry=registry)
    counter.labels("/a").inc(requests)
    counter.labels(f"/only-{requests}").inc()
    Gauge("x_in_flight", "In flight.", registry=registry).set(in_flight)
    Gauge("x_process_start_time_seconds", "Start.", registry=registry).set(started)
    Gauge("x_process_max_fds", "Ceiling.", registry=registry).set(1024)
    Histogram("x_seconds", "Latency.", buckets=(0.1, 1.0), registry=registry).observe(latency)
    return generate_latest(registry).decode()


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_the_workers_series_are_summed_but_starts_and_ceilings() -> None:
    merged = samples(merge_metrics([worker_series(3, 1, 100.0, 0.05), worker_series(4, 2, 90.0, 0.5)]))
    assert merged[("x_requests_total", (("route", "/a"),))] == 7
    assert merged[("x_requests_total", (("route", "/only-3"),))] == 1  # a series one worker has
    assert merged[("x_requests_total", (("route", "/only-4"),))] == 1
    assert merged[("x_in_flight", ())] == 3
    assert merged[("x_process_start_time_seconds", ())] == 90.0
    assert merged[("x_process_max_fds", ())] == 1024
    assert merged[("x_seconds_bucket", (("le", "0.1"),))] == 1
    assert merged[("x_seconds_bucket", (("le", "1.0"),))] == 2
    assert merged[("x_seconds_count", ())] == 2
    assert merged[("x_seconds_sum", ())] == 0.55
    created = [value for (name, _), value in merged.items() if name == "x_requests_created"]
    assert created and all(value > 0 for value in created)


def test_one_workers_series_come_out_as_they_went_in() -> None:
    text = worker_series(3, 1, 100.0, 0.05)
    assert samples(merge_metrics([text])) == samples(text.encode())


def test_pod_load_is_the_sum_and_the_latest_arrival() -> None:
    loads = [PodLoad(2, 10, 4.0), PodLoad(1, 5, 0.5), PodLoad(0, 0, None)]
    assert PodLoad.total(loads) == PodLoad(3, 15, 0.5)
    assert PodLoad.total([PodLoad(0, 0, None)]) == PodLoad(0, 0, None)


def test_a_sibling_answer_is_read_whole_in_either_framing() -> None:
    framed = parse_answer(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nhello")
    assert (framed.status, framed.content_type, framed.body) == (200, "text/plain", b"hello")
    chunked = parse_answer(
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    assert (chunked.status, chunked.body) == (503, b"abcde")
