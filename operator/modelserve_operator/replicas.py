"""How many replicas a ModelServer runs: decided here and nowhere else.

The Deployment's `spec.replicas` and the status's idea of "all ready" both come from this one
function, so the autoscaler (which will follow demand up to `replicas.max`) replaces one function.
"""

from __future__ import annotations

from .spec import Replicas


def desired_replicas(replicas: Replicas) -> int:
    """min + buffer warm replicas, never above max (the CRD already refuses min + buffer > max)."""
    return min(replicas.min + replicas.buffer, replicas.max)
