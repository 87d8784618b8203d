"""modelserve: a Kubernetes operator that serves LLMs, as one layered package.

Four programs ship in this package (and in one image); each imports the layers below it and never
another program. Lowest layer first (`make lint` checks the rule with import-linter's contracts in pyproject.toml):

    contracts   names (group, kind, labels, Key), the sidecar's, gateway's and operator's settings
                and their environment (`env_setting`), the spec's choices; standard library only
    engines     one module per engine (vllm, sglang, llamacpp, external): facts + spec -> container
    api         the ModelServer: spec and status types, validation, CRD, the objects it becomes
    kube | http the Kubernetes layer (client, watch cache, work queue, pod predicates) and the
                proxies' HTTP core (relay, upstream session, serve, errors, Ollama translation),
                independent of each other
    operator | sidecar | gateway | cli   the programs

The engines sit below the API because the CRD's rules are read from the engines' facts (the flags
each pins, the tool-call parsers it knows). An engine reads a ModelServer through the Protocols of
`engines/view.py`, which the API's models satisfy: of this package it imports `contracts/` only.
The sandbox (`sandbox/`) is a development tool with a distribution of its own, never in this package.
"""

__version__ = "0.1.0"
