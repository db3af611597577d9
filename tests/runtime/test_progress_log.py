"""Rank 0's progress lines from logged rows: when they are due, what they say, and the live
progress file ``status`` reads."""

from __future__ import annotations

from pathlib import Path

from hpc_ddp.rundir.live_progress import read_live_progress
from hpc_ddp.runtime.progress_log import ProgressLog


def _lines(log: ProgressLog, steps: range) -> list[int]:
    return [step for step in steps if log.row({"step": step, "loss": 0.5}, epoch=0) is not None]


def test_a_line_at_each_multiple_of_log_every_and_at_the_total() -> None:
    every_step = ProgressLog(10)
    every_step.begin(0, 35)
    assert _lines(every_step, range(1, 36)) == [10, 20, 30, 35]
    resumed = ProgressLog(10)  # from step 45, rows every 10th step as the trainer logs them
    resumed.begin(45, 75)
    assert _lines(resumed, range(50, 76, 10)) == [50, 60, 70]
    sparse = ProgressLog(10)  # rows every 7th step: the first row past each multiple
    sparse.begin(0, 100)
    assert _lines(sparse, range(7, 50, 7)) == [14, 21, 35, 42]


def test_a_line_says_step_total_loss_rate_and_eta_and_the_file_holds_them(tmp_path: Path) -> None:
    log = ProgressLog(2, tmp_path / "progress.json")
    log.step_samples = 64
    log.begin(0, 10)
    assert log.row({"step": 1, "loss": 1.0}, epoch=0) is None
    line = log.row({"step": 2, "loss": 0.25}, epoch=1)
    assert line is not None
    assert line.startswith("step 2/10 | epoch 1 | loss 0.2500 | ")
    assert " samples/s | ETA " in line
    live = read_live_progress(tmp_path / "progress.json")
    assert live is not None
    assert (live.step, live.total) == (2, 10)
    assert live.eta_s is not None
    assert live.samples_per_s is not None
    assert live.describe(live.time).startswith("at step 2/10 | ")
    given = log.row({"step": 10, "samples_per_s": 123.4}, epoch=1)  # the trainer's own rate
    assert given is not None
    assert "123 samples/s | ETA 0:00:00" in given
    assert read_live_progress(tmp_path / "missing.json") is None
