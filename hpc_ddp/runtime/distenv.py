"""Who this process is in the job: rank, world, node, master address and port, attempt. Pure.

Every function takes the environment as a ``Mapping[str, str]`` handed in by the caller and
never reads ``os.environ``. Three launchers are recognised, in this order:

``torchrun`` (or any launcher that sets ``RANK`` and ``WORLD_SIZE``)
    Its values win: it has already arranged the rendezvous. hpc-ddp's local backend sets the
    same variables, and says so (``HPC_DDP_LOCAL_JOB``): its ranks' launcher is ``local``.
``slurm``
    One task per rank started by ``srun``: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``
    and the *step's* node list and tasks per node (a step may run on a subset of the job's nodes,
    and ``SLURM_NODEID`` counts within the step). ``MASTER_ADDR`` is the step's first node.
``single``
    No launcher: one process, rank 0 of 1, on 127.0.0.1.

Each launcher's own variables are read into a :class:`Placement` (``from_launcher``,
``from_slurm``), with every contradiction between them named; :func:`derive_dist_env` picks the
launcher and adds what all of them share (job ids, attempt, the port). Node names, never
``hostname``: on a dev cluster every fake node has the same hostname.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hpc_ddp.backends.slurm.nodelist import parse_nodelist, parse_tasks_per_node
from hpc_ddp.errors import DistEnvError
from hpc_ddp.rundir.layout import (
    ARRAY_OFFSET_ENV,
    LAUNCH_ENV,
    LOCAL_JOB_ENV,
    SUPERVISED_ENV,
    TASK_LAUNCHER_ENV,
)

Launcher = Literal["slurm", "torchrun", "local", "single"]
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
    launch: int = 0
    """Which launch of this attempt (``HPC_DDP_LAUNCH``): the supervisor's in-job restarts
    start launch 1, 2, ... inside the same Slurm attempt."""
    supervised: bool = False
    """``HPC_DDP_SUPERVISED=1``: a supervisor decides what follows a fault (never this rank)."""

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
        _check_launcher_inside_slurm(env, placement)
        return _make(env, placement, _launcher_of(env), port, launcher_port)
    if "SLURM_PROCID" in env:
        return _make(env, from_slurm(env), "slurm", port)
    return _make(env, SINGLE, "single", port)


def _launcher_of(env: Mapping[str, str]) -> Launcher:
    """Who set RANK and WORLD_SIZE: the local backend, ``hpc-ddp run`` for its command child
    (the task's own place, under Slurm), or a torchrun (also any other launcher)."""
    if env.get(LOCAL_JOB_ENV):
        return "local"
    if env.get(TASK_LAUNCHER_ENV) == "slurm" and "TORCHELASTIC_RUN_ID" not in env:
        return "slurm"
    return "torchrun"


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
    launch = env_int(env, LAUNCH_ENV, default=0)
    array_task_index(env)  # a task id that is not a number fails here, naming it
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
        array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
        array_task_id=env.get("SLURM_ARRAY_TASK_ID") or None,
        restart_count=restart,
        node_name=env.get("SLURMD_NODENAME") or None,
        nodelist=where.nodes,
        launcher=launcher,
        port_source=source,
        launch=launch,
        supervised=env.get(SUPERVISED_ENV) == "1",
    )


_BATCH_STEP_ID = "4294967294"  # SLURM_BATCH_SCRIPT: the id some Slurm versions give the batch step


@dataclass(frozen=True)
class Placement:
    """What each launcher derives its own way."""

    rank: int
    local_rank: int
    world: int
    local_world: int
    node_rank: int
    master_addr: str
    nodes: tuple[str, ...]


SINGLE = Placement(0, 0, 1, 1, 0, "127.0.0.1", ())
"""No launcher: one process, rank 0 of 1, on 127.0.0.1."""


def _check_launcher_inside_slurm(env: Mapping[str, str], placement: Placement) -> None:
    """A launcher inside Slurm tasks (torchrun under srun) starts at least one process per
    task, so its WORLD_SIZE is at least SLURM_NTASKS. A smaller one was not set by a launcher
    of this job: it came with the environment (an ``export RANK=...`` in the shell that ran
    sbatch, which passes its environment on), and every task would take itself for that
    rank."""
    if "SLURM_PROCID" not in env:
        return
    step = _slurm_step(env)
    if placement.world < step.world:
        raise DistEnvError(
            f"RANK={env['RANK']} WORLD_SIZE={env['WORLD_SIZE']} in a Slurm step of "
            f"{step.ntasks_var}={step.world} tasks: these are not this step's launcher's (it "
            "would start at least one process per task), but left in the environment sbatch or "
            "srun was given. HINT: unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE in the "
            "shell you submit from, and submit again."
        )


def from_launcher(env: Mapping[str, str]) -> tuple[Placement, int | None]:
    """torchrun's (or any launcher's) ``RANK``/``WORLD_SIZE`` and friends, and its
    ``MASTER_PORT`` (None when unset)."""
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
    nodes = slurm_nodes(env)[1]
    placement = Placement(rank, local_rank, world, local_world, node_rank, master_addr, nodes)
    return placement, launcher_port


@dataclass(frozen=True)
class _Step:
    """The srun step's shape as its variables give it, with their names for messages."""

    world: int
    ntasks_var: str
    """The variable ``world`` came from."""
    tpn_var: str
    per_node: list[int] | None
    nodes_var: str
    nodes: tuple[str, ...]


