"""The requeue decision: why a stop came, whether another attempt follows, and the words of
its failure paths.

Why (:func:`classify_stop`, pure). What a task sees when a stop signal arrives (observed on
Slurm 22.05, ``scontrol show job``):

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

Whether (:func:`decide_requeue`, pure): time limits, preemptions and manual requeues go on
within ``requeue.max_requeues``; crashes only with ``requeue.on_crash``.

Acting on them is the attempt recorder's (:class:`hpc_ddp.fault.coordinator.Coordinator`). Pure.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from hpc_ddp.backends.allocation import JobStanding
from hpc_ddp.errors import BackendError
from hpc_ddp.rundir.endcause import EndCause, RequeueRule, meaning


@dataclass(frozen=True)
class StopVerdict:
    """The cause of a stop and what to do about it."""

    cause: EndCause
    request_requeue: bool
    """True when this job must ask Slurm to requeue it (Slurm is not doing so already)."""
    explanation: str
    slurm_answered: bool = True
    """False when ``scontrol show job`` failed: the verdict rests on the signal alone."""


def classify_stop(
    signum: int,
    *,
    requeue_signum: int,
    restart_count: int,
    job: JobStanding | None,
    lost_nodes: Sequence[str] = (),
) -> StopVerdict:
    """Classify a stop from the agreed signal and Slurm's view of the job.

    ``job`` is what ``scontrol show job`` says of it, None outside Slurm (inside a Slurm
    job whose state could not be read, use :func:`classify_unanswered_stop`);
    ``restart_count`` is this attempt's ``SLURM_RESTART_COUNT``; ``lost_nodes`` are the job's
    nodes Slurm holds down or not responding: a requeue Slurm started by itself then is its
    answer to a node failure (``scontrol show job`` keeps no reason for it), not a person's.
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
    state, preempting, restarts = job.state, job.preempting, job.restarts
    if restarts is not None and restarts > restart_count:
        if not preempting and lost_nodes:
            lost = ",".join(lost_nodes)
            return StopVerdict(
                EndCause.NODE_FAIL,
                False,
                f"Slurm is requeueing the job after node {lost} failed ({state})",
            )
        cause = EndCause.PREEMPTED if preempting else EndCause.MANUAL_REQUEUE
        return StopVerdict(cause, False, f"Slurm is already requeueing the job ({state})")
    if job.running:
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


@dataclass(frozen=True)
class RequeueDecision:
    """Whether the run goes on in a new attempt, and why (for the ledger and the log)."""

    requeue: bool
    reason: str


_NOT_REQUEUED = {
    EndCause.FINISHED: "finished: nothing left to do",
    EndCause.CANCELLED: "cancelled: a cancelled job is not brought back",
    EndCause.REQUEUE_FAILED: "the requeue request failed: nothing brings the job back",
    EndCause.UNKNOWN: "stopped for an unknown reason: not requeued",
    EndCause.NO_PROGRESS: "no progress: a crash loop is not requeued",
}
"""Why an attempt that ended so is never requeued (the table's ``requeue: never``; the
budget's own words say why for ``budget_exhausted``)."""


