"""One session per rank of a launch: a second process that opens a session as the same rank
is refused before it joins anything.

Processes a task forks for itself (``torch.multiprocessing.spawn``, ``multiprocessing``)
inherit the task's ``RANK`` and ``WORLD_SIZE``: each would take itself for the same rank of
the same world, write the same run directory, resume from the others' checkpoints and report
the run finished. Each session claims ``rank-<R>.session`` in its launch's directory, by
exclusive creation; a claim whose process is gone (a crashed rank restarted by torchrun, a run
started by hand again) is taken over.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from hpc_ddp.errors import HpcDdpError


def claim_rank(launch_dir: Path, rank: int, pid: int | None = None) -> Path:
    """Claim rank ``rank`` of the launch whose directory is ``launch_dir`` for process ``pid``
    (this one by default); returns the claim's path. Raises :class:`HpcDdpError` with a HINT
    when a live process of this host holds it already."""
    pid = os.getpid() if pid is None else pid
    host = socket.gethostname()
    path = launch_dir / f"rank-{rank}.session"
    launch_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # a stale claim is removed once, then created afresh
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder is not None and holder != (pid, host) and _alive(holder, host):
                raise _refusal(rank, holder[0], pid) from None
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as claim:
            claim.write(f"{pid} {host}\n")
        return path
    raise _refusal(rank, None, pid)


def _holder(path: Path) -> tuple[int, str] | None:
    """(pid, host) of a claim; None for one unreadable or half-written (taken as stale)."""
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None


def _alive(holder: tuple[int, str], host: str) -> bool:
    """A claim of another host cannot be checked from here: only this host's processes can
    be the forked twins this guards against, so another host's claim is stale."""
    pid, where = holder
    if where != host:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refusal(rank: int, holder: int | None, pid: int) -> HpcDdpError:
    who = f"process {holder}" if holder is not None else "another process"
    return HpcDdpError(
        f"rank {rank} of this launch has a session in {who} already (this is process {pid}): "
        "two processes opened a session as the same rank. Processes a task starts itself "
        "(torch.multiprocessing.spawn, multiprocessing) inherit its RANK and WORLD_SIZE, so "
        "each would train as that same rank. HINT: open the session in one process per task "
        "and start more tasks (slurm.tasks_per_node: N), or start the processes with torchrun "
        "(dist.launcher: torchrun), which gives each its own rank."
    )
