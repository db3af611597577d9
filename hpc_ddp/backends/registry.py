"""The backends by name: the login side's one registry, and its one injection point.

A run's manifest records its backend's name (``slurm``, ``local``: the catalog's,
:mod:`hpc_ddp.backends.catalog`); everything the login side does that depends on it is a method
of the backend's login face (:class:`~hpc_ddp.backends.base.Backend`), of what its logs say of a
job's end (:class:`~hpc_ddp.backends.base.Postmortem`), of a job this process holds on this
machine (:class:`~hpc_ddp.backends.base.Held`) or, for a sweep, of its sweep runner
(:class:`~hpc_ddp.sweep.runner.SweepRunner`). :class:`Registry` makes each by name, from the
module the backend's catalog row names (a :class:`LoginFace`). The CLI (``main(argv,
backends=)``) and the API (``backends=``) take one; code below them is handed it as
:class:`~hpc_ddp.backends.base.Backends`. Each backend's module is imported only when picked: a
Slurm user's ``status`` never loads the local backend (ctypes, pickle, sockets), nor a local run
the Slurm client.

A new backend adds its package under ``hpc_ddp/backends/`` and one row to the catalog.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from hpc_ddp.backends.catalog import BackendName, row_of
from hpc_ddp.frozen import dataclass
from hpc_ddp.rundir.layout import MANIFEST_FILE

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Backend, Held, Postmortem

    # Named for the API's deprecated `slurm=` (its type), which may not import Slurm's own.
    from hpc_ddp.backends.slurm.client import SlurmClient as SlurmClient  # noqa: PLC0414
    from hpc_ddp.rundir.manifest import Manifest
    from hpc_ddp.sweep.runner import SweepRunner


class LoginFace(Protocol):
    """A backend's login faces: the module its catalog row names
    (:attr:`hpc_ddp.backends.catalog.Row.login_face`), each face made when asked for. A backend
    whose jobs run under the submitting process also has ``held(handle, run_dir, job_id) ->
    Held`` and ``kill_wait_s() -> float``."""

    def backend(self, registry: Registry) -> Backend:
        """Its login face, over the registry's client for it."""
        ...

    def sweeps(self, registry: Registry) -> SweepRunner:
        """Its sweep runner."""
        ...

    def postmortem(self) -> Postmortem:
        """What its logs say of a job's end."""
        ...


@dataclass(frozen=True)
class Registry:
    """Every backend, by name (a :class:`~hpc_ddp.backends.base.Backends`). ``clients``: the
    client each backend runs its scheduler's commands through, by its name (tests pass a Slurm
    one over :class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`); a backend without one: the real
    commands, made when first needed (a dry run makes none). ``slurm``: Slurm's, as
    ``Registry(client)`` has always said it."""

    slurm: SlurmClient | None = field(default=None, compare=False)
    clients: Mapping[BackendName, object] = field(default_factory=dict, compare=False)

    def client(self, name: BackendName) -> object | None:
        """The client the backend ``name`` runs its commands through (None: the real ones)."""
        if name == "slurm" and self.slurm is not None:
            return self.slurm
        return self.clients.get(name)

    def backend(self, which: Manifest | BackendName) -> Backend:
        """The backend a run's manifest names (or the one named ``which``)."""
        return _login_face(_name(which)).backend(self)

    def sweeps(self, which: BackendName) -> SweepRunner:
        """The sweep runner of a new sweep on the backend named ``which``."""
        return _login_face(which).sweeps(self)

    def sweeps_of(self, sweep_dir: Path) -> SweepRunner:
        """The sweep runner of the backend a sweep directory's manifest names; a sweep
        directory without a manifest reads as Slurm's, as it always did."""
        from hpc_ddp.rundir.manifest import read_manifest  # not needed to submit a run

        if not (sweep_dir / MANIFEST_FILE).exists():
            return self.sweeps("slurm")
        return self.sweeps(read_manifest(sweep_dir).backend)

    def postmortem(self, which: Manifest | BackendName) -> Postmortem:
        """What the logs of that backend's jobs say of their end, beside the ledger."""
        return _login_face(_name(which)).postmortem()

    def held(self, which: BackendName, handle: object, run_dir: Path, job_id: str) -> Held:
        """The job ``job_id`` of ``run_dir`` this process started on ``which`` and holds
        (``handle``: what its start returned); a backend whose jobs a scheduler holds has none
        (:class:`ValueError`)."""
        made: _MakeHeld | None = getattr(_login_face(which), "held", None)
        if made is None:
            raise ValueError(f"a {which} job is held by its scheduler, not by this process")
        return made(handle, run_dir, job_id)

    def kill_wait_s(self, which: BackendName) -> float | None:
        """How long a cancel of a ``which`` job gives its processes after the SIGTERM before
        it SIGKILLs those left, unless told (a local run's, as Slurm's ``KillWait``); None
        where the scheduler's own setting decides."""
        wait: _KillWait | None = getattr(_login_face(which), "kill_wait_s", None)
        return None if wait is None else wait()


def _name(which: Manifest | BackendName) -> BackendName:
    return which if isinstance(which, str) else which.backend


def _login_face(name: BackendName) -> LoginFace:
    """The login-face module of the backend ``name`` (a :class:`KeyError` for a name the
    catalog lacks: a manifest's was checked when it was read)."""
    return cast(LoginFace, importlib.import_module(row_of(name).login_face))


class _MakeHeld(Protocol):
    def __call__(self, handle: object, run_dir: Path, job_id: str) -> Held: ...


class _KillWait(Protocol):
    def __call__(self) -> float: ...


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