def decide_requeue(
    cause: EndCause,
    attempts_so_far: int,
    max_requeues: int,
    on_crash: bool,
    run_dir: str = "RUN_DIR",
    *,
    own_snapshots: bool = False,
) -> RequeueDecision:
    """Decide whether an attempt that ended with ``cause`` is followed by another.

    ``attempts_so_far`` is the number of requeues already spent (this attempt's
    ``SLURM_RESTART_COUNT``). Each cause's ``requeue`` in
    :data:`~hpc_ddp.rundir.endcause.END_CAUSES` says which go on: time limits, preemptions,
    manual requeues and lost nodes while fewer than ``max_requeues`` were spent; a crash or a
    hang too, only with ``on_crash``; a finished, cancelled, failed-to-requeue or unexplained
    stop never. ``run_dir`` is named in the hints (``hpc-ddp resume RUN_DIR``);
    ``own_snapshots``: a ``command`` program without a session, which hpc-ddp saves nothing
    for (the hints say what really goes on: its own snapshot, if it keeps one).
    """
    goes_on = (
        "the program starts again, and goes on from its own snapshot if it keeps one "
        "(hpc-ddp saves nothing for a program without a session)."
        if own_snapshots
        else "the run resumes from its last checkpoint."
    )
    rule = meaning(cause).requeue
    if rule is RequeueRule.NEVER and cause is not EndCause.BUDGET_EXHAUSTED:
        return RequeueDecision(False, _NOT_REQUEUED.get(cause, f"{cause.value}: not requeued"))
    if rule is RequeueRule.ON_CRASH and not on_crash:
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
            f"{run_dir} requeue.max_requeues={max(2 * max_requeues, max_requeues + 5)}`; "
            f"{goes_on}",
        )
    return RequeueDecision(
        True,
        f"{cause.value}: requeue {attempts_so_far + 1} of {max_requeues} (requeue.max_requeues)",
    )


def requeue_failed_message(
    ref: str | None,
    verdict: StopVerdict,
    error: str,
    step: int | None,
    checkpoint: str | None,
    code: int,
    run_dir: str,
) -> str:
    """A requeue was needed and could not be had: the job ends FAILED (its tasks exit ``code``)."""
    why = verdict.explanation if verdict.slurm_answered else "Slurm could not be asked either"
    return (
        f"could not requeue job {ref} after {verdict.cause.value} ({why}): "
        f"{error}. The job will not come back by itself: its tasks exit "
        f"{code}, so Slurm records it FAILED. {_kept(step, checkpoint)} "
        "HINT: let the job reach Slurm (scontrol on PATH inside the container, munged's "
        f"socket, SLURM_CONF), and run `scontrol requeue {ref}` where Slurm's commands "
        "work: the run resumes from that checkpoint. Slurm forgets a finished job after "
        f"MinJobAge; then, or any time, `hpc-ddp resume {run_dir}` goes on from it as a new job."
    )


def unconfirmed_message(
    ref: str | None,
    verdict: StopVerdict,
    step: int | None,
    checkpoint: str | None,
    code: int,
    run_dir: str,
) -> str:
    """A stop Slurm could not be asked about, and no requeue asked for (tasks exit ``code``)."""
    return (
        f"{verdict.cause.value}: {verdict.explanation}. The tasks exit "
        f"{code}: the job ends FAILED unless Slurm requeues or cancels "
        f"it. {_kept(step, checkpoint)} HINT: if the job does not come back (`hpc-ddp "
        f"status`), run `scontrol requeue {ref}` where Slurm's commands work, or "
        f"`hpc-ddp resume {run_dir}` (also once Slurm has forgotten the job, after MinJobAge); "
        "and let the job reach Slurm (scontrol on PATH inside the container, munged's socket, "
        "SLURM_CONF)."
    )


def outside_slurm_message(run_dir: str) -> str:
    """Why a stop or crash that Slurm would requeue is not followed by another attempt here."""
    return (
        "not a Slurm job, so no requeue is possible: nothing starts the run again by itself. "
        f"HINT: `hpc-ddp resume {run_dir}` goes on from the newest checkpoint."
    )


def backend_failure_summary(exc: BackendError) -> str:
    """A scheduler's failure on one line for the ledger: what failed and what it said, no hint."""
    text = str(exc).split("HINT:", 1)[0]
    lines = (line.strip().rstrip(".") for line in text.splitlines())
    return "; ".join(line for line in lines if line and not line.startswith("command:"))


def _kept(step: int | None, checkpoint: str | None) -> str:
    if step is None:
        return "The program has no session: a new attempt resumes from whatever it saved itself."
    if checkpoint is None:
        return (
            f"No checkpoint was saved at step {step} (session.restore() named nothing to save): "
            "a new attempt starts from the beginning."
        )
    return f"The checkpoint at step {step} ({checkpoint}) is kept."
