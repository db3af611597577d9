"""Slurm's login faces, as its catalog row names them (:mod:`hpc_ddp.backends.registry` makes
them by name): the backend (``sbatch``, ``squeue``, ``sacct``, ``scancel``, through one client),
its sweep runner (one job array per sweep) and what srun's words in a batch log say of a job's
end. Each module is imported when its face is first asked for: a dry run loads no client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Backend, Postmortem
    from hpc_ddp.backends.registry import Registry
    from hpc_ddp.backends.slurm.client import SlurmClient
    from hpc_ddp.sweep.runner import SweepRunner


def backend(registry: Registry) -> Backend:
    """Slurm's backend over the registry's Slurm client (None: the real commands)."""
    from hpc_ddp.backends.slurm.backend import SlurmBackend

    return SlurmBackend(_client(registry))


def sweeps(registry: Registry) -> SweepRunner:
    """A sweep as one job array."""
    from hpc_ddp.backends.slurm.backend import SlurmBackend
    from hpc_ddp.backends.slurm.sweeps import ArraySweeps

    return ArraySweeps(SlurmBackend(_client(registry)))


def postmortem() -> Postmortem:
    """What srun's lines in the batch log say of a job's end."""
    from hpc_ddp.backends.slurm.postmortem import SrunPostmortem

    return SrunPostmortem()


def _client(registry: Registry) -> SlurmClient | None:
    return cast("SlurmClient | None", registry.client("slurm"))
