"""The processes a rank starts live through Slurm's stop signals (real signals, real processes;
the same delivery through Slurm is in tests/fault/test_user_signals_e2e.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpc_ddp.runtime.childsignals import start_ignoring

pytestmark = pytest.mark.torch


def _kill_from_outside(pid: int, signame: str) -> None:
    """Send as slurmstepd does: from a process that is neither the target's parent nor itself."""
    subprocess.run(["kill", f"-{signame}", str(pid)], check=True)


def test_a_command_child_lives_through_the_warning_and_dies_of_sigterm() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    proc = start_ignoring(signal.SIGUSR2, [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert signal.getsignal(signal.SIGUSR2) is before  # this process's own handler is back
        time.sleep(0.3)
        _kill_from_outside(proc.pid, "USR2")
        time.sleep(0.3)
        assert proc.poll() is None  # without the ignore, USR2's default action ends it
        _kill_from_outside(proc.pid, "TERM")
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


_LOADER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from hpc_ddp.runtime.childsignals import blocked_while_starting, data_worker_init

    class Slow(Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i): time.sleep(0.002); return torch.tensor([i])

    heard = []
    signal.signal(signal.SIGTERM, lambda s, f: heard.append(s))
    signal.signal(signal.SIGUSR2, lambda s, f: heard.append(s))
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, worker_init_fn=data_worker_init)
    with blocked_while_starting():
        batches = iter(loader)
    pids = [w.pid for w in batches._workers]
    for pid in pids + [os.getpid()]:  # at once: the workers may not have run their init yet
        for name in ("USR2", "TERM"):
            subprocess.run(["kill", f"-{name}", str(pid)], check=True)
    seen = [int(next(batches)[0, 0]) for _ in range(30)]
    for pid in pids:  # and again, once they run
        for name in ("USR2", "TERM", "INT"):
            subprocess.run(["kill", f"-{name}", str(pid)], check=True)
    seen += [int(next(batches)[0, 0]) for _ in range(30)]
    assert seen == list(range(0, 240, 4)), seen
    print("alive", all(w.is_alive() for w in batches._workers), "heard", sorted(set(heard)),
          flush=True)
    # `batches` is still alive at exit: multiprocessing SIGTERMs the workers, which must end.
    """
)


def test_loader_workers_live_through_slurms_signals_and_end_with_their_owner(
    tmp_path: Path,
) -> None:
    script = tmp_path / "loader.py"
    script.write_text(_LOADER)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"alive True heard {[int(signal.SIGUSR2), int(signal.SIGTERM)]}"
    assert "DataLoader worker" not in done.stderr  # no worker death reported, not even at exit


_ORPHAN = textwrap.dedent(
    """
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from hpc_ddp.runtime.childsignals import blocked_while_starting, data_worker_init

    class Slow(Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i): time.sleep(0.01); return torch.tensor([i])

    loader = DataLoader(Slow(), batch_size=4, num_workers=2, worker_init_fn=data_worker_init)
    with blocked_while_starting():
        batches = iter(loader)
    next(batches)
    print(" ".join(str(w.pid) for w in batches._workers), flush=True)
    time.sleep(600)
    """
)


def test_loader_workers_die_with_a_rank_that_is_killed(tmp_path: Path) -> None:
    """Workers that live through Slurm's SIGTERM must not outlive their rank: one SIGKILLed
    (Slurm's KillWait, torchrun's kill) takes them with it, or they would run on, reparented
    where Slurm's proctrack/linuxproc no longer finds them."""
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as rank:
        try:
            assert rank.stdout is not None
            workers = [int(p) for p in rank.stdout.readline().split()]
            assert len(workers) == 2
            rank.kill()
            rank.wait(timeout=10)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(_alive(p) for p in workers):
                time.sleep(0.1)
            assert not [p for p in workers if _alive(p)]
        finally:
            rank.kill()


def _alive(pid: int) -> bool:
    """A process that exists and is no zombie (an orphan's zombie is init's to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
