"""What an attempt of a run is and how it ended: pure types shared by the runtime and ``status``.

:class:`EndCause` and :class:`Attempt` are what :mod:`hpc_ddp.runtime.ledger` writes and folds
``RUN_DIR/ledger.jsonl`` into, and what :mod:`hpc_ddp.state` judges a run by;
:func:`decide_requeue` says whether an attempt that ended with a given cause is followed by
another. No file I/O, no environment, no torch: the login side imports this module to read a
run, and the ledger (which does the I/O) re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Attempt", "EndCause", "RequeueDecision", "decide_requeue"]


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


@dataclass(frozen=True)
class RequeueDecision:
    """Whether the run goes on in a new attempt, and why (for the ledger and the log)."""

    requeue: bool
    reason: str


def decide_requeue(
    cause: EndCause,
    attempts_so_far: int,
    max_requeues: int,
    on_crash: bool,
    run_dir: str = "RUN_DIR",
) -> RequeueDecision:
    """Decide whether an attempt that ended with ``cause`` is followed by another.

    ``attempts_so_far`` is the number of requeues already spent (this attempt's
    ``SLURM_RESTART_COUNT``). Time limits, preemptions and manual requeues go on while fewer
    than ``max_requeues`` were spent; a crash too, only with ``on_crash``; a finished,
    cancelled, failed-to-requeue or unexplained stop never. ``run_dir`` is named in the hints
    (``hpc-ddp resume RUN_DIR``).
    """
    if cause is EndCause.FINISHED:
        return RequeueDecision(False, "finished: nothing left to do")
    if cause is EndCause.CANCELLED:
        return RequeueDecision(False, "cancelled: a cancelled job is not brought back")
    if cause is EndCause.REQUEUE_FAILED:
        return RequeueDecision(False, "the requeue request failed: nothing brings the job back")
    if cause is EndCause.UNKNOWN:
        return RequeueDecision(False, "stopped for an unknown reason: not requeued")
    if cause is EndCause.CRASH and not on_crash:
        return RequeueDecision(
            False,
            "crashed: not requeued (a crash is not a preemption). HINT: fix the error in the "
            f"rank logs, then `hpc-ddp resume {run_dir}` goes on from the newest checkpoint; "
            "or set requeue.on_crash=true to retry crashes.",
        )
    if cause is EndCause.BUDGET_EXHAUSTED or attempts_so_far >= max_requeues:
        return RequeueDecision(
            False,
            f"requeue budget exhausted: {attempts_so_far} of requeue.max_requeues="
            f"{max_requeues} requeues used. HINT: go on with a larger budget: `hpc-ddp resume "
            f"{run_dir} requeue.max_requeues={max(2 * max_requeues, max_requeues + 5)}`; the run "
            "resumes from its last checkpoint.",
        )
    return RequeueDecision(
        True,
        f"{cause.value}: requeue {attempts_so_far + 1} of {max_requeues} (requeue.max_requeues)",
    )
