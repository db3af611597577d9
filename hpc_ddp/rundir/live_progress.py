"""The live progress file: ``RUN_DIR/progress.json``, where rank 0 was when it last wrote it.

Rank 0 replaces it atomically (:class:`~hpc_ddp.runtime.progress_log.ProgressLog`); ``hpc-ddp
status`` reads it to show where a running run is and when it will end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LiveProgress", "format_duration", "read_live_progress"]


def format_duration(seconds: float) -> str:
    """``0:01:23``; days spill into the hours (``27:00:00``)."""
    total = max(0, round(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


@dataclass(frozen=True)
class LiveProgress:
    """What ``progress.json`` says: where rank 0 was when it last wrote it."""

    time: float
    step: int
    total: int
    samples_per_s: float | None
    eta_s: float | None

    def describe(self, now: float) -> str:
        """``at step 120/600 | 2345 samples/s | ETA 0:01:23 (5 s ago)``, the ETA counted
        down to ``now``."""
        parts = [f"at step {self.step}/{self.total}"]
        if self.samples_per_s is not None:
            parts.append(f"{self.samples_per_s:.0f} samples/s")
        ago = max(0.0, now - self.time)
        if self.eta_s is not None:
            parts.append(f"ETA {format_duration(max(0.0, self.eta_s - ago))}")
        return f"{' | '.join(parts)} ({ago:.0f} s ago)"


def read_live_progress(path: Path) -> LiveProgress | None:
    """The live progress in ``path`` (None: none, or not readable as one)."""
    try:
        data = json.loads(path.read_text())
        return LiveProgress(
            time=float(data["time"]),
            step=int(data["step"]),
            total=int(data["total"]),
            samples_per_s=None if data["samples_per_s"] is None else float(data["samples_per_s"]),
            eta_s=None if data["eta_s"] is None else float(data["eta_s"]),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None
