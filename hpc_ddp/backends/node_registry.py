"""The backends' node faces by environment: :func:`allocation_for` picks the allocation a
process runs in, :func:`launcher_for` the supervisor's launcher in it (the node side's
counterpart of :mod:`hpc_ddp.backends.registry`, which picks login faces by name). The local
backend's tasks, which its controller runs (:mod:`hpc_ddp.job.local_task`), ask theirs here too:
:func:`local_launcher` and :func:`record_local_rank`.

Like Lightning's cluster environments, each backend says whether an environment is its own
from its own variables; the first that does is picked, and this machine with no scheduler
(:class:`~hpc_ddp.backends.local.allocation.LocalAllocation`) is what is left. Each backend's
module is imported only when picked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
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
    backend's supervisor asks for its own (:func:`local_launcher`).
    Raises :class:`~hpc_ddp.errors.SlurmError` for an ``argv`` that is no srun command."""
    from hpc_ddp.backends.slurm.allocation import SlurmAllocation

    allocation = SlurmAllocation(env, slurm)
    return allocation, allocation.launcher(argv)


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
