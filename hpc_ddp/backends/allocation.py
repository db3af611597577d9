"""The allocation: a backend's node face, what a rank, its task and the supervisor ask of the
scheduler whose job they run in (as submitit's ``JobEnvironment`` and Lightning's cluster
environments). Pure.

An :class:`Allocation` answers from the environment it is given (never ``os.environ`` itself):
this task's place when the scheduler started it (:class:`Placement`), the job's identity and
restart count (:class:`JobIdentity`), the sweep point an array task runs; and, by asking the
scheduler, what it says of the running job at a stop (:class:`JobStanding`), the job's own
requeue, and which nodes it holds down. Each backend implements it in its own package
(:class:`hpc_ddp.backends.slurm.allocation.SlurmAllocation`,
:class:`hpc_ddp.backends.local.allocation.LocalAllocation`), in the module its catalog row names
(a :class:`NodeFace`); :func:`hpc_ddp.backends.node_registry.allocation_for` picks the one an
environment belongs to.

The supervisor's launches come from the other node face, a
:class:`~hpc_ddp.backends.base.Launcher` (:func:`hpc_ddp.backends.node_registry.launcher_for`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hpc_ddp.errors import DistEnvError

if TYPE_CHECKING:
    from hpc_ddp.backends.base import Launcher
    from hpc_ddp.backends.catalog import BackendName


@dataclass(frozen=True)
class Placement:
    """Where this process's task sits among the job's tasks, as one launcher gives it."""

    rank: int
    local_rank: int
    world: int
    local_world: int
    node_rank: int
    master_addr: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class JobIdentity:
    """The job this process runs in, as its scheduler names it."""

    job_id: str | None
    """The scheduler's job id (on Slurm an array task's own, unique per task)."""
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int
    """0 on the job's first attempt, +1 per requeue."""
    node_name: str | None
    """The node this task runs on, by the scheduler's name for it."""
    step_id: str | None = None
    """The scheduler's step this task runs in (Slurm's ``SLURM_STEP_ID``), where it has one."""

    @property
    def job_ref(self) -> str | None:
        """``ARRAYJOB_TASK`` for an array task (as a requeue wants it), else the job id.

        Never the array task's bare job id: the last task's equals the array's own id.
        """
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


NO_JOB = JobIdentity(None, None, None, 0, None)
"""No scheduler's job: a local run, torchrun by hand, one plain process."""


@dataclass(frozen=True)
class GpuGrant:
    """The GPUs this task was given, as far as its scheduler's variables tell
    (:meth:`Allocation.gpu_grant`)."""

    asked: bool | None
    """True: the job asked for GPUs; False: it asked for none (a Slurm job, or a local run,
    without GPUs); None: no launcher says (torchrun, a plain process): visible CUDA decides."""
    per_task: int | None
    """GPUs each rank has to itself (``--gpus-per-task``: seen from ``cuda:0``); None when the
    ranks of a node share them, or nobody says."""
    given: int | None
    """How many GPUs the launcher gave this rank, where it says (the local backend)."""
    source: str
    """What says so, for messages (``SLURM_GPUS_ON_NODE=2``)."""


NO_GRANT = GpuGrant(None, None, None, "no launcher says")
"""No scheduler says what GPUs a task has: the devices it sees decide."""


def gpu_count(text: str) -> int | None:
    """``2`` or ``a100:2`` (a scheduler's ``[type:]count``) -> 2; anything else -> None."""
    count = text.strip().rpartition(":")[2]
    return int(count) if count.isdigit() else None


@dataclass(frozen=True)
class JobStanding:
    """What the scheduler says of the running job when a stop comes (``scontrol show job``)."""

    state: str
    """The scheduler's word for the job's state (named in the explanations)."""
    running: bool
    """The job still runs (not completing or ended): a requeue is ours to ask for."""
    restarts: int | None
    """The job's restart count as the scheduler holds it now; None when it did not say."""
    preempting: bool
    """A preemption of the job is under way."""
    nodes: tuple[str, ...]
    """The job's nodes as the scheduler holds them now; () when it did not say."""


