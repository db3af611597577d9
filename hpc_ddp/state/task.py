"""Where one sweep task stands: the run verdict of :func:`~hpc_ddp.state.verdict.judge`,
coarsened to the states a sweep table ranks and resubmits by (pure).

A sweep task is a run whose job is one array task, and squeue is its only Slurm witness (sweeps
do not ask sacct), so Slurm's silence about an answered query is
:attr:`~hpc_ddp.state.verdict.Source.GONE_NO_ACCOUNTING`. The verdict's word decides, refined
by the ledger where a sweep needs to know what happens next, which the verdict leaves to its note:

- a finished ledger wins even while Slurm still winds the job down (``COMPLETING``, or a job
  that ended ``TIMEOUT`` after training finished): the task has its result;
- a ``PENDING`` task that ran before, and, without Slurm's word, an attempt that stopped for a
  requeue it asked for, are ``requeued``: both will go on by themselves;
- a ledger that says cancelled names a failure Slurm has no better word for;
- without Slurm's word, an attempt that recorded its end with no known cause is ``unknown``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from hpc_ddp.backends.jobs import JobInfo, JobState
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import END_CAUSES, EndCause
from hpc_ddp.state.verdict import Source, judge, ledger_word


class TaskState(str, Enum):
    """Where one sweep task stands."""

    PENDING = "pending"
    """Queued and never started."""
    RUNNING = "running"
    REQUEUED = "requeued"
    """Stopped on purpose (time limit, preemption, requeue) and queued to go on."""
    FINISHED = "finished"
    """Its ledger's last attempt ended ``finished``."""
    FAILED = "failed"
    """Gone from the queue without finishing (crash, budget spent, killed, never started)."""
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    """No word from Slurm and the ledger does not settle it."""


RESUBMITTABLE = frozenset({TaskState.FAILED, TaskState.CANCELLED})
"""States ``hpc-ddp sweep --resubmit-failed`` submits again."""

_RUNNING = (JobState.RUNNING, JobState.COMPLETING, JobState.CONFIGURING, JobState.SUSPENDED,
            JobState.STOPPED, JobState.SIGNALING, JobState.STAGE_OUT,
            JobState.RESIZING)  # fmt: skip
_REQUEUED = (JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED,
             JobState.SPECIAL_EXIT)  # fmt: skip
_WORDS = {
    **{s.value: TaskState.RUNNING for s in _RUNNING},
    **{s.value: TaskState.REQUEUED for s in _REQUEUED},
    JobState.PENDING.value: TaskState.PENDING,
    JobState.UNKNOWN.value: TaskState.UNKNOWN,
    "COMPLETED": TaskState.FINISHED,
    "CANCELLED": TaskState.CANCELLED,
}
"""Verdict words with a task state of their own; every other word (a finished Slurm state,
``INCOMPLETE``, ``GONE?``) means the task ended without finishing: ``failed``."""

_REQUEUE_GUESSES = frozenset(ledger_word(c) + "?" for c, m in END_CAUSES.items() if m.signalled)
"""The verdict's guesses, without Slurm's word, for attempts that stopped to be requeued."""


def task_source(live: JobInfo | None, answered: bool) -> Source:
    """Where a task's Slurm state comes from: squeue's row ``live``, else squeue ``answered``
    without it (the task has left the queue), else nowhere."""
    if live is not None:
        return Source.SQUEUE
    return Source.GONE_NO_ACCOUNTING if answered else Source.UNREACHABLE


def task_state(
    attempts: Sequence[Attempt],
    live: JobInfo | None,
    live_known: bool,
    accounted: JobState | None = None,
) -> TaskState:
    """Where a task stands, from its ledger and squeue's row (``live_known``: squeue answered).

    A finished ledger wins over anything Slurm says. Otherwise a live row decides, else
    ``accounted``, sacct's final state of a task squeue no longer holds; a task that has left
    the queue without finishing and without either failed (or was cancelled). Without squeue's
    answer the ledger's best guess is given, and ``unknown`` where it has none.
    """
    last = attempts[-1] if attempts else None
    if last is not None and last.cause is EndCause.FINISHED:
        return TaskState.FINISHED
    source = task_source(live, live_known)
    slurm = None if live is None else live.state
    if source is Source.GONE_NO_ACCOUNTING and accounted is not None and accounted.finished:
        source, slurm = Source.SACCT, accounted
    # The logs only ever change the verdict's note, never a task state: not worth reading.
    word = judge(slurm, source, attempts, _no_logs).state
    if source is Source.UNREACHABLE:
        return _from_guess(word, last)
    state = _WORDS.get(word, TaskState.FAILED)
    if state is TaskState.PENDING and (last is not None or bool(live and live.restart_count)):
        return TaskState.REQUEUED
    if state in (TaskState.FAILED, TaskState.UNKNOWN) and _cancelled(last):
        return TaskState.CANCELLED
    return state


def verdict_task_state(word: str) -> TaskState:
    """The task state for a run verdict's word (``COMPLETED``, ``RUNNING``, ``CANCELLED``,
    ``FAILED``, ...): a local sweep's point is judged as a run, then shown as a task."""
    return _WORDS.get(word, TaskState.FAILED)


def _from_guess(word: str, last: Attempt | None) -> TaskState:
    """The task state for the verdict's guess from the ledger alone (``RUNNING?``, ``X?``)."""
    if last is None:
        return TaskState.UNKNOWN
    if word == "RUNNING?":
        return TaskState.RUNNING if last.is_open else TaskState.UNKNOWN
    if word == "CANCELLED?":
        return TaskState.CANCELLED
    if word in _REQUEUE_GUESSES and last.requeue_requested:
        return TaskState.REQUEUED
    return TaskState.FAILED


def _cancelled(last: Attempt | None) -> bool:
    return last is not None and last.cause is EndCause.CANCELLED


def _no_logs() -> str | None:
    return None
