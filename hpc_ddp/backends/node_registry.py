"""The backends' node faces by environment: :func:`allocation_for` picks the allocation a
process runs in, :func:`launcher_for` the supervisor's launcher in it (the node side's
counterpart of :mod:`hpc_ddp.backends.registry`, which picks login faces by name).

Like Lightning's cluster environments, each backend says whether an environment is its own
from its own variables; the first that does is picked, and this machine with no scheduler
(:class:`~hpc_ddp.backends.local.allocation.LocalAllocation`) is what is left. Each backend's
module is imported only when picked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hpc_ddp.backends.allocation import Allocation

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Launcher
    from hpc_ddp.backends.slurm.client import SlurmClient


def allocation_for(env: Mapping[str, str], *, slurm: SlurmClient | None = None) -> Allocation:
    """The allocation ``env`` belongs to: Slurm's when it carries Slurm's variables, else this
    machine's. ``slurm``: the client Slurm's face asks through (tests inject a fake); None:
    the real commands, made when first needed."""
    from hpc_ddp.backends.slurm.allocation import SlurmAllocation, is_slurm_env

    if is_slurm_env(env):
        return SlurmAllocation(env, slurm)
    from hpc_ddp.backends.local.allocation import LocalAllocation

    return LocalAllocation()


def launcher_for(
    env: Mapping[str, str], argv: Sequence[str], *, slurm: SlurmClient | None = None
) -> tuple[Allocation, Launcher[Any]]:
    """The allocation of ``hpc-ddp supervise``'s batch script and the launcher that runs
    ``argv`` (``srun ...``) as each launch in it: srun steps of a Slurm job. The local
    backend's supervisor makes its own (:func:`hpc_ddp.job.local_task.run_supervisor`).
    Raises :class:`~hpc_ddp.errors.SlurmError` for an ``argv`` that is no srun command."""
    from hpc_ddp.backends.slurm.allocation import SlurmAllocation

    allocation = SlurmAllocation(env, slurm)
    return allocation, allocation.launcher(argv)
