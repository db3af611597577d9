"""Why a job was told to stop, and whether hpc-ddp must ask Slurm to requeue it. Pure.

What a task sees when a stop signal arrives (observed on Slurm 22.05, ``scontrol show job``):

============================  ========  ==========  =========  =============================
how the stop came             signal    JobState    Restarts   PreemptTime
============================  ========  ==========  =========  =============================
``--signal`` before timeout   USR2      RUNNING     unchanged  None
preemption, grace time > 0    USR2      RUNNING     unchanged  set   (then TERM after grace)
preemption, after grace       TERM      COMPLETING  +1         set
``scontrol requeue``          TERM      COMPLETING  +1         None
``scancel``                   TERM      COMPLETING  unchanged  None
============================  ========  ==========  =========  =============================

So: when Slurm has already counted a restart it is requeueing the job itself and a second
request would be wrong; a job that is COMPLETING without a new restart was cancelled and must
never be brought back; a job still RUNNING is ours to requeue (also under preemption with grace
time: if it ended before the grace ran out, Slurm would record it COMPLETED and not requeue).

When Slurm cannot be asked (``scontrol`` missing, as inside many containers, no munge socket,
or a controller that does not answer), nothing above can be read, and hpc-ddp never guesses that
Slurm is requeueing the job (:func:`classify_unanswered_stop`):

* the requeue signal is still ours to act on: Slurm sends it only while the job runs (the
  time-limit warning, the start of a preemption's grace time), never as part of a requeue of
  its own, so the requeue is requested; if that request fails too, the attempt ends
  ``requeue_failed`` and the tasks exit non-zero, so Slurm records the job FAILED;
* SIGTERM may be Slurm requeueing the job, cancelling it or ending it at its time limit. A
  requeue request would be wrong in all three (a second requeue is counted twice; a cancelled
  job must never come back), so none is made; the attempt ends ``unknown`` and the tasks exit
  non-zero. A job Slurm requeues or cancels does so whatever the tasks' exit status (observed on
  22.05); one that nobody brings back then ends FAILED, never COMPLETED with training unfinished.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass

from hpc_ddp.runtime.attempt import EndCause

_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})


@dataclass(frozen=True)
class StopVerdict:
    """The cause of a stop and what to do about it."""

    cause: EndCause
    request_requeue: bool
    """True when this job must ask Slurm to requeue it (Slurm is not doing so already)."""
    explanation: str
    slurm_answered: bool = True
    """False when ``scontrol show job`` failed: the verdict rests on the signal alone."""


def _restarts(job: Mapping[str, str]) -> int | None:
    try:
        return int(job["Restarts"])
    except (KeyError, ValueError):
        return None


def classify_stop(
    signum: int,
    *,
    requeue_signum: int,
    restart_count: int,
    job: Mapping[str, str] | None,
) -> StopVerdict:
    """Classify a stop from the agreed signal and Slurm's view of the job.

    ``job`` is ``scontrol show job -o`` parsed into fields, None outside Slurm (inside a Slurm
    job whose state could not be read, use :func:`classify_unanswered_stop`);
    ``restart_count`` is this attempt's ``SLURM_RESTART_COUNT``.
    """
    if job is None:
        # No Slurm job: a local run or plain torchrun. The requeue signal still means "save
        # and come back" (the caller cannot requeue, so the run stops). Any other signal came
        # from a person (`hpc-ddp cancel`, Ctrl-C, kill) and nothing will bring the run back:
        # that is a cancel, and the ledger and `status` should say so rather than "unknown".
        if signum == requeue_signum:
            return StopVerdict(EndCause.TIME_LIMIT, True, "requeue signal, job state unknown")
        return StopVerdict(
            EndCause.CANCELLED, False, f"{_name(signum)} outside Slurm: cancelled by a person"
        )
    state = job.get("JobState", "UNKNOWN")
    preempting = job.get("PreemptTime", "None") not in ("None", "", "Unknown")
    restarts = _restarts(job)
    if restarts is not None and restarts > restart_count:
        cause = EndCause.PREEMPTED if preempting else EndCause.MANUAL_REQUEUE
        return StopVerdict(cause, False, f"Slurm is already requeueing the job ({state})")
    if state in _RUNNING_STATES:
        if preempting:
            return StopVerdict(
                EndCause.PREEMPTED, True, "preemption announced; requeueing before grace ends"
            )
        if signum == requeue_signum:
            return StopVerdict(EndCause.TIME_LIMIT, True, "time-limit warning signal")
        return StopVerdict(
            EndCause.MANUAL_REQUEUE, True, f"{_name(signum)} while the job is still running"
        )
    return StopVerdict(EndCause.CANCELLED, False, f"job is {state} without a requeue: cancelled")


def classify_unanswered_stop(signum: int, *, requeue_signum: int, error: str) -> StopVerdict:
    """Classify a stop inside a Slurm job whose state could not be read (see the module docstring).

    ``error`` says why ``scontrol show job`` failed; it goes into the explanation.
    """
    if signum == requeue_signum:
        return StopVerdict(
            EndCause.TIME_LIMIT,
            True,
            f"requeue signal {_name(signum)} while Slurm could not be asked about the job "
            f"({error}); Slurm sends it only to a running job",
            slurm_answered=False,
        )
    return StopVerdict(
        EndCause.UNKNOWN,
        False,
        f"{_name(signum)} while Slurm could not be asked about the job ({error}): Slurm may be "
        "requeueing, cancelling or ending it, so no requeue is requested",
        slurm_answered=False,
    )


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def signal_number(name: str) -> int:
    """``USR2`` or ``SIGUSR2`` -> its number."""
    key = name.upper()
    return int(signal.Signals[key if key.startswith("SIG") else f"SIG{key}"])
