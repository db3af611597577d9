"""Writing ledger events in tests, as the requeue coordinator does: one durable line each."""

from __future__ import annotations

from pathlib import Path

from hpc_ddp.durable import append_line
from hpc_ddp.runtime.ledger import EndCause, end_event, start_event


def record_start(
    path: Path,
    *,
    attempt: int,
    job_id: str | None,
    job_ref: str | None,
    nodelist: str,
    world_size: int,
    resumed_from_step: int | None,
    checkpoint: str | None,
    now: float | None = None,
) -> None:
    """Append an ``attempt_start`` event to the ledger at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(
        path,
        start_event(
            attempt=attempt,
            job_id=job_id,
            job_ref=job_ref,
            nodelist=nodelist,
            world_size=world_size,
            resumed_from_step=resumed_from_step,
            checkpoint=checkpoint,
            now=now,
        ),
    )


def record_end(
    path: Path,
    *,
    attempt: int,
    cause: EndCause,
    steps_done: int | None,
    checkpoint: str | None,
    requeue_requested: bool,
    message: str = "",
    now: float | None = None,
) -> None:
    """Append an ``attempt_end`` event to the ledger at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(
        path,
        end_event(
            attempt=attempt,
            cause=cause,
            steps_done=steps_done,
            checkpoint=checkpoint,
            requeue_requested=requeue_requested,
            message=message,
            now=now,
        ),
    )
