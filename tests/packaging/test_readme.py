"""The README cannot drift from the code it documents."""

from __future__ import annotations

import re

from modelserve.api import spec_table
from modelserve.engines import ENGINES
from modelserve.operator import status
from modelserve.sidecar.metrics import SidecarMetrics
from tests.helpers.chart import REPO

README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_spec_reference_is_generated_from_the_spec_model() -> None:
    assert spec_table.updated(README) == README, "README.md's spec reference drifted: run `make generate`"
    # Every field of the model has a row.
    for field, *_ in spec_table.rows(spec_table.spec_schema()):
        assert f"\n| {field} |" in README


def test_the_two_set_up_commands() -> None:
    set_up = _section("Set up")
    assert "| `make dev` |" in set_up and "| `make test` |" in set_up
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^dev:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_sidecar_series_is_listed() -> None:
    metrics = _section("Metrics")
    for family in SidecarMetrics().registry.collect():
        if family.name.startswith("modelserve_sidecar_process_"):
            continue  # the standard process collector's series
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` | {family.type} |" in metrics, name


def test_every_status_reason_has_troubleshooting() -> None:
    status_source = (REPO / "modelserve" / "operator" / "status.py").read_text()
    reasons = set(re.findall(r'Problem\(\s*"(\w+)"', status_source)) | {"ScaledToZero"}
    reasons |= set(status.UNSCHEDULABLE_REASONS)  # a pod the scheduler could not place: what is short
    assert {"InsufficientGPU", "InsufficientCPU", "ModelLoading", "ImagePullError", "CrashLoop"} <= reasons
    troubleshooting = _section("Troubleshooting")
    for reason in reasons:
        assert f"`{reason}`" in troubleshooting, reason


def test_the_security_section_lists_every_refused_flag_and_variable() -> None:
    security = _section("Security")
    for engine in ENGINES.values():
        row = next(line for line in security.splitlines() if f"({engine.title} {engine.version})" in line)
        for switch in (*engine.admin_flags, *engine.admin_env):
            assert f"`{switch.name}`" in row, (engine.name, switch.name)
