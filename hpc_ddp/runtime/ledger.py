"""The attempt ledger: ``RUN_DIR/ledger.jsonl``, one JSON line per attempt event. Pure.

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

This module is the ledger's format: the events (:func:`start_event`, :func:`end_event`, each one
JSON line), what they fold into (:class:`Attempt`, :class:`EndCause`) and reading them back
(:func:`read_ledger`). It writes nothing: the requeue coordinator appends each line with
:func:`hpc_ddp.durable.append_line` (one ``write`` of one whole line to a file opened
``O_APPEND``, then fsynced), so the login side (``status``, ``results``) imports the same
module without torch. A crash can still leave a torn last line; readers skip any line that does
not parse, and writers start on a fresh line after one. An attempt with a start and no end is
still running, or died without a word (SIGKILL, node failure): :func:`read_ledger` reports it
with ``ended=None``. An end with no start is an attempt that failed before rank 0 wrote its
start (every rank records its own crash): it is reported as an attempt that started when it
ended. Why a stop came and whether another attempt follows is the requeue coordinator's to say
(:mod:`hpc_ddp.runtime.requeue`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from hpc_ddp.errors import RunDirError

log = logging.getLogger(__name__)


class EndCause(str, Enum):
    """Why an attempt ended.

    Only ``time_limit``, ``preempted`` and ``manual_requeue`` are followed by another attempt
    (when ``requeue_requested`` is true, or Slurm was requeueing the job itself). The run is
    over, unfinished, after ``crash``, ``budget_exhausted``, ``requeue_failed`` (a requeue was
    needed and ``scontrol requeue`` failed: the job ends FAILED with the checkpoint kept) and
    ``cancelled``; after ``unknown`` it is over unless Slurm itself brings the job back.
    """

    FINISHED = "finished"
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"
    MANUAL_REQUEUE = "manual_requeue"
    CRASH = "crash"
    BUDGET_EXHAUSTED = "budget_exhausted"
    REQUEUE_FAILED = "requeue_failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Attempt:
    """One attempt folded from its ledger events."""

    attempt: int
    """``SLURM_RESTART_COUNT`` of the attempt (0 for the first)."""
    started: float
    ended: float | None
    """``None``: still running, or died without writing its end (killed, node lost)."""
    cause: EndCause | None
    steps_done: int | None
    """Global optimizer step reached when it ended."""
    checkpoint: str | None
    """The last checkpoint known: the one saved at the end, else the one resumed from."""
    nodelist: str
    job_ref: str | None
    resumed_from_step: int | None
    job_id: str | None = None
    world_size: int | None = None
    resumed_from: str | None = None
    """The checkpoint this attempt started from."""
    requeue_requested: bool | None = None
    message: str | None = None

    @property
    def is_open(self) -> bool:
        """True while no end has been recorded."""
        return self.ended is None

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end (None while open)."""
        return None if self.ended is None else self.ended - self.started


def start_event(
    *,
    attempt: int,
    job_id: str | None,
    job_ref: str | None,
    nodelist: str,
    world_size: int,
    resumed_from_step: int | None,
    checkpoint: str | None,
    now: float | None = None,
) -> str:
    """The ``attempt_start`` line of an attempt (rank 0 appends it)."""
    return _line(
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
        }
    )


def end_event(
    *,
    attempt: int,
    cause: EndCause,
    steps_done: int | None,
    checkpoint: str | None,
    requeue_requested: bool,
    message: str = "",
    now: float | None = None,
) -> str:
    """The ``attempt_end`` line of an attempt."""
    return _line(
        {
            "event": "attempt_end",
            "attempt": attempt,
            "time": time.time() if now is None else now,
            "cause": EndCause(cause).value,
            "steps_done": steps_done,
            "checkpoint": checkpoint,
            "requeue_requested": requeue_requested,
            "message": message,
        }
    )


def _line(event: dict[str, Any]) -> str:
    return json.dumps(event, sort_keys=True) + "\n"


