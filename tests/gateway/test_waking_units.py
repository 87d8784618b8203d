"""The pure parts of waiting at zero: the wakes the gateway remembers and the Retry-After it tells
from them (cold_starts.py), and a held stream's keep-alives and error event (held_streams.py), read
back by the openai SDK's own SSE decoder."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai._streaming import SSEDecoder

from modelserve.contracts.env import ConfigError
from modelserve.gateway.cold_starts import ColdStarts, retry_after_seconds
from modelserve.gateway.errors import FULL_RETRY_AFTER_SECONDS, HOLD_RETRY_AFTER_SECONDS, hold_timeout
from modelserve.gateway.held_streams import ERROR_BODY_LIMIT, StartedStream, comment, error_event
from modelserve.gateway.holding import SHARED_WIDTH, Holding, Outcome, shared_counts
from modelserve.gateway.metrics import GatewayMetrics
from modelserve.gateway.settings import GatewaySettings
from modelserve.http.downstream import Headers
from modelserve.http.shared_rows import SharedRows

KEY = ("ns", "m")

# --- Retry-After ---------------------------------------------------------------------------------


def test_without_a_wake_seen_retry_after_is_the_fixed_value() -> None:
    assert retry_after_seconds([], None, HOLD_RETRY_AFTER_SECONDS) == 30
    assert retry_after_seconds([], 12.0, FULL_RETRY_AFTER_SECONDS) == 5


def test_retry_after_is_the_recent_median_wake_less_what_this_one_has_lasted() -> None:
    wakes = [20.0, 18.0, 60.0]  # median 20, longest 60
    assert retry_after_seconds(wakes, 0.0, 5) == 20
    assert retry_after_seconds(wakes, None, 5) == 20  # none in progress: a whole wake
    assert retry_after_seconds(wakes, 7.5, 5) == 13  # 12.5, rounded up: never too early by a fraction
    assert retry_after_seconds(wakes, 19.8, 5) == 1  # at least 1 s


def test_past_the_median_the_longest_recent_wake_and_past_that_the_fixed_value() -> None:
    wakes = [20.0, 18.0, 60.0]
    assert retry_after_seconds(wakes, 20.0, 5) == 40  # past the median (20): the longest, 60
    assert retry_after_seconds(wakes, 59.0, 5) == 1
    assert retry_after_seconds(wakes, 60.0, 5) == 5  # longer than every recent wake: no estimate
    assert retry_after_seconds(wakes, 600.0, HOLD_RETRY_AFTER_SECONDS) == 30
    assert retry_after_seconds([10.0, 30.0], 0.0, 5) == 20  # an even count: the mean of the middle two


# --- the wakes remembered ------------------------------------------------------------------------


def test_a_wake_is_timed_from_its_first_held_request_to_its_first_ready_replica() -> None:
    starts = ColdStarts(keep=3, give_up_after=600)
    assert starts.ready(KEY, 5.0) is None  # nobody was held: no wake
    starts.held(KEY, 100.0)
    starts.held(KEY, 104.0)  # a second request: the same wake
    assert starts.waking_for(KEY, 110.0) == 10.0
    assert starts.ready(KEY, 118.0) == 18.0
    assert starts.observed(KEY) == [18.0] and starts.waking_for(KEY, 120.0) is None
    assert starts.ready(KEY, 130.0) is None  # another replica, the same model: no wake in progress
    assert starts.retry_after(KEY, 200.0, 5) == 18


def test_the_last_few_wakes_are_kept_and_a_deleted_model_forgets_them() -> None:
    starts = ColdStarts(keep=3, give_up_after=600)
    for i, seconds in enumerate((10.0, 20.0, 30.0, 40.0)):
        starts.held(KEY, 1000.0 * i)
        starts.ready(KEY, 1000.0 * i + seconds)
    assert starts.observed(KEY) == [20.0, 30.0, 40.0]
    starts.held(KEY, 9000.0)
    starts.forget(KEY)
    assert starts.observed(KEY) == [] and starts.waking_for(KEY, 9001.0) is None


def test_a_wake_outlives_its_held_requests_until_nobody_waited_for_a_whole_hold() -> None:
    starts = ColdStarts(keep=5, give_up_after=600)
    starts.held(KEY, 0.0)
    starts.unheld(KEY, 600.0)  # its requests timed out; the pod goes on loading
    starts.held(KEY, 640.0)  # a retry: the same wake
    starts.unheld(KEY, 650.0)
    assert starts.ready(KEY, 700.0) == 700.0
    # Nobody waits for over a whole hold: given up (the pod may never have started).
    starts.held(KEY, 1000.0)
    starts.unheld(KEY, 1001.0)
    assert starts.waking_for(KEY, 1602.0) is None
    assert starts.ready(KEY, 5000.0) is None and starts.observed(KEY) == [700.0]
    starts.held(KEY, 6000.0)  # a new wake
    starts.unheld(KEY, 6001.0)
    starts.held(KEY, 7000.0)  # after the give-up: a new wake again, not one of 1000 s
    assert starts.ready(KEY, 7030.0) == 30.0


def test_holding_times_each_wake_and_tells_the_retry_after() -> None:
    async def scenario() -> None:
        now = [0.0]
        woken: list[tuple[tuple[str, str], float]] = []
        holding = Holding(
            max_held=1,
            cold_starts=ColdStarts(keep=5, give_up_after=600),
            on_woken=lambda key, seconds: woken.append((key, seconds)),
            clock=lambda: now[0],
        )
        never = asyncio.get_running_loop().create_future()
        held = asyncio.ensure_future(holding.wait(KEY, 10, never))
        await asyncio.sleep(0.01)
        assert holding.retry_after(KEY, FULL_RETRY_AFTER_SECONDS) == 5  # no wake seen yet
        now[0] = 40.0
        holding.wake(KEY)
        assert await held is Outcome.READY and woken == [(KEY, 40.0)]
        held = asyncio.ensure_future(holding.wait(KEY, 10, never))
        await asyncio.sleep(0.01)
        now[0] = 55.0
        assert await holding.wait(KEY, 10, never) is Outcome.FULL
        assert holding.retry_after(KEY, FULL_RETRY_AFTER_SECONDS) == 25  # 40 s typical, 15 s along
        holding.forget(KEY)  # deleted: its held request goes on (to a 404), no wake is timed
        assert await held is Outcome.READY and woken == [(KEY, 40.0)]
        assert holding.retry_after(KEY, FULL_RETRY_AFTER_SECONDS) == 5
        never.cancel()

    asyncio.run(scenario())


# --- a held stream's keep-alives and its error event ---------------------------------------------


def _events(data: bytes) -> list[tuple[str | None, str]]:
    """What the openai SDK's decoder makes of a stream's bytes: (event, data) of each event."""
    return [(sse.event, sse.data) for sse in SSEDecoder().iter_bytes(iter([data]))]


def test_keepalives_are_comments_the_openai_sdk_skips() -> None:
    line = comment("tiny", 6.7)
    assert line == b": waiting for tiny to start (6 s so far)\n\n"
    chunk = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    assert _events(line + line + chunk + b"data: [DONE]\n\n") == [
        (None, '{"choices": [{"delta": {"content": "hi"}}]}'),
        (None, "[DONE]"),
    ]


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (503, hold_timeout("tiny", 600).body(), json.loads(hold_timeout("tiny", 600).body())["error"]),
        (
            400,
            b'{"error":{"message":"max_tokens too large","type":"BadRequestError","param":"max_tokens","code":400}}',
            {"message": "max_tokens too large", "type": "BadRequestError", "param": "max_tokens", "code": 400},
        ),
        (
            502,
            b"Bad Gateway\r\n\r\nsomething",
            {"message": "Bad Gateway\r\n\r\nsomething", "type": "server_error", "param": None, "code": None},
        ),
        (404, b'{"error": "model not found"}', {"message": "model not found", "type": "invalid_request_error"}),
        (500, b"[" * 100_000, {"type": "server_error"}),  # hostile: read without raising
        (500, b"", {"message": "The model answered 500.", "type": "server_error"}),
    ],
    ids=["gateway", "vllm", "text", "string-error", "nested", "empty"],
)
def test_an_error_after_the_head_is_one_openai_shaped_event(status: int, body: bytes, error: dict) -> None:
    event = error_event(status, body)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    ((name, data),) = _events(event)
    sent = json.loads(data)["error"]
    assert name is None and {k: sent[k] for k in error} == error
    assert set(sent) >= {"message", "type", "param", "code"}


class _Recorder:
    """A Downstream that keeps what it was given (the held stream's client, its head already sent)."""

    def __init__(self) -> None:
        self.body = b""
        self.ended = False

    async def write(self, chunk: bytes) -> None:
        self.body += chunk

    async def end(self, chunk: bytes = b"") -> None:
        self.body += chunk
        self.ended = True


def test_a_started_stream_passes_a_2xx_on_and_turns_anything_else_into_its_error_event() -> None:
    refusal = b'{"error": {"message": "Invalid API key.", "type": "authentication_error", "param": null, '
    refusal += b'"code": "invalid_api_key"}}'

    async def answer(status: int, *chunks: bytes) -> _Recorder:
        client = _Recorder()
        stream = StartedStream(client)  # type: ignore[arg-type]
        headers: Headers = [(b"content-type", b"text/event-stream" if status == 200 else b"application/json")]
        await stream.start(status, headers)
        for chunk in chunks[:-1]:
            await stream.write(chunk)
        await stream.end(chunks[-1])
        return client

    streamed = asyncio.run(answer(200, b"data: 1\n\n", b"data: [DONE]\n\n"))
    assert streamed.ended and streamed.body == b"data: 1\n\ndata: [DONE]\n\n"
    refused = asyncio.run(answer(401, refusal[:40], refusal[40:]))
    assert refused.ended and _events(refused.body) == [(None, json.dumps(json.loads(refusal)))]
    # An error body beyond the limit is kept in part: its words, wrapped.
    huge = asyncio.run(answer(500, b"x" * ERROR_BODY_LIMIT, b"y" * ERROR_BODY_LIMIT))
    ((_, data),) = _events(huge.body)
    assert json.loads(data)["error"]["message"] == "x" * ERROR_BODY_LIMIT


# --- settings and series --------------------------------------------------------------------------


def test_the_keepalive_interval_and_wake_history_are_settings() -> None:
    defaults = GatewaySettings.from_env({})
    assert (defaults.hold_keepalive_seconds, defaults.wake_history) == (3.0, 5)
    assert GatewaySettings.from_env({"MODELSERVE_GATEWAY_HOLD_KEEPALIVE_SECONDS": "0"}).hold_keepalive_seconds == 0
    with pytest.raises(ConfigError, match="MODELSERVE_GATEWAY_HOLD_KEEPALIVE_SECONDS"):
        GatewaySettings.from_env({"MODELSERVE_GATEWAY_HOLD_KEEPALIVE_SECONDS": "-1"})
    with pytest.raises(ConfigError, match="MODELSERVE_GATEWAY_WAKE_HISTORY"):
        GatewaySettings.from_env({"MODELSERVE_GATEWAY_WAKE_HISTORY": "0"})


def test_a_forgotten_model_leaves_no_wake_or_keepalive_series() -> None:
    metrics = GatewayMetrics()
    gone, kept = ("default", "gone"), ("default", "kept")
    for key in (gone, kept):
        metrics.wake.labels(*key).observe(18.0)
        metrics.keepalives.labels(*key).inc()
    metrics.forget(gone)
    text = metrics.render().decode()
    assert 'model="gone"' not in text
    assert 'modelserve_gateway_wake_seconds_count{model="kept",namespace="default"} 1.0' in text
    assert 'modelserve_gateway_hold_keepalives_total{model="kept",namespace="default"} 1.0' in text


def test_with_workers_the_bound_per_model_is_the_pods() -> None:
    """Two workers' Holdings on one shared mapping (http/shared_rows.py): a model's held requests at
    one count against the bound at the other, verified and unverified alike; the per-client bound
    stays each worker's."""

    async def scenario() -> None:
        rows = SharedRows(2, SHARED_WIDTH)
        first = Holding(max_held=2, max_unverified=1, shared=shared_counts(rows, 0))
        second = Holding(max_held=2, max_unverified=1, shared=shared_counts(rows, 1))
        never = asyncio.get_running_loop().create_future()
        held = [asyncio.ensure_future(first.wait(KEY, 10, never)) for _ in range(2)]
        unverified = asyncio.ensure_future(first.wait(KEY, 10, never, "10.0.0.1"))
        await asyncio.sleep(0.01)
        assert not second.admits(KEY) and not second.admits(KEY, "10.0.0.2")
        assert second.admits(("ns", "other"))
        first.wake(KEY)
        assert [await h for h in held] == [Outcome.READY] * 2 and await unverified is Outcome.READY
        assert second.admits(KEY) and second.admits(KEY, "10.0.0.2")  # given back: the entry forgotten
        never.cancel()

    asyncio.run(scenario())


def test_before_any_wake_it_counts_on_the_last_start_the_operator_measured() -> None:
    # No wake seen by this gateway: the status' lastStart (30 s) less how long this wake has lasted.
    assert retry_after_seconds([], 12.0, HOLD_RETRY_AFTER_SECONDS, last_start=30.0) == 18
    assert retry_after_seconds([], None, HOLD_RETRY_AFTER_SECONDS, last_start=7.2) == 8
    # Past it: the fixed value, as past every recent wake; the wakes it saw win over the status.
    assert retry_after_seconds([], 40.0, FULL_RETRY_AFTER_SECONDS, last_start=30.0) == FULL_RETRY_AFTER_SECONDS
    assert retry_after_seconds([20.0], 0.0, 5, last_start=90.0) == 20


def test_a_held_streams_keep_alive_says_how_long_the_last_start_took() -> None:
    assert comment("tiny", 6.4) == b": waiting for tiny to start (6 s so far)\n\n"
    assert comment("tiny", 6.4, 12.3) == b": waiting for tiny to start (6 s so far; its last start took 12 s)\n\n"
