"""Writing checkpoints: durable at every moment of a save (kills, full disks, torn writes), the
``latest`` pointer, pruning to ``keep_last`` (and the best), few large writes, and the background
writer thread with what follows a write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hpc_ddp.checkpoint.format import build_payload, capture_rng_state, find_latest, load_checkpoint
from hpc_ddp.checkpoint.snapshot import snapshot
from hpc_ddp.checkpoint.writer import CheckpointWriter, prune_plan, write_checkpoint
from hpc_ddp.config.model import JobConfig
from hpc_ddp.errors import CheckpointError
from hpc_ddp.rundir.layout import LATEST_CHECKPOINT, checkpoint_name
from hpc_ddp.runtime.progress import Progress
from hpc_ddp.sessions.session import Session
from tests.checkpoint.test_format import CPU, real_payload, save, small_model
from tests.helpers.launch import HELPERS, base_env

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("steps", "keep", "delete"),
    [([1, 2, 3, 4], 2, [1, 2]), ([4, 1, 3], 3, []), ([1, 2], 0, []), ([5], 1, [])],
)
def test_prune_plan(steps: list[int], keep: int, delete: list[int]) -> None:
    assert prune_plan(steps, keep) == delete


def test_prune_plan_spares_the_best_beside_keep_last() -> None:
    assert prune_plan([10, 20, 30, 40, 50], 2, best=20) == [10, 30]
    assert prune_plan([10, 20, 30], 2, best=30) == [10]  # the best among the newest: no extra
    assert prune_plan([10, 20, 30], 0, best=20) == []


def test_a_save_that_fails_midway_leaves_the_old_state_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    old = save(tmp_path, 10)

    def torn_save(obj: Any, f: Any) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(torch, "save", torn_save)
        with pytest.raises(OSError, match="No space left"):
            save(tmp_path, 20)
    with monkeypatch.context() as m:

        def refuse(*args: Any) -> None:
            raise OSError(5, "Input/output error")

        m.setattr(os, "replace", refuse)
        with pytest.raises(OSError, match="Input/output"):
            save(tmp_path, 30)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST_CHECKPOINT, old.name]
    assert (tmp_path / LATEST_CHECKPOINT).read_text().strip() == old.name
    assert find_latest(tmp_path) is not None


def test_keep_last_prunes_only_after_new_one_is_durable(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in sorted(tmp_path.glob("step-*.pt"))] == [
        "step-00000030.pt",
        "step-00000040.pt",
    ]
    assert (tmp_path / LATEST_CHECKPOINT).read_text().strip() == "step-00000040.pt"


def test_a_write_goes_out_in_few_large_writes_and_leaves_torchs_options_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensor storages go to os.write as they are; torch's many small zip records are
    gathered. The zip CRC switch is torch's global one: it is back as it was afterwards."""
    payload = build_payload(
        model={f"w{i}": torch.randn(256, 256) for i in range(8)}  # 8 x 256 KiB
        | {f"b{i}": torch.randn(3) for i in range(200)},  # 200 tiny records
        progress=Progress(step=1),
        rng=[capture_rng_state(CPU)],
    )
    writes: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    before = torch.serialization.get_crc32_options()
    with monkeypatch.context() as m:
        m.setattr(os, "write", counting_write)
        path = write_checkpoint(tmp_path, payload, keep_last=0)
    assert torch.serialization.get_crc32_options() == before
    size = path.stat().st_size
    assert sum(writes) >= size  # the latest pointer is written too
    assert len(writes) < 8 + 20, writes  # not one write per record
    assert load_checkpoint(path)["model"]["w3"].shape == (256, 256)


def test_the_file_is_durable_before_the_pointer_moves_and_old_files_go(tmp_path: Path) -> None:
    save(tmp_path, 10, keep_last=1)
    seen: list[tuple[list[str], str]] = []

    def on_durable() -> None:
        names = sorted(p.name for p in tmp_path.glob("step-*.pt"))
        seen.append((names, (tmp_path / LATEST_CHECKPOINT).read_text().strip()))

    write_checkpoint(tmp_path, real_payload(20), keep_last=1, on_durable=on_durable)
    assert seen == [(["step-00000010.pt", "step-00000020.pt"], "step-00000010.pt")]
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-00000020.pt"]


def test_writer_background_and_error(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "ckpt", keep_last=2)
    model = small_model()
    for step in (1, 2, 3):
        writer.submit(
            build_payload(
                model=snapshot(model.state_dict()),
                progress=Progress(step=step),
                rng=[capture_rng_state(CPU)],
            )
        )
    writer.wait()
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == [
        "step-00000002.pt",
        "step-00000003.pt",
    ]
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = CheckpointWriter(blocked / "ckpt", keep_last=2)  # a directory under a file
    bad.submit(build_payload(model={}, progress=Progress(step=1), rng=[]))
    with pytest.raises(CheckpointError, match="HINT"):
        bad.wait()
    bad.wait()  # the error is reported once


