"""A run's files as ``status`` reads them without torch: the recorded run id, metrics lines.

The checkpoint files are judged in :mod:`hpc_ddp.rundir.checkpoints`, which the node side shares.
"""

from __future__ import annotations

import json
from typing import Any

from hpc_ddp.errors import RunDirError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.metrics import drop_replayed

__all__ = ["last_metric", "metric_rows", "step_times"]

Rows = list[dict[str, Any]]


def metric_rows(paths: RunPaths) -> Rows:
    """Every JSON object row of ``metrics.jsonl`` ([] without one): read once, for
    :func:`last_metric` and :func:`step_times` both."""
    rows = []
    try:
        with paths.metrics.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunDirError(
            f"{paths.metrics}: unreadable metrics ({exc.strerror or exc}). HINT: check the "
            "file's permissions, or move it aside (training appends a new one)."
        ) from None
    return rows


def _rows(source: RunPaths | Rows) -> Rows:
    return metric_rows(source) if isinstance(source, RunPaths) else source


def step_times(source: RunPaths | Rows) -> list[tuple[float, int]]:
    """(time, step) of every row that logged a step, rows a later attempt replayed included:
    when each step was reached, for the goodput account. ``source``: the run's files, or
    their :func:`metric_rows`."""
    out = []
    for row in _rows(source):
        when, step = row.get("time"), row.get("step")
        if isinstance(when, (int, float)) and isinstance(step, int) and "event" not in row:
            out.append((float(when), step))
    return out


def last_metric(source: RunPaths | Rows, key: str) -> Any:
    """The last value logged for ``key`` in ``metrics.jsonl`` (None if never logged), among
    the rows that count: a row a later attempt logged again is not the last word
    (:func:`~hpc_ddp.rundir.metrics.drop_replayed`, as ``results`` reads them).

    Lines that are not JSON objects (a torn last line from a killed writer, binary garbage, a
    bare number or list) are skipped. A metrics file that cannot be read at all is a
    :class:`RunDirError`.
    """
    rows = _rows(source)
    values = [row[key] for row in drop_replayed(rows) if key in row]
    return values[-1] if values else None
