"""The operator-sidecar contract: what the operator renders into a pod, the sidecar reads back as the
spec said, through the sidecar's own settings loader."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from harness.testdata import examples
from modelserve import __version__
from modelserve.api import manifests
from modelserve.api.spec import AuthMode, ModelServer, SamplingDefaults
from modelserve.contracts import sidecar as contract
from modelserve.contracts.adapters import AdapterApi
from modelserve.contracts.env import variables
from modelserve.contracts.names import SIDECAR_NAME
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import engine_for

SETTINGS = Settings(sidecar_image="ghcr.io/modelserve/modelserve:0.1.0", drain_seconds=45)
# Every example as it is, plus the variants the examples do not show.
VARIANTS = {
    "public": {"auth": {"mode": "public"}},
    "private-named": {"auth": {"mode": "private", "secretName": "team-keys"}},
    "sampling": {
        "samplingDefaults": {
            "temperature": 0.1,
            "topK": 50,
            "maxTokens": 512,
            "repetitionPenalty": 1.05,
            "stop": ["<|im_end|>", "<|endoftext|>"],
        }
    },
    "vision": {"vision": True},
}


def _cases() -> list[tuple[str, dict]]:
    cases = [(name, manifest) for name, manifest in examples().items()]
    base = examples()["lfm2-1.2b"]
    cases += [(variant, {**base, "spec": {**base["spec"], **change}}) for variant, change in VARIANTS.items()]
    return cases


def _sidecar_env(ms: ModelServer, settings: Settings = SETTINGS) -> dict[str, str]:
    pod = manifests.serving_pod_template(manifests.workload(ms, settings))["spec"]
    (sidecar,) = [c for c in pod["containers"] if c["name"] == SIDECAR_NAME]
    return {var["name"]: var["value"] for var in sidecar["env"]}


@pytest.mark.parametrize(("name", "manifest"), _cases(), ids=[name for name, _ in _cases()])
def test_the_sidecar_reads_back_what_the_spec_said(name: str, manifest: dict) -> None:
    ms = ModelServer.from_manifest({**manifest, "metadata": {**manifest["metadata"], "namespace": "ns", "uid": "u"}})
    read = contract.Settings.from_env(_sidecar_env(ms))

    assert read == manifests.sidecar_settings(ms, SETTINGS)
    assert read.served_model == ms.name
    if ms.spec.external:
        assert read.upstream_url == ms.spec.external.url
        assert (read.engine_health_path, read.engine_metrics) == ("/v1/models", False)
        assert read.upstream_model == read.engine_model == ms.spec.model
        assert dict(read.sampling_aliases) == {}
    else:
        engine = engine_for(ms.spec.profile)
        assert read.upstream_url == f"http://127.0.0.1:{engine.port}"
        assert (read.engine_health_path, read.engine_metrics_path) == (engine.health_path, engine.metrics_path)
        assert read.engine_probe_timeout_seconds == engine.probe_timeout_seconds
        assert read.engine_metrics and read.upstream_model == "" and read.engine_model == ms.name
        assert dict(read.sampling_aliases) == dict(engine.sampling_aliases)
    assert read.auth_public == (ms.spec.auth.mode == AuthMode.PUBLIC)
    assert read.vision == ms.spec.vision
    expected_sampling = ms.spec.sampling_defaults.model_dump(exclude_none=True) if ms.spec.sampling_defaults else {}
    assert dict(read.sampling_defaults) == expected_sampling
    assert all(type(value) is contract.SAMPLING_FIELDS[key] for key, value in read.sampling_defaults.items())
    assert read.drain_seconds == SETTINGS.drain_seconds
    pod = manifests.serving_pod_template(manifests.workload(ms, SETTINGS))["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == SIDECAR_NAME)
    assert sidecar["ports"][0]["containerPort"] == read.listen_port
    if read.auth_public:
        assert "volumeMounts" not in sidecar
    else:
        assert sidecar["volumeMounts"][0]["mountPath"] == str(read.keys_dir) == contract.KEYS_DIR
        assert read.keys_dir == Path(contract.KEYS_DIR)


def test_rendering_round_trips_every_setting() -> None:
    every = contract.Settings(
        upstream_url="http://127.0.0.1:9",
        served_model="m",
        listen_host="::",
        listen_port=9000,
        engine_health_path="/h",
        engine_metrics_path="/m",
        engine_metrics=False,
        upstream_model="llama3.2:1b",
        engine_probe_timeout_seconds=2.5,
        auth_public=False,
        keys_dir=Path("/keys"),
        metrics_public=False,
        vision=True,
        sampling_defaults={"top_k": 5, "temperature": 0.7, "stop": ["<|im_end|>"]},
        sampling_aliases={"repetition_penalty": "repeat_penalty"},
        max_body_bytes=7,
        upstream_timeout_seconds=1.5,
        drain_seconds=0.5,
        upstream_max_connections=3,
        adapter_api=AdapterApi.SGLANG,
        adapters_dir=Path("/adapters"),
        engine_concurrency=6,
        replicas_file=Path("/replicas/count"),
        workers=3,
        max_head_bytes=8192,
        max_header_fields=20,
        head_timeout_seconds=2.5,
        body_timeout_seconds=30.5,
        max_connections=99,
        body_budget_bytes=1 << 20,
        send_timeout_seconds=12.5,
        tls_dir=Path("/tls"),
    )
    env = every.to_env()
    assert set(env) == set(variables(contract.Settings))  # nothing left out with private auth
    read = contract.Settings.from_env(env)
    assert read == every


def test_the_spec_sampling_fields_are_the_contracts() -> None:
    fields = SamplingDefaults.model_fields
    assert list(fields) == list(contract.SAMPLING_FIELDS)
    for name, kind in contract.SAMPLING_FIELDS.items():
        assert kind in {_python_type(arg) for arg in typing.get_args(fields[name].annotation)}, name


def _python_type(annotation: object) -> object:
    """`Annotated[list[str], ...]` -> list; `float` -> float."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return typing.get_origin(annotation) or annotation


