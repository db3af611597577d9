"""What Slurm's accounting (``sacct``, with slurmdbd and MariaDB) records of a job that was
requeued or preempted, on the second dev cluster (the default one has no accounting).

``sacct -X`` shows one row per job id: its latest run. ``sacct -X -D`` (``--duplicates``)
shows every run of a requeued job, the earlier ones ``REQUEUED`` (``scontrol requeue``),
``PREEMPTED`` (requeued by a job in a higher partition) or ``NODE_FAIL``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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


def _runs(cluster: Cluster, job: str, *flags: str) -> list[str]:
    out = cluster.run(
        "sacct", "-X", *flags, "-n", "-P", "-j", job, "--format=State", check=False
    ).stdout
    return out.split()


def _wait_runs(cluster: Cluster, job: str, expected: list[str]) -> None:
    # slurmdbd records asynchronously: the last row may lag the job by a moment.
    e2e.wait_for(
        f"sacct -X -D rows {expected}",
        lambda: _runs(cluster, job, "-D") == expected,
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
    _wait_runs(accounting_cluster, job, ["REQUEUED", "COMPLETED"])
    assert _runs(accounting_cluster, job) == ["COMPLETED"]  # without -D: the latest run only


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
    _wait_runs(accounting_cluster, job, ["PREEMPTED", "COMPLETED"])
    assert e2e.restarts(accounting_cluster, job) == 1
