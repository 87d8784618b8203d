"""spec.adapters without a cluster: the engines' LoRA flags, the ConfigMap the sidecar reads, a pod
template that does not change when the list does, and the status summed from the sidecars' reports."""

from __future__ import annotations

import json
from typing import Any

from harness.testdata import model_server
from modelserve.api import manifests
from modelserve.api.spec import ModelServer
from modelserve.contracts.adapters import ADAPTERS_KEY, AdapterState, Desired, Phase, parse_desired
from modelserve.contracts.operator_settings import Settings
from modelserve.contracts.sidecar import Settings as SidecarSettings
from modelserve.operator.adapters import adapter_statuses, pods_to_nudge
from modelserve.operator.status import transitions

SETTINGS = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0")
PIRATE = {"name": "pirate", "source": "acme/pirate-lora"}
POET = {"name": "poet", "source": "/root/.cache/huggingface/poet"}


def _ms(**spec: Any) -> ModelServer:
    return model_server("base", "default", **spec)


def _pod(ms: ModelServer) -> dict[str, Any]:
    return manifests.deployment(ms, SETTINGS)["spec"]["template"]


def test_vllm_turns_lora_on_with_the_limits_and_the_runtime_routes() -> None:
    engine, sidecar = _pod(_ms(adapters=[PIRATE], adapterLimits={"maxRank": 32, "maxPerBatch": 3}))["spec"][
        "containers"
    ]
    assert engine["args"][-5:] == ["--enable-lora", "--max-loras", "3", "--max-lora-rank", "32"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in engine["env"]
    env = {var["name"]: var["value"] for var in sidecar["env"]}
    assert env["MODELSERVE_ADAPTER_API"] == "vllm"
    assert SidecarSettings.from_env(env).adapters_dir.as_posix() == "/etc/modelserve/adapters"


def test_sglang_gets_rank_target_modules_and_one_more_batch_slot_for_the_base() -> None:
    (engine, sidecar) = _pod(_ms(profile="low-latency", adapters=[]))["spec"]["containers"]
    args = engine["args"]
    at = args.index("--enable-lora")
    expected = ["--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "all", "--max-loras-per-batch", "5"]
    assert args[at : at + 7] == expected
    assert {"name": "MODELSERVE_ADAPTER_API", "value": "sglang"} in sidecar["env"]


def test_without_adapters_nothing_changes() -> None:
    pod = _pod(_ms())
    engine, sidecar = pod["spec"]["containers"]
    assert "--enable-lora" not in engine["args"]
    assert not any(var["name"].startswith("MODELSERVE_ADAPTER") for var in sidecar["env"])
    assert all(volume["name"] != "adapters" for volume in pod["spec"]["volumes"])
    assert manifests.adapters_config_map(_ms()) is None


def test_the_list_lives_in_a_configmap_so_changing_it_rolls_no_pod() -> None:
    one, two = _ms(adapters=[PIRATE]), _ms(adapters=[PIRATE, POET])
    assert _pod(one) == _pod(two) == _pod(_ms(adapters=[]))
    config_map = manifests.adapters_config_map(two)
    assert config_map["metadata"]["name"] == "base-adapters"
    assert parse_desired(config_map["data"][ADAPTERS_KEY]) == (
        Desired("pirate", "acme/pirate-lora"),
        Desired("poet", "/root/.cache/huggingface/poet"),
    )
    volumes = {volume["name"]: volume for volume in _pod(two)["spec"]["volumes"]}
    assert volumes["adapters"]["configMap"]["name"] == "base-adapters"
    kinds = [obj["kind"] for obj in manifests.server_side_applied(two, SETTINGS)]
    assert kinds.index("ConfigMap") < kinds.index("Deployment")


def _report(*states: tuple[str, str, Phase, str]) -> list[AdapterState]:
    return [AdapterState(name, source, phase, message, 0.5) for name, source, phase, message in states]


def test_status_per_adapter_across_replicas() -> None:
    ms = _ms(adapters=[PIRATE, POET])
    loaded = ("pirate", "acme/pirate-lora", Phase.LOADED, "loaded")
    refused = ("poet", POET["source"], Phase.FAILED, "No adapter found for /root/.cache/huggingface/poet")
    pending = ("poet", POET["source"], Phase.PENDING, "waiting for the engine")
    statuses = adapter_statuses(ms, [_report(loaded, refused), _report(loaded, pending), None])
    assert [(s.name, s.phase, s.loaded_replicas) for s in statuses] == [("pirate", "Loaded", 2), ("poet", "Failed", 0)]
    assert statuses[1].message.startswith("No adapter found") and statuses[0].load_seconds == 0.5
    half = adapter_statuses(ms, [_report(loaded), _report()])
    assert (half[0].phase, half[0].message) == ("Pending", "loaded in 1 of 2 ready replica(s)")
    assert adapter_statuses(ms, [])[0].message == "no ready replica"
    # A report for another source (the spec changed since) does not count.
    old = ("pirate", "acme/old", Phase.LOADED, "loaded")
    assert adapter_statuses(ms, [_report(old)])[0].phase == "Pending"
    assert adapter_statuses(_ms(), [_report(loaded)]) is None


def test_states_round_trip_the_sidecars_json() -> None:
    state = AdapterState("pirate", "acme/pirate-lora", Phase.FAILED, "refused", None)
    assert AdapterState.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_an_adapter_that_turns_loaded_or_failed_is_an_event() -> None:
    pending = {"name": "poet", "source": "a/poet", "phase": "Pending", "message": "no ready replica"}
    failed = {**pending, "phase": "Failed", "message": "No adapter found for a/poet"}
    loaded = {"name": "pirate", "source": "a/pirate", "phase": "Loaded", "message": "loaded in 1 ready replica(s)"}
    events = transitions({"adapters": [pending]}, {"adapters": [failed, loaded]})
    assert [(e.type, e.reason) for e in events] == [("Warning", "AdapterFailed"), ("Normal", "AdapterLoaded")]
    assert "No adapter found for a/poet" in events[0].message
    assert transitions({"adapters": [failed, loaded]}, {"adapters": [failed, loaded]}) == []


def test_pods_are_nudged_until_they_carry_the_lists_hash() -> None:
    one, two = _ms(adapters=[PIRATE]), _ms(adapters=[PIRATE, POET])
    digest = manifests.adapters_digest(two)
    assert digest != manifests.adapters_digest(one) and manifests.adapters_digest(_ms()) is None
    assert digest == manifests.adapters_digest(_ms(adapters=[PIRATE, POET]))  # the same list, the same bytes

    def pod(name: str, annotation: str | None, deleting: bool = False) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name, "annotations": {} if annotation is None else {ANNOTATION: annotation}}
        if deleting:
            metadata["deletionTimestamp"] = "2026-11-25T00:00:00Z"
        return {"metadata": metadata}

    pods = [pod("new", None), pod("old", manifests.adapters_digest(one)), pod("done", digest), pod("gone", None, True)]
    assert pods_to_nudge(digest, pods) == ["new", "old"]


ANNOTATION = manifests.ADAPTERS_HASH_ANNOTATION
