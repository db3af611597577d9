"""Small helpers shared by the benchmarks: timing whole commands, reporting as a table."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def time_command(argv: Sequence[str], repeats: int, cwd: Path = REPO) -> list[float]:
    """Wall-clock seconds of ``repeats`` runs of ``argv`` (after one warm-up run)."""
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def summary(label: str, times: Sequence[float]) -> str:
    """One report line: median, min and max in milliseconds."""
    return (
        f"{label:48} median {1000 * statistics.median(times):8.1f} ms"
        f"   min {1000 * min(times):8.1f}   max {1000 * max(times):8.1f}   (n={len(times)})"
    )
