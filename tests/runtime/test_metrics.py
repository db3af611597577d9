"""MetricsWriter: metrics.jsonl, and the same rows as TensorBoard scalars read back with
TensorBoard's own reader (tags, steps, values, wall times), including a requeued attempt
whose purge drops the steps the previous attempt logged after its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

# tensorboard ships no type information
from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
    EventAccumulator,
)

from hpc_ddp.errors import HpcDdpError
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.metrics import drop_replayed, metrics_line
from hpc_ddp.runtime.metrics import (
    TENSORBOARD_HINT,
    MetricsWriter,
    metric_row,
    tensorboard_scalars,
    wait_for_a_later_second,
)
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


def test_a_reopened_event_file_sorts_after_the_one_before(tmp_path: Path) -> None:
    """Writer 10 of a process sorts before writer 9 within one second: the next file waits
    for a later second when one of this second is there (a flaky CI run read them backwards)."""
    tb = tmp_path / "tb"
    tb.mkdir()
    now = int(time.time())
    (tb / f"events.out.tfevents.{now + 1}.host.1.9").touch()
    wait_for_a_later_second(tb)
    assert int(time.time()) > now + 1
    began = time.monotonic()
    wait_for_a_later_second(tmp_path)  # no event file: no wait
    assert time.monotonic() - began < 0.01


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


# --- values s.log is given: NaN, numpy, nested, more than one element -----------------------

NAN_ROWS: list[tuple[str, Any, Any]] = [
    ("nan tensor", torch.tensor(float("nan")), None),
    ("inf tensor", torch.tensor(float("inf")), None),
    ("-inf 1-element tensor", torch.tensor([float("-inf")]), None),
    ("numpy float32 nan", np.float32("nan"), None),
    ("numpy 0-d inf", np.array(np.inf), None),
    ("dict with nan", {"a": math.nan, "b": torch.tensor(0.5)}, {"a": None, "b": 0.5}),
    ("list with nan", [1.0, math.nan, np.float32("inf")], [1.0, None, None]),
    ("tuple of tensors", (torch.tensor(2.0), torch.tensor(math.nan)), [2.0, None]),
    ("finite numpy", np.float32(0.25), 0.25),
    ("numpy int", np.int64(7), 7),
]


@pytest.mark.parametrize(("what", "value", "written"), NAN_ROWS, ids=[r[0] for r in NAN_ROWS])
def test_non_finite_values_are_written_as_null_and_the_writer_goes_on(
    tmp_path: Path, what: str, value: Any, written: Any
) -> None:
    del what
    writer = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard_dir=tmp_path / "tb")
    writer.write({"step": 1, "x": value})
    writer.write({"step": 2, "x": 1.0})  # the run logs on
    writer.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "x": written},
        {"step": 2, "x": 1.0},
    ]


def test_a_nan_loss_still_reaches_tensorboard(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard_dir=tmp_path / "tb")
    writer.write({"step": 1, "loss": torch.tensor(math.nan)})
    writer.close()
    [(step, value)] = scalars(tmp_path / "tb")["loss"]
    assert step == 1
    assert math.isnan(value)


NON_SCALARS: list[tuple[dict[str, Any], str]] = [
    ({"loss": torch.ones(3)}, "'loss' is a Tensor of 3 elements (shape (3,))"),
    ({"acc": np.array([0.1, 0.2])}, "'acc' is a ndarray of 2 elements (shape (2,))"),
    ({"empty": torch.ones(0)}, "'empty' is a Tensor of 0 elements"),
    ({"d": {"inner": torch.ones(2, 2)}}, "'d.inner' is a Tensor of 4 elements (shape (2, 2))"),
    ({"l": [1.0, np.zeros(5)]}, "'l[1]' is a ndarray of 5 elements"),
]


@pytest.mark.parametrize(("row", "said"), NON_SCALARS, ids=[next(iter(r)) for r, _ in NON_SCALARS])
def test_a_value_of_more_than_one_element_is_refused_naming_its_key_before_any_write(
    tmp_path: Path, row: dict[str, Any], said: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write({"step": 1, "loss": 1.0})
    before = path.read_bytes()
    with pytest.raises(HpcDdpError, match="HINT:") as refused:
        writer.write({"step": 2, "ok": 1.0, **row})
    assert said in str(refused.value)
    # Checked without item() on the ranks that write nothing: refused there too.
    with pytest.raises(HpcDdpError, match=re.escape(said)):
        metric_row(row, convert=False)
    writer.close()
    assert path.read_bytes() == before  # nothing of the refused row


def test_metric_row_without_convert_leaves_the_values_as_given() -> None:
    t = torch.tensor(1.5)
    assert metric_row({"t": t}, convert=False)["t"] is t
    assert metric_row({"t": t}) == {"t": 1.5}


# A session script that logs what users log: NaN and inf tensors, numpy NaN, NaN nested in a
# dict and a list, then (only with a second argument) a vector.
NAN_SCRIPT = """\
import math, sys
import numpy as np
import torch
import hpc_ddp

with hpc_ddp.session() as s:
    for step in s.steps(total=3):
        loss = torch.tensor(float("nan") if step == 1 else float(step))
        s.log(step=step, loss=loss, gnorm=torch.tensor(float("inf")), np_nan=np.float32("nan"),
              parts={"a": math.nan, "b": torch.tensor(2.0)}, hist=[1.0, math.nan])
        if len(sys.argv) > 1 and step == 2:
            s.log(step=step, per_class=torch.ones(4))
"""


def _run_nan_script(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "nan_metrics.py").write_text(NAN_SCRIPT)
    argv = ", ".join(["python", str(tmp_path / "nan_metrics.py"), *args])
    (tmp_path / "job.yaml").write_text(
        f"name: nanlog\ncommand: [{argv}]\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:05:00'}\n"
        "fault: {enabled: false}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", str(tmp_path / "job.yaml"), "--backend",
         "local", "--wait", "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    [run_dir] = (tmp_path / "runs").iterdir()
    return done, run_dir


def test_a_real_two_rank_run_logging_nan_tensors_completes_with_nulls(tmp_path: Path) -> None:
    done, run_dir = _run_nan_script(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert [r["loss"] for r in rows] == [None, 2.0, 3.0]
    assert all(r["gnorm"] is None and r["np_nan"] is None for r in rows)
    assert all(r["parts"] == {"a": None, "b": 2.0} and r["hist"] == [1.0, None] for r in rows)


def test_a_real_run_logging_a_vector_fails_on_every_rank_naming_the_key(tmp_path: Path) -> None:
    done, run_dir = _run_nan_script(tmp_path, "vector")
    assert done.returncode != 0
    for rank in (0, 1):
        err = (run_dir / "logs" / f"rank-{rank}.err").read_text()
        assert "'per_class' is a Tensor of 4 elements (shape (4,))" in err, err[-2000:]
    logged = (run_dir / "metrics.jsonl").read_text()
    assert "per_class" not in logged
