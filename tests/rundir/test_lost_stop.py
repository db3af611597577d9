"""A stop whose save the kill beat: found in the ledger (``stop_save`` with no durable
``checkpoint`` line of its step), recorded once (``stop_save_lost``) and shown by status."""

from __future__ import annotations

import json
from pathlib import Path

from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.ledger import lost_stop, read_ledger
from hpc_ddp.rundir.ledger_events import (
    LaunchId,
    checkpoint_event,
    lost_stop_lines,
    start_event,
    stop_save_event,
)
from hpc_ddp.state.report import _lost_stops


def _ledger(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(lines))
    return path


def _key(restart: int) -> LaunchId:
    return LaunchId("7", "7", restart)


def _start(restart: int, now: float, resumed: int | None = None) -> str:
    return start_event(
        attempt=restart, launch_id=_key(restart), nodelist="n1",
        world_size=1, resumed_from_step=resumed, checkpoint=None, now=now,
    )  # fmt: skip


def _save(step: int, now: float, restart: int = 0) -> str:
    return checkpoint_event(launch_id=_key(restart), step=step, stall_s=0.1, durable_s=2, now=now)


def _stop(step: int, now: float, restart: int = 0) -> str:
    return stop_save_event(launch_id=_key(restart), step=step, lead_time_s=120, now=now)


def test_a_stop_save_without_its_checkpoint_line_is_lost(tmp_path: Path) -> None:
    path = _ledger(tmp_path, _start(0, 10), _save(20, 20), _stop(40, 30), _start(1, 50, 20))
    first, second = read_ledger(path)
    assert lost_stop(first, over=False) is None  # still saving, perhaps: never judged
    lost = lost_stop(first, over=True)
    assert lost is not None
    assert (lost.step, lost.saved_step, lost.lost_steps, lost.lead_s) == (40, 20, 20, 120)
    assert "HINT: raise requeue.lead_time" in lost.describe()
    assert lost_stop(second, over=True) is None
    # Recorded once: its line folds into the attempt, and no second line is made.
    lines = lost_stop_lines([first, second], found_by="attempt", now=60)
    assert len(lines) == 1
    assert json.loads(lines[0])["lost_steps"] == 20
    path.write_text(path.read_text() + lines[0])
    first = read_ledger(path)[0]
    assert first.lost is not None
    assert first.lost.recorded
    assert lost_stop_lines(read_ledger(path), found_by="status", now=70) == []


def test_a_stop_whose_save_landed_or_had_nothing_new_is_not_lost(tmp_path: Path) -> None:
    landed = _ledger(tmp_path, _start(0, 10), _stop(40, 30), _save(40, 31), _start(1, 50, 40))
    assert lost_stop(read_ledger(landed)[0], over=True) is None
    (tmp_path / "b").mkdir()
    resumed_at_stop = _ledger(tmp_path / "b", _start(0, 10, 40), _stop(40, 30))
    assert lost_stop(read_ledger(resumed_at_stop)[0], over=True) is None


def test_status_shows_the_lost_stop_and_records_the_last_one(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    _ledger(tmp_path, _start(0, 10), _save(20, 20), _stop(40, 30))
    attempts = read_ledger(paths.ledger)
    assert _lost_stops(paths, attempts, running=True, now=100) == []  # the job may still save
    notes = _lost_stops(paths, attempts, running=False, now=100)
    assert len(notes) == 1
    assert "the stop's save of step 40 was not durable" in notes[0]
    assert "requeue.lead_time: auto" in notes[0]
    recorded = read_ledger(paths.ledger)[0].lost
    assert recorded is not None
    assert recorded.recorded
    assert _lost_stops(paths, read_ledger(paths.ledger), running=False, now=200) == notes
    assert paths.ledger.read_text().count("stop_save_lost") == 1
