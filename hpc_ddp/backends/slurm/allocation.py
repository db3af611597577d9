"""Slurm's node face (:class:`~hpc_ddp.backends.allocation.Allocation`): the ``SLURM_*``
variables a task is given, and what ``scontrol`` and ``sinfo`` say of its job and nodes.

Placement (:func:`slurm_placement`, pure): one task per rank started by ``srun``:
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the *step's* node list and tasks per
node (a step may run on a subset of the job's nodes, and ``SLURM_NODEID`` counts within the
step). ``MASTER_ADDR`` is the step's first node; every contradiction between the variables is
named. Node names, never ``hostname``: on a dev cluster every fake node has the same hostname.

Everything read from the environment comes from the mapping the caller hands in; only the
scheduler's answers (:meth:`SlurmAllocation.standing`, ``requeue``, ``down``) run commands,
through a :class:`~hpc_ddp.backends.slurm.client.SlurmClient` (tests inject one over
:class:`~hpc_ddp.backends.slurm.fake.FakeSlurm`), made when first needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from hpc_ddp.backends.allocation import (
    NO_GRANT,
    GpuGrant,
    JobIdentity,
    JobStanding,
    Placement,
    check_below,
    env_int,
    gpu_count,
)
from hpc_ddp.backends.nodelist import parse_nodelist
from hpc_ddp.backends.slurm.jobstate import DOWN_STATES
from hpc_ddp.backends.slurm.nodelist import parse_tasks_per_node
from hpc_ddp.errors import DistEnvError
from hpc_ddp.rundir.layout import ARRAY_OFFSET_ENV

if TYPE_CHECKING:
    from hpc_ddp.backends.catalog import BackendName
    from hpc_ddp.backends.slurm.client import SlurmClient
    from hpc_ddp.backends.slurm.step import SrunLauncher

_BATCH_STEP_ID = "4294967294"  # SLURM_BATCH_SCRIPT: the id some Slurm versions give the batch step

_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
    "SLURMD_NODENAME",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
)
"""The variables Slurm's face reads: any of them makes an environment Slurm's."""

_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})


SLURM_GPU_VARS = (
    "SLURM_STEP_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS",
)
"""What Slurm sets in a task whose job asked for GPUs (by ``--gpus*`` or ``--gres=gpu``).

Not ``SLURM_JOB_GPUS``: an ``--exclusive`` job on a GPU node gets every GPU of the node without
asking, and its batch shell's ``SLURM_JOB_GPUS=0,1`` is inherited by the tasks of a step that
was given none (seen on Slurm 22.05: no ``CUDA_VISIBLE_DEVICES``, no ``SLURM_STEP_GPUS``)."""


def slurm_gpu_grant(env: Mapping[str, str], rank: int, world: int) -> GpuGrant:
    """What GPUs a Slurm task was given (pure). A Slurm task has :data:`SLURM_GPU_VARS` exactly
    when its job was allocated GPUs. It has GPUs of its own when ``SLURM_GPUS_PER_TASK`` says
    so (set in a batch job's steps), or when it sees fewer than ``SLURM_GPUS_ON_NODE`` (a bare
    ``srun --gpus-per-task`` binds each task to its own without setting the variable); only
    when the ranks (``rank`` of ``world``) are Slurm's tasks, though: under torchrun inside a
    task, its processes share the task's GPUs."""
    if "SLURM_JOB_ID" not in env:
        return NO_GRANT
    found = [f"{name}={env[name]}" for name in SLURM_GPU_VARS if env.get(name)]
    if not found:
        return GpuGrant(False, None, None, f"Slurm job {env['SLURM_JOB_ID']} has no GPUs")
    ranks_are_tasks = (env.get("SLURM_PROCID"), env.get("SLURM_NTASKS")) == (str(rank), str(world))
    per_task = None
    if ranks_are_tasks:
        per_task = gpu_count(env.get("SLURM_GPUS_PER_TASK", "")) or _bound_to_task(env)
    return GpuGrant(True, per_task, None, found[0])


def _bound_to_task(env: Mapping[str, str]) -> int | None:
    """How many GPUs Slurm bound this task to, when it sees fewer than the step has on its
    node (the others are its neighbours'); None when it sees them all."""
    seen = len([d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])
    on_node = gpu_count(env.get("SLURM_GPUS_ON_NODE", ""))
    return seen if seen > 0 and on_node is not None and seen < on_node else None


