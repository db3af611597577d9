"""Slurm's accounting (``sacct``, with slurmdbd and MariaDB) on the second dev cluster (the
default one has none): what it records of a job that was requeued or preempted, and what
``hpc-ddp status`` and ``results`` make of it once the controller has forgotten the jobs.

``sacct -X`` shows one row per job id: its latest run, and after the cluster's job ids started
again, the latest *job* of that id. ``sacct -X -D`` (``--duplicates``) shows every run of a
requeued job, the earlier ones ``REQUEUED`` (``scontrol requeue``), ``PREEMPTED`` (requeued by a
job in a higher partition) or ``NODE_FAIL``, and every job an id has named; ``SubmitLine``
(the sbatch command line, with the script's path) tells them apart. The cluster without
accounting is covered by the default cluster's tests (tests/cli/test_status.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.backends.jobs import JobState
from hpc_ddp.devcluster import cluster as devcluster
from hpc_ddp.rundir.manifest import read_manifest
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = pytest.mark.slurm

# Runs once until it is requeued; the next run finishes at once.
_ONCE = (
    'if [ -z "${{SLURM_RESTART_COUNT:-}}" ]; then\n'
    "  srun bash -c 'touch {out}/started; exec sleep 300'\n"
    "fi\n"
)


def _submit(cluster: Cluster, tmp_path: Path, options: str) -> str:
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH {options} --output={tmp_path}/batch.out --open-mode=append\n"
        + _ONCE.format(out=tmp_path)
    )
    return cluster.run("sbatch", "--parsable", str(script)).stdout.strip()


def _runs(cluster: Cluster, job: str, script: Path, *flags: str) -> list[str]:
    """sacct's states of job ``job`` that ran ``script`` (the id may have named earlier jobs
    of this cluster, before its job ids started again: they ran other scripts)."""
    out = cluster.run(
        "sacct", "-X", *flags, "-n", "-P", "-j", job, "--format=State,SubmitLine", check=False
    ).stdout
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    return [state for state, line in rows if line.endswith(f" {script}")]


def _wait_runs(cluster: Cluster, job: str, tmp_path: Path, expected: list[str]) -> None:
    # slurmdbd records asynchronously: the last row may lag the job by a moment.
    e2e.wait_for(
        f"sacct -X -D rows {expected}",
        lambda: _runs(cluster, job, tmp_path / "job.sh", "-D") == expected,
        timeout_s=30,
        poll_s=0.5,
    )


def test_sacct_keeps_the_run_that_scontrol_requeue_ended(
    accounting_cluster: Cluster, tmp_path: Path
) -> None:
    job = _submit(accounting_cluster, tmp_path, "-N1")
    e2e.wait_for("the first run", (tmp_path / "started").exists, timeout_s=60)
    accounting_cluster.run("scontrol", "requeue", job)
    assert e2e.wait_done(accounting_cluster, job, timeout_s=60)["JobState"] == "COMPLETED"
    _wait_runs(accounting_cluster, job, tmp_path, ["REQUEUED", "COMPLETED"])
    assert _runs(accounting_cluster, job, tmp_path / "job.sh") == ["COMPLETED"]  # the latest


def test_sacct_marks_a_preempted_run_preempted(accounting_cluster: Cluster, tmp_path: Path) -> None:
    # All three nodes in `debug` (requeue on preemption, no grace time), then a job in `high`.
    job = _submit(accounting_cluster, tmp_path, "-N3 --exclusive")
    e2e.wait_for("the first run", (tmp_path / "started").exists, timeout_s=60)
    high = accounting_cluster.run(
        "sbatch", "--parsable", "-p", "high", "-N3", "--exclusive", "-o", "/dev/null",
        "--wrap", "true",
    ).stdout.strip()  # fmt: skip
    assert e2e.wait_done(accounting_cluster, high, timeout_s=60)["JobState"] == "COMPLETED"
    assert e2e.wait_done(accounting_cluster, job, timeout_s=60)["JobState"] == "COMPLETED"
    _wait_runs(accounting_cluster, job, tmp_path, ["PREEMPTED", "COMPLETED"])
    assert e2e.restarts(accounting_cluster, job) == 1


# --- hpc-ddp's own answers from accounting ---------------------------------------------------
#
# The tests below make the controller forget every job (devcluster.forget_jobs: slurmctld
# restarted without its saved jobs, as after losing its StateSaveLocation), so only sacct knows
# what ran before, and job ids start again from the cluster's FirstJobId. Jobs are `command:`
# jobs of plain Python (no torch): each takes about a second.

_TASK = """\
import os, pathlib, sys, time
mode = sys.argv[1]
if mode == "fail":
    sys.exit(3)
