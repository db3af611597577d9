"""The Python API on the real dev cluster (issue 27): submit -> wait -> metrics -> resume with
real jobs, a failing job's error with the lines ``status`` prints, a cancel, docs/cli.md's
example exactly as written, and ``examples/api/lr_search.py``.

The API runs in this process against the cluster (the ``slurm_cluster`` fixture points
``SLURM_CONF`` at it); what it says is checked against the CLI run as a user would run it, in
a subprocess, and against the run directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

import hpc_ddp
from hpc_ddp.rundir.ledger import read_ledger
from hpc_ddp.rundir.manifest import read_manifest
from tests import e2e_util as e2e

if TYPE_CHECKING:
    from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
QUICK = {"train.checkpoint_every": 10, "env.vars": {"OMP_NUM_THREADS": "1"}}
"""Overrides that keep the quickstart job short and steady on a busy 2-core machine."""


def in_new_process(cluster: Cluster, code: str, *args: str) -> Any:
    """Run ``code`` in a fresh interpreter against the cluster; its last line, as JSON."""
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=cluster.env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.torch
def test_submit_wait_metrics_resume_through_the_api(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = hpc_ddp.submit("jobs/quickstart.yaml", {**QUICK, "train.max_steps": 30},
                         backend="slurm", runs_dir=tmp_path)  # fmt: skip
    assert job.backend == "slurm"
    assert job.job_id.isdigit()
    status = job.wait(timeout=300)
    assert (status.state, status.succeeded, status.ckpt_step) == ("COMPLETED", True, 30)
    assert status.to_dict() == e2e.status(slurm_cluster, job.run_dir)  # the CLI's row
    losses = [r["step"] for r in job.metrics() if "loss" in r]
    assert losses[-1] == 30
    assert losses == sorted(set(losses))

    # Days later, in another process: the same job, from its run directory alone.
    rebuilt = in_new_process(
        slurm_cluster,
        "import json, sys, hpc_ddp\n"
        "job = hpc_ddp.Job.from_run_dir(sys.argv[1])\n"
        "s = job.status()\n"
        "print(json.dumps([job.job_id, s.state, s.ckpt_step, len(job.metrics())]))\n",
        str(job.run_dir),
    )
    assert rebuilt == [job.job_id, "COMPLETED", 30, len(job.metrics())]

    with pytest.raises(hpc_ddp.TargetError, match="HINT"):  # finished: resume needs force
        hpc_ddp.resume(job.run_dir, {"train.max_steps": 50})
    again = hpc_ddp.resume(job.run_dir, {"train.max_steps": 50}, force=True)
    assert again.run_dir == job.run_dir
    assert again.job_id != job.job_id
    done = again.wait(timeout=300)
    assert (done.state, done.attempts, done.causes, done.ckpt_step) == (
        "COMPLETED", 2, ("finished", "finished"), 50
    )  # fmt: skip
    steps = [r["step"] for r in again.metrics() if "loss" in r]
    assert steps[-1] == 50
    assert steps == sorted(set(steps))
    assert read_manifest(job.run_dir).previous_jobs == [job.job_id]
    [first, second] = read_ledger(job.paths.ledger)
    assert (first.job_ref, second.job_ref) == (job.job_id, again.job_id)
    assert second.resumed_from_step == 30
    assert job.cancel().outcome == "already_finished"


def test_a_failing_job_raises_with_the_lines_status_prints(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "fails.yaml"
    config.write_text(yaml.safe_dump({
        "name": "fails",
        "command": ["python3", "-c", "import sys; sys.exit('boom: no such data')"],
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"},
    }))  # fmt: skip
    job = hpc_ddp.submit(config, backend="slurm", runs_dir=tmp_path / "runs")
    with pytest.raises(hpc_ddp.RunFailedError) as caught:
        job.wait(timeout=180)
    err = caught.value
    assert isinstance(err.status, hpc_ddp.RunStatus)
    assert err.status.state == "FAILED"
    shown = e2e.hpc(slurm_cluster, "status", str(job.run_dir), check=False).stdout
    assert err.reasons
    assert all(line in shown for line in err.reasons), (err.reasons, shown)
    assert str(err).startswith(f"{job.run_dir} ended FAILED")
    assert "boom: no such data" in job.logs() + job.logs(batch=True)


def test_cancel_stops_a_running_job_and_wait_says_so(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "sleeps.yaml"
    config.write_text(yaml.safe_dump({
        "name": "sleeps", "command": ["sleep", "300"],
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
    }))  # fmt: skip
    job = hpc_ddp.submit(config, backend="slurm", runs_dir=tmp_path)
    try:
        e2e.wait_for("RUNNING", lambda: job.status().state == "RUNNING", timeout_s=120, poll_s=0.5)
        result = job.cancel()
        assert (result.outcome, result.jobs) == ("cancelled", (job.job_id,))
        status = job.wait(timeout=120, check=False)
        assert (status.state, status.succeeded) == ("CANCELLED", False)
    finally:
        slurm_cluster.run("scancel", job.job_id, check=False)


def api_doc_example() -> str:
    """The first python block of docs/cli.md's "Python API" section, as written."""
    doc = (REPO / "docs" / "cli.md").read_text()
    section = doc.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python example under ## Python API"
    return match.group(1)


