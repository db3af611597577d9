"""Writing ledger events in tests, as the requeue coordinator does: one durable line each.

The keyword arguments are :func:`hpc_ddp.rundir.ledger_events.start_event`'s and ``end_event``'s,
but for the attempt's key, given as its parts (``job_id``, ``job_ref``, ``restart``, ``launch``;
``restart`` defaults to the attempt's number): they make its
:class:`~hpc_ddp.rundir.ledger_events.LaunchId`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_ddp.durable import append_line
from hpc_ddp.rundir.ledger_events import LaunchId, end_event, start_event

_KEY = ("job_id", "job_ref", "restart", "launch")


def _keyed(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with its key's parts made one ``launch_id`` (None when it names none)."""
    parts = {k: event.pop(k) for k in _KEY if k in event}
    if parts:
        restart = parts.get("restart")
        event["launch_id"] = LaunchId(
            parts.get("job_id"),
            parts.get("job_ref"),
            event["attempt"] if restart is None else restart,
            parts.get("launch", 0),
        )
    return event


def record_start(path: Path, **event: Any) -> None:
    """Append an ``attempt_start`` event to the ledger at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, start_event(**_keyed({"launch_id": None, **event})))


def record_end(path: Path, **event: Any) -> None:
    """Append an ``attempt_end`` event to the ledger at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, end_event(**_keyed(event)))