def owns_env(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is a Slurm job's: it carries any variable Slurm's face reads (the node
    face's question, :class:`~hpc_ddp.backends.allocation.NodeFace`)."""
    return any(name in env for name in _VARIABLES)


def allocation_of(env: Mapping[str, str], client: object | None = None) -> SlurmAllocation:
    """The Slurm job ``env`` belongs to, asked about through ``client`` (a
    :class:`~hpc_ddp.backends.slurm.client.SlurmClient`; None: the real commands)."""
    return SlurmAllocation(env, cast("SlurmClient | None", client))


def supervise_launcher(
    env: Mapping[str, str], argv: Sequence[str], client: object | None = None
) -> tuple[SlurmAllocation, SrunLauncher]:
    """The batch script's allocation and the launcher that runs ``argv`` (``srun ...``) as
    each launch in it: one srun step each."""
    allocation = allocation_of(env, client)
    return allocation, allocation.launcher(argv)


def slurm_identity(env: Mapping[str, str]) -> JobIdentity:
    """The job, array task, restart count (``SLURM_RESTART_COUNT``) and node of ``env``."""
    return JobIdentity(
        job_id=env.get("SLURM_JOB_ID") or None,
        array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
        array_task_id=env.get("SLURM_ARRAY_TASK_ID") or None,
        restart_count=env_int(env, "SLURM_RESTART_COUNT", default=0),
        node_name=env.get("SLURMD_NODENAME") or None,
        step_id=env.get("SLURM_STEP_ID") or None,
    )


def array_task_index(env: Mapping[str, str]) -> int | None:
    """The sweep point this array task runs: ``SLURM_ARRAY_TASK_ID`` plus the array's
    ``HPC_DDP_ARRAY_OFFSET`` (0 when unset); ``None`` outside a job array.

    Raises :class:`DistEnvError` naming the variable when either is not a whole number.
    """
    if not env.get("SLURM_ARRAY_TASK_ID"):
        return None
    return env_int(env, "SLURM_ARRAY_TASK_ID") + env_int(env, ARRAY_OFFSET_ENV, default=0)


def standing_of(fields: Mapping[str, str]) -> JobStanding:
    """``scontrol show job -o`` parsed into fields, as a :class:`JobStanding`."""
    state = fields.get("JobState", "UNKNOWN")
    try:
        restarts: int | None = int(fields["Restarts"])
    except (KeyError, ValueError):
        restarts = None
    listed = fields.get("NodeList") or ""
    try:
        nodes = tuple(parse_nodelist(listed)) if listed.strip() else ()
    except DistEnvError:
        nodes = ()  # the job's nodes as its variables name them stand in
    return JobStanding(
        state=state,
        running=state in _RUNNING_STATES,
        restarts=restarts,
        preempting=fields.get("PreemptTime", "None") not in ("None", "", "Unknown"),
        nodes=nodes,
    )


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


def slurm_placement(env: Mapping[str, str]) -> Placement:
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


def check_launcher_inside_slurm(env: Mapping[str, str], placement: Placement) -> None:
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


class SlurmAllocation:
    """The Slurm job a process runs in: its ``SLURM_*`` variables (``env``) and the client
    that asks Slurm about it (``client``; None: the real commands, made when first needed)."""

    def __init__(self, env: Mapping[str, str], client: SlurmClient | None = None) -> None:
        self.env = env
        self._client = client

    @property
    def name(self) -> BackendName:
        """``slurm``."""
        return "slurm"

    @property
    def client(self) -> SlurmClient:
        """The client Slurm's commands run through."""
        if self._client is None:
            from hpc_ddp.backends.slurm.client import SlurmClient

            self._client = SlurmClient()
        return self._client

    def placement(self) -> Placement | None:
        """An srun task's place (:func:`slurm_placement`); None outside one."""
        return slurm_placement(self.env) if "SLURM_PROCID" in self.env else None

    def nodes(self) -> tuple[str, ...]:
        """The step's nodes, else the job's."""
        return slurm_nodes(self.env)[1]

    def gpu_grant(self, rank: int, world: int) -> GpuGrant:
        """:func:`slurm_gpu_grant` of this task's variables."""
        return slurm_gpu_grant(self.env, rank, world)

    def cpus_per_task(self) -> int | None:
        """``SLURM_CPUS_PER_TASK`` (set when the job asked ``--cpus-per-task``)."""
        count = self.env.get("SLURM_CPUS_PER_TASK", "").strip()
        return int(count) if count.isdigit() and int(count) > 0 else None

    def pool(self) -> str | None:
        """``SLURM_JOB_PARTITION``."""
        return self.env.get("SLURM_JOB_PARTITION") or None

    def check_launcher(self, placement: Placement) -> None:
        """See :func:`check_launcher_inside_slurm`."""
        check_launcher_inside_slurm(self.env, placement)

    def identity(self) -> JobIdentity:
        """See :func:`slurm_identity`."""
        return slurm_identity(self.env)

    def array_point(self) -> int | None:
        """See :func:`array_task_index`."""
        return array_task_index(self.env)

    def standing(self, job_ref: str) -> JobStanding:
        """``scontrol show job`` of ``job_ref`` (:func:`standing_of`)."""
        return standing_of(self.client.show_job(job_ref))

    def requeue(self, job_ref: str) -> None:
        """``scontrol requeue job_ref``."""
        self.client.requeue(job_ref)

    def down(self, nodes: Sequence[str]) -> dict[str, str]:
        """Of ``nodes``, those ``sinfo`` says are down, drained, failing or not responding."""
        states = self.client.node_states(nodes)
        return {n: s for n, s in states.items() if s in DOWN_STATES}

    def launcher(self, argv: Sequence[str]) -> SrunLauncher:
        """Each launch an srun step of the batch script's allocation (the job's nodes, not the
        batch step's)."""
        from hpc_ddp.backends.slurm.step import SrunLauncher

        ident = self.identity()
        job_id = ident.job_id or ""
        listed = self.env.get("SLURM_JOB_NODELIST") or self.env.get("SLURM_NODELIST") or ""
        return SrunLauncher(
            argv,
            self.client,
            job_id=job_id,
            job_ref=ident.job_ref or job_id,
            nodes=parse_nodelist(listed) if listed else (),
        )
