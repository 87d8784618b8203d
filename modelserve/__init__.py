"""modelserve: a Kubernetes operator that serves LLMs, as one layered package.

Five programs ship in this package (and in one image); each imports the layers below it and never
another program. Lowest layer first (`make lint` checks the rule with import-linter's contracts in pyproject.toml):

    contracts   names (group, kind, labels, Key), the sidecar's, gateway's and operator's settings
                and their environment (`env_setting`), the spec's choices, each engine's refused
                routes (`engine_routes`, the one engine fact the proxies read); standard library only
    engines     one module per engine (vllm, sglang, llamacpp; external: none) and the registry
                (`engines/__init__.py`, one line each): every fact of an engine on its `Engine`,
                spec -> container
    api         the ModelServer: spec and status types, validation, CRD, the objects it becomes
    kube | http the Kubernetes layer (client, watch cache, work queue, pod predicates) and the
                proxies' HTTP core (relay, upstream session, serve, errors, Ollama translation),
                independent of each other
    operator | sidecar | gateway | cli | nodecache   the programs (nodecache: the node's model cache,
                its agent and each model pod's fetch; of these layers it imports contracts only)

An engine is one module. The engines sit below the API because the spec's rules are made from the
registry (`api/engine_rules.py`: GPUs, nodes, dtypes, adapters, parsers, the flags each refuses),
as are the profiles and the operator's engine image settings. An engine reads a ModelServer through
the Protocols of `engines/view.py`, which the API's models satisfy, so of this package it imports
`contracts/` only (a contract says so). Its refused routes are the exception that stays in
`contracts/`: the proxies classify refusals by them and must not import the engines. Adding an
engine is its module, its route table, one registry line, a chart value and its fixtures.
The sandbox (`sandbox/`) is a development tool with a distribution of its own, never in this package.
docs/architecture.md says more, with the recipes for the common changes.
"""

__version__ = "0.1.0"
