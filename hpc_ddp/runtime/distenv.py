"""Who this process is in the job: rank, world, master address and port, attempt.

Pure: every function takes the environment as a ``Mapping[str, str]`` handed in by the caller
and never reads ``os.environ``. Three launchers are recognised, in this order:

``torchrun`` (or any launcher that sets ``RANK`` and ``WORLD_SIZE``)
    Its values win: it has already arranged the rendezvous.
``slurm``
    One task per rank started by ``srun``: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``
    and the *step's* node list and tasks per node (a step may run on a subset of the job's nodes,
    and ``SLURM_NODEID`` counts within the step). ``MASTER_ADDR`` is the step's first node.
``single``
    No launcher: one process, rank 0 of 1, on 127.0.0.1.

Node names, never ``hostname``: on a dev cluster every fake node has the same hostname. Each
launcher's own variables are read by :mod:`hpc_ddp.runtime.placement`; this module picks the
launcher and adds what they share (job ids, attempt, the port).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hpc_ddp.errors import DistEnvError
from hpc_ddp.rundir import ARRAY_OFFSET_ENV
from hpc_ddp.runtime.placement import SINGLE, Placement, env_int, from_launcher, from_slurm

Launcher = Literal["slurm", "torchrun", "single"]
PortSource = Literal["derived", "config", "launcher"]

PORT_BASE = 20000
PORT_SLOTS = 12763
"""Derived ports lie in ``[PORT_BASE, PORT_BASE + PORT_SLOTS)`` = 20000-32762.

Below Linux's default ephemeral range (32768-60999, ``net.ipv4.ip_local_port_range``): the
kernel hands ephemeral ports to every outgoing connection and to every ``bind(port=0)``, which
includes gloo's and NCCL's own peer sockets; a derived port in that range could be taken by a
neighbouring job's transient socket between our probe and torch's bind. Above 20000 to stay
clear of the usual fixed services (ssh, Slurm's 6817-6819, X11, Jupyter 8888, TensorBoard
6006). The slot count is prime so any non-zero multiplier permutes the slots."""

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
    launcher: Launcher
    port_source: PortSource = "derived"
    """Where ``master_port`` came from; only a ``derived`` port may be moved to dodge a clash."""

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


def derive_master_port(job_id: str | None, restart_count: int, *, candidate: int = 0) -> int:
    """A deterministic port for one attempt of one job, the same on every rank.

    ``job_id`` is the task's own ``SLURM_JOB_ID``; array tasks each have their own, so array
    tasks get different ports without their task id. A numeric id maps through a permutation of
    the slots (``(id + attempt * step) * spread mod slots``): consecutive ids never collide, and
    attempts of nearby jobs stay apart (see ``_RESTART_STEP``). Non-numeric ids (``None`` for a
    run outside Slurm) are hashed. ``candidate`` > 0 gives the fallbacks probed when the first
    port is taken: hashed, so they do not walk into the next job's port.
    """
    key = job_id if job_id is not None else "local"
    if candidate > 0:
        return PORT_BASE + _hash(f"{key}:{restart_count}:{candidate}") % PORT_SLOTS
    base = int(key) if key.isascii() and key.isdigit() else _hash(key)
    slot = ((base + restart_count * _RESTART_STEP) * _SPREAD) % PORT_SLOTS
    return PORT_BASE + slot


def _hash(text: str) -> int:
    # blake2b, not hash(): str hashes are salted per process, and every rank must agree.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def array_task_index(env: Mapping[str, str]) -> int | None:
    """The sweep point this array task runs: ``SLURM_ARRAY_TASK_ID`` plus the array's
    ``HPC_DDP_ARRAY_OFFSET`` (0 when unset); ``None`` outside a job array.

    Raises :class:`DistEnvError` naming the variable when either is not a whole number.
    """
    if not env.get("SLURM_ARRAY_TASK_ID"):
        return None
    return env_int(env, "SLURM_ARRAY_TASK_ID") + env_int(env, ARRAY_OFFSET_ENV, default=0)


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
    if "RANK" in env or "WORLD_SIZE" in env:
        placement, launcher_port = from_launcher(env)
        return _make(env, placement, "torchrun", port, launcher_port)
    if "SLURM_PROCID" in env:
        return _make(env, from_slurm(env), "slurm", port)
    return _make(env, SINGLE, "single", port)


def _make(
    env: Mapping[str, str],
    where: Placement,
    launcher: Launcher,
    port: int | None,
    launcher_port: int | None = None,
) -> DistEnv:
    """Add what every launcher shares: job ids, attempt, node name and the port."""
    job_id = env.get("SLURM_JOB_ID") or None
    restart = env_int(env, "SLURM_RESTART_COUNT", default=0)
    array_task_index(env)  # a task id that is not a number fails here, naming it
    source: PortSource
    if launcher_port is not None:
        master_port, source = launcher_port, "launcher"
    elif port is not None:
        master_port, source = port, "config"
    else:
        master_port, source = derive_master_port(job_id, restart), "derived"
    return DistEnv(
        rank=where.rank,
        local_rank=where.local_rank,
        world_size=where.world,
        local_world_size=where.local_world,
        node_rank=where.node_rank,
        master_addr=where.master_addr,
        master_port=master_port,
        job_id=job_id,
        array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
        array_task_id=env.get("SLURM_ARRAY_TASK_ID") or None,
        restart_count=restart,
        node_name=env.get("SLURMD_NODENAME") or None,
        nodelist=where.nodes,
        launcher=launcher,
        port_source=source,
    )
