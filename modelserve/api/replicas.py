"""How many replicas a ModelServer starts from, and whether the autoscaler moves it.

The Deployment's `spec.replicas` and the status's idea of "all ready" both come from the count
the autoscaler decides (autoscaling.py); this is where it starts, and what it keeps when the
autoscaler has nothing to decide.
"""

from __future__ import annotations

from .spec import Replicas


def desired_replicas(replicas: Replicas) -> int:
    """`count` when the /scale subresource set it, else min + buffer, never above max."""
    if replicas.count is not None:
        return replicas.count
    return min(replicas.min + replicas.buffer, replicas.max)


def autoscaled(replicas: Replicas) -> bool:
    """Whether the built-in autoscaler decides: no count set, and a range to move in."""
    return replicas.count is None and replicas.max > replicas.min
