"""The proxies' common core, shared by the sidecar and the gateway: the streaming relay, the upstream
pool of the proxied requests (and the aiohttp session of everything else), how a process serves,
OpenAI-shaped errors, and the Ollama <-> OpenAI translation."""
