"""What the user's own program receives and keeps when Slurm delivers its signals (issue 39,
items 3-5), on the real dev cluster. Every signal goes through Slurm: ``scancel --signal=USR2
JOB`` reaches every process of the step (the program, torchrun and its workers, DataLoader
workers), and ``hpc-ddp cancel`` is a plain ``scancel``, SIGTERM to every process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from hpc_ddp.rundir.layout import checkpoint_name
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
EPOCHS = 8
EPOCH_S = 2.0
NEVER = 1000  # SAVE_EVERY: the snapshot trainer then saves only on SIGTERM


def _write_job(directory: Path, command: list[str], nodes: int, tasks: int = 1) -> Path:
    config = directory / "job.yaml"
    config.write_text(
        "name: usersig\n"
        f"command: {json.dumps(command)}\n"
        f"slurm: {{nodes: {nodes}, tasks_per_node: {tasks}, cpus_per_task: 2, time: '00:05:00'}}\n"
        "requeue: {max_requeues: 1}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n'
    )
    return config


def _lines(snapshot: Path) -> list[tuple[str, int, int]]:
    path = Path(f"{snapshot}.epochs")
    if not path.exists():
        return []
    return [(w[0], int(w[1]), int(w[3])) for w in map(str.split, path.read_text().splitlines())]


def _check_saved_on_sigterm(cluster: Cluster, job: e2e.Submitted, snapshot: Path) -> None:
    """The program got SIGTERM (not death by USR2), saved, and went on from that save."""
    fields = e2e.wait_done(cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["Restarts"] == "1"
    lines = _lines(snapshot)
    stops = [(epoch, restart) for kind, epoch, restart in lines if kind == "sigterm"]
    [(stopped_in, restart)] = stops  # the program itself heard SIGTERM, once
    assert restart == 0, lines
    assert stopped_in >= 2, lines
    second = [e for kind, e, restart in lines if kind == "epoch" and restart == 1]
    # Its only snapshot was the one it wrote on SIGTERM: the requeued attempt starts there.
    assert second == list(range(stopped_in, EPOCHS)), lines
    first, last = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True), first
    assert (last.attempt, last.cause) == (1, EndCause.FINISHED), last


def _submit(cluster: Cluster, tmp_path: Path, config: Path) -> e2e.Submitted:
    return e2e.submit(cluster, tmp_path / "runs", str(config))


def _snapshot_argv(snapshot: Path) -> list[str]:
    return [str(HELPERS / "snapshot_trainer.py"), str(EPOCHS), str(snapshot), str(EPOCH_S),
            str(NEVER)]  # fmt: skip


def test_a_plain_program_gets_sigterm_not_death_by_slurms_warning(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    snapshot = tmp_path / "snapshot.pt"
    config = _write_job(tmp_path, ["python", *_snapshot_argv(snapshot)], nodes=2)
    job = _submit(slurm_cluster, tmp_path, config)
    e2e.wait_for("two epochs", lambda: len(_lines(snapshot)) >= 2, timeout_s=180)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")  # every process of the step
    _check_saved_on_sigterm(slurm_cluster, job, snapshot)


def test_torchrun_and_its_workers_live_through_the_warning_and_save_on_sigterm(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    snapshot = tmp_path / "snapshot.pt"
    torchrun = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "--max-restarts=0"]  # fmt: skip
    config = _write_job(tmp_path, [*torchrun, *_snapshot_argv(snapshot)], nodes=1)
    job = _submit(slurm_cluster, tmp_path, config)
    e2e.wait_for("two epochs", lambda: len(_lines(snapshot)) >= 2, timeout_s=180)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")
    _check_saved_on_sigterm(slurm_cluster, job, snapshot)


def _steps(run_dir: Path) -> list[int]:
    return [int(r["step"]) for r in e2e.metric_rows(run_dir)]


def test_a_session_under_torchrun_stops_saves_and_requeues_once(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    total = 120
    torchrun = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "--max-restarts=0"]  # fmt: skip
    loop = [str(HELPERS / "loader_loop.py"), str(total), "2", "0.05"]
    job = _submit(slurm_cluster, tmp_path, _write_job(tmp_path, [*torchrun, *loop], nodes=1))
    e2e.wait_for("20 steps", lambda: len(_steps(job.run_dir)) >= 20, timeout_s=180)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["Restarts"] == "1"  # requeued once, not restarted in the allocation
    first, last = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True), first
    assert first.checkpoint is not None, first
    assert first.steps_done, first
    assert last.resumed_from_step == first.steps_done, (first, last)
    assert (last.cause, last.world_size) == (EndCause.FINISHED, 2), last
    assert _steps(job.run_dir) == list(range(1, total + 1))  # none lost, none twice


def test_a_cancel_of_a_session_with_loader_workers_stops_at_a_step_and_saves(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    # Short steps and slow samples: the ranks agree only every few dozen steps, and each batch
    # is fetched by a worker after the SIGTERM reached it too.
    loop = ["python", str(HELPERS / "loader_loop.py"), "100000", "2", "0.002", "0.002"]
    job = _submit(slurm_cluster, tmp_path, _write_job(tmp_path, loop, nodes=2))
    e2e.wait_for("20 steps", lambda: len(_steps(job.run_dir)) >= 20, timeout_s=180)
    e2e.hpc(slurm_cluster, "cancel", str(job.run_dir))  # scancel: SIGTERM to every process
    slurm_cluster.wait_gone(job.job_id, timeout_s=120)
    [attempt] = e2e.ledger(job.run_dir)
    assert attempt.cause is EndCause.CANCELLED, attempt  # not a crash of a killed worker
    assert attempt.steps_done, attempt
    assert attempt.checkpoint is not None, attempt
    assert attempt.checkpoint == checkpoint_name(attempt.steps_done), attempt  # the agreed step
    assert max(_steps(job.run_dir)) == attempt.steps_done
    for rank in (0, 1):
        err = (job.run_dir / "logs" / f"rank-{rank}.err").read_text(errors="replace")
        assert "DataLoader worker" not in err, err[-2000:]
