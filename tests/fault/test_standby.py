"""The standby's call file and its supervisor-side rules (:mod:`hpc_ddp.fault.standby`).

The real standby (srun steps, torch imports, a SIGKILLed rank) is proved on the dev cluster by
``test_standby_e2e.py``; here the file protocol runs against real files and threads, and the
rules against a recording launcher.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpc_ddp.backends.base import LaunchShape
from hpc_ddp.config.model import DistConfig, FaultConfig, JobConfig
from hpc_ddp.fault import standby as sb
from hpc_ddp.fault.blame import Beat
from hpc_ddp.fault.supervisor import Plan
from hpc_ddp.rundir.layout import STANDBY_ENV


def test_a_word_is_rewritten_in_place_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "standby.call"
    assert sb.read_call(path) is None
    sb.write_call(path, "wait")
    inode = path.stat().st_ino
    assert sb.read_call(path) == "wait"
    sb.write_call(path, "go")
    assert sb.read_call(path) == "go"
    sb.write_call(path, "dismiss")
    assert sb.read_call(path) == "dismiss"
    assert path.stat().st_ino == inode  # the same file: no rename a cached handle could hide
    assert path.stat().st_size == sb.CALL_BYTES
    path.write_bytes(b"garbage\n")
    assert sb.read_call(path) is None


@pytest.mark.parametrize("word", ["go", "dismiss"])
def test_waiting_ends_on_the_word_and_ignores_slurms_warning_meanwhile(
    tmp_path: Path, word: sb.Word, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sb, "called_at", None)  # restored after: no later session starts "called"
    path = tmp_path / "standby.call"
    sb.write_call(path, "wait")
    before = signal.getsignal(signal.SIGUSR2)

    def supervisor() -> None:  # the word comes from elsewhere; this thread is the waiter's
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGUSR2)  # would end the process by default
        time.sleep(0.1)
        sb.write_call(path, word)

    other = threading.Thread(target=supervisor)
    other.start()
    began = time.monotonic()
    called = sb.wait_to_be_called(path)
    other.join(timeout=5)
    assert called is (word == "go")
    assert time.monotonic() - began >= 0.3
    assert signal.getsignal(signal.SIGUSR2) == before
    assert (sb.called_at is not None) == (word == "go")


@dataclass
class _Step:
    ended: int | None = None
    lost: list[tuple[str, str]] = field(default_factory=list)
    abandoned: int = 0

    def poll(self) -> int | None:
        return self.ended

    def node_failures(self) -> list[tuple[str, str]]:
        return self.lost

    def refused(self) -> str | None:
        return None

    def abandon(self) -> None:
        self.abandoned += 1


@dataclass
class _Launcher:
    started: list[tuple[LaunchShape, dict[str, str]]] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)

    def start(self, plan: LaunchShape, env: Mapping[str, str]) -> _Step:
        self.started.append((plan, dict(env)))
        self.steps.append(_Step())
        return self.steps[-1]


def _beats(steps: int, world: int = 2) -> dict[int, Beat | None]:
    return {r: Beat(r, "n1", 1, 1, 0.0, launch_steps=steps) for r in range(world)}


def _armed(tmp_path: Path, after_s: float = 5.0) -> tuple[sb.Standby[_Step], _Launcher, Path]:
    launcher = _Launcher()
    standby = sb.Standby(launcher, enabled=True, after_s=after_s)
    call = tmp_path / "launch-1" / "standby.call"
    standby.arm(Plan(1, 2, 1, (), overlap=True), {"HPC_DDP_LAUNCH": "1"}, call)
    return standby, launcher, call


def test_it_starts_once_every_rank_has_trained_after_s_and_never_twice(tmp_path: Path) -> None:
    standby, launcher, call = _armed(tmp_path)
    standby.tend(_beats(0), 100.0, settled=True)  # not training yet
    standby.tend({0: _beats(3)[0], 1: None}, 100.0, settled=True)  # one rank not yet
    standby.tend(_beats(3), 100.0, settled=True)  # training from now
    standby.tend(_beats(9), 104.9, settled=True)
    assert launcher.started == []
    standby.tend(_beats(9), 105.0, settled=False)  # a fault was found: not now
    assert launcher.started == []
    standby.tend(_beats(12), 105.0, settled=True)
    standby.tend(_beats(20), 200.0, settled=True)
    [(shape, env)] = launcher.started
    assert (shape.nodes, shape.tasks_per_node, shape.exclude, shape.overlap) == (2, 1, (), True)
    assert env == {"HPC_DDP_LAUNCH": "1", STANDBY_ENV: str(call)}
    assert sb.read_call(call) == "wait"


def test_a_restart_of_its_shape_calls_it(tmp_path: Path) -> None:
    standby, launcher, call = _armed(tmp_path, after_s=0)
    standby.tend(_beats(1), 0.0, settled=True)
    step = standby.call(Plan(1, 2, 1, (), overlap=True))
    assert step is launcher.steps[0]
    assert sb.read_call(call) == "go"
    assert standby.step is None  # called once: the next launch arms a new one
    assert standby.call(Plan(1, 2, 1, (), overlap=True)) is None


@pytest.mark.parametrize(
    ("plan", "ended", "lost"),
    [
        (Plan(1, 2, 1, ("n2",), overlap=True), None, []),  # the restart leaves a node out
        (Plan(1, 1, 1, (), overlap=True), None, []),  # fewer nodes
        (Plan(2, 2, 1, (), overlap=True), None, []),  # another launch
        (Plan(1, 2, 1, (), overlap=True), 1, []),  # its step ended
        (Plan(1, 2, 1, (), overlap=True), None, [("n2", "Node failure")]),  # it lost a node
    ],
)
def test_anything_else_dismisses_it_and_starts_cold(
    tmp_path: Path, plan: Plan, ended: int | None, lost: list[tuple[str, str]]
) -> None:
    standby, launcher, call = _armed(tmp_path, after_s=0)
    standby.tend(_beats(1), 0.0, settled=True)
    launcher.steps[0].ended, launcher.steps[0].lost = ended, lost
    assert standby.call(plan) is None
    assert sb.read_call(call) == "dismiss"


def test_a_node_slurm_dropped_from_the_job_is_left_out_either_way(tmp_path: Path) -> None:
    standby, launcher, _call = _armed(tmp_path, after_s=0)
    standby.prepare(Plan(1, 2, 1, ("n2",), overlap=True), ("n1", "n2", "n3"))
    # By the restart Slurm has dropped the lost n2 (--no-kill): srun leaves it out either way.
    step = standby.call(Plan(1, 2, 1, (), overlap=True), ("n1", "n3"))
    assert step is launcher.steps[0]
    assert standby.call(Plan(1, 2, 1, (), overlap=True)) is None  # called once


def test_a_fault_before_it_was_due_starts_it_at_once_in_the_guessed_place(
    tmp_path: Path,
) -> None:
    standby, launcher, call = _armed(tmp_path, after_s=1e9)
    standby.prepare(Plan(1, 2, 1, ("n2",), overlap=True), ("n1", "n2", "n3"))
    [(shape, env)] = launcher.started
    assert (getattr(shape, "launch", None), shape.exclude) == (1, ("n2",))
    assert env[STANDBY_ENV] == str(call)
    assert sb.read_call(call) == "wait"
    standby.tend(_beats(9), 1e10, settled=True)  # never a second one
    assert len(launcher.started) == 1
    assert standby.call(Plan(1, 2, 1, ("n2",), overlap=True), ("n1", "n2", "n3")) is not None
    assert sb.read_call(call) == "go"


def test_a_standby_in_the_place_the_restart_will_have_is_kept(tmp_path: Path) -> None:
    standby, launcher, call = _armed(tmp_path, after_s=0)
    standby.tend(_beats(1), 0.0, settled=True)
    standby.prepare(Plan(1, 2, 1, (), overlap=True), ("n1", "n2"))
    assert len(launcher.started) == 1
    assert sb.read_call(call) == "wait"
    standby.prepare(Plan(2, 2, 1, (), overlap=True), ("n1", "n2"))  # not its launch: nothing
    assert len(launcher.started) == 1


def test_a_standby_in_another_place_is_dismissed_and_the_new_one_gets_its_own_file(
    tmp_path: Path,
) -> None:
    standby, launcher, call = _armed(tmp_path, after_s=0)
    standby.tend(_beats(1), 0.0, settled=True)
    standby.prepare(Plan(1, 2, 1, ("n2",), overlap=True), ("n1", "n2", "n3"))
    assert sb.read_call(call) == "dismiss"  # the one on n1, n2 (n2 was lost)
    (_, _first), (shape, env) = launcher.started
    second = Path(env[STANDBY_ENV])
    # Its own file: "go" for it can never reach the dismissed one still reading the first.
    assert second != call
    assert second.parent == call.parent
    assert shape.exclude == ("n2",)
    assert sb.read_call(second) == "wait"
    assert standby.call(Plan(1, 2, 1, ("n2",), overlap=True), ("n1", "n2", "n3")) is not None
    assert (sb.read_call(call), sb.read_call(second)) == ("dismiss", "go")


def test_a_dismissed_standby_that_does_not_end_is_left_to_srun_never_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sb, "DISMISS_WAIT_S", 0.2)
    standby, launcher, call = _armed(tmp_path, after_s=0)
    standby.tend(_beats(1), 0.0, settled=True)
    standby.dismiss()
    assert sb.read_call(call) == "dismiss"
    deadline = time.monotonic() + 5
    while launcher.steps[0].abandoned == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    # A step that lost a node may not end until Slurm settles it: killing it "by its id" once
    # guessed the newest step, the launch just started beside it.
    assert launcher.steps[0].abandoned == 1


def test_a_standby_that_cannot_start_only_turns_itself_off(tmp_path: Path) -> None:
    class Refusing(_Launcher):
        def start(self, plan: LaunchShape, env: Mapping[str, str]) -> _Step:
            raise OSError("srun: not found")

    standby = sb.Standby(Refusing(), enabled=True, after_s=0)
    standby.arm(Plan(1, 2, 1, (), overlap=True), {}, tmp_path / "standby.call")
    standby.tend(_beats(1), 0.0, settled=True)
    assert (standby.enabled, standby.step) == (False, None)
    assert standby.call(Plan(1, 2, 1, (), overlap=True)) is None


@pytest.mark.parametrize(
    ("changes", "fits"),
    [
        ({}, True),
        ({"fault": FaultConfig(standby=False)}, False),
        ({"command": ("python", "train.py")}, False),
        ({"dist": DistConfig(launcher="torchrun")}, False),
    ],
)
def test_only_a_launch_of_hpc_ddps_own_ranks_has_one(
    changes: dict[str, object], fits: bool
) -> None:
    from dataclasses import replace

    assert sb.standby_fits(replace(JobConfig(name="j"), **changes)) is fits  # type: ignore[arg-type]
