"""The local backend's node face (:class:`~hpc_ddp.backends.allocation.Allocation`): this
machine, where no scheduler holds the job.

A local run's ranks get torchrun-style variables from their task (:mod:`hpc_ddp.job.local_task`)
or their supervisor's launcher (:mod:`hpc_ddp.backends.local.launcher`), never Slurm's (those
are removed: a local run is not a Slurm job), so this face places no task itself, names no job,
and has nothing to requeue. It also stands for a process no scheduler started (torchrun by
hand, one plain process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.allocation import (
    NO_GRANT,
    NO_JOB,
    GpuGrant,
    JobIdentity,
    JobStanding,
    Placement,
    gpu_count,
)
from hpc_ddp.errors import BackendError
from hpc_ddp.rundir.layout import LOCAL_GPUS_ENV, LOCAL_GPUS_PER_TASK_ENV

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Launcher
    from hpc_ddp.backends.catalog import BackendName

_NO_SCHEDULER = "not a Slurm job: nothing requeues a local run (`hpc-ddp resume` does)"


class LocalAllocation:
    """This machine, no scheduler (see the module docstring); ``env``: the task's environment,
    where the local backend says which GPUs it gave the task."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env: Mapping[str, str] = env if env is not None else {}

    @property
    def name(self) -> BackendName:
        """``local``."""
        return "local"

    def placement(self) -> Placement | None:
        """None: the launcher's variables (or one lone process) place the task."""
        return None

    def nodes(self) -> tuple[str, ...]:
        """None named: every rank runs on this machine."""
        return ()

    def check_launcher(self, placement: Placement) -> None:
        """Nothing to check against: no scheduler started tasks here."""
        del placement

    def identity(self) -> JobIdentity:
        """No scheduler's job (the local controller's pid is the run's record, not a job id
        a rank derives its port or ledger entries from)."""
        return NO_JOB

    def array_point(self) -> int | None:
        """None: a local sweep runs no job array."""
        return None

    def gpu_grant(self, rank: int, world: int) -> GpuGrant:
        """What the local backend gave this rank (:data:`~hpc_ddp.rundir.layout.LOCAL_GPUS_ENV`:
        the GPUs the rank may use, ``LOCAL_GPUS_PER_TASK_ENV``: each rank's own); else
        :data:`~hpc_ddp.backends.allocation.NO_GRANT` (torchrun by hand, one plain process)."""
        del rank, world
        if LOCAL_GPUS_ENV not in self.env:
            return NO_GRANT
        given = gpu_count(self.env[LOCAL_GPUS_ENV]) or 0
        per_task = gpu_count(self.env.get(LOCAL_GPUS_PER_TASK_ENV, ""))
        return GpuGrant(given > 0, per_task, given, f"{LOCAL_GPUS_ENV}={self.env[LOCAL_GPUS_ENV]}")

    def cpus_per_task(self) -> int | None:
        """None: each rank takes its share of the CPUs it may run on."""
        return None

    def pool(self) -> str | None:
        """None: this machine."""
        return None

    def standing(self, job_ref: str) -> JobStanding:
        """Never asked (there is no job); raises :class:`~hpc_ddp.errors.BackendError`."""
        raise BackendError(f"{_NO_SCHEDULER}; no job {job_ref} to ask about")

    def requeue(self, job_ref: str) -> None:
        """Nothing requeues a local run; raises :class:`~hpc_ddp.errors.BackendError`."""
        raise BackendError(f"{_NO_SCHEDULER}; job {job_ref} not requeued")

    def down(self, nodes: Sequence[str]) -> dict[str, str]:
        """None: this machine is up."""
        del nodes
        return {}


# --- the node face, as the catalog names it -----------------------------------------------


def owns_env(env: Mapping[str, str]) -> bool:
    """True: this machine takes every environment no scheduler's variables claim (it comes
    last in the catalog)."""
    del env
    return True


def allocation_of(env: Mapping[str, str], client: object | None = None) -> LocalAllocation:
    """This machine (no scheduler to ask, so no client)."""
    del client
    return LocalAllocation(env)


def supervise_launcher(
    env: Mapping[str, str], argv: Sequence[str], client: object | None = None
) -> tuple[LocalAllocation, Launcher[Any]]:
    """Never: ``hpc-ddp supervise`` runs in a scheduler's batch script (a local run's
    supervisor gets its launcher from its controller); raises
    :class:`~hpc_ddp.errors.BackendError`."""
    del env, client
    raise BackendError(
        f"no scheduler's job here to run {' '.join(argv[:1]) or 'the launches'} in: hpc-ddp "
        "supervise runs in the batch script a scheduler started. HINT: submit the job "
        "(hpc-ddp submit), which renders the script that calls it."
    )
