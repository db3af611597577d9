"""On the dev Slurm cluster: a node a previous run lost is left out of the next job
(``#SBATCH --exclude``, Slurm's ``ExcNodeList``), and the job runs on the others."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.lemons.record import LemonEntry
from hpc_ddp.lemons.store import add_entry, where
from tests import e2e_util as e2e
from tests.conftest import Cluster
from tests.fault.test_faults_e2e import _KILLED, _lose_rank_1s_node, job_file, three_nodes

__all__ = ["three_nodes"]  # the fixture, shared with the fault tests

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


def test_a_node_a_run_lost_is_recorded_and_left_out_of_the_next_job(
    three_nodes: Cluster, tmp_path: Path
) -> None:
    """A run with a spare node loses rank 1's node: its supervisor records it (``hpc-ddp
    nodes``); the node comes back, and the next job asks Slurm to leave it out and runs on the
    two others."""
    config = job_file(tmp_path, "")
    config.write_text(config.read_text().replace("nodes: 2,", "nodes: 2, spare_nodes: 1,"))
    first = e2e.submit(three_nodes, tmp_path / "runs", str(config))
    _, node, others = _lose_rank_1s_node(three_nodes, first)
    fields = e2e.wait_done(three_nodes, first.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    listed = json.loads(e2e.hpc(three_nodes, "nodes", "--json").stdout)["nodes"]
    assert [(r["node"], r["lemon"], r["last_kind"], r["last_job_id"]) for r in listed] == [
        (node, True, "lost", first.job_id)
    ]
    devcluster.revive_node(three_nodes.state_dir, node, three_nodes.env, 120)
    _KILLED.remove(node)
    second = e2e.submit(three_nodes, tmp_path / "runs", str(job_file(tmp_path / "next")))
    fields = e2e.wait_done(three_nodes, second.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExcNodeList"] == node
    assert e2e.ledger(second.run_dir)[0].nodelist.split(",") == others
