"""OpenAI-shaped errors the gateway answers itself (a replica's own pass through untouched)."""

from __future__ import annotations

from modelserve.http.errors import INVALID_REQUEST_ERROR, SERVER_ERROR, ErrorResponse, bad_request, retry_after

# After a hold timed out the model is still starting: come back soon, not at once. These two are
# what a client turned away while its model wakes is told when the gateway has no estimate of its
# own (cold_starts.py: none seen yet, or this wake already longer than every recent one).
HOLD_RETRY_AFTER_SECONDS = 30
FULL_RETRY_AFTER_SECONDS = 5
REPLICA_RETRY_AFTER_SECONDS = 1


def missing_model() -> ErrorResponse:
    return bad_request("The request body has no 'model': the gateway routes by it.", "missing_model", "model")


def unknown_model(name: str) -> ErrorResponse:
    return ErrorResponse(
        404,
        f"The model '{name}' does not exist or is not served through this gateway.",
        INVALID_REQUEST_ERROR,
        "model_not_found",
        "model",
    )


def ambiguous_model(name: str, namespaces: list[str]) -> ErrorResponse:
    choices = ", ".join(f"'{ns}/{name}'" for ns in namespaces)
    return bad_request(
        f"The model '{name}' is served in several namespaces; name one of {choices}.", "ambiguous_model", "model"
    )


def no_version(name: str) -> ErrorResponse:
    """Every version of a served name has weight 0 or a tripped guard."""
    return ErrorResponse(
        503,
        f"No version of '{name}' takes requests: each has weight 0 or a tripped traffic guard.",
        SERVER_ERROR,
        "no_version_available",
        "model",
        extra_headers=retry_after(HOLD_RETRY_AFTER_SECONDS),
    )


def hold_timeout(name: str, seconds: float, retry_after_seconds: float = HOLD_RETRY_AFTER_SECONDS) -> ErrorResponse:
    # Retry-After in the words too: a held stream gets this as an event, its head long sent.
    headers = retry_after(retry_after_seconds)
    return ErrorResponse(
        503,
        f"No replica of '{name}' became ready within {seconds:g} s; it is still starting. "
        f"Retry in {headers[0][1].decode()} s.",
        SERVER_ERROR,
        "model_starting",
        extra_headers=headers,
    )


def hold_queue_full(name: str, limit: int, retry_after_seconds: float = FULL_RETRY_AFTER_SECONDS) -> ErrorResponse:
    return ErrorResponse(
        429,
        f"'{name}' has no ready replica and {limit} requests are already waiting for one. Retry later.",
        "rate_limit_error",
        "hold_queue_full",
        extra_headers=retry_after(retry_after_seconds),
    )


def replica_unavailable() -> ErrorResponse:
    return ErrorResponse(
        503,
        "No replica of the model could be reached (two tried); retry later.",
        SERVER_ERROR,
        "replica_unavailable",
        extra_headers=retry_after(REPLICA_RETRY_AFTER_SECONDS),
    )


def unverified_hold_full(
    name: str, per_model: int, per_client: int, retry_after_seconds: float = FULL_RETRY_AFTER_SECONDS
) -> ErrorResponse:
    """hold_queue_full for a key the gateway has not seen open the model: its share is small."""
    return ErrorResponse(
        429,
        f"'{name}' has no ready replica, and requests with a key not yet seen to open it wait only "
        f"{per_model} at a time ({per_client} per client); as many are already waiting. Retry later.",
        "rate_limit_error",
        "hold_queue_full",
        extra_headers=retry_after(retry_after_seconds),
    )


def no_endpoint_in_subset(name: str) -> ErrorResponse:
    """The endpoint picker's data plane allowed only endpoints (its subset hint) that are no ready
    replica of the model: the protocol's 503."""
    return ErrorResponse(
        503,
        f"No ready replica of '{name}' is among the endpoints the gateway's data plane allowed for this request.",
        SERVER_ERROR,
        "no_endpoint_in_subset",
        "model",
        extra_headers=retry_after(REPLICA_RETRY_AFTER_SECONDS),
    )
