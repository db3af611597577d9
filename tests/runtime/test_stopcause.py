"""classify_stop: the table of what a task sees when told to stop (observed on Slurm 22.05)."""

from __future__ import annotations

import signal

import pytest

from hpc_ddp.runtime.ledger import EndCause
from hpc_ddp.runtime.stopcause import classify_stop, classify_unanswered_stop, signal_number

USR2, TERM = int(signal.SIGUSR2), int(signal.SIGTERM)


def job(state: str, restarts: int, preempt: str = "None") -> dict[str, str]:
    return {"JobState": state, "Restarts": str(restarts), "PreemptTime": preempt}


@pytest.mark.parametrize(
    ("signum", "restart_count", "fields", "cause", "requeue"),
    [
        # --signal=USR2@lead before the time limit (or scancel --signal=USR2)
        (USR2, 0, job("RUNNING", 0), EndCause.TIME_LIMIT, True),
        (USR2, 3, job("RUNNING", 3), EndCause.TIME_LIMIT, True),
        # preemption with grace time: USR2 first, job still running, PreemptTime set
        (USR2, 0, job("RUNNING", 0, "2026-11-22T07:53:04"), EndCause.PREEMPTED, True),
        # preemption after grace: Slurm already counted the restart
        (TERM, 0, job("COMPLETING", 1, "2026-11-22T07:53:04"), EndCause.PREEMPTED, False),
        # scontrol requeue: Slurm already counted the restart, no preempt time
        (TERM, 0, job("COMPLETING", 1), EndCause.MANUAL_REQUEUE, False),
        (TERM, 2, job("COMPLETING", 3), EndCause.MANUAL_REQUEUE, False),
        # scancel: completing without a new restart -> never requeue
        (TERM, 0, job("COMPLETING", 0), EndCause.CANCELLED, False),
        (TERM, 1, job("CANCELLED", 1), EndCause.CANCELLED, False),
        # SIGTERM sent by hand to a running job: come back
        (TERM, 0, job("RUNNING", 0), EndCause.MANUAL_REQUEUE, True),
    ],
)
def test_classify_stop(
    signum: int, restart_count: int, fields: dict[str, str], cause: EndCause, requeue: bool
) -> None:
    verdict = classify_stop(signum, requeue_signum=USR2, restart_count=restart_count, job=fields)
    assert (verdict.cause, verdict.request_requeue) == (cause, requeue)
    assert verdict.explanation


def test_without_slurm_the_requeue_signal_asks_to_come_back_and_term_is_a_cancel() -> None:
    v = classify_stop(USR2, requeue_signum=USR2, restart_count=0, job=None)
    assert (v.cause, v.request_requeue) == (EndCause.TIME_LIMIT, True)
    v = classify_stop(TERM, requeue_signum=USR2, restart_count=0, job=None)
    assert (v.cause, v.request_requeue) == (EndCause.CANCELLED, False)
    assert "SIGTERM outside Slurm" in v.explanation


def test_when_slurm_cannot_be_asked_nothing_is_taken_for_a_requeue_under_way() -> None:
    """Inside a Slurm job whose state could not be read: the requeue signal still asks for a
    requeue (Slurm sends it only to a running job); SIGTERM asks for none and is not called a
    requeue by Slurm (it may be one, or a cancel: unknown)."""
    why = "scontrol show job failed (exit 1). Slurm said: Unable to contact slurm controller"
    v = classify_unanswered_stop(USR2, requeue_signum=USR2, error=why)
    assert (v.cause, v.request_requeue, v.slurm_answered) == (EndCause.TIME_LIMIT, True, False)
    assert why in v.explanation
    v = classify_unanswered_stop(TERM, requeue_signum=USR2, error=why)
    assert (v.cause, v.request_requeue, v.slurm_answered) == (EndCause.UNKNOWN, False, False)
    assert v.cause not in (EndCause.MANUAL_REQUEUE, EndCause.PREEMPTED)
    assert "SIGTERM" in v.explanation
    assert why in v.explanation
    # A custom requeue signal is the one that asks.
    v = classify_unanswered_stop(USR2, requeue_signum=int(signal.SIGUSR1), error=why)
    assert (v.cause, v.request_requeue) == (EndCause.UNKNOWN, False)


def test_slurms_answer_counts_as_answered() -> None:
    v = classify_stop(USR2, requeue_signum=USR2, restart_count=0, job=job("RUNNING", 0))
    assert v.slurm_answered


def test_missing_restarts_field_is_not_mistaken_for_a_requeue() -> None:
    v = classify_stop(USR2, requeue_signum=USR2, restart_count=0, job={"JobState": "RUNNING"})
    assert v.request_requeue


@pytest.mark.parametrize(("name", "num"), [("USR2", USR2), ("SIGUSR2", USR2), ("term", TERM)])
def test_signal_number(name: str, num: int) -> None:
    assert signal_number(name) == num
