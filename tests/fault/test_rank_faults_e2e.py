"""Rank faults the ranks' own words used to get wrong, on real ranks (gloo, CPU): a rank that
leaves its training loop early, a survivor's word on a killed peer, a writer hung in a save.

Each runs locally (the local backend's supervisor and rank processes) and, where the issue saw
it on Slurm, on the real dev cluster too. ``dist.timeout_s`` is 300 s throughout, so a fault
found "at once" is one found long before a collective would have timed out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from hpc_ddp.backends.local.process import live_ranks
from hpc_ddp.rundir.attempt import Attempt
from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import REPO, Cluster
from tests.helpers.launch import base_env

pytestmark = [pytest.mark.torch, pytest.mark.slow]

LEAVER = REPO / "tests" / "helpers" / "leaver.py"
FAULT = "fault: {beat_s: 0.5, stale_s: 3, startup_timeout_s: 400, step_timeout_s: 10"
FOUND_WITHIN_S = 30.0
"""A fault found "at once": well inside dist.timeout_s (300 s)."""


def leaver_job(
    directory: Path, how: str, rank: int, *, at: int, every: int, fault: str = ""
) -> Path:
    """A 2-rank ``command:`` job on leaver.py: ``rank`` (-1: every rank) does ``how`` at step
    ``at`` of 100 in its first launch."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{how}.yaml"
    path.write_text(
        f"name: {how.replace('_', '-')}\n"
        f"command: [python, {LEAVER}, '100', '{every}', '{at}', '{rank}', {how}]\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:10:00'}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n'
        "dist: {timeout_s: 300}\n"
        f"{FAULT}{fault}}}\n"
    )
    return path


