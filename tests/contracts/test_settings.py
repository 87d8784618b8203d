"""The operator's settings: read like the sidecar's and the gateway's (typed, each error naming its
variable, exit 2), and the one renamed variable still read under its old name for one release."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelserve.contracts import sidecar
from modelserve.contracts.env import ConfigError, default_of, variables
from modelserve.contracts.operator_settings import Settings
from modelserve.engines import ENGINES
from modelserve.gateway.settings import GatewaySettings

OLD_NAME, NEW_NAME = "MODELSERVE_GATEWAY_NAMESPACE", "MODELSERVE_GATEWAY_POD_NAMESPACE"


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("MODELSERVE_DRAIN_SECONDS", "soon", "must be a number"),
        ("MODELSERVE_DRAIN_SECONDS", "-1", "must be zero or a positive number"),
        ("MODELSERVE_RESYNC_SECONDS", "-1", "must be zero or a positive number"),
        ("MODELSERVE_METRICS_PORT", "70000", "must be a port number"),
        ("MODELSERVE_GATEWAY_URL", "gateway:8080", "must be an http(s) URL"),
        ("MODELSERVE_GATEWAY_ADDRESSES", "127.0.0.1:8080,nowhere", "'nowhere' is not host:port"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_variable(variable: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({variable: value})
    assert str(refused.value).startswith(f"{variable}={value!r}: ") and says in str(refused.value)


@pytest.mark.parametrize("raw", ["30.5", "0", "45", "0.25"])
def test_the_drain_is_read_as_the_sidecar_reads_it(raw: str) -> None:
    # The operator passes MODELSERVE_DRAIN_SECONDS on to every sidecar: one variable, one type.
    env = {"MODELSERVE_DRAIN_SECONDS": raw}
    assert (
        Settings.from_env(env).drain_seconds
        == float(raw)
        == sidecar.Settings.from_env(
            {**env, "MODELSERVE_UPSTREAM_URL": "http://127.0.0.1:9", "MODELSERVE_SERVED_MODEL": "m"}
        ).drain_seconds
    )
    assert Settings().drain_seconds == default_of(sidecar.Settings.__dataclass_fields__["drain_seconds"])


def test_the_operator_exits_2_naming_the_bad_variable() -> None:
    program = Path(sys.executable).with_name("modelserve-operator")
    env = {"PATH": os.environ["PATH"], "MODELSERVE_STARTUP_SECONDS": "an hour"}
    result = subprocess.run([str(program)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "modelserve-operator: invalid configuration: MODELSERVE_STARTUP_SECONDS='an hour'" in result.stderr


def test_the_help_lists_every_variable() -> None:
    program = Path(sys.executable).with_name("modelserve-operator")
    result = subprocess.run([str(program), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for name in variables(Settings):
        assert name in result.stdout


def test_the_gateway_pod_namespace_is_read_under_its_old_name_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert Settings.from_env({OLD_NAME: "gateways"}).gateway_pod_namespace == "gateways"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert OLD_NAME in warning and NEW_NAME in warning and "deprecated" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        settings = Settings.from_env({OLD_NAME: "old", NEW_NAME: "new"})
    assert settings.gateway_pod_namespace == "new"
    assert not caplog.records  # the new name set: the old one is not read, nothing to warn about


def test_the_operator_and_the_gateway_name_their_namespaces_apart() -> None:
    assert NEW_NAME in variables(Settings) and OLD_NAME not in variables(Settings)
    assert "MODELSERVE_GATEWAY_NAMESPACES" in variables(GatewaySettings)
    assert not set(variables(Settings)) & set(variables(GatewaySettings))


def test_every_engine_has_its_image_variable() -> None:
    settings = Settings.from_env({engine.image_env: f"mirror/{engine.name}:1" for engine in ENGINES.values()})
    assert settings.engine_images == {engine.name: f"mirror/{engine.name}:1" for engine in ENGINES.values()}
    for engine in ENGINES.values():
        assert settings.engine_image(engine.name, engine.image) == f"mirror/{engine.name}:1"
        assert Settings().engine_image(engine.name, engine.image) == engine.image


def test_engine_images_are_read_by_name_blank_ones_left_out() -> None:
    env = {
        "MODELSERVE_ENGINE_IMAGE_VLLM": "mirror/vllm:1",
        "MODELSERVE_ENGINE_IMAGE_SGLANG": " ",
        "MODELSERVE_ENGINE_IMAGE_": "x",
    }
    assert Settings.from_env(env).engine_images == {"vllm": "mirror/vllm:1"}
    assert "MODELSERVE_ENGINE_IMAGE_<ENGINE>" in variables(Settings)
