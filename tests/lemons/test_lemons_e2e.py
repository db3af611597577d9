"""On the dev Slurm cluster: a node a previous run lost is left out of the next job
(``#SBATCH --exclude``, Slurm's ``ExcNodeList``), and the job runs on the others."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, where
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

QUICK = ["slurm.nodes=1", "train.epochs=1", "train.log_every=1"]


def test_a_node_lost_by_an_earlier_run_is_excluded_from_the_next_job(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    # As the supervisor of an earlier run records a lost node (Supervisor._remember).
    earlier = str(tmp_path / "earlier")
    lost = LemonEntry("n1", "lost", "node_fail", "srun: Node failure on n1", "earlier", earlier,
                      "7", time.time() - 60)  # fmt: skip
    add_entry(where(), lost)
    shown = e2e.hpc(slurm_cluster, "submit", "jobs/quickstart.yaml", *QUICK, "--dry-run").stdout
    assert "#SBATCH --exclude=n1\n" in shown
    assert "# lemon node n1: excluding (lost in run earlier (job 7)" in shown
    job = e2e.submit(slurm_cluster, tmp_path / "runs", "jobs/quickstart.yaml", *QUICK)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExcNodeList"] == "n1"
    assert fields["NodeList"] == "n2"


def test_without_a_record_the_job_may_use_every_node(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path / "runs", "jobs/quickstart.yaml", *QUICK)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExcNodeList"] == "(null)"
