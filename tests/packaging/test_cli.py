"""`modelserve render` and `modelserve key new`, run as a user runs them."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.testdata import CRD_PATH, examples, invalid_cases
from modelserve.api.spec import NAME_RULE
from modelserve.api.validation import rules_by_message
from modelserve.cli.main import API_KEY_PLACEHOLDER
from modelserve.contracts.api_keys import GENERATED_KEY_FIELD
from modelserve_sandbox.cluster import Cluster
from tests.helpers.chart import REPO

GOLDEN_DIR = REPO / "tests" / "api" / "golden"
GOLDEN_UID = "00000000-0000-4000-8000-000000000000"  # what the golden files were rendered with
SIDECAR_IMAGE = "ghcr.io/modelserve/modelserve:0.1.0"


def modelserve(*args: str, input: str | None = None, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODELSERVE_SIDECAR_IMAGE": SIDECAR_IMAGE, **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "modelserve.cli.main", *args],
        input=input,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def _write(path: Path, *manifests: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("name", sorted(examples()))
def test_render_is_the_operators_golden_set(tmp_path: Path, name: str) -> None:
    manifest = copy.deepcopy(examples()[name])
    manifest["metadata"]["uid"] = GOLDEN_UID
    result = modelserve("render", _write(tmp_path / "ms.yaml", manifest))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (GOLDEN_DIR / f"{name}.yaml").read_text()


def test_render_refuses_a_bad_operator_setting_naming_it(tmp_path: Path) -> None:
    example = _write(tmp_path / "ms.yaml", examples()["lfm2-1.2b"])
    result = modelserve("render", example, MODELSERVE_DRAIN_SECONDS="a minute")
    assert result.returncode == 2 and not result.stdout
    assert "modelserve render: invalid configuration: MODELSERVE_DRAIN_SECONDS='a minute'" in result.stderr


def test_render_takes_many_files_documents_and_stdin(tmp_path: Path) -> None:
    cpu, gpu = examples()["smollm2-135m-cpu"], examples()["lfm2-1.2b"]
    both = _write(tmp_path / "both.yaml", cpu, gpu)
    result = modelserve("render", "-n", "serving", both, "-", input=yaml.safe_dump(cpu))
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all(result.stdout))
    deployments = [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in rendered if d["kind"] == "Deployment"]
    assert deployments == [("serving", "smollm2-135m-cpu"), ("serving", "lfm2-1-2b"), ("serving", "smollm2-135m-cpu")]
    # The private example gets its key Secret, with a placeholder rather than a key nobody will use.
    (secret,) = [d for d in rendered if d["kind"] == "Secret"]
    assert secret["stringData"] == {GENERATED_KEY_FIELD: API_KEY_PLACEHOLDER}
    owners = {d["metadata"]["ownerReferences"][0]["uid"] for d in rendered}
    assert owners == {"<uid of the ModelServer>"}


# Every invalid case in one render (a CLI start is about a second, and there are over a hundred):
# render names each invalid document, in order, under a line of its own.
_REFUSED: dict[str, str] = {}


def _render_refused(tmp_path_factory: pytest.TempPathFactory, case: str) -> str:
    """What `modelserve render` says of `case`'s file, rendered with every other invalid case's."""
    if not _REFUSED:
        folder = tmp_path_factory.mktemp("invalid")
        files = [_write(folder / f"{name}.yaml", manifest) for name, manifest, _, _ in invalid_cases()]
        result = modelserve("render", *files)
        assert result.returncode == 1 and not result.stdout, result.stderr[-2000:]
        blocks = re.split(r"^modelserve render: ", result.stderr, flags=re.MULTILINE)[1:]
        for block in blocks:
            _REFUSED[Path(block.split(" (document ", 1)[0]).stem] = block
        assert list(_REFUSED) == [name for name, _, _, _ in invalid_cases()], result.stderr[-2000:]
    return _REFUSED[case]


@pytest.mark.parametrize(("case", "manifest", "field", "says"), invalid_cases(), ids=[c[0] for c in invalid_cases()])
def test_render_refuses_what_the_api_server_refuses(
    tmp_path_factory: pytest.TempPathFactory, case: str, manifest: dict, field: str, says: tuple[str, ...]
) -> None:
    refusal = _render_refused(tmp_path_factory, case)
    assert f'ModelServer "{manifest["metadata"]["name"]}" is invalid:' in refusal.splitlines()[0], refusal
    named = [line.split(": ", 1)[0] for line in refusal.splitlines()[1:]]
    # A repeated list-map key: the API server names the repeat (spec.env[1]), render the list.
    assert any(field == path or field.startswith(f"{path}[") for path in named), refusal
    assert all(words in refusal for words in says), refusal


def test_render_names_the_file_and_document_of_a_bad_manifest(tmp_path: Path) -> None:
    good, bad = examples()["lfm2-1.2b"], copy.deepcopy(examples()["lfm2-1.2b"])
    bad["spec"]["replicas"] = {"min": 3, "max": 2}
    path = _write(tmp_path / "two.yaml", good, bad)
    result = modelserve("render", path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f'modelserve render: {path} (document 2): ModelServer "lfm2-1-2b" is invalid:',
        "spec.replicas.min: replicas.min must not exceed replicas.max",
        "spec.replicas.buffer: replicas.min + replicas.buffer must not exceed replicas.max",
    ]
    # Every invalid document is named, not only the first, and nothing is printed for the valid ones.
    other = copy.deepcopy(examples()["smollm2-135m-cpu"])
    other["spec"]["maxModelLen"] = -1
    both = modelserve("render", path, _write(tmp_path / "other.yaml", good, other))
    assert both.returncode == 1 and not both.stdout, both.stdout
    headers = [line for line in both.stderr.splitlines() if line.startswith("modelserve render: ")]
    assert headers == [
        f'modelserve render: {path} (document 2): ModelServer "lfm2-1-2b" is invalid:',
        f'modelserve render: {tmp_path / "other.yaml"} (document 2): ModelServer "smollm2-135m-cpu" is invalid:',
    ], both.stderr
    assert "spec.maxModelLen: " in both.stderr, both.stderr
    assert modelserve("render", str(tmp_path / "missing.yaml")).returncode == 1


def test_key_new_prints_a_secret_with_a_fresh_key() -> None:
    first, second = modelserve("key", "new", "team-keys", "-n", "serving"), modelserve("key", "new", "team-keys")
    assert first.returncode == 0 and second.returncode == 0
    secret = yaml.safe_load(first.stdout)
    assert secret["metadata"] == {"name": "team-keys", "namespace": "serving"}
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    key = secret["stringData"][GENERATED_KEY_FIELD]
    assert re.fullmatch(r"msk-[A-Za-z0-9_-]{43}", key)  # 32 random bytes
    assert yaml.safe_load(second.stdout)["stringData"][GENERATED_KEY_FIELD] != key
    refused = modelserve("key", "new", "Team_Keys")
    assert refused.returncode == 1 and "not a valid Secret name" in refused.stderr


# --- against the real API server -------------------------------------------------------------


def _api_server_refusal(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> str:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"the API server accepted {manifest}"
    return result.stderr


def test_render_and_the_api_server_name_the_same_fields(
    cluster: Cluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    cluster.wait_established("modelservers.serving.modelserve.dev")
    rule_messages = {NAME_RULE.message, *rules_by_message()}
    for case, manifest, _, _ in invalid_cases():
        refusal = _api_server_refusal(cluster, namespace, manifest)
        cli = _render_refused(tmp_path_factory, case).splitlines()[1:]
        for line in cli:
            path, message = line.split(": ", 1)
            assert path in refusal, f"{case}: the API server does not name {path}:\n{refusal}"
            if message in rule_messages:  # the same CEL rule: the same words
                assert message in refusal, f"{case}:\n{refusal}"
