"""The supervisor's policy (pure): restart, requeue or stop; crash loops; which nodes go.

The supervisor itself runs on the real dev cluster in tests/fault/test_faults_e2e.py; here its
decisions are pinned case by case.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import zipfile
from pathlib import Path

import pytest

from hpc_ddp.config.model import FaultConfig, RequeueConfig
from hpc_ddp.exitcodes import NO_PROGRESS_EXIT_CODE
from hpc_ddp.fault.blame import BEAT_BYTES, Finding
from hpc_ddp.fault.supervisor import (
    Budget,
    Requeue,
    Restart,
    Stop,
    decide_next,
    exclusion,
    newest_checkpoint_step,
    no_progress_streak,
    prepare_launch,
    read_bad_nodes,
    write_bad_nodes,
)
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import Attempt, Blame, EndCause

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
        under_slurm=True,
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
    local = dataclasses.replace(budget(), under_slurm=False)
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


def test_bad_nodes_are_remembered_for_the_same_job_only(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    write_bad_nodes(paths, "42", {"n2": "srun: Node failure"})
    assert read_bad_nodes(paths, "42") == {"n2": "srun: Node failure"}
    assert read_bad_nodes(paths, "43") == {}  # `hpc-ddp resume` is a new job: it starts clean


def test_a_launch_directory_is_made_whole_before_any_rank_starts(tmp_path: Path) -> None:
    lp = RunPaths(tmp_path).launch("42.0.1")
    lp.root.mkdir(parents=True)
    lp.fault.write_text("{}")  # a stale claim must never end the new launch
    prepare_launch(lp, 3)
    assert not lp.fault.exists()
    for path in (lp.supervisor, lp.beat(0), lp.beat(2), lp.exit_note(0), lp.exit_note(2)):
        assert path.stat().st_size == BEAT_BYTES


def _labelled(path: Path, step: int) -> None:
    """A zip archive whose pickle says ``step``, as a checkpoint's does (no torch needed)."""
    payload = {"progress": {"step": step}, "meta": {}}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))


def test_the_newest_checkpoint_step_is_the_newest_whose_label_says_it(tmp_path: Path) -> None:
    """Issue 31: a copy named step-00009999.pt, a FIFO or a cut file was taken for the newest
    checkpoint (the launch said "from step 9999", and no_progress compared with it)."""
    assert newest_checkpoint_step(tmp_path / "none") is None
    for step in (10, 140):
        _labelled(tmp_path / f"step-{step:08d}.pt", step)
    for name in (".tmp-step-00000150.pt", "latest"):
        (tmp_path / name).write_text("x")
    assert newest_checkpoint_step(tmp_path) == 140
    _labelled(tmp_path / "step-00009999.pt", 140)  # a copy under a newer name
    os.mkfifo(tmp_path / "step-00000160.pt")  # never opened
    (tmp_path / "step-00000150.pt").write_bytes((tmp_path / "step-00000140.pt").read_bytes()[:-9])
    assert newest_checkpoint_step(tmp_path) == 140


def test_a_committed_shard_set_counts_as_a_checkpoint_a_partial_one_does_not(
    tmp_path: Path,
) -> None:
    """An FSDP run's checkpoints are step-N/ directories (the no-progress check compares them
    too); one without its digest record, or still under its .partial- name, is no checkpoint."""
    _labelled(tmp_path / "step-00000010.pt", 10)
    for name in ("step-00000020", "step-00000030", ".partial-step-00000040"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "digests.json").write_text("{}")
    (tmp_path / "step-00000050").mkdir()  # no record: not committed
    assert newest_checkpoint_step(tmp_path) == 30