@pytest.mark.torch
@pytest.mark.slow
def test_the_api_doc_example_runs_as_written(slurm_cluster: Cluster, tmp_path: Path) -> None:
    code = api_doc_example()
    assert "hpc_ddp.submit(" in code
    assert "sweep.results()" in code
    assert "hpc_ddp.runs()" in code
    env = {**slurm_cluster.env, "HPC_DDP_RUNS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[-1] == "already_finished"
    [run] = [p for p in tmp_path.iterdir() if not (p / "tasks").is_dir()]
    [sweep_dir] = [p for p in tmp_path.iterdir() if (p / "tasks").is_dir()]
    assert out[0] == f"{run} {read_manifest(run).previous_jobs[0]}"
    assert out[1] == "COMPLETED 40"
    shown = json.loads(e2e.hpc(slurm_cluster, "results", str(sweep_dir), "--json").stdout)
    rows = shown["rows"]
    assert [r["state"] for r in rows] == ["finished"] * 6
    best = rows[0]  # the best row, as the CLI ranks
    assert out[3] == f"{best['values']['train.lr']} {best['best']}"
    assert [line.split(",")[0] for line in out[4:-1]] == [  # status lists them so, too
        f"RunStatus(run='{run}'", f"SweepStatus(sweep='{sweep_dir}'"
    ]  # fmt: skip
    assert "state='COMPLETED'" in out[4]
    assert "'finished': 6" in out[5]
    assert e2e.status(slurm_cluster, run)["attempts"] == 2


@pytest.mark.torch
def test_the_lr_search_example_picks_the_next_rate_from_the_metrics(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    argv = [sys.executable, "examples/api/lr_search.py", "--rounds", "2", "--lr", "0.05",
            "--factor", "4", "--set", "train.max_steps=30", "--set", "slurm.nodes=1",
            "--set", 'env.vars={OMP_NUM_THREADS: "1"}', "--runs-dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, env=slurm_cluster.env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = sorted(tmp_path.iterdir())
    assert len(runs) == 2
    tried = {}
    for run in runs:
        row = e2e.status(slurm_cluster, run)
        assert row["state"] == "COMPLETED", row
        lr = yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"]
        metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        tried[lr] = [m["val_loss"] for m in metrics if m.get("val_loss") is not None][-1]
    assert sorted(tried) == [0.05, 0.2]  # the first rate, then one step up
    best = min(tried, key=lambda lr: tried[lr])
    assert done.stdout.splitlines()[-1] == (
        f"best: lr {best:.4g} (val_loss {tried[best]:.4f}) of 2 run(s)"
    )
    assert os.path.commonpath(runs) == str(tmp_path)
