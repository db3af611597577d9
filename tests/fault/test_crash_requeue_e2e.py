"""``requeue.on_crash`` on the real two-node dev cluster: a crash is requeued once, then resumes.

The job is a ``command:`` script that uses the session API and raises on rank 1 at step 8 of
its first attempt only. Rank 1 asks Slurm for the requeue (rank 0 dies of the lost connection
and asks nothing); the second attempt resumes from the step-5 checkpoint and finishes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

STEPS = 30
CRASH_AT = 8
CKPT_EVERY = 5


def job_file(tmp_path: Path, *, on_crash: bool) -> Path:
    return e2e.crashy_job(tmp_path, STEPS, CKPT_EVERY, CRASH_AT, on_crash=on_crash)


def test_on_crash_requeues_once_and_the_next_attempt_resumes(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file(tmp_path, on_crash=True)))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["Restarts"] == "1"  # exactly one requeue: one process asked, once
    first, second = e2e.ledger(job.run_dir)
    assert (first.attempt, first.cause, first.requeue_requested) == (0, EndCause.CRASH, True)
    assert first.steps_done == CRASH_AT
    assert first.checkpoint == f"step-{CKPT_EVERY:08d}.pt"
    assert first.message is not None
    assert first.message.startswith("rank 1 ")  # the rank that crashed, not its peer
    assert "injected crash at step 8" in first.message
    assert (second.attempt, second.cause, second.steps_done) == (1, EndCause.FINISHED, STEPS)
    assert (second.resumed_from, second.resumed_from_step) == (first.checkpoint, CKPT_EVERY)
    assert e2e.final_digest(slurm_cluster, job.run_dir)[0] == STEPS


def test_without_on_crash_a_crash_ends_the_job_failed(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file(tmp_path, on_crash=False)))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "0")
    [attempt] = e2e.ledger(job.run_dir)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, False)


# --- a `command:` child killed outright: only the `hpc_ddp run` above it can tell Slurm --------

KILL_AT = 8


def _killed_rank_log(run_dir: Path) -> str:
    return (run_dir / "logs" / "rank-1.err").read_text(errors="replace")


def _one_end_of_attempt_0(run_dir: Path) -> None:
    """Exactly one process wrote the first attempt's end: the claim kept the others quiet."""
    lines = (run_dir / "ledger.jsonl").read_text().splitlines()
    ends = [line for line in lines if '"attempt_end"' in line and '"attempt": 0,' in line]
    assert len(ends) == 1, lines


def test_a_command_child_killed_by_sigkill_is_requeued_with_on_crash(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Rank 1's program dies of SIGKILL at step 8 of its first attempt (no Python runs after
    it); its ``hpc_ddp run`` parent takes the crash path: one requeue, then the run resumes
    from the step-5 checkpoint and completes. Rank 0's program dies of the lost connection
    at the same moment; whichever of the two claims the crash first asks Slurm, once."""
    config = e2e.crashy_job(tmp_path, STEPS, CKPT_EVERY, KILL_AT, on_crash=True, how="sigkill")
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(config))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["Restarts"] == "1"  # exactly one requeue
    first, second = e2e.ledger(job.run_dir)
    assert (first.attempt, first.cause, first.requeue_requested) == (0, EndCause.CRASH, True)
    _one_end_of_attempt_0(job.run_dir)
    assert "was killed by SIGKILL" in _killed_rank_log(job.run_dir)
    assert (second.attempt, second.cause, second.steps_done) == (1, EndCause.FINISHED, STEPS)
    assert (second.resumed_from, second.resumed_from_step) == (
        f"step-{CKPT_EVERY:08d}.pt",
        CKPT_EVERY,
    )
    assert e2e.final_digest(slurm_cluster, job.run_dir)[0] == STEPS


def test_a_command_child_killed_by_sigkill_without_on_crash_fails_the_job(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    config = e2e.crashy_job(tmp_path, STEPS, CKPT_EVERY, KILL_AT, on_crash=False, how="sigkill")
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(config))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "0")
    [attempt] = e2e.ledger(job.run_dir)
    assert (attempt.cause, attempt.requeue_requested) == (EndCause.CRASH, False)
    assert attempt.message is not None
    assert f"`hpc-ddp resume {job.run_dir}`" in attempt.message  # how to go on after a fix
    assert "was killed by SIGKILL" in _killed_rank_log(job.run_dir)
