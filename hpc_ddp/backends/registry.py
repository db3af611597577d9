"""The backends by name: the login side's one registry, and its one injection point.

A run's manifest records its backend's name (``slurm``, ``local``); everything the login side
does that depends on it is a method of the backend's login face
(:class:`~hpc_ddp.backends.base.Backend`), of what its logs say of a job's end
(:class:`~hpc_ddp.backends.base.Postmortem`), of a job this process holds on this machine
(:class:`~hpc_ddp.backends.base.Held`) or, for a sweep, of its sweep runner
(:class:`~hpc_ddp.sweep.runner.SweepRunner`). :class:`Registry` makes each by name. The CLI
(``main(argv, backends=)``) and the API (``backends=``) take one; code below them is handed it
as :class:`~hpc_ddp.backends.base.Backends`. Each backend's module is imported only when
picked: a Slurm user's ``status`` never loads the local backend (ctypes, pickle, sockets), nor
a local run the Slurm client.

A new backend adds its package under ``hpc_ddp/backends/`` and one entry to :data:`_ENTRIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_ddp.frozen import dataclass
from hpc_ddp.rundir.layout import MANIFEST_FILE

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Backend, Forced, Held, Postmortem, Waited

    # Named for the API's deprecated `slurm=` (its type), which may not import Slurm's own.
    from hpc_ddp.backends.slurm.client import SlurmClient as SlurmClient  # noqa: PLC0414
    from hpc_ddp.rundir.manifest import BackendName, Manifest
    from hpc_ddp.sweep.runner import SweepRunner


@dataclass(frozen=True)
class Registry:
    """Every backend, by name (a :class:`~hpc_ddp.backends.base.Backends`). ``slurm``: the
    client the Slurm backend runs its commands through (tests pass one over
    :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`); None: the real commands, made when first
    needed (a dry run makes none)."""

    slurm: SlurmClient | None = field(default=None, compare=False)

    def backend(self, which: Manifest | BackendName) -> Backend:
        """The backend a run's manifest names (or the one named ``which``)."""
        return _ENTRIES[_name(which)].backend(self)

    def sweeps(self, which: BackendName) -> SweepRunner:
        """The sweep runner of a new sweep on the backend named ``which``."""
        return _ENTRIES[which].sweeps(self)

    def sweeps_of(self, sweep_dir: Path) -> SweepRunner:
        """The sweep runner of the backend a sweep directory's manifest names; a sweep
        directory without a manifest reads as Slurm's, as it always did."""
        from hpc_ddp.rundir.manifest import read_manifest  # not needed to submit a run

        if not (sweep_dir / MANIFEST_FILE).exists():
            return self.sweeps("slurm")
        return self.sweeps(read_manifest(sweep_dir).backend)

    def postmortem(self, which: Manifest | BackendName) -> Postmortem:
        """What the logs of that backend's jobs say of their end, beside the ledger."""
        return _ENTRIES[_name(which)].postmortem()

    def held(self, which: BackendName, handle: object, run_dir: Path, job_id: str) -> Held:
        """The job ``job_id`` of ``run_dir`` this process started on ``which`` and holds
        (``handle``: what its start returned); a backend whose jobs a scheduler holds has none
        (:class:`ValueError`)."""
        made = _ENTRIES[which].held
        if made is None:
            raise ValueError(f"a {which} job is held by its scheduler, not by this process")
        return made(handle, run_dir, job_id)

    def kill_wait_s(self, which: BackendName) -> float | None:
        """How long a cancel of a ``which`` job gives its processes after the SIGTERM before
        it SIGKILLs those left, unless told (a local run's, as Slurm's ``KillWait``); None
        where the scheduler's own setting decides."""
        wait = _ENTRIES[which].kill_wait_s
        return None if wait is None else wait()


def _name(which: Manifest | BackendName) -> BackendName:
    return which if isinstance(which, str) else which.backend


class _Entry:
    """One backend's faces, each made (and its module imported) only when asked for. A plain
    class, not a dataclass: every command makes the table, and a dataclass costs a dry run
    ~0.3 ms to define."""

    __slots__ = ("backend", "held", "kill_wait_s", "postmortem", "sweeps")

    def __init__(
        self,
        backend: Callable[[Registry], Backend],
        sweeps: Callable[[Registry], SweepRunner],
        postmortem: Callable[[], Postmortem],
        *,
        held: Callable[[object, Path, str], Held] | None = None,
        kill_wait_s: Callable[[], float] | None = None,
    ) -> None:
        self.backend = backend
        self.sweeps = sweeps
        self.postmortem = postmortem
        self.held = held
        """Its jobs that run under this process (None: a scheduler holds them)."""
        self.kill_wait_s = kill_wait_s


# --- Slurm ------------------------------------------------------------------------------------


def _slurm(registry: Registry) -> Backend:
    from hpc_ddp.backends.slurm.backend import SlurmBackend

    return SlurmBackend(registry.slurm)


def _slurm_sweeps(registry: Registry) -> SweepRunner:
    from hpc_ddp.backends.slurm.backend import SlurmBackend
    from hpc_ddp.backends.slurm.sweeps import ArraySweeps

    return ArraySweeps(SlurmBackend(registry.slurm))


def _srun_postmortem() -> Postmortem:
    from hpc_ddp.backends.slurm.postmortem import SrunPostmortem

    return SrunPostmortem()


# --- local ------------------------------------------------------------------------------------


def _local(registry: Registry) -> Backend:
    del registry  # no scheduler's command runs for a local run
    from hpc_ddp.backends.local.backend import LocalBackend

    return LocalBackend()


def _local_sweeps(registry: Registry) -> SweepRunner:
    from hpc_ddp.backends.local.sweeps import ControllerSweeps

    return ControllerSweeps(registry)


def _rank_logs_only() -> Postmortem:
    # A local run's tasks report in their result files (LocalBackend.startup_failure reads
    # them); no launcher of its own writes a log.
    from hpc_ddp.backends.ranklogs import RankLogsOnly

    return RankLogsOnly()


class _LocalHeld:
    """A local run this process started (:class:`~hpc_ddp.backends.local.controller.LocalJob`):
    waited on through its processes and rank 0's log, stopped by signals."""

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


def _local_kill_wait() -> float:
    from hpc_ddp.backends.local.process import KILL_WAIT_S

    return KILL_WAIT_S


_ENTRIES: dict[BackendName, _Entry] = {
    "slurm": _Entry(_slurm, _slurm_sweeps, _srun_postmortem),
    "local": _Entry(
        _local, _local_sweeps, _rank_logs_only, held=_LocalHeld, kill_wait_s=_local_kill_wait
    ),
}
"""Each backend by the name its manifests record (:data:`~hpc_ddp.rundir.manifest.BACKENDS`)."""


def registry_of(backends: Registry | None, slurm: SlurmClient | None = None) -> Registry:
    """The registry an API call was given: ``backends``, else one over ``slurm`` (the API's
    deprecated ``slurm=``, a Slurm client alone: ``backends=Registry(slurm)`` says the same),
    else the real commands. Both given is a :class:`TypeError`."""
    if backends is not None and slurm is not None:
        raise TypeError(
            "backends= and slurm= both given. HINT: pass backends=Registry(slurm) alone "
            "(slurm= is its older spelling)."
        )
    return backends if backends is not None else Registry(slurm)
