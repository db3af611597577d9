"""``submit --wait`` on Slurm ends with the words ``status`` would print: the state, the rank
srun saw fail first, and why (the ledger's crash), exit 1 unless the run finished.

The unit test answers for Slurm with the shipped :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`;
the test marked ``slurm`` runs a two-task job whose rank 1 raises on the dev cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from hpc_ddp.cli.main import main
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import RunPaths
from hpc_ddp.rundir.manifest import Manifest, write_manifest
from hpc_ddp.submission.wait import wait_for_jobs
from tests import e2e_util as e2e
from tests.conftest import Cluster
from tests.ledgers import record_end, record_start

CRASH = "rank 1 on n2: RuntimeError: injected crash at step 8"
BATCH_LOG = (
    "srun: error: n2: task 1: Exited with exit code 1\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=5.0\n"
    "srun: error: n1: task 0: Terminated\n"
)


def crashed_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "crashy"
    paths = RunPaths(run_dir)
    paths.logs.mkdir(parents=True)
    write_manifest(paths, Manifest("crashy", "slurm", "5", "2026-01-01T12:00:00+00:00",
                                   ["sbatch"], "crashy.yaml", str(run_dir)))  # fmt: skip
    record_start(paths.ledger, attempt=0, job_id="5", job_ref="5", nodelist="n[1-2]",
                 world_size=2, resumed_from_step=None, checkpoint=None)  # fmt: skip
    record_end(paths.ledger, attempt=0, cause=EndCause.CRASH, steps_done=8,
               checkpoint="step-00000005.pt", requeue_requested=False, message=CRASH)  # fmt: skip
    (paths.logs / "batch-5.err").write_text(BATCH_LOG)
    return run_dir


def test_wait_prints_the_failed_rank_and_the_error_as_status_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = crashed_run(tmp_path)
    slurm = FakeSlurm(accounting=False)
    slurm.add_job("5", state=JobState.RUNNING, command=str(run_dir / "job.sbatch"))

    def finish(seconds: float) -> None:
        del seconds
        slurm.jobs["5"].state = JobState.FAILED  # the first poll saw it running

    assert wait_for_jobs(Registry(slurm.client()), ["5"], run_dirs=[run_dir], sleep=finish) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "finished: 5 FAILED"
    assert err[1] == f"{run_dir}: failed first: rank 1 on n2: Exited with exit code 1 (srun, " + (
        "in the batch log: hpc-ddp logs RUN --batch)"
    )
    assert err[2].startswith(f"{run_dir}: attempt 0 ended 'crash' at step 8 ({CRASH}")
    # The same lines under status's table.
    assert main(["status", str(run_dir)], backends=Registry(slurm.client())) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-2:] == err[1:]


def test_a_completed_run_prints_no_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = crashed_run(tmp_path)
    record_start(RunPaths(run_dir).ledger, attempt=1, job_id="5", job_ref="5", nodelist="n1",
                 world_size=2, resumed_from_step=5, checkpoint="step-00000005.pt")  # fmt: skip
    record_end(RunPaths(run_dir).ledger, attempt=1, cause=EndCause.FINISHED, steps_done=20,
               checkpoint=None, requeue_requested=False)  # fmt: skip
    (RunPaths(run_dir).logs / "batch-5.err").write_text("")
    slurm = FakeSlurm()
    slurm.add_job("5", state=JobState.COMPLETED, command=str(run_dir / "job.sbatch"))
    assert (
        wait_for_jobs(Registry(slurm.client()), ["5"], run_dirs=[run_dir], sleep=lambda s: None)
        == 0
    )
    assert capsys.readouterr().err == "finished: 5 COMPLETED\n"


@pytest.mark.slurm
@pytest.mark.torch
def test_submit_wait_names_the_rank_that_crashed(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job_file = e2e.crashy_job(tmp_path, 20, 5, 8, on_crash=False)
    done = e2e.hpc(slurm_cluster, "submit", str(job_file), "--wait", "--runs-dir",
                   str(tmp_path / "runs"), "--json", check=False, timeout_s=300)  # fmt: skip
    assert done.returncode == 1, done.stderr
    job = json.loads(done.stdout)["job_id"]
    err = done.stderr.splitlines()
    assert f"finished: {job} FAILED" in err
    reasons = [line for line in err if line.startswith(json.loads(done.stdout)["run_dir"])]
    assert any(": failed first: rank 1 on " in line for line in reasons), done.stderr
    assert any("(rank 1 on " in line and "injected crash at step 8" in line for line in reasons)


def test_ctrl_c_while_waiting_on_slurm_stops_the_wait_not_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C on `submit --wait` of a Slurm job: exit 130 and a line that says the job goes on
    and how to stop it, no traceback (the job is Slurm's; `hpc-ddp cancel` stops it)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from hpc_ddp.submission import wait

    def interrupted(*args: object, **kwargs: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(wait, "wait_for_jobs", interrupted)
    launched = SimpleNamespace(local=None, job_id="5", paths=RunPaths(tmp_path))
    assert wait.wait_for(cast("Any", launched), Registry(FakeSlurm().client())) == 130
    said = capsys.readouterr().err.strip()
    assert said == (
        f"stopped waiting; job 5 goes on (`hpc-ddp status {tmp_path}`; "
        f"`hpc-ddp cancel {tmp_path}` stops it)"
    )
