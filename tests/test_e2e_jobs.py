"""The whole product on the real two-node dev cluster: submit, watch, train, resume, BYO scripts.

Every job goes through the real CLI in a subprocess (as a user would type it), real sbatch,
real srun tasks on n1 and n2, and real DDP over gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

HPC_DDP = [sys.executable, "-m", "hpc_ddp"]


def wait_done(cluster: Cluster, job_id: str) -> str:
    """The job's final JobState (requeue holds released at once)."""
    return e2e.wait_done(cluster, job_id)["JobState"]


QUICK = ["train.epochs=2", "train.log_every=1"]


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    """The uninterrupted quickstart run (2 nodes x 1 task) every resume is compared with."""
    runs = tmp_path_factory.mktemp("ref")
    job = e2e.submit(slurm_cluster, runs, "jobs/quickstart.yaml", *QUICK)
    assert wait_done(slurm_cluster, job.job_id) == "COMPLETED"
    return e2e.final_digest(slurm_cluster, job.run_dir)


@pytest.mark.parametrize("init_method", ["env", "tcp", "file"])
def test_two_nodes_train_and_the_cli_watches(
    slurm_cluster: Cluster, tmp_path: Path, init_method: str, reference: tuple[int, str]
) -> None:
    job = e2e.submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", *QUICK, f"dist.init_method={init_method}"
    )
    run_dir = job.run_dir
    assert wait_done(slurm_cluster, job.job_id) == "COMPLETED"
    # Both ranks ran, one on each node, and rank 1's log is reachable through the CLI.
    log1 = e2e.hpc(slurm_cluster, "logs", str(run_dir), "--rank", "1", "--err").stdout
    assert "rank 1/2" in log1
    assert "step 64/64" in log1
    assert log1 == (run_dir / "logs" / "rank-1.err").read_text()
    rank0 = (run_dir / "logs" / "rank-0.err").read_text()
    assert "rank 0/2" in rank0
    assert "global batch 128 = 64 per rank x 2 ranks" in rank0
    losses = [r["loss"] for r in e2e.metric_rows(run_dir) if "loss" in r]
    assert losses[-1] < 0.8 * losses[0]  # it learns
    # The rendezvous does not change the arithmetic: same weights as the env:// reference.
    assert e2e.final_digest(slurm_cluster, run_dir) == reference
    row = e2e.status(slurm_cluster, run_dir)
    assert row["state"] == "COMPLETED"
    assert row["checkpoint_step"] == 64
    assert row["attempts"] == 1
    assert row["causes"] == ["finished"]


