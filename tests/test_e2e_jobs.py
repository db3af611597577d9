"""The whole product on the real two-node dev cluster: submit, watch, train, resume, BYO scripts.

Every job goes through the real CLI in a subprocess (as a user would type it), real sbatch,
real srun tasks on n1 and n2, and real DDP over gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

HPC_DDP = [sys.executable, "-m", "hpc_ddp"]


def cli(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``hpc-ddp ARGS`` from the repo root against the cluster."""
    done = subprocess.run(
        [*HPC_DDP, *args], cwd=REPO, env=cluster.env, capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"hpc-ddp {' '.join(args)} -> {done.returncode}\n{done.stderr}")
    return done


def submit(cluster: Cluster, runs: Path, job: str, *overrides: str) -> dict[str, Any]:
    """Submit ``job`` with overrides; returns the --json result (job_id, run_dir, ...)."""
    out = cli(cluster, "submit", job, "--runs-dir", str(runs), "--json", *overrides).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def wait_step(run_dir: Path, step: int, timeout_s: float = 90.0) -> None:
    """Wait until rank 0 has logged ``step`` (or later) to metrics.jsonl."""
    deadline = time.monotonic() + timeout_s
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists():
            steps = [json.loads(x).get("step", -1) for x in path.read_text().splitlines() if x]
            if steps and max(steps) >= step:
                return
        time.sleep(0.05)
    raise AssertionError(f"{run_dir}: step {step} not reached in {timeout_s} s")


def wait_done(cluster: Cluster, job_id: str, timeout_s: float = 180.0) -> str:
    """Wait until the job is finished for good (requeues released at once); its JobState."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fields = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
        state = fields.split("JobState=")[1].split()[0]
        if state == "PENDING" and "Reason=BeginTime" in fields:
            # A requeued job is held for cred_expire + 1 s; the tests need not wait for it.
            cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} not finished in {timeout_s} s")


def final_digest(cluster: Cluster, run_dir: Path) -> tuple[int, str]:
    """(step, weights digest) of the newest checkpoint, as `hpc-ddp checkpoints` reports it."""
    rows = json.loads(cli(cluster, "checkpoints", str(run_dir), "--json").stdout)
    return rows[-1]["step"], rows[-1]["weights_digest"]


def metric_values(run_dir: Path, key: str) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row[key] for row in map(json.loads, lines) if key in row]


QUICK = ["train.epochs=2", "train.log_every=1"]


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    """The uninterrupted quickstart run (2 nodes x 1 task) every resume is compared with."""
    runs = tmp_path_factory.mktemp("ref")
    job = submit(slurm_cluster, runs, "jobs/quickstart.yaml", *QUICK)
    assert wait_done(slurm_cluster, job["job_id"]) == "COMPLETED"
    return final_digest(slurm_cluster, Path(job["run_dir"]))


@pytest.mark.parametrize("init_method", ["env", "tcp", "file"])
def test_two_nodes_train_and_the_cli_watches(
    slurm_cluster: Cluster, tmp_path: Path, init_method: str, reference: tuple[int, str]
) -> None:
    job = submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", *QUICK, f"dist.init_method={init_method}"
    )
    run_dir = Path(job["run_dir"])
    assert wait_done(slurm_cluster, job["job_id"]) == "COMPLETED"
    # Both ranks ran, one on each node, and rank 1's log is reachable through the CLI.
    log1 = cli(slurm_cluster, "logs", str(run_dir), "--rank", "1", "--err").stdout
    assert "rank 1/2" in log1
    assert "step 64/64" in log1
    assert log1 == (run_dir / "logs" / "rank-1.err").read_text()
    rank0 = (run_dir / "logs" / "rank-0.err").read_text()
    assert "rank 0/2" in rank0
    assert "global batch 128 = 64 per rank x 2 ranks" in rank0
    losses = metric_values(run_dir, "loss")
    assert losses[-1] < 0.8 * losses[0]  # it learns
    # The rendezvous does not change the arithmetic: same weights as the env:// reference.
    assert final_digest(slurm_cluster, run_dir) == reference
    [row] = json.loads(cli(slurm_cluster, "status", str(run_dir), "--json").stdout)
    assert row["state"] == "COMPLETED"
    assert row["ckpt step"] == 64
    assert row["attempts"] == 1
    assert row["causes"] == "finished"


def test_one_node_two_tasks_and_two_jobs_share_a_node(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Two 1-node x 2-task jobs on n1 at the same time: distinct master ports, both finish."""
    args = ["slurm.nodes=1", "slurm.tasks_per_node=2", "slurm.extra={nodelist: n1}", *QUICK]
    jobs = [submit(slurm_cluster, tmp_path / str(i), "jobs/quickstart.yaml", *args) for i in (0, 1)]
    assert [wait_done(slurm_cluster, j["job_id"]) for j in jobs] == ["COMPLETED", "COMPLETED"]
    ports = []
    for j in jobs:
        files = list((Path(j["run_dir"]) / "rendezvous").glob("master_port.*"))
        assert len(files) == 1
        ports.append(int(files[0].read_text()))
        assert "rank 0/2" in (Path(j["run_dir"]) / "logs" / "rank-0.err").read_text()
    assert ports[0] != ports[1]