class Allocation(Protocol):
    """The node face of a backend (see the module docstring)."""

    @property
    def name(self) -> BackendName:
        """The backend's name, as its catalog row gives it (a task it started itself has this
        launcher); ``local``: this machine, no scheduler."""
        ...

    def placement(self) -> Placement | None:
        """This task's place when the scheduler started it (one srun task per rank); None
        when it did not (a launcher's variables, or one lone process, decide). Raises
        :class:`~hpc_ddp.errors.DistEnvError` naming the variables that contradict."""
        ...

    def nodes(self) -> tuple[str, ...]:
        """The nodes the scheduler's variables name (the step's, else the job's)."""
        ...

    def check_launcher(self, placement: Placement) -> None:
        """Refuse a launcher's ``placement`` (torchrun inside the tasks) that cannot be this
        job's: its world is smaller than the scheduler's tasks."""
        ...

    def identity(self) -> JobIdentity:
        """The job, its array task and its restart count (:data:`NO_JOB` outside any)."""
        ...

    def array_point(self) -> int | None:
        """The sweep point an array task runs; None outside a job array."""
        ...

    def gpu_grant(self, rank: int, world: int) -> GpuGrant:
        """The GPUs the scheduler gave this task (``rank`` of ``world``: whether the ranks are
        the scheduler's own tasks, or a launcher's inside one)."""
        ...

    def cpus_per_task(self) -> int | None:
        """The CPUs the scheduler gave each task (Slurm's ``--cpus-per-task``); None where it
        does not say (each rank then takes its share of what it may run on)."""
        ...

    def pool(self) -> str | None:
        """The pool of nodes the job runs in (Slurm's partition, PBS's queue); None on this
        machine."""
        ...

    def standing(self, job_ref: str) -> JobStanding:
        """What the scheduler says of job ``job_ref`` now; raises
        :class:`~hpc_ddp.errors.BackendError` when it cannot be asked."""
        ...

    def requeue(self, job_ref: str) -> None:
        """Ask the scheduler to requeue job ``job_ref``; raises
        :class:`~hpc_ddp.errors.BackendError` when it refuses or cannot be asked."""
        ...

    def down(self, nodes: Sequence[str]) -> dict[str, str]:
        """Of ``nodes``, those the scheduler holds down or not responding, with their state."""
        ...


class NodeFace(Protocol):
    """A backend's node face: the module its catalog row names
    (:attr:`hpc_ddp.backends.catalog.Row.node_face`), which
    :mod:`hpc_ddp.backends.node_registry` imports when it asks."""

    def owns_env(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` is a job of this backend's (it carries the scheduler's variables)."""
        ...

    def allocation_of(self, env: Mapping[str, str], client: object | None = None) -> Allocation:
        """The allocation ``env`` belongs to; ``client``: what the backend asks its scheduler
        through (tests inject a fake), None: the real commands, made when first needed."""
        ...

    def supervise_launcher(
        self, env: Mapping[str, str], argv: Sequence[str], client: object | None = None
    ) -> tuple[Allocation, Launcher[Any]]:
        """The allocation of ``hpc-ddp supervise``'s batch script and the launcher that runs
        ``argv`` as each launch in it. Raises :class:`~hpc_ddp.errors.BackendError` where no
        batch script runs it, or ``argv`` is not this backend's launch command."""
        ...


_INT_RE = re.compile(r"[-+]?[0-9]{1,18}")


def env_int(
    env: Mapping[str, str], name: str, *, minimum: int = 0, default: int | None = None
) -> int:
    """``int(env[name])`` with an error that names the variable and its value."""
    if name not in env:
        if default is not None:
            return default
        raise DistEnvError(f"{name} is not set. HINT: launch with srun or torchrun, which set it.")
    text = env[name]
    if not _INT_RE.fullmatch(text.strip()):  # int() would take "1_000", " ١ " and 5000 digits
        raise DistEnvError(
            f"{name}={text[:40]!r} is not an integer. HINT: unset it, or let the launcher set it."
        )
    value = int(text.strip())
    if value < minimum:
        raise DistEnvError(f"{name}={text!r} is below {minimum}. HINT: let the launcher set it.")
    return value


def check_below(name: str, value: int, limit_desc: str, limit: int) -> None:
    """A :class:`DistEnvError` unless ``value < limit`` (the launcher's variables agree)."""
    if value >= limit:
        raise DistEnvError(
            f"{name}={value} but {limit_desc}: it must be below {limit}. HINT: the launcher's "
            "variables contradict each other; do not set rank variables by hand or copy another "
            "job's."
        )
