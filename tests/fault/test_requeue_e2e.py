"""Issue 6 on the real two-node dev cluster: every way a training job gets stopped.

Each test submits the quickstart job through the CLI, stops it the way Slurm or a person
would (the lead-time signal, a preemption, ``scontrol requeue``, an array task's signal, a
SIGKILLed rank, the real time limit, a signal whose requeue request fails because the tasks
cannot reach Slurm), and checks what the issue promises: the final weights are
bit-identical to an uninterrupted run of the same config, the ledger names each attempt's
cause, and Slurm's own ``Restarts`` count shows exactly the requeues there should be.

All jobs run with one intra-op thread per rank (:data:`tests.e2e_util.STEADY_THREADS`) and log
every step, so the tests can signal at a step they have seen and the pace stays steady when the
2-core machine is busy.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from hpc_ddp.exitcodes import BUDGET_EXIT_CODE, REQUEUE_FAILED_EXIT_CODE
from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.taskconfig import load_task_config
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

QUICKSTART = "jobs/quickstart.yaml"
STEPS = 128  # 4 epochs of 32 steps (4096 samples, 64 per rank, 2 ranks)
STEPS_PER_EPOCH = 32
CKPT_EVERY = 20
TRAIN = [
    "train.epochs=4",
    f"train.checkpoint_every={CKPT_EVERY}",
    "train.log_every=1",
    e2e.STEADY_THREADS,
]

Reference = tuple[int, str]


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """(step, weights digest) of the uninterrupted run every stopped run must end up equal to."""
    job = e2e.submit(slurm_cluster, tmp_path_factory.mktemp("reference"), QUICKSTART, *TRAIN)
    assert e2e.wait_done(slurm_cluster, job.job_id)["JobState"] == "COMPLETED"
    assert e2e.causes(job.run_dir) == ["finished"]
    ref = e2e.final_digest(slurm_cluster, job.run_dir)
    assert ref[0] == STEPS
    return ref


def assert_resumed_in_place(run_dir: Path) -> None:
    """Each attempt started from the checkpoint the one before it left, at its step."""
    attempts = e2e.ledger(run_dir)
    for before, after in itertools.pairwise(attempts):
        assert before.steps_done is not None
        assert before.checkpoint == f"step-{before.steps_done:08d}.pt"
        assert after.resumed_from == before.checkpoint
        assert after.resumed_from_step == before.steps_done


@pytest.mark.parametrize("full", [False, True], ids=["tasks", "full"])
def test_time_limit_signal_saves_requeues_and_resumes_bit_identical(
    slurm_cluster: Cluster, tmp_path: Path, reference: Reference, full: bool
) -> None:
    """The lead-time USR2 (tasks only, as Slurm sends it; and with --full to shell and srun)."""
    job = e2e.submit(slurm_cluster, tmp_path, QUICKSTART, *TRAIN)
    seen = e2e.wait_step(job.run_dir, 10)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2", full=full)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "COMPLETED"
    assert fields["Restarts"] == "1"
    assert e2e.final_digest(slurm_cluster, job.run_dir) == reference
    first, second = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True)
    assert first.steps_done is not None
    assert seen <= first.steps_done < STEPS  # stopped at a later step boundary: nothing lost
    assert (second.cause, second.attempt, second.steps_done) == (EndCause.FINISHED, 1, STEPS)
    assert_resumed_in_place(job.run_dir)
    row = e2e.status(slurm_cluster, job.run_dir)
    assert (row["state"], row["attempts"]) == ("COMPLETED", 2)
    assert row["causes"] == ["time_limit", "finished"]


def test_preempted_job_requeues_within_grace_time_and_resumes(
    slurm_cluster: Cluster, tmp_path: Path, reference: Reference
) -> None:
    """A job in `low` (GraceTime=10) is preempted by one in `high` that needs every CPU."""
    # --exclusive: the preemptor then needs this job's nodes and no one else's.
    job = e2e.submit(
        slurm_cluster, tmp_path, QUICKSTART, *TRAIN, "slurm.partition=low", "slurm.exclusive=true"
    )
    e2e.wait_step(job.run_dir, 10, timeout_s=180)
    high = slurm_cluster.run(
        "sbatch", "--parsable", "-p", "high", "-N2", "--ntasks-per-node=1", "-c", "4",
        "-o", str(tmp_path / "high-%j.out"), "--wrap", "sleep 1",
    ).stdout.strip()  # fmt: skip
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "COMPLETED"
    assert fields["Restarts"] == "1"  # hpc-ddp's requeue only: Slurm did not requeue it again
    assert e2e.job_fields(slurm_cluster, high)["JobState"] == "COMPLETED"
    assert e2e.final_digest(slurm_cluster, job.run_dir) == reference
    first, second = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.PREEMPTED, True)
    assert (second.cause, second.steps_done) == (EndCause.FINISHED, STEPS)
    assert_resumed_in_place(job.run_dir)


def test_manual_scontrol_requeue_is_not_requeued_twice(
    slurm_cluster: Cluster, tmp_path: Path, reference: Reference
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path, QUICKSTART, *TRAIN)
    e2e.wait_step(job.run_dir, 10)
    slurm_cluster.run("scontrol", "requeue", job.job_id)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "COMPLETED"
    assert fields["Restarts"] == "1"  # Slurm's requeue, and no second one from hpc-ddp
    assert e2e.final_digest(slurm_cluster, job.run_dir) == reference
    first, second = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.MANUAL_REQUEUE, False)
    assert (second.cause, second.steps_done) == (EndCause.FINISHED, STEPS)
    assert_resumed_in_place(job.run_dir)


@pytest.mark.slow
def test_three_interruptions_mid_epoch_after_a_checkpoint_and_late(
    slurm_cluster: Cluster, tmp_path: Path, reference: Reference
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path, QUICKSTART, *TRAIN)
    # 1: in the middle of the first epoch.
    e2e.wait_step(job.run_dir, 10)
    e2e.signal_job(slurm_cluster, job.job_id)
    watch = (slurm_cluster, job.job_id)  # released at once when Slurm holds the requeued job
    first = e2e.wait_attempt(job.run_dir, 1, release=watch).resumed_from_step
    assert first is not None
    assert first % STEPS_PER_EPOCH != 0
    # 2: just after a periodic checkpoint of the second attempt, once its file is in place.
    target = (first // CKPT_EVERY + 1) * CKPT_EVERY
    if target - first < 3:
        target += CKPT_EVERY
    e2e.wait_checkpoint(job.run_dir, target, release=watch)
    e2e.signal_job(slurm_cluster, job.job_id)
    second = e2e.wait_attempt(job.run_dir, 2, release=watch).resumed_from_step
    assert second is not None
    assert target <= second < target + CKPT_EVERY
    # 3: later on, in the third attempt.
    e2e.wait_step(job.run_dir, second + 10, release=watch)
    e2e.signal_job(slurm_cluster, job.job_id)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "COMPLETED"
    assert fields["Restarts"] == "3"
    assert e2e.final_digest(slurm_cluster, job.run_dir) == reference
    attempts = e2e.ledger(job.run_dir)
    assert [a.attempt for a in attempts] == [0, 1, 2, 3]
    assert e2e.causes(job.run_dir) == ["time_limit"] * 3 + ["finished"]
    assert all(a.requeue_requested for a in attempts[:3])
    assert_resumed_in_place(job.run_dir)


@pytest.mark.slow
def test_array_task_signalled_alone_is_requeued_alone(
    slurm_cluster: Cluster, tmp_path: Path, reference: Reference
) -> None:
    """Three tasks; task 1 (seed 0: the reference's config) gets the USR2, and only it."""
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        f"base: {e2e.REPO / QUICKSTART}\nsweep:\n  grid:\n    train.seed: [1, 0, 2]\n"
    )
    result = e2e.sweep(slurm_cluster, tmp_path / "runs", sweep_file, *TRAIN)
    [array] = result["array_jobs"]
    task_dirs = [Path(result["sweep_dir"], "tasks", str(i)) for i in range(3)]
    assert load_task_config(Path(result["sweep_dir"]), 1).train.seed == 0
    e2e.wait_step(task_dirs[1], 10, timeout_s=180)
    e2e.signal_job(slurm_cluster, f"{array}_1")
    final = e2e.wait_all_done(slurm_cluster, [f"{array}_{i}" for i in range(3)], timeout_s=240)
    assert [f["JobState"] for f in final] == ["COMPLETED"] * 3
    assert [f["Restarts"] for f in final] == ["0", "1", "0"]
    assert [e2e.causes(d) for d in task_dirs] == [
        ["finished"],
        ["time_limit", "finished"],
        ["finished"],
    ]
    [task1_first, _] = e2e.ledger(task_dirs[1])
    assert task1_first.job_ref == f"{array}_1"
    assert task1_first.requeue_requested
    assert e2e.final_digest(slurm_cluster, task_dirs[1]) == reference
    assert_resumed_in_place(task_dirs[1])
    for d in (task_dirs[0], task_dirs[2]):
        assert e2e.final_digest(slurm_cluster, d)[0] == STEPS


