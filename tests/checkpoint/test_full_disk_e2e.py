"""A full disk, for real: a run whose checkpoint no longer fits fails, on every rank.

The run directory lies on a real 6 MiB tmpfs (mounted here; the dev cluster's slurmd runs on
this machine, so its tasks write into it). One checkpoint of the model (``image_size: 24``: its
weights and SGD momentum, 3.9 MB) fits, the second does not: the write raises ENOSPC, from
``torch.save`` (DDP: rank 0's writer) or from inside DCP (FSDP: every rank's shard, a
``CheckpointException``, which is a ``BaseException``). Whatever the strategy, every rank must
fail with the error and its HINT, the job must end FAILED, and no ledger record may name a
checkpoint that is not on disk.

The same in a one-rank session of this process, on a 1 MiB tmpfs: the first save does not fit.
There the error comes from inside ``torch.save``'s zip writer (a ``RuntimeError`` "unexpected
pos" whose context is the ``OSError``), and for a shard set DCP hands it over pickled, which
drops that context: the errno must still be named.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import CheckpointError
from hpc_ddp.sessions.session import Session
from tests import e2e_util as e2e
from tests.conftest import IN_CI, Cluster

pytestmark = pytest.mark.torch

RUN = [
    "train.image_size=24",  # 3.9 MB a checkpoint: the first fits in 6 MiB, the second not
    "train.max_steps=30",
    "train.checkpoint_every=10",
    "train.log_every=5",
    "train.eval_every=0",
    e2e.STEADY_THREADS,
]


def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``where``, unmounted at the end. Under CI=true a failed mount
    fails the test."""
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
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


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 6 MiB tmpfs (unmounted at the end)."""
    yield from _tmpfs(tmp_path / "full", "6m")


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (unmounted at the end)."""
    yield from _tmpfs(tmp_path / "full", "1m")


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_save_that_does_not_fit_names_enospc_and_leaves_nothing(
    tiny_tmpfs: Path, strategy: str
) -> None:
    run_dir = tiny_tmpfs / "run"
    with pytest.raises(CheckpointError) as failed:
        _save_once(run_dir, strategy)
    message = str(failed.value)
    assert "No space left on device (ENOSPC)" in message
    assert f"HINT: the file system of {run_dir / 'checkpoints'} is full: free space" in message
    assert not [p.name for p in (run_dir / "checkpoints").iterdir() if "step-" in p.name]
    ends = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    [end] = [e for e in ends if e["event"] == "attempt_end"]
    assert end["checkpoint"] is None
    assert "ENOSPC" in end["message"]


def _named(record: dict[str, Any]) -> str | None:
    name = record.get("checkpoint")
    return name if isinstance(name, str) else None


def _save_once(run_dir: Path, strategy: str) -> None:
    """A one-rank session that saves 2 MiB of weights at step 1 (more than 1 MiB)."""
    with Session(run_dir, JobConfig(name="t"), env={}) as s:
        model = s.wrap(nn.Sequential(nn.Linear(1024, 512), nn.Linear(512, 2)), strategy=strategy)
        s.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        s.progress.step = 1
        s.checkpoint(wait=True)


@pytest.mark.slurm
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
