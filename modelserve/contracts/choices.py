"""The spec's enumerations the engine modules use too.

They live apart from `spec.py` because the spec reads the engines' facts (the tool-call parsers
each pinned engine knows), so the engine modules must not import the spec at run time.
"""

from __future__ import annotations

from enum import StrEnum


class Profile(StrEnum):
    """Deployment profile: which engine serves the model."""

    HIGH_THROUGHPUT = "high-throughput"
    LOW_LATENCY = "low-latency"
    CPU = "cpu"
    EXTERNAL = "external"  # no engine in the pod: the sidecar fronts a server outside the cluster


class Dtype(StrEnum):
    """Numeric type of the weights and activations."""

    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class AcrossNodes(StrEnum):
    """How a replica spanning nodes splits the model between them."""

    PIPELINE = "pipeline"  # tensor parallel within each node, pipeline parallel across nodes
    TENSOR = "tensor"  # tensor parallel over every GPU of the group
