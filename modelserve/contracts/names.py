"""The names every program uses for the ModelServer resource and what the operator makes of it."""

from __future__ import annotations

from modelserve import __version__

GROUP = "serving.modelserve.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ModelServer"
PLURAL = "modelservers"

# On every object the operator makes for a ModelServer (value: its name): the Deployment's selector,
# and how the operator's caches and the gateway find a ModelServer's pods and Secrets.
SELECTOR_LABEL = f"{GROUP}/modelserver"
# The sidecar's container in every model pod (the container the autoscaler and the gateway read).
SIDECAR_NAME = "sidecar"

# The operator's server-side apply field manager, Event reporter and user agent.
FIELD_MANAGER = "modelserve-operator"
# This release: the operator's default image tag; the user agents.
PACKAGE_VERSION = __version__
# How the operator's own requests show in the API server's audit log.
USER_AGENT = f"{FIELD_MANAGER}/{PACKAGE_VERSION}"

Key = tuple[str, str]  # (namespace, name) of one object, most often a ModelServer
