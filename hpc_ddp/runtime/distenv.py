"""Who this process is in the job: rank, world, node, master address and port, attempt. Pure.

Every function takes the environment as a ``Mapping[str, str]`` handed in by the caller and
never reads ``os.environ``. Three launchers are recognised, in this order:

``torchrun`` (or any launcher that sets ``RANK`` and ``WORLD_SIZE``)
    Its values win: it has already arranged the rendezvous. hpc-ddp's local backend sets the
    same variables, and says so (``HPC_DDP_LOCAL_JOB``): its ranks' launcher is ``local``.
the scheduler's own tasks (``slurm``)
    One task per rank started by the scheduler (``srun``): the allocation's placement
    (:meth:`~hpc_ddp.backends.allocation.Allocation.placement`,
    :func:`hpc_ddp.backends.slurm.allocation.slurm_placement`).
``single``
    No launcher: one process, rank 0 of 1, on 127.0.0.1.

The allocation this process runs in (:func:`~hpc_ddp.backends.node_registry.allocation_for`)
reads its own variables: the placement of the tasks it started, the job ids and the restart
count; :func:`derive_dist_env` picks the launcher and adds what all of them share (the
attempt, the port).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hpc_ddp.backends.allocation import Allocation, Placement, check_below, env_int
from hpc_ddp.backends.catalog import is_scheduler
from hpc_ddp.backends.ports import PORT_BASE, PORT_SLOTS
from hpc_ddp.errors import DistEnvError
from hpc_ddp.rundir.layout import (
    LAUNCH_ENV,
    LOCAL_JOB_ENV,
    SUPERVISED_ENV,
    TASK_LAUNCHER_ENV,
)

Origin = str
"""Who placed this process: a backend's name (the catalog's: ``slurm``, whose srun started one
task per rank; ``local``, whose processes got their ranks from it), ``torchrun`` (also any other
launcher that sets ``RANK``/``WORLD_SIZE``), or ``single`` (one lone process)."""
PortSource = Literal["derived", "config", "launcher"]

_SPREAD = 7888
"""Multiplier that scatters consecutive job ids over the whole range (about PORT_SLOTS/phi)."""
_RESTART_STEP = 4875
"""Slot offset between consecutive attempts of one job (about PORT_SLOTS/phi^2). Golden-ratio
steps keep the offsets of attempts 0..k far apart on the circle (three-distance theorem): with
3 attempts, jobs whose ids differ by less than 3013 never share a port; with 6, by less than 1151.
"""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the distributed job, derived from its environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    job_id: str | None
    """``SLURM_JOB_ID``: for an array task, the task's own job id (unique per task)."""
    array_job_id: str | None
    array_task_id: str | None
    restart_count: int
    """``SLURM_RESTART_COUNT``: 0 on the first attempt, +1 per requeue."""
    node_name: str | None
    nodelist: tuple[str, ...]
    launcher: Origin
    port_source: PortSource = "derived"
    """Where ``master_port`` came from; only a ``derived`` port may be moved to dodge a clash."""
    launch: int = 0
    """Which launch of this attempt (``HPC_DDP_LAUNCH``): the supervisor's in-job restarts
    start launch 1, 2, ... inside the same Slurm attempt."""
    supervised: bool = False
    """``HPC_DDP_SUPERVISED=1``: a supervisor decides what follows a fault (never this rank)."""
    step_id: str | None = None
    """The scheduler's step this task runs in (Slurm's ``SLURM_STEP_ID``), where it has one."""

    @property
    def attempt_key(self) -> str:
        """What names this launch's rendezvous files (port, file store, crash claim): the
        restart count, and ``restart.launch`` for an in-job restart, so that no launch reads
        a file an earlier launch of the same attempt left."""
        restart = self.restart_count
        return str(restart) if self.launch == 0 else f"{restart}.{self.launch}"

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the only rank that writes shared files."""
        return self.rank == 0

    @property
    def job_ref(self) -> str | None:
        """``ARRAYJOB_TASK`` for an array task (as ``scontrol requeue`` wants it), else the job id.

        Never the array task's bare ``SLURM_JOB_ID``: the last task's equals the array's own id.
        """
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    def as_environ(self) -> dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` and torchrun-aware code read."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def derive_master_port(
    job_id: str | None, restart_count: int, *, candidate: int = 0, launch: int = 0
) -> int:
    """A deterministic port for one attempt of one job, the same on every rank.

    ``job_id`` is the task's own ``SLURM_JOB_ID``; array tasks each have their own, so array
    tasks get different ports without their task id. A numeric id maps through a permutation of
    the slots (``(id + attempt * step) * spread mod slots``): consecutive ids never collide, and
    attempts of nearby jobs stay apart (see ``_RESTART_STEP``). Non-numeric ids (``None`` for a
    run outside Slurm) are hashed. ``candidate`` > 0 gives the fallbacks probed when the first
    port is taken: hashed, so they do not walk into the next job's port. An in-job restart
    (``launch`` > 0) hashes all its candidates with the launch: a port the previous launch's
    ranks still hold (a zombie, a socket in TIME_WAIT) is never its first try.
    """
    key = job_id if job_id is not None else "local"
    if launch > 0:
        return PORT_BASE + _hash(f"{key}:{restart_count}.{launch}:{candidate}") % PORT_SLOTS
    if candidate > 0:
        return PORT_BASE + _hash(f"{key}:{restart_count}:{candidate}") % PORT_SLOTS
    base = int(key) if key.isascii() and key.isdigit() else _hash(key)
    slot = ((base + restart_count * _RESTART_STEP) * _SPREAD) % PORT_SLOTS
    return PORT_BASE + slot


def _hash(text: str) -> int:
    # blake2b, not hash(): str hashes are salted per process, and every rank must agree.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def derive_dist_env(env: Mapping[str, str], *, port: int | None = None) -> DistEnv:
    """Derive this process's :class:`DistEnv` from ``env``.

    ``port`` is the configured ``dist.port``: it wins over the derived port, but not over a
    ``MASTER_PORT`` set by torchrun. A ``MASTER_PORT`` left in a Slurm task's environment is
    ignored (it is often a stale export from the login shell); set ``dist.port`` instead.

    Raises :class:`DistEnvError` naming the variables when they are missing, not integers, or
    contradict each other.
    """
    if port is not None and not 0 < port < 65536:
        raise DistEnvError(f"dist.port={port} is not a TCP port. HINT: use 1024-65535 or null.")
    from hpc_ddp.backends.node_registry import allocation_for

    allocation = allocation_for(env)
    if "RANK" in env or "WORLD_SIZE" in env:
        placement, launcher_port = from_launcher(env, allocation)
        allocation.check_launcher(placement)
        return _make(env, allocation, placement, _launcher_of(env), port, launcher_port)
    own = allocation.placement()
    if own is not None:
        return _make(env, allocation, own, allocation.name, port)
    return _make(env, allocation, SINGLE, "single", port)


def _launcher_of(env: Mapping[str, str]) -> Origin:
    """Who set RANK and WORLD_SIZE: the local backend, ``hpc-ddp run`` for its command child
    (the task's own place, as a scheduler's launcher gave it), or a torchrun (also any other
    launcher)."""
    if env.get(LOCAL_JOB_ENV):
        return "local"
    placed = env.get(TASK_LAUNCHER_ENV, "")
    if is_scheduler(placed) and "TORCHELASTIC_RUN_ID" not in env:
        return placed
    return "torchrun"


def _make(
    env: Mapping[str, str],
    allocation: Allocation,
    where: Placement,
    launcher: Origin,
    port: int | None,
    launcher_port: int | None = None,
) -> DistEnv:
    """Add what every launcher shares: job ids, attempt, node name and the port."""
    job = allocation.identity()
    job_id, restart = job.job_id, job.restart_count
    launch = env_int(env, LAUNCH_ENV, default=0)
    allocation.array_point()  # a task id that is not a number fails here, naming it
    source: PortSource
    if launcher_port is not None:
        master_port, source = launcher_port, "launcher"
    elif port is not None:
        master_port, source = port, "config"
    else:
        master_port, source = derive_master_port(job_id, restart, launch=launch), "derived"
    return DistEnv(
        rank=where.rank,
        local_rank=where.local_rank,
        world_size=where.world,
        local_world_size=where.local_world,
        node_rank=where.node_rank,
        master_addr=where.master_addr,
        master_port=master_port,
        job_id=job_id,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        restart_count=restart,
        node_name=job.node_name,
        nodelist=where.nodes,
        launcher=launcher,
        port_source=source,
        launch=launch,
        supervised=env.get(SUPERVISED_ENV) == "1",
        step_id=job.step_id,
    )


SINGLE = Placement(0, 0, 1, 1, 0, "127.0.0.1", ())
"""No launcher: one process, rank 0 of 1, on 127.0.0.1."""


def from_launcher(
    env: Mapping[str, str], allocation: Allocation | None = None
) -> tuple[Placement, int | None]:
    """torchrun's (or any launcher's) ``RANK``/``WORLD_SIZE`` and friends, and its
    ``MASTER_PORT`` (None when unset); the nodes are those ``allocation`` names (none
    without one)."""
    for name in ("RANK", "WORLD_SIZE"):
        if name not in env:
            other = "WORLD_SIZE" if name == "RANK" else "RANK"
            raise DistEnvError(
                f"{other}={env[other]!r} is set but {name} is not. HINT: set both RANK and "
                "WORLD_SIZE (torchrun does), or neither to let Slurm's variables decide."
            )
    rank = env_int(env, "RANK")
    world = env_int(env, "WORLD_SIZE", minimum=1)
    local_rank = env_int(env, "LOCAL_RANK") if world > 1 or "LOCAL_RANK" in env else 0
    local_world = (
        env_int(env, "LOCAL_WORLD_SIZE", minimum=1) if "LOCAL_WORLD_SIZE" in env else world
    )
    node_rank = env_int(env, "GROUP_RANK" if "GROUP_RANK" in env else "NODE_RANK", default=0)
    check_below("RANK", rank, f"WORLD_SIZE={world}", world)
    check_below("LOCAL_RANK", local_rank, f"LOCAL_WORLD_SIZE={local_world}", local_world)
    master_addr = env.get("MASTER_ADDR") or ""
    if not master_addr:
        if world > 1:
            raise DistEnvError(
                f"RANK={rank} WORLD_SIZE={world} but MASTER_ADDR is not set. HINT: set "
                "MASTER_ADDR to rank 0's node (torchrun sets it), or launch with srun alone."
            )
        master_addr = "127.0.0.1"
    launcher_port = env_int(env, "MASTER_PORT", minimum=1) if env.get("MASTER_PORT") else None
    nodes = allocation.nodes() if allocation is not None else ()
    placement = Placement(rank, local_rank, world, local_world, node_rank, master_addr, nodes)
    return placement, launcher_port
