"""A process's memory as the kernel counts it (/proc/<pid>/status), for tests that bound what a
hostile client makes a proxy or the node agent hold."""

from __future__ import annotations

from pathlib import Path


def status_bytes(pid: int, field: str = "VmRSS") -> int:
    """`field` of the process's status in bytes: VmRSS (resident now) or VmHWM (its peak)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:"))) * 1024
