"""A sweep task's state is the run verdict ``status`` gives, coarsened: the two never disagree
on whether a task is over, and the sweep's refinements are the ledger facts the verdict leaves
to its note."""

from __future__ import annotations

import pytest

from hpc_ddp.backends.jobs import JobInfo, JobState
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.state.task import RESUBMITTABLE, TaskState, task_source, task_state
from hpc_ddp.state.verdict import Source, judge


def attempt(cause: EndCause | None, *, ended: bool = True, requeue: bool = False) -> Attempt:
    return Attempt(attempt=0, started=1.0, ended=2.0 if ended else None, cause=cause,
                   steps_done=3, checkpoint=None, nodelist="n1", job_ref="1_0",
                   resumed_from_step=None, requeue_requested=requeue)  # fmt: skip


def info(state: JobState, restarts: int = 0) -> JobInfo:
    return JobInfo("11", "10", "0", state, "", "n1", None, restarts)


LEDGERS = [
    [],
    [attempt(None, ended=False)],
    [attempt(None)],
    *([attempt(c)] for c in EndCause),
    *([attempt(c, requeue=True)] for c in EndCause),
]
LIVE = [None, *(info(s, r) for s in JobState for r in (0, 1))]


def test_the_source_is_squeue_its_silence_or_nothing() -> None:
    assert task_source(info(JobState.RUNNING), answered=False) is Source.SQUEUE
    assert task_source(None, answered=True) is Source.GONE_NO_ACCOUNTING
    assert task_source(None, answered=False) is Source.UNREACHABLE


@pytest.mark.parametrize("known", [True, False])
def test_a_task_is_live_exactly_when_its_verdict_says_slurm_still_runs_it(known: bool) -> None:
    """Pending, running and requeued tasks are those whose verdict is a live Slurm word (or
    the ledger's guess of one), unless the ledger already says finished."""
    live_words = {s.value for s in JobState if not s.finished} - {"UNKNOWN"}
    for attempts in LEDGERS:
        for live in LIVE:
            state = task_state(attempts, live, known)
            source = task_source(live, known)
            word = judge(None if live is None else live.state, source, attempts, lambda: None)
            finished = bool(attempts) and attempts[-1].cause is EndCause.FINISHED
            if finished:
                assert state is TaskState.FINISHED
            elif word.state in live_words:
                assert state in (TaskState.PENDING, TaskState.RUNNING, TaskState.REQUEUED)
            elif source is not Source.UNREACHABLE:
                assert state in (*RESUBMITTABLE, TaskState.UNKNOWN), (attempts, live, word)


def test_a_finished_ledger_wins_while_slurm_still_winds_the_job_down() -> None:
    done = [attempt(EndCause.FINISHED)]
    assert judge(JobState.COMPLETING, Source.SQUEUE, done, lambda: None).state == "COMPLETING"
    assert task_state(done, info(JobState.COMPLETING), True) is TaskState.FINISHED
    assert task_state(done, info(JobState.TIMEOUT), True) is TaskState.FINISHED


def test_a_cancelled_ledger_names_a_failure_slurm_has_no_better_word_for() -> None:
    cancelled = [attempt(EndCause.CANCELLED)]
    assert judge(JobState.TIMEOUT, Source.SQUEUE, cancelled, lambda: None).state == "TIMEOUT"
    assert task_state(cancelled, info(JobState.TIMEOUT), True) is TaskState.CANCELLED
    assert task_state(cancelled, info(JobState.UNKNOWN), True) is TaskState.CANCELLED
    assert task_state([attempt(EndCause.CRASH)], info(JobState.UNKNOWN), True) is (
        TaskState.UNKNOWN
    )


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [
        ([], TaskState.UNKNOWN),  # verdict UNKNOWN?: no attempt
        ([attempt(EndCause.UNKNOWN)], TaskState.FAILED),  # verdict UNKNOWN? too: an attempt ended
        ([attempt(None, ended=False)], TaskState.RUNNING),
        ([attempt(None)], TaskState.UNKNOWN),  # RUNNING?, but the attempt recorded an end
        ([attempt(EndCause.PREEMPTED, requeue=True)], TaskState.REQUEUED),
        ([attempt(EndCause.PREEMPTED)], TaskState.FAILED),
        ([attempt(EndCause.CANCELLED)], TaskState.CANCELLED),
    ],
)
def test_without_slurms_word_the_verdicts_guess_is_refined_by_the_ledger(
    attempts: list[Attempt], expected: TaskState
) -> None:
    assert judge(None, Source.UNREACHABLE, attempts, lambda: None).state.endswith("?")
    assert task_state(attempts, None, live_known=False) is expected


def test_a_pending_task_that_ran_before_is_requeued() -> None:
    assert task_state([], info(JobState.PENDING), True) is TaskState.PENDING
    assert task_state([], info(JobState.PENDING, restarts=1), True) is TaskState.REQUEUED
    assert task_state([attempt(EndCause.TIME_LIMIT)], info(JobState.PENDING), True) is (
        TaskState.REQUEUED
    )