def read_ledger(path: Path, *, since: float | None = None) -> list[Attempt]:
    """The attempts recorded in ``path``, in the order they started; [] if there is no file.

    Lines that do not parse (a torn last line) or are not ledger events are skipped, never fatal,
    and so is an event whose attempt number or time is not a sane number (negative, not finite,
    out of any clock's range); an optional number that is not (a negative step, a world size of
    0) is read as unknown. A ledger that cannot be read at all (a directory in its place, no
    permission) is a :class:`~hpc_ddp.errors.RunDirError` with a hint, not a traceback.

    A second start of the same attempt number (the same step relaunched) opens a new entry; an
    end closes the latest open entry of its attempt. An end with no open entry is the end of an
    attempt that failed before rank 0 recorded its start (a model that cannot be built, a bad
    checkpoint): it becomes an attempt of its own, started when it ended, unless the attempt
    has ended already (every rank of a crashed attempt writes its end; the first written wins).
    ``since``: when the run's current job was submitted (its manifest's ``submitted_at``), to
    tell the ends of a resumed run's new job, whose attempts count from 0 again, from old ones;
    only for runs whose old processes had all ended by then (the local backend's).
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
            _fold(attempts, event, since)
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            log.warning("%s:%d: skipping an unreadable ledger line (%s)", path, number, exc)
    return attempts


def _fold(attempts: list[Attempt], event: Any, since: float | None) -> None:
    kind = event["event"]
    if kind == "attempt_start":
        checkpoint = _opt_str(event.get("checkpoint"))
        attempts.append(
            Attempt(
                attempt=_count(event["attempt"], "attempt"),
                started=_time(event["time"]),
                ended=None,
                cause=None,
                steps_done=None,
                checkpoint=checkpoint,
                nodelist=str(event.get("nodelist") or ""),
                job_ref=_opt_str(event.get("job_ref")),
                resumed_from_step=_opt_count(event.get("resumed_from_step"), "resumed_from_step"),
                job_id=_opt_str(event.get("job_id")),
                world_size=_opt_count(event.get("world_size"), "world_size", low=1),
                resumed_from=checkpoint,
            )
        )
    elif kind == "attempt_end":
        _fold_end(attempts, event, since)
    else:
        raise ValueError(f"unknown event {kind!r}")


def _fold_end(attempts: list[Attempt], event: Any, since: float | None) -> None:
    number = _count(event["attempt"], "attempt")
    ended = _time(event["time"])
    cause = _cause(event.get("cause"))
    steps = _opt_count(event.get("steps_done"), "steps_done")
    checkpoint = _opt_str(event.get("checkpoint"))
    requested = bool(event.get("requeue_requested"))
    message = _opt_str(event.get("message"))
    for index in range(len(attempts) - 1, -1, -1):
        entry = attempts[index]
        if entry.attempt == number and entry.is_open:
            attempts[index] = replace(
                entry,
                ended=ended,
                cause=cause,
                steps_done=steps,
                checkpoint=checkpoint or entry.checkpoint,
                requeue_requested=requested,
                message=message,
            )
            return
    if not _starts_an_attempt(attempts, number, ended, since):
        return  # a peer's late word on an attempt already ended: the first end wins
    attempts.append(
        Attempt(
            attempt=number,
            started=ended,  # never recorded: it failed before its start was written
            ended=ended,
            cause=cause,
            steps_done=steps,
            checkpoint=checkpoint,
            nodelist="",
            job_ref=None,
            resumed_from_step=None,
            requeue_requested=requested,
            message=message,
        )
    )


def _starts_an_attempt(
    attempts: list[Attempt], number: int, ended: float, since: float | None
) -> bool:
    """Whether an end with no open entry is an attempt of its own (one that failed before its
    start was written), not a repeat of an end already recorded for the attempt.

    Every rank of a crashed attempt writes its end, so an end after an ended entry of the same
    number is normally such a repeat. Attempt numbers start again at 0 in a resumed run's new
    job, though: with ``since`` (when the run's current job was submitted), an end from that
    job after an entry that ended before it is the new job's own.
    """
    earlier = [a for a in attempts if a.attempt == number]
    if not earlier:
        return True
    last_end = earlier[-1].ended
    return since is not None and ended >= since and last_end is not None and last_end < since


_LATEST_TIME = 253402300799.0
"""9999-12-31T23:59:59Z: the latest time every platform's clock functions can show."""
_LARGEST_COUNT = (1 << 63) - 1


def _time(value: Any) -> float:
    """A ledger time (seconds since the epoch); ValueError unless finite and in 0..9999 AD."""
    if isinstance(value, bool):
        raise ValueError(f"time {value!r} is not a number")
    t = float(value)
    if not (math.isfinite(t) and 0.0 <= t <= _LATEST_TIME):
        raise ValueError(f"time {value!r} is out of range")
    return t


def _count(value: Any, name: str, low: int = 0) -> int:
    """A whole number of at least ``low`` (an attempt, a step); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} {value!r} is not a whole number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} {value!r} is not a whole number")
    number = int(value)
    if not low <= number <= _LARGEST_COUNT:
        raise ValueError(f"{name} {number} is out of range")
    return number


def _opt_count(value: Any, name: str, low: int = 0) -> int | None:
    """:func:`_count` for an optional field: None when absent, or (with a warning) when not a
    sane number, so one bad field never hides the rest of its event."""
    if value is None:
        return None
    try:
        return _count(value, name, low)
    except (ValueError, OverflowError) as exc:
        log.warning("ledger: %s; read as unknown", exc)
        return None


def _cause(value: Any) -> EndCause:
    try:
        return EndCause(value)
    except ValueError:
        return EndCause.UNKNOWN  # written by a newer hpc-ddp


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
