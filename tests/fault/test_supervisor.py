"""The supervisor's files: the bad nodes of a job, a launch's directory, the newest checkpoint;
what it says of a launch it starts.

Its policy is pinned in tests/fault/test_plan.py; the supervisor itself runs on the real dev
cluster in tests/fault/test_faults_e2e.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.base import TaskEnd
from hpc_ddp.config.model import JobConfig, SlurmConfig
from hpc_ddp.fault import launch_watch, supervisor
from hpc_ddp.fault.blame import ALIVE, BEAT_BYTES, RESCUE_PHASE, Beat, FaultRecord
from hpc_ddp.fault.launch_ledger import Identity
from hpc_ddp.fault.supervisor import (
    Plan,
    Supervisor,
    launch_words,
    prepare_launch,
    read_bad_nodes,
    write_bad_nodes,
)
from hpc_ddp.rundir.layout import RunPaths


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


class _Gone:
    """A launch whose every process is already gone, cleanly."""

    def poll(self) -> int | None:
        return 0

    def task_ends(self) -> Sequence[Any]:
        return []

    def node_failures(self) -> list[tuple[str, str]]:
        return []

    def node_answers(self, node: str) -> bool | None:
        return True

    def refused(self) -> str | None:
        return None

    def signal(self, name: str, beats: Mapping[int, Any]) -> None:
        pass

    def kill(self, beats: Mapping[int, Any]) -> None:
        pass

    def forward(self, signum: int) -> None:
        pass

    def abandon(self) -> None:
        pass


class _LateCommit:
    """A launcher under which a checkpoint is committed after the supervisor looked (a
    straggler of the launch before): the ranks it starts resume from that one."""

    def __init__(self, newest: list[int]) -> None:
        self.newest = newest

    def nodes(self) -> tuple[str, ...]:
        return ("n1",)

    def start(self, plan: Any, env: Mapping[str, str]) -> _Gone:
        self.newest.append(141)
        return _Gone()


def test_a_relaunch_names_the_newest_checkpoint_when_it_looked_not_where_the_ranks_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It used to say "from step 128" while the ranks resumed at 141, committed after its look:
    it says what it saw and when, and leaves where they resume to the ranks' own line."""
    newest = [128]
    monkeypatch.setattr(supervisor, "newest_step", lambda *a, **k: newest[-1])
    sup = Supervisor(
        RunPaths(tmp_path), JobConfig(name="t"), _LateCommit(newest),  # type: ignore[arg-type]
        Identity("42", "42", 0), env={},
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="hpc_ddp"):
        sup._run_launch(Plan(1, 1, 1), {})
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("supervisor:")]
    assert said == [
        "supervisor: launch 1 (1 node(s)); newest committed checkpoint when relaunching: step "
        "128 (rank 0's log says where the ranks resume)"
    ]


def test_a_launch_that_leaves_a_node_out_and_finds_no_checkpoint_says_so() -> None:
    assert launch_words(Plan(0, 2, 1, ("n3",)), None) == (
        "launch 0 (2 node(s), without n3); newest committed checkpoint when relaunching: none "
        "(rank 0's log says where the ranks resume)"
    )


class _Nodes:
    """A launcher whose allocation holds ``nodes``."""

    def __init__(self, nodes: tuple[str, ...]) -> None:
        self._nodes = nodes

    def nodes(self) -> tuple[str, ...]:
        return self._nodes


def test_nodes_found_bad_before_a_requeue_are_tried_again_when_the_allocation_is_short(
    tmp_path: Path,
) -> None:
    """A requeued job got its bad nodes again (Slurm could not leave them out): left out, every
    launch would be refused for want of nodes, so they are tried again; with enough others
    they stay left out."""
    cfg = JobConfig(name="t", slurm=SlurmConfig(nodes=2))
    bad = {"n2": "lost", "n3": "failed twice"}

    def supervisor(nodes: tuple[str, ...]) -> Supervisor:
        return Supervisor(
            RunPaths(tmp_path), cfg, _Nodes(nodes), Identity("42", "42", 1),  # type: ignore[arg-type]
            env={},
        )  # fmt: skip

    assert supervisor(("n1", "n2", "n3"))._still_avoidable(bad) == {}
    assert supervisor(("n1", "n2", "n3", "n4"))._still_avoidable({"n2": "lost"}) == {"n2": "lost"}


class _Step(_Gone):
    """A launch still running: rank 1 died (srun said so); the supervisor's kills counted."""

    def __init__(self) -> None:
        self.kills = 0

    def poll(self) -> int | None:
        return None

    def task_ends(self) -> Sequence[Any]:
        return [TaskEnd(1, "n2", "Killed")]

    def kill(self, beats: Mapping[int, Any]) -> None:
        self.kills += 1


@pytest.mark.parametrize(
    ("armed", "phase", "blamed", "waited", "kills"),
    [
        (False, "step", (1,), 2.5, 1),  # nothing to wait for past the dump's grace
        (True, "step", (1,), 2.5, 0),  # a loaded survivor not yet at its next beat
        (True, "step", (1,), launch_watch.RESCUE_TAKEN_UP_S + 0.1, 1),  # it never took it up
        (True, RESCUE_PHASE, (1,), launch_watch.RESCUE_TAKEN_UP_S + 0.1, 0),  # still saving
        (True, "step", (0, 1), 2.5, 1),  # blamed itself: it saves nothing
    ],
)
def test_a_survivor_armed_to_save_is_let_take_the_fault_up_before_the_step_ends(
    tmp_path: Path, armed: bool, phase: str, blamed: tuple[int, ...], waited: float, kills: int
) -> None:
    """The CI run where a loaded survivor's watchdog had not reached its next beat by the dump's
    2 s grace: the step was ended under it and the one rank that could save the step every rank
    completed was gone (1 step trained twice)."""
    record = FaultRecord("crash", "srun", 100.0, (1,), ("n2",), "Killed")
    watch = launch_watch.LaunchWatch(fault=replace(record, ranks=blamed), fault_at=100.0)
    watch.signalled = True
    beats = {0: Beat(0, "n1", 10, 5, 100.0, step=13, phase=phase, state=ALIVE, rescues=armed)}
    step = _Step()
    cfg = JobConfig(name="t").fault
    watch.end_step(step, beats, step.task_ends(), 100.0 + waited, world=2, cfg=cfg)
    assert step.kills == kills
