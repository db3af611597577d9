"""The supervisor's plan (pure): restart, requeue or stop; crash loops; which nodes go.

The supervisor itself runs on the real dev cluster in tests/fault/test_faults_e2e.py; here its
decisions are pinned case by case.
"""

from __future__ import annotations

import dataclasses

import pytest

from hpc_ddp.config.model import FaultConfig, RequeueConfig
from hpc_ddp.exitcodes import (
    BUDGET_EXIT_CODE,
    NO_PROGRESS_EXIT_CODE,
    NOT_CURRENT_EXIT_CODE,
    REQUEUE_EXIT_CODE,
)
from hpc_ddp.fault.blame import FaultRecord, Finding
from hpc_ddp.fault.plan import (
    Budget,
    Requeue,
    Restart,
    Stop,
    decide_next,
    decide_refused,
    ended_on_purpose,
    exclusion,
    likely_exclusion,
    no_progress_streak,
    recorded_cause,
    started_from,
    with_own_words,
)
from hpc_ddp.rundir.attempt import Attempt, Blame
from hpc_ddp.rundir.endcause import EndCause

RUN = "/runs/r"


def launch(
    n: int,
    cause: EndCause,
    *,
    from_step: int | None = 140,
    checkpoint_step: int | None = 140,
    steps: int = 150,
    nxt: str | None = "restart",
) -> Attempt:
    return Attempt(
        attempt=n, started=float(n), ended=n + 0.5, cause=cause, steps_done=steps,
        checkpoint=None, nodelist="n[1-2]", job_ref="42", resumed_from_step=from_step,
        job_id="42", restart=0, launch=n, from_step=from_step, checkpoint_step=checkpoint_step,
        blame=Blame((1,), ("n2",), "RuntimeError: injected crash at step 150"), next=nxt,
    )  # fmt: skip


def finding(cause: EndCause = EndCause.CRASH, *, node_level: bool = False) -> Finding:
    return Finding(cause, Blame((1,), ("n2",), "boom", node_level))


def budget(**fault: object) -> Budget:
    return Budget(
        dataclasses.replace(FaultConfig(), **fault),  # type: ignore[arg-type]
        RequeueConfig(max_requeues=2),
        restart_count=0,
        scheduled=True,
    )


def test_a_crash_is_restarted_in_the_allocation_within_the_budget() -> None:
    nxt = decide_next(
        finding(), [launch(0, EndCause.CRASH, nxt=None)], healthy=2, needed=2, bad=[],
        budget=budget(), run_dir=RUN,
    )  # fmt: skip
    assert isinstance(nxt, Restart)
    assert "restart 1 of 3 (fault.max_restarts)" in nxt.message


def test_a_crash_loop_stops_with_no_progress_naming_the_error_step_and_the_way_on() -> None:
    history = [launch(0, EndCause.CRASH), launch(1, EndCause.CRASH, nxt=None)]
    nxt = decide_next(finding(), history, healthy=2, needed=2, bad=[], budget=budget(), run_dir=RUN)
    assert isinstance(nxt, Stop)
    assert (nxt.cause, nxt.exit_code) == (EndCause.NO_PROGRESS, NO_PROGRESS_EXIT_CODE)
    assert "2 launches in a row died at step 150 without a checkpoint newer than step 140" in (
        nxt.message
    )
    assert "rank 1 on n2: RuntimeError: injected crash at step 150" in nxt.message
    assert f"`hpc-ddp resume {RUN}` goes on from step 140" in nxt.message
    assert "HINT: fix the error (logs/rank-1.err)" in nxt.message
    # The limit is the config's; 0 never stops for it.
    assert isinstance(
        decide_next(finding(), history, healthy=2, needed=2, bad=[],
                    budget=budget(no_progress_limit=0), run_dir=RUN), Restart,
    )  # fmt: skip


