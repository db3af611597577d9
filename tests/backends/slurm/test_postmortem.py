"""Naming the rank that failed first from srun's lines in the batch log (seen on Slurm 22.05)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc_ddp.backends.arrays import batch_logs
from hpc_ddp.backends.ranklogs import last_error_line
from hpc_ddp.backends.slurm.postmortem import (
    TaskFailure,
    failed_rank,
    first_failure,
    has_logs,
    parse_failure_bursts,
    startup_failure,
)

# Rank 1 SIGKILLed on n2 (tests/fault/test_requeue_e2e.py): srun then terminates rank 0.
KILLED = """\
srun: cluster configuration lacks support for cpu binding
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=206.0
srun: error: n1: task 0: Terminated
srun: Force Terminated StepId=206.0
"""
# An earlier attempt was preempted the hard way, the requeued one then had a rank raise.
TWO_ATTEMPTS = """\
srun: cluster configuration lacks support for cpu binding
srun: error: n1: task 0: Terminated
srun: error: n2: task 1: Terminated
srun: Force Terminated StepId=300.0
srun: cluster configuration lacks support for cpu binding
srun: error: n1: task 0: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=300.0
srun: error: n2: task 1: Terminated
"""
RANGES = "srun: error: n1: tasks 0-1,3: Segmentation fault\nsrun: error: n2: task 2: Terminated\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (KILLED, TaskFailure(1, "n2", "Killed")),
        (TWO_ATTEMPTS, TaskFailure(0, "n1", "Exited with exit code 1")),
        (RANGES, TaskFailure(0, "n1", "Segmentation fault")),
        ("srun: cluster configuration lacks support for cpu binding\n", None),
        ("", None),
    ],
    ids=["killed", "last-attempt-only", "task-ranges", "clean", "empty"],
)
def test_first_failure_names_the_culprit_of_the_last_burst(
    text: str, expected: TaskFailure | None
) -> None:
    assert first_failure(text) == expected


def test_bursts_split_at_other_lines_and_expand_ranges() -> None:
    bursts = parse_failure_bursts(TWO_ATTEMPTS)
    assert [[f.rank for f in b] for b in bursts] == [[0, 1], [0, 1]]
    [burst] = parse_failure_bursts(RANGES)
    assert [(f.rank, f.node) for f in burst] == [(0, "n1"), (1, "n1"), (3, "n1"), (2, "n2")]
    assert TaskFailure(1, "n2", "Killed").describe() == "rank 1 on n2: Killed"


def test_failed_rank_reads_the_newest_batch_log(tmp_path: Path) -> None:
    assert failed_rank(tmp_path / "missing") is None
    old = tmp_path / "batch-10.err"
    old.write_text(RANGES)
    os.utime(old, (1, 1))
    assert failed_rank(tmp_path) == TaskFailure(0, "n1", "Segmentation fault")
    (tmp_path / "batch-11.err").write_text(KILLED)
    (tmp_path / "batch-11.out").write_text("srun: error: n9: task 7: Killed\n")
    assert failed_rank(tmp_path) == TaskFailure(1, "n2", "Killed")


# What torch.distributed prints for a rank's uncaught exception once its process group is up.
TORCH_PREFIXED = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/hpc_ddp/train/data.py", line 86, in load_import_string
[rank1]:     raise ConfigError(
[rank1]: hpc_ddp.errors.ConfigError: train.model: no attribute 'Nope'. HINT: write it right.
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (TORCH_PREFIXED, "hpc_ddp.errors.ConfigError: train.model: no attribute 'Nope'. HINT: "
         "write it right."),
        ("[rank12]:ValueError: x\n", "ValueError: x"),
        ("[rank0]: all good\n", None),
        ("[rankX]: ValueError: x\n", None),  # not torch's prefix: not an error line
        ("ValueError: plain\n", "ValueError: plain"),
    ],
)  # fmt: skip
def test_an_error_line_is_found_behind_torchs_rank_prefix(text: str, expected: str | None) -> None:
    assert last_error_line(text) == expected


def test_startup_failure_reads_a_rank_log_torch_prefixed(tmp_path: Path) -> None:
    (tmp_path / "rank-1.err").write_text(TORCH_PREFIXED)
    assert startup_failure(tmp_path) == (
        "rank-1.err: hpc_ddp.errors.ConfigError: train.model: no attribute 'Nope'. HINT: write "
        "it right."
    )


def test_a_sweep_tasks_batch_logs_are_found_in_the_sweeps_logs(tmp_path: Path) -> None:
    """An array task's batch log is ``SWEEP/logs/batch-<array job>_<task id>``: found for its
    point through ``arrays.json``, offsets and resubmitted arrays included."""
    sweep = tmp_path / "sweep"
    arrays = [
        {"job_id": "101", "points": "0-3", "offset": 0, "array": "0-3%2", "script": "job.sbatch",
         "submitted_at": "t"},
        {"job_id": "102", "points": "4-5", "offset": 4, "array": "0-1", "script": "job-1.sbatch",
         "submitted_at": "t"},
        {"job_id": "107", "points": "2,5", "offset": 0, "array": "2,5", "script": "job-2.sbatch",
         "submitted_at": "t", "reason": "resubmit-failed"},
    ]  # fmt: skip
    (sweep / "logs").mkdir(parents=True)
    (sweep / "arrays.json").write_text(json.dumps(arrays))
    for name in ("101_2", "101_3", "102_1", "107_2", "107_5"):
        (sweep / "logs" / f"batch-{name}.err").write_text(RANGES)
    for point in range(6):
        (sweep / "tasks" / str(point)).mkdir(parents=True)  # no logs/: the script makes it
    logs = sweep / "logs"
    assert batch_logs(sweep / "tasks/2/logs", "err") == [
        logs / "batch-101_2.err", logs / "batch-107_2.err"
    ]  # fmt: skip
    assert batch_logs(sweep / "tasks/5/logs", "err") == [
        logs / "batch-102_1.err", logs / "batch-107_5.err"
    ]  # fmt: skip
    assert batch_logs(sweep / "tasks/3/logs", "err") == [logs / "batch-101_3.err"]
    assert batch_logs(sweep / "tasks/0/logs", "err") == []
    assert batch_logs(sweep / "tasks/3/logs", "out") == []
    # The newest attempt's log is the one read: the resubmitted array's.
    os.utime(logs / "batch-101_2.err", (1, 1))
    (logs / "batch-107_2.err").write_text(KILLED)
    assert failed_rank(sweep / "tasks/2/logs") == TaskFailure(1, "n2", "Killed")
    assert failed_rank(sweep / "tasks/3/logs") == TaskFailure(0, "n1", "Segmentation fault")
    assert failed_rank(sweep / "tasks/0/logs") is None
    assert has_logs(sweep / "tasks/4/logs") is False  # 102_0 never wrote a log
    assert has_logs(sweep / "tasks/5/logs") is True
    (logs / "batch-102_0.err").write_text("/venv/bin/python: No such file or directory\n")
    assert startup_failure(sweep / "tasks/4/logs") == (
        "batch-102_0.err: /venv/bin/python: No such file or directory"
    )
    # A sweep's logs from before (in the task's own logs/) are still found, first.
    (sweep / "tasks/3/logs").mkdir()
    (sweep / "tasks/3/logs/batch-90_3.err").write_text("")
    assert batch_logs(sweep / "tasks/3/logs", "err") == [
        sweep / "tasks/3/logs/batch-90_3.err", logs / "batch-101_3.err"
    ]  # fmt: skip
    # A damaged arrays.json names no log (status shows the sweep DAMAGED for it).
    (sweep / "arrays.json").write_text("{")
    assert batch_logs(sweep / "tasks/2/logs", "err") == []