def test_one_node_two_tasks_and_two_jobs_share_a_node(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Two 1-node x 2-task jobs on n1 at the same time: distinct master ports, both finish."""
    args = ["slurm.nodes=1", "slurm.tasks_per_node=2", "slurm.extra={nodelist: n1}", *QUICK]
    jobs = [
        e2e.submit(slurm_cluster, tmp_path / str(i), "jobs/quickstart.yaml", *args) for i in (0, 1)
    ]
    assert [wait_done(slurm_cluster, j.job_id) for j in jobs] == ["COMPLETED", "COMPLETED"]
    ports = []
    for j in jobs:
        files = list((j.run_dir / "rendezvous").glob("master_port.*"))
        assert len(files) == 1
        ports.append(int(files[0].read_text()))
        assert "rank 0/2" in (j.run_dir / "logs" / "rank-0.err").read_text()
    assert ports[0] != ports[1]


@pytest.mark.parametrize("workers", ["auto", "2"])
def test_interrupted_run_resumes_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path, reference: tuple[int, str], workers: str
) -> None:
    """Stopped mid-run by the lead-time signal and requeued: the same weights as the
    uninterrupted reference (which loads in the training process: ``auto`` on CPUs), also with
    two data-loader workers per rank prefetching ahead of the stop."""
    job = e2e.submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", *QUICK, f"train.num_workers={workers}"
    )
    run_dir = job.run_dir
    e2e.wait_step(run_dir, 10)
    slurm_cluster.run("scancel", "--signal=USR2", job.job_id)
    assert wait_done(slurm_cluster, job.job_id) == "COMPLETED"
    assert e2e.final_digest(slurm_cluster, run_dir) == reference
    count = "0" if workers == "auto" else workers
    rank0 = (run_dir / "logs" / "rank-0.err").read_text()
    assert f"data loader: {count} worker process(es) per rank" in rank0
    assert "exactness: a resume of this run is bit-identical to an uninterrupted run" in rank0
    row = e2e.status(slurm_cluster, run_dir)
    assert row["causes"] == ["time_limit", "finished"]
    first, second = row["attempt_list"]
    assert first["steps_done"] is not None
    assert first["steps_done"] >= 10
    assert first["checkpoint"] == f"step-{first['steps_done']:08d}.pt"
    assert second["steps_done"] == 64


def test_cancel_stops_a_running_job_for_good(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = e2e.submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", "train.epochs=50", "train.log_every=1"
    )
    e2e.wait_step(job.run_dir, 3)
    out = e2e.hpc(slurm_cluster, "cancel", str(job.run_dir)).stdout
    assert f"cancelled slurm job {job.job_id}" in out
    assert wait_done(slurm_cluster, job.job_id) == "CANCELLED"
    fields = slurm_cluster.run("scontrol", "show", "job", "-o", job.job_id).stdout
    assert "Restarts=0" in fields  # a cancel is never turned into a requeue


def test_test_only_reports_slurms_reason(slurm_cluster: Cluster, tmp_path: Path) -> None:
    done = e2e.hpc(
        slurm_cluster,
        "submit",
        "jobs/quickstart.yaml",
        "slurm.nodes=3",
        "--test-only",
        "--runs-dir",
        str(tmp_path),
        check=False,
    )
    assert done.returncode == 1
    assert "sbatch --test-only" in done.stderr
    assert "node" in done.stderr.lower()  # Slurm's own words about the node count
    assert not list(tmp_path.glob("*/job.sbatch"))  # a test-only request leaves no run dir
    ok = e2e.hpc(
        slurm_cluster, "submit", "jobs/quickstart.yaml", "--test-only", "--runs-dir", str(tmp_path)
    )
    assert "to start at" in ok.stdout + ok.stderr


def test_byo_command_job_resumes_bit_identical(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A user script (examples/byo/train.py) as a `command:` job across n1 and n2."""
    ref = e2e.submit(slurm_cluster, tmp_path / "ref", "jobs/byo.yaml")
    assert wait_done(slurm_cluster, ref.job_id) == "COMPLETED"
    job = e2e.submit(slurm_cluster, tmp_path / "int", "jobs/byo.yaml")
    run_dir = job.run_dir
    e2e.wait_step(run_dir, 60)
    slurm_cluster.run("scancel", "--signal=USR2", job.job_id)
    assert wait_done(slurm_cluster, job.job_id) == "COMPLETED"
    expected = e2e.final_digest(slurm_cluster, ref.run_dir)
    assert expected[0] == 300
    assert e2e.final_digest(slurm_cluster, run_dir) == expected
    fields = slurm_cluster.run("scontrol", "show", "job", "-o", job.job_id).stdout
    assert "Restarts=1" in fields


@pytest.mark.parametrize("how", ["auto-without-sbatch", "explicit"])
def test_local_backend_runs_the_same_job_in_two_processes(
    slurm_cluster: Cluster, tmp_path: Path, how: str
) -> None:
    """No Slurm on PATH: `submit --wait` runs the quickstart as 2 local processes."""
    del slurm_cluster  # only for the env; the local backend never talks to Slurm
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PATH"] = str(bin_dir)  # no sbatch (nor /bin, which is /usr/bin on Debian)
    args = ["submit", "jobs/quickstart.yaml", "--runs-dir", str(tmp_path), "--wait", *QUICK]
    if how == "explicit":
        args += ["--backend", "local"]
    done = subprocess.run(
        [*HPC_DDP, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "as local job" in done.stdout
    [run_dir] = tmp_path.iterdir()
    assert "rank 0/2" in (run_dir / "logs" / "rank-0.err").read_text()
    assert (run_dir / "logs" / "rank-1.err").exists()
    assert (run_dir / "checkpoints" / "step-00000064.pt").exists()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["backend"] == "local"