def test_a_launch_that_saved_a_newer_checkpoint_breaks_the_streak() -> None:
    moved = launch(0, EndCause.CRASH, from_step=100, checkpoint_step=140)
    assert no_progress_streak([moved, launch(1, EndCause.CRASH, nxt=None)]) == [
        launch(1, EndCause.CRASH, nxt=None)
    ]
    finished = launch(0, EndCause.FINISHED)
    assert no_progress_streak([finished, launch(1, EndCause.HANG)]) == [launch(1, EndCause.HANG)]
    assert no_progress_streak([launch(0, EndCause.TIME_LIMIT)]) == []


def test_a_launch_starts_from_the_newer_of_the_supervisors_look_and_its_ranks_resume() -> None:
    """The supervisor looked when relaunching (step 128); a checkpoint committed after its
    look (step 141) is the one the ranks resumed from. A launch that then dies having saved
    nothing made no progress, whatever the look said; and a launch whose ranks passed the
    newest over for an older one made none by leaving the newest on disk."""
    late = dataclasses.replace(
        launch(0, EndCause.CRASH, from_step=128, checkpoint_step=141), resumed_from_step=141
    )
    assert started_from(late) == 141
    again = dataclasses.replace(late, attempt=1, launch=1, next=None)
    assert no_progress_streak([late, again]) == [late, again]
    nxt = decide_next(finding(), [late, again], healthy=2, needed=2, bad=[], budget=budget(),
                      run_dir=RUN)  # fmt: skip
    assert isinstance(nxt, Stop)
    assert nxt.cause is EndCause.NO_PROGRESS
    assert "without a checkpoint newer than step 141" in nxt.message
    assert f"`hpc-ddp resume {RUN}` goes on from step 141" in nxt.message
    older = dataclasses.replace(launch(0, EndCause.CRASH, from_step=128, checkpoint_step=128),
                                resumed_from_step=120)  # fmt: skip
    assert started_from(older) == 128
    assert no_progress_streak([older]) == [older]
    fresh = launch(0, EndCause.CRASH, from_step=None, checkpoint_step=None)
    assert started_from(fresh) is None
    assert no_progress_streak([fresh]) == [fresh]


def test_a_requeued_allocation_gets_the_restart_budget_anew() -> None:
    """Three faults that each made progress spent restart 0's budget; after a preemption's
    requeue (Slurm's restart 1) the next fault restarts in the job again, not the end of a
    run that keeps training (a crash loop is no_progress_limit's)."""
    spent = [
        launch(n, EndCause.CRASH, from_step=100 + 10 * n, checkpoint_step=110 + 10 * n)
        for n in range(3)
    ]
    now = dataclasses.replace(
        launch(0, EndCause.CRASH, from_step=140, checkpoint_step=150, nxt=None), restart=1
    )
    nxt = decide_next(finding(), [*spent, now], healthy=2, needed=2, bad=[], budget=budget(),
                      run_dir=RUN)  # fmt: skip
    assert isinstance(nxt, Restart)
    assert "restart 1 of 3 (fault.max_restarts)" in nxt.message
    same = dataclasses.replace(now, restart=0)  # the same allocation: spent
    stop = decide_next(finding(), [*spent, same], healthy=2, needed=2, bad=[], budget=budget(),
                       run_dir=RUN)  # fmt: skip
    assert isinstance(stop, Stop)
    assert "fault.max_restarts=3" in stop.message


def test_past_the_restart_budget_on_crash_decides() -> None:
    history = [
        launch(0, EndCause.CRASH, checkpoint_step=150),
        launch(1, EndCause.CRASH, from_step=150, checkpoint_step=160, nxt=None),
    ]
    spent = budget(max_restarts=1)
    stop = decide_next(finding(), history, healthy=2, needed=2, bad=[], budget=spent, run_dir=RUN)
    assert isinstance(stop, Stop)
    assert stop.exit_code == 1
    assert "fault.max_restarts=1" in stop.message
    assert f"hpc-ddp resume {RUN}" in stop.message
    on_crash = dataclasses.replace(spent, requeue=RequeueConfig(max_requeues=2, on_crash=True))
    nxt = decide_next(finding(), history, healthy=2, needed=2, bad=[], budget=on_crash, run_dir=RUN)
    assert isinstance(nxt, Requeue)
    assert "requeue.on_crash" in nxt.message


