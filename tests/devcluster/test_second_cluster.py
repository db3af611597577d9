"""A second dev cluster beside the default one (three nodes, accounting, a short SlurmdTimeout),
and what a lost node does to a job there: :func:`~hpc_ddp.devcluster.cluster.kill_node` takes a
node away as a crash would, :func:`~hpc_ddp.devcluster.cluster.revive_node` brings it back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster.conf import JOB_IDS_PER_SLOT, hosts_owners
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = pytest.mark.slurm

DOWN_WITHIN_S = 30.0
"""Seen: 8-10 s with SlurmdTimeout=5 (MessageTimeout=2); Slurm's defaults take over 5 minutes."""


def _sbatch(cluster: Cluster, tmp_path: Path, options: str, body: str) -> str:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH {options} --output={tmp_path}/batch.out\n{body}\n")
    return cluster.run("sbatch", "--parsable", str(script)).stdout.strip()


def _wait_started(tmp_path: Path, ntasks: int, timeout_s: float = 60.0) -> None:
    e2e.wait_for(
        f"{ntasks} tasks started",
        lambda: len(list(tmp_path.glob("started-*"))) == ntasks,
        timeout_s=timeout_s,
    )


@pytest.fixture
def lost_n3(accounting_cluster: Cluster) -> Iterator[Cluster]:
    """The accounting cluster, with ``n3`` brought back (and every job cancelled) afterwards."""
    yield accounting_cluster
    accounting_cluster.run("scancel", "--user=root", check=False)
    devcluster.revive_node(accounting_cluster.state_dir, "n3", accounting_cluster.env)


def _kill_and_time_down(cluster: Cluster, node: str) -> float:
    layout = devcluster.layout_for(cluster.state_dir)
    t0 = time.monotonic()
    assert devcluster.kill_node(cluster.state_dir, node)
    state = e2e.wait_for(
        f"{node} DOWN",
        lambda: "DOWN" in (s := devcluster.node_state(layout, node)) and s,
        timeout_s=DOWN_WITHIN_S,
        poll_s=0.2,
    )
    assert "NOT_RESPONDING" in state
    return time.monotonic() - t0


def test_two_clusters_run_side_by_side(
    slurm_cluster: Cluster, accounting_cluster: Cluster, tmp_path: Path
) -> None:
    default = devcluster.layout_for(slurm_cluster.state_dir)
    second = devcluster.layout_for(accounting_cluster.state_dir)
    assert default.ctld_port != second.ctld_port
    assert second.node_names == ("n1", "n2", "n3")
    owners = hosts_owners(devcluster.HOSTS_FILE.read_text())
    assert owners[str(slurm_cluster.state_dir)] == default.node_names
    assert owners[str(accounting_cluster.state_dir)] == second.node_names

    # A three-node job there, while the default cluster runs: every node name resolves.
    job = _sbatch(
        accounting_cluster,
        tmp_path,
        "-N3 --ntasks-per-node=1",
        f"srun bash -c 'getent hosts n1 n2 n3 > {tmp_path}/hosts-$SLURMD_NODENAME'",
    )
    assert int(job) // JOB_IDS_PER_SLOT == second.spec.slot  # its own range of job ids
    accounting_cluster.wait_gone(job)
    for node in second.node_names:
        lines = (tmp_path / f"hosts-{node}").read_text().splitlines()
        assert [line.split()[0] for line in lines] == ["127.0.0.1"] * 3


