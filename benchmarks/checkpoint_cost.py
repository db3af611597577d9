"""Measure what a checkpoint costs, round by round against ``dd conv=fsync`` of the same bytes.

Usage: ``python -m benchmarks.checkpoint_cost DIR [STATE ...] [--rounds N]``. One process, CPU,
through :class:`~hpc_ddp.sessions.session.Session` as a training script uses it. States:

``mlp``, ``resnet18``
    the built-in models with SGD and momentum (the optimizer state as large as the weights):
    7 MB and 89 MB files.
``1GB``
    four 4,736-wide linear layers with AdamW after one step (weights and two moments): about
    1.08 GB.

Each round, in a rotated order: one checkpoint (the time ``Session.checkpoint()`` blocks the
training thread: the RNG gather and the snapshot into kept buffers, in wall and CPU time; and
the time until the file is durable: digests, ``torch.save``, fsync, rename, fsync of the
directory, from the :class:`~hpc_ddp.checkpoint.writer.CheckpointWriter`'s own clock), one ``dd
bs=1M conv=fsync`` of the same bytes (a checkpoint file, read from the page cache) into the same
directory, and the restart path: the file dropped from the page cache (as on another node), then
read back without and with the digest check
(:func:`~hpc_ddp.checkpoint.format.load_checkpoint`). Also ``dd if=/dev/zero`` of as many MiB,
for comparison only: this VM's virtual disk writes zeros about 1.5 times as fast as other bytes
(1 GB: 0.44-0.53 s against 0.62-0.91 s), so zeros would make a reference no real checkpoint
could meet. Between rounds the weights change, as training would change them. One uncounted
round first: a process's first save maps its snapshot buffers and starts the writer, once per
run, not once per checkpoint. Each measurement starts after ``sync`` (see :func:`settle`).

Prints one JSON line per state with every round's seconds; no target of its own:
:mod:`benchmarks.bench_trainer` (b) holds these against dd.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpc_ddp.checkpoint.format import load_checkpoint
from hpc_ddp.config.model import JobConfig, TrainConfig
from hpc_ddp.rundir.layout import checkpoint_name
from hpc_ddp.sessions.session import Session
from hpc_ddp.train.models import build_model

STATES = ("mlp", "resnet18", "1GB")
WIDE = 4736  # 4 layers of WIDE x WIDE: 89.7 M parameters, x 3 (weights, AdamW's moments) x 4 B


def build(name: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model and optimizer of a state, after one step (so the optimizer has its state)."""
    torch.manual_seed(0)
    if name == "1GB":
        model: nn.Module = nn.Sequential(*(nn.Linear(WIDE, WIDE) for _ in range(4)))
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(2, WIDE)
    else:
        model = build_model(TrainConfig(model=name))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def dd_seconds(directory: Path, source: Path | None, megabytes: int = 0) -> float:
    """Wall time of ``dd if=SOURCE bs=1M conv=fsync`` into ``directory``: the same bytes as
    ``source`` (read from the page cache), or ``megabytes`` MiB of ``/dev/zero``."""
    target = directory / "dd.bin"
    if source is not None:
        _read_through(source)  # in the page cache, as the writer's snapshot is in memory
    args = [f"if={source}"] if source is not None else ["if=/dev/zero", f"count={megabytes}"]
    settle()
    start = time.perf_counter()
    subprocess.run(
        ["dd", *args, f"of={target}", "bs=1M", "conv=fsync"], check=True, capture_output=True
    )
    seconds = time.perf_counter() - start
    target.unlink()
    settle()
    return seconds


SETTLE_S = 0.5
"""The pause after ``sync`` before the next measurement: training time between checkpoints."""