def from_slurm(env: Mapping[str, str]) -> Placement:
    """One task of an srun step: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the
    step's node list and tasks per node; ``MASTER_ADDR`` is the step's first node."""
    rank = env_int(env, "SLURM_PROCID")
    step = _slurm_step(env)
    world = step.world
    _require_srun(env, rank, step)
    check_below("SLURM_PROCID", rank, f"{step.ntasks_var}={world}", world)
    # srun always sets these; a lone task (world 1) in a batch script may lack them.
    node_rank = env_int(env, "SLURM_NODEID", default=0 if world == 1 else None)
    local_rank = env_int(env, "SLURM_LOCALID", default=0 if world == 1 else None)
    per_node = _tasks_per_node(env, step, node_rank)
    local_world = per_node[node_rank]
    check_below(
        "SLURM_LOCALID",
        local_rank,
        f"{step.tpn_var}={env.get(step.tpn_var)!r} puts {local_world} task(s) on node {node_rank}",
        local_world,
    )
    _check_first_node(env, rank, node_rank, step)
    master_addr = step.nodes[0] if step.nodes else "127.0.0.1"
    return Placement(rank, local_rank, world, local_world, node_rank, master_addr, step.nodes)


def _slurm_step(env: Mapping[str, str]) -> _Step:
    """The step's task count, tasks per node and nodes, preferring the step's variables to the
    job's (a step may run on a subset of the job's nodes)."""
    ntasks_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodes_var, nodes = slurm_nodes(env)
    tpn_var = "SLURM_STEP_TASKS_PER_NODE"
    if tpn_var not in env:
        tpn_var = "SLURM_TASKS_PER_NODE"
    per_node = parse_tasks_per_node(env[tpn_var], tpn_var) if tpn_var in env else None
    if ntasks_var in env:
        world = env_int(env, ntasks_var, minimum=1)
    elif per_node is not None:
        ntasks_var, world = tpn_var, sum(per_node)
    else:
        world = 1
    return _Step(world, ntasks_var, tpn_var, per_node, nodes_var, nodes)


def _require_srun(env: Mapping[str, str], rank: int, step: _Step) -> None:
    """A multi-task job's batch script is not one of its ranks: refuse it."""
    world = step.world
    step_id = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", _BATCH_STEP_ID))
    if world > 1 and step_id in (_BATCH_STEP_ID, "batch"):
        raise DistEnvError(
            f"SLURM_PROCID={rank} with {step.ntasks_var}={world} but no srun step (SLURM_STEP_ID "
            f"is unset): this is the batch script of a {world}-task job, not one of its tasks, "
            f"and rank 0 would wait for {world - 1} peers that never start. HINT: launch each "
            "rank with `srun ... python -m hpc_ddp run RUN_DIR` (the rendered job.sbatch does)."
        )


def _tasks_per_node(env: Mapping[str, str], step: _Step, node_rank: int) -> list[int]:
    """Tasks on each node of the step, checked against its task and node counts."""
    world, ntasks_var, nodes_var = step.world, step.ntasks_var, step.nodes_var
    if not step.nodes:
        if world > 1:
            raise DistEnvError(
                f"{ntasks_var}={world} but no SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or "
                "SLURM_NODELIST to find rank 0's node. HINT: run under srun, which sets them."
            )
        nodes_count = 1
    else:
        nodes_count = len(step.nodes)
        check_below(
            "SLURM_NODEID",
            node_rank,
            f"{nodes_var}={env[nodes_var]!r} has {nodes_count} node(s)",
            nodes_count,
        )
    per_node = step.per_node
    if per_node is None:
        if world % nodes_count:
            raise DistEnvError(
                f"{ntasks_var}={world} tasks on {nodes_count} nodes and no "
                "SLURM_STEP_TASKS_PER_NODE to say how they are spread. HINT: run under srun."
            )
        per_node = [world // nodes_count] * nodes_count
    if len(per_node) != nodes_count or sum(per_node) != world:
        raise DistEnvError(
            f"{step.tpn_var}={env.get(step.tpn_var)!r} does not fit {ntasks_var}={world} on "
            f"{nodes_count} node(s) ({nodes_var}={env.get(nodes_var)!r}). HINT: these come from "
            "one srun step; do not export SLURM_* variables from one job into another."
        )
    return per_node


def _check_first_node(env: Mapping[str, str], rank: int, node_rank: int, step: _Step) -> None:
    """Rank 0 must run on the step's first node, and the node list must be this node's."""
    nodes, nodes_var = step.nodes, step.nodes_var
    if rank == 0 and node_rank != 0:
        # The TCP store is served by rank 0 at MASTER_ADDR, the step's first node.
        raise DistEnvError(
            f"SLURM_PROCID=0 runs on SLURM_NODEID={node_rank}, not on the first node of "
            f"{nodes_var}={env.get(nodes_var)!r} where MASTER_ADDR points. HINT: use srun's "
            "default block or cyclic distribution (drop -m arbitrary / SLURM_HOSTFILE)."
        )
    node_name = env.get("SLURMD_NODENAME")
    if nodes and node_name and nodes[node_rank] != node_name:
        raise DistEnvError(
            f"SLURM_NODEID={node_rank} picks {nodes[node_rank]!r} from {nodes_var}="
            f"{env[nodes_var]!r}, but SLURMD_NODENAME={node_name!r}. HINT: the node list is not "
            "this step's; run under srun, which sets SLURM_STEP_NODELIST."
        )


def slurm_nodes(env: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """The step's node list if srun gave one, else the job's; ('', ()) when there is none."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return name, tuple(parse_nodelist(env[name]))
    return "", ()


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
