"""The launchers users already have, on the real dev cluster (issue 39 item 11): one torchrun
per node under ``dist.launcher: torchrun``, its rendezvous from the allocation, through
Slurm's warning and a requeue; and a classic ``--local_rank`` script under srun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def _job(directory: Path, body: str) -> str:
    config = directory / "job.yaml"
    config.write_text(
        f"name: launchers\n{body}"
        "requeue: {max_requeues: 1}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n'
    )
    return str(config)


def test_one_torchrun_per_node_trains_four_ranks_and_survives_a_requeue(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    total = 80
    loop = ["python", str(HELPERS / "loader_loop.py"), str(total), "1", "0.05"]
    body = (
        f"command: {json.dumps(loop)}\n"
        "dist: {launcher: torchrun, procs_per_node: 2}\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 2, time: '00:05:00'}\n"
    )
    job = e2e.submit(slurm_cluster, tmp_path / "runs", _job(tmp_path, body))

    def steps() -> list[int]:
        return [int(r["step"]) for r in e2e.metric_rows(job.run_dir)]

    e2e.wait_for("15 steps", lambda: len(steps()) >= 15, timeout_s=180)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["Restarts"] == "1"
    first, last = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True), first
    assert (first.world_size, last.world_size) == (4, 4)  # 2 nodes x 2 workers, one rendezvous
    assert (last.cause, last.resumed_from_step) == (EndCause.FINISHED, first.steps_done), last
    assert steps() == list(range(1, total + 1))
    assert {int(r["world"]) for r in e2e.metric_rows(job.run_dir)} == {4}


def test_a_classic_local_rank_script_gets_its_rank_as_an_argument(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    command = ["python", str(HELPERS / "local_rank_arg.py"), str(out)]
    body = (
        f"command: {json.dumps(command)}\n"
        "dist: {local_rank_arg: --local_rank}\n"
        "slurm: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1, time: '00:05:00'}\n"
    )
    job = e2e.submit(slurm_cluster, tmp_path / "runs", _job(tmp_path, body))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=180)
    assert fields["JobState"] == "COMPLETED", fields
    seen = {p.name: p.read_text().split() for p in out.iterdir()}
    assert seen == {"rank-0.txt": ["0", "0", "2"], "rank-1.txt": ["1", "1", "2"]}
