"""The real default dev cluster: jobs across its nodes, its fake GPUs, and up/down."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from hpc_ddp.cli.main import main
from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.devcluster.conf import hosts_owners
from tests.conftest import Cluster

SCRIPTS = Path(__file__).parents[1] / "scripts"

_SHOW_TASK = (
    'echo "$SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID ${{CUDA_VISIBLE_DEVICES-unset}}" '
    "> {out}/task-$SLURM_PROCID.txt"
)


def _run_tasks(cluster: Cluster, tmp_path: Path, sbatch: str, ntasks: int) -> list[list[str]]:
    """Run a batch job whose step's tasks each write ``rank node localid CUDA_VISIBLE_DEVICES``."""
    script = tmp_path / "job.sh"
    show = _SHOW_TASK.format(out=tmp_path)
    script.write_text(
        f"#!/bin/bash\n#SBATCH {sbatch} --output={tmp_path}/batch.out\nsrun bash -c '{show}'\n"
    )
    job = cluster.run("sbatch", "--parsable", str(script)).stdout.strip()
    cluster.wait_gone(job)
    return [(tmp_path / f"task-{r}.txt").read_text().split() for r in range(ntasks)]


@pytest.mark.slurm
def test_two_task_job_runs_across_both_nodes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    seen = _run_tasks(slurm_cluster, tmp_path, "--nodes=2 --ntasks-per-node=1", 2)
    assert [s[:2] for s in seen] == [["0", "n1"], ["1", "n2"]]
    assert all(s[3] == "unset" for s in seen)  # a CPU job sees no GPUs, though nodes have some


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("request_", "visible"),
    [
        # One GPU per task: each task sees its own, as device 0 of its own list.
        ("--gpus-per-task=1", ["0", "1", "0", "1"]),
        # All of the node's GPUs for every task: each picks cuda:LOCAL_RANK.
        ("--gpus-per-node=2", ["0,1"] * 4),
    ],
)
def test_fake_gpus_reach_each_task_as_cuda_visible_devices(
    slurm_cluster: Cluster, tmp_path: Path, request_: str, visible: list[str]
) -> None:
    spec = devcluster.layout_for(slurm_cluster.state_dir).spec
    assert spec.gpus_per_node >= 2, "bring the dev cluster up with --gpus-per-node 2 or more"
    seen = _run_tasks(slurm_cluster, tmp_path, f"-N2 --ntasks-per-node=2 {request_}", 4)
    assert [s[:3] for s in seen] == [
        ["0", "n1", "0"], ["1", "n1", "1"], ["2", "n2", "0"], ["3", "n2", "1"]
    ]  # fmt: skip
    assert [s[3] for s in seen] == visible


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
def test_status_json_names_each_daemon_and_node(
    slurm_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--state-dir", str(slurm_cluster.state_dir)]
    assert main(["dev-cluster", "status", *where, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    layout = devcluster.layout_for(slurm_cluster.state_dir)
    assert shown["running"] is True
    assert shown["conf"] == str(slurm_cluster.conf)
    assert shown["daemons"] == {n: devcluster.pid_alive(p) for n, p in layout.pid_files().items()}
    assert sorted(shown["nodes"]) == list(layout.node_names)
    assert shown["spec"]["nodes"] == len(layout.node_names)


def test_status_json_of_a_cluster_that_is_not_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dev-cluster", "status", "--state-dir", str(tmp_path), "--json"]) == 3
    shown = json.loads(capsys.readouterr().out)  # 3 as without --json: not everything runs
    assert (shown["running"], shown["nodes"]) == (False, {})
    assert set(shown["daemons"].values()) == {None}


@pytest.mark.slurm
def test_up_is_idempotent_and_down_leaves_nothing(slurm_cluster: Cluster) -> None:
    again = devcluster.up(slurm_cluster.state_dir, slurm_cluster.env)
    assert again.started == ()
    assert again.seconds < 5

    layout = devcluster.layout_for(slurm_cluster.state_dir)
    me = str(slurm_cluster.state_dir)
    assert hosts_owners(devcluster.HOSTS_FILE.read_text())[me] == layout.node_names
    pids = {n: devcluster.pid_alive(p) for n, p in layout.pid_files().items()}
    assert all(pids.values())
    others = {d: n for d, n in hosts_owners(devcluster.HOSTS_FILE.read_text()).items() if d != me}
    stopped = devcluster.down(slurm_cluster.state_dir)
    try:
        assert sorted(stopped) == sorted(pids)
        assert all(devcluster.pid_alive(p) is None for p in layout.pid_files().values())
        # Its names leave the hosts line; another running cluster's stay (or no line at all).
        assert hosts_owners(devcluster.HOSTS_FILE.read_text()) == others
    finally:
        back = devcluster.up(slurm_cluster.state_dir, slurm_cluster.env)
    assert sorted(back.started) == sorted(pids)
    assert me in hosts_owners(devcluster.HOSTS_FILE.read_text())


@pytest.mark.slurm
def test_drained_nodes_are_resumed_by_their_drain_reason(slurm_cluster: Cluster) -> None:
    """The suite's fixture resumes only a node that an earlier test's job drained for "Kill
    task failed"; a fresh controller's ``wait_idle`` resumes any drain its saved state kept."""
    layout = devcluster.layout_for(slurm_cluster.state_dir)

    def drain(node: str, reason: str) -> None:
        slurm_cluster.run(
            "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"
        )

    drain("n1", "Kill task failed")
    drain("n2", "an admin's own drain")
    try:
        resumed = devcluster.resume_drained_nodes(layout, "Kill task failed")
        assert resumed == {"n1": "Kill task failed"}
        assert "DRAIN" in devcluster.node_state(layout, "n2")
        devcluster.wait_idle(layout, 30, resume_drained=True)
        states = devcluster.node_states(layout)  # idle* : a new controller not yet answered
        assert {n: st.rstrip("*") for n, st in states.items()} == {"n1": "idle", "n2": "idle"}
    finally:
        devcluster.resume_drained_nodes(layout)
