"""modelserve-gateway: one OpenAI-compatible endpoint for every ModelServer it watches."""
