"""How a local job's tasks ended (:mod:`hpc_ddp.backends.local.outcome`): each task's result
file, read as plain values only, the rank to blame, and what ``submit --wait`` and ``status``
say of a failed local run.

The result files are written with submitit's own pickler, as its task wrapper writes them; the
last tests run real two-rank local jobs whose model breaks on the ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_ddp.backends.local.outcome import LocalResult, TaskOutcome, first_failure, task_outcomes
from hpc_ddp.backends.local.process import read_identity
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.ledger import read_ledger
from tests.conftest import REPO

TRACE = (
    "Traceback (most recent call last):\n"
    '  File "x.py", line 1, in <module>\n'
    "hpc_ddp.errors.ConfigError: train.model: cannot import module 'nope'. HINT: install it.\n"
)


def _write_result(folder: Path, job_id: str, rank: int, result: tuple[str, object]) -> None:
    from submitit.core.utils import JobPaths, cloudpickle_dump

    folder.mkdir(parents=True, exist_ok=True)
    cloudpickle_dump(result, JobPaths(folder, job_id, rank).result_pickle)


def test_task_outcomes_read_submitits_result_files(tmp_path: Path) -> None:
    _write_result(tmp_path, "77", 0, ("success", 0))
    _write_result(tmp_path, "77", 1, ("success", 3))
    _write_result(tmp_path, "77", 2, ("error", TRACE))
    got = task_outcomes(tmp_path, "77", 4)
    assert [(o.rank, o.ok) for o in got] == [(0, True), (1, False), (2, False), (3, False)]
    assert got[1].detail == "exit code 3"
    assert got[2].detail.startswith("ConfigError: train.model: cannot import module 'nope'.")
    assert got[3].detail.startswith("ended without a result")
    assert got[3].reported_at is None


def test_the_rank_killed_outright_is_blamed_before_its_complaining_peers() -> None:
    peer = TaskOutcome(0, False, "RuntimeError: Connection reset by peer", 10.0)
    killed = TaskOutcome(1, False, "ended without a result", None)
    assert first_failure([peer, killed]) == killed
    early = TaskOutcome(2, False, "ValueError: bad", 5.0)
    assert first_failure([peer, early]) == early
    assert first_failure([TaskOutcome(0, True, "exit code 0", 1.0)]) is None


def test_local_result_says_the_verdict_status_gives_and_whom_to_blame() -> None:
    """The state is status's verdict (one verdict: never "the controller ended INTERRUPTED"
    beside a status that says CANCELLED); the result files only name the rank to blame."""
    ok = [TaskOutcome(0, True, "exit code 0", 1.0), TaskOutcome(1, True, "exit code 0", 1.0)]
    assert LocalResult("9", "FINISHED", ok).describe("COMPLETED") == "local job 9: COMPLETED"
    assert LocalResult("9", "INTERRUPTED", ok).describe("CANCELLED") == "local job 9: CANCELLED"
    bad = [TaskOutcome(0, False, "ConfigError: x", 2.0), TaskOutcome(1, False, "E: y", 3.0)]
    result = LocalResult("9", "FINISHED", bad)
    assert result.describe("FAILED") == (
        "local job 9: FAILED: rank 0 failed (then rank 1): ConfigError: x"
    )
    assert LocalResult("9", "INTERRUPTED", []).describe("FAILED") == "local job 9: FAILED"


def model_broken_on_rank_1(cfg: object) -> object:
    """``train.model`` for the test below: rank 1 fails at once, rank 0 a moment later."""
    del cfg
    if os.environ["RANK"] == "1":
        raise ValueError("model broken on rank 1")
    time.sleep(2.0)
    raise ValueError("rank 0 gave up too")


def _submit_broken(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path),
         "train.model=tests.backends.local.test_outcome:model_broken_on_rank_1", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.torch
def test_local_wait_fails_and_names_the_rank_that_failed_first(tmp_path: Path) -> None:
    """The model imports (so the submit-time checks pass) but breaks on the ranks; without a
    supervisor each rank's submitit result names it."""
    done = _submit_broken(tmp_path, "fault.enabled=false")
    assert done.returncode == 1, done.stderr[-3000:]
    last = [ln for ln in done.stderr.splitlines() if ln.startswith("local job ")][-1]
    assert last.endswith(
        ": FAILED: rank 1 failed (then rank 0): ValueError: model broken on rank 1"
    )
    [run_dir] = tmp_path.iterdir()
    assert read_identity(run_dir) is not None  # the controller was recorded at submit time


@pytest.mark.torch
def test_a_supervised_local_run_that_always_fails_stops_as_a_crash_loop(tmp_path: Path) -> None:
    """The supervisor restarts the broken ranks once in their own process tree, sees the same
    error at the same step with no newer checkpoint, and stops with no_progress, naming rank 1
    and its error; rank 0, which adopted the fault, is not blamed."""
    done = _submit_broken(tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    [run_dir] = tmp_path.iterdir()
    reason = f"{run_dir}: failed first: no_progress: rank 1 on local: ValueError: model broken"
    assert any(ln.startswith(reason) for ln in done.stderr.splitlines()), done.stderr[-3000:]
    attempts = read_ledger(run_dir / "ledger.jsonl")
    assert [(a.launch, a.cause, a.next) for a in attempts] == [
        (0, EndCause.CRASH, "restart"),
        (1, EndCause.NO_PROGRESS, "stop"),
    ]
    assert attempts[-1].message is not None
    assert f"`hpc-ddp resume {run_dir}` goes on from the start" in attempts[-1].message
    assert "rank 0 gave up too" not in (run_dir / "logs" / "rank-0.err").read_text()


def test_a_result_file_is_read_as_plain_values_only(tmp_path: Path) -> None:
    witness = tmp_path / "ran"
    evil = b"cos\nsystem\n(S'touch " + str(witness).encode() + b"'\ntR."
    (tmp_path / "77_0_result.pkl").write_bytes(evil)
    [got] = task_outcomes(tmp_path, "77", 1)
    assert not witness.exists()
    assert (got.ok, got.detail.startswith("unreadable result 77_0_result.pkl")) == (False, True)


@pytest.mark.torch
def test_a_local_run_that_fails_before_its_attempt_starts_is_failed_in_status(
    tmp_path: Path,
) -> None:
    """The model cannot be built: every rank crashes inside the session before rank 0 records
    the attempt's start. status must say FAILED, with the rank and its error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend", "local",
         "--wait", "--runs-dir", str(tmp_path), "train.model=tests.helpers.user_code:Nope"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    [run_dir] = tmp_path.iterdir()
    status = subprocess.run(
        [sys.executable, "-m", "hpc_ddp", "status", str(run_dir), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    [row] = json.loads(status.stdout)["runs"]
    # Restarted once in its process tree, then stopped as a crash loop: the same error again.
    assert (row["state"], row["causes"]) == ("FAILED", ["crash", "no_progress"])
    said = r"rank [01] on [^:]+: ConfigError: train\.model: module 'tests\.helpers\.user_code' "
    assert re.search(said + "has no attribute 'Nope'", row["note"]), row["note"]
    assert "command:" not in row["note"]
