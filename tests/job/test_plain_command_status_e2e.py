"""How ``status`` sees a ``command:`` program that opens no session, on the real dev cluster
(issue 39, Low): its attempt while it runs, a cancel, and a requeue. The program is a few lines
of Python without a signal handler: Slurm's SIGTERM (a cancel, or the one ``hpc-ddp run``
turns the warning into) ends it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = pytest.mark.slurm

PROGRAM = """\
import os, pathlib, sys, time
here = pathlib.Path(sys.argv[1])
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
(here / f"started.{os.environ['RANK']}.{restart}").touch()
while restart == "0":  # the first attempt runs until a signal ends it; a requeue finishes
    time.sleep(0.2)
"""


def _submit(cluster: Cluster, tmp_path: Path) -> e2e.Submitted:
    (tmp_path / "plain.py").write_text(PROGRAM)
    config = tmp_path / "job.yaml"
    config.write_text(
        "name: plainstatus\n"
        f"command: {json.dumps(['python', str(tmp_path / 'plain.py'), str(tmp_path)])}\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:05:00'}\n"
        "requeue: {max_requeues: 1}\n"
    )
    job = e2e.submit(cluster, tmp_path / "runs", str(config))
    e2e.wait_for(
        "both ranks' programs",
        lambda: all((tmp_path / f"started.{r}.0").exists() for r in (0, 1)),
        timeout_s=120,
    )
    return job


def test_a_plain_programs_running_attempt_is_shown_and_its_cancel_recorded(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = _submit(slurm_cluster, tmp_path)
    row = e2e.status(slurm_cluster, job.run_dir)
    assert (row["state"], row["attempts"], row["causes"]) == ("RUNNING", 1, ["running"]), row
    [running] = row["attempt_list"]
    assert (running["world_size"], running["job_id"]) == (2, job.job_id), running
    e2e.hpc(slurm_cluster, "cancel", str(job.run_dir))  # scancel: SIGTERM to every process
    slurm_cluster.wait_gone(job.job_id, timeout_s=120)
    [attempt] = e2e.ledger(job.run_dir)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CANCELLED, False), attempt
    row = e2e.status(slurm_cluster, job.run_dir)
    assert (row["state"], row["causes"]) == ("CANCELLED", ["cancelled"]), row


def test_a_requeued_plain_attempt_says_requeue_and_elapsed_spans_both(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = _submit(slurm_cluster, tmp_path)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")  # the warning, to every process
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=180)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), fields
    first, last = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True), first
    assert last.cause is EndCause.FINISHED, last
    shown = e2e.hpc(slurm_cluster, "status", str(job.run_dir), "--json", "--goodput").stdout
    [row] = json.loads(shown)["runs"]
    assert [a["next"] for a in row["attempt_list"]] == ["requeue", "stop"], row["attempt_list"]
    assert row["elapsed_s"] >= row["goodput"]["wall_s"] - 1, row
    assert row["elapsed_s"] >= (last.ended or 0) - first.started - 1, row  # not the last alone
