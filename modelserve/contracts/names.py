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
# On every object the operator makes (model pods, the InferencePools and their picker's objects):
# MANAGED_BY_LABEL = MANAGED_BY, which also tells the operator's own from another's of the same name.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "modelserve-operator"
# This release: the operator's default image tag; the user agents.
PACKAGE_VERSION = __version__
# How the operator's own requests show in the API server's audit log.
USER_AGENT = f"{FIELD_MANAGER}/{PACKAGE_VERSION}"

Key = tuple[str, str]  # (namespace, name) of one object, most often a ModelServer

# LeaderWorkerSet (kubernetes-sigs/lws, installed apart from the operator): what runs the replicas of
# a ModelServer whose replicas span nodes, one group of pods per replica.
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
# Labels LeaderWorkerSet puts on every pod of a group.
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # "0": the group's leader
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"  # one value per group

# The Gateway API Inference Extension's InferencePool (installed apart from the operator, optional):
# with MODELSERVE_INFERENCE_POOLS the operator keeps one per namespace of ModelServers.
INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"
INFERENCE_POOL_KIND = "InferencePool"
INFERENCE_POOL_PLURAL = "inferencepools"
# On the pods that serve HTTP (a Deployment's, a LeaderWorkerSet's leaders), only with pools on (value:
# the pool's name): the pool's selector. On the pool's picker Service and EndpointSlice too.
INFERENCE_POOL_LABEL = f"{GROUP}/inference-pool"
