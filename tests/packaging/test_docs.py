"""The docs cannot drift from the code they document: the generated reference pages are what
`make generate` writes now, and the hand-written pages name every reason, series and refused switch."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hack import docgen
from hack.docgen import conditions, settings
from modelserve.api import spec_table
from modelserve.engines import ENGINES
from modelserve.operator import status
from modelserve.sidecar.metrics import SidecarMetrics
from tests.helpers.chart import REPO

DOCS = REPO / "docs"


def _page(path: str) -> str:
    return (DOCS / path).read_text()


def test_spec_reference_is_generated_from_the_spec_model() -> None:
    page = _page("reference/spec.md")
    assert spec_table.updated(page) == page, "docs/reference/spec.md drifted: run `make generate`"
    # Every field of the model has a row.
    for field, *_ in spec_table.rows(spec_table.spec_schema()):
        assert f"\n| {field} |" in page


@pytest.mark.parametrize("path", sorted(docgen.rendered()), ids=lambda path: str(path.relative_to(REPO)))
def test_generated_docs_are_current(path) -> None:
    assert path.read_text() == docgen.rendered()[path], f"{path.relative_to(REPO)} drifted: run `make generate`"


def test_every_generated_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    for path in docgen.PAGES:
        assert path.removeprefix("docs/") in nav, path


def test_every_setting_says_what_it_does() -> None:
    # The meaning column comes from the comment above each field (hack/docgen/settings.py).
    for _, _, cls in settings.PROGRAMS:
        meanings = settings.comments(cls)
        missing = [f.metadata["env"] for f in dataclasses.fields(cls) if not meanings.get(f.name)]
        assert not missing, f"{cls.__module__}.{cls.__name__}: write a comment above {missing}"


def test_every_sidecar_series_is_listed() -> None:
    metrics = _page("reference/metrics.md")
    for family in SidecarMetrics().registry.collect():
        if family.name.startswith("modelserve_sidecar_process_"):
            continue  # the standard process collector's series
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{name}` | {family.type} |" in metrics, name


def test_every_status_reason_has_troubleshooting() -> None:
    status_source = (REPO / "modelserve" / "operator" / "status.py").read_text()
    reasons = set(re.findall(r'Problem\(\s*"(\w+)"', status_source)) | {"ScaledToZero"}
    reasons |= set(status.UNSCHEDULABLE_REASONS)  # a pod the scheduler could not place: what is short
    # And every reason the conditions reference finds with a message about what is wrong.
    reasons |= {reason.name for reason in conditions.reasons().values() if reason.problem}
    assert {"InsufficientGPU", "InsufficientCPU", "ModelLoading", "ImagePullError", "CrashLoop"} <= reasons
    assert {"LeaderWorkerSetMissing", "InvalidSpec", "ApplyFailed", "WaitingForGPUs"} <= reasons
    troubleshooting = _page("operations/troubleshooting.md")
    for reason in reasons:
        assert f"`{reason}`" in troubleshooting, reason


def test_every_condition_type_is_described() -> None:
    assert set(conditions.condition_types()) <= set(conditions.CONDITION_TYPES)
    assert {"Ready", "Progressing", "Degraded", "TrafficGuard"} <= set(conditions.condition_types())


def test_the_security_page_lists_every_refused_flag_and_variable() -> None:
    security = _page("operations/security.md")
    for engine in ENGINES.values():
        row = next(line for line in security.splitlines() if f"({engine.title} {engine.version})" in line)
        for switch in (*engine.admin_flags, *engine.admin_env):
            assert f"`{switch.name}`" in row, (engine.name, switch.name)


def test_the_quickstarts_client_image_is_the_pinned_sdks() -> None:
    """hack/build-images.sh tags the in-cluster client image with the virtualenv's openai version: the
    pages that name the image name the version pyproject.toml pins."""
    pinned = re.search(r'"openai==([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert pinned, "pyproject.toml pins the openai SDK"
    for page in ("getting-started/quickstart.md", "getting-started/set-up.md"):
        named = set(re.findall(r"modelserve\.local/openai-client:([0-9.]+)", _page(page)))
        assert named == {pinned.group(1)}, (page, named)
