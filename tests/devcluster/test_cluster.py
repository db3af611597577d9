"""The dev cluster: its pure config and hosts edits, and the real two-node cluster itself."""

from __future__ import annotations

import json
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster.conf import (
    HOSTS_MARKER,
    ClusterLayout,
    add_hosts_entry,
    parse_sinfo_states,
    releasable_early,
    remove_hosts_entry,
    render_slurm_conf,
)
from tests.conftest import Cluster

SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_conf_has_two_nodes_three_partitions_and_fast_requeue() -> None:
    conf = render_slurm_conf(ClusterLayout(state_dir=Path("/s"), hostname="box"))
    assert "SlurmctldHost=box(127.0.0.1)" in conf
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [n.split()[0] for n in nodes] == ["NodeName=n1", "NodeName=n2"]
    assert "Port=17001" in nodes[0]
    assert "Port=17002" in nodes[1]
    assert all("CPUs=4" in n for n in nodes)
    assert "cred_expire=10" in conf
    parts = {line.split()[0]: line for line in conf.splitlines() if line.startswith("Partition")}
    assert "Default=YES" in parts["PartitionName=debug"]
    assert "GraceTime=" in parts["PartitionName=low"]
    assert "PriorityTier=10" in parts["PartitionName=high"]
    assert "PreemptMode=OFF" in parts["PartitionName=high"]


@pytest.mark.parametrize(
    "original",
    ["127.0.0.1 localhost\n", "127.0.0.1 localhost", "", "::1 ip6\n# comment\n10.0.0.1 x\n"],
)
def test_hosts_entry_round_trips(original: str) -> None:
    added = add_hosts_entry(original)
    assert "127.0.0.1 n1 n2" in added
    assert HOSTS_MARKER in added
    assert add_hosts_entry(added) == added  # idempotent
    expected = original if not original or original.endswith("\n") else original + "\n"
    assert remove_hosts_entry(added) == expected


def test_remove_hosts_entry_keeps_lines_it_did_not_add() -> None:
    text = "127.0.0.1 n1 # someone else's\n127.0.0.1 n1 n2 # hpc-ddp dev-cluster\n"
    assert remove_hosts_entry(text) == "127.0.0.1 n1 # someone else's\n"


def test_parse_sinfo_states() -> None:
    text = "n1 idle\nn2 mix\nn1 idle\n\ngarbage line here\n"
    assert parse_sinfo_states(text) == {"n1": "idle", "n2": "mix"}


REQUEUED_AT = "2026-11-23T18:01:00"  # SubmitTime after a requeue (the controller's local time)


@pytest.mark.parametrize(
    ("state", "reason", "after_s", "releasable"),
    [
        ("PENDING", "BeginTime", 0.0, False),  # the second of the requeue: the start is killed
        ("PENDING", "BeginTime", 1.9, False),
        ("PENDING", "BeginTime", 2.0, True),
        ("PENDING", "BeginTime", 30.0, True),
        ("PENDING", "Priority", 30.0, False),  # not held by a requeue: nothing to release
        ("RUNNING", "None", 30.0, False),
    ],
)
def test_a_requeued_job_is_released_early_only_after_the_settle_time(
    state: str, reason: str, after_s: float, releasable: bool
) -> None:
    fields = {"JobState": state, "Reason": reason, "SubmitTime": REQUEUED_AT}
    requeued = datetime.fromisoformat(REQUEUED_AT).timestamp()
    assert releasable_early(fields, requeued + after_s) is releasable


@pytest.mark.slurm
def test_two_task_job_runs_across_both_nodes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/bash
            #SBATCH --nodes=2 --ntasks-per-node=1 --output={tmp_path}/batch.out
            srun bash -c 'echo "$SLURM_PROCID $SLURM_NODEID $SLURMD_NODENAME" \\
                > {tmp_path}/task-$SLURM_PROCID.txt'
            """
        )
    )
    job = slurm_cluster.run("sbatch", "--parsable", str(script)).stdout.strip()
    slurm_cluster.wait_gone(job)
    seen = sorted((tmp_path / f"task-{r}.txt").read_text().split() for r in (0, 1))
    assert seen == [["0", "0", "n1"], ["1", "1", "n2"]]


@pytest.mark.slurm
@pytest.mark.torch
def test_gloo_all_reduce_across_both_nodes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/bash
            #SBATCH --nodes=2 --ntasks-per-node=1 --output={tmp_path}/batch.out
            export OMP_NUM_THREADS=1
            srun {sys.executable} {SCRIPTS / "allreduce.py"} {tmp_path}
            """
        )
    )
    job = slurm_cluster.run("sbatch", "--parsable", str(script)).stdout.strip()
    slurm_cluster.wait_gone(job, timeout_s=120)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["node"] for r in results] == ["n1", "n2"]
    assert all(r["master"] == "n1" for r in results)
    assert [r["sum"] for r in results] == [3.0, 3.0]  # 1 + 2 from ranks 0 and 1


@pytest.mark.slurm
def test_up_is_idempotent_and_down_leaves_nothing(slurm_cluster: Cluster) -> None:
    again = devcluster.up(slurm_cluster.state_dir, slurm_cluster.env)
    assert again.started == ()
    assert again.seconds < 5

    layout = devcluster.layout_for(slurm_cluster.state_dir)
    pids = {n: devcluster.pid_alive(p) for n, p in layout.pid_files().items()}
    assert all(pids.values())
    stopped = devcluster.down(slurm_cluster.state_dir)
    try:
        assert sorted(stopped) == sorted(pids)
        assert all(devcluster.pid_alive(p) is None for p in layout.pid_files().values())
        hosts = devcluster.HOSTS_FILE.read_text()
        assert HOSTS_MARKER not in hosts
        assert hosts == remove_hosts_entry(slurm_cluster.hosts_before)
    finally:
        back = devcluster.up(slurm_cluster.state_dir, slurm_cluster.env)
    assert sorted(back.started) == sorted(pids)
    assert HOSTS_MARKER in devcluster.HOSTS_FILE.read_text()
