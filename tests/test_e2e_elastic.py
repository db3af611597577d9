"""Elastic runs on the dev cluster: a run goes on at another world size with the same global
batch, and every sample of the interrupted epoch is seen exactly once.

The training data records each index it hands out (:mod:`tests.seen_samples`), in every attempt
and on every rank, so the proof is the multiset of samples the run read: the same as an
uninterrupted run's. With 1024 (960) samples and a global batch of 64 (96) an epoch is whole
steps with no padding, so an uninterrupted run of 2 epochs reads every index exactly twice (the
2 -> 1 test also runs one and compares). Three ways to change size:

* ``hpc-ddp resume RUN slurm.nodes=1 --elastic``: 2 ranks x 32 x 1 -> 1 rank x 32 x 2;
* ``hpc-ddp resume RUN slurm.tasks_per_node=3 --elastic``: 1 rank x 32 x 3 -> 3 ranks x 32 x 1;
* a requeue of a ``slurm.min_nodes: 1`` run (``--nodes=1-2``) that lands on one node, the
  other taken by another job: the supervisor trains on the node it got, 2 ranks -> 1, with no
  command at all.

Each says sample-exact, not bit-exact where the user sees it: the resume's ``changed:`` lines,
the ledger's ``resize`` and the rank's log.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from hpc_ddp.config.elastic import Resize
from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster
from tests.seen_samples import seen

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

SAMPLES = 1024
EPOCHS = 2
RECORDED = [
    "train.dataset=tests.seen_samples:seen_synthetic",
    "train.image_size=8",
    "train.batch_size=32",
    f"train.epochs={EPOCHS}",
    "train.checkpoint_every=1000",  # the stop's own checkpoint only
    "train.eval_every=0",
    "train.log_every=1",
    e2e.STEADY_THREADS,
]
SAMPLE_EXACT_LOG = "(the same global batch): sample-exact, not bit-exact; RNG reseeded from"


def every_index(samples: int, times: int) -> collections.Counter[int]:
    """What an uninterrupted run of ``times`` whole epochs reads: each index ``times`` times."""
    return collections.Counter({i: times for i in range(samples)})


def stop_mid_epoch(cluster: Cluster, job: e2e.Submitted, after: int) -> int:
    """USR2 once step ``after`` is logged (requeue budget 0: the run stops, saves, does not
    come back); the step it stopped at."""
    e2e.wait_step(job.run_dir, after)
    e2e.signal_job(cluster, job.job_id)
    e2e.wait_done(cluster, job.job_id)
    [first] = e2e.ledger(job.run_dir)
    assert first.cause is EndCause.BUDGET_EXHAUSTED, first
    assert first.steps_done is not None
    return first.steps_done


def rank_log(run_dir: Path, rank: int = 0) -> str:
    return (run_dir / "logs" / f"rank-{rank}.err").read_text(errors="replace")


def test_a_resume_on_one_node_of_two_sees_every_sample_once_with_the_same_global_batch(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    shape = [f"train.synthetic_samples={SAMPLES}", "requeue.max_requeues=0"]
    ref = e2e.submit(slurm_cluster, tmp_path / "ref", "jobs/quickstart.yaml", *RECORDED, *shape)
    job = e2e.submit(slurm_cluster, tmp_path / "run", "jobs/quickstart.yaml", *RECORDED, *shape)
    stopped = stop_mid_epoch(slurm_cluster, job, after=4)
    steps_per_epoch = SAMPLES // 64
    assert 0 < stopped < steps_per_epoch  # inside epoch 0: its rest is dealt out anew

    plain = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "slurm.nodes=1", check=False)
    assert plain.returncode == 2
    assert "or add --elastic to go on at 1 ranks with the same global batch" in plain.stderr

    out = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "slurm.nodes=1", "--elastic",
                  "--json")  # fmt: skip
    said = out.stderr
    assert "sample-exact, not bit-exact: 2 -> 1 ranks with the same global batch" in said
    assert (
        "changed: train.grad_accum: 1 -> 2 (--elastic: keeps the global batch of 2 ranks x 32 "
        "x accumulation 1 (64 samples))"
    ) in said
    assert "changed: world size: 2 -> 1 ranks (--elastic): sample-exact, not bit-exact" in said
    again = json.loads(out.stdout)
    assert e2e.wait_done(slurm_cluster, again["job_id"])["JobState"] == "COMPLETED"
    assert e2e.wait_done(slurm_cluster, ref.job_id)["JobState"] == "COMPLETED"

    # The multiset of samples the run read equals the uninterrupted run's: each index twice.
    assert seen(job.run_dir) == seen(ref.run_dir) == every_index(SAMPLES, EPOCHS)
    first, second = e2e.ledger(job.run_dir)
    assert (first.world_size, first.grad_accum) == (2, 1)
    assert (second.world_size, second.grad_accum) == (1, 2)
    assert second.resize == Resize(2, 1, 1, 2)
    assert second.resumed_from_step == stopped
    # `status --attempts` shows the resize: the ranks column and the words of it.
    table = e2e.hpc(slurm_cluster, "status", str(job.run_dir), "--attempts").stdout
    resumed = next(line for line in table.splitlines() if "resized:" in line)
    assert " 2->1 " in resumed
    assert "resized: 2 ranks x accumulation 1 -> 1 rank x accumulation 2" in resumed
    [whole] = e2e.ledger(ref.run_dir)
    assert second.steps_done == whole.steps_done == EPOCHS * steps_per_epoch
    log = rank_log(job.run_dir)
    assert f"elastic resume from step-{stopped:08d}.pt: 2 ranks x accumulation 1 -> 1 rank x " \
        f"accumulation 2 {SAMPLE_EXACT_LOG}" in log  # fmt: skip
    assert f"the data goes on at sample {stopped * 64} of epoch 0" in log
    # The resumed attempt names one exactness, sample-exact; "bit-identical" is only the first
    # attempt's word on a resume at its own world size.
    resumed_log = log.split("elastic resume from", 1)[1]
    assert "exactness: this resume (2 -> 1 ranks, the same global batch) is sample-exact, " \
        "not bit-exact" in resumed_log  # fmt: skip
    assert "bit-identical" not in resumed_log
    assert "global batch 64 = 32 per rank x 1 ranks x 2 accumulation; 16 steps/epoch" in log


def test_a_resume_from_one_rank_to_three_sees_every_sample_once(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """1 rank x 32 x 3 -> 1 node x 3 tasks x 32 x 1: growing needs the accumulation to shrink;
    growing past it (4 ranks, less than a batch each) is refused."""
    samples = 960  # 10 steps of 96 per epoch
    one = ["slurm.nodes=1", "train.grad_accum=3", f"train.synthetic_samples={samples}",
           "requeue.max_requeues=0"]  # fmt: skip
    job = e2e.submit(slurm_cluster, tmp_path, "jobs/quickstart.yaml", *RECORDED, *one)
    stopped = stop_mid_epoch(slurm_cluster, job, after=3)
    assert 0 < stopped < samples // 96

    too_many = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "slurm.tasks_per_node=4",
                       "--elastic", check=False)  # fmt: skip
    assert too_many.returncode == 2
    assert "4 ranks would each need less than one batch per step" in too_many.stderr
    assert "HINT: go on with at most 3 ranks (1 or 3)" in too_many.stderr

    out = e2e.hpc(slurm_cluster, "resume", str(job.run_dir), "slurm.tasks_per_node=3",
                  "--elastic", "--json")  # fmt: skip
    assert "changed: train.grad_accum: 3 -> 1 (--elastic: keeps the global batch of 1 rank x " \
        "32 x accumulation 3 (96 samples))" in out.stderr  # fmt: skip
    again = json.loads(out.stdout)
    assert e2e.wait_done(slurm_cluster, again["job_id"])["JobState"] == "COMPLETED"

    assert seen(job.run_dir) == every_index(samples, EPOCHS)
    first, second = e2e.ledger(job.run_dir)
    assert (first.world_size, first.grad_accum) == (1, 3)
    assert second.resize == Resize(1, 3, 3, 1)
    assert (second.world_size, second.grad_accum, second.nodelist) == (3, 1, "n1")
    assert second.steps_done == EPOCHS * (samples // 96)
    for rank in range(3):
        log = rank_log(job.run_dir, rank)
        assert "1 rank x accumulation 3 -> 3 ranks x accumulation 1" in log
        assert "global batch 96 = 32 per rank x 3 ranks x 1 accumulation; 10 steps/epoch" in log


def start_on_both_nodes(cluster: Cluster, runs: Path, *overrides: str) -> e2e.Submitted:
    """Submit once no job holds n1 or n2, so that the ``--nodes=1-2`` job gets both (the
    cluster is shared: a job of someone else's may take one first; then try again)."""
    for _ in range(5):
        e2e.wait_for("n1 and n2 free", lambda: not cluster.run(
            "squeue", "-h", "-w", "n1,n2", "-o", "%i").stdout.strip(), timeout_s=120)  # fmt: skip
        job = e2e.submit(cluster, runs, "jobs/quickstart.yaml", *overrides)
        if e2e.wait_attempt(job.run_dir, 0).world_size == 2:
            return job
        cluster.run("scancel", job.job_id)
        cluster.wait_gone(job.job_id)
    pytest.fail("the --nodes=1-2 job never started on both nodes (the cluster stayed busy)")


def test_a_requeue_that_lands_on_fewer_nodes_of_a_min_nodes_range_goes_on_sample_exact(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """``slurm.min_nodes: 1`` with ``slurm.nodes: 2`` asks for ``--nodes=1-2``: Slurm gives
    both nodes when they are free. While it trains, a job that wants all of n2 queues behind
    it; the time-limit warning saves and requeues the run, the other job takes n2, and the run
    comes back on n1 alone: the supervisor trains on the node it got, 1 rank accumulating 2,
    with no command from anyone."""
    ranged = [*RECORDED, f"train.synthetic_samples={SAMPLES}", "slurm.min_nodes=1"]
    job = start_on_both_nodes(slurm_cluster, tmp_path, *ranged)
    script = (job.run_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1-2\n" in script
    assert "#SBATCH --mincpus=1\n" in script  # not --ntasks-per-node: see render._range_shape
    e2e.wait_step(job.run_dir, 4)
    blocker = slurm_cluster.run("sbatch", "--parsable", "-w", "n2", "--exclusive", "-o",
                                "/dev/null", "--wrap", "sleep 300").stdout.strip()  # fmt: skip
    try:
        e2e.signal_job(slurm_cluster, job.job_id)  # the time-limit warning: save, requeue
        e2e.wait_state(slurm_cluster, job.job_id, ["PENDING"], release=False)
        e2e.wait_state(slurm_cluster, blocker, ["RUNNING"])
        assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "COMPLETED"
    finally:
        slurm_cluster.run("scancel", blocker, check=False)

    assert seen(job.run_dir) == every_index(SAMPLES, EPOCHS)
    first, second = e2e.ledger(job.run_dir)
    assert (first.world_size, first.grad_accum, first.cause) == (2, 1, EndCause.TIME_LIMIT)
    assert (second.world_size, second.grad_accum, second.nodelist) == (1, 2, "n1")
    assert second.resize == Resize(2, 1, 1, 2)
    assert second.steps_done == EPOCHS * SAMPLES // 64
    log = rank_log(job.run_dir)
    assert SAMPLE_EXACT_LOG in log
    assert "global batch 64 = 32 per rank x 1 ranks x 2 accumulation; 16 steps/epoch" in log
    said = e2e.batch_log(job.run_dir, job.job_id)
    assert "supervisor: launch 0 (2 node(s))" in said
    assert "supervisor: launch 0 (1 node(s))" in said
