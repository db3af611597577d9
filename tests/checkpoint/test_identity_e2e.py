"""Checkpoint identity and damaged files on the real dev cluster (issue 31, items 1-3).

``R`` is a finished 2-rank run of ``jobs/quickstart.yaml`` (checkpoints at steps 20 and 30,
``keep_last: 2``); each test tampers with a copy of it (``cp -r``, as a user would) and then
asks the real CLI (``checkpoints --verify``, ``status``, ``resume``) and real jobs what they make
of it:

1. a copy of step 20 named ``step-00009999.pt`` is damaged: never the newest, never resumed
   from, never a reason to prune the real newest files;
2. a newer checkpoint copied in from another run (another seed and learning rate) is refused,
   both run ids named, and the resume goes on from this run's own newest;
3. a flipped bit in the zip trailer is damage, never a traceback; and on the node, a restart
   after a killed rank falls back past damaged checkpoints to the newest good one instead of
   dying on them until ``no_progress``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import parse_checkpoint_name
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

BASE = [
    "train.max_steps=30",
    "train.checkpoint_every=10",
    "train.log_every=5",
    "train.eval_every=0",
    e2e.STEADY_THREADS,
]


@pytest.fixture(scope="module")
def finished(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """R: a finished run with checkpoints at 20 and 30 (keep_last 2)."""
    runs = tmp_path_factory.mktemp("r")
    job = e2e.submit(slurm_cluster, runs, "jobs/quickstart.yaml", *BASE)
    assert e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    return job.run_dir


@pytest.fixture(scope="module")
def stranger(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another run (another seed and learning rate) with a checkpoint at step 50."""
    runs = tmp_path_factory.mktemp("s")
    job = e2e.submit(
        slurm_cluster,
        runs,
        "jobs/quickstart.yaml",
        *BASE,
        "train.max_steps=50",
        "train.checkpoint_every=50",
        "train.seed=7",
        "train.lr=0.2",
    )
    assert e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)["JobState"] == "COMPLETED"
    return job.run_dir


def _copy(run_dir: Path, where: Path) -> Path:
    copy = where / run_dir.name
    shutil.copytree(run_dir, copy)
    return copy


def _verify(cluster: Cluster, run_dir: Path) -> tuple[int, dict[int, dict[str, object]], str]:
    out = e2e.hpc(cluster, "checkpoints", str(run_dir), "--verify", "--json", check=False)
    rows = json.loads(out.stdout)["checkpoints"]
    return out.returncode, {row["step"]: row for row in rows}, out.stderr


def _resumed(cluster: Cluster, run_dir: Path, *overrides: str) -> tuple[str, str]:
    """``resume --force OVERRIDES`` to the end; (what resume printed, rank 0's log)."""
    out = e2e.hpc(cluster, "resume", str(run_dir), "--force", *overrides, "--json")
    job = json.loads(out.stdout)["job_id"]
    assert e2e.wait_done(cluster, job, timeout_s=300)["JobState"] == "COMPLETED"
    log = (run_dir / "logs" / "rank-0.err").read_text(errors="replace")
    return out.stderr, log


def _run_id(run_dir: Path) -> str:
    return (run_dir / "run_id").read_text().strip()


def test_a_copy_named_for_a_newer_step_is_never_resumed_from_nor_prunes_the_newest(
    slurm_cluster: Cluster, finished: Path, tmp_path: Path
) -> None:
    run = _copy(finished, tmp_path)
    ckpts = run / "checkpoints"
    shutil.copyfile(ckpts / "step-00000020.pt", ckpts / "step-00009999.pt")

    code, rows, err = _verify(slurm_cluster, run)
    assert code == 1
    assert rows[9999]["state"] == "damaged"
    assert rows[9999]["error"] == "named step 9999 but holds step 20 (copied or renamed)"
    assert "resume would use step-00000030.pt" in err
    row = e2e.status(slurm_cluster, run)
    assert row["checkpoint_step"] == 30
    assert "named step 9999 but holds step 20" in row["note"]

    said, log = _resumed(slurm_cluster, run, "train.max_steps=50")
    assert "from checkpoint step 30" in said
    assert "skipped: 1 newest checkpoint(s) damaged (step 9999: named step 9999" in said
    assert "resumed from step-00000030.pt: step 30" in log
    assert e2e.ledger(run)[-1].resumed_from_step == 30
    assert e2e.ledger(run)[-1].steps_done == 50
    # keep_last 2 counts this run's line only: 40 and 50 stay; the misnamed copy is kept
    # (for inspection) and never resumed from.
    names = sorted(p.name for p in ckpts.glob("step-*.pt"))
    assert names == ["step-00000040.pt", "step-00000050.pt", "step-00009999.pt"]
    assert e2e.status(slurm_cluster, run)["checkpoint_step"] == 50