def test_budget_exhausted_ends_failed_with_a_clear_message(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path, QUICKSTART, *TRAIN, "requeue.max_requeues=1")
    e2e.wait_step(job.run_dir, 10)
    e2e.signal_job(slurm_cluster, job.job_id)
    watch = (slurm_cluster, job.job_id)
    resumed = e2e.wait_attempt(job.run_dir, 1, release=watch).resumed_from_step
    assert resumed is not None
    e2e.wait_step(job.run_dir, resumed + 5)
    e2e.signal_job(slurm_cluster, job.job_id)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "FAILED"
    assert fields["ExitCode"] == f"{BUDGET_EXIT_CODE}:0"
    assert fields["Restarts"] == "1"
    first, last = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True)
    assert (last.cause, last.requeue_requested) == (EndCause.BUDGET_EXHAUSTED, False)
    assert last.message is not None
    assert "requeue.max_requeues=1" in last.message
    assert "HINT" in last.message
    # Nothing was lost: the last attempt saved where it stopped, for a resubmission to use.
    assert last.steps_done is not None
    assert e2e.final_digest(slurm_cluster, job.run_dir)[0] == last.steps_done
    assert "requeue budget exhausted" in (job.run_dir / "logs" / "rank-0.err").read_text()
    row = e2e.status(slurm_cluster, job.run_dir)
    assert (row["state"], row["causes"]) == ("FAILED", ["time_limit", "budget_exhausted"])


