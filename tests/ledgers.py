"""Writing ledger events in tests, as the requeue coordinator does: one durable line each.

The keyword arguments are :func:`hpc_ddp.rundir.ledger_events.start_event`'s and ``end_event``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_ddp.durable import append_line
from hpc_ddp.rundir.ledger_events import end_event, start_event


def record_start(path: Path, **event: Any) -> None:
    """Append an ``attempt_start`` event to the ledger at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, start_event(**event))


def record_end(path: Path, **event: Any) -> None:
    """Append an ``attempt_end`` event to the ledger at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, end_event(**event))