def test_a_lost_node_is_down_in_seconds_and_its_job_requeued(
    lost_n3: Cluster, tmp_path: Path
) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    job = _sbatch(
        lost_n3,
        tmp_path,
        "-N3 --ntasks-per-node=1",
        f"srun bash -c 'touch {tmp_path}/started-$SLURM_PROCID; exec sleep 300'",
    )
    _wait_started(tmp_path, 3)
    took = _kill_and_time_down(lost_n3, "n3")
    print(f"n3 DOWN {took:.1f} s after its slurmd died")

    # Slurm ends the run (NODE_FAIL) and, JobRequeue=1, queues the job again: it waits for a
    # third node. sacct keeps the failed run as its own record.
    fields = e2e.wait_state(lost_n3, job, ["PENDING"], release=False, timeout_s=30)
    assert fields["Restarts"] == "1"
    runs = e2e.wait_for(
        "a NODE_FAIL record in sacct",
        lambda: (r := _sacct_runs(lost_n3, job, since)) and r[0][0] == "NODE_FAIL" and r,
        timeout_s=30,
        poll_s=0.5,
    )
    assert runs[0] == ("NODE_FAIL", "n[1-3]")
    assert "Node failure on n3" in (tmp_path / "batch.out").read_text()


def test_with_no_kill_the_job_loses_only_the_node(lost_n3: Cluster, tmp_path: Path) -> None:
    # The step dies with the node, but the allocation goes on without it: a new step can run
    # on the nodes left, as hpc-ddp's in-allocation recovery does.
    job = _sbatch(
        lost_n3,
        tmp_path,
        "-N3 --ntasks-per-node=1 --no-kill",
        f"srun bash -c 'touch {tmp_path}/started-$SLURM_PROCID; exec sleep 300'\n"
        f"echo $? > {tmp_path}/first-step.rc\n"
        f'scontrol show job -o "$SLURM_JOB_ID" > {tmp_path}/after.txt\n'
        f"srun -N2 -n2 bash -c 'echo $SLURMD_NODENAME > {tmp_path}/again-$SLURM_PROCID'",
    )
    _wait_started(tmp_path, 3)
    _kill_and_time_down(lost_n3, "n3")
    fields = e2e.wait_done(lost_n3, job, timeout_s=60)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0")
    assert (tmp_path / "first-step.rc").read_text().strip() == "137"  # step force-terminated
    after = (tmp_path / "after.txt").read_text()
    assert " NodeList=n[1-2] " in after
    assert " NumNodes=2 " in after
    again = sorted((tmp_path / f"again-{r}").read_text().strip() for r in (0, 1))
    assert again == ["n1", "n2"]


def _sacct_runs(cluster: Cluster, job: str, since: str) -> list[tuple[str, str]]:
    """Every run of ``job`` submitted at ``since`` or later that sacct recorded (``-X -D``):
    (state, nodes), oldest first. The database outlives the controller's state, so the same
    job id may also name jobs of earlier test sessions; those were submitted before."""
    out = cluster.run(
        "sacct", "-X", "-D", "-n", "-P", "-j", job, "--format=Submit,State,NodeList", check=False
    ).stdout
    runs = []
    for line in out.splitlines():
        submitted, state, nodes = line.split("|")
        if submitted >= since:  # ISO times compare as text
            runs.append((state, nodes))
    return runs


def test_a_controller_restart_keeps_the_clusters_names_in_etc_hosts(
    accounting_cluster: Cluster, tmp_path: Path
) -> None:
    """``forget_jobs`` restarts the controller. Another cluster that goes down (or comes up)
    meanwhile keeps only the names of clusters whose controller runs: it must not find this
    one's stopped, and drop its names for the rest of the suite."""
    me = str(accounting_cluster.state_dir)
    stop = threading.Event()

    def churn() -> None:  # a cluster of nothing, taken down over and over
        while not stop.is_set():
            devcluster.down(tmp_path / "elsewhere")
            time.sleep(0.02)

    other = threading.Thread(target=churn)
    other.start()
    try:
        devcluster.forget_jobs(accounting_cluster.state_dir, accounting_cluster.env)
    finally:
        stop.set()
        other.join(timeout=30)
    owners = hosts_owners(devcluster.HOSTS_FILE.read_text())
    assert owners.get(me) == devcluster.layout_for(accounting_cluster.state_dir).node_names
