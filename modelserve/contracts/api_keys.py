"""API keys the operator and the CLI generate."""

from __future__ import annotations

import secrets

# The data key of a generated key Secret; the sidecar accepts a key in every data key of a Secret.
GENERATED_KEY_FIELD = "api-key"


def new_api_key() -> str:
    return "msk-" + secrets.token_urlsafe(32)
