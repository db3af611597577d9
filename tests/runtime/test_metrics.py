"""MetricsWriter: metrics.jsonl, and the same rows as TensorBoard scalars read back with
TensorBoard's own reader (tags, steps, values, wall times), including a requeued attempt
whose purge drops the steps the previous attempt logged after its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# tensorboard ships no type information
from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
    EventAccumulator,
)

from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.metrics import drop_replayed, metrics_line
from hpc_ddp.runtime.metrics import TENSORBOARD_HINT, MetricsWriter, tensorboard_scalars
from hpc_ddp.state.artifacts import last_metric
from hpc_ddp.sweep.results import read_metrics
from tests.conftest import REPO

pytestmark = pytest.mark.torch


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``log_dir``'s event files, as TensorBoard itself loads them."""
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def attempt(run: Path, resume: int | None, steps: range, *, loss0: float = 0.0) -> None:
    """One attempt as the session drives it: resume_at (if any), a row per step, close."""
    writer = MetricsWriter(run / "metrics.jsonl", tensorboard_dir=run / "tensorboard")
    if resume is not None:
        writer.resume_at(resume)
    for step in steps:
        writer.write({"time": 1_000.0 + step, "step": step, "loss": loss0 + step, "epoch": 0})
    writer.close()


def test_rows_reach_jsonl_and_tensorboard_with_the_training_step(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard_dir=tmp_path / "tb")
    writer.write({"time": 1234.5, "step": 10, "epoch": 1, "loss": 0.5, "lr": 0.125})
    writer.write({"time": 1240.0, "step": 20, "val_loss": torch.tensor(0.25), "tag": "x"})
    writer.write({"loss": 9.0})  # no step: the JSON line only
    writer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["val_loss"] == 0.25
    assert rows[2] == {"loss": 9.0}
    assert scalars(tmp_path / "tb") == {
        "epoch": [(10, 1.0)],
        "loss": [(10, 0.5)],
        "lr": [(10, 0.125)],  # float32 on disk: exact values only
        "val_loss": [(20, 0.25)],
    }
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.wall_time for e in acc.Scalars("loss")] == [1234.5]  # the row's own time


def test_a_requeue_continues_the_run_and_drops_replayed_steps(tmp_path: Path) -> None:
    # Attempt 1 logs steps 1-7, checkpoints at 5, is preempted; attempt 2 resumes after 5.
    attempt(tmp_path, 0, range(1, 8), loss0=100.0)
    attempt(tmp_path, 5, range(6, 11))
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2  # one event file per attempt
    got = scalars(tmp_path / "tensorboard")["loss"]
    assert [s for s, _ in got] == list(range(1, 11))  # 6 and 7 once each, not twice
    assert got[4:] == [(5, 105.0), (6, 6.0), (7, 7.0), (8, 8.0), (9, 9.0), (10, 10.0)]


@pytest.mark.parametrize(("resume", "second"), [(5, range(6, 11)), (0, range(1, 4))])
def test_metrics_jsonl_drops_the_replayed_steps_as_tensorboard_does(
    tmp_path: Path, resume: int, second: range
) -> None:
    """The file keeps every line (it is only appended to) plus a resume marker; `results`
    and `status` read it through the marker, and see exactly what TensorBoard shows."""
    attempt(tmp_path, 0, range(1, 8), loss0=100.0)  # steps 1-7; the checkpoint was at 5 (or none)
    attempt(tmp_path, resume, second)
    raw = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert raw[7] == {"event": "resume", "step": resume, "time": raw[7]["time"]}
    assert len(raw) == 7 + 1 + len(second)  # nothing was rewritten: only appended
    shown = scalars(tmp_path / "tensorboard")["loss"]
    counted = read_metrics(tmp_path / "metrics.jsonl")  # what `results` reads
    assert [(r["step"], r["loss"]) for r in counted] == [(s, float(v)) for s, v in shown]
    assert last_metric(RunPaths(tmp_path), "loss") == shown[-1][1]  # what `status` shows
    steps = [r["step"] for r in counted]
    assert len(steps) == len(set(steps))


def test_no_resume_marker_where_nothing_is_replayed(tmp_path: Path) -> None:
    """The first attempt, and one that goes on from the very step its predecessor stopped at
    (a clean stop: the checkpoint at the stop step), leave the file as plain rows."""
    attempt(tmp_path, 0, range(1, 3))
    attempt(tmp_path, 2, range(3, 5))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    assert all("event" not in json.loads(line) for line in lines)
    assert drop_replayed([{"step": 3}, {"event": "resume", "step": 2}, {"step": 3}]) == [
        {"step": 3}
    ]


def test_without_the_purge_the_replayed_steps_would_show_twice(tmp_path: Path) -> None:
    """The control: proves the reader and the test above can see duplicated steps."""
    attempt(tmp_path, None, range(1, 8))
    attempt(tmp_path, None, range(6, 11))
    steps = [s for s, _ in scalars(tmp_path / "tensorboard")["loss"]]
    assert steps.count(6) == 2


def test_a_restart_from_scratch_drops_everything(tmp_path: Path) -> None:
    attempt(tmp_path, 0, range(0, 4), loss0=100.0)  # no checkpoint was saved
    attempt(tmp_path, 0, range(0, 3))
    assert scalars(tmp_path / "tensorboard")["loss"] == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_reopening_after_close_keeps_this_attempts_steps(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "m.jsonl", tensorboard_dir=tmp_path / "tb")
    writer.resume_at(0)
    writer.write({"step": 1, "loss": 1.0})
    writer.close()
    writer.write({"step": 2, "loss": 2.0})  # a second event file, without a second purge
    writer.close()
    assert scalars(tmp_path / "tb")["loss"] == [(1, 1.0), (2, 2.0)]


def test_without_a_tensorboard_dir_no_event_files_and_no_import(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from hpc_ddp.runtime.metrics import MetricsWriter\n"
        "w = MetricsWriter(Path(sys.argv[1]) / 'metrics.jsonl')\n"
        "w.write({'step': 1, 'loss': 1.0}); w.close()\n"
        "assert 'tensorboard' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


def test_missing_tensorboard_fails_at_construction_with_a_hint(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['tensorboard'] = None  # as if not installed\n"
        "from pathlib import Path\n"
        "from hpc_ddp.errors import ConfigError\n"
        "from hpc_ddp.runtime.metrics import MetricsWriter\n"
        "try:\n"
        "    MetricsWriter(Path(sys.argv[1]) / 'm.jsonl', tensorboard_dir=Path(sys.argv[1]))\n"
        "except ConfigError as exc:\n"
        "    print(exc.exit_code, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert out.startswith("2 train.tensorboard is true but TensorBoard cannot be imported")
    assert f"HINT: {TENSORBOARD_HINT}" in out
    assert TENSORBOARD_HINT == "pip install 'hpc-ddp[tensorboard]'"
    assert os.listdir(tmp_path) == []  # failed before anything was written


def test_tensorboard_scalars_pick_numbers() -> None:
    row = {
        "step": 3, "time": 1.0, "loss": 0.5, "n": 4, "ok": True, "name": "x",
        "t": torch.tensor(2.0), "vec": torch.ones(2), "nan": math.nan,
    }  # fmt: skip
    got = tensorboard_scalars(row)
    assert set(got) == {"loss", "n", "t", "nan"}
    assert got["t"] == 2.0
    assert math.isnan(got["nan"])
    assert metrics_line({"nan": math.nan}) == '{"nan": null}\n'
