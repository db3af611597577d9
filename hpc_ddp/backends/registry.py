"""The backends by name: :func:`backend_for` picks the login face of a run's backend.

A run's manifest records its backend's name (``slurm``, ``local``); everything the login side
does that depends on it is a method of the object this returns
(:class:`~hpc_ddp.backends.base.Backend`). Each backend's module is imported only when picked:
a Slurm user's ``status`` never loads the local backend (ctypes, pickle, sockets), nor a local
run the Slurm client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hpc_ddp.backends.base import Backend
from hpc_ddp.rundir.manifest import Backend as BackendName
from hpc_ddp.rundir.manifest import Manifest

if TYPE_CHECKING:
    from hpc_ddp.backends.slurm.client import SlurmClient


def backend_for(which: Manifest | BackendName, *, slurm: SlurmClient | None = None) -> Backend:
    """The backend a run's manifest names (or the one named ``which``). ``slurm``: the client
    the Slurm backend runs its commands through (tests inject a fake); None: the real commands,
    made when first needed."""
    name = which if isinstance(which, str) else which.backend
    return _FACTORIES[name](slurm)


def _slurm(client: SlurmClient | None) -> Backend:
    from hpc_ddp.backends.slurm.backend import SlurmBackend

    return SlurmBackend(client)


def _local(client: SlurmClient | None) -> Backend:
    del client  # no Slurm command runs for a local run
    from hpc_ddp.backends.local.backend import LocalBackend

    return LocalBackend()


_FACTORIES: dict[BackendName, Callable[[SlurmClient | None], Backend]] = {
    "slurm": _slurm,
    "local": _local,
}
"""Each backend by the name its manifests record (:data:`~hpc_ddp.rundir.manifest.BACKENDS`)."""
