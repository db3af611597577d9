"""The attempt ledger: ``RUN_DIR/ledger.jsonl``, one JSON object per attempt event.

Every attempt of a run (the first start and each requeue) appends an ``attempt_start`` line
when it begins and an ``attempt_end`` line when it stops on purpose::

    {"event": "attempt_start", "attempt": 0, "time": 1718000000.0, "job_id": "4242",
     "job_ref": "4242", "nodelist": "n[1-2]", "world_size": 4, "resumed_from_step": null,
     "checkpoint": null}
    {"event": "attempt_end", "attempt": 0, "time": 1718003600.0, "cause": "time_limit",
     "steps_done": 1200, "checkpoint": "checkpoints/step-00001200.pt",
     "requeue_requested": true, "message": "time-limit warning signal"}

``requeue_requested`` is true only when hpc-ddp asked ``scontrol requeue`` and Slurm accepted;
a request that failed is recorded as the cause ``requeue_failed`` with ``requeue_requested``
false, and the ``message`` says what failed, which checkpoint is kept and how to go on.

Only global rank 0 writes, so there is a single writer per run: each event is one ``write`` of
one whole line to a file opened ``O_APPEND``, then fsynced. A crash can still leave a torn last
line; readers skip any line that does not parse, and writers start on a fresh line after one.
An attempt with a start and no end is still running, or died without a word (SIGKILL, node
failure): :func:`read_ledger` reports it with ``ended=None``.

The types (:class:`EndCause`, :class:`Attempt`) and the requeue decision
(:func:`decide_requeue`) are pure and live in :mod:`hpc_ddp.runtime.attempt`, re-exported here;
why a stop came is :func:`hpc_ddp.runtime.stopcause.classify_stop`'s to say.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_ddp.durable import append_line
from hpc_ddp.errors import RunDirError
from hpc_ddp.runtime.attempt import Attempt, EndCause, RequeueDecision, decide_requeue

# Re-exported: the types and the decision lived here before they moved to the pure
# hpc_ddp.runtime.attempt, and the runtime, the CLI and the tests import them from here.
__all__ = [
    "Attempt",
    "EndCause",
    "RequeueDecision",
    "decide_requeue",
    "read_ledger",
    "record_end",
    "record_start",
]

log = logging.getLogger(__name__)


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
    """Append an ``attempt_start`` event (rank 0 only)."""
    _append(
        path,
        {
            "event": "attempt_start",
            "attempt": attempt,
            "time": time.time() if now is None else now,
            "job_id": job_id,
            "job_ref": job_ref,
            "nodelist": nodelist,
            "world_size": world_size,
            "resumed_from_step": resumed_from_step,
            "checkpoint": checkpoint,
        },
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
    """Append an ``attempt_end`` event (rank 0 only)."""
    _append(
        path,
        {
            "event": "attempt_end",
            "attempt": attempt,
            "time": time.time() if now is None else now,
            "cause": EndCause(cause).value,
            "steps_done": steps_done,
            "checkpoint": checkpoint,
            "requeue_requested": requeue_requested,
            "message": message,
        },
    )


def _append(path: Path, event: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, json.dumps(event, sort_keys=True))


def read_ledger(path: Path) -> list[Attempt]:
    """The attempts recorded in ``path``, in the order they started; [] if there is no file.

    Lines that do not parse (a torn last line) or are not ledger events are skipped, never fatal.
    A ledger that cannot be read at all (a directory in its place, no permission) is a
    :class:`~hpc_ddp.errors.RunDirError` with a hint, not a traceback. A second start of the
    same attempt number (the same step relaunched) opens a new entry; an end closes the latest
    open entry of its attempt, and an end with no start is ignored.
    """
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:  # IsADirectoryError, PermissionError, EIO...
        raise RunDirError(
            f"{path}: unreadable ledger ({exc.strerror or exc}). HINT: ledger.jsonl must be a "
            "readable file; check its permissions, or move whatever is in its place aside "
            "(the next attempt starts a new ledger)."
        ) from None
    attempts: list[Attempt] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            _fold(attempts, event)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("%s:%d: skipping an unreadable ledger line (%s)", path, number, exc)
    return attempts


def _fold(attempts: list[Attempt], event: Any) -> None:
    kind = event["event"]
    if kind == "attempt_start":
        checkpoint = _opt_str(event.get("checkpoint"))
        attempts.append(
            Attempt(
                attempt=int(event["attempt"]),
                started=float(event["time"]),
                ended=None,
                cause=None,
                steps_done=None,
                checkpoint=checkpoint,
                nodelist=str(event.get("nodelist") or ""),
                job_ref=_opt_str(event.get("job_ref")),
                resumed_from_step=_opt_int(event.get("resumed_from_step")),
                job_id=_opt_str(event.get("job_id")),
                world_size=_opt_int(event.get("world_size")),
                resumed_from=checkpoint,
            )
        )
    elif kind == "attempt_end":
        number = int(event["attempt"])
        for index in range(len(attempts) - 1, -1, -1):
            entry = attempts[index]
            if entry.attempt == number and entry.is_open:
                attempts[index] = replace(
                    entry,
                    ended=float(event["time"]),
                    cause=_cause(event.get("cause")),
                    steps_done=_opt_int(event.get("steps_done")),
                    checkpoint=_opt_str(event.get("checkpoint")) or entry.checkpoint,
                    requeue_requested=bool(event.get("requeue_requested")),
                    message=_opt_str(event.get("message")),
                )
                return
        if not any(entry.attempt == number for entry in attempts):
            log.warning("ledger: end of attempt %d without its start; ignored", number)
    else:
        raise ValueError(f"unknown event {kind!r}")


def _cause(value: Any) -> EndCause:
    try:
        return EndCause(value)
    except ValueError:
        return EndCause.UNKNOWN  # written by a newer hpc-ddp


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
