"""The backends' node faces by environment: :func:`allocation_for` picks the allocation a
process runs in, :func:`launcher_for` the supervisor's launcher in it (the node side's
counterpart of :mod:`hpc_ddp.backends.registry`, which picks login faces by name). The local
backend's tasks, which its controller runs (:mod:`hpc_ddp.job.local_task`), ask theirs here too:
:func:`local_launcher` and :func:`record_local_rank`.

Like Lightning's cluster environments, each backend says whether an environment is its own
from its own variables (:meth:`~hpc_ddp.backends.allocation.NodeFace.owns_env`), asked in the
catalog's order (:data:`~hpc_ddp.backends.catalog.CATALOG`); this machine with no scheduler
(:class:`~hpc_ddp.backends.local.allocation.LocalAllocation`) comes last and takes what is
left. Each node face is the module its catalog row names, imported when asked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hpc_ddp.backends import catalog
from hpc_ddp.backends.allocation import Allocation, NodeFace
from hpc_ddp.backends.catalog import BackendName

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Launcher

Clients = Callable[[BackendName], object | None]
"""The client each backend asks its scheduler through, by the backend's name
(:meth:`hpc_ddp.backends.registry.Registry.client`); None for a backend's real commands."""


def _no_clients(name: BackendName) -> object | None:
    del name
    return None


def node_face_for(env: Mapping[str, str]) -> tuple[BackendName, NodeFace]:
    """The backend whose job ``env`` belongs to, and its node face: the first in the catalog
    that owns ``env`` (the last, this machine, owns every one)."""
    for row in catalog.CATALOG:  # read when asked: tests add a row
        face = cast(NodeFace, importlib.import_module(row.node_face))
        if face.owns_env(env):
            return row.name, face
    raise LookupError("no backend owns this environment: the catalog lacks its last row")


def allocation_for(env: Mapping[str, str], *, clients: Clients = _no_clients) -> Allocation:
    """The allocation ``env`` belongs to: the first backend's in the catalog whose variables
    it carries (Slurm's ``SLURM_*``), else this machine's. ``clients``: what each backend's
    face asks its scheduler through, by name (tests inject a fake); None for a backend: its
    real commands, made when first needed."""
    name, face = node_face_for(env)
    return face.allocation_of(env, clients(name))


def launcher_for(
    env: Mapping[str, str], argv: Sequence[str], *, clients: Clients = _no_clients
) -> tuple[Allocation, Launcher[Any]]:
    """The allocation of ``hpc-ddp supervise``'s batch script and the launcher that runs
    ``argv`` (``srun ...``) as each launch in it (srun steps of a Slurm job), from the node
    face of the backend whose job ``env`` is. The local backend's supervisor asks for its own
    (:func:`local_launcher`). Raises
    :class:`~hpc_ddp.errors.BackendError` for an ``argv`` that is not the backend's launch
    command, or an environment no scheduler's job owns."""
    name, face = node_face_for(env)
    return face.supervise_launcher(env, argv, clients(name))


def local_launcher(
    run_dir: Path,
    ntasks: int,
    job_id: str,
    *,
    gpus: Sequence[str] | None = None,
    per_task: int | None = None,
) -> tuple[Launcher[Any], Callable[[], bool]]:
    """The launcher of a supervised local run's supervisor (:func:`hpc_ddp.job.local_task.
    run_supervisor`): each launch's ``ntasks`` ranks as processes of this machine, ``job_id``
    the controller's, ``gpus`` and ``per_task`` as :func:`~hpc_ddp.job.local_task.run_task`
    takes them; and whether a person has cancelled the run in ``run_dir`` (its note there),
    which the supervisor asks before it starts anything."""
    from hpc_ddp.backends.local.launcher import LocalLauncher
    from hpc_ddp.backends.local.process import was_cancelled

    launcher = LocalLauncher(run_dir, ntasks, job_id, gpus=gpus, per_task=per_task)
    return launcher, lambda: was_cancelled(run_dir)


def record_local_rank(run_dir: Path, rank: int, pid: int) -> None:
    """Record the process ``pid`` as rank ``rank`` of the local run in ``run_dir``
    (``local-ranks/``), so that ``status``, ``cancel`` and ``resume`` still find it if its
    controller's death does not end it; nothing when its identity cannot be read."""
    from hpc_ddp.backends.local.process import identify, write_rank_identity

    me = identify(pid)
    if me is not None:
        write_rank_identity(run_dir, rank, me)
