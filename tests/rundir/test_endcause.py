"""The one table of end causes: every cause has a row, and the rows say what the four sets of
causes it replaced said (``ledger.FAULT_CAUSES``, ``verdict.FAILURES``, goodput's two tuples,
the requeue policy's), pinned here as they were."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from hpc_ddp.rundir.endcause import (
    END_CAUSES,
    Bucket,
    EndCause,
    Meaning,
    RequeueRule,
    is_failure,
    is_fault,
    is_restartable,
    meaning,
)
from hpc_ddp.state.goodput import PARTS

C = EndCause


def _where(test: Callable[[Meaning], bool]) -> set[EndCause]:
    return {c for c in EndCause if test(meaning(c))}


def test_every_cause_has_exactly_one_row() -> None:
    assert list(END_CAUSES) == list(EndCause)
    with pytest.raises(TypeError):
        END_CAUSES[C.CRASH] = meaning(C.FINISHED)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        meaning(C.CRASH).fault = False  # type: ignore[misc]


def test_the_restartable_causes_are_the_old_ledger_fault_causes() -> None:
    # ledger.FAULT_CAUSES: what the supervisor restarts in the allocation, and a crash loop counts.
    assert _where(lambda m: m.restartable) == {C.CRASH, C.HANG, C.NODE_FAIL}
    assert {c for c in EndCause if is_restartable(c)} == {C.CRASH, C.HANG, C.NODE_FAIL}


def test_the_faults_are_the_ledgers_and_goodputs_faults() -> None:
    # ledger: FAULT_CAUSES or no_progress; goodput: (hang, node_fail, crash, no_progress).
    old = {C.HANG, C.NODE_FAIL, C.CRASH, C.NO_PROGRESS}
    assert {c for c in EndCause if is_fault(c)} == old
    assert _where(lambda m: m.goodput is not Bucket.PRODUCTIVE) == old


def test_the_failures_are_the_old_verdict_failures() -> None:
    assert {c for c in EndCause if is_failure(c)} == {
        C.CRASH,
        C.HANG,
        C.NODE_FAIL,
        C.NO_PROGRESS,
    }


def test_the_goodput_buckets_are_goodputs_old_tuples() -> None:
    # goodput: a hang undetected only for (hang, node_fail); the other faults' tail is recovery.
    assert _where(lambda m: m.goodput is Bucket.HANG_UNDETECTED) == {C.HANG, C.NODE_FAIL}
    assert _where(lambda m: m.goodput is Bucket.RECOVERY) == {C.CRASH, C.NO_PROGRESS}
    assert {b.value for b in Bucket} <= {name for name, _ in PARTS}


def test_the_requeue_rules_are_the_old_requeue_policy() -> None:
    # decide_requeue: (crash, hang) only with requeue.on_crash; these fell through to the budget.
    assert _where(lambda m: m.requeue is RequeueRule.ON_CRASH) == {C.CRASH, C.HANG}
    assert _where(lambda m: m.requeue is RequeueRule.WITHIN_BUDGET) == {
        C.TIME_LIMIT,
        C.PREEMPTED,
        C.MANUAL_REQUEUE,
        C.NODE_FAIL,
    }


def test_the_signalled_causes_are_the_sweep_tasks_old_requeue_guesses() -> None:
    assert _where(lambda m: m.signalled) == {C.TIME_LIMIT, C.PREEMPTED, C.MANUAL_REQUEUE}


@pytest.mark.parametrize("cause", list(EndCause), ids=[c.value for c in EndCause])
def test_the_status_word_is_the_old_ledger_word(cause: EndCause) -> None:
    old = {"crash": "FAILED", "hang": "FAILED", "no_progress": "FAILED", "cancelled": "CANCELLED"}
    assert meaning(cause).status == old.get(cause.value, cause.value.upper())


def test_no_cause_recorded_is_nothing_yet() -> None:
    assert (is_fault(None), is_restartable(None), is_failure(None)) == (False, False, False)
