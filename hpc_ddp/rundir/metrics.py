"""The metrics file: ``RUN_DIR/metrics.jsonl``, one JSON object per line, and the rule that
reads it back.

Rank 0 appends and flushes it line by line (:class:`~hpc_ddp.runtime.metrics.MetricsWriter`), so a
requeued attempt continues the same file and a reader (``hpc-ddp status``, ``results``) sees whole
lines, at worst a torn last one.

The file is only ever appended to, so a resumed attempt drops the steps its predecessor logged
after the checkpoint it goes on from with a marker: ``{"event": "resume", "step": N, "time":
...}`` before its first row, and every row above it that logged a step after N is replaced by
what follows. :func:`drop_replayed` is that rule; ``status`` and ``results`` read the file
through it, so each step counts once, from the attempt that counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

NOT_METRICS = frozenset({"step", "time"})  # the x axis and the wall time, not curves
RESUME_EVENT = "resume"
"""``event`` of the marker a resumed attempt writes before its first row (see the module)."""


def resume_marker(step: int, now: float) -> dict[str, Any]:
    """The marker row: the attempt goes on after ``step``; rows logged before it at later
    steps are about to be logged again."""
    return {"event": RESUME_EVENT, "step": step, "time": now}


TAIL_BYTES = 1 << 16
"""How much of the end of ``metrics.jsonl`` :func:`last_logged_step` reads."""


def last_logged_step(path: Path) -> int | None:
    """The step of the last row in ``path`` that has one (0: no file, or no row); None when
    the file's last :data:`TAIL_BYTES` hold no row with a step (rows without one only)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return 0
    if not tail.strip():
        return 0
    for line in reversed(tail.splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn line, or the first one, cut by the seek
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def drop_replayed(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` that count, in order, markers left out: each resume
    marker drops the rows before it whose ``step`` is after the marker's (an attempt that
    crashed after its last checkpoint logged them, and the next one logs them again)."""
    kept: list[dict[str, Any]] = []
    for row in rows:
        step = row.get("step")
        if row.get("event") == RESUME_EVENT and isinstance(step, int):
            kept = [r for r in kept if not (isinstance(r.get("step"), int) and r["step"] > step)]
            continue
        kept.append(row)
    return kept


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