def test_interrupted_run_resumes_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path, reference: tuple[int, str]
) -> None:
    job = submit(slurm_cluster, tmp_path, "jobs/quickstart.yaml", *QUICK)
    run_dir = Path(job["run_dir"])
    wait_step(run_dir, 10)
    slurm_cluster.run("scancel", "--signal=USR2", job["job_id"])
    assert wait_done(slurm_cluster, job["job_id"]) == "COMPLETED"
    assert final_digest(slurm_cluster, run_dir) == reference
    [row] = json.loads(cli(slurm_cluster, "status", str(run_dir), "--json").stdout)
    assert row["causes"] == "time_limit,finished"
    first, second = row["attempt_list"]
    assert first["steps_done"] is not None
    assert first["steps_done"] >= 10
    assert first["checkpoint"] == f"step-{first['steps_done']:08d}.pt"
    assert second["steps_done"] == 64


def test_cancel_stops_a_running_job_for_good(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = submit(
        slurm_cluster, tmp_path, "jobs/quickstart.yaml", "train.epochs=50", "train.log_every=1"
    )
    wait_step(Path(job["run_dir"]), 3)
    out = cli(slurm_cluster, "cancel", job["run_dir"]).stdout
    assert f"cancelled slurm job {job['job_id']}" in out
    assert wait_done(slurm_cluster, job["job_id"]) == "CANCELLED"
    fields = slurm_cluster.run("scontrol", "show", "job", "-o", job["job_id"]).stdout
    assert "Restarts=0" in fields  # a cancel is never turned into a requeue


def test_test_only_reports_slurms_reason(slurm_cluster: Cluster, tmp_path: Path) -> None:
    done = cli(
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
    ok = cli(
        slurm_cluster, "submit", "jobs/quickstart.yaml", "--test-only", "--runs-dir", str(tmp_path)
    )
    assert "to start at" in ok.stdout + ok.stderr


def test_byo_command_job_resumes_bit_identical(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A user script (examples/byo/train.py) as a `command:` job across n1 and n2."""
    ref = submit(slurm_cluster, tmp_path / "ref", "jobs/byo.yaml")
    assert wait_done(slurm_cluster, ref["job_id"]) == "COMPLETED"
    job = submit(slurm_cluster, tmp_path / "int", "jobs/byo.yaml")
    run_dir = Path(job["run_dir"])
    wait_step(run_dir, 60)
    slurm_cluster.run("scancel", "--signal=USR2", job["job_id"])
    assert wait_done(slurm_cluster, job["job_id"]) == "COMPLETED"
    expected = final_digest(slurm_cluster, Path(ref["run_dir"]))
    assert expected[0] == 300
    assert final_digest(slurm_cluster, run_dir) == expected
    fields = slurm_cluster.run("scontrol", "show", "job", "-o", job["job_id"]).stdout
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
