"""``hpc-ddp cancel`` signals only what is provably the target's, and says what it found
(issue 20, items 3 and 6).

* A job id in a run directory is only a claim: ``cp -r runs/a runs/b`` gives ``b`` the
  manifest of ``a``'s live job. squeue says which script a job runs; one that is not a script
  of the target directory is not cancelled (``not_this_run``, exit 2).
* A job that already ended, or that Slurm does not know, is not cancelled either, and is said
  to be so (``scancel`` returns 0 for both): ``already_finished`` with its state, ``unknown``.

Over :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm` here; on the dev cluster at the end (a real
copied run beside its live original, and a real finished job).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.backends.registry import Registry
from hpc_ddp.backends.slurm.fake import FakeSlurm
from tests import e2e_util as e2e
from tests.cli.test_status import command_job
from tests.cli.test_targets import write_run, write_sweep
from tests.conftest import Cluster
from tests.helpers.cli import run_cli


def cancel(slurm: FakeSlurm, *targets: str) -> tuple[int, list[dict[str, Any]]]:
    """``hpc-ddp cancel TARGETS --json``: (exit code, one dict per target)."""
    code, out = run_cli("cancel", *targets, "--json", backends=Registry(slurm.client()))
    shown = json.loads(out)
    assert shown["schema"] == "hpc-ddp.cancel/1"
    return code, shown["results"]


def _status(slurm: FakeSlurm, *runs: Path) -> dict[str, dict[str, Any]]:
    """``hpc-ddp status RUNS --json``, by run directory name."""
    _, out = run_cli("status", *map(str, runs), "--json", backends=Registry(slurm.client()))
    return {Path(row["run_dir"]).name: row for row in json.loads(out)["runs"]}


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"])
def test_a_job_that_already_ended_is_not_cancelled_and_its_state_is_said(
    tmp_path: Path, state: str
) -> None:
    run = write_run(tmp_path, "a", job_id="77")
    slurm = FakeSlurm()
    slurm.add_job("77", state=JobState(state), command=str(run / "job.sbatch"))
    code, [shown] = cancel(slurm, str(run))
    assert code == 0
    assert shown["outcome"] == "already_finished"
    assert shown["message"] == (
        f"slurm job 77 already finished ({state}): nothing was cancelled ({run})"
    )
    assert slurm.commands("scancel") == []
    assert slurm.jobs["77"].state is JobState(state)  # its verdict is left as it was


def test_a_job_the_queue_forgot_is_looked_up_in_accounting(tmp_path: Path) -> None:
    run = write_run(tmp_path, "a", job_id="77")
    slurm = FakeSlurm()
    slurm.add_job("77", state=JobState.FAILED, in_queue=False)
    code, [shown] = cancel(slurm, str(run))
    assert (code, shown["outcome"]) == (0, "already_finished")
    assert "slurm job 77 already finished (FAILED)" in shown["message"]
    assert slurm.commands("scancel") == []


@pytest.mark.parametrize(
    ("accounting", "why"),
    [(True, "sacct has no record of it"), (False, "no accounting to ask")],
)
def test_a_job_slurm_does_not_know_is_said_to_be_unknown(
    tmp_path: Path, accounting: bool, why: str
) -> None:
    run = write_run(tmp_path, "a", job_id="424242")
    slurm = FakeSlurm(accounting=accounting)
    code, [shown] = cancel(slurm, str(run))
    assert (code, shown["outcome"]) == (0, "unknown")
    assert shown["message"] == (
        f"slurm job 424242 is unknown to Slurm (not in its queue; {why}): nothing was "
        f"cancelled ({run})"
    )
    assert slurm.commands("scancel") == []


def test_a_copied_run_directory_cancels_nothing_of_the_original(tmp_path: Path) -> None:
    original = write_run(tmp_path, "a", job_id="77")
    copy = tmp_path / "b"
    shutil.copytree(original, copy)  # `cp -r runs/a runs/b`: b's manifest names a's job
    slurm = FakeSlurm()
    job = slurm.add_job("77", state=JobState.RUNNING, command=str(original / "job.sbatch"))
    code, [shown] = cancel(slurm, str(copy))
    assert code == 2
    assert shown["outcome"] == "not_this_run"
    assert shown["message"].startswith(
        f"{copy}: slurm job 77 is not this run's: it runs {original / 'job.sbatch'}, not a "
        f"script of {copy}; nothing was cancelled. HINT: a copied run directory (cp -r) keeps "
        "the original's manifest.json"
    )
    assert slurm.commands("scancel") == []
    assert job.state is JobState.RUNNING
    # status agrees: the original's job is not the copy's (so the copy may be resumed).
    rows = _status(slurm, original, copy)
    assert rows["a"]["state"] == "RUNNING"
    assert rows["b"]["state"] == "GONE?"
    assert f"names another job (script {original / 'job.sbatch'})" in rows["b"]["note"]
    assert "this run directory is a copy of that job's" in rows["b"]["note"]
    # Both at once: the original's job is cancelled, the copy still refused (exit 2).
    code, shown_both = cancel(slurm, str(original), str(copy))
    assert code == 2
    assert [s["outcome"] for s in shown_both] == ["cancelled", "not_this_run"]
    assert slurm.commands("scancel") == ["scancel 77"]


def test_a_job_running_no_script_of_the_run_is_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path, "a", job_id="77")
    slurm = FakeSlurm()
    slurm.add_job("77", state=JobState.RUNNING)  # `sbatch --wrap`: squeue shows no script
    code, [shown] = cancel(slurm, str(run))
    assert (code, shown["outcome"]) == (2, "not_this_run")
    assert "it does not say which script it runs" in shown["message"]
    assert slurm.commands("scancel") == []


def test_a_run_reached_through_a_symlink_is_the_same_run(tmp_path: Path) -> None:
    real = write_run(tmp_path / "real", "a", job_id="77")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    slurm = FakeSlurm()
    slurm.add_job("77", state=JobState.RUNNING, command=str(real / "job.sbatch"))
    code, [shown] = cancel(slurm, str(tmp_path / "link" / "a"))
    assert (code, shown["outcome"]) == (0, "cancelled")
    assert slurm.commands("scancel") == ["scancel 77"]


def test_a_sweep_task_pending_in_its_arrays_range_is_cancelled_alone(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "runs")
    slurm = FakeSlurm()
    script = str(sweep / "job.sbatch")
    slurm.add_job("1001", state=JobState.PENDING, array_job_id="1001", array_task_id="0-2",
                  command=script)  # fmt: skip
    code, [shown] = cancel(slurm, str(sweep / "tasks" / "0"))
    assert (code, shown["outcome"]) == (0, "cancelled")
    assert slurm.commands("scancel") == ["scancel 1001_0"]


def test_a_sweep_cancels_its_live_arrays_and_says_which_had_ended(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "runs")
    slurm = FakeSlurm()
    for job, state in (("1001", JobState.COMPLETED), ("1002", JobState.RUNNING)):
        slurm.add_job(job, state=state, command=str(sweep / "job.sbatch"))
    code, [shown] = cancel(slurm, str(sweep))  # 1003 is known to no one
    assert (code, shown["outcome"]) == (0, "cancelled")
    assert slurm.commands("scancel") == ["scancel 1002"]
    assert shown["message"] == (
        f"cancelled slurm job array 1002 ({sweep}); slurm job array 1001 already finished "
        "(COMPLETED); slurm job array 1003 is unknown to Slurm (not in its queue; sacct has no "
        "record of it)"
    )


def test_a_failing_sacct_does_not_keep_a_live_array_from_being_cancelled(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "runs")
    slurm = FakeSlurm()
    for job in ("1001", "1002"):
        slurm.add_job(job, state=JobState.RUNNING, command=str(sweep / "job.sbatch"))
    slurm.fail("sacct", "sacct: error: slurmdbd: connection refused")
    code, [shown] = cancel(slurm, str(sweep))  # 1003: not in the queue, and sacct fails
    assert (code, shown["outcome"]) == (0, "cancelled")
    assert slurm.commands("scancel") == ["scancel 1001", "scancel 1002"]
    assert (
        "slurm job array 1003 is unknown to Slurm (not in its queue; sacct could not be "
        in (shown["message"])
    )


# --- on the dev cluster ----------------------------------------------------------------------


@pytest.mark.slurm
def test_real_cancel_of_a_copy_spares_the_original_and_says_what_ended(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """``cp -r`` a live run: cancelling the copy signals nothing and says why, the original
    runs on. Cancelling the original again once it ended says so (its state stays CANCELLED),
    and a run whose job Slurm never had is said to be unknown."""
    runs = tmp_path / "runs"
    sleeper = command_job(tmp_path, "sleeper", "import time\ntime.sleep(300)\n")
    job = e2e.submit(slurm_cluster, runs, str(sleeper))
    copy = runs / "copy"
    try:
        e2e.wait_state(slurm_cluster, job.job_id, ["RUNNING"], timeout_s=240)
        shutil.copytree(job.run_dir, copy, ignore=shutil.ignore_patterns("submit.lock"))
        done = e2e.hpc(slurm_cluster, "cancel", str(copy), check=False)
        assert done.returncode == 2, done.stdout
        assert f"{copy}: slurm job {job.job_id} is not this run's: it runs " in done.stderr
        assert f"{job.run_dir / 'job.sbatch'}, not a script of {copy.resolve()}" in done.stderr
        assert "nothing was cancelled. HINT:" in done.stderr
        assert e2e.job_fields(slurm_cluster, job.job_id)["JobState"] == "RUNNING"
        assert e2e.status(slurm_cluster, job.run_dir)["state"] == "RUNNING"
        assert e2e.status(slurm_cluster, copy)["state"] != "RUNNING"  # not its job
    finally:
        e2e.hpc(slurm_cluster, "cancel", str(job.run_dir), check=False)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "CANCELLED"
    before = e2e.status(slurm_cluster, job.run_dir)
    [again] = json.loads(e2e.hpc(slurm_cluster, "cancel", str(job.run_dir), "--json").stdout)[
        "results"
    ]
    assert again["outcome"] == "already_finished"
    assert (
        f"slurm job {job.job_id} already finished (CANCELLED): nothing was cancelled"
        in (again["message"])
    )
    after = e2e.status(slurm_cluster, job.run_dir)
    assert (
        (after["state"], after["note"])
        == (before["state"], before["note"])
        == (
            "CANCELLED",
            before["note"],
        )
    )
    never = write_run(runs, "never", job_id="999999")
    [unknown] = json.loads(e2e.hpc(slurm_cluster, "cancel", str(never), "--json").stdout)["results"]
    assert unknown["outcome"] == "unknown"
    assert "slurm job 999999 is unknown to Slurm (not in its queue; " in unknown["message"]