def test_only_llama_cpp_reads_repetition_penalty_under_its_own_name() -> None:
    # llama.cpp's server (b9093, b11434) ignores repetition_penalty and reads repeat_penalty.
    cpu = ModelServer.from_manifest(examples()["smollm2-135m-cpu"])
    assert _sidecar_env(cpu)["MODELSERVE_SAMPLING_ALIASES"] == '{"repetition_penalty":"repeat_penalty"}'
    gpu = ModelServer.from_manifest(examples()["lfm2-1.2b"])
    assert "MODELSERVE_SAMPLING_ALIASES" not in _sidecar_env(gpu)


CONTRACT_RECORDS = Path(__file__).parents[1] / "fixtures" / "sidecar-contract"


def _release(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.stem.split("."))


def _previous_record() -> dict:
    """The sidecar of release N-1 as recorded: the newest record older than this release (this
    release's own while it is the first)."""
    this = tuple(int(part) for part in __version__.split(".")[:3])
    older = sorted((p for p in CONTRACT_RECORDS.glob("*.json") if _release(p) < this), key=_release)
    return json.loads((older[-1] if older else CONTRACT_RECORDS / f"{__version__}.json").read_text())


def test_this_releases_contract_record_is_what_the_code_says() -> None:
    # `make generate` writes it; a change of the contract without it fails here.
    assert json.loads((CONTRACT_RECORDS / f"{__version__}.json").read_text()) == contract.record()


def test_the_operator_manages_a_sidecar_one_release_older() -> None:
    previous = _previous_record()
    assert previous["contract"] >= contract.CONTRACT_VERSION - 1
    # The autoscaler reads every pod's load, and the kubelet probes kept pods, on N-1's routes.
    assert {contract.LOAD_ROUTE, contract.HEALTH_ROUTE, contract.READY_ROUTE} <= set(previous["routes"])
    assert contract.PodLoad.from_json(previous["load"]) == contract.PodLoad(3, 17, 1.5)
    # What this operator renders for every example and variant, an N-1 sidecar reads all of.
    for _, manifest in _cases():
        ms = ModelServer.from_manifest({**manifest, "metadata": {**manifest["metadata"], "namespace": "n", "uid": "u"}})
        unknown = set(_sidecar_env(ms)) - set(previous["variables"])
        assert not unknown, f"{ms.name}: variables a sidecar of the previous release does not read: {unknown}"


def test_the_operators_client_limits_reach_every_sidecar_and_stay_out_at_their_defaults() -> None:
    ms = ModelServer.from_manifest(examples()["smollm2-135m-cpu"])
    limit_variables = {contract.Settings.__dataclass_fields__[name].metadata["env"] for name in contract.CLIENT_LIMITS}
    assert not limit_variables & set(_sidecar_env(ms))  # no pod rolls for settings it already runs with
    changed = Settings.from_env(
        {"MODELSERVE_SIDECAR_MAX_CONNECTIONS": "99", "MODELSERVE_SIDECAR_HEAD_TIMEOUT_SECONDS": "2.5"}
    )
    read = contract.Settings.from_env(_sidecar_env(ms, changed))
    assert (read.max_connections, read.head_timeout_seconds) == (99, 2.5)
    assert read.max_head_bytes == contract.Settings.__dataclass_fields__["max_head_bytes"].default