def settle() -> None:
    """Let the machine finish what the last measurement left it, outside any timing: ``sync``,
    then a pause. On a file system mounted with ``discard`` (this VM's root is) deleting a large
    file queues its blocks for TRIM, and the next fsync waits for that; and right after a
    ``sync`` the kernel's writeback threads hold the 2 cores for a few milliseconds, which
    stretched a 0.7 ms (CPU) snapshot to 4.6 ms of wall time. Without this, the deletion of a
    dd's file or of a pruned checkpoint would be billed to whatever is timed next. In training,
    the next checkpoint comes minutes after the previous one's pruning, not milliseconds."""
    os.sync()
    time.sleep(SETTLE_S)


def _read_through(path: Path) -> None:
    chunk = bytearray(8 << 20)
    with path.open("rb", buffering=0) as f:
        while f.readinto(chunk):
            pass


def drop_from_page_cache(path: Path) -> None:
    """Make the next read of ``path`` come from the disk (its pages are clean after fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _timed_load(path: Path, *, verify: bool) -> float:
    drop_from_page_cache(path)
    gc.collect()
    start = time.perf_counter()
    load_checkpoint(path, verify=verify)
    return time.perf_counter() - start


def _save(s: Session) -> dict[str, float]:
    """One checkpoint: the seconds it blocked the caller, and until it was durable."""
    gc.collect()
    cpu = time.thread_time()
    start = time.perf_counter()
    s.checkpoint()
    blocking = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    s.checkpoint(wait=True)  # the pruning of an older checkpoint too
    durable_at = s._ckpt().writer.durable_at  # the writer's own clock
    assert durable_at is not None
    settle()
    return {"blocking_s": blocking, "blocking_cpu_s": cpu, "durable_s": durable_at - start}


def measure(directory: Path, name: str, rounds: int) -> dict[str, Any]:
    """Every round's seconds for the state ``name``, in ``directory / name``.

    With one intra-op thread, as a CPU rank runs (``OMP_NUM_THREADS`` is the task's CPUs, 1 by
    default, and the ranks of (a) in :mod:`benchmarks.bench_trainer` use 1): on a busy 2-core
    machine torch's second copy thread was seen to stretch a 7 ms snapshot to 250 ms.
    """
    torch.set_num_threads(1)
    cfg = JobConfig(name="bench", train=TrainConfig(keep_last=2))
    model, opt = build(name)
    keys = (
        "blocking_s",
        "blocking_cpu_s",
        "durable_s",
        "dd_s",
        "dd_zero_s",
        "load_s",
        "load_verify_s",
    )
    times: dict[str, list[float]] = {k: [] for k in keys}
    with Session(directory / name, cfg, env={}) as s:
        s.restore(model=model, optimizer=opt)
        s.progress.step = 1
        _save(s)  # the uncounted round: the first save maps the snapshot buffers
        path = s.paths.checkpoints / checkpoint_name(s.progress.step)
        megabytes = math.ceil(path.stat().st_size / 2**20)
        out: dict[str, Any] = {
            "state": name,
            "rounds": rounds,
            "file_mb": path.stat().st_size / 1e6,
            "dd_mb": megabytes,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        }
        dd_seconds(s.paths.checkpoints, path)
        for r in range(rounds):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1e-3)  # training changed the weights since the last save
            s.progress.step += 1
            got: dict[str, float] = {}
            if r % 2:
                got["dd_s"] = dd_seconds(s.paths.checkpoints, path)  # the previous file's bytes
                got.update(_save(s))
            else:
                got.update(_save(s))
            path = s.paths.checkpoints / checkpoint_name(s.progress.step)
            if not r % 2:
                got["dd_s"] = dd_seconds(s.paths.checkpoints, path)
            got["dd_zero_s"] = dd_seconds(s.paths.checkpoints, None, megabytes)
            for verify in (False, True) if r % 2 else (True, False):  # the first read is slower
                got["load_verify_s" if verify else "load_s"] = _timed_load(path, verify=verify)
            for key in keys:
                times[key].append(got[key])
    return {**out, **times}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("states", nargs="*", default=list(STATES))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    for name in args.states:
        print(json.dumps(measure(args.dir, name, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
