"""The proxies' common core, shared by the sidecar and the gateway: the streaming relay, the upstream
session, how a process serves, OpenAI-shaped errors, and the Ollama <-> OpenAI translation."""
