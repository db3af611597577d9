"""No local rank outlives its run unseen (:mod:`hpc_ddp.job.local_task`: a task dies with its
controller): real local runs whose controller is killed outright.

submitit's controller is the local job's only process that ``cancel`` used to know. Killed
with SIGKILL it forwards nothing, and its ranks (reparented to pid 1) used to train on while
``status`` said the run had exited and ``resume`` would start a second job in the same run
directory. Now the ranks ask the kernel for a SIGTERM when their controller dies and stop as
a cancel stops them (agreed step, checkpoint); and each records its identity in
``RUN_DIR/local-ranks/``, so that with that signal switched off (the test-only
``HPC_DDP_TEST_NO_PDEATHSIG``) ``status`` and ``resume`` still see them and ``cancel`` stops them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.backends.local.process import (
    cancel_local,
    identify,
    live_controller,
    live_ranks,
    read_rank_identities,
    signal_if_same,
)
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import NO_PDEATHSIG_ENV
from hpc_ddp.rundir.manifest import read_manifest
from tests import e2e_util as e2e
from tests.conftest import REPO

pytestmark = pytest.mark.torch

LONG = ["train.epochs=300", "train.log_every=1", "train.checkpoint_every=5"]
"""About 10,000 steps: minutes of training, far more than any test here waits for."""


def local_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {**env, **extra}


def hpc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_ddp", *args],
        cwd=REPO, env=env or local_env(), capture_output=True, text=True, timeout=180,
        check=False,
    )  # fmt: skip


@pytest.fixture
def started(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A local run training (``request.param``: extra environment), at a checkpoint; its
    processes are killed at the end if a test left any running."""
    env = local_env(**getattr(request, "param", {}))
    out, err = tmp_path / "submit.out", tmp_path / "submit.err"
    # Files, not pipes: the controller inherits them and would hold a pipe open for its life.
    with out.open("w") as stdout, err.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "hpc_ddp", "submit", "jobs/quickstart.yaml", "--backend",
             "local", "--json", "--runs-dir", str(tmp_path / "runs"), *LONG],
            cwd=REPO, env=env, stdout=stdout, stderr=stderr, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, err.read_text()
    run_dir = Path(json.loads(out.read_text())["run_dir"])
    try:
        e2e.wait_checkpoint(run_dir, 10, timeout_s=180)
        assert sorted(read_rank_identities(run_dir)) == [0, 1]
        yield run_dir
    finally:
        controller = live_controller(run_dir, read_manifest(run_dir).job_id)
        for ident in [*live_ranks(run_dir).values(), *([controller] if controller else [])]:
            signal_if_same(ident, signal.SIGKILL)


def kill_controller(run_dir: Path) -> None:
    controller = live_controller(run_dir, read_manifest(run_dir).job_id)
    assert controller is not None
    assert signal_if_same(controller, signal.SIGKILL)
    # A zombie (nobody may reap it here) no longer matches: its command line is gone.
    e2e.wait_for("the controller gone", lambda: identify(controller.pid) != controller)


def assert_stopped_with_a_checkpoint(run_dir: Path) -> None:
    """The ranks stopped as a cancel stops them: cancelled at an agreed step, saved there."""
    [attempt] = e2e.ledger(run_dir)
    assert attempt.cause is EndCause.CANCELLED, attempt
    assert attempt.steps_done is not None
    assert attempt.steps_done >= 10
    assert attempt.checkpoint == f"step-{attempt.steps_done:08d}.pt"
    assert (run_dir / "checkpoints" / attempt.checkpoint).is_file()


def status_row(run_dir: Path) -> dict[str, object]:
    done = hpc("status", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["runs"]
    result: dict[str, object] = row
    return result


def test_ranks_stop_and_save_when_their_controller_is_killed(started: Path) -> None:
    run_dir = started
    kill_controller(run_dir)
    e2e.wait_for("the ranks stopped", lambda: not live_ranks(run_dir), timeout_s=60)
    assert_stopped_with_a_checkpoint(run_dir)
    row = status_row(run_dir)
    assert (row["state"], row["causes"]) == ("CANCELLED", ["cancelled"])
    again = hpc("resume", str(run_dir), "--dry-run")
    assert again.returncode == 0, again.stderr
    assert "# backend: local; would start 2 process(es)" in again.stdout
    assert "sbatch" not in again.stdout


@pytest.mark.parametrize("started", [{NO_PDEATHSIG_ENV: "1"}], indirect=True)
def test_ranks_that_outlive_their_controller_are_live_until_cancel_stops_them(
    started: Path,
) -> None:
    run_dir = started
    job_id = read_manifest(run_dir).job_id
    kill_controller(run_dir)
    assert sorted(live_ranks(run_dir)) == [0, 1]  # orphaned, training on
    row = status_row(run_dir)
    assert row["state"] == "RUNNING"
    assert "the local controller has exited, but rank 0, 1 still run" in str(row["note"])
    refused = hpc("resume", str(run_dir), "--dry-run", "--force")
    assert refused.returncode == 2
    assert "two jobs must never write one run directory" in refused.stderr
    assert sorted(live_ranks(run_dir)) == [0, 1]  # they ran on through all of that
    said = hpc("cancel", str(run_dir))
    assert said.returncode == 0, said.stderr
    assert "still running: rank 0, 1; every process ended in " in said.stdout, said.stdout
    assert not live_ranks(run_dir)  # cancel returned once they had stopped
    assert_stopped_with_a_checkpoint(run_dir)
    assert status_row(run_dir)["state"] == "CANCELLED"
    assert cancel_local(run_dir, job_id).message.endswith("already ended; nothing was signalled")
    assert hpc("resume", str(run_dir), "--dry-run").returncode == 0