def container_scontrol(cluster: Cluster, where: Path, *, requeue_s: float = 0.0) -> str:
    """An ``env.setup`` line that gives the job's tasks the ``scontrol`` of a container that
    has Slurm's config but not munged's socket: the real command, failing as it does there
    ("Munge encode failed: Failed to access ..."), while srun and the batch shell are unchanged.
    ``requeue_s``: how long its ``scontrol requeue`` takes to fail (a controller far away).
    """
    real = shutil.which("scontrol", path=cluster.env["PATH"])
    assert real is not None
    conf = where / "container-slurm.conf"
    text, n = re.subn(
        r"(AuthInfo=socket=)[^,\s]+",
        rf"\g<1>{where}/no-munge/munge.socket",
        cluster.conf.read_text(),
    )
    assert n == 1
    conf.write_text(text)
    bin_dir = where / "container-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "scontrol"
    slow = f'[ "$1" = requeue ] && sleep {requeue_s}\n' if requeue_s else ""
    wrapper.write_text(f'#!/bin/sh\n{slow}SLURM_CONF={conf} exec {real} "$@"\n')
    wrapper.chmod(0o755)
    return f'env.setup=["export PATH={bin_dir}:$PATH"]'


def test_failed_requeue_ends_failed_with_the_checkpoint_kept(
    slurm_cluster: Cluster, tmp_path: Path, reference: Reference
) -> None:
    """Issue 11: the tasks cannot reach Slurm when the lead-time signal comes. Before, the
    failed `scontrol requeue` was taken for "Slurm requeued it": requeue_requested in the
    ledger and the job COMPLETED with training unfinished.

    Its failure takes 11 s, past the 10 s step deadline: rank 1, waiting meanwhile for rank 0's
    word, is in the stop, not in a hung step (before, it declared a hang, and the restart in
    the allocation trained to the end: COMPLETED)."""
    scontrol = container_scontrol(slurm_cluster, tmp_path, requeue_s=11)
    job = e2e.submit(slurm_cluster, tmp_path, QUICKSTART, *TRAIN, scontrol)
    seen = e2e.wait_step(job.run_dir, 10)
    e2e.signal_job(slurm_cluster, job.job_id)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert fields["JobState"] == "FAILED"
    assert fields["ExitCode"] == f"{REQUEUE_FAILED_EXIT_CODE}:0"
    assert fields["Restarts"] == "0"  # nothing requeued it
    [attempt] = e2e.ledger(job.run_dir)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.REQUEUE_FAILED, False)
    assert attempt.steps_done is not None
    assert seen <= attempt.steps_done < STEPS
    # The checkpoint where it stopped is in place, whole, and named in the message.
    assert attempt.checkpoint == f"step-{attempt.steps_done:08d}.pt"
    assert (job.run_dir / "checkpoints" / attempt.checkpoint).is_file()
    assert e2e.final_digest(slurm_cluster, job.run_dir)[0] == attempt.steps_done
    assert attempt.message is not None
    assert f"could not requeue job {job.job_id}" in attempt.message
    assert "Munge encode failed" in attempt.message  # what the real scontrol said
    assert f"checkpoint at step {attempt.steps_done} ({attempt.checkpoint}) is kept" in (
        attempt.message
    )
    assert "HINT: let the job reach Slurm" in attempt.message
    assert (
        f"could not requeue job {job.job_id}" in (job.run_dir / "logs" / "rank-0.err").read_text()
    )
    assert e2e.status(slurm_cluster, job.run_dir)["state"] == "FAILED"
    # The HINT works: `scontrol requeue` from where Slurm answers resumes at that checkpoint,
    # and the run ends with the uninterrupted run's weights.
    slurm_cluster.run("scontrol", "requeue", job.job_id)
    fields = e2e.wait_done(slurm_cluster, job.job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1")
    assert e2e.causes(job.run_dir) == ["requeue_failed", "finished"]
    assert_resumed_in_place(job.run_dir)
    assert e2e.final_digest(slurm_cluster, job.run_dir) == reference


def test_a_killed_rank_fails_the_job_fast_and_is_named(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Without the supervisor (``fault.enabled: false``: one srun step, --kill-on-bad-exit),
    a killed rank ends the job FAILED at once, blamed on that rank and node. With it, the same
    kill is restarted in the allocation (tests/fault/test_faults_e2e.py)."""
    job = e2e.submit(slurm_cluster, tmp_path, QUICKSTART, *TRAIN, "fault.enabled=false")
    e2e.wait_step(job.run_dir, 10)
    [pid] = e2e.rank_pids(job.job_id, rank=1)
    node = dict(
        v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v
    )["SLURMD_NODENAME"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=60)
    assert time.monotonic() - killed < 60
    assert fields["JobState"] == "FAILED"
    assert fields["Restarts"] == "0"  # a crash is not a preemption
    [attempt] = e2e.ledger(job.run_dir)
    assert attempt.cause in (None, EndCause.CRASH)  # rank 0 may record the lost peer
    assert not attempt.requeue_requested
    assert f"srun: error: {node}: task 1: Killed" in e2e.batch_log(job.run_dir, job.job_id)
    row = e2e.status(slurm_cluster, job.run_dir)
    assert row["state"] == "FAILED"
    assert row["failed_rank"] == f"rank 1 on {node}: Killed"
    table = e2e.hpc(slurm_cluster, "status", str(job.run_dir)).stdout
    assert f"failed first: rank 1 on {node}: Killed" in table


# The real time limit: --time=2 and USR2 60 s ahead. Slurm checks limits every 30 s at a fixed
# phase and sends the signal at the first check within lead + 30 s of the end, so each attempt
# gets it 30-60 s after it started, and the kill would come 120-150 s after. The job trains about
# 65 s (wall clock, whatever the CPU load: the data "arrives" slowly), so the first attempt is
# always stopped by the signal; the second usually finishes, and may be stopped once more.
TIME_LIMITED = [
    "slurm.time=2",
    "requeue.lead_time=60",
    # A quiet machine trains ~140 steps an attempt (its start-up ~15 s of the 60 before the
    # warning); a loaded one half that: 2 attempts, or 4, never the budget.
    "requeue.max_requeues=6",
    "train.dataset=tests.e2e_util:io_bound_synthetic",
    "train.max_steps=240",
    "train.checkpoint_every=0",
    "train.eval_every=0",
    "train.log_every=10",
    e2e.STEADY_THREADS,
]


@pytest.mark.slow
@pytest.mark.timeout(900)  # up to 6 attempts of 2 minutes on a loaded machine
def test_real_time_limit_requeues_and_completes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    # The uninterrupted run has no time to spare under --time=2: it gets 10 minutes, and runs
    # beside the limited job (both mostly wait for their data, so neither slows the other).
    ref_job = e2e.submit(
        slurm_cluster, tmp_path / "ref", QUICKSTART, *TIME_LIMITED, "slurm.time=10"
    )
    job = e2e.submit(slurm_cluster, tmp_path / "limited", QUICKSTART, *TIME_LIMITED)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=780)
    assert fields["JobState"] == "COMPLETED", e2e.story(job.run_dir)
    requeues = int(fields["Restarts"])
    assert 1 <= requeues <= 5, e2e.story(job.run_dir)
    assert e2e.causes(job.run_dir) == ["time_limit"] * requeues + ["finished"]
    attempts = e2e.ledger(job.run_dir)
    assert all(a.requeue_requested for a in attempts[:-1])
    first = attempts[0]
    assert first.ended is not None
    assert first.steps_done  # it trained, then was stopped by the warning, before the kill
    assert first.ended - first.started < 60, e2e.story(job.run_dir)
    assert_resumed_in_place(job.run_dir)
    assert e2e.wait_done(slurm_cluster, ref_job.job_id, timeout_s=120)["JobState"] == "COMPLETED"
    reference = e2e.final_digest(slurm_cluster, ref_job.run_dir)
    assert reference[0] == 240
    assert e2e.final_digest(slurm_cluster, job.run_dir) == reference
