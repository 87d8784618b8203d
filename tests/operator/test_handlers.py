"""The kopf wiring's own settings."""

from __future__ import annotations

from modelserve.operator.handlers import API_RETRY_BACKOFFS


def test_api_retries_are_short_and_outlast_an_outage() -> None:
    # Recovery after an API server outage waits one retry at most; a 75 s outage fails no request.
    assert max(API_RETRY_BACKOFFS) <= 2.0
    assert sum(API_RETRY_BACKOFFS) >= 75
