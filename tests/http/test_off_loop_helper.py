"""The off-loop helper (http/off_loop.py) ends with the process that started it, however that ends:
issue 57 N17 found the helper, its fork server and the resource tracker alive after the gateway's
SIGTERM. A real proxy-like process starts the helper, says its pids, and is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from modelserve_sandbox.processes import ended, wait_until

STARTER = """
import asyncio, os, sys
from multiprocessing import resource_tracker
from modelserve.http.off_loop import OffLoop

async def main() -> None:
    work = OffLoop(4)
    assert await work.run(len, b"abc") == 3
    print(*work.helper_pids(), resource_tracker._resource_tracker._pid, flush=True)
    sys.stdin.read()  # until the test ends it

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_helper_and_its_tracker_end_with_the_process_that_started_them(tmp_path: Path, signum: int) -> None:
    script = tmp_path / "starter.py"
    script.write_text(STARTER)
    starter = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        pids = [int(pid) for pid in starter.stdout.readline().split()]
        assert len(pids) == 2 and not any(ended(pid) for pid in pids), pids  # the helper and the tracker
        os.kill(starter.pid, signum)  # SIGTERM's default: gone at once, no clean-up of its own
        starter.wait(timeout=30)
        wait_until(lambda: all(ended(pid) for pid in pids), 30, f"helper and tracker {pids} to end")
    finally:
        starter.kill()
        starter.wait(timeout=30)
        for pid in pids if "pids" in locals() else ():
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)
