"""`modelserve-operator` with tracemalloc on: SIGUSR1 writes the top allocation sites to
$MODELSERVE_TRACEMALLOC_OUT (where the operator's memory goes, for bench/operator_scale.py)."""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

from modelserve.operator.main import main

TOP = 25


def dump(_signum: int, _frame: FrameType | None) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snapshot.statistics("traceback")
    total = sum(stat.size for stat in stats)
    lines = [f"traced {total / 2**20:.1f} MiB in {sum(stat.count for stat in stats)} blocks; top {TOP} sites:"]
    for stat in stats[:TOP]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback[:4])
        lines.append(f"{stat.size / 2**20:8.1f} MiB {stat.count:8d} blocks  {frames}")
    out = Path(os.environ["MODELSERVE_TRACEMALLOC_OUT"])
    out.with_suffix(".tmp").write_text("\n".join(lines) + "\n")
    out.with_suffix(".tmp").rename(out)  # whole, for whoever waits for the file


if __name__ == "__main__":
    tracemalloc.start(4)  # frames per allocation: enough to name the caller, cheap to snapshot
    signal.signal(signal.SIGUSR1, dump)
    main(sys.argv[1:])
