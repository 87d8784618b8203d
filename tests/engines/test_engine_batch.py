"""What each engine batches (the sidecar's engine bound) and the autoscaler's default target: the
batch flag as the engine's parser reads it, else its variable, else the pinned version's default; the
target per profile, never above the batch; and what the operator renders for the sidecar."""

from __future__ import annotations

from typing import Any

import pytest

from harness.testdata import examples, model_server
from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.contracts.operator_settings import Settings

CPU = {"profile": "cpu", "model": "unsloth/gemma-3-270m-it-GGUF:Q4_K_M"}
LOW_LATENCY = {"profile": "low-latency"}
EXTERNAL = {"profile": "external", "model": "llama3.2:1b", "external": {"url": "http://10.0.0.5:11434"}}


def _np(value: str) -> dict[str, Any]:
    return {"name": "LLAMA_ARG_N_PARALLEL", "value": value}


@pytest.mark.parametrize(
    ("spec", "batch"),
    [
        ({}, 1024),  # vLLM 0.32.0's default on the largest GPUs (256 under 70 GiB)
        ({"engineArgs": ["--max-num-seqs", "64"]}, 64),
        ({"engineArgs": ["--max-num-seqs=32"]}, 32),
        ({"engineArgs": ["--max_num_seqs", "16"]}, 16),  # argparse as vLLM reads it: `_` for `-`
        ({"engineArgs": ["--max-num-se", "12"]}, 12),  # and an unambiguous prefix
        ({"engineArgs": ["--max-num-seqs", "8", "--enforce-eager", "--max-num-seqs", "24"]}, 24),  # the last
        ({"engineArgs": ["--performance-mode", "throughput"]}, 2048),  # doubles the default only
        ({"engineArgs": ["--performance-mode=throughput", "--max-num-seqs", "100"]}, 100),
        ({"engineArgs": ["-dp", "2"]}, 2048),  # each data parallel rank batches as many
        ({"engineArgs": ["--data-parallel-size=2", "--max-num-seqs", "10"]}, 20),
        ({"engineArgs": ["--max-num-seqs", "many"]}, 1024),  # vLLM refuses it at start: the default here
        ({"engineArgs": ["--max-num-seqs", "0"]}, 1024),
        ({"replicas": {"max": 4, "targetPerReplica": 5}}, 1024),  # the autoscaler's target is another knob
        (LOW_LATENCY, 4096),  # SGLang 0.5.10: as many as its KV cache holds, 2048 to 4096
        ({**LOW_LATENCY, "engineArgs": ["--max-running-requests", "128"]}, 128),
        (CPU, 4),  # llama.cpp b9093's slots when -np is unset or auto
        ({**CPU, "engineArgs": ["-np", "8"]}, 8),
        ({**CPU, "engineArgs": ["--parallel", "2"]}, 2),
        ({**CPU, "engineArgs": ["--parallel", "-1"]}, 4),  # auto
        ({**CPU, "env": [_np("6")]}, 6),
        ({**CPU, "env": [_np("6")], "engineArgs": ["-np", "3"]}, 3),  # the flag wins over the variable
        ({**EXTERNAL}, 8),  # an external server's batch is unknown: its target
        ({**EXTERNAL, "replicas": {"max": 2, "targetPerReplica": 3}}, 3),
    ],
)
def test_the_engine_bound_is_what_the_engine_batches(spec: dict[str, Any], batch: int) -> None:
    assert model_server(**spec).spec.engine_concurrency == batch


@pytest.mark.parametrize(
    ("spec", "target"),
    [
        ({}, 64),
        ({"engineArgs": ["--max-num-seqs", "16"]}, 16),  # never above the batch
        (LOW_LATENCY, 32),
        (CPU, 4),  # the slots
        ({**CPU, "engineArgs": ["-np", "8"]}, 8),
        (EXTERNAL, 8),
        ({"replicas": {"max": 4, "targetPerReplica": 5}}, 5),
        ({**CPU, "replicas": {"max": 4, "targetPerReplica": 2}}, 2),
    ],
)
def test_the_autoscalers_target_defaults_by_profile(spec: dict[str, Any], target: int) -> None:
    assert model_server(**spec).spec.target_per_replica == target


def _sidecar_env(ms: ModelServer) -> dict[str, Any]:
    pod = manifests.serving_pod_template(manifests.workload(ms, Settings()))["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "sidecar")
    return {var["name"]: var.get("value") for var in sidecar["env"]}


@pytest.mark.parametrize(
    ("example", "bound"),
    [("lfm2-1.2b", "1024"), ("lfm2-8b-a1b", "4096"), ("smollm2-135m-vllm", "8"), ("smollm2-135m-cpu", "4")],
)
def test_the_sidecar_is_rendered_with_the_engines_batch(example: str, bound: str) -> None:
    # The throttle this replaced: every profile rendered 8 (targetPerReplica's default).
    assert _sidecar_env(ModelServer.from_manifest(examples()[example]))["MODELSERVE_ENGINE_CONCURRENCY"] == bound
