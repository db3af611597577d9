"""FSDP on the real two-node dev cluster: ``train.strategy=fsdp`` trains over 2 nodes, each rank
writing its own shard, and a run stopped by the lead-time signal and requeued, or restarted in
the job after a rank was killed, ends with the whole weights bit-identical to the uninterrupted
run's (exported from the last shard set)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from hpc_ddp.checkpoint.format import weights_digest
from hpc_ddp.rundir.ledger import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

FSDP = ["train.strategy=fsdp", "train.epochs=2", "train.log_every=1"]


def exported_digest(cluster: Cluster, run_dir: Path) -> str:
    """The weights digest of the newest verified shard set, as ``--export`` writes them."""
    out = run_dir / "exported.pt"
    e2e.hpc(cluster, "checkpoints", str(run_dir), "--export", str(out))
    return weights_digest(torch.load(out, weights_only=True))


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    runs = tmp_path_factory.mktemp("fsdp-ref")
    job = e2e.submit(slurm_cluster, runs, "jobs/quickstart.yaml", *FSDP)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "COMPLETED"
    newest = job.run_dir / "checkpoints" / "step-00000064"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "digests.json"} <= {
        p.name for p in newest.iterdir()
    }
    assert "fsdp: 3 block(s) sharded" in (job.run_dir / "logs" / "rank-1.err").read_text()
    return exported_digest(slurm_cluster, job.run_dir)


def test_an_fsdp_run_requeued_mid_run_resumes_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path, reference: str
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path, "jobs/quickstart.yaml", *FSDP)
    e2e.wait_step(job.run_dir, 10)
    slurm_cluster.run("scancel", "--signal=USR2", job.job_id)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "COMPLETED"
    assert exported_digest(slurm_cluster, job.run_dir) == reference
    rank0 = (job.run_dir / "logs" / "rank-0.err").read_text()
    assert "resumed from sharded step-" in rank0
    attempts = e2e.ledger(job.run_dir)
    assert [a.cause.value if a.cause else None for a in attempts] == ["time_limit", "finished"]


# --- a fault, and the in-job restart -----------------------------------------------------------

FAULT_AT = 20
FAULTS = """name: fsdp-faults
slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:10:00'}
env: {vars: {OMP_NUM_THREADS: "1"}}
dist: {timeout_s: 60}
train: {model: mlp, dataset: "tests.e2e_util:io_bound_synthetic", max_steps: 60,
        checkpoint_every: 10, log_every: 5, batch_size: 32, synthetic_samples: 4096,
        eval_every: 0, strategy: fsdp}
fault: {beat_s: 0.5, stale_s: 3, startup_timeout_s: 120, step_timeout_s: 10}
"""


def test_an_fsdp_run_whose_rank_is_killed_restarts_in_the_job_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL of rank 1 once the step-20 shard set is committed: the supervisor restarts the
    launch in the allocation, it resumes from that shard set, and ends with the weights of a
    twin run that no fault touched."""
    job_file = tmp_path / "fsdp-faults.yaml"
    job_file.write_text(FAULTS)
    twin = e2e.submit(slurm_cluster, tmp_path / "twin", str(job_file))
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file))
    committed = job.run_dir / "checkpoints" / f"step-{FAULT_AT:08d}" / "digests.json"
    e2e.wait_for(str(committed), committed.exists, timeout_s=120)
    pids = e2e.wait_for("rank 1", lambda: e2e.rank_pids(job.job_id, 1, launch=0))
    os.kill(int(pids[-1]), signal.SIGKILL)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
    dead, again = e2e.ledger(job.run_dir)
    assert (dead.cause, dead.next) == (EndCause.CRASH, "restart")
    assert again.resumed_from_step is not None
    assert again.resumed_from_step >= FAULT_AT
    assert e2e.wait_done(slurm_cluster, twin.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    assert exported_digest(slurm_cluster, job.run_dir) == exported_digest(
        slurm_cluster, twin.run_dir
    )


def test_an_fsdp_run_through_a_storm_of_interruptions_ends_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """One run: stopped by the lead-time signal and requeued, then a rank killed and the launch
    restarted in the job, then stopped and requeued again; it ends with its untouched twin's
    weights, each attempt resuming from the shard set the previous one committed."""
    job_file = tmp_path / "fsdp-faults.yaml"
    job_file.write_text(FAULTS)
    twin = e2e.submit(slurm_cluster, tmp_path / "twin", str(job_file))
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file))

    def after_commit(step: int) -> None:
        record = job.run_dir / "checkpoints" / f"step-{step:08d}" / "digests.json"
        e2e.wait_for(str(record), record.exists, timeout_s=180, release=(slurm_cluster, job.job_id))

    after_commit(10)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")
    after_commit(30)
    pids = e2e.wait_for("rank 1", lambda: e2e.rank_pids(job.job_id, 1, launch=0))
    os.kill(int(pids[-1]), signal.SIGKILL)
    after_commit(50)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "2"), fields
    attempts = e2e.ledger(job.run_dir)
    causes = [a.cause for a in attempts]
    assert causes == [EndCause.TIME_LIMIT, EndCause.CRASH, EndCause.TIME_LIMIT, EndCause.FINISHED]
    assert all(a.resumed_from_step for a in attempts[1:])  # each from a committed shard set
    assert e2e.wait_done(slurm_cluster, twin.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    assert exported_digest(slurm_cluster, job.run_dir) == exported_digest(
        slurm_cluster, twin.run_dir
    )
