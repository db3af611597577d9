"""Metrics and logs: ``RUN_DIR/metrics.jsonl`` (rank 0), progress lines, rank-tagged logging.

One JSON object per line, appended and flushed line by line, so a requeued attempt continues
the same file and a reader (``hpc-ddp status``, ``results``) sees whole lines, at worst a torn
last one. Formatting is pure; only :class:`MetricsWriter` touches the file.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import IO, Any


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars as Python numbers (``item()``); anything else as text."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


def metrics_line(row: dict[str, Any]) -> str:
    """One row as a JSON line; non-finite floats become null (JSON has no NaN)."""
    clean = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
    }
    return json.dumps(clean, default=_plain, allow_nan=False) + "\n"


def format_duration(seconds: float) -> str:
    """``0:01:23``; days spill into the hours (``27:00:00``)."""
    total = max(0, round(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def format_progress(
    *,
    step: int,
    total: int,
    epoch: int,
    loss: float | None,
    samples_per_s: float | None,
    eta_s: float | None,
) -> str:
    """``step 120/600 | epoch 1 | loss 0.4321 | 2345 samples/s | ETA 0:01:23``."""
    parts = [f"step {step}/{total}", f"epoch {epoch}"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if samples_per_s is not None:
        parts.append(f"{samples_per_s:.0f} samples/s")
    if eta_s is not None:
        parts.append(f"ETA {format_duration(eta_s)}")
    return " | ".join(parts)


class Throughput:
    """Samples per second and ETA over the window since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._start = time.perf_counter()
        self._steps = 0
        self._samples = 0

    def add(self, steps: int, samples: int) -> None:
        self._steps += steps
        self._samples += samples

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (evaluation, a checkpoint) out of the window."""
        self._start += seconds

    def rate(self) -> tuple[float | None, float | None]:
        """(samples per second, seconds per step) of the window, None when it is empty."""
        elapsed = time.perf_counter() - self._start
        if self._steps == 0 or elapsed <= 0:
            return None, None
        return self._samples / elapsed, elapsed / self._steps


class MetricsWriter:
    """Appends rows to ``metrics.jsonl``; open it on rank 0 only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", buffering=1)
        self._file.write(metrics_line(row))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_rank_logging(
    logger: logging.Logger, rank: int, *, every_rank: bool = False
) -> logging.Handler | None:
    """Rank-tagged lines on stderr from ``logger``: INFO on rank 0, warnings elsewhere.

    ``every_rank`` gives INFO on all ranks: right when each rank writes its own log file
    (srun ``--output=rank-%t.out``), wrong on a shared terminal where lines would repeat.
    Does nothing (returns None) when the application has configured logging itself.
    """
    if logger.handlers or logging.getLogger().handlers:
        return None
    handler = logging.StreamHandler()
    handler.addFilter(_RankFilter(rank))
    handler.setFormatter(logging.Formatter("%(asctime)s [rank %(rank)s] %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 or every_rank else logging.WARNING)
    return handler