def submit_local(job: Path, runs: Path, timeout_s: float = 400) -> tuple[Path, str]:
    """``hpc-ddp submit JOB --backend local --wait``: (run dir, its stderr); must succeed."""
    done = subprocess.run(
        [*e2e.HPC_DDP, "submit", str(job), "--backend", "local", "--wait", "--runs-dir",
         str(runs)],
        cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    run_dir = next(runs.glob("*-*"))
    assert done.returncode == 0, done.stderr[-4000:] + _logs(run_dir)
    return run_dir, done.stderr


def _logs(run_dir: Path) -> str:
    return "".join(
        f"\n== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted((run_dir / "logs").glob("*.err"))
    )


def left_at(run_dir: Path, rank: int) -> float:
    """When the leaver said it left (its own clock, printed before it left)."""
    text = (run_dir / "logs" / f"rank-{rank}.err").read_text(errors="replace")
    found = re.search(r"leaving at step \d+ \(\w+\) at ([0-9.]+)", text)
    assert found, text[-3000:]
    return float(found.group(1))


def assert_found_and_restarted(run_dir: Path, rank: int, node: str | None = None) -> Attempt:
    """The first launch ended in a crash blamed on ``rank`` that left its loop at step 30 of
    100, found within seconds; the other rank, which completed step 30 too, saved it (the
    survivor's save), the restart went on from there, and the run finished."""
    left, again = e2e.ledger(run_dir)
    assert (left.cause, left.next, left.launch) == (EndCause.CRASH, "restart", 0), left
    assert left.blame is not None
    assert left.blame.ranks == (rank,)
    if node is not None:
        assert left.blame.nodes == (node,)
    assert "left its training loop at step 30 of 100" in left.blame.evidence
    assert left.blame.detected_at is not None
    assert left.blame.detected_at - left_at(run_dir, rank) < FOUND_WITHIN_S
    assert left.rescue is not None, left
    assert (left.rescue.rank, left.rescue.step) == (1 - rank, 30), left.rescue
    assert left.checkpoint == "step-00000030.pt"
    assert (again.launch, again.resumed_from_step, again.cause) == (1, 30, EndCause.FINISHED)
    assert again.steps_done == 100
    return left


# --- local ranks -----------------------------------------------------------------------------


def test_a_rank_that_breaks_out_of_its_loop_is_found_at_once_and_restarted(
    tmp_path: Path,
) -> None:
    """Rank 1 `break`s at step 30 of 100 while rank 0 trains on: blamed on rank 1 within
    seconds (not after dist.timeout_s), restarted from the newest checkpoint, finished."""
    run_dir, _ = submit_local(leaver_job(tmp_path, "break", 1, at=30, every=10), tmp_path / "r")
    assert_found_and_restarted(run_dir, 1)


def test_rank_0_calling_sys_exit_early_is_a_crash_not_finished(tmp_path: Path) -> None:
    """Rank 0 calls sys.exit(0) at step 30 of 100: the ledger must not say `finished` at step
    30; it is the same fault, blamed on rank 0, restarted, and the run finishes at 100."""
    run_dir, _ = submit_local(leaver_job(tmp_path, "exit", 0, at=30, every=10), tmp_path / "r")
    assert_found_and_restarted(run_dir, 0)
    shown = subprocess.run(
        [*e2e.HPC_DDP, "status", str(run_dir), "--json"],
        cwd=REPO, env=base_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    [row] = json.loads(shown.stdout)["runs"]
    assert (row["state"], row["causes"]) == ("COMPLETED", ["crash", "finished"]), row


def test_an_early_stop_every_rank_agrees_on_is_no_fault(tmp_path: Path) -> None:
    """Both ranks leave their loops at step 30 (an early stop they agreed on): no fault, one
    launch, ended `finished` by the ranks themselves."""
    run_dir, _ = submit_local(leaver_job(tmp_path, "break", -1, at=30, every=10), tmp_path / "r")
    [only] = e2e.ledger(run_dir)
    assert (only.cause, only.next, only.blame, only.steps_done) == (
        EndCause.FINISHED, "stop", None, 30,
    )  # fmt: skip
    assert only.message == "left the training loop at step 30 of 100"


def test_a_writer_hung_in_a_save_is_blamed_not_the_rank_that_waited_for_it(
    tmp_path: Path,
) -> None:
    """Rank 0's checkpoint write of step 40 hangs (fault.checkpoint_timeout_s: 15): rank 1
    gives up waiting for it at the step-60 save. The launch is blamed on rank 0, the writer,
    and names the checkpoint on disk (step 20), not the step-40 file that was never written.
    No survivor's save: rank 1 leaves with its complaint before the verdict that blames rank
    0 (the complaint is what the verdict is read from)."""
    job = leaver_job(tmp_path, "ckpt_hang", 0, at=40, every=20, fault=", checkpoint_timeout_s: 15")
    run_dir, _ = submit_local(job, tmp_path / "r")
    hung, again = e2e.ledger(run_dir)
    assert (hung.cause, hung.next) == (EndCause.HANG, "restart"), hung
    assert hung.blame is not None
    assert hung.blame.ranks == (0,), hung.blame
    assert "rank 1 gave up on it" in hung.blame.evidence
    assert hung.checkpoint == "step-00000020.pt"
    assert hung.witnesses
    assert "PeerError" in hung.witnesses[0]
    assert "step-00000040.pt" not in _raw_checkpoint_names(run_dir, launch=0)
    assert (again.resumed_from_step, again.cause) == (20, EndCause.FINISHED)


def _raw_checkpoint_names(run_dir: Path, launch: int) -> set[str]:
    """Every checkpoint the ledger's lines of ``launch`` name (each rank's end and the
    supervisor's), as written."""
    names = set()
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        event = json.loads(line)
        ours = event.get("event") in ("attempt_end", "launch_end")
        if ours and event.get("launch", 0) == launch and event.get("checkpoint"):
            names.add(event["checkpoint"])
    return names


def test_a_killed_ranks_survivor_is_a_witness_not_a_second_blame_locally(
    tmp_path: Path,
) -> None:
    """SIGKILL of rank 1 (the built-in trainer): rank 0 dies of the lost connection and writes
    its end too, marked as a witness; the launch's one verdict blames rank 1."""
    run_dir = _killed_rank_1_locally(tmp_path)
    assert_one_verdict(run_dir, node=None)


def _killed_rank_1_locally(tmp_path: Path) -> Path:
    from tests.fault.test_faults_e2e import FAULT_AT, job_file

    runs = tmp_path / "runs"
    waiting = subprocess.Popen(
        [*e2e.HPC_DDP, "submit", str(job_file(tmp_path)), "--backend", "local", "--wait",
         "--runs-dir", str(runs), "dist.timeout_s=300", "fault.startup_timeout_s=400"],
        cwd=REPO, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        run_dir: Path = e2e.wait_for("the run directory", lambda: next(runs.glob("faults-*"), None))
        e2e.wait_checkpoint(run_dir, FAULT_AT, timeout_s=120)
        rank1 = e2e.wait_for("rank 1", lambda: live_ranks(run_dir).get(1))
        os.kill(rank1.pid, signal.SIGKILL)
        _, err = waiting.communicate(timeout=300)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, err[-3000:]
    return run_dir


def assert_one_verdict(run_dir: Path, node: str | None) -> None:
    """The killed launch: one verdict (the supervisor's, blaming rank 1), every rank's own end
    of it a witness; `status` shows that one verdict."""
    dead, again = e2e.ledger(run_dir)
    assert (dead.cause, dead.next) == (EndCause.CRASH, "restart"), dead
    assert dead.blame is not None
    assert dead.blame.ranks == (1,)
    if node is not None:
        assert dead.blame.nodes == (node,)
    assert again.cause is EndCause.FINISHED
    ends = [
        json.loads(line)
        for line in (run_dir / "ledger.jsonl").read_text().splitlines()
        if '"attempt_end"' in line and json.loads(line).get("launch", 0) == 0
    ]
    assert ends, "the survivor wrote no end"
    assert all(e.get("witness") is True for e in ends), ends
    assert dead.witnesses
    assert dead.witnesses[0].startswith("rank 0 on ")
    verdicts = [
        line
        for line in (run_dir / "ledger.jsonl").read_text().splitlines()
        if '"launch_end"' in line and json.loads(line).get("launch") == 0
    ]
    assert len(verdicts) == 1


# --- the dev cluster -------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize(("how", "rank", "node"), [("break", 1, "n2"), ("exit", 0, "n1")])
def test_a_rank_that_leaves_its_loop_on_slurm_is_found_at_once(
    slurm_cluster: Cluster, tmp_path: Path, how: str, rank: int, node: str
) -> None:
    """The same on the dev cluster: rank 1 (on n2) breaks, or rank 0 (on n1) calls
    sys.exit(0), at step 30 of 100; blamed on it within seconds, restarted in the allocation
    (a new srun step), and the job ends COMPLETED with no requeue."""
    config = leaver_job(tmp_path, how, rank, at=30, every=10)
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(config))
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), _logs(job.run_dir)
    assert_found_and_restarted(job.run_dir, rank, node=node)


@pytest.mark.slurm
def test_a_killed_ranks_survivor_is_a_witness_on_slurm(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL of rank 1 on n2: the supervisor's launch_end blames it; rank 0's "connection
    reset" end is a witness, and `status` names rank 1 only."""
    from tests.fault.test_faults_e2e import FAULT_AT, job_file

    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(job_file(tmp_path)),
                     "dist.timeout_s=300", "fault.startup_timeout_s=400")  # fmt: skip
    e2e.wait_checkpoint(job.run_dir, FAULT_AT, timeout_s=120)
    pids = e2e.wait_for(
        f"rank 1 of job {job.job_id}", lambda: e2e.rank_pids(job.job_id, 1, launch=0)
    )
    os.kill(int(pids[-1]), signal.SIGKILL)
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "0"), fields
    assert_one_verdict(job.run_dir, node="n2")
    row = e2e.status(slurm_cluster, job.run_dir)
    assert row["attempt_list"][0]["blame"].startswith("rank 1 on n2")
