"""The auto interval in a session's loop (hpc_ddp.sessions.autointerval), with a fake clock:
decisions at known steps, the first save made to measure C and W, the interval re-chosen from
the measured step time, M from the ledger and the user's history, which rank 0 updates."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from hpc_ddp.checkpoint.checkpointer import SavedNote
from hpc_ddp.checkpoint.interval import Mtbf, SaveCost, choose_interval, interval_steps
from hpc_ddp.config.model import TrainConfig
from hpc_ddp.fault.interruptions import HISTORY_FILE, parse_history
from hpc_ddp.rundir.attempt import AutoInterval
from hpc_ddp.sessions.autointerval import WARMUP_STEPS, AutoCheckpoints, state_dir


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _auto(tmp_path: Path, clock: Clock, **train: float) -> AutoCheckpoints:
    settled: list[int] = []
    auto = AutoCheckpoints(
        TrainConfig(checkpoint_every="auto", **train),  # type: ignore[arg-type]
        is_main=True,
        broadcast=lambda value: value,
        settle=lambda: settled.append(1),
        ledger=tmp_path / "ledger.jsonl",
        env={"XDG_STATE_HOME": str(tmp_path / "state")},
        run_id="run-1",
        began=clock.now - 5.0,  # a start-up of 5 s before the first step
        clock=clock,
    )
    return auto


def _history(tmp_path: Path, seconds: float, interruptions: int, now: float) -> Path:
    path = tmp_path / "state" / "hpc-ddp" / HISTORY_FILE
    path.parent.mkdir(parents=True)
    doc = {"runs": {"other": {"key": "local", "seconds": seconds,
                              "interruptions": interruptions, "updated": now}}}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def _run(
    auto: AutoCheckpoints, clock: Clock, steps: range, step_s: float
) -> list[tuple[int, AutoInterval | None]]:
    """Steps of ``step_s``; a save costs 0.2 s (C) and is durable 1 s after it was asked.
    The saves made, with the plan in force at each."""
    saved: list[tuple[int, AutoInterval | None]] = []
    for step in steps:
        clock.now += step_s
        auto.step_done(step)
        if auto.due(step):
            saved.append((step, auto.plan))
            clock.now += 0.2
            auto.saved(step, 0.2)
            auto.durable(SavedNote(step, 0.2, 1.0, clock.now, auto.plan))
        if auto.deciding(step, steps.start):
            auto.decide(step)
    return saved


def test_the_first_save_measures_and_the_next_ones_follow_the_models_interval(
    tmp_path: Path,
) -> None:
    clock = Clock()
    history = _history(tmp_path, 3000.0, 10, clock.now)  # M = 300 s from the history
    auto = _auto(tmp_path, clock)
    saved = _run(auto, clock, range(1, 600), 0.5)
    first = 1 + WARMUP_STEPS + 1  # decided after the warm-up: a save next, to measure
    assert saved[0] == (first, None)
    plan = auto.plan
    assert plan is not None
    assert plan.mtbf_from == "run+history"
    assert plan.step_s == pytest.approx(0.5)
    # The interval is the model's for the measured C, W and R, and M from the pool.
    choice = choose_interval(SaveCost(0.2, 1.0, 5.0), Mtbf(plan.mtbf_s, "x"))
    assert plan.interval_s == pytest.approx(choice.seconds)
    assert plan.interval_steps == interval_steps(choice.seconds, 0.5)
    # Each save comes the chosen steps after the one before (re-chosen at each: M grows as
    # the run trains without an interruption, and so does the interval).
    for (before, _), (step, in_force) in itertools.pairwise(saved):
        assert in_force is not None
        assert step - before == in_force.interval_steps
    assert saved[-1][1] is not None
    assert saved[1][1] is not None
    assert saved[-1][1].interval_s > saved[1][1].interval_s
    assert plan.mtbf_s < 400.0  # not the 8 h prior
    # Rank 0 keeps its own entry in the history, beside the other run's.
    runs, warning = parse_history(history.read_text())
    assert warning is None
    assert set(runs) == {"other", "run-1"}
    assert runs["run-1"].seconds > 0
    assert runs["run-1"].interruptions == 0


def test_without_history_m_is_the_prior_and_the_users_maximum_caps_the_interval(
    tmp_path: Path,
) -> None:
    clock = Clock()
    auto = _auto(tmp_path, clock, checkpoint_max_s=20.0)
    saved = [step for step, _ in _run(auto, clock, range(1, 200), 0.5)]
    plan = auto.plan
    assert plan is not None
    assert plan.mtbf_from == "run"
    assert plan.mtbf_s == 8 * 3600.0
    assert plan.interval_s == pytest.approx(20.0)
    assert plan.interval_steps == 40
    assert all(b - a == 40 for a, b in itertools.pairwise(saved))


def test_a_damaged_history_costs_only_the_history(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "state" / "hpc-ddp" / HISTORY_FILE
    path.parent.mkdir(parents=True)
    path.write_text("{oops")
    auto = _auto(tmp_path, clock)
    _run(auto, clock, range(1, 50), 0.5)
    assert auto.plan is not None
    assert auto.plan.mtbf_from == "run"
    assert parse_history(path.read_text())[1] is None  # rewritten with this run's entry


def test_the_state_directory_follows_xdg_and_defaults_under_home() -> None:
    assert state_dir({"XDG_STATE_HOME": "/s"}) == Path("/s/hpc-ddp")
    assert state_dir({"HOME": "/h"}) == Path("/h/.local/state/hpc-ddp")
