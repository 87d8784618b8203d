"""The spec's enumerations the engine modules use too.

They live apart from `spec.py` because the spec reads the engines' facts, so the engine modules
never import the spec. The profiles are not here: the engine registry makes them
(`modelserve.engines.Profile`), one per engine.
"""

from __future__ import annotations

from enum import StrEnum


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
