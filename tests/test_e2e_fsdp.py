"""FSDP on the real two-node dev cluster: ``train.strategy=fsdp`` trains over 2 nodes, each rank
writing its own shard, and a run stopped by the lead-time signal and requeued, or restarted in
the job after a rank was killed, ends with the whole weights bit-identical to the uninterrupted
run's (exported from the last shard set)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from hpc_ddp.checkpoint.digest import weights_digest
from hpc_ddp.config.elastic import Resize
from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster
from tests.seen_samples import seen
from tests.test_e2e_elastic import EPOCHS, RECORDED, SAMPLES, every_index, stop_mid_epoch

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

FSDP = ["train.strategy=fsdp", "train.epochs=2", "train.log_every=1"]


def exported_digest(cluster: Cluster, run_dir: Path) -> str:
    """The weights digest of the newest verified shard set, as ``--export`` writes them."""
    out = run_dir / "exported.pt"
    del cluster  # reading files needs no Slurm
    e2e.hpc_here("checkpoints", str(run_dir), "--export", str(out))
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


def _faulted_and_twin(cluster: Cluster, tmp_path: Path) -> tuple[e2e.Submitted, e2e.Submitted]:
    """Two runs of :data:`FAULTS`: the one a test interrupts, and its twin that nothing
    touches."""
    job_file = tmp_path / "fsdp-faults.yaml"
    job_file.write_text(FAULTS)
    twin = e2e.submit(cluster, tmp_path / "twin", str(job_file))
    return e2e.submit(cluster, tmp_path / "runs", str(job_file)), twin


def _assert_same_weights(cluster: Cluster, job: e2e.Submitted, twin: e2e.Submitted) -> None:
    """The twin ends, and the interrupted run's exported weights are the twin's."""
    assert e2e.wait_done(cluster, twin.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    assert exported_digest(cluster, job.run_dir) == exported_digest(cluster, twin.run_dir)


def test_an_fsdp_run_whose_rank_is_killed_restarts_in_the_job_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL of rank 1 once the step-20 shard set is committed: the supervisor restarts the
    launch in the allocation, it resumes from that shard set, and ends with the weights of a
    twin run that no fault touched."""
    job, twin = _faulted_and_twin(slurm_cluster, tmp_path)
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
    _assert_same_weights(slurm_cluster, job, twin)


def test_an_fsdp_run_through_a_storm_of_interruptions_ends_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """One run: stopped by the lead-time signal and requeued, then a rank killed and the launch
    restarted in the job, then stopped and requeued again; it ends with its untouched twin's
    weights, each attempt resuming from the shard set the previous one committed."""
    job, twin = _faulted_and_twin(slurm_cluster, tmp_path)

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
    _assert_same_weights(slurm_cluster, job, twin)


def test_an_fsdp_run_resumed_on_one_node_of_two_is_resharded_and_sample_exact(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """``hpc-ddp resume RUN slurm.nodes=1 --elastic`` of an FSDP run stopped mid-epoch on 2
    nodes: the one rank loads both ranks' shards (DCP reshards them), accumulates 2
    micro-batches to keep the global batch, and the run reads every sample of the interrupted
    epoch exactly once, as an uninterrupted run does."""
    shape = [f"train.synthetic_samples={SAMPLES}", "requeue.max_requeues=0"]
    fsdp = [*RECORDED, *shape, "train.strategy=fsdp"]
    ref = e2e.submit(slurm_cluster, tmp_path / "ref", "jobs/quickstart.yaml", *fsdp)
    job = e2e.submit(slurm_cluster, tmp_path / "run", "jobs/quickstart.yaml", *fsdp)
    stopped = stop_mid_epoch(slurm_cluster, job, after=4)
    out = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "slurm.nodes=1", "--elastic",
                  "--json")  # fmt: skip
    assert "sample-exact, not bit-exact: 2 -> 1 ranks with the same global batch" in out.stderr
    again = json.loads(out.stdout)
    assert e2e.wait_done(slurm_cluster, again["job_id"])["JobState"] == "COMPLETED"
    assert e2e.wait_done(slurm_cluster, ref.job_id)["JobState"] == "COMPLETED"
    assert seen(job.run_dir) == seen(ref.run_dir) == every_index(SAMPLES, EPOCHS)
    _, second = e2e.ledger(job.run_dir)
    assert second.resize == Resize(2, 1, 1, 2)
    assert second.resumed_from_step == stopped
    log = (job.run_dir / "logs" / "rank-0.err").read_text(errors="replace")
    assert f"elastic resume from step-{stopped:08d}: 2 ranks x accumulation 1 -> 1 rank" in log
    assert "the model and optimizer resharded by DCP" in log


def _own_script_job(directory: Path) -> Path:
    return e2e.helper_job(directory, "fsdp-own", "fsdp_own.py", f"'{OWN_STEPS}'")


OWN_STEPS = 60


def test_your_own_fsdp_script_requeued_mid_run_ends_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """``s.wrap(model, strategy="fsdp")`` in a script of your own, over 2 nodes: stopped by the
    time-limit warning and requeued, it goes on from its newest shard set and ends with the
    weights of the same script run without a stop."""
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(_own_script_job(tmp_path)))
    e2e.wait_step(job.run_dir, 25)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")  # the time-limit warning, tasks only
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    attempts = e2e.ledger(job.run_dir)
    assert [a.cause for a in attempts] == [EndCause.TIME_LIMIT, EndCause.FINISHED]
    resumed = attempts[1].resumed_from_step
    assert resumed is not None
    assert 20 <= resumed < OWN_STEPS
    final = job.run_dir / "checkpoints" / f"step-{OWN_STEPS:08d}"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "digests.json"} <= {
        p.name for p in final.iterdir()
    }
    twin = e2e.submit(slurm_cluster, tmp_path / "twin", str(_own_script_job(tmp_path)))
    assert e2e.wait_done(slurm_cluster, twin.job_id)["JobState"] == "COMPLETED"
    assert [a.cause for a in e2e.ledger(twin.run_dir)] == [EndCause.FINISHED]
    assert exported_digest(slurm_cluster, job.run_dir) == exported_digest(
        slurm_cluster, twin.run_dir
    )
