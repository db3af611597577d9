"""A full disk on the real two-node dev cluster: a run whose checkpoint no longer fits fails.

The run directory lies on a real 6 MiB tmpfs (mounted here; the dev cluster's slurmd runs on
this machine, so its tasks write into it). One checkpoint of the model (``image_size: 24``: its
weights and SGD momentum, 3.9 MB) fits, the second does not: the write raises ENOSPC, from
``torch.save`` (DDP: rank 0's writer) or from inside DCP (FSDP: every rank's shard, a
``CheckpointException``, which is a ``BaseException``). Whatever the strategy, every rank must
fail with the error and its HINT, the job must end FAILED, and no ledger record may name a
checkpoint that is not on disk.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import e2e_util as e2e
from tests.conftest import IN_CI, Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

RUN = [
    "train.image_size=24",  # 3.9 MB a checkpoint: the first fits in 6 MiB, the second not
    "train.max_steps=30",
    "train.checkpoint_every=10",
    "train.log_every=5",
    "train.eval_every=0",
    e2e.STEADY_THREADS,
]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 6 MiB tmpfs, unmounted at the end. Under CI=true a failed mount fails the test."""
    where = tmp_path / "full"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        why = f"cannot mount a tmpfs at {where}: {done.stderr.strip()}"
        if IN_CI:
            pytest.fail(f"CI=true and {why}")
        pytest.skip(why)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _named(record: dict[str, Any]) -> str | None:
    name = record.get("checkpoint")
    return name if isinstance(name, str) else None


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_checkpoint_that_does_not_fit_fails_the_run_on_every_rank(
    slurm_cluster: Cluster, small_tmpfs: Path, strategy: str
) -> None:
    job = e2e.submit(slurm_cluster, small_tmpfs, "jobs/quickstart.yaml", *RUN,
                     f"train.strategy={strategy}")  # fmt: skip
    fields = e2e.wait_done(slurm_cluster, job.job_id, timeout_s=240)
    assert fields["JobState"] == "FAILED", fields

    for rank in (0, 1):
        err = (job.run_dir / "logs" / f"rank-{rank}.err").read_text()
        assert "No space left on device (ENOSPC)" in err, f"rank {rank}:\n{err[-3000:]}"
        assert "HINT: the file system of" in err
        assert "is full: free space there" in err

    checkpoints = job.run_dir / "checkpoints"
    on_disk = {p.name for p in checkpoints.iterdir()}
    first = "step-00000010.pt" if strategy == "ddp" else "step-00000010"
    assert first in on_disk
    assert not [n for n in on_disk if "00000020" in n]  # nothing of the save that failed
    # The ledger names no checkpoint that is not on disk: saves, attempt ends, launch ends.
    records = [json.loads(line) for line in (job.run_dir / "ledger.jsonl").read_text().split("\n")
               if line]  # fmt: skip
    named = {n for r in records if (n := _named(r)) is not None}
    assert named, records
    assert named <= on_disk, named - on_disk
    saves = [r["step"] for r in records if r["event"] == "checkpoint"]
    assert sorted(set(saves)) == [10]
    ends = [r for r in records if r["event"] == "attempt_end"]
    assert ends
    assert all(r["cause"] in ("crash", "no_progress") for r in ends)
    assert any("ENOSPC" in r["message"] for r in ends)

    row = e2e.status(slurm_cluster, job.run_dir)
    assert row["state"] == "FAILED"
    assert row["checkpoint_step"] == 10
    listed = e2e.checkpoints(slurm_cluster, job.run_dir)
    assert [(r["step"], r["state"]) for r in listed] == [(10, "ok")]