def _slow_writes(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    import hpc_ddp.checkpoint.writer as c

    write = c.write_checkpoint

    def slow(*args: Any, **kwargs: Any) -> Path:
        time.sleep(seconds)
        return write(*args, **kwargs)

    monkeypatch.setattr(c, "write_checkpoint", slow)


def test_what_follows_a_write_runs_on_the_writer_once_it_is_durable_never_after_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`then` hands bookkeeping to the writer thread: the caller does not wait for the write,
    the callback sees the file on disk, and a failed write skips it."""
    _slow_writes(monkeypatch, 0.5)
    writer = CheckpointWriter(tmp_path / "ckpt", keep_last=2)
    seen: list[tuple[str, bool]] = []
    file = tmp_path / "ckpt" / checkpoint_name(4)
    writer.submit(build_payload(model={}, progress=Progress(step=4), rng=[]))
    began = time.perf_counter()
    writer.then(lambda: seen.append((threading.current_thread().name, file.exists())))
    assert time.perf_counter() - began < 0.3  # the 0.5 s write is not waited for
    assert seen == []
    writer.wait()
    assert seen == [("hpc-ddp-checkpoint", True)]
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = CheckpointWriter(blocked / "ckpt", keep_last=2)  # a directory under a file
    bad.submit(build_payload(model={}, progress=Progress(step=1), rng=[]))
    bad.then(lambda: seen.append(("after a failure", False)))
    with pytest.raises(CheckpointError, match="HINT"):
        bad.wait()
    assert len(seen) == 1


@pytest.mark.usefixtures("own_process")
def test_a_sessions_checkpoint_is_recorded_in_the_ledger_by_the_writer_not_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's `checkpoint` ledger line (an fsync'd append, ~4 ms here) held the training
    thread at every save, longer than the snapshot of a small model: it is now written once
    the file is durable, stamped with the time of the save and the stall training saw."""
    _slow_writes(monkeypatch, 0.5)
    model = small_model()
    with Session(tmp_path, JobConfig(name="t"), env={}) as s:
        s.restore(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        s.progress.step = 3
        saved_at = time.time()
        s.checkpoint()
        events = [json.loads(line)["event"] for line in s.paths.ledger.read_text().splitlines()]
        assert "checkpoint" not in events  # the file is still being written
        s.checkpoint(wait=True)
        lines = [json.loads(line) for line in s.paths.ledger.read_text().splitlines()]
    [record] = [e for e in lines if e["event"] == "checkpoint"]
    assert record["step"] == 3
    assert saved_at <= record["time"] < saved_at + 0.4  # when it was saved, not written
    assert 0.0 <= record["stall_s"] < 0.4


def test_a_write_in_flight_is_finished_when_the_process_exits(tmp_path: Path) -> None:
    """The writer thread is a daemon (a writer nobody closes never keeps a process alive), yet
    a script that returns while its last checkpoint is being written still gets the file."""
    script = f"""
import time, torch
from pathlib import Path
import hpc_ddp.checkpoint.writer as c
from hpc_ddp.checkpoint.format import build_payload, capture_rng_state
from hpc_ddp.runtime.progress import Progress
write = c.write_checkpoint
def slow(*args, **kwargs):
    time.sleep(1.0)
    return write(*args, **kwargs)
c.write_checkpoint = slow
writer = c.CheckpointWriter(Path({str(tmp_path)!r}), keep_last=2)
writer.submit(build_payload(model={{"w": torch.ones(3)}}, progress=Progress(step=5),
                            rng=[capture_rng_state(torch.device("cpu"))]))
print("returning", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], env=base_env(), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "returning\n"), done.stderr
    assert load_checkpoint(tmp_path / checkpoint_name(5))["model"]["w"].sum() == 3


def test_sigkill_during_saves_always_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    """30 SIGKILLs at random moments of a save loop: the newest complete file always loads."""
    kills = 30
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "ckpt_killer.py"), str(tmp_path), str(kills), "1234"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rounds = json.loads(proc.stdout)
    assert len(rounds) == kills
    assert all(r["step"] is not None and r["intact"] for r in rounds), rounds
    steps = [r["step"] for r in rounds]
    assert steps == sorted(steps)  # never went back to an older checkpoint
    assert steps[-1] > kills // 3  # the writers made progress between kills
    assert sum(r["torn"] for r in rounds) >= 5  # many kills did land in the middle of a write
    found = find_latest(tmp_path)
    assert found is not None
    assert found[1]["progress"]["step"] == steps[-1]
    assert torch.load(found[0], weights_only=True)["meta"]["digests"]["model"]


def test_keep_last_never_deletes_a_good_file_for_one_named_beyond_it(tmp_path: Path) -> None:
    save(tmp_path, 100)
    save(tmp_path, 120)
    (tmp_path / "step-00009999.pt").write_bytes((tmp_path / "step-00000100.pt").read_bytes())
    (tmp_path / "step-00000005.pt").mkdir()  # not a file: never pruned, never a crash
    save(tmp_path, 140, keep_last=2)
    names = sorted(p.name for p in tmp_path.glob("step-*.pt"))
    assert names == [
        "step-00000005.pt",
        "step-00000120.pt",
        "step-00000140.pt",
        "step-00009999.pt",  # kept for inspection, but not counted among the last two
    ]
    found = find_latest(tmp_path)
    assert found is not None
    assert found[0].name == "step-00000140.pt"
