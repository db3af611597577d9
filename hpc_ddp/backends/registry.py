"""The backends by name: the login side's one registry, and its one injection point.

A run's manifest records its backend's name (``slurm``, ``local``); everything the login side
does that depends on it is a method of the backend's login face
(:class:`~hpc_ddp.backends.base.Backend`) or, for a sweep, of its sweep runner
(:class:`~hpc_ddp.sweep.runner.SweepRunner`). :class:`Registry` makes both by name. The CLI
(``main(argv, backends=)``) and the API take one; code below it is handed it as
:class:`~hpc_ddp.backends.base.Backends`. Each backend's module is imported only when picked:
a Slurm user's ``status`` never loads the local backend (ctypes, pickle, sockets), nor a local
run the Slurm client.

A new backend adds its package under ``hpc_ddp/backends/`` and one line to each table here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_ddp.rundir.layout import MANIFEST_FILE
from hpc_ddp.rundir.manifest import BackendName, Manifest, read_manifest

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Backend
    from hpc_ddp.backends.slurm.client import SlurmClient
    from hpc_ddp.sweep.runner import SweepRunner


@dataclass(frozen=True)
class Registry:
    """Every backend, by name (a :class:`~hpc_ddp.backends.base.Backends`). ``slurm``: the
    client the Slurm backend runs its commands through (tests pass one over
    :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`); None: the real commands, made when first
    needed."""

    slurm: SlurmClient | None = field(default=None, compare=False)

    def backend(self, which: Manifest | BackendName) -> Backend:
        """The backend a run's manifest names (or the one named ``which``)."""
        name = which if isinstance(which, str) else which.backend
        return _BACKENDS[name](self)

    def sweeps(self, which: BackendName) -> SweepRunner:
        """The sweep runner of a new sweep on the backend named ``which``."""
        return _SWEEPS[which](self)

    def sweeps_of(self, sweep_dir: Path) -> SweepRunner:
        """The sweep runner of the backend a sweep directory's manifest names; a sweep
        directory without a manifest reads as Slurm's, as it always did."""
        if not (sweep_dir / MANIFEST_FILE).exists():
            return self.sweeps("slurm")
        return self.sweeps(read_manifest(sweep_dir).backend)


def _slurm(registry: Registry) -> Backend:
    from hpc_ddp.backends.slurm.backend import SlurmBackend

    return SlurmBackend(registry.slurm)


def _local(registry: Registry) -> Backend:
    del registry  # no scheduler's command runs for a local run
    from hpc_ddp.backends.local.backend import LocalBackend

    return LocalBackend()


def _slurm_sweeps(registry: Registry) -> SweepRunner:
    from hpc_ddp.backends.slurm.backend import SlurmBackend
    from hpc_ddp.backends.slurm.sweeps import ArraySweeps

    return ArraySweeps(SlurmBackend(registry.slurm))


def _local_sweeps(registry: Registry) -> SweepRunner:
    from hpc_ddp.backends.local.sweeps import ControllerSweeps

    return ControllerSweeps(registry)


_BACKENDS: dict[BackendName, Callable[[Registry], Backend]] = {
    "slurm": _slurm,
    "local": _local,
}
"""Each backend by the name its manifests record (:data:`~hpc_ddp.rundir.manifest.BACKENDS`)."""
_SWEEPS: dict[BackendName, Callable[[Registry], SweepRunner]] = {
    "slurm": _slurm_sweeps,
    "local": _local_sweeps,
}
"""Each backend's sweep runner, by the same names."""
