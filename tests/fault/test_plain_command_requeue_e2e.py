"""Issue 32 item 13 on the real two-node dev cluster: a torchrun-ready script without a session
(``tests/helpers/snapshot_trainer.py``, the shape of pytorch/examples' ``multinode.py``) is
warned once, gets SIGTERM, is requeued by the ``hpc_ddp run`` process above it, and ends with
all its epochs done from its own snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ddp.rundir.endcause import EndCause
from tests import e2e_util as e2e
from tests.conftest import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

EPOCHS = 8
EPOCH_S = 2.0


def _job_file(directory: Path, snapshot: Path) -> Path:
    script = Path(__file__).resolve().parents[1] / "helpers" / "snapshot_trainer.py"
    config = directory / "plain.yaml"
    config.write_text(
        "name: plain\n"
        f"command: [python, {script}, '{EPOCHS}', {snapshot}, '{EPOCH_S}']\n"
        "slurm: {nodes: 2, tasks_per_node: 1, cpus_per_task: 1, time: '00:05:00'}\n"
        "requeue: {max_requeues: 1}\n"
        'env: {vars: {OMP_NUM_THREADS: "1"}}\n'
    )
    return config


def _epochs(snapshot: Path) -> list[tuple[int, int]]:
    path = Path(f"{snapshot}.epochs")
    if not path.exists():
        return []
    return [(int(w[1]), int(w[3])) for w in map(str.split, path.read_text().splitlines())]


def test_a_script_without_a_session_is_requeued_and_finishes_from_its_snapshot(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    snapshot = tmp_path / "snapshot.pt"
    job = e2e.submit(slurm_cluster, tmp_path / "runs", str(_job_file(tmp_path, snapshot)))
    e2e.wait_for("two epochs", lambda: len(_epochs(snapshot)) >= 2, timeout_s=180)
    e2e.signal_job(slurm_cluster, job.job_id, "USR2")  # the time-limit warning, tasks only
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=300)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["Restarts"] == "1"
    epochs = _epochs(snapshot)
    assert sorted({e for e, _ in epochs}) == list(range(EPOCHS))  # every epoch done
    second = [e for e, restart in epochs if restart == 1]
    assert second
    assert second == list(range(second[0], EPOCHS))  # from its own snapshot
    assert second[0] >= 2  # the epochs before the warning were not run again
    first, last = e2e.ledger(job.run_dir)
    assert (first.cause, first.requeue_requested) == (EndCause.TIME_LIMIT, True)
    assert (last.attempt, last.cause) == (1, EndCause.FINISHED)
    rank0 = (job.run_dir / "logs" / "rank-0.out").read_text(errors="replace")
    assert f"Resuming training from snapshot at epoch {second[0]}" in rank0