def test_another_runs_checkpoint_is_refused_naming_both_runs(
    slurm_cluster: Cluster, finished: Path, stranger: Path, tmp_path: Path
) -> None:
    run = _copy(finished, tmp_path)
    shutil.copyfile(
        stranger / "checkpoints" / "step-00000050.pt", run / "checkpoints" / "step-00000050.pt"
    )
    mine, theirs = _run_id(run), _run_id(stranger)
    assert mine != theirs
    why = f"written by run {theirs}, not by this run ({mine})"

    code, rows, err = _verify(slurm_cluster, run)
    assert code == 1
    assert (rows[50]["state"], rows[50]["error"]) == ("stranger", why)
    assert rows[30]["run_id"] == mine
    assert f"{why}; resume would use step-00000030.pt" in err
    row = e2e.status(slurm_cluster, run)
    assert row["checkpoint_step"] == 30
    assert why in row["note"]

    # A forced resume that changes what shapes the state (the learning rate) says so.
    said, log = _resumed(slurm_cluster, run, "train.max_steps=40", "train.lr=0.3")
    assert why in said
    assert f"skipping checkpoint {run}/checkpoints/step-00000050.pt (stranger: {why})" in log
    assert "resumed from step-00000030.pt: step 30" in log
    assert "resuming from step-00000030.pt with a changed config (train.lr: 0.05 -> 0.3)" in log
    assert e2e.ledger(run)[-1].resumed_from_step == 30
    assert e2e.ledger(run)[-1].steps_done == 40


def _flip_trailer(path: Path) -> None:
    """Bit 4 of byte size-23: the zip64 end-of-directory locator (zipfile.is_zipfile raised
    BadZipFile on it)."""
    data = bytearray(path.read_bytes())
    data[-23] ^= 1 << 4
    path.write_bytes(bytes(data))


def test_a_flipped_trailer_bit_is_damage_in_every_reader_never_a_traceback(
    slurm_cluster: Cluster, finished: Path, tmp_path: Path
) -> None:
    run = _copy(finished, tmp_path)
    _flip_trailer(run / "checkpoints" / "step-00000030.pt")
    listed = e2e.hpc(slurm_cluster, "checkpoints", str(run))
    assert "damaged: damaged zip archive (BadZipFile" in listed.stdout
    code, rows, err = _verify(slurm_cluster, run)
    assert (code, rows[30]["state"], rows[20]["state"]) == (1, "damaged", "ok")
    assert "Traceback" not in err
    assert e2e.status(slurm_cluster, run)["checkpoint_step"] == 20
    every = e2e.hpc(slurm_cluster, "status", "--runs-dir", str(tmp_path), "--json")
    assert "Traceback" not in every.stderr
    dry = e2e.hpc(slurm_cluster, "resume", str(run), "--force", "--dry-run")
    assert "from checkpoint step 20" in dry.stdout
    assert "Traceback" not in dry.stderr


def test_a_restart_after_a_killed_rank_falls_back_past_damaged_checkpoints(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Rank 0 is paused once step 20 is saved, every checkpoint after step 10 gets a flipped
    trailer bit, rank 1 is killed: the in-job restart resumes from step 10 and finishes (before
    the fix each restart died reading the newest file, until no_progress)."""
    job = e2e.submit(
        slurm_cluster,
        tmp_path / "runs",
        "jobs/quickstart.yaml",
        *BASE,
        "train.max_steps=40",
        "train.dataset=tests.e2e_util:io_bound_synthetic",
        "fault.beat_s=0.5",
        "fault.stale_s=5",
        "fault.rescue=false",  # the survivor's save would write a good step 20 over the damage
    )
    e2e.wait_checkpoint(job.run_dir, 20, timeout_s=180)
    [rank0] = e2e.wait_for("rank 0", lambda: e2e.rank_pids(job.job_id, 0, launch=0))
    [rank1] = e2e.wait_for("rank 1", lambda: e2e.rank_pids(job.job_id, 1, launch=0))
    os.kill(rank0, signal.SIGSTOP)  # only rank 0 writes checkpoints: none is written now
    try:
        damaged = [
            p
            for p in (job.run_dir / "checkpoints").glob("step-*.pt")
            if (parse_checkpoint_name(p.name) or 0) > 10
        ]
        assert damaged
        for path in damaged:
            _flip_trailer(path)
        os.kill(rank1, signal.SIGKILL)
    finally:
        os.kill(rank0, signal.SIGCONT)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    first, again = e2e.ledger(job.run_dir)[-2:]
    assert first.cause is EndCause.CRASH
    assert (again.cause, again.resumed_from_step, again.steps_done) == (
        EndCause.FINISHED,
        10,
        40,
    )
    assert again.from_step == 10  # the supervisor's word too, not the damaged file's name
    log = (job.run_dir / "logs" / "rank-0.err").read_text(errors="replace")
    assert "(damaged: damaged zip archive (BadZipFile" in log
    assert "resumed from step-00000010.pt: step 10" in log
