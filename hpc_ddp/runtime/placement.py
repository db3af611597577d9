"""Where a launcher put this process: rank, world, node and rank 0's node, read from its
environment with every contradiction named (pure).

:mod:`hpc_ddp.runtime.distenv` picks the launcher and adds what all of them share (job ids,
attempt, port); this module reads each launcher's own variables. Every function takes the
environment as a ``Mapping[str, str]`` and never reads ``os.environ``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpc_ddp.errors import DistEnvError
from hpc_ddp.slurm.nodelist import parse_nodelist, parse_tasks_per_node

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
