"""The local backend's login faces, as its catalog row names them
(:mod:`hpc_ddp.backends.registry` makes them by name): the backend (processes of this machine
under submitit's detached controller), its sweep runner, what its logs say of a job's end, and a
run this process started and holds (:class:`~hpc_ddp.backends.base.Held`: its wait and its stop).
Each module is imported when its face is first asked for: a Slurm user's ``status`` never loads
the local backend (ctypes, pickle, sockets).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Backend, Forced, Held, Postmortem, Waited
    from hpc_ddp.backends.registry import Registry
    from hpc_ddp.sweep.runner import SweepRunner


def backend(registry: Registry) -> Backend:
    """Processes of this machine (no scheduler's command runs, so no client)."""
    del registry
    from hpc_ddp.backends.local.backend import LocalBackend

    return LocalBackend()


def sweeps(registry: Registry) -> SweepRunner:
    """A sweep's points run by one controller of this machine, a few at a time."""
    from hpc_ddp.backends.local.sweeps import ControllerSweeps

    return ControllerSweeps(registry)


def postmortem() -> Postmortem:
    """A local run's tasks report in their result files (``LocalBackend.startup_failure``
    reads them); no launcher of its own writes a log."""
    from hpc_ddp.backends.ranklogs import RankLogsOnly

    return RankLogsOnly()


def held(handle: object, run_dir: Path, job_id: str) -> Held:
    """The local run this process started (``handle``: its
    :class:`~hpc_ddp.backends.local.controller.LocalJob`)."""
    return LocalHeld(handle, run_dir, job_id)


def kill_wait_s() -> float:
    """How long a cancel gives a local run's processes after the SIGTERM before it SIGKILLs
    those left (as Slurm's ``KillWait``)."""
    from hpc_ddp.backends.local.process import KILL_WAIT_S

    return KILL_WAIT_S


class LocalHeld:
    """A local run this process started: waited on through its processes and rank 0's log,
    stopped by signals."""

    def __init__(self, job: Any, run_dir: Path, job_id: str) -> None:
        self._job = job
        self._run_dir = run_dir
        self._job_id = job_id

    @property
    def started(self) -> float:
        started: float = self._job.started
        return started

    def ended(self) -> bool:
        return bool(self._job.ended())

    def wait(
        self,
        *,
        follow: Path | None = None,
        follow_from: int = 0,
        on_poll: Callable[[], None] | None = None,
    ) -> Waited:
        from hpc_ddp.backends.local.controller import wait_local

        return wait_local(self._job, follow=follow, follow_from=follow_from, on_poll=on_poll)

    def stop(self) -> None:
        from hpc_ddp.backends.local.process import cancel_local

        cancel_local(self._run_dir, self._job_id)

    def force(self) -> Forced:
        from hpc_ddp.backends.local.process import mark_cancelled
        from hpc_ddp.backends.local.stop import force_stop

        mark_cancelled(self._run_dir)  # a person stopped it: `status` says CANCELLED
        return force_stop(self._run_dir, self._job_id, self.started)
