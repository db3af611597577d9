"""The survivor's save on the real dev cluster: a rank SIGKILLed inside ``optimizer.step()``.

A user's own session loop (``tests/helpers/rescued.py``: dropout, momentum, a scheduler) on 2
ranks of 2 nodes, with the supervisor's in-job restart. When rank 1 dies inside step 13's
update, rank 0 has completed step 13 (the gradients were all-reduced before the update), writes
it as a normal, digested checkpoint, and the restart goes on from step 13: no step trained
twice, and the twin's weights at the end. When rank 0 dies with a BatchNorm in the model (its
running stats only rank 0 saves) no complete save is possible: the ledger says why, and the
restart goes on from the periodic checkpoint, still to the twin's weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS, EVERY, KILL_AT = 24, 5, 13
FAULT = (
    "train: {keep_last: 10}\n"  # the rescued checkpoint stays to be read back
    "dist: {timeout_s: 60}\n"
    "fault: {beat_s: 0.5, stale_s: 3, startup_timeout_s: 120, step_timeout_s: 10}\n"
)


def _job(tmp: Path, kill_at: int, kill_rank: int, bn: bool) -> Path:
    args = f"'{STEPS}', '{EVERY}', '{kill_at}', '{kill_rank}'" + (", bn" if bn else "")
    return e2e.helper_job(tmp, "rescued", "rescued.py", args, FAULT)


def _run(cluster: Cluster, tmp: Path, kill_at: int, kill_rank: int, bn: bool) -> Path:
    job = e2e.submit(cluster, tmp / "runs", str(_job(tmp, kill_at, kill_rank, bn)))
    fields = e2e.wait_done(cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
    return job.run_dir


@pytest.fixture(scope="module")
def twins(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Any]:
    """(step, weights digest) of each model's uninterrupted run, by ``bn``."""
    out = {}
    for bn in (False, True):
        run_dir = _run(slurm_cluster, tmp_path_factory.mktemp(f"twin-{bn}"), 0, 0, bn)
        out[bn] = e2e.final_digest(slurm_cluster, run_dir)
    return out


def _goodput(cluster: Cluster, run_dir: Path) -> dict[str, Any]:
    out = e2e.hpc(cluster, "status", str(run_dir), "--json", "--goodput").stdout
    goodput: dict[str, Any] = json.loads(out)["runs"][0]["goodput"]
    return goodput


def test_a_rank_killed_inside_its_update_costs_no_step(
    slurm_cluster: Cluster, tmp_path: Path, twins: dict[bool, Any]
) -> None:
    run_dir = _run(slurm_cluster, tmp_path, KILL_AT, 1, bn=False)
    dead, again = e2e.ledger(run_dir)
    assert (dead.cause, dead.next) == (EndCause.CRASH, "restart")
    assert dead.blame is not None
    assert dead.blame.ranks == (1,)
    assert dead.rescue is not None, dead
    assert (dead.rescue.rank, dead.rescue.step) == (0, KILL_AT), dead.rescue
    assert dead.rescue.checkpoint == f"step-{KILL_AT:08d}.pt"
    assert (again.resumed_from_step, again.cause) == (KILL_AT, EndCause.FINISHED)
    assert _goodput(slurm_cluster, run_dir)["redone_steps"] == 0
    rows = e2e.checkpoints(slurm_cluster, run_dir)
    rescued = next(r for r in rows if r["step"] == KILL_AT)
    assert rescued["error"] is None  # a normal, digested checkpoint, verified as any other
    assert e2e.final_digest(slurm_cluster, run_dir) == twins[False]


def test_without_rank_0_a_batchnorm_model_falls_back_and_the_ledger_says_why(
    slurm_cluster: Cluster, tmp_path: Path, twins: dict[bool, Any]
) -> None:
    run_dir = _run(slurm_cluster, tmp_path, KILL_AT, 0, bn=True)
    dead, again = e2e.ledger(run_dir)
    assert dead.blame is not None
    assert dead.blame.ranks == (0,)
    assert dead.rescue is not None, dead
    assert (dead.rescue.step, dead.rescue.checkpoint) == (KILL_AT, None), dead.rescue
    assert dead.rescue.why is not None
    assert "rank 0 was lost" in dead.rescue.why
    assert "running_mean" in dead.rescue.why
    periodic = KILL_AT // EVERY * EVERY
    assert again.resumed_from_step == periodic
    # From the survivor's step, not the beats (half a second behind: 0 in a loaded CI run).
    assert _goodput(slurm_cluster, run_dir)["redone_steps"] >= KILL_AT - periodic
    assert e2e.final_digest(slurm_cluster, run_dir) == twins[True]


def _torchrun_job(tmp: Path, kill_at: int, kill_rank: int) -> Path:
    script = Path(__file__).resolve().parents[1] / "helpers" / "rescued.py"
    config = tmp / "torchrun.yaml"
    config.write_text(
        "name: rescued-torchrun\n"
        f"command: [python, {script}, '{STEPS}', '{EVERY}', '{kill_at}', '{kill_rank}']\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 2, time: '00:05:00'}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n'
        "train: {keep_last: 10}\n"
        "dist: {launcher: torchrun, procs_per_node: 2, timeout_s: 60}\n"
        "fault: {beat_s: 0.5, stale_s: 3, startup_timeout_s: 120, step_timeout_s: 10}\n"
    )
    return config


def test_torchrun_workers_lost_with_their_node_task_are_rescued_by_the_next_nodes_first(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """torchrun's worker 1 (node 0's second) dies inside its update: torchrun ends node 0's
    workers, the launch blames task 0, and worker 2 (node 1's first, the lowest survivor in
    the workers' numbering) writes the step."""
    runs = []
    for kill_at in (0, KILL_AT):
        job = e2e.submit(slurm_cluster, tmp_path / f"runs-{kill_at}",
                         str(_torchrun_job(tmp_path, kill_at, 1)))  # fmt: skip
        fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
        assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
        runs.append(job.run_dir)
    twin, run_dir = runs
    dead, again = e2e.ledger(run_dir)
    assert dead.blame is not None
    assert dead.blame.ranks == (0,)  # the launch's numbering: node 0's task
    assert dead.rescue is not None, dead
    assert (dead.rescue.rank, dead.rescue.step) == (2, KILL_AT), dead.rescue
    assert (again.resumed_from_step, again.cause) == (KILL_AT, EndCause.FINISHED)
    assert (dead.world_size, again.world_size) == (4, 4)
    assert _goodput(slurm_cluster, run_dir)["redone_steps"] == 0
    assert e2e.final_digest(slurm_cluster, run_dir) == e2e.final_digest(slurm_cluster, twin)