if mode == "once" and not os.environ.get("SLURM_RESTART_COUNT"):
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(300)
if mode == "hang":
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(300)
"""


def _job(tmp_path: Path, name: str, mode: str) -> str:
    script = tmp_path / "task.py"
    script.write_text(_TASK)
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        f"command: [python, {script}, '{{params.mode}}', {tmp_path / name}.started]\n"
        f"params: {{mode: {mode}}}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, cpus_per_task: 1, time: '5'}\n"
    )
    return str(path)


def _forget(cluster: Cluster, script: Path | None = None, jobs: Sequence[str] = ()) -> None:
    """Make the controller forget every job, once slurmdbd holds the whole record of each of
    ``jobs`` (which ran ``script``). A controller stopped before then loses what it had not
    sent yet for good: slurmdbd records a job's end before its ``SubmitLine`` (seen: about a
    second without it), and jobs ended just before the restart may never reach it at all."""

    def recorded() -> bool:
        out = cluster.run(
            "sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State,SubmitLine",
            "-j", ",".join(jobs),
        ).stdout  # fmt: skip
        rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]
        ours = {job: state for job, state, line in rows if line.endswith(f" {script}")}
        return all(j in ours and _finished(ours[j]) for j in jobs)

    if jobs:
        e2e.wait_for(f"sacct's whole records of {jobs}", recorded, timeout_s=30, poll_s=0.5)
    devcluster.forget_jobs(cluster.state_dir, cluster.env)
    assert cluster.run("squeue", "-h", "-o", "%i").stdout.split() == []


def _finished(state: str) -> bool:
    return JobState(state.split(maxsplit=1)[0]).finished


def _latest(cluster: Cluster, jobs: Sequence[str], fields: str = "State") -> dict[str, list[str]]:
    """sacct's newest line of each of ``jobs`` by JobID (and, for an id that was once an array
    job's, that array's tasks: ``-j`` matches them too)."""
    out = cluster.run(
        "sacct", "-X", "-n", "-P", "-o", f"JobID,{fields}", "-j", ",".join(jobs)
    ).stdout
    return {(f := line.split("|"))[0]: f[1:] for line in out.splitlines() if "|" in line}


def _status(cluster: Cluster, *targets: Path) -> list[dict[str, Any]]:
    out = e2e.hpc(cluster, "status", *map(str, targets), "--json").stdout
    rows: list[dict[str, Any]] = json.loads(out)["runs"]
    return rows


def test_status_of_jobs_the_controller_forgot_and_of_a_job_id_given_again(
    accounting_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = accounting_cluster
    _forget(cluster)
    runs = tmp_path / "runs"
    done = e2e.hpc(cluster, "submit", _job(tmp_path, "done", "ok"), "--runs-dir", str(runs),
                   "--wait")  # fmt: skip
    assert "COMPLETED" in done.stderr
    [first] = runs.iterdir()
    first_job = read_manifest(first).job_id
    assert first_job is not None
    _forget(cluster, first / "job.sbatch", [first_job])
    [row] = _status(cluster, first)
    assert (row["job_id"], row["state"]) == (first_job, "COMPLETED"), row

    # The next job gets the first one's id, and fails: the first run is not taken for it,
    # neither while the controller holds the new job nor from sacct once it forgot it too.
    failed = e2e.submit(cluster, runs, _job(tmp_path, "failed", "fail"))
    assert failed.job_id == first_job
    assert e2e.wait_done(cluster, failed.job_id)["JobState"] == "FAILED"
    for forget in (False, True):
        if forget:
            _forget(cluster, failed.run_dir / "job.sbatch", [failed.job_id])
            # sacct's newest line of the id is the second job's; -D keeps the first's.
            assert _latest(cluster, [first_job])[first_job] == ["FAILED"]
            assert _runs(cluster, first_job, first / "job.sbatch", "-D") == ["COMPLETED"]
        first_row, failed_row = _status(cluster, first, failed.run_dir)
        assert (first_row["job_id"], first_row["state"]) == (first_job, "COMPLETED"), first_row
        assert (failed_row["job_id"], failed_row["state"]) == (first_job, "FAILED"), failed_row


def test_a_requeued_job_that_completed_is_completed_after_the_controller_forgot_it(
    accounting_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = accounting_cluster
    job = e2e.submit(cluster, tmp_path / "runs", _job(tmp_path, "requeued", "once"))
    e2e.wait_for("the first run", (tmp_path / "requeued.started").exists, timeout_s=60)
    cluster.run("scontrol", "requeue", job.job_id)
    assert e2e.wait_done(cluster, job.job_id)["JobState"] == "COMPLETED"
    _forget(cluster, job.run_dir / "job.sbatch", [job.job_id])
    runs = _runs(cluster, job.job_id, job.run_dir / "job.sbatch", "-D")
    assert runs == ["REQUEUED", "COMPLETED"]
    row = e2e.status(cluster, job.run_dir)
    assert row["state"] == "COMPLETED", row


def test_a_sweep_whose_tasks_ended_differently_after_the_controller_forgot_them(
    accounting_cluster: Cluster, tmp_path: Path
) -> None:
    """One task completes, one fails, one is cancelled while it runs. Its plain command leaves
    no word of the cancel in its ledger: only sacct knows. (A task cancelled while still
    pending in the array's range gets no record of its own in sacct 22.05 at all.)"""
    cluster = accounting_cluster
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"base: {_job(tmp_path, 'mixed', 'ok')}\n"
        "sweep:\n  list:\n    - {params.mode: ok}\n    - {params.mode: fail}\n"
        "    - {params.mode: hang}\n"
    )
    result = e2e.sweep(cluster, tmp_path / "runs", sweep)
    sweep_dir, [array] = Path(result["sweep_dir"]), result["array_jobs"]
    e2e.wait_for("task 2 running", (tmp_path / "mixed.started").exists, timeout_s=90)
    e2e.hpc(cluster, "cancel", str(sweep_dir / "tasks" / "2"))
    refs = [f"{array}_{i}" for i in range(3)]
    e2e.wait_all_done(cluster, refs, timeout_s=90)
    expected = ["finished", "failed", "cancelled"]
    assert _sweep_states(cluster, sweep_dir) == expected  # squeue still holds them
    _forget(cluster, sweep_dir / "job.sbatch", refs)

    assert _sweep_states(cluster, sweep_dir) == expected
    table = json.loads(e2e.hpc(cluster, "results", str(sweep_dir), "--json").stdout)["rows"]
    assert [r["state"] for r in sorted(table, key=lambda r: r["index"])] == expected, table


def _sweep_states(cluster: Cluster, sweep_dir: Path) -> list[str]:
    [entry] = json.loads(e2e.hpc(cluster, "status", str(sweep_dir), "--json").stdout)["sweeps"]
    return [task["state"] for task in entry["tasks"]]
