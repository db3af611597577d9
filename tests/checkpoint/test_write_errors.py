"""A checkpoint write that the file system refuses (a quota, an I/O error) fails the save.

Both writers, a DDP model's file (rank 0's background writer) and an FSDP model's shard set
(every rank's DCP shard; DCP wraps the error in its ``CheckpointException``, a
``BaseException``), in a one-rank session of this process. ``fsync`` of the checkpoint's own
files is made to fail with a real errno, as a file system over quota reports it (NFS reports
EDQUOT at fsync or close) or a failing disk does; nothing else the session writes is touched.
A full disk (ENOSPC) is tested for real, on a tmpfs, in ``test_full_disk_e2e.py``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import CheckpointError
from hpc_ddp.sessions.session import Session

pytestmark = pytest.mark.torch

HINTS = {
    errno.EDQUOT: "your disk quota on the file system of",
    errno.EIO: "could not write (an I/O error)",
}


def _failing_fsync(code: int) -> Callable[[int], None]:
    """``os.fsync`` that fails with ``code`` for a checkpoint being written (a file under a
    ``.partial-`` shard set, or a ``.tmp-`` checkpoint file), as the file system would."""
    real = os.fsync

    def fsync(fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        name = Path(path).name
        if ".partial-step-" in path or (name.startswith(".tmp-step-") and ".pt." in name):
            raise OSError(code, os.strerror(code))
        real(fd)

    return fsync


def _ledger(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


@pytest.mark.usefixtures("own_process")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("code", [errno.EDQUOT, errno.EIO], ids=["EDQUOT", "EIO"])
def test_a_refused_write_fails_the_save_and_its_ledger_line_never_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, code: int
) -> None:
    """Step 2's save fails in the background: the next save raises its error with the HINT
    for that errno, and the ledger never records step 2 (its callback is dropped, not run
    after a later save, step 3's). Step 4's fails too: the crash names step 3, the newest
    checkpoint on disk, not step 4."""
    crash: CheckpointError | None = None
    try:
        _save_through_failures(tmp_path, monkeypatch, strategy, code)
    except CheckpointError as exc:  # step 4's, out of the session: recorded as a crash
        crash = exc
    assert crash is not None
    assert f"({errno.errorcode[code]})" in str(crash)
    checkpoints = tmp_path / "checkpoints"
    on_disk = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-"))
    suffix = ".pt" if strategy == "ddp" else ""
    assert on_disk == [f"step-0000000{n}{suffix}" for n in (1, 3)]
    assert not [p for p in checkpoints.iterdir() if p.name.startswith((".partial-", ".tmp-"))]
    ledger = _ledger(tmp_path)
    assert [e["step"] for e in ledger if e["event"] == "checkpoint"] == [1, 3]
    [end] = [e for e in ledger if e["event"] == "attempt_end"]
    assert end["cause"] == "crash"
    assert end["checkpoint"] == f"step-00000003{suffix}"


def _save_through_failures(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, code: int
) -> None:
    name = errno.errorcode[code]
    with Session(run_dir, JobConfig(name="t"), env={}) as s:
        torch.manual_seed(0)
        model = s.wrap(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), strategy=strategy)
        s.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        s.progress.step = 1
        s.checkpoint(wait=True)
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", _failing_fsync(code))
            s.progress.step = 2
            s.checkpoint()  # in the background
            s.progress.step = 3
            with pytest.raises(CheckpointError) as failed:
                s.checkpoint()
        message = str(failed.value)
        assert f"({name})" in message
        assert "step-00000002" in message
        assert HINTS[code] in message
        assert f"`hpc-ddp resume {run_dir}`" in message
        s.checkpoint(wait=True)  # step 3: the disk takes it again
        s.progress.step = 4
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", _failing_fsync(code))
            s.checkpoint(wait=True)
