"""classify_stop: the table of what a task sees when told to stop (observed on Slurm 22.05)."""

from __future__ import annotations

import signal

import pytest

from hpc_ddp.ledger import EndCause
from hpc_ddp.preemption import classify_stop, signal_number

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


def test_without_slurm_the_requeue_signal_still_asks_to_come_back() -> None:
    v = classify_stop(USR2, requeue_signum=USR2, restart_count=0, job=None)
    assert (v.cause, v.request_requeue) == (EndCause.TIME_LIMIT, True)
    v = classify_stop(TERM, requeue_signum=USR2, restart_count=0, job=None)
    assert (v.cause, v.request_requeue) == (EndCause.UNKNOWN, False)


def test_missing_restarts_field_is_not_mistaken_for_a_requeue() -> None:
    v = classify_stop(USR2, requeue_signum=USR2, restart_count=0, job={"JobState": "RUNNING"})
    assert v.request_requeue


@pytest.mark.parametrize(("name", "num"), [("USR2", USR2), ("SIGUSR2", USR2), ("term", TERM)])
def test_signal_number(name: str, num: int) -> None:
    assert signal_number(name) == num
