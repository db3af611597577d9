"""How exact a resume is: what a run stopped and resumed keeps of the uninterrupted run. Pure.

Stated once here, for the resume message and the trainer's log; the README and
``docs/concepts.md`` ("Exactness: what is bit-identical where") say the same in prose.

=========================================  ==================================================
where                                      a resume is
=========================================  ==================================================
CPU (gloo)                                 bit-identical: the same weights, to the last bit
GPU (NCCL) with ``train.deterministic``    bit-identical on the same nodes, GPU topology and
                                           software, as long as no op lacked a deterministic
                                           version (the log names any that did)
GPU without it (the default)               step- and sample-exact: the same steps, the same
                                           samples in the same order, the same RNG streams;
                                           the weights differ by rounding, as two
                                           uninterrupted GPU runs differ from each other
another world size than the checkpoint's   sample-exact, not bit-exact (``--elastic``, or a
                                           ``slurm.min_nodes`` allocation): the same global
                                           batch and the same samples in every step, summed
                                           over other ranks; RNG reseeded from (seed, step,
                                           rank) (:mod:`hpc_ddp.config.elastic`)
=========================================  ==================================================
"""

from __future__ import annotations

import enum

from hpc_ddp.config.elastic import SAMPLE_EXACT, Resize
from hpc_ddp.config.model import JobConfig, SlurmConfig

DETERMINISTIC_ENV = (("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),)
"""What ``train.deterministic`` sets in a task's environment (a value set by the user wins):
cuBLAS reads it once, at its first call, so ``hpc-ddp run`` sets it before torch is imported."""

_GPU_FLAGS = frozenset({"gpus", "gpus-per-socket", "gres"})
"""``slurm.extra`` flags that can ask for GPUs (``gres`` only with ``gpu`` in its value)."""


class Exactness(enum.Enum):
    """What a resume keeps; the value is the phrase for messages."""

    BITWISE = "bit-identical to an uninterrupted run"
    BITWISE_SAME_NODES = "bit-identical on the same nodes and GPU topology"
    STEP_EXACT = "step- and sample-exact, not bitwise"
    NONE = "not exact"


def exactness(*, on_gpu: bool, deterministic: bool) -> Exactness:
    """What a resume on the same world size keeps, by where it computes."""
    if not on_gpu:
        return Exactness.BITWISE
    return Exactness.BITWISE_SAME_NODES if deterministic else Exactness.STEP_EXACT


def asks_for_gpus(slurm: SlurmConfig) -> bool:
    """True when the job asks Slurm for GPUs: ``gpus_per_*``, or a GPU flag in ``extra``."""
    if slurm.gpus_per_task is not None or slurm.gpus_per_node is not None:
        return True
    return any(
        name in _GPU_FLAGS and (name != "gres" or "gpu" in (value or ""))
        for name, value in slurm.extra
    )


def resume_clause(before: JobConfig, after: JobConfig, resize: Resize | None = None) -> str:
    """One short clause on what a resume of ``before`` as ``after`` keeps, for the resume
    message: ``bit-identical to an uninterrupted run (CPU)``; ``resize``: ``--elastic`` changes
    the world size."""
    if resize is not None:
        return (
            f"{SAMPLE_EXACT}: {resize.before_world} -> {resize.world} ranks with the same global "
            "batch (--elastic)"
        )
    if before.slurm.ntasks != after.slurm.ntasks and after.slurm.min_nodes is None:
        return (
            f"{Exactness.NONE.value}: {before.slurm.ntasks} -> {after.slurm.ntasks} ranks "
            "reshards the data"
        )
    clause = _same_world_clause(after)
    if after.slurm.min_nodes is not None:
        clause += f"; {SAMPLE_EXACT} where it lands on another node count (slurm.min_nodes)"
    return clause


def _same_world_clause(after: JobConfig) -> str:
    if not asks_for_gpus(after.slurm):
        return f"{Exactness.BITWISE.value} (CPU)"
    if after.command is not None or after.entrypoint is not None:
        return f"{Exactness.STEP_EXACT.value} on GPUs, unless your program makes them so"
    kept = exactness(on_gpu=True, deterministic=after.train.deterministic)
    if kept is Exactness.STEP_EXACT:
        return f"{kept.value} (GPUs without train.deterministic)"
    return f"{kept.value} (train.deterministic)"
