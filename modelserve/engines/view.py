"""What an engine reads of a ModelServer, and the sizes derived from it.

The engines sit below the API (the API's rules are made from the engines' facts), so they never
import its pydantic models: they read a ModelServer through these Protocols, which `api/spec.py`'s
`ModelServer` and `ModelServerSpec` satisfy. The sizes (GPUs per pod, the tensor and pipeline
split, the adapter limits' defaults) are worked out here, once, for the engines and the API alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from modelserve.contracts.choices import AcrossNodes, Dtype

# What an engine reserves for adapters when spec.adapterLimits is unset (the CRD's defaults too).
DEFAULT_MAX_RANK = 16
DEFAULT_MAX_PER_BATCH = 4


class Wire(Protocol):
    """A part of the spec the engine copies into the pod as it is (its wire form)."""

    def to_wire(self) -> dict[str, Any]: ...


class EnvVarView(Wire, Protocol):
    @property
    def name(self) -> str: ...


class SecretRefView(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def key(self) -> str: ...


class AdapterLimitsView(Protocol):
    @property
    def max_rank(self) -> int: ...

    @property
    def max_per_batch(self) -> int: ...


class SpecView(Protocol):
    """The fields of a ModelServer's spec an engine reads (read-only: the spec is frozen)."""

    @property
    def model(self) -> str: ...

    @property
    def dtype(self) -> Dtype: ...

    @property
    def max_model_len(self) -> int | None: ...

    @property
    def gpu_memory_utilization(self) -> float | None: ...

    @property
    def tool_call_parser(self) -> str | None: ...

    @property
    def load_format(self) -> str | None: ...

    @property
    def chat_template(self) -> str | None: ...

    @property
    def gpus(self) -> int | None: ...

    @property
    def nodes(self) -> int | None: ...

    @property
    def across_nodes(self) -> AcrossNodes | None: ...

    @property
    def torch_compile(self) -> bool: ...

    @property
    def chunked_prefill_size(self) -> int | None: ...

    @property
    def vision(self) -> bool: ...

    @property
    def adapters(self) -> Sequence[object] | None: ...

    @property
    def adapter_limits(self) -> AdapterLimitsView | None: ...

    @property
    def image(self) -> str | None: ...

    @property
    def engine_args(self) -> Sequence[str]: ...

    @property
    def env(self) -> Sequence[EnvVarView]: ...

    @property
    def hf_token_secret_ref(self) -> SecretRefView | None: ...

    @property
    def resources(self) -> Wire | None: ...


class ServedModel(Protocol):
    """A ModelServer as an engine sees it: its name (the served model name) and its spec."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> SpecView: ...


@dataclass(frozen=True)
class DefaultAdapterLimits:
    max_rank: int = DEFAULT_MAX_RANK
    max_per_batch: int = DEFAULT_MAX_PER_BATCH


def adapter_limits(spec: SpecView) -> AdapterLimitsView:
    """The adapter limits with their defaults."""
    return spec.adapter_limits or DefaultAdapterLimits()


def node_count(spec: SpecView) -> int:
    """Nodes (pods) per replica: above 1, a LeaderWorkerSet group."""
    return spec.nodes or 1


def multi_node(spec: SpecView) -> bool:
    return node_count(spec) > 1


def gpu_count(spec: SpecView, on_gpus: bool) -> int:
    """GPUs per replica: spec.gpus, else 1 for an engine on GPUs and 0 for one on CPUs."""
    if spec.gpus is not None:
        return spec.gpus
    return 1 if on_gpus else 0


def gpus_per_node(spec: SpecView, on_gpus: bool) -> int:
    """Each pod's nvidia.com/gpu limit (the rules make gpus a multiple of nodes)."""
    return gpu_count(spec, on_gpus) // node_count(spec)


def split(spec: SpecView, on_gpus: bool) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes: tensor within a node and pipeline across nodes, or
    tensor over the whole group with acrossNodes tensor."""
    if spec.across_nodes == AcrossNodes.TENSOR:
        return gpu_count(spec, on_gpus), 1
    return gpus_per_node(spec, on_gpus), node_count(spec)
