"""`make generate` (`python -m hack.generate`): rewrite every file derived from the code, so a spec
change is one command.

- crds/modelserver.yaml and its chart copy, from the spec model (modelserve.api.crd);
- docs/reference/spec.md's table of every spec field and rule (modelserve.api.spec_table);
- the other reference pages (settings, metrics, conditions, chart values, CLI) and the diagram copied
  into README.md and docs/index.md (hack/docgen);
- tests/api/golden/*.yaml, each example's manifest set (review the diff: it is what users get);
- tests/fixtures/sidecar-contract/<version>.json, this release's side of the operator-sidecar
  contract (earlier releases' stay: the next release's N-1 tests read them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hack import docgen
from modelserve import __version__
from modelserve.api import crd, spec_table
from modelserve.contracts import sidecar

REPO = Path(__file__).resolve().parents[1]
CRD_FILES = (REPO / "crds" / "modelserver.yaml", REPO / "charts" / "modelserve" / "files" / "modelserver-crd.yaml")


def write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        print(f"updated {path.relative_to(REPO)}")


def main() -> int:
    for path in CRD_FILES:
        write(path, crd.render())
    spec_page = REPO / "docs" / "reference" / "spec.md"
    write(spec_page, spec_table.updated(spec_page.read_text()))
    for path, text in docgen.rendered().items():
        write(path, text)
    contract = REPO / "tests" / "fixtures" / "sidecar-contract" / f"{__version__}.json"
    contract.parent.mkdir(exist_ok=True)
    write(contract, json.dumps(sidecar.record(), indent=2) + "\n")
    golden = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/api/test_manifests.py",
            "-k",
            "golden",
        ],
        cwd=REPO,
        env={**os.environ, "MODELSERVE_UPDATE_GOLDEN": "1"},
        capture_output=True,
        text=True,
    )
    if golden.returncode != 0:
        print(golden.stdout + golden.stderr, file=sys.stderr)
        return golden.returncode
    print(
        subprocess.run(
            ["git", "status", "--short", "tests/api/golden"], cwd=REPO, capture_output=True, text=True
        ).stdout,
        end="",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