def test_too_few_healthy_nodes_requeue_avoiding_the_bad_one_or_stop_without_requeues() -> None:
    history = [launch(0, EndCause.NODE_FAIL, nxt=None)]
    nxt = decide_next(
        finding(EndCause.NODE_FAIL), history, healthy=1, needed=2, bad=["n2"],
        budget=budget(), run_dir=RUN,
    )  # fmt: skip
    assert isinstance(nxt, Requeue)
    assert (nxt.cause, nxt.exclude) == (EndCause.NODE_FAIL, ("n2",))
    local = dataclasses.replace(budget(), scheduled=False)
    stop = decide_next(
        finding(EndCause.NODE_FAIL), history, healthy=1, needed=2, bad=["n2"], budget=local,
        run_dir=RUN,
    )  # fmt: skip
    assert isinstance(stop, Stop)


@pytest.mark.parametrize(
    ("cause", "node_level", "own_error", "spare", "previous", "excluded"),
    [
        (EndCause.NODE_FAIL, True, False, False, None, ("n2",)),  # lost: always
        (EndCause.CRASH, True, True, False, None, ("n2",)),  # a hardware error
        (EndCause.CRASH, False, True, True, None, ()),  # a Python bug is not the node's
        (EndCause.HANG, False, False, True, None, ("n2",)),  # hung, a spare is free
        (EndCause.HANG, False, False, False, None, ()),  # hung, no spare: retried in place
        (EndCause.HANG, False, False, False, ("n2",), ("n2",)),  # the same node twice
        (EndCause.CRASH, False, False, True, None, ("n2",)),  # killed, a spare is free
    ],
)
def test_which_nodes_a_fault_leaves_out(
    cause: EndCause,
    node_level: bool,
    own_error: bool,
    spare: bool,
    previous: tuple[str, ...] | None,
    excluded: tuple[str, ...],
) -> None:
    before = None if previous is None else Blame((1,), previous, "earlier")
    got = exclusion(
        finding(cause, node_level=node_level), own_error=own_error, spare=spare,
        previous=before, enabled=True,
    )  # fmt: skip
    assert got == excluded
    assert exclusion(
        finding(cause, node_level=node_level), own_error=own_error, spare=spare,
        previous=before, enabled=False,
    ) == ()  # fmt: skip


def test_a_step_srun_refused_for_want_of_nodes_is_requeued_avoiding_the_bad_ones() -> None:
    why = "Requested node configuration is not available"
    nxt, blame = decide_refused(why, ("n2",), scheduled=True, requeues_left=True, now=5.0)
    assert isinstance(nxt, Requeue)
    assert (nxt.cause, nxt.exclude, nxt.word) == (EndCause.NODE_FAIL, ("n2",), "requeue")
    assert nxt.message == f"node_fail: srun could not start the step: {why}; requeued"
    assert (blame.nodes, blame.node_level, blame.detected_at) == (("n2",), True, 5.0)
    for scheduled, left in ((False, True), (True, False)):
        stop, _ = decide_refused(why, (), scheduled=scheduled, requeues_left=left, now=5.0)
        assert isinstance(stop, Stop)
        assert (stop.cause, stop.exit_code, stop.word) == (EndCause.CRASH, 1, "stop")
    other, _ = decide_refused("Invalid account", (), scheduled=True, requeues_left=True, now=5)
    assert isinstance(other, Stop)
    assert other.message == "crash: srun could not start the step: Invalid account"


