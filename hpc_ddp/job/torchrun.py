"""The argv a task runs for a ``command`` under ``dist.launcher: torchrun``, and the one for a
classic script that takes its local rank as an argument (``dist.local_rank_arg``).

One torchrun per node, as pytorch/examples' ``slurm/sbatch_run.sh`` starts it, but with
nothing left to the node's PATH or a shell: torchrun is ``<interpreter> -m
torch.distributed.run`` with the interpreter a ``python`` command runs
(:func:`hpc_ddp.job.command.command_argv`), and its rendezvous is the allocation's: static, on
rank 0's node at the job's derived port, each node's rank its Slurm node index. Restarts stay
with hpc-ddp's supervisor (``--max-restarts=0``): a torchrun that restarted its workers by
itself would replay steps from its own idea of the newest state.

Pure: a function of the config's command and this task's place.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpc_ddp.config.model import JobConfig
from hpc_ddp.config.params import PYTHON_NAMES


def procs_per_node(cfg: JobConfig) -> int:
    """torchrun's workers on each node: ``dist.procs_per_node``, else the GPUs per node that
    the job asked for, else 1."""
    if cfg.dist.procs_per_node is not None:
        return cfg.dist.procs_per_node
    return cfg.slurm.gpus_per_node or 1


def torchrun_argv(
    cfg: JobConfig,
    command: Sequence[str],
    interpreter: str,
    *,
    node_rank: int,
    master_addr: str,
    master_port: int,
) -> list[str]:
    """``command`` (its ``python`` already the task's interpreter, or not a Python program at
    all) as one node's torchrun: a script or ``-m MODULE`` runs in torchrun's workers under
    ``interpreter``; any other program runs with ``--no-python``."""
    argv = list(command)
    if argv[0] in PYTHON_NAMES or argv[0] == interpreter:
        program = argv[1:]  # torchrun's workers run its own interpreter: this one
    elif argv[0].endswith(".py"):
        program = argv
    else:
        program = ["--no-python", *argv]
    return [
        interpreter,
        "-m",
        "torch.distributed.run",
        f"--nnodes={cfg.slurm.nodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={procs_per_node(cfg)}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        "--max-restarts=0",
        *program,
    ]


def with_local_rank(cfg: JobConfig, argv: Sequence[str], local_rank: int) -> list[str]:
    """``argv`` with ``dist.local_rank_arg=LOCAL_RANK`` appended when the job names one (a
    classic ``--local_rank`` script: neither torchrun nor srun passes it)."""
    option = cfg.dist.local_rank_arg
    return [*argv, f"{option}={local_rank}"] if option else list(argv)
