"""modelserve-sidecar: API keys, metrics and honest readiness in front of the engine, in every pod."""