@pytest.mark.parametrize(
    ("code", "cause", "on_purpose"),
    [
        (REQUEUE_EXIT_CODE, None, True),  # an agreed stop, or finished
        (BUDGET_EXIT_CODE, None, True),
        (NOT_CURRENT_EXIT_CODE, None, True),  # not the run's current job
        (1, EndCause.CANCELLED, True),  # the ranks said why, and it is no fault
        (1, EndCause.NO_PROGRESS, True),
        (1, EndCause.CRASH, False),
        (1, EndCause.NODE_FAIL, False),
        (1, None, False),
        (None, None, False),
    ],
)
def test_a_launch_ended_on_purpose_by_its_code_or_its_ranks_own_word(
    code: int | None, cause: EndCause | None, on_purpose: bool
) -> None:
    entry = None if cause is None else dataclasses.replace(launch(0, EndCause.CRASH), cause=cause)
    assert ended_on_purpose(code, entry) is on_purpose


def test_a_crash_loop_is_recorded_as_such_and_any_other_decision_as_the_finding() -> None:
    loop = Stop(EndCause.NO_PROGRESS, NO_PROGRESS_EXIT_CODE, "no_progress: ...")
    assert recorded_cause(loop, finding(EndCause.HANG)) is EndCause.NO_PROGRESS
    assert recorded_cause(Stop(EndCause.CRASH, 1, "x"), finding(EndCause.HANG)) is EndCause.HANG
    assert recorded_cause(Restart((), "x"), finding(EndCause.NODE_FAIL)) is EndCause.NODE_FAIL
    assert Restart((), "x").word == "restart"


def test_a_crash_blamed_on_the_rank_that_recorded_it_takes_its_own_words() -> None:
    said = dataclasses.replace(
        launch(0, EndCause.CRASH), message="rank 1 on n2: ValueError: bad batch at step 7"
    )
    got = with_own_words(finding(), said)
    assert got.blame.evidence == "ValueError: bad batch at step 7"
    assert (got.cause, got.blame.ranks, got.blame.nodes) == (EndCause.CRASH, (1,), ("n2",))
    other = dataclasses.replace(said, message="rank 0 on n1: Connection reset by peer")
    assert with_own_words(finding(), other) == finding()  # another rank's words
    assert with_own_words(finding(EndCause.HANG), said) == finding(EndCause.HANG)
    assert with_own_words(finding(), None) == finding()


def test_a_hang_blaming_every_node_of_the_launch_leaves_none_out() -> None:
    """ "No rank stands out": every rank stuck in one step singles no node out, however often
    it comes (leaving them all out would only give the allocation back)."""
    both = dataclasses.replace(
        finding(EndCause.HANG), blame=Blame((0, 1), ("n1", "n2"), "no rank stands out")
    )
    before = Blame((0, 1), ("n1", "n2"), "earlier")
    for spare in (False, True):
        got = exclusion(both, own_error=False, spare=spare, previous=before, enabled=True,
                        launch_nodes=2)  # fmt: skip
        assert got == ()
    # The same blame in a launch of 3 nodes singles out 2 of them.
    assert exclusion(both, own_error=False, spare=False, previous=before, enabled=True,
                     launch_nodes=3) == ("n1", "n2")  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "node_level", "spare", "expected"),
    [
        ("node_fail", True, True, ("n2",)),  # a lost node: always out
        ("node_fail", True, False, ("n2",)),
        ("hang", False, True, ("n2",)),  # a hung rank with a spare free: its node is out
        ("hang", False, False, ()),  # no spare: retried in place
        ("task_failed", False, True, ("n2",)),  # killed by a signal, a spare free
        ("crash", False, True, ()),  # the program's own exception follows it anywhere
        ("early_exit", False, True, ()),
    ],
)
def test_the_restarts_place_is_guessed_from_the_fault_as_exclusion_decides_it(
    kind: str, node_level: bool, spare: bool, expected: tuple[str, ...]
) -> None:
    fault = FaultRecord(kind, "supervisor", 1.0, (1,), ("n2",), "why", node_level=node_level)
    assert likely_exclusion(fault, spare=spare, previous=None, enabled=True,
                            launch_nodes=2) == expected  # fmt: skip
    assert likely_exclusion(fault, spare=spare, previous=None, enabled=False) == ()
